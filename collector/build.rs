// Compiles proto/portcullis.proto with protox (pure Rust): no `protoc` needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=../proto/portcullis.proto");
    let fds = protox::compile(["portcullis.proto"], ["../proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    // OTLP's messages: the export requests the collector sends (no
    // services: the calls name OTLP's by path).
    println!("cargo:rerun-if-changed=../proto/otlp.proto");
    let otlp = protox::compile(["otlp.proto"], ["../proto"])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        .compile_fds(otlp)?;
    Ok(())
}
