//! Dropout from a seeded counter-based generator, and scaled dot-product
//! attention composed of the tape's operations.

use cistern_runtime::{DropoutSpec, KernelLaunch};

use super::backward::Grad;
use super::node::{Op, VarIndex};
use super::sinks::Sinks;
use super::tape::Tape;
use super::tensor::Tensor;
use super::var::Var;
use crate::error::AutodiffError;

impl Tape {
    /// PyTorch's `dropout(input, p, training=True)`: each element is zeroed
    /// with probability `p` and the others scaled by `1/(1 − p)`. The mask
    /// comes from a counter-based generator keyed by `seed`: the same seed
    /// gives the same mask on every backend, and it is never stored
    /// (backward regenerates it). Use a new seed per call. `p` outside
    /// `[0, 1]` is `InvalidArgument`; `p = 0` is the identity (no kernel).
    pub fn dropout(&self, input: &Var<'_>, p: f32, seed: u64) -> Result<Var<'_>, AutodiffError> {
        let spec = DropoutSpec::new(p, seed)
            .map_err(|error| AutodiffError::InvalidArgument(format!("dropout: {error}")))?;
        let input = self.operand(input)?;
        let len: usize = input.shape.iter().product();
        if u32::try_from(len).is_err() {
            return Err(AutodiffError::InvalidArgument(format!(
                "dropout: {len} elements; the generator counts at most 2^32"
            )));
        }
        let out = if p == 0.0 {
            input.value.clone()
        } else {
            let out = self.reserve(len)?;
            let launch = KernelLaunch::dropout(spec, input.value.whole(), out.whole());
            self.launch(launch)?;
            out
        };
        let op = Op::Dropout {
            input: input.index,
            spec,
        };
        Ok(self.record(out, input.shape, op))
    }

    /// The gradient of a dropout: the same mask over the value's gradient.
    pub(super) fn dropout_gradient(
        &self,
        input: VarIndex,
        spec: DropoutSpec,
        grad: &Grad,
        len: usize,
        sinks: &mut Sinks,
    ) -> Result<Grad, AutodiffError> {
        if spec.threshold == 0 && spec.scale == 1.0 {
            return Ok(grad.clone());
        }
        let g = self.materialize(grad, len)?;
        let out = self.gradient_of(input, len, sinks, |out| {
            KernelLaunch::dropout(spec, g.whole(), out)
        })?;
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

/// An `l×s` float mask hiding every key after the query's position
/// (PyTorch's `is_causal`: query `i` sees keys `0..=i`).
fn causal_mask(l: usize, s: usize) -> Result<Tensor<f32>, AutodiffError> {
    let data = (0..l)
        .flat_map(|i| (0..s).map(move |j| if j <= i { 0.0 } else { f32::NEG_INFINITY }))
        .collect();
    Ok(Tensor::new([l, s], data)?)
}
