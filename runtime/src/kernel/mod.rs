//! Kernel launches as the server receives them: which kernel, with its
//! arguments, and what it binds.
//!
//! A [`Kernel`] variant carries its own arguments, so a launch cannot pair a
//! kernel with another kernel's arguments. Everything else the server knows
//! of a kernel — name, catalogue id, binding signature, element size, shape
//! rule — is its [`Contract`], in `contract.rs`, one arm per kernel. Adding
//! a kernel: `docs/architecture.md`, "Adding a kernel".
//!
//! How a launch fails, and what poisons:
//! - a malformed binding (count, bounds, alignment, size, aliasing of a
//!   written range) is `InvalidProgram`, an invalid argument value (an
//!   optimizer config field, the step count, a segment table) is
//!   `InvalidArgument`; both are refused before anything runs;
//! - a kernel that refuses its data while running (LAMB's non-finite
//!   norms) changed nothing: its owner gets `InvalidArgument` through the
//!   launch's token and the stream's latch, and the context stays active;
//! - only a trap, a panic inside a kernel or a sticky device status poisons
//!   the context.

mod contract;
mod launch;
mod optimizer_step;

pub use contract::{Access, AttentionPart, Contract, ShapeRule};
pub use optimizer_step::OptimizerStep;

use cistern_kernels::{
    Activation, AttentionSpec, BatchedGemmSpec, BroadcastSpec, ClassLossSpec, DropoutSpec,
    EmbeddingSpec, GatherSpec, GemmSpec, KernelId, LayerNormSpec, MapOp, MapScalars, MaxDimSpec,
    ScaleRule, SumSpec,
};
use serde::{Deserialize, Serialize};

use crate::ids::BufferRef;
use crate::optimizer::{OptimizerArgs, SegmentTable};

