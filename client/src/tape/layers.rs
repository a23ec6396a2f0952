//! Layer normalisation and embeddings on the tape, forward and backward:
//! `layer_norm` (one fused kernel each way, the weight's and bias's
//! gradients column sums) and `embedding` (a gather; backward a
//! deterministic scatter-add).

use cistern_runtime::{EmbeddingSpec, KernelLaunch, LayerNormSpec};

use super::backward::Grad;
use super::node::{Op, VarIndex};
use super::rules::Contributions;
use super::sinks::Sinks;
use super::tape::{Tape, checked_len};
use super::var::Var;
use crate::compute::Buffer;
use crate::error::AutodiffError;

/// What a layer norm's backward needs besides its inputs.
#[derive(Clone, Debug)]
pub(super) struct LayerNormRecord {
    pub(super) spec: LayerNormSpec,
    /// Each row's mean and rstd (`2·rows`).
    pub(super) stats: Buffer,
}

/// What an embedding's backward needs: its indices on the device.
#[derive(Clone, Debug)]
pub(super) struct EmbeddingRecord {
    pub(super) spec: EmbeddingSpec,
    pub(super) indices: Buffer,
}

fn invalid(message: String) -> AutodiffError {
    AutodiffError::InvalidArgument(message)
}

impl Tape {
    /// PyTorch's `layer_norm(input, normalized_shape, weight, bias, eps)`:
    /// each slice over the last dimensions `normalized_shape` is centred and
    /// scaled to unit (biased) variance, then scaled by `weight` and shifted
    /// by `bias` (each of `normalized_shape`, optional). With both, one
    /// fused kernel each way; with one, the normalisation then a
    /// broadcasting `mul` or `add`.
    pub fn layer_norm(
        &self,
        input: &Var<'_>,
        normalized_shape: &[usize],
        weight: Option<&Var<'_>>,
        bias: Option<&Var<'_>>,
        eps: f32,
    ) -> Result<Var<'_>, AutodiffError> {
        match (weight, bias) {
            (Some(_), Some(_)) | (None, None) => {}
            (Some(weight), None) => {
                let y = self.layer_norm(input, normalized_shape, None, None, eps)?;
                return self.mul(&y, weight);
            }
            (None, Some(bias)) => {
                let y = self.layer_norm(input, normalized_shape, None, None, eps)?;
                return self.add(&y, bias);
            }
        }
        let input = self.operand(input)?;
        let split = input.shape.len().checked_sub(normalized_shape.len());
        let fits = split.is_some_and(|at| input.shape[at..] == *normalized_shape);
        let (Some(at), true) = (split, fits) else {
            return Err(invalid(format!(
                "layer_norm: normalized_shape {normalized_shape:?} is not the end of the \
                 input's shape {:?}",
                input.shape
            )));
        };
        let cols = checked_len(normalized_shape)?;
        let rows = input.shape[..at].iter().product::<usize>();
        let mut affine = None;
        if let (Some(weight), Some(bias)) = (weight, bias) {
            let (weight, bias) = (self.operand(weight)?, self.operand(bias)?);
            for (name, side) in [("weight", &weight), ("bias", &bias)] {
                if side.shape != normalized_shape {
                    return Err(invalid(format!(
                        "layer_norm: {name} has shape {:?}, expected normalized_shape \
                         {normalized_shape:?}",
                        side.shape
                    )));
                }
            }
            affine = Some((weight, bias));
        }
        let spec = LayerNormSpec {
            rows: rows as u64,
            cols: cols as u64,
            eps,
            affine: affine.is_some(),
        };
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(invalid(format!(
                "layer_norm: eps {eps} is not a finite non-negative value"
            )));
        }
        let y = self.reserve(rows * cols)?;
        let stats = self.reserve(2 * rows)?;
        let bindings = affine
            .as_ref()
            .map(|(weight, bias)| (weight.value.whole(), bias.value.whole()));
        self.launch(KernelLaunch::layer_norm(
            spec,
            input.value.whole(),
            bindings,
            y.whole(),
            stats.whole(),
        ))?;
        let op = Op::LayerNorm {
            input: input.index,
            weight: affine.as_ref().map(|(weight, _)| weight.index),
            bias: affine.as_ref().map(|(_, bias)| bias.index),
            record: Box::new(LayerNormRecord { spec, stats }),
        };
        Ok(self.record(y, input.shape, op))
    }

    /// PyTorch's `embedding(indices, weight)`: row `indices[i]` of `weight`
    /// (`vocab×dim`) for each index, the result of shape `shape + [dim]`
    /// (`shape` the indices' own, holding exactly their count). An index
    /// past the table is `InvalidArgument` naming its position, before
    /// anything is queued. Backward adds each row's gradient into the
    /// table's, in index order (deterministic).
    pub fn embedding(
        &self,
        weight: &Var<'_>,
        indices: &[usize],
        shape: &[usize],
    ) -> Result<Var<'_>, AutodiffError> {
        let weight = self.operand(weight)?;
        let [vocab, dim] = weight.shape[..] else {
            return Err(invalid(format!(
                "embedding: the weight has shape {:?}; it is a vocab×dim matrix",
                weight.shape
            )));
        };
        if checked_len(shape)? != indices.len() {
            return Err(invalid(format!(
                "embedding: {} indices do not fill the shape {shape:?}",
                indices.len()
            )));
        }
        let mut bytes = Vec::with_capacity(4 * indices.len());
        for (position, &index) in indices.iter().enumerate() {
            let word = i32::try_from(index).ok().filter(|_| index < vocab);
            let Some(word) = word else {
                return Err(invalid(format!(
                    "embedding: index {index} at position {position} is past the table's \
                     {vocab} rows"
                )));
            };
            bytes.extend(word.to_ne_bytes());
        }
        let mut out_shape = shape.to_vec();
        out_shape.push(dim);
        let out = self.reserve(checked_len(&out_shape)?)?;
        let indices = self.upload_words(&bytes, indices.len())?;
        let spec = EmbeddingSpec {
            rows: indices.size() / 4,
            dim: dim as u64,
            vocab: vocab as u64,
        };
        self.launch(KernelLaunch::embedding(
            spec,
            weight.value.whole(),
            indices.whole(),
            out.whole(),
        ))?;
        let op = Op::Embedding {
            weight: weight.index,
            record: Box::new(EmbeddingRecord { spec, indices }),
        };
        Ok(self.record(out, out_shape, op))
    }

    /// The contributions of a layer norm to its reached inputs: the
    /// input's from the fused kernel, the weight's and bias's as column
    /// sums of `grad_y ⊙ x̂` and `grad_y`.
    pub(super) fn layer_norm_gradients(
        &self,
        (input, weight, bias): (VarIndex, Option<VarIndex>, Option<VarIndex>),
        record: &LayerNormRecord,
        grad: &Grad,
        reached: impl Fn(VarIndex) -> bool,
        sinks: &mut Sinks,
    ) -> Result<Contributions, AutodiffError> {
        let spec = record.spec;
        let (rows, cols) = (spec.rows as usize, spec.cols as usize);
        let g = self.materialize(grad, rows * cols)?;
        let x = self.with_node(input, |node| node.value.clone());
        let weight_value = weight.map(|w| self.with_node(w, |node| node.value.clone()));
        let weighted = self.reserve(rows * cols)?;
        let mut out = Contributions::new();
        let launch = |grad_x| {
            KernelLaunch::layer_norm_backward(
                spec,
                x.whole(),
                weight_value.as_ref().map(Buffer::whole),
                record.stats.whole(),
                g.whole(),
                grad_x,
                weighted.whole(),
            )
        };
        if reached(input) {
            let grad_x = self.gradient_of(input, rows * cols, sinks, launch)?;
            out.push((input, Grad::Device(grad_x)));
        } else {
            let scratch = self.reserve(rows * cols)?;
            self.launch(launch(scratch.whole()))?;
        }
        let column_sum = |of: &Buffer| {
            let of = of.whole();
            move |sums| KernelLaunch::column_sum(of, spec.rows, spec.cols, sums)
        };
        if let Some(weight) = weight.filter(|&w| reached(w)) {
            let sums = self.gradient_of(weight, cols, sinks, column_sum(&weighted))?;
            out.push((weight, Grad::Device(sums)));
        }
        if let Some(bias) = bias.filter(|&b| reached(b)) {
            let sums = self.gradient_of(bias, cols, sinks, column_sum(&g))?;
            out.push((bias, Grad::Device(sums)));
        }
        Ok(out)
    }

    /// The table's gradient of an embedding: one scatter-add.
    pub(super) fn embedding_gradient(
        &self,
        weight: VarIndex,
        record: &EmbeddingRecord,
        grad: &Grad,
        sinks: &mut Sinks,
    ) -> Result<Buffer, AutodiffError> {
        let spec = record.spec;
        let g = self.materialize(grad, (spec.rows * spec.dim) as usize)?;
        let len = (spec.vocab * spec.dim) as usize;
        self.gradient_of(weight, len, sinks, |out| {
            KernelLaunch::embedding_backward(spec, record.indices.whole(), g.whole(), out)
        })
    }
}
