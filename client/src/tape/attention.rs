//! Dropout from a seeded counter-based generator, scaled dot-product
//! attention composed of the tape's operations, and multi-head attention
//! fused into one kernel over the heads where a linear layer left them.

use cistern_runtime::{AttentionSpec, Binding, DropoutSpec, KernelLaunch};

use super::backward::Grad;
use super::node::{Op, VarIndex};
use super::rules::Contributions;
use super::sinks::Sinks;
use super::tape::Tape;
use super::tensor::Tensor;
use super::var::Var;
use crate::compute::Buffer;
use crate::error::AutodiffError;

impl Tape {
    /// PyTorch's `dropout(input, p, training=True)`: each element is zeroed
    /// with probability `p` and the others scaled by `1/(1 − p)`. The mask
    /// comes from a counter-based generator keyed by `seed`: the same seed
    /// gives the same mask on every backend, and it is never stored
    /// (backward regenerates it). Use a new seed per call. `p` outside
    /// `[0, 1]` is `InvalidArgument`; `p = 0` is the identity (no kernel).
    pub fn dropout(&self, input: &Var<'_>, p: f32, seed: u64) -> Result<Var<'_>, AutodiffError> {
        self.dropout_with(input, p, seed, None)
    }

    /// [`dropout`](Self::dropout) at the step a device word holds: the
    /// mask of `seed + (step << 32)`, where `step` is the `u32` in
    /// `counter` (a store's [`step_counter`], which its steps advance)
    /// when the kernel runs. A step recorded once and replayed so draws a
    /// new mask each time, with no seed from the host; use a new `seed`
    /// per call within a step. `counter` must be one 4-byte word of this
    /// tape's device (`InvalidArgument`, `DeviceMismatch`).
    ///
    /// [`step_counter`]: crate::DeviceParamStore::step_counter
    pub fn dropout_counted(
        &self,
        input: &Var<'_>,
        p: f32,
        seed: u64,
        counter: &Buffer,
    ) -> Result<Var<'_>, AutodiffError> {
        self.client().check_owner(counter)?;
        if counter.size() != 4 {
            return Err(AutodiffError::InvalidArgument(format!(
                "dropout_counted: the counter is one 4-byte word, not {} bytes",
                counter.size()
            )));
        }
        self.dropout_with(input, p, seed, Some(counter.clone()))
    }