/// A kernel every backend provides, with its arguments. Bindings are listed
/// in the order of the kernel's signature. New variants go last (serialized
/// by position); a new element-wise kernel is a [`MapOp`], not a variant.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Kernel {
    /// An element-wise kernel (`cistern_kernels::map`): bindings its
    /// inputs, then its output unless it writes its first input.
    Map {
        /// Which one: its definition says its bindings and scalars.
        op: MapOp,
        /// Its scalar arguments, as many as its definition names.
        scalars: MapScalars,
    },
    /// Copies its first binding's bytes to its second.
    Copy,
    /// Copies `f32`s from its first binding to its second (the recovery probe's kernel).
    Identity,
    /// Does nothing but count one run on the device (benchmarks prove it ran).
    Empty,
    /// Faults on the device, as a hardware trap does: poisons the context (tests).
    Trap,
    /// `y ← act(x)`: bindings `x`, `y`.
    ActivationForward {
        /// The function applied.
        activation: Activation,
    },
    /// `grad_in ← grad_out · act'(x)`: bindings `x`, `grad_out`, `grad_in`.
    ActivationBackward {
        /// The function whose derivative is applied.
        activation: Activation,
    },
    /// `C ← act(op(A)·op(B) + bias)`: bindings `a`, `b`, `bias` (of `n`
    /// elements, when `bias`), `c`.
    Gemm {
        /// Shape, transposes and activation (boxed: the widest arguments,
        /// and every launch command is as wide as they are).
        spec: Box<GemmSpec>,
        /// Whether a bias binding comes before `c`.
        bias: bool,
    },
    /// Column sums of a row-major `rows×cols` matrix (bias gradient):
    /// bindings `x`, `out` (`cols` elements).
    ColumnSum {
        /// Rows of the matrix.
        rows: u64,
        /// Columns of the matrix: the output's length.
        cols: u64,
    },
    /// Mean squared error into one `f32`: bindings `pred`, `target`, `out`.
    MseLoss,
    /// Per-segment sums: bindings `x`, `out` (one `f32` per segment).
    SegmentSum {
        /// One segment per output element.
        segments: SegmentTable,
    },
    /// Per-segment sums of squares: bindings `x`, `out` (one `f32` per segment).
    SegmentSumSquares {
        /// One segment per output element.
        segments: SegmentTable,
    },
    /// AMP: `grads ← grads·inv_scale`, setting the found-inf flag on any
    /// non-finite gradient: bindings `grads`, `found_inf` (one `f32`).
    AmpUnscale {
        /// `1 / loss scale`.
        inv_scale: f32,
    },
    /// One fused optimizer step over a segment table: bindings `params`,
    /// `grads`, `found_inf` (when AMP), then the state buffers in
    /// [`cistern_optim::StateLayout`] order (boxed: wide, and rare next to
    /// element-wise launches).
    OptimizerStep(Box<OptimizerArgs>),
    /// AMP with the loss scale on the device: `grads ← grads / scale`,
    /// setting the found-inf flag on any non-finite gradient: bindings
    /// `grads`, `found_inf` (one `f32`), `scale` (one `f32`, read).
    AmpUnscaleByDeviceScale,
    /// PyTorch's `_amp_update_scale_` after a step: bindings `found_inf`
    /// (read), `scale` (one `f32`), `tracker` and `skipped` (one `u32`
    /// each, in `f32` words), all one element.
    AmpUpdateScale {
        /// Growth, backoff and interval, as `GradScalerConfig`'s.
        rule: ScaleRule,
    },
    /// [`Kernel::OptimizerStep`] with its step count on the device:
    /// bindings `params`, `grads`, `found_inf`, `count` (one `u32` in an
    /// `f32` word, written), then the state buffers. Skipped when the flag
    /// is set; otherwise runs as step `count + 1` and advances the count.
    /// `step` and `found_inf` of its arguments are not used.
    OptimizerStepCounted(Box<OptimizerArgs>),
    /// Softmax (or log-softmax) over each row of a row-major `rows×cols`
    /// matrix: bindings `x`, `y`.
    Softmax {
        /// Rows of the matrix.
        rows: u64,
        /// Columns: the dimension normalised.
        cols: u64,
        /// Log-softmax rather than softmax.
        log: bool,
    },
    /// The gradient of [`Kernel::Softmax`] from its output: bindings `y`,
    /// `grad_output`, `grad_input` (`rows×cols` each).
    SoftmaxBackward {
        /// Rows of the matrix.
        rows: u64,
        /// Columns: the dimension normalised.
        cols: u64,
        /// Of log-softmax rather than softmax.
        log: bool,
    },
    /// A class-index loss (cross-entropy from logits, NLL from
    /// log-probabilities): bindings `input` (`rows×classes`), `targets`
    /// (`rows` `i32` words), `weight` (`classes`, when weighted), `out`
    /// (one element, or `rows` for no reduction). Boxed: rare and wide.
    ClassLoss(Box<ClassLossSpec>),
    /// Its gradient with respect to the input, in one pass: bindings
    /// `input`, `targets`, `weight` (when weighted), `grad_output` (as long
    /// as the loss), `grad_input` (`rows×classes`).
    ClassLossBackward(Box<ClassLossSpec>),
    /// `out ← a op b` with PyTorch's broadcasting, through strides
    /// (`cistern_kernels::broadcast_binary`): bindings `a`, `b`, `out`.
    /// Boxed: wide.
    BroadcastBinary(Box<BroadcastSpec>),
    /// A scaled sum over strided dimensions, or a strided gather when it
    /// sums over none (`cistern_kernels::strided_sum`): bindings `x`, `out`.
    /// Boxed: wide.
    StridedSum(Box<SumSpec>),
    /// Layer normalisation over the rows of a `rows×cols` matrix
    /// (`cistern_kernels::layer_norm`): bindings `x`, `weight` and `bias`
    /// (`cols` each, when affine), `y`, `stats` (`2·rows`: means, rstds).
    LayerNorm(Box<LayerNormSpec>),
    /// Its fused backward: bindings `x`, `weight` (when affine), `stats`,
    /// `grad_y`, `grad_x`, `weighted` (`grad_y ⊙ x̂`, for the weight's
    /// gradient).
    LayerNormBackward(Box<LayerNormSpec>),
    /// A gather of table rows by `i32` index (`cistern_kernels::embedding`):
    /// bindings `weight` (`vocab×dim`), `indices` (`rows`), `out` (`rows×dim`).
    Embedding(Box<EmbeddingSpec>),
    /// Its deterministic scatter-add: bindings `indices`, `grad_out`,
    /// `grad_weight` (`vocab×dim`, overwritten).
    EmbeddingBackward(Box<EmbeddingSpec>),
    /// Dropout from a counter-based generator
    /// (`cistern_kernels::dropout::dropout`): bindings `x`, `out`, of one
    /// length. Its own backward (the same mask over the gradient).
    Dropout(Box<DropoutSpec>),
    /// A batch of GEMMs of one shape (`cistern_kernels::batched_gemm`):
    /// bindings `a`, `b`, `c` (`batch·m·n`, product `i` its `i`-th block),
    /// each product's operands at their offsets into `a` and `b`.
    BatchedGemm(Box<BatchedGemmSpec>),
    /// A resident dataset's batch (`cistern_kernels::batch_gather`):
    /// bindings `features` (`rows×width`), `targets` (`rows×target_width`
    /// words), `counter` (one `u32` word, the step; advanced), `x`
    /// (`batch×width`), `y` (`batch×target_width`).
    BatchGather(Box<GatherSpec>),
    /// The maximum over one dimension and the index of its first maximal
    /// element (`cistern_kernels::max_dim`): bindings `x`
    /// (`outer×dim×inner`), `values` and `indices` (`outer×inner`, the
    /// indices `i32` words).
    MaxDim(Box<MaxDimSpec>),
    /// Its gradient, routed to that index: bindings `indices`, `grad_out`
    /// (`outer×inner`), `grad_x` (`outer×dim×inner`, overwritten).
    MaxDimBackward(Box<MaxDimSpec>),
    /// Multi-head attention over heads in place
    /// (`cistern_kernels::attention`): bindings `q` (`batch×queries×heads×
    /// head_dim`), `k`, `v` (`batch×keys×heads×head_dim`), `out` (as `q`),
    /// `weights` (`batch×heads×queries×keys`, kept for the backward).
    Attention(Box<AttentionSpec>),
    /// The backward's first half, per query row: bindings `k`, `v`,
    /// `weights`, `grad_out`, `grad_scores` (as `weights`), `grad_q`.
    AttentionBackwardQueries(Box<AttentionSpec>),
    /// The backward's second half, per key row: bindings `q`, `weights`,
    /// `grad_out`, `grad_scores`, `grad_k`, `grad_v`.
    AttentionBackwardKeys(Box<AttentionSpec>),
    /// [`Kernel::Dropout`] at the step a device word holds
    /// (`cistern_kernels::dropout::dropout_counted`): bindings `x`,
    /// `counter` (one `u32` word, read), `out`; the mask of the seed plus
    /// `counter << 32`, so a replayed graph draws a new mask each step.
    DropoutCounted(Box<DropoutSpec>),
}

