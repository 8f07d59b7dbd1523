//! Generates the gRPC client for the router <-> shard contract from `proto/`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    // Read at run time: a build script compiled for one checkout may be reused for another.
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR")?;
    let proto_root = std::path::Path::new(&manifest_dir).join("../proto");
    let contract = proto_root.join("tandem/shard/v1/shard.proto");
    println!("cargo:rerun-if-changed={}", contract.display());
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // Image files travel as shared buffers: a Step sent to every rank copies none of them.
        .bytes(".tandem.shard.v1.ImageInput.data")
        .compile_protos(&[contract], &[proto_root])?;
    Ok(())
}
