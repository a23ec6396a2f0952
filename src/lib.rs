//! Cistern: a compute runtime for training programs.
//!
//! This facade re-exports the workspace crates under one name
//! (`cistern::client`, `cistern::runtime`, ...). Behind the default `cli`
//! feature it also holds the `cistern` command line's modules (devices,
//! bench, stress, report, train, predict): private, no public API, so a
//! program that depends on `cistern` with `default-features = false`
//! compiles none of them nor their dependencies. The binary calls
//! `run_command_line`; the fuzz targets and their stable-toolchain tests
//! call `fuzzing` (both hidden, both behind `cli`).

pub use cistern_client as client;
pub use cistern_kernels as kernels;
pub use cistern_memory as memory;
pub use cistern_optim as optim;
pub use cistern_runtime as runtime;

#[cfg(feature = "cli")]
mod bench;
#[cfg(feature = "cli")]
mod cli;
#[cfg(feature = "cli")]
mod devices;
#[cfg(feature = "cli")]
mod logging;
#[cfg(feature = "cli")]
mod report;
#[cfg(feature = "cli")]
mod stress;
#[cfg(feature = "cli")]
mod train;

#[cfg(feature = "cli")]
#[doc(hidden)]
pub mod fuzzing;

/// The `cistern` binary's `main`: parses the arguments, sets up logging and
/// runs the command. Not an API: the binary's only entry point.
#[cfg(feature = "cli")]
#[doc(hidden)]
pub fn run_command_line() -> std::process::ExitCode {
    use clap::Parser;
    let cli = cli::Cli::parse();
    logging::init(cli.verbose);
    cli::run(cli)
}
