//! `narrow`, `split` and `cat`, and softmax over any dimension. Along the first dimension a slice of a
//! contiguous tensor is a contiguous range: `narrow` is then a view of its
//! input's buffer (no copy) and `cat` a copy of each input into its range
//! of the output. Along another dimension each is composed with
//! `permute`, which moves that dimension first and back.

use cistern_runtime::{KernelLaunch, SumSpec};

use super::backward::Grad;
use super::node::{Op, VarIndex};
use super::rules::Contributions;
use super::strides::{axis, check_rank};
use super::tape::{Tape, checked_len};
use super::var::Var;
use crate::compute::Buffer;
use crate::error::AutodiffError;

fn invalid(message: String) -> AutodiffError {
    AutodiffError::InvalidArgument(message)
}

/// A copy of `elements` contiguous `f32`s (a strided sum over nothing).
fn copy_spec(elements: usize) -> SumSpec {
    SumSpec {
        shape: vec![elements as u64],
        strides: vec![1],
        summed: Vec::new(),
        summed_strides: Vec::new(),
        scale: 1.0,
    }
}

/// `order` moving dimension `dim` of `rank` to the front, and its inverse.
fn to_front(dim: usize, rank: usize) -> (Vec<isize>, Vec<isize>) {
    let mut order: Vec<isize> = vec![dim as isize];
    order.extend((0..rank as isize).filter(|&d| d != dim as isize));
    let mut back = vec![0isize; rank];
    for (i, &d) in order.iter().enumerate() {
        back[d as usize] = i as isize;
    }
    (order, back)
}

