//! Constructors of well-formed launches, one per kernel: bindings in the
//! order of the kernel's signature.

use cistern_kernels::{
    Activation, AttentionSpec, BatchedGemmSpec, BroadcastSpec, ClassLossSpec, DropoutSpec,
    EmbeddingSpec, GatherSpec, GemmSpec, LayerNormSpec, MapOp, MaxDimSpec, ScaleRule, SumSpec,
};

use super::{Binding, Kernel, KernelLaunch};
use crate::optimizer::SegmentTable;

impl KernelLaunch {
    /// A launch of `kernel` over `bindings` (in signature order).
    pub fn new(kernel: Kernel, bindings: Vec<Binding>) -> Self {
        KernelLaunch { kernel, bindings }
    }

    /// The element-wise kernel `op` with `scalars` over `bindings` (its
    /// inputs, then its output unless it writes in place).
    pub fn map(op: MapOp, scalars: &[f32], bindings: Vec<Binding>) -> Self {
        Self::new(Kernel::map(op, scalars), bindings)
    }

    /// `fill`: every `f32` of `target` becomes `value`.
    pub fn fill(target: Binding, value: f32) -> Self {
        Self::map(MapOp::Fill, &[value], vec![target])
    }

    /// `Copy`: `source`'s bytes to `target`.
    pub fn copy(source: Binding, target: Binding) -> Self {
        Self::new(Kernel::Copy, vec![source, target])
    }

    /// `Identity`: `source`'s `f32`s to `target`.
    pub fn identity(source: Binding, target: Binding) -> Self {
        Self::new(Kernel::Identity, vec![source, target])
    }

    /// `Empty`: a launch that does nothing but count one run.
    pub fn empty() -> Self {
        Self::new(Kernel::Empty, Vec::new())
    }

    /// `Trap`: a launch that faults on the device and poisons its context.
    pub fn trap() -> Self {
        Self::new(Kernel::Trap, Vec::new())
    }

    /// `scale`: `x ← factor·x`.
    pub fn scale(x: Binding, factor: f32) -> Self {
        Self::map(MapOp::Scale, &[factor], vec![x])
    }

    /// `axpy`: `a ← a + alpha·c` (equal sizes).
    pub fn axpy(a: Binding, alpha: f32, c: Binding) -> Self {
        Self::map(MapOp::Axpy, &[alpha], vec![a, c])
    }

    /// `add`: `out ← a + b` (equal sizes).
    pub fn add(a: Binding, b: Binding, out: Binding) -> Self {
        Self::map(MapOp::Add, &[], vec![a, b, out])
    }

    /// `mul`: `out ← a ⊙ b` (equal sizes).
    pub fn mul(a: Binding, b: Binding, out: Binding) -> Self {
        Self::map(MapOp::Mul, &[], vec![a, b, out])
    }

    /// `ActivationForward`: `y ← act(x)` (equal sizes).
    pub fn activation_forward(activation: Activation, x: Binding, y: Binding) -> Self {
        Self::new(Kernel::ActivationForward { activation }, vec![x, y])
    }

    /// `ActivationBackward`: `grad_in ← grad_out · act'(x)` (equal sizes).
    pub fn activation_backward(
        activation: Activation,
        x: Binding,
        grad_out: Binding,
        grad_in: Binding,
    ) -> Self {
        let kernel = Kernel::ActivationBackward { activation };
        Self::new(kernel, vec![x, grad_out, grad_in])
    }

    /// `Gemm`: `c ← act(op(a)·op(b) + bias)` as `spec` describes.
    pub fn gemm(spec: GemmSpec, a: Binding, b: Binding, bias: Option<Binding>, c: Binding) -> Self {
        let kernel = Kernel::Gemm {
            spec: Box::new(spec),
            bias: bias.is_some(),
        };
        let bindings = match bias {
            Some(bias) => vec![a, b, bias, c],
            None => vec![a, b, c],
        };
        Self::new(kernel, bindings)
    }

