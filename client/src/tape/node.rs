//! What a tape records per value: its device buffer, shape, whether it is
//! tracked, and the operation that made it (its inputs named by index).

use cistern_runtime::{Activation, BinaryOp, DropoutSpec, MaxDimSpec};

use super::attention::AttentionRecord;
use super::classify::{BceRecord, ClassLossRecord};
use super::layers::{EmbeddingRecord, LayerNormRecord};
use super::weight_layout::WeightLayout;
use crate::compute::Buffer;

/// A value's index on its tape: values are never removed, so an index never
/// names another value.
pub(super) type VarIndex = usize;

/// One recorded value.
#[derive(Debug)]
pub(super) struct Node {
    /// Its elements, row-major, on the tape's stream.
    pub(super) value: Buffer,
    pub(super) shape: Vec<usize>,
    /// Whether gradients flow to it (a tracked leaf, or made from one).
    pub(super) tracked: bool,
    pub(super) op: Op,
    /// Set for a parameter a store keeps on the device: its gradient goes
    /// through the store, and its value is read through the store only.
    pub(super) resident: Option<ResidentMark>,
}

/// Which store slot a resident leaf is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ResidentMark {
    /// The store's process-unique id.
    pub(crate) store: u64,
    /// The slot, in registration order.
    pub(crate) slot: usize,
}

impl Node {
    /// Its element count (checked when the shape was first accepted).
    pub(super) fn len(&self) -> usize {
        self.shape.iter().product()
    }
}

/// The operation that made a value, with what its backward needs.
#[derive(Clone, Debug)]
pub(super) enum Op {
    /// A leaf: uploaded, resident or detached.
    Leaf,
    /// `a·b` over batches: `a` is `[..., m, k]`, `b` is `[..., k, n]`.
    MatMul { a: VarIndex, b: VarIndex },
    /// `act(input·W + bias)`, `input` is `m×k`, `W` the weight as its
    /// layout stores it (`n×k` transposed, or `k×n`).
    Linear {
        input: VarIndex,
        weight: VarIndex,
        bias: Option<VarIndex>,
        activation: Activation,
        layout: WeightLayout,
        /// The pre-activation, where the activation's derivative cannot be
        /// taken from its output (`None`: backward passes the output).
        pre_activation: Option<Buffer>,
    },
    /// `act(input)`.
    Activation {
        input: VarIndex,
        activation: Activation,
    },
    /// `a op b` (add, sub, mul, div), broadcast to the value's shape.
    Binary {
        op: BinaryOp,
        a: VarIndex,
        b: VarIndex,
    },
    /// `factor·input`.
    Scale { input: VarIndex, factor: f32 },
    /// `Σ input`.
    Sum { input: VarIndex },
    /// `Σ input / n`.
    Mean { input: VarIndex },
    /// `Σ (pred − target)² / n`.
    MseLoss { pred: VarIndex, target: VarIndex },
    /// Softmax or log-softmax over the rows of the last dimension.
    Softmax {
        input: VarIndex,
        rows: usize,
        cols: usize,
        log: bool,
    },
    /// Cross-entropy or NLL over class-index targets.
    ClassLoss {
        input: VarIndex,
        record: Box<ClassLossRecord>,
    },
    /// Binary cross-entropy with logits (its target is untracked).
    BceWithLogits {
        input: VarIndex,
        record: Box<BceRecord>,
    },
    /// The sum (or mean) over `dims` of `input`, with or without the
    /// summed dimensions kept as 1s (the data is the same either way).
    SumDims {
        input: VarIndex,
        dims: Vec<usize>,
        mean: bool,
    },
    /// The same elements under another shape (no copy).
    Reshape { input: VarIndex },
    /// `input` with its dimensions reordered: dimension `i` is `input`'s
    /// `order[i]` (a strided copy).
    Permute { input: VarIndex, order: Vec<usize> },
    /// Layer normalisation over the last dimensions, affine when `weight`
    /// and `bias` are given.
    LayerNorm {
        input: VarIndex,
        weight: Option<VarIndex>,
        bias: Option<VarIndex>,
        record: Box<LayerNormRecord>,
    },
    /// Rows of `input`'s first dimension from element `start`: a view.
    Narrow { input: VarIndex, start: usize },
    /// `inputs` one after another along the first dimension.
    Cat { inputs: Vec<VarIndex> },
    /// Dropout under a seeded counter-based mask (regenerated in backward),
    /// at the step `counter` holds when it has one.
    Dropout {
        input: VarIndex,
        spec: DropoutSpec,
        counter: Option<Buffer>,
    },
    /// Rows of the table `weight` gathered by index.
    Embedding {
        weight: VarIndex,
        record: Box<EmbeddingRecord>,
    },
    /// The maximum over one dimension; `indices` (`i32` words, one per
    /// value) say where each came from.
    MaxDim {
        input: VarIndex,
        spec: MaxDimSpec,
        indices: Buffer,
    },
    /// Multi-head attention over the heads of `q`, `k` and `v` in place.
    Attention {
        q: VarIndex,
        k: VarIndex,
        v: VarIndex,
        record: Box<AttentionRecord>,
    },
}

impl Op {
    /// The values this operation read, in order.
    pub(super) fn inputs(&self) -> Vec<VarIndex> {
        match *self {
            Op::Leaf => Vec::new(),
            Op::MatMul { a, b } | Op::Binary { a, b, .. } => vec![a, b],
            Op::Linear {
                input,
                weight,
                bias,
                ..
            } => std::iter::once(input)
                .chain(std::iter::once(weight))
                .chain(bias)
                .collect(),
            Op::Activation { input, .. }
            | Op::Scale { input, .. }
            | Op::Sum { input }
            | Op::Mean { input }
            | Op::Softmax { input, .. }
            | Op::ClassLoss { input, .. }
            | Op::BceWithLogits { input, .. }
            | Op::SumDims { input, .. }
            | Op::Reshape { input }
            | Op::Permute { input, .. } => vec![input],
            Op::LayerNorm {
                input,
                weight,
                bias,
                ..
            } => std::iter::once(input).chain(weight).chain(bias).collect(),
            Op::Embedding { weight, .. } => vec![weight],
            Op::Dropout { input, .. } | Op::Narrow { input, .. } | Op::MaxDim { input, .. } => {
                vec![input]
            }
            Op::Cat { ref inputs } => inputs.clone(),
            Op::Attention { q, k, v, .. } => vec![q, k, v],
            Op::MseLoss { pred, target } => vec![pred, target],
        }
    }
}

/// Whether the derivative of `activation` at its input can be taken from its
/// output alone, through the backward kernel: `act'(z)` depends only on the
/// sign of `z`, and `act(z) > 0` exactly when `z > 0`.
pub(super) fn derivative_from_output(activation: Activation) -> bool {
    match activation {
        Activation::Identity | Activation::Relu => true,
        Activation::LeakyRelu { negative_slope } => negative_slope >= 0.0,
        Activation::Gelu | Activation::GeluTanh | Activation::Tanh | Activation::Sigmoid => false,
    }
}
