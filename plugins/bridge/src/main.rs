fn main() -> std::process::ExitCode {
    cni_protocol::run(&cni_bridge::Bridge, &cni_build_stamp::about("bridge"))
}