    /// `ColumnSum`: `out[j] ← Σ_i x[i][j]` over a `rows×cols` matrix.
    pub fn column_sum(x: Binding, rows: u64, cols: u64, out: Binding) -> Self {
        Self::new(Kernel::ColumnSum { rows, cols }, vec![x, out])
    }

    /// `MseLoss`: `out[0] ← Σ (pred − target)² / n`.
    pub fn mse_loss(pred: Binding, target: Binding, out: Binding) -> Self {
        Self::new(Kernel::MseLoss, vec![pred, target, out])
    }

    /// `mse_loss_backward`: `grad ← grad_output · 2(pred − target) / n`,
    /// `n` being `pred`'s elements.
    pub fn mse_loss_backward(
        pred: Binding,
        target: Binding,
        grad_output: f32,
        grad: Binding,
    ) -> Self {
        let n = usize::try_from(pred.size / 4).unwrap_or(usize::MAX);
        let factor = cistern_kernels::mse_backward_factor(grad_output, n);
        Self::map(MapOp::MseLossBackward, &[factor], vec![pred, target, grad])
    }

    /// `SegmentSum`: `out[s] ← Σ x[segment s]`.
    pub fn segment_sum(x: Binding, segments: impl Into<SegmentTable>, out: Binding) -> Self {
        let segments = segments.into();
        Self::new(Kernel::SegmentSum { segments }, vec![x, out])
    }

    /// `SegmentSumSquares`: `out[s] ← Σ x[segment s]²`.
    pub fn segment_sum_squares(
        x: Binding,
        segments: impl Into<SegmentTable>,
        out: Binding,
    ) -> Self {
        let segments = segments.into();
        Self::new(Kernel::SegmentSumSquares { segments }, vec![x, out])
    }

    /// `AmpUnscale`: `grads ← grads·inv_scale`; sets `found_inf` (one `f32`)
    /// to 1 on a non-finite gradient and never clears it.
    pub fn amp_unscale(grads: Binding, inv_scale: f32, found_inf: Binding) -> Self {
        Self::new(Kernel::AmpUnscale { inv_scale }, vec![grads, found_inf])
    }

    /// `AmpUnscaleByDeviceScale`: `grads ← grads / scale[0]`; sets
    /// `found_inf` on a non-finite gradient and never clears it.
    pub fn amp_unscale_by_device_scale(grads: Binding, found_inf: Binding, scale: Binding) -> Self {
        let kernel = Kernel::AmpUnscaleByDeviceScale;
        Self::new(kernel, vec![grads, found_inf, scale])
    }

    /// `AmpUpdateScale`: the scale, growth tracker and skip count after a
    /// step whose flag is `found_inf`, by `rule`.
    pub fn amp_update_scale(
        rule: ScaleRule,
        found_inf: Binding,
        scale: Binding,
        tracker: Binding,
        skipped: Binding,
    ) -> Self {
        let kernel = Kernel::AmpUpdateScale { rule };
        Self::new(kernel, vec![found_inf, scale, tracker, skipped])
    }

    /// `Softmax`: `y ← softmax(x)` (or log-softmax) over each row of a
    /// `rows×cols` matrix.
    pub fn softmax(x: Binding, rows: u64, cols: u64, log: bool, y: Binding) -> Self {
        Self::new(Kernel::Softmax { rows, cols, log }, vec![x, y])
    }

    /// `SoftmaxBackward`: the input's gradient from the output `y` and its
    /// gradient.
    pub fn softmax_backward(
        y: Binding,
        grad_output: Binding,
        rows: u64,
        cols: u64,
        log: bool,
        grad_input: Binding,
    ) -> Self {
        let kernel = Kernel::SoftmaxBackward { rows, cols, log };
        Self::new(kernel, vec![y, grad_output, grad_input])
    }

