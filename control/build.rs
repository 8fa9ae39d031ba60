// Compiles proto/ecds.proto, proto/cds.proto and proto/xds.proto with protox
// (pure Rust): no `protoc` needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=../proto/ecds.proto");
    println!("cargo:rerun-if-changed=../proto/xds.proto");
    println!("cargo:rerun-if-changed=../proto/cds.proto");
    let fds = protox::compile(["ecds.proto", "cds.proto"], ["../proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
