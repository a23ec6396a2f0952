//! Cistern: a compute runtime for training programs.
//!
//! This facade re-exports the workspace crates under one name
//! (`cistern::client`, `cistern::runtime`, ...). It owns no code of its own:
//! the `cistern` command line (devices, bench, stress, report) is the
//! package's binary, behind the default `cli` feature, so a program that
//! depends on `cistern` with `default-features = false` compiles none of the
//! command line's dependencies.

pub use cistern_client as client;
pub use cistern_kernels as kernels;
pub use cistern_memory as memory;
pub use cistern_optim as optim;
pub use cistern_runtime as runtime;
