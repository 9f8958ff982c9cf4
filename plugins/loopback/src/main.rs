fn main() -> std::process::ExitCode {
    cni_protocol::run(
        &cni_loopback::Loopback,
        &cni_protocol::about("loopback", env!("CARGO_PKG_VERSION")),
    )
}