impl Tape {
    /// `length` elements of dimension `dim` from `start`, as PyTorch's
    /// `narrow`: the same rank, that dimension `length` long. Along the
    /// first dimension a view (no copy); along another, a permutation
    /// there and back. `start + length` past the dimension, or a length of
    /// 0, is `InvalidArgument`.
    pub fn narrow(
        &self,
        input: &Var<'_>,
        dim: isize,
        start: usize,
        length: usize,
    ) -> Result<Var<'_>, AutodiffError> {
        let shape = self.operand(input)?.shape;
        let d = axis("narrow", dim, shape.len())?;
        let fits = start.checked_add(length).is_some_and(|end| end <= shape[d]);
        if !fits || length == 0 {
            return Err(invalid(format!(
                "narrow: {length} elements from {start} of dimension {dim} of shape {shape:?}"
            )));
        }
        if d == 0 {
            return self.narrow_first(input, start, length);
        }
        check_rank("narrow", &shape)?;
        let (order, back) = to_front(d, shape.len());
        let front = self.permute(input, &order)?;
        let part = self.narrow_first(&front, start, length)?;
        self.permute(&part, &back)
    }

    /// `input` cut into pieces of `split_size` along `dim` (the last one
    /// shorter where it does not divide), as PyTorch's `split`.
    pub fn split(
        &self,
        input: &Var<'_>,
        split_size: usize,
        dim: isize,
    ) -> Result<Vec<Var<'_>>, AutodiffError> {
        let shape = self.operand(input)?.shape;
        let d = axis("split", dim, shape.len())?;
        if split_size == 0 {
            return Err(invalid("split: a split_size of 0".into()));
        }
        (0..shape[d])
            .step_by(split_size)
            .map(|start| self.narrow(input, dim, start, split_size.min(shape[d] - start)))
            .collect()
    }

    /// The concatenation of `inputs` along `dim`, as PyTorch's `cat`: every
    /// input of one rank and the same dimensions but `dim`. Along the first
    /// dimension one copy per input into its range of the output; along
    /// another, a permutation of each there and of the result back.
    pub fn cat(&self, inputs: &[&Var<'_>], dim: isize) -> Result<Var<'_>, AutodiffError> {
        let Some(first) = inputs.first() else {
            return Err(invalid("cat: no inputs".into()));
        };
        let shape = self.operand(first)?.shape;
        let d = axis("cat", dim, shape.len())?;
        for input in inputs {
            let other = self.operand(input)?.shape;
            let same = other.len() == shape.len()
                && (0..shape.len()).all(|i| i == d || other[i] == shape[i]);
            if !same {
                return Err(invalid(format!(
                    "cat: shapes {shape:?} and {other:?} differ outside dimension {dim}"
                )));
            }
        }
        if d == 0 {
            return self.cat_first(inputs);
        }
        check_rank("cat", &shape)?;
        let (order, back) = to_front(d, shape.len());
        let fronts = inputs
            .iter()
            .map(|input| self.permute(input, &order))
            .collect::<Result<Vec<_>, _>>()?;
        let refs: Vec<&Var<'_>> = fronts.iter().collect();
        let joined = self.cat_first(&refs)?;
        self.permute(&joined, &back)
    }

    /// Rows `start..start + length` of the first dimension: a view.
    fn narrow_first(
        &self,
        input: &Var<'_>,
        start: usize,
        length: usize,
    ) -> Result<Var<'_>, AutodiffError> {
        let input = self.operand(input)?;
        let inner: usize = input.shape[1..].iter().product();
        let mut shape = input.shape.clone();
        shape[0] = length;
        let (offset, size) = ((start * inner * 4) as u64, (length * inner * 4) as u64);
        let view = input
            .value
            .view(offset, size)
            .ok_or_else(|| invalid("narrow: the range lies outside the input".into()))?;
        let op = Op::Narrow {
            input: input.index,
            start: start * inner,
        };
        Ok(self.record_view(view, shape, op, input.index))
    }

    /// The inputs one after another along the first dimension.
    fn cat_first(&self, inputs: &[&Var<'_>]) -> Result<Var<'_>, AutodiffError> {
        let operands = inputs
            .iter()
            .map(|input| self.operand(input))
            .collect::<Result<Vec<_>, _>>()?;
        let mut shape = operands[0].shape.clone();
        shape[0] = operands.iter().map(|operand| operand.shape[0]).sum();
        let out = self.reserve(checked_len(&shape)?)?;
        let mut at = 0u64;
        for operand in &operands {
            let len: usize = operand.shape.iter().product();
            let target = out.range(at * 4, len as u64 * 4);
            self.launch(KernelLaunch::strided_sum(
                copy_spec(len),
                operand.value.whole(),
                target,
            ))?;
            at += len as u64;
        }
        let op = Op::Cat {
            inputs: operands.iter().map(|operand| operand.index).collect(),
        };
        Ok(self.record(out, shape, op))
    }

    /// The gradient of a narrow along the first dimension: zeros, and the
    /// value's gradient copied into its range.
    pub(super) fn narrow_gradient(
        &self,
        input: VarIndex,
        start: usize,
        grad: &Grad,
        len: usize,
    ) -> Result<Buffer, AutodiffError> {
        let total = self.with_node(input, |node| node.len());
        let g = self.materialize(grad, len)?;
        let out = self.filled(total, 0.0)?;
        let target = out.range(start as u64 * 4, len as u64 * 4);
        self.launch(KernelLaunch::strided_sum(copy_spec(len), g.whole(), target))?;
        Ok(out)
    }

    /// The contributions of a concatenation along the first dimension:
    /// each input's range of the gradient, a view (no copy).
    pub(super) fn cat_gradients(
        &self,
        inputs: &[VarIndex],
        grad: &Grad,
        len: usize,
        reached: impl Fn(VarIndex) -> bool,
    ) -> Result<Contributions, AutodiffError> {
        let g = self.materialize(grad, len)?;
        let mut out = Contributions::new();
        let mut at = 0u64;
        for &input in inputs {
            let size = self.with_node(input, |node| node.len()) as u64 * 4;
            if reached(input) {
                let view = g
                    .view(at, size)
                    .ok_or_else(|| invalid("cat: a gradient range lies outside".into()))?;
                out.push((input, Grad::Device(view)));
            }
            at += size;
        }
        Ok(out)
    }
}

impl Tape {
    /// `softmax(input, dim)` over any dimension (negative from the end):
    /// over the last one, [`softmax`](Tape::softmax); over another, a
    /// `permute` bringing it last, the softmax and a `permute` back.
    pub fn softmax_dim(&self, input: &Var<'_>, dim: isize) -> Result<Var<'_>, AutodiffError> {
        self.over_last(input, dim, |tape, x| tape.softmax(x))
    }

    /// `log_softmax(input, dim)` over any dimension, as
    /// [`softmax_dim`](Tape::softmax_dim).
    pub fn log_softmax_dim(&self, input: &Var<'_>, dim: isize) -> Result<Var<'_>, AutodiffError> {
        self.over_last(input, dim, |tape, x| tape.log_softmax(x))
    }

    /// `f` applied over dimension `dim` of `input` by moving it last and back.
    fn over_last<'t>(
        &'t self,
        input: &Var<'_>,
        dim: isize,
        f: impl FnOnce(&'t Tape, &Var<'t>) -> Result<Var<'t>, AutodiffError>,
    ) -> Result<Var<'t>, AutodiffError> {
        let rank = self.operand(input)?.shape.len();
        let d = axis("softmax", dim, rank)?;
        let input = Var::new(self, self.index_of(input)?);
        if d + 1 == rank {
            return f(self, &input);
        }
        let mut order: Vec<isize> = (0..rank as isize).filter(|&i| i != d as isize).collect();
        order.push(d as isize);
        let mut back = vec![0isize; rank];
        for (i, &o) in order.iter().enumerate() {
            back[o as usize] = i as isize;
        }
        let moved = self.permute(&input, &order)?;
        let done = f(self, &moved)?;
        self.permute(&done, &back)
    }
}
