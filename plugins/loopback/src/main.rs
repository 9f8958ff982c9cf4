fn main() -> std::process::ExitCode {
    cni_protocol::run(&cni_loopback::Loopback, &cni_build_stamp::about("loopback"))
}
