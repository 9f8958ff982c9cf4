//! The `host-local` binary: everything happens in the library; this only dispatches.

fn main() -> std::process::ExitCode {
    cni_protocol::run(
        &cni_host_local::HostLocal,
        &cni_build_stamp::about("host-local"),
    )
}
