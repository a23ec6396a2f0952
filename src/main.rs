//! The `cistern` binary.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    cistern::cli::run(cistern::cli::Cli::parse())
}
