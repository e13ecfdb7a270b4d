//! Compiles steppe/v1/*.proto with protox (pure Rust; no protoc needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "steppe/v1/trace.proto",
        "steppe/v1/json.proto",
        "steppe/v1/artifacts.proto",
        "steppe/v1/agent.proto",
        "steppe/v1/worker.proto",
        "steppe/v1/runs.proto",
        "steppe/v1/history.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["."])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Agent work and outcomes are large: boxed, so the session messages
        // that may hold them stay small.
        .boxed(".steppe.v1.Assignment.agent")
        .boxed(".steppe.v1.Assignment.fix")
        .boxed(".steppe.v1.AssignmentResult.agent")
        .compile_fds(fds)?;
    Ok(())
}
