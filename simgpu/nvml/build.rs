fn main() {
    // Clients load us as libnvidia-ml.so.1 (pynvml, nvml-wrapper, HAMi-core).
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
}
