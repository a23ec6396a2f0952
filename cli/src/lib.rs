//! The `cistern` command line's modules: train, predict, devices, bench,
//! stress and report. No public API: the binary calls
//! [`run_command_line`]; the fuzz targets and their stable-toolchain tests
//! call `fuzzing` (hidden); `examples/vit_digits.rs` and `train --model
//! vit` share the model of `vit` (hidden). A program embedding Cistern depends on the
//! `cistern` facade instead, which compiles none of this.

mod bench;
mod cli;
mod devices;
mod logging;
mod report;
mod stress;
mod train;

#[doc(hidden)]
pub mod fuzzing;
#[doc(hidden)]
pub mod vit;

/// The `cistern` binary's `main`: parses the arguments, sets up logging and
/// runs the command. Not an API: the binary's only entry point.
#[doc(hidden)]
pub fn run_command_line() -> std::process::ExitCode {
    use clap::Parser;
    let cli = cli::Cli::parse();
    logging::init(cli.verbose);
    cli::run(cli)
}