    fn dropout_with(
        &self,
        input: &Var<'_>,
        p: f32,
        seed: u64,
        counter: Option<Buffer>,
    ) -> Result<Var<'_>, AutodiffError> {
        let spec = DropoutSpec::new(p, seed)
            .map_err(|error| AutodiffError::InvalidArgument(format!("dropout: {error}")))?;
        let input = self.operand(input)?;
        let len: usize = input.shape.iter().product();
        if u32::try_from(len).is_err() {
            return Err(AutodiffError::InvalidArgument(format!(
                "dropout: {len} elements; the generator counts at most 2^32"
            )));
        }
        let mask = Mask { spec, counter };
        let out = if p == 0.0 {
            input.value.clone()
        } else {
            let out = self.reserve(len)?;
            self.launch(mask.launch(input.value.whole(), out.whole()))?;
            out
        };
        let op = Op::Dropout {
            input: input.index,
            spec: mask.spec,
            counter: mask.counter,
        };
        Ok(self.record(out, input.shape, op))
    }

    /// The gradient of a dropout: the same mask over the value's gradient.
    pub(super) fn dropout_gradient(
        &self,
        input: VarIndex,
        mask: &Mask,
        grad: &Grad,
        len: usize,
        sinks: &mut Sinks,
    ) -> Result<Grad, AutodiffError> {
        if mask.spec.threshold == 0 && mask.spec.scale == 1.0 {
            return Ok(grad.clone());
        }
        let g = self.materialize(grad, len)?;
        let out = self.gradient_of(input, len, sinks, |out| mask.launch(g.whole(), out))?;
        Ok(Grad::Device(out))
    }

    /// PyTorch's `scaled_dot_product_attention(q, k, v, attn_mask,
    /// is_causal)`: `softmax(q·kᵀ/√d + mask)·v` over batches, `q` being
    /// `[..., L, d]`, `k` `[..., S, d]`, `v` `[..., S, dv]`; the result is
    /// `[..., L, dv]`. `mask` is added to the scores (a float mask that
    /// broadcasts to `[..., L, S]`: 0 to attend, −∞ not to); `causal` hides
    /// every key after the query's position (with `mask`, both apply).
    /// Composed of `transpose`, `matmul`, `scale`, `add` and `softmax`, each
    /// with its own backward.
    pub fn scaled_dot_product_attention(
        &self,
        q: &Var<'_>,
        k: &Var<'_>,
        v: &Var<'_>,
        mask: Option<&Var<'_>>,
        causal: bool,
    ) -> Result<Var<'_>, AutodiffError> {
        let (q_shape, k_shape) = (q.shape(), k.shape());
        let (Some(&d), Some(&l), Some(&s)) = (
            q_shape.last(),
            q_shape.iter().rev().nth(1),
            k_shape.iter().rev().nth(1),
        ) else {
            return Err(AutodiffError::InvalidArgument(format!(
                "scaled_dot_product_attention: q {q_shape:?} and k {k_shape:?} need at least \
                 two dimensions"
            )));
        };
        let keys = self.transpose(k, -1, -2)?;
        let scores = self.matmul(q, &keys)?;
        let mut scores = self.scale(&scores, 1.0 / (d as f32).sqrt())?;
        if let Some(mask) = mask {
            scores = self.add(&scores, mask)?;
        }
        if causal {
            let hidden = causal_mask(l, s)?;
            let hidden = self.upload(&hidden)?;
            scores = self.add(&scores, &hidden)?;
        }
        let weights = self.softmax(&scores)?;
        self.matmul(&weights, v)
    }
}

/// What a fused attention keeps for its backward: its shape and the
/// attention weights.
#[derive(Clone, Debug)]
pub(super) struct AttentionRecord {
    pub(super) spec: AttentionSpec,
    pub(super) weights: Buffer,
}

