//! The WGSL sources of the kernels, for GPU backends: each module is the
//! shared prelude ([`PRELUDE`]) followed by one of the family sources.
//! What each entry point computes matches the CPU function of the same
//! name in this crate.

/// Bindings, launch parameters and helpers every module starts with.
pub const PRELUDE: &str = include_str!("wgsl/common.wgsl");
/// `fill`, `scale`, `axpy`, `binary` (add, mul, MSE backward), `amp_unscale`.
pub const ELEMENTWISE: &str = include_str!("wgsl/elementwise.wgsl");
/// The activation functions and their `forward` and `backward` entry points.
pub const ACTIVATION: &str = include_str!("wgsl/activation.wgsl");
/// `gemm`, tiled, with the bias + activation epilogue (needs [`ACTIVATION`]).
pub const GEMM: &str = include_str!("wgsl/gemm.wgsl");
/// `column_sum`, `segment_sum` (sums and sums of squares), `mse_loss`.
pub const REDUCE: &str = include_str!("wgsl/reduce.wgsl");
/// `sgd`, `adam` (and AdamW), `rmsprop`, `adagrad`, each also as the rest of
/// a counted step (after [`AMP`]'s `step_count`), and LAMB's passes.
pub const OPTIMIZER: &str = include_str!("wgsl/optimizer.wgsl");
/// AMP on device words: `amp_unscale_by_device_scale`, `amp_update_scale`
/// and `step_count` (the first dispatch of a counted optimizer step).
pub const AMP: &str = include_str!("wgsl/amp.wgsl");
/// `strided_copy` of 32-bit words.
pub const STRIDED: &str = include_str!("wgsl/strided.wgsl");
