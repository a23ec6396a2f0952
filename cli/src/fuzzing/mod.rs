//! Fuzz target bodies: one function per decoder or parser that a user's
//! bytes reach, each taking arbitrary bytes.
//!
//! `fuzz/` (cargo-fuzz, nightly) and `cli/tests/fuzz_corpus.rs` (the stable
//! suite, over a checked-in corpus and its mutations) call the same bodies.
//! In `cistern-cli`, as the parsers of files are the command
//! line's. A body never panics on any input unless a property it checks fails: a
//! panic is a finding. Not an API: `docs/reliability.md` says how to run them.

mod files;
mod memory;
mod reports;
mod seeds;

pub use files::{alloc_trace, checkpoint_file, csv_table, saved_model};
pub use memory::memory_manager;
pub use reports::{compact_report, error_report, io_error, server_error};
pub use seeds::{Seed, seeds};

/// A fuzz target: the name of its `fuzz/fuzz_targets/` file and corpus
/// folder, and its body.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    /// The target's name.
    pub name: &'static str,
    /// Runs the target on one input.
    pub body: fn(&[u8]),
}

/// Every target.
pub const TARGETS: &[Target] = &[
    Target {
        name: "error_report",
        body: error_report,
    },
    Target {
        name: "compact_report",
        body: compact_report,
    },
    Target {
        name: "server_error",
        body: server_error,
    },
    Target {
        name: "io_error",
        body: io_error,
    },
    Target {
        name: "memory_manager",
        body: memory_manager,
    },
    Target {
        name: "alloc_trace",
        body: alloc_trace,
    },
    Target {
        name: "csv_table",
        body: csv_table,
    },
    Target {
        name: "saved_model",
        body: saved_model,
    },
    Target {
        name: "checkpoint_file",
        body: checkpoint_file,
    },
];
