//! Reductions over dimensions and views, forward: `sum_dim`, `mean_dim`,
//! `max_dim`, `reshape` (free), `permute` and `transpose` (a strided copy).
//! `docs/tape.md` has their shape rules.

use cistern_runtime::{KernelLaunch, MaxDimSpec};

use super::node::Op;
use super::strides::{axis, check_rank, permute_spec, sum_dims_spec};
use super::tape::{Tape, checked_len};
use super::var::Var;
use crate::compute::Buffer;
use crate::error::AutodiffError;

/// The indices of a [`Tape::max_dim_with_indices`]: where along the
/// reduced dimension each maximum is, on the device until read. Borrows
/// its tape, as a [`Var`] does.
#[derive(Clone)]
pub struct DimIndices<'t> {
    tape: &'t Tape,
    buffer: Buffer,
    shape: Vec<usize>,
}

impl DimIndices<'_> {
    /// Their shape: the values' shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Reads them back (a synchronisation of the tape's stream), row-major
    /// in [`shape`](Self::shape), as PyTorch's `int64` indices. A failure
    /// of the tape's work is its error.
    pub fn to_host(&self) -> Result<Vec<i64>, AutodiffError> {
        let len = self.shape.iter().product();
        let words = self.tape.read_words(&self.buffer, len)?;
        Ok(words
            .into_iter()
            .map(|word| i64::from(word as i32))
            .collect())
    }
}

impl std::fmt::Debug for DimIndices<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DimIndices")
            .field("tape", &self.tape.id())
            .field("shape", &self.shape)
            .finish()
    }
}

impl Tape {
    /// The sum over the dimensions `dims` (negative ones count from the
    /// end), as PyTorch's `sum(dim, keepdim)`: with `keepdim` the summed
    /// dimensions stay as 1s, else they are removed. Each dimension is
    /// named once; at least one is named.
    pub fn sum_dim(
        &self,
        input: &Var<'_>,
        dims: &[isize],
        keepdim: bool,
    ) -> Result<Var<'_>, AutodiffError> {
        self.sum_dims("sum_dim", input, dims, keepdim, false)
    }

    /// The mean over the dimensions `dims`, as PyTorch's `mean(dim,
    /// keepdim)`; the rules of [`sum_dim`](Tape::sum_dim).
    pub fn mean_dim(
        &self,
        input: &Var<'_>,
        dims: &[isize],
        keepdim: bool,
    ) -> Result<Var<'_>, AutodiffError> {
        self.sum_dims("mean_dim", input, dims, keepdim, true)
    }

    fn sum_dims(
        &self,
        name: &str,
        input: &Var<'_>,
        dims: &[isize],
        keepdim: bool,
        mean: bool,
    ) -> Result<Var<'_>, AutodiffError> {
        let input = self.operand(input)?;
        check_rank(name, &input.shape)?;
        let dims = distinct_axes(name, dims, input.shape.len())?;
        if dims.is_empty() {
            return Err(AutodiffError::InvalidArgument(format!(
                "{name}: name at least one dimension (sum() and mean() reduce them all)"
            )));
        }
        let count: usize = dims.iter().map(|&d| input.shape[d]).product();
        let scale = if mean { 1.0 / count as f32 } else { 1.0 };
        let shape: Vec<usize> = (input.shape.iter().enumerate())
            .filter_map(|(d, &n)| match dims.contains(&d) {
                true if keepdim => Some(1),
                true => None,
                false => Some(n),
            })
            .collect();
        let out = self.reserve(checked_len(&shape)?)?;
        let spec = sum_dims_spec(&input.shape, &dims, scale);
        self.launch(KernelLaunch::strided_sum(
            spec,
            input.value.whole(),
            out.whole(),
        ))?;
        let op = Op::SumDims {
            input: input.index,
            dims,
            mean,
        };
        Ok(self.record(out, shape, op))
    }

    /// The maximum over dimension `dim` (negative counts from the end), as
    /// the values of PyTorch's `torch.max(input, dim, keepdim)`: with
    /// `keepdim` the dimension stays as a 1, else it is removed. Backward
    /// routes each gradient to the index PyTorch returns, the first
    /// maximal element (a NaN counts as the largest: the first NaN wins).
    pub fn max_dim(
        &self,
        input: &Var<'_>,
        dim: isize,
        keepdim: bool,
    ) -> Result<Var<'_>, AutodiffError> {
        Ok(self.max_dim_with_indices(input, dim, keepdim)?.0)
    }

    /// [`max_dim`](Tape::max_dim) and the indices PyTorch's `torch.max(input,
    /// dim, keepdim)` returns beside the values: where along `dim` each
    /// maximum is (the first of equals, the first NaN), in the values'
    /// shape. The indices are the ones backward routes through; they carry
    /// no gradient.
    pub fn max_dim_with_indices(
        &self,
        input: &Var<'_>,
        dim: isize,
        keepdim: bool,
    ) -> Result<(Var<'_>, DimIndices<'_>), AutodiffError> {
        let input = self.operand(input)?;
        let d = axis("max_dim", dim, input.shape.len())?;
        let spec = MaxDimSpec {
            outer: input.shape[..d].iter().product::<usize>() as u64,
            dim: input.shape[d] as u64,
            inner: input.shape[d + 1..].iter().product::<usize>() as u64,
        };
        let mut shape = input.shape.clone();
        match keepdim {
            true => shape[d] = 1,
            false => _ = shape.remove(d),
        }
        let len = checked_len(&shape)?;
        let (values, indices) = (self.reserve(len)?, self.reserve(len)?);
        self.launch(KernelLaunch::max_dim(
            spec,
            input.value.whole(),
            values.whole(),
            indices.whole(),
        ))?;
        let found = DimIndices {
            tape: self,
            buffer: indices.clone(),
            shape: shape.clone(),
        };
        let op = Op::MaxDim {
            input: input.index,
            spec,
            indices,
        };
        Ok((self.record(values, shape, op), found))
    }

    /// The same elements under `shape`, as PyTorch's `reshape`: one
    /// dimension may be -1 (inferred); the element count is unchanged. No
    /// copy: every tape value is contiguous.
    pub fn reshape(&self, input: &Var<'_>, shape: &[isize]) -> Result<Var<'_>, AutodiffError> {
        let input = self.operand(input)?;
        let len = checked_len(&input.shape)?;
        let shape = infer_shape(&input.shape, len, shape)?;
        let op = Op::Reshape { input: input.index };
        Ok(self.record_view(input.value, shape, op, input.index))
    }

    /// `input` with its dimensions reordered, as PyTorch's `permute`:
    /// dimension `i` of the result is `input`'s `dims[i]`; every dimension
    /// named once. A strided copy (none for the identity order).
    pub fn permute(&self, input: &Var<'_>, dims: &[isize]) -> Result<Var<'_>, AutodiffError> {
        let input = self.operand(input)?;
        check_rank("permute", &input.shape)?;
        let rank = input.shape.len();
        let order = distinct_axes("permute", dims, rank)?;
        if order.len() != rank {
            return Err(AutodiffError::InvalidArgument(format!(
                "permute: {} dimensions named for a tensor of shape {:?}; name each once",
                order.len(),
                input.shape
            )));
        }
        let shape: Vec<usize> = order.iter().map(|&d| input.shape[d]).collect();
        let out = self.reserve(checked_len(&shape)?)?;
        let spec = permute_spec(&input.shape, &order);
        self.launch(KernelLaunch::strided_sum(
            spec,
            input.value.whole(),
            out.whole(),
        ))?;
        let op = Op::Permute {
            input: input.index,
            order,
        };
        Ok(self.record(out, shape, op))
    }

    /// `input` with dimensions `dim0` and `dim1` swapped, as PyTorch's
    /// `transpose` (a [`permute`](Tape::permute)).
    pub fn transpose(
        &self,
        input: &Var<'_>,
        dim0: isize,
        dim1: isize,
    ) -> Result<Var<'_>, AutodiffError> {
        let rank = self.operand(input)?.shape.len();
        let (d0, d1) = (
            axis("transpose", dim0, rank)?,
            axis("transpose", dim1, rank)?,
        );
        let mut order: Vec<isize> = (0..rank as isize).collect();
        order.swap(d0, d1);
        self.permute(input, &order)
    }
}