    /// `ClassLoss`: the loss of `spec` over `input` and `targets` (`i32`
    /// words), weighted by `weight` when given (which sets `spec.weighted`).
    pub fn class_loss(
        mut spec: ClassLossSpec,
        input: Binding,
        targets: Binding,
        weight: Option<Binding>,
        out: Binding,
    ) -> Self {
        spec.weighted = weight.is_some();
        let bindings = [Some(input), Some(targets), weight, Some(out)];
        let kernel = Kernel::ClassLoss(Box::new(spec));
        Self::new(kernel, bindings.into_iter().flatten().collect())
    }

    /// `ClassLossBackward`: the input's gradient of the loss of `spec`,
    /// given the loss's gradient; `weight` sets `spec.weighted`.
    pub fn class_loss_backward(
        mut spec: ClassLossSpec,
        input: Binding,
        targets: Binding,
        weight: Option<Binding>,
        grad_output: Binding,
        grad_input: Binding,
    ) -> Self {
        spec.weighted = weight.is_some();
        let bindings = [
            Some(input),
            Some(targets),
            weight,
            Some(grad_output),
            Some(grad_input),
        ];
        let kernel = Kernel::ClassLossBackward(Box::new(spec));
        Self::new(kernel, bindings.into_iter().flatten().collect())
    }

    /// `BroadcastBinary`: `out ← a op b` through the strides of `spec`.
    pub fn broadcast_binary(spec: BroadcastSpec, a: Binding, b: Binding, out: Binding) -> Self {
        Self::new(Kernel::BroadcastBinary(Box::new(spec)), vec![a, b, out])
    }

    /// `StridedSum`: `out ← scale·Σ x` over the summed dimensions of
    /// `spec` (a strided gather when it sums over none).
    pub fn strided_sum(spec: SumSpec, x: Binding, out: Binding) -> Self {
        Self::new(Kernel::StridedSum(Box::new(spec)), vec![x, out])
    }

    /// `LayerNorm`: `y ← (x − mean)·rstd (·weight + bias)` over each row,
    /// the stats written; `affine` (weight, bias) sets `spec.affine`.
    pub fn layer_norm(
        mut spec: LayerNormSpec,
        x: Binding,
        affine: Option<(Binding, Binding)>,
        y: Binding,
        stats: Binding,
    ) -> Self {
        spec.affine = affine.is_some();
        let mut bindings = vec![x];
        bindings.extend(affine.into_iter().flat_map(|(w, b)| [w, b]));
        bindings.extend([y, stats]);
        Self::new(Kernel::LayerNorm(Box::new(spec)), bindings)
    }

    /// `LayerNormBackward`: the input's gradient and `grad_y ⊙ x̂` from the
    /// forward's stats; `weight` sets `spec.affine`.
    pub fn layer_norm_backward(
        mut spec: LayerNormSpec,
        x: Binding,
        weight: Option<Binding>,
        stats: Binding,
        grad_y: Binding,
        grad_x: Binding,
        weighted: Binding,
    ) -> Self {
        spec.affine = weight.is_some();
        let bindings = [
            Some(x),
            weight,
            Some(stats),
            Some(grad_y),
            Some(grad_x),
            Some(weighted),
        ];
        let kernel = Kernel::LayerNormBackward(Box::new(spec));
        Self::new(kernel, bindings.into_iter().flatten().collect())
    }

    /// `BatchedGemm`: `c_i ← op(a_i)·op(b_i)` for each product of `spec`.
    pub fn batched_gemm(spec: BatchedGemmSpec, a: Binding, b: Binding, c: Binding) -> Self {
        Self::new(Kernel::BatchedGemm(Box::new(spec)), vec![a, b, c])
    }

    /// `Dropout`: `out ← mask(seed)·x·scale`; also its own backward.
    pub fn dropout(spec: DropoutSpec, x: Binding, out: Binding) -> Self {
        Self::new(Kernel::Dropout(Box::new(spec)), vec![x, out])
    }

