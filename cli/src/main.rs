//! The `cistern` command line: train, predict, devices, bench, stress and report.
//!
//! Its modules are private modules of the `cistern-cli` library (so the fuzz
//! targets reach the parsers they read user files with): the stress tool's
//! workload, verifier and telemetry writer are no public API, and the
//! end-to-end tests drive them through this binary.

use std::process::ExitCode;

fn main() -> ExitCode {
    exit_quietly_on_closed_pipe();
    cistern_cli::run_command_line()
}

/// Restores the default SIGPIPE action, which Rust's runtime ignores, so
/// `cistern bench gemm | head -1` ends the process quietly when the reader
/// goes, as other command-line tools do, instead of panicking in `println!`.
#[cfg(unix)]
fn exit_quietly_on_closed_pipe() {
    const SIGPIPE: i32 = 13;
    const SIG_DFL: usize = 0;
    unsafe extern "C" {
        fn signal(signum: i32, handler: usize) -> usize;
    }
    // SAFETY: `signal` with SIG_DFL installs no handler of ours; it runs
    // before any thread is spawned.
    unsafe {
        signal(SIGPIPE, SIG_DFL);
    }
}

#[cfg(not(unix))]
fn exit_quietly_on_closed_pipe() {}
