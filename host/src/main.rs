//! The `factory` command-line tool: its front doors live in [`doors`].

mod doors;

fn main() -> std::process::ExitCode {
    doors::cli::main()
}