impl Tape {
    /// Multi-head attention over `heads` heads, fused: `q` is `[B, L, E]`,
    /// `k` and `v` `[B, S, E]` (`E = heads·head_dim`, as linear layers
    /// produce them), and the result `[B, L, E]` equals
    /// `merge(scaled_dot_product_attention(split(q), split(k), split(v),
    /// None, causal))`, where `split` views `[B, T, E]` as `[B, heads, T,
    /// head_dim]` and `merge` is its inverse. One kernel reads the heads in
    /// place (no permute copies) and keeps the attention weights; the
    /// backward is two kernels. Shapes that disagree, or `E` not a multiple
    /// of `heads`, are `InvalidArgument`.
    pub fn multi_head_attention(
        &self,
        q: &Var<'_>,
        k: &Var<'_>,
        v: &Var<'_>,
        heads: usize,
        causal: bool,
    ) -> Result<Var<'_>, AutodiffError> {
        let (q, k, v) = (self.operand(q)?, self.operand(k)?, self.operand(v)?);
        let refuse = |why: String| {
            Err(AutodiffError::InvalidArgument(format!(
                "multi_head_attention: q {:?}, k {:?}, v {:?}: {why}",
                q.shape, k.shape, v.shape
            )))
        };
        let ([b, l, e], [kb, s, ke]) = (&q.shape[..], &k.shape[..]) else {
            return refuse("q and k must be [batch, positions, embedding]".into());
        };
        if (kb, ke) != (b, e) || v.shape != k.shape {
            return refuse("k and v must share q's batch and embedding, and one shape".into());
        }
        if heads == 0 || e % heads != 0 {
            return refuse(format!(
                "an embedding of {e} does not split into {heads} heads"
            ));
        }
        let head_dim = e / heads;
        let spec = AttentionSpec {
            batch: *b as u64,
            heads: heads as u64,
            queries: *l as u64,
            keys: *s as u64,
            head_dim: head_dim as u64,
            scale: 1.0 / (head_dim as f32).sqrt(),
            causal,
        };
        spec.validate().map_err(|error| {
            AutodiffError::InvalidArgument(format!("multi_head_attention: {error}"))
        })?;
        let out = self.reserve(b * l * e)?;
        let weights = self.reserve(b * heads * l * s)?;
        self.launch(KernelLaunch::attention(
            spec,
            [q.value.whole(), k.value.whole(), v.value.whole()],
            out.whole(),
            weights.whole(),
        ))?;
        let op = Op::Attention {
            q: q.index,
            k: k.index,
            v: v.index,
            record: Box::new(AttentionRecord { spec, weights }),
        };
        Ok(self.record(out, q.shape, op))
    }

    /// The contributions of a fused attention to `q`, `k` and `v`: the
    /// queries' half of the backward, then the keys' (run whatever was
    /// reached: each half writes two gradients).
    pub(super) fn attention_gradients(
        &self,
        [q, k, v]: [VarIndex; 3],
        record: &AttentionRecord,
        grad: &Grad,
        reached: impl Fn(VarIndex) -> bool,
    ) -> Result<Contributions, AutodiffError> {
        let spec = record.spec;
        let (queries, keys) = (
            (spec.batch * spec.queries * spec.heads * spec.head_dim) as usize,
            (spec.batch * spec.keys * spec.heads * spec.head_dim) as usize,
        );
        let g = self.materialize(grad, queries)?;
        let value = |index| self.with_node(index, |node| node.value.clone());
        let (q_value, k_value, v_value) = (value(q), value(k), value(v));
        let scores = self.reserve((spec.batch * spec.heads * spec.queries * spec.keys) as usize)?;
        let grad_q = self.reserve(queries)?;
        self.launch(KernelLaunch::attention_backward_queries(
            spec,
            [
                k_value.whole(),
                v_value.whole(),
                record.weights.whole(),
                g.whole(),
            ],
            scores.whole(),
            grad_q.whole(),
        ))?;
        let mut out = Contributions::new();
        if reached(q) {
            out.push((q, Grad::Device(grad_q)));
        }
        if reached(k) || reached(v) {
            let (grad_k, grad_v) = (self.reserve(keys)?, self.reserve(keys)?);
            self.launch(KernelLaunch::attention_backward_keys(
                spec,
                [
                    q_value.whole(),
                    record.weights.whole(),
                    g.whole(),
                    scores.whole(),
                ],
                grad_k.whole(),
                grad_v.whole(),
            ))?;
            for (index, gradient) in [(k, grad_k), (v, grad_v)] {
                if reached(index) {
                    out.push((index, Grad::Device(gradient)));
                }
            }
        }
        Ok(out)
    }
}

/// An `l×s` float mask hiding every key after the query's position
/// (PyTorch's `is_causal`: query `i` sees keys `0..=i`).
fn causal_mask(l: usize, s: usize) -> Result<Tensor<f32>, AutodiffError> {
    let data = (0..l)
        .flat_map(|i| (0..s).map(move |j| if j <= i { 0.0 } else { f32::NEG_INFINITY }))
        .collect();
    Ok(Tensor::new([l, s], data)?)
}

/// A dropout's mask: its spec, and the step counter it reads, if counted.
pub(super) struct Mask {
    pub(super) spec: DropoutSpec,
    pub(super) counter: Option<Buffer>,
}

impl Mask {
    /// The launch applying the mask to `x` into `out`.
    fn launch(&self, x: Binding, out: Binding) -> KernelLaunch {
        match &self.counter {
            Some(counter) => KernelLaunch::dropout_counted(self.spec, x, counter.whole(), out),
            None => KernelLaunch::dropout(self.spec, x, out),
        }
    }
}