impl Kernel {
    /// The element-wise kernel `op` with `scalars`.
    pub fn map(op: MapOp, scalars: &[f32]) -> Kernel {
        let scalars = MapScalars::new(scalars);
        Kernel::Map { op, scalars }
    }

    /// The kernel's name, as errors and traces show it.
    pub fn name(&self) -> &'static str {
        self.contract().name
    }

    /// The `cistern-kernels` catalogue entry this kernel runs.
    pub fn id(&self) -> KernelId {
        self.contract().id
    }

    /// The access of each binding, in order.
    pub fn signature(&self) -> &'static [Access] {
        self.contract().signature
    }
}

/// A byte range of an allocation that a kernel binds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Binding {
    /// The allocation.
    pub buffer: BufferRef,
    /// First byte bound, from the allocation's start.
    pub offset: u64,
    /// Bytes bound.
    pub size: u64,
}

/// One kernel call: the server checks it against the kernel's [`Contract`]
/// (binding count, access, sizes, alignment, aliasing, argument values)
/// before anything runs, and answers `InvalidProgram` for malformed
/// bindings, `InvalidArgument` for invalid arguments.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelLaunch {
    /// The kernel and its arguments.
    pub kernel: Kernel,
    /// Its bindings, in the order of its signature.
    pub bindings: Vec<Binding>,
}

impl KernelLaunch {
    /// The access of each binding this launch must have.
    pub fn signature(&self) -> &'static [Access] {
        self.kernel.signature()
    }

    /// The `cistern-kernels` catalogue entry this launch runs.
    pub fn id(&self) -> KernelId {
        self.kernel.id()
    }
}

#[cfg(test)]
mod tests;
