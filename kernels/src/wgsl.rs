//! The WGSL sources of the kernels, for GPU backends: each module is the
//! shared prelude ([`PRELUDE`]), its buffer bindings ([`BINDINGS`], or
//! [`BINDINGS_VEC4`] / [`BINDINGS_VEC4_STEP`] for a vec4 module), then one
//! of the family sources.
//! What each entry point computes matches the CPU function of the same
//! name in this crate.

/// Launch parameters and helpers every module starts with.
pub const PRELUDE: &str = include_str!("wgsl/common.wgsl");
/// The buffer bindings of a scalar module: arrays of `f32`.
pub const BINDINGS: &str = include_str!("wgsl/bindings.wgsl");
/// The buffer bindings of a vec4 module: every buffer an array of `vec4<f32>`.
pub const BINDINGS_VEC4: &str = include_str!("wgsl/bindings_vec4.wgsl");
/// The buffer bindings of the vec4 optimizer steps: the streamed buffers as
/// arrays of `vec4<f32>`, binding 3 (a flag or a counted step's constants)
/// as `f32`s.
pub const BINDINGS_VEC4_STEP: &str = include_str!("wgsl/bindings_vec4_step.wgsl");
/// What every optimizer step reads from binding 3: `skipped`, `per_step`.
pub const STEP: &str = include_str!("wgsl/step.wgsl");
/// `amp_unscale`, and the activations' `forward` and `backward` (needs
/// [`ACTIVATION`]); the plain element-wise kernels are made from their
/// definitions ([`crate::map::wgsl_source`]).
pub const ELEMENTWISE: &str = include_str!("wgsl/elementwise.wgsl");
/// `forward` and `backward` over `vec4`s, for runs whose bindings allow it
/// (needs [`ACTIVATION`] and [`BINDINGS_VEC4`]).
pub const ELEMENTWISE_VEC4: &str = include_str!("wgsl/elementwise_vec4.wgsl");
/// The activation functions, `activate` and `gradient`.
pub const ACTIVATION: &str = include_str!("wgsl/activation.wgsl");
/// `gemm`, tiled, with the bias + activation epilogue (needs [`ACTIVATION`]).
pub const GEMM: &str = include_str!("wgsl/gemm.wgsl");
/// `column_sum`, `segment_sum` (sums and sums of squares), `mse_loss`.
pub const REDUCE: &str = include_str!("wgsl/reduce.wgsl");
/// Softmax and log-softmax over rows, their backward, and the class-index
/// losses and their backward (needs [`REDUCE`]).
pub const CLASSIFY: &str = include_str!("wgsl/classify.wgsl");
/// `sgd`, `adam` (and AdamW), `rmsprop`, `adagrad`, each also as the rest of
/// a counted step (after [`AMP`]'s `step_count`), and LAMB's passes (needs
/// [`STEP`]).
pub const OPTIMIZER: &str = include_str!("wgsl/optimizer.wgsl");
/// `sgd`, `adam` (and AdamW), `rmsprop` and `adagrad` over `vec4`s, for
/// runs whose bindings allow it (needs [`STEP`] and [`BINDINGS_VEC4_STEP`]).
pub const OPTIMIZER_VEC4: &str = include_str!("wgsl/optimizer_vec4.wgsl");
/// AMP on device words: `amp_unscale_by_device_scale`, `amp_update_scale`
/// and `step_count` (the first dispatch of a counted optimizer step).
pub const AMP: &str = include_str!("wgsl/amp.wgsl");
/// `strided_copy` of 32-bit words.
pub const STRIDED: &str = include_str!("wgsl/strided.wgsl");
/// `layer_norm`, `layer_norm_backward`, `embedding` and
/// `embedding_backward` (`crate::norm`, `crate::embedding`).
pub const NORM: &str = include_str!("wgsl/norm.wgsl");
/// `attention`, `attention_backward_queries` and `attention_backward_keys`
/// (`crate::attention`).
pub const ATTENTION: &str = include_str!("wgsl/attention.wgsl");
/// `max_dim` and `max_dim_backward` (`crate::max_dim`).
pub const MAX: &str = include_str!("wgsl/max.wgsl");
/// `broadcast_binary` and `strided_sum` (`crate::broadcast`), over a table
/// of dimensions and strides.
pub const BROADCAST: &str = include_str!("wgsl/broadcast.wgsl");
