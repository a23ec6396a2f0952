//! Cistern: a compute runtime for training programs.
//!
//! This facade re-exports the workspace crates under one name
//! (`cistern::client`, `cistern::runtime`, ...): what a training program
//! embeds. It has no command-line dependency; the `cistern` binary is the
//! `cistern-cli` package.

pub use cistern_client as client;
pub use cistern_kernels as kernels;
pub use cistern_memory as memory;
pub use cistern_optim as optim;
pub use cistern_parallel as parallel;
pub use cistern_runtime as runtime;
