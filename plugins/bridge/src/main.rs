fn main() -> std::process::ExitCode {
    cni_protocol::run(
        &cni_bridge::Bridge,
        &cni_protocol::about("bridge", env!("CARGO_PKG_VERSION")),
    )
}
