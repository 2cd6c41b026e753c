//! The `factory` command-line tool.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