/// `dims` resolved against `rank`, in the order given; a dimension named
/// twice is `InvalidArgument`.
fn distinct_axes(name: &str, dims: &[isize], rank: usize) -> Result<Vec<usize>, AutodiffError> {
    let mut resolved = Vec::with_capacity(dims.len());
    for &dim in dims {
        let d = axis(name, dim, rank)?;
        if resolved.contains(&d) {
            return Err(AutodiffError::InvalidArgument(format!(
                "{name}: dimension {dim} is named twice in {dims:?}"
            )));
        }
        resolved.push(d);
    }
    Ok(resolved)
}

/// `shape` with its one -1 inferred so that it holds `len` elements (those
/// of `from`); `InvalidArgument` naming both shapes otherwise.
fn infer_shape(from: &[usize], len: usize, shape: &[isize]) -> Result<Vec<usize>, AutodiffError> {
    let refused = |why: &str| {
        AutodiffError::InvalidArgument(format!(
            "reshape: shape {shape:?} is invalid for a tensor of shape {from:?} ({len} elements): {why}"
        ))
    };
    let inferred = shape.iter().filter(|&&n| n == -1).count();
    if inferred > 1 || shape.iter().any(|&n| n < -1) {
        return Err(refused(
            "only one dimension may be -1, and none other negative",
        ));
    }
    let known = shape
        .iter()
        .filter(|&&n| n != -1)
        .try_fold(1usize, |total, &n| total.checked_mul(n as usize))
        .ok_or_else(|| refused("its element count overflows"))?;
    let fill = match (inferred, known) {
        (1, 0) => return Err(refused("-1 is ambiguous next to a 0")),
        (1, known) if len % known == 0 => len / known,
        (0, known) if known == len => 0,
        _ => return Err(refused("the element counts differ")),
    };
    Ok(shape
        .iter()
        .map(|&n| if n == -1 { fill } else { n as usize })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_minus_one_is_inferred_from_the_element_count() {
        assert_eq!(infer_shape(&[2, 3, 4], 24, &[-1, 4]).unwrap(), [6, 4]);
        assert_eq!(infer_shape(&[2, 3, 4], 24, &[4, 6]).unwrap(), [4, 6]);
        assert!(infer_shape(&[2, 3, 4], 24, &[5, -1]).is_err());
        assert!(infer_shape(&[2, 3, 4], 24, &[-1, -1]).is_err());
        assert!(infer_shape(&[2, 3, 4], 24, &[25]).is_err());
    }

    #[test]
    fn a_dimension_named_twice_is_refused() {
        assert_eq!(distinct_axes("sum", &[0, -1], 3).unwrap(), [0, 2]);
        assert!(distinct_axes("sum", &[2, -1], 3).is_err());
    }
}
