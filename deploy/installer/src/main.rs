//! The `cni-installer` binary: everything happens in the library.

fn main() -> std::process::ExitCode {
    cni_installer::main(std::env::args_os().skip(1))
}
