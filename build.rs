//! Generates the gRPC port's code from `proto/ctrlog/v1` (the public contract), with protox,
//! so that no system `protoc` is needed, and writes the encoded descriptor set that the
//! reflection service serves and the compatibility test reads.

use std::path::PathBuf;

use prost::Message;

const PROTOS: &[&str] = &[
    "proto/ctrlog/v1/control.proto",
    "proto/ctrlog/v1/commands.proto",
    "proto/ctrlog/v1/errors.proto",
    "proto/google/rpc/status.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    // Only a replica's build serves or calls the gRPC port; a container's (`client`) needs none.
    if std::env::var_os("CARGO_FEATURE_SERVER").is_none() {
        return Ok(());
    }
    let descriptors = protox::compile(PROTOS, ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("ctrlog_v1_descriptor.bin"),
        descriptors.encode_to_vec(),
    )?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
