//! Compiles the vendored kubelet APIs (DRA v1 and plugin registration v1)
//! with `protox` (pure Rust: no system `protoc`) into tonic servers and
//! clients for both sides of each protocol.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/dra/v1/api.proto",
        "proto/pluginregistration/v1/api.proto",
    ];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
