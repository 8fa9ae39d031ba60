// Compiles proto/rls.proto and proto/cache.proto with protox (pure Rust):
// no `protoc` needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=../proto/rls.proto");
    println!("cargo:rerun-if-changed=../proto/cache.proto");
    let fds = protox::compile(["rls.proto", "cache.proto"], ["../proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
