//! The kernel catalogue and the CPU implementation of every kernel.
//!
//! This crate owns what a kernel computes: [`KernelId`] names each one, and
//! the functions here are the CPU versions — plain functions over `f32`
//! slices, multi-threaded with rayon, returning [`KernelError`] on bad input
//! instead of panicking. Optimizer kernels update every parameter of a model
//! in one call over a concatenated buffer with a [`Segment`] table.
//!
//! It depends only on `cistern-optim` (configs and reference math) and must
//! never depend on the memory manager, the runtime or the client: those
//! launch kernels, kernels do not know about them.

mod activation;
mod attention;
mod batched;
mod broadcast;
mod catalogue;
mod classify;
pub mod cuda;
mod dataset;
pub mod dropout;
mod elementwise;
mod embedding;
mod erf;
mod error;
mod gemm;
pub mod map;
mod max;
mod norm;
mod optimizer;
mod parallel;
mod reduce;
mod small_products;
pub mod wgsl;
mod wide;

pub use activation::{Activation, activation_backward, activation_forward};
pub use attention::{
    AttentionSpec, attention, attention_backward_keys, attention_backward_queries,
};
pub use batched::{BatchedGemmSpec, batched_gemm};
pub use broadcast::{BinaryOp, BroadcastSpec, MAX_RANK, SumSpec, broadcast_binary, strided_sum};
pub use catalogue::KernelId;
pub use cistern_optim::Segment;
pub use classify::{
    ClassInput, ClassLossSpec, Reduction, check_targets, class_loss, class_loss_backward, softmax,
    softmax_backward,
};
pub use dataset::{GatherSpec, batch_gather, shuffled};
pub use dropout::DropoutSpec;
pub use elementwise::{add, axpy, copy, fill, mul, scale};
pub use embedding::{EmbeddingSpec, embedding, embedding_backward};
pub use erf::{erf, erfc};
pub use error::KernelError;
pub use gemm::{GemmKernel, GemmSpec, gemm, gemm_threads, gemm_with};
pub use map::{MapOp, MapScalars, map};
pub use max::{MaxDimSpec, max_dim, max_dim_backward};
pub use norm::{LayerNormSpec, layer_norm, layer_norm_backward};
pub use optimizer::{
    ScaleRule, StepContext, StepOutcome, StepScalars, adagrad_step, adam_step, adamw_step,
    amp_unscale, amp_unscale_by_device_scale, amp_update_scale, lamb_step, optimizer_step,
    optimizer_step_counted, rmsprop_step, segment_runs, sgd_step, step_scalars,
};
pub use reduce::{
    column_sum, mse_backward_factor, mse_loss, mse_loss_backward, segment_sum, segment_sum_squares,
};
