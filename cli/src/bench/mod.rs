//! The `cistern bench` subcommands: each prints one JSON object per result line.

pub mod alloc;
pub mod attention;
pub mod checkpoint;
pub mod cross_entropy;
#[cfg(feature = "cuda")]
mod cublas;
#[cfg(not(feature = "cuda"))]
#[path = "cublas_absent.rs"]
mod cublas;
pub mod gemm;
pub mod optim;
pub mod optim_store;
pub mod parallel;
pub mod peak;
pub mod roundtrip;
pub mod tape;
pub mod train_step;
