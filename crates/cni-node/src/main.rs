//! `cni-node`, the node agent; everything is in the library.

fn main() -> std::process::ExitCode {
    cni_node::main(std::env::args_os().skip(1))
}
