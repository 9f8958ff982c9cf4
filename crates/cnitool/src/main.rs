//! `cnitool`: the runtime-side command line tool (see the `cnitool` library for what it does).

fn main() -> std::process::ExitCode {
    cnitool::main(std::env::args_os().skip(1))
}
