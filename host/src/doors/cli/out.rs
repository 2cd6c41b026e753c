//! The CLI's standard output: `outln!`/`out!` print like `println!`/`print!`, except that a
//! reader that went away (`factory backends --prices | head -1`: a closed pipe) ends the
//! process quietly with exit code 0, as other Unix tools do, where `println!` would panic.
//! Any other write error ends it with the error on stderr and exit code 2.

use std::io::Write;

/// `println!` on stdout, ending the process quietly when its reader has gone.
macro_rules! outln {
    () => {
        $crate::doors::cli::out::print(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::doors::cli::out::print(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` on stdout, ending the process quietly when its reader has gone.
#[allow(unused_macros)]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::doors::cli::out::print(format_args!($($arg)*))
    };
}

/// Write `text` to stdout; on failure, end the process (see the module docs).
pub fn print(text: std::fmt::Arguments<'_>) {
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(text) {
        failed(&e)
    }
}

/// Write `bytes` to stdout and flush; on failure, end the process (see the module docs).
pub fn write_all(bytes: &[u8]) {
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        failed(&e)
    }
}

/// End the process after a failed write to stdout: quietly (0) when its reader has gone,
/// else with the error (2).
fn failed(error: &std::io::Error) -> ! {
    if error.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    eprintln!("error: writing to stdout: {error}");
    std::process::exit(2);
}
