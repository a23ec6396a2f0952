//! The kernel catalogue: a stable name for every kernel, by which a server
//! launches it on any backend. The element-wise kernels are one entry,
//! [`KernelId::Map`], named by their definitions (`map/ops.rs`).

use serde::{Deserialize, Serialize};

use crate::map::MapOp;

macro_rules! catalogue {
    ($($(#[doc = $doc:literal])* $variant:ident => $name:literal,)*) => {
        /// Every kernel Cistern can launch. Names are stable: the runtime's
        /// errors, and so telemetry, name kernels by them.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[non_exhaustive]
        pub enum KernelId {
            $($(#[doc = $doc])* $variant,)*
            /// An element-wise kernel, one definition each ([`crate::map`]).
            Map(MapOp),
        }

        impl KernelId {
            /// Every kernel, in catalogue order, the element-wise ones last.
            pub fn all() -> Vec<KernelId> {
                let custom = [$(KernelId::$variant,)*];
                let map = MapOp::ALL.iter().map(|&op| KernelId::Map(op));
                custom.into_iter().chain(map).collect()
            }

            /// The kernel's stable snake_case name.
            pub const fn name(self) -> &'static str {
                match self {
                    $(KernelId::$variant => $name,)*
                    KernelId::Map(op) => op.name(),
                }
            }

            /// The kernel with that name, if there is one.
            pub fn from_name(name: &str) -> Option<KernelId> {
                match name {
                    $($name => Some(KernelId::$variant),)*
                    _ => MapOp::from_name(name).map(KernelId::Map),
                }
            }
        }
    };
}

catalogue! {
    /// Does nothing; measures launch overhead.
    Empty => "empty",
    /// Faults on purpose; what a fault does is the runtime's to define.
    Trap => "trap",
    /// Copies src to dst (CPU: [`crate::copy`]); the health probe's kernel.
    Identity => "identity",
    /// [`crate::copy`].
    Copy => "copy",
    /// ReLU forward.
    ReluForward => "relu_forward",
    /// ReLU backward.
    ReluBackward => "relu_backward",
    /// Leaky ReLU forward.
    LeakyReluForward => "leaky_relu_forward",
    /// Leaky ReLU backward.
    LeakyReluBackward => "leaky_relu_backward",
    /// Exact (erf) GELU forward.
    GeluForward => "gelu_forward",
    /// Exact (erf) GELU backward.
    GeluBackward => "gelu_backward",
    /// Tanh-approximated GELU forward.
    GeluTanhForward => "gelu_tanh_forward",
    /// Tanh-approximated GELU backward.
    GeluTanhBackward => "gelu_tanh_backward",
    /// Tanh forward.
    TanhForward => "tanh_forward",
    /// Tanh backward.
    TanhBackward => "tanh_backward",
    /// Sigmoid forward.
    SigmoidForward => "sigmoid_forward",
    /// Sigmoid backward.
    SigmoidBackward => "sigmoid_backward",
    /// [`crate::gemm`] with its fused bias + activation epilogue.
    Gemm => "gemm",
    /// [`crate::column_sum`] (bias gradient).
    ColumnSum => "column_sum",
    /// [`crate::mse_loss`].
    MseLoss => "mse_loss",
    /// [`crate::segment_sum`].
    SegmentSum => "segment_sum",
    /// [`crate::segment_sum_squares`].
    SegmentSumSquares => "segment_sum_squares",
    /// [`crate::amp_unscale`].
    AmpUnscale => "amp_unscale",
    /// [`crate::sgd_step`].
    SgdStep => "sgd_step",
    /// [`crate::adam_step`].
    AdamStep => "adam_step",
    /// [`crate::adamw_step`].
    AdamWStep => "adamw_step",
    /// [`crate::rmsprop_step`].
    RmsPropStep => "rmsprop_step",
    /// [`crate::adagrad_step`].
    AdagradStep => "adagrad_step",
    /// [`crate::lamb_step`].
    LambStep => "lamb_step",
    /// [`crate::amp_unscale_by_device_scale`].
    AmpUnscaleByDeviceScale => "amp_unscale_by_device_scale",
    /// [`crate::amp_update_scale`].
    AmpUpdateScale => "amp_update_scale",
    /// [`crate::softmax`], `log = false`.
    Softmax => "softmax",
    /// [`crate::softmax`], `log = true`.
    LogSoftmax => "log_softmax",
    /// [`crate::softmax_backward`], `log = false`.
    SoftmaxBackward => "softmax_backward",
    /// [`crate::softmax_backward`], `log = true`.
    LogSoftmaxBackward => "log_softmax_backward",
    /// [`crate::class_loss`] over logits.
    CrossEntropy => "cross_entropy",
    /// [`crate::class_loss_backward`] over logits.
    CrossEntropyBackward => "cross_entropy_backward",
    /// [`crate::class_loss`] over log-probabilities.
    NllLoss => "nll_loss",
    /// [`crate::class_loss_backward`] over log-probabilities.
    NllLossBackward => "nll_loss_backward",
    /// [`crate::broadcast_binary`]: add, sub, mul or div with broadcasting.
    BroadcastBinary => "broadcast_binary",
    /// [`crate::strided_sum`]: a sum over strided dimensions, or a gather.
    StridedSum => "strided_sum",
    /// [`crate::layer_norm`]: layer normalisation over rows.
    LayerNorm => "layer_norm",
    /// [`crate::layer_norm_backward`]: its fused backward.
    LayerNormBackward => "layer_norm_backward",
    /// [`crate::embedding`]: a gather of table rows by index.
    Embedding => "embedding",
    /// [`crate::embedding_backward`]: its deterministic scatter-add.
    EmbeddingBackward => "embedding_backward",
    /// [`crate::dropout::dropout`]: a seeded counter-based mask, scaled.
    Dropout => "dropout",
    /// [`crate::batched_gemm`]: a batch of GEMMs of one shape in one launch.
    BatchedGemm => "batched_gemm",
    /// [`crate::batch_gather`]: a resident dataset's batch of the step its
    /// device-side counter names, then the counter advanced.
    BatchGather => "batch_gather",
    /// [`crate::max_dim`]: the maximum over one dimension and its index.
    MaxDim => "max_dim",
    /// [`crate::max_dim_backward`]: the gradient routed to that index.
    MaxDimBackward => "max_dim_backward",
    /// [`crate::attention`]: multi-head attention over heads in place.
    Attention => "attention",
    /// [`crate::attention_backward_queries`]: the scores' and queries' gradients.
    AttentionBackwardQueries => "attention_backward_queries",
    /// [`crate::attention_backward_keys`]: the keys' and values' gradients.
    AttentionBackwardKeys => "attention_backward_keys",
    /// [`crate::dropout::dropout_counted`]: dropout at the step a device word holds.
    DropoutCounted => "dropout_counted",
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_name_is_unique_and_round_trips() {
        let all = KernelId::all();
        let mut names: Vec<_> = all.iter().map(|k| k.name()).collect();
        for &kernel in &all {
            assert_eq!(KernelId::from_name(kernel.name()), Some(kernel));
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all.len());
        assert_eq!(KernelId::from_name("no_such_kernel"), None);
    }
}
