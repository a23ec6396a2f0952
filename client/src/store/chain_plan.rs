//! A checked device chain (`LayerPlan` per layer) and the workspace of
//! its train step (`ChainRun`), which the store's state holds between steps.

use cistern_optim::SgdConfig;
use cistern_runtime::{Activation, ClassLossSpec};

use crate::compute::{Buffer, Graph};

/// What a recorded chain step reads its batch from: the workspace the
/// host writes, two resident inputs, or a resident dataset (by id).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FeedKey {
    Host,
    Resident(u64, u64),
    Dataset(u64),
}

/// One checked layer: its slots, sizes (`k` in, `n` out: a `k×n` weight)
/// and activation.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct LayerPlan {
    pub(super) weight: usize,
    pub(super) bias: Option<usize>,
    pub(super) n: usize,
    pub(super) k: usize,
    pub(super) activation: Activation,
}

/// Whether the activation's derivative is computed from its output (so
/// the GEMM's epilogue applies it and no pre-activation is kept).
pub(super) fn fused(activation: Activation) -> bool {
    match activation {
        Activation::Identity | Activation::Relu => true,
        Activation::LeakyRelu { negative_slope } => negative_slope >= 0.0,
        _ => false,
    }
}

/// The loss of a chain's train step, checked.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum LossPlan {
    /// MSE (mean) against `rows×width` targets.
    Mse,
    /// Cross-entropy (mean or sum) against one class index per row, with
    /// its class weights.
    CrossEntropy {
        spec: ClassLossSpec,
        weight: Option<Vec<f32>>,
    },
}

/// A cross-entropy workspace's own buffers: the class weights (where
/// weighted) and the loss's upstream gradient, 1.
#[derive(Debug)]
pub(super) struct ClassLossBuffers {
    pub(super) weight: Option<Buffer>,
    pub(super) one: Buffer,
}

/// A chain's device buffers for one batch shape, and its recorded step.
#[derive(Debug)]
pub(super) struct ChainRun {
    pub(super) rows: usize,
    pub(super) plan: Vec<LayerPlan>,
    pub(super) x: Buffer,
    /// The targets: `rows×width` values (MSE) or `rows` class indices.
    pub(super) y: Buffer,
    pub(super) loss_plan: LossPlan,
    /// Where the loss is cross-entropy.
    pub(super) class_buffers: Option<ClassLossBuffers>,
    /// Per layer: its output, its pre-activation (unfused activations),
    /// the gradient of its output, and of its pre-activation.
    pub(super) outs: Vec<Buffer>,
    pub(super) pres: Vec<Option<Buffer>>,
    pub(super) grads: Vec<Buffer>,
    pub(super) act_grads: Vec<Option<Buffer>>,
    pub(super) loss: Buffer,
    /// Whether one step ran directly (the warm-up).
    pub(super) warmed: bool,
    /// The recorded step, the config and the feed it was recorded with.
    pub(super) graph: Option<(Graph, SgdConfig, FeedKey)>,
}

impl ChainRun {
    /// Whether it serves a step of `plan` with `loss` over `rows`-row batches.
    pub(super) fn fits(&self, rows: usize, plan: &[LayerPlan], loss: &LossPlan) -> bool {
        self.rows == rows && self.plan == plan && &self.loss_plan == loss
    }
}
