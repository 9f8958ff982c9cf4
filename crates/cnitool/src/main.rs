fn main() -> std::process::ExitCode {
    cnitool::main(std::env::args_os().skip(1))
}
