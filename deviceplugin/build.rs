//! Compiles the vendored kubelet API with `protox` (pure Rust: no system
//! `protoc`) into tonic servers and clients for both sides of the protocol.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/v1beta1/api.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto/v1beta1"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
