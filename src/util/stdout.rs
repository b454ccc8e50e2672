//! What commands print on standard output. Where it cannot be written (a
//! full disk under `> file`) the command fails with an error that says so,
//! exit 1, where `println!` would panic.

use anyhow::{Context, Result};

/// `println!` for commands: the line, or an error returned from the caller.
#[macro_export]
macro_rules! outln {
    () => {
        $crate::util::stdout::write(format_args!("\n"))?
    };
    ($($arg:tt)*) => {
        $crate::util::stdout::write(format_args!("{}\n", format_args!($($arg)*)))?
    };
}
pub use crate::outln;

/// Writes `args` on standard output.
pub fn write(args: std::fmt::Arguments<'_>) -> Result<()> {
    use std::io::Write;
    std::io::stdout()
        .lock()
        .write_fmt(args)
        .context("writing to standard output")
}