    /// `DropoutCounted`: [`dropout`](Self::dropout) under `spec`'s seed
    /// plus the step `counter` (one `u32` word) holds, shifted to the high
    /// word; also its own backward.
    pub fn dropout_counted(spec: DropoutSpec, x: Binding, counter: Binding, out: Binding) -> Self {
        Self::new(
            Kernel::DropoutCounted(Box::new(spec)),
            vec![x, counter, out],
        )
    }

    /// `BatchGather`: the batch of step `counter` of a resident dataset
    /// into `x` and `y`, then `counter += 1`.
    pub fn batch_gather(
        spec: GatherSpec,
        features: Binding,
        targets: Binding,
        counter: Binding,
        x: Binding,
        y: Binding,
    ) -> Self {
        let kernel = Kernel::BatchGather(Box::new(spec));
        Self::new(kernel, vec![features, targets, counter, x, y])
    }

    /// `Embedding`: `out[i] ← weight[indices[i]]` (`i32` indices).
    pub fn embedding(spec: EmbeddingSpec, weight: Binding, indices: Binding, out: Binding) -> Self {
        Self::new(
            Kernel::Embedding(Box::new(spec)),
            vec![weight, indices, out],
        )
    }

    /// `EmbeddingBackward`: the table's gradient, a deterministic scatter-add.
    pub fn embedding_backward(
        spec: EmbeddingSpec,
        indices: Binding,
        grad_out: Binding,
        grad_weight: Binding,
    ) -> Self {
        let kernel = Kernel::EmbeddingBackward(Box::new(spec));
        Self::new(kernel, vec![indices, grad_out, grad_weight])
    }

    /// `MaxDim`: `values`, `indices` ← the maximum over the middle
    /// dimension of `x` and its first index.
    pub fn max_dim(spec: MaxDimSpec, x: Binding, values: Binding, indices: Binding) -> Self {
        Self::new(Kernel::MaxDim(Box::new(spec)), vec![x, values, indices])
    }

    /// `MaxDimBackward`: `grad_x` ← each `grad_out` at its index, 0 elsewhere.
    pub fn max_dim_backward(
        spec: MaxDimSpec,
        indices: Binding,
        grad_out: Binding,
        grad_x: Binding,
    ) -> Self {
        let kernel = Kernel::MaxDimBackward(Box::new(spec));
        Self::new(kernel, vec![indices, grad_out, grad_x])
    }

    /// `Attention`: `out ← softmax(q·kᵀ·scale)·v` per sequence and head,
    /// the weights kept for the backward.
    pub fn attention(
        spec: AttentionSpec,
        [q, k, v]: [Binding; 3],
        out: Binding,
        weights: Binding,
    ) -> Self {
        Self::new(
            Kernel::Attention(Box::new(spec)),
            vec![q, k, v, out, weights],
        )
    }

    /// `AttentionBackwardQueries`: the scores' gradient and `grad_q`.
    pub fn attention_backward_queries(
        spec: AttentionSpec,
        [k, v, weights, grad_out]: [Binding; 4],
        grad_scores: Binding,
        grad_q: Binding,
    ) -> Self {
        let kernel = Kernel::AttentionBackwardQueries(Box::new(spec));
        Self::new(kernel, vec![k, v, weights, grad_out, grad_scores, grad_q])
    }

    /// `AttentionBackwardKeys`: `grad_k` and `grad_v`.
    pub fn attention_backward_keys(
        spec: AttentionSpec,
        [q, weights, grad_out, grad_scores]: [Binding; 4],
        grad_k: Binding,
        grad_v: Binding,
    ) -> Self {
        let kernel = Kernel::AttentionBackwardKeys(Box::new(spec));
        Self::new(
            kernel,
            vec![q, weights, grad_out, grad_scores, grad_k, grad_v],
        )
    }
}
