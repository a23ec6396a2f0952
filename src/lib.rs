//! Cistern: a compute runtime for training programs.
//!
//! This facade re-exports the workspace crates and hosts the `cistern` CLI's
//! subcommands (benchmarks, device listing) as library code, so tests can
//! call them.

pub use cistern_client as client;
pub use cistern_kernels as kernels;
pub use cistern_memory as memory;
pub use cistern_optim as optim;
pub use cistern_runtime as runtime;

pub mod bench;
pub mod cli;
mod devices;
pub mod report;
pub mod stress;
