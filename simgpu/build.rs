fn main() {
    // Clients load us as libcuda.so.1; -Bsymbolic keeps a preloaded
    // interposer from rebinding simgpu's calls into its own exports.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
}
