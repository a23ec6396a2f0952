//! Kernels that walk an output of up to [`MAX_RANK`] dimensions and read
//! their inputs through strides: a binary operation with PyTorch's
//! broadcasting ([`broadcast_binary`]), and a sum over strided dimensions
//! ([`strided_sum`]), which is also a strided gather (a permutation's copy,
//! an expansion) when it sums over no dimension.
//!
//! Every output element is computed by one thread in a fixed order, so the
//! results do not depend on the thread count (the reductions included).

use serde::{Deserialize, Serialize};

use crate::KernelError;
use crate::parallel::{MIN_PARALLEL, for_each_indexed};

/// The most dimensions an output (or a summed set of dimensions) has.
pub const MAX_RANK: usize = 6;

/// The operation of [`broadcast_binary`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a − b`.
    Sub,
    /// `a ⊙ b`.
    Mul,
    /// `a / b`.
    Div,
}

impl BinaryOp {
    /// Its value at `a`, `b`.
    pub fn apply(self, a: f32, b: f32) -> f32 {
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
        }
    }

    /// Its code in the WGSL and CUDA bodies.
    pub const fn code(self) -> u32 {
        match self {
            BinaryOp::Add => 0,
            BinaryOp::Sub => 1,
            BinaryOp::Mul => 2,
            BinaryOp::Div => 3,
        }
    }
}

/// `out[i] ← a[i·a_strides] op b[i·b_strides]` over the output's
/// dimensions `shape` (row-major): a stride is an input's step, in
/// elements, along one output dimension (0 where it is broadcast).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BroadcastSpec {
    /// The operation.
    pub op: BinaryOp,
    /// The output's dimensions.
    pub shape: Vec<u64>,
    /// `a`'s stride along each output dimension.
    pub a_strides: Vec<u64>,
    /// `b`'s stride along each output dimension.
    pub b_strides: Vec<u64>,
}

impl BroadcastSpec {
    /// Refuses a rank past [`MAX_RANK`] and strides that do not match the shape.
    pub fn validate(&self) -> Result<(), KernelError> {
        check_dims("shape", &self.shape, &[&self.a_strides, &self.b_strides])
    }

    /// The output's element count (`None` on overflow).
    pub fn outputs(&self) -> Option<u64> {
        count(&self.shape)
    }

    /// The elements `a` must hold to be read everywhere (`None` on overflow).
    pub fn a_extent(&self) -> Option<u64> {
        extent(&self.shape, &self.a_strides)
    }

    /// The elements `b` must hold to be read everywhere (`None` on overflow).
    pub fn b_extent(&self) -> Option<u64> {
        extent(&self.shape, &self.b_strides)
    }
}

/// `out[i] ← scale · Σ_r x[i·strides + r·summed_strides]`: for each element
/// `i` of the output's dimensions `shape`, the sum over every index `r` of
/// the dimensions `summed`, in row-major order. With no summed dimension it
/// is a strided gather (times `scale`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SumSpec {
    /// The output's dimensions.
    pub shape: Vec<u64>,
    /// `x`'s stride along each output dimension.
    pub strides: Vec<u64>,
    /// The dimensions summed over (none: a gather).
    pub summed: Vec<u64>,
    /// `x`'s stride along each summed dimension.
    pub summed_strides: Vec<u64>,
    /// The factor applied to each sum (1 for a sum, `1/n` for a mean).
    pub scale: f32,
}

impl SumSpec {
    /// Refuses ranks past [`MAX_RANK`], strides that do not match their
    /// dimensions, and a non-finite scale.
    pub fn validate(&self) -> Result<(), KernelError> {
        check_dims("shape", &self.shape, &[&self.strides])?;
        check_dims("summed", &self.summed, &[&self.summed_strides])?;
        if !self.scale.is_finite() {
            return Err(KernelError::invalid("scale", "must be finite"));
        }
        Ok(())
    }

    /// The output's element count (`None` on overflow).
    pub fn outputs(&self) -> Option<u64> {
        count(&self.shape)
    }

    /// The elements `x` must hold to be read everywhere (`None` on overflow).
    pub fn extent(&self) -> Option<u64> {
        let kept = extent(&self.shape, &self.strides)?;
        let summed = extent(&self.summed, &self.summed_strides)?;
        match (kept, summed) {
            (0, _) | (_, 0) => Some(0),
            (kept, summed) => kept.checked_add(summed)?.checked_sub(1),
        }
    }
}

fn check_dims(name: &str, dims: &[u64], strides: &[&Vec<u64>]) -> Result<(), KernelError> {
    if dims.len() > MAX_RANK {
        let reason = format!("{} dimensions; at most {MAX_RANK}", dims.len());
        return Err(KernelError::invalid(name, reason));
    }
    if strides.iter().any(|strides| strides.len() != dims.len()) {
        let reason = format!("{} dimensions but strides of another rank", dims.len());
        return Err(KernelError::invalid(name, reason));
    }
    Ok(())
}

fn count(dims: &[u64]) -> Option<u64> {
    dims.iter().try_fold(1u64, |total, &n| total.checked_mul(n))
}

/// One past the largest offset `dims` reach through `strides` (0 when
/// some dimension is 0).
fn extent(dims: &[u64], strides: &[u64]) -> Option<u64> {
    if dims.contains(&0) {
        return Some(0);
    }
    dims.iter()
        .zip(strides)
        .try_fold(1u64, |end, (&n, &stride)| {
            end.checked_add((n - 1).checked_mul(stride)?)
        })
}

fn usize_of(value: u64, field: &str) -> Result<usize, KernelError> {
    usize::try_from(value).map_err(|_| KernelError::invalid(field, "does not fit in usize"))
}

fn check_extent(field: &str, extent: Option<u64>, len: usize) -> Result<(), KernelError> {
    match extent {
        Some(extent) if extent <= len as u64 => Ok(()),
        Some(extent) => Err(KernelError::LengthMismatch {
            argument: field.into(),
            expected: usize_of(extent, field)?,
            actual: len,
        }),
        None => Err(KernelError::invalid(field, "its extent overflows")),
    }
}

/// A row-major walk over `dims` that tracks the offset of each position
/// through one set of strides per input.
struct Walk<'a, const N: usize> {
    dims: &'a [u64],
    strides: [&'a [u64]; N],
    index: [u64; MAX_RANK],
    offsets: [u64; N],
}

impl<'a, const N: usize> Walk<'a, N> {
    /// The walk positioned at element `start`.
    fn at(dims: &'a [u64], strides: [&'a [u64]; N], start: u64) -> Self {
        let mut index = [0u64; MAX_RANK];
        let mut offsets = [0u64; N];
        let mut rest = start;
        for d in (0..dims.len()).rev() {
            let n = dims[d].max(1);
            index[d] = rest % n;
            rest /= n;
            for (offset, strides) in offsets.iter_mut().zip(&strides) {
                *offset += index[d] * strides[d];
            }
        }
        Walk {
            dims,
            strides,
            index,
            offsets,
        }
    }

    /// Moves to the next element (the last dimension fastest).
    fn advance(&mut self) {
        for d in (0..self.dims.len()).rev() {
            self.index[d] += 1;
            for (offset, strides) in self.offsets.iter_mut().zip(&self.strides) {
                *offset += strides[d];
            }
            if self.index[d] < self.dims[d] {
                return;
            }
            for (offset, strides) in self.offsets.iter_mut().zip(&self.strides) {
                *offset -= self.index[d] * strides[d];
            }
            self.index[d] = 0;
        }
    }
}

/// `dims` and each input's `strides` with the dimensions of 1 dropped and
/// each pair of neighbours that every input steps through contiguously
/// (`strides[d] = strides[d + 1]·dims[d + 1]`) merged into one: the same
/// walk, in the same order, over fewer and longer rows.
fn coalesce<const N: usize>(dims: &[u64], strides: [&[u64]; N]) -> (Vec<u64>, [Vec<u64>; N]) {
    let mut merged: Vec<u64> = Vec::with_capacity(dims.len());
    let mut merged_strides: [Vec<u64>; N] = std::array::from_fn(|_| Vec::new());
    for (d, &n) in dims.iter().enumerate().filter(|&(_, &n)| n != 1) {
        let contiguous = merged.last().is_some_and(|_| {
            (merged_strides.iter().zip(&strides))
                .all(|(kept, s)| kept.last().is_some_and(|&outer| outer == s[d] * n))
        });
        match (contiguous, merged.last_mut()) {
            (true, Some(last)) => {
                *last *= n;
                for (kept, s) in merged_strides.iter_mut().zip(&strides) {
                    if let Some(outer) = kept.last_mut() {
                        *outer = s[d];
                    }
                }
            }
            _ => {
                merged.push(n);
                for (kept, s) in merged_strides.iter_mut().zip(&strides) {
                    kept.push(s[d]);
                }
            }
        }
    }
    (merged, merged_strides)
}

/// Calls `f(offsets, first, count)` for each run of `count` outputs from
/// `first` (counted from `start`; `len` in all) along the last dimension:
/// the run's first element is at `offsets` in each input, the next ones a
/// last stride further each.
fn for_each_run<const N: usize>(
    dims: &[u64],
    strides: [&[u64]; N],
    (start, len): (u64, usize),
    mut f: impl FnMut([u64; N], usize, usize),
) {
    let (last, outer) = dims.split_last().map_or((1, dims), |(&n, rest)| (n, rest));
    let outer_strides = strides.map(|s| &s[..outer.len()]);
    let last_strides = strides.map(|s| s.get(outer.len()).copied().unwrap_or(0));
    let mut walk = Walk::at(outer, outer_strides, start / last.max(1));
    let (mut j, mut done) = (start % last.max(1), 0);
    while done < len {
        let count = ((last - j) as usize).min(len - done);
        let mut offsets = walk.offsets;
        for (offset, stride) in offsets.iter_mut().zip(last_strides) {
            *offset += j * stride;
        }
        f(offsets, done, count);
        done += count;
        j = 0;
        walk.advance();
    }
}

/// `out[k] ← op(a[k·sa], b[k·sb])` over one run, the contiguous and the
/// broadcast cases as their own loops (so that they vectorise).
#[inline(always)]
fn binary_run(
    op: impl Fn(f32, f32) -> f32,
    a: &[f32],
    b: &[f32],
    [sa, sb]: [usize; 2],
    out: &mut [f32],
) {
    let n = out.len();
    match (sa, sb) {
        (1, 1) => {
            for ((o, &x), &y) in out.iter_mut().zip(&a[..n]).zip(&b[..n]) {
                *o = op(x, y);
            }
        }
        (1, 0) => {
            let y = b[0];
            for (o, &x) in out.iter_mut().zip(&a[..n]) {
                *o = op(x, y);
            }
        }
        (0, 1) => {
            let x = a[0];
            for (o, &y) in out.iter_mut().zip(&b[..n]) {
                *o = op(x, y);
            }
        }
        _ => {
            for (k, o) in out.iter_mut().enumerate() {
                *o = op(a[k * sa], b[k * sb]);
            }
        }
    }
}

/// Runs [`BroadcastSpec`] on the CPU: `out` holds the output's elements;
/// `a` and `b` hold at least what their strides reach.
pub fn broadcast_binary(
    spec: &BroadcastSpec,
    a: &[f32],
    b: &[f32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    spec.validate()?;
    let outputs = spec.outputs().ok_or_else(|| overflow("shape"))?;
    KernelError::check_len("out", usize_of(outputs, "shape")?, out.len())?;
    if out.is_empty() {
        return Ok(());
    }
    check_extent("a", spec.a_extent(), a.len())?;
    check_extent("b", spec.b_extent(), b.len())?;
    let (dims, [a_strides, b_strides]) = coalesce(&spec.shape, [&spec.a_strides, &spec.b_strides]);
    let last = |s: &[u64]| s.last().map_or(0, |&v| v as usize);
    let steps = [last(&a_strides), last(&b_strides)];
    let walk = (
        dims.as_slice(),
        [a_strides.as_slice(), b_strides.as_slice()],
        steps,
    );
    match spec.op {
        BinaryOp::Add => binary_runs(|x, y| x + y, walk, a, b, out),
        BinaryOp::Sub => binary_runs(|x, y| x - y, walk, a, b, out),
        BinaryOp::Mul => binary_runs(|x, y| x * y, walk, a, b, out),
        BinaryOp::Div => binary_runs(|x, y| x / y, walk, a, b, out),
    }
    Ok(())
}

/// One operation over every run of a (coalesced) walk: its dimensions,
/// each input's strides, and each input's last stride.
type BinaryWalk<'a> = (&'a [u64], [&'a [u64]; 2], [usize; 2]);

fn binary_runs(
    op: impl Fn(f32, f32) -> f32 + Copy + Send + Sync,
    (dims, strides, steps): BinaryWalk<'_>,
    a: &[f32],
    b: &[f32],
    out: &mut [f32],
) {
    for_each_indexed(out, |start, piece| {
        let range = (start as u64, piece.len());
        for_each_run(dims, strides, range, |[at_a, at_b], first, count| {
            let (a, b) = (&a[at_a as usize..], &b[at_b as usize..]);
            binary_run(op, a, b, steps, &mut piece[first..first + count]);
        });
    });
}

/// Runs [`SumSpec`] on the CPU: `out` holds the output's elements; `x`
/// holds at least what the strides reach.
pub fn strided_sum(spec: &SumSpec, x: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
    spec.validate()?;
    let outputs = spec.outputs().ok_or_else(|| overflow("shape"))?;
    KernelError::check_len("out", usize_of(outputs, "shape")?, out.len())?;
    let summed = count(&spec.summed).ok_or_else(|| overflow("summed"))?;
    if out.is_empty() {
        return Ok(());
    }
    if summed == 0 {
        out.fill(0.0);
        return Ok(());
    }
    check_extent("x", spec.extent(), x.len())?;
    let (dims, [kept_strides]) = coalesce(&spec.shape, [&spec.strides]);
    let step = kept_strides.last().map_or(0, |&v| v as usize);
    let strides = [kept_strides.as_slice()];
    let scale = spec.scale;
    if spec.summed.is_empty() {
        match out.len() < MIN_PARALLEL && dims.len() <= NESTED_RANK {
            true => gather_nested(&dims, &kept_strides, scale, x, out),
            false => gather_runs(&dims, &kept_strides, scale, x, out),
        }
        return Ok(());
    }
    // Each output's terms in row-major order over the summed dimensions,
    // their last (coalesced) one a run: the order of the plain walk.
    let (summed_dims, [summed_strides]) = coalesce(&spec.summed, [&spec.summed_strides]);
    let summed_step = summed_strides.last().map_or(0, |&v| v as usize);
    let summed_runs = [summed_strides.as_slice()];
    let total = usize_of(summed, "summed")?;
    for_each_indexed(out, |start, piece| {
        for_each_run(
            &dims,
            strides,
            (start as u64, piece.len()),
            |[at], first, count| {
                for (k, out) in piece[first..first + count].iter_mut().enumerate() {
                    let base = at as usize + k * step;
                    let mut sum = 0.0f32;
                    for_each_run(&summed_dims, summed_runs, (0, total), |[offset], _, n| {
                        let from = base + offset as usize;
                        for r in 0..n {
                            sum += x[from + r * summed_step];
                        }
                    });
                    *out = scale * sum;
                }
            },
        );
    });
    Ok(())
}

/// The most (coalesced) dimensions [`gather_nested`] takes.
const NESTED_RANK: usize = 4;

/// A gather (one read per element) along runs of the last dimension, in
/// pieces over the pool when large.
fn gather_runs(dims: &[u64], strides: &[u64], scale: f32, x: &[f32], out: &mut [f32]) {
    let step = strides.last().map_or(0, |&v| v as usize);
    for_each_indexed(out, |start, piece| {
        for_each_run(
            dims,
            [strides],
            (start as u64, piece.len()),
            |[at], first, count| {
                let (at, out) = (at as usize, &mut piece[first..first + count]);
                match step {
                    1 => {
                        (out.iter_mut().zip(&x[at..at + count])).for_each(|(o, &v)| *o = scale * v)
                    }
                    _ => (out.iter_mut().enumerate())
                        .for_each(|(k, o)| *o = scale * x[at + k * step]),
                }
            },
        );
    });
}

/// [`gather_runs`] of at most [`NESTED_RANK`] dimensions as nested loops,
/// on this thread: the run walker's bookkeeping cost more than copying
/// a head's 16-wide run (attention's head permutes, 2–3× faster).
fn gather_nested(dims: &[u64], strides: &[u64], scale: f32, x: &[f32], out: &mut [f32]) {
    let (mut shape, mut step) = ([1usize; NESTED_RANK], [0usize; NESTED_RANK]);
    let pad = NESTED_RANK - dims.len();
    for (d, (&n, &s)) in dims.iter().zip(strides).enumerate() {
        (shape[pad + d], step[pad + d]) = (n as usize, s as usize);
    }
    let ([n0, n1, n2, n3], [s0, s1, s2, s3]) = (shape, step);
    let mut rows = out.chunks_exact_mut(n3);
    for i0 in 0..n0 {
        for i1 in 0..n1 {
            for i2 in 0..n2 {
                let Some(row) = rows.next() else {
                    return;
                };
                let at = i0 * s0 + i1 * s1 + i2 * s2;
                match s3 {
                    1 => (row.iter_mut().zip(&x[at..at + n3])).for_each(|(o, &v)| *o = scale * v),
                    _ => {
                        (row.iter_mut().enumerate()).for_each(|(k, o)| *o = scale * x[at + k * s3])
                    }
                }
            }
        }
    }
}

fn overflow(field: &str) -> KernelError {
    KernelError::invalid(field, "its element count overflows")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_broadcast_over_a_matrix_adds_it_to_every_row() {
        let spec = BroadcastSpec {
            op: BinaryOp::Add,
            shape: vec![2, 3],
            a_strides: vec![3, 1],
            b_strides: vec![0, 1],
        };
        let mut out = [0.0; 6];
        broadcast_binary(&spec, &[1., 2., 3., 4., 5., 6.], &[10., 20., 30.], &mut out).unwrap();
        assert_eq!(out, [11., 22., 33., 14., 25., 36.]);
    }

    #[test]
    fn an_outer_broadcast_of_a_column_and_a_row_divides_every_pair() {
        let spec = BroadcastSpec {
            op: BinaryOp::Div,
            shape: vec![2, 2],
            a_strides: vec![1, 0],
            b_strides: vec![0, 1],
        };
        let mut out = [0.0; 4];
        broadcast_binary(&spec, &[1., 2.], &[4., 8.], &mut out).unwrap();
        assert_eq!(out, [0.25, 0.125, 0.5, 0.25]);
    }

    #[test]
    fn a_sum_over_the_leading_and_trailing_dimensions_keeps_the_middle_one() {
        // x is [2, 3, 2]; the output keeps dimension 1.
        let x: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let spec = SumSpec {
            shape: vec![3],
            strides: vec![2],
            summed: vec![2, 2],
            summed_strides: vec![6, 1],
            scale: 0.5,
        };
        let mut out = [0.0; 3];
        strided_sum(&spec, &x, &mut out).unwrap();
        // (0+1+6+7)/2, (2+3+8+9)/2, (4+5+10+11)/2
        assert_eq!(out, [7.0, 11.0, 15.0]);
    }

    #[test]
    fn a_sum_over_nothing_is_a_transposing_gather() {
        let spec = SumSpec {
            shape: vec![3, 2],
            strides: vec![1, 3],
            summed: vec![],
            summed_strides: vec![],
            scale: 1.0,
        };
        let mut out = [0.0; 6];
        strided_sum(&spec, &[1., 2., 3., 4., 5., 6.], &mut out).unwrap();
        assert_eq!(out, [1., 4., 2., 5., 3., 6.]);
    }

    #[test]
    fn strides_reaching_past_an_input_or_a_rank_past_six_are_refused() {
        let mut spec = BroadcastSpec {
            op: BinaryOp::Mul,
            shape: vec![2, 3],
            a_strides: vec![3, 1],
            b_strides: vec![3, 1],
        };
        let mut out = [0.0; 6];
        assert!(broadcast_binary(&spec, &[0.0; 6], &[0.0; 5], &mut out).is_err());
        spec.shape = vec![1; 7];
        spec.a_strides = vec![0; 7];
        spec.b_strides = vec![0; 7];
        assert!(broadcast_binary(&spec, &[0.0], &[0.0], &mut [0.0]).is_err());
    }

    #[test]
    fn a_long_walk_split_into_pieces_matches_the_index_arithmetic() {
        let (rows, cols) = (300usize, 257usize);
        let spec = BroadcastSpec {
            op: BinaryOp::Sub,
            shape: vec![rows as u64, cols as u64],
            a_strides: vec![cols as u64, 1],
            b_strides: vec![1, 0],
        };
        let a: Vec<f32> = (0..rows * cols).map(|v| v as f32).collect();
        let b: Vec<f32> = (0..rows).map(|v| v as f32 * 0.5).collect();
        let mut out = vec![0.0; rows * cols];
        broadcast_binary(&spec, &a, &b, &mut out).unwrap();
        for (i, value) in out.iter().enumerate() {
            assert_eq!(*value, a[i] - b[i / cols]);
        }
    }

    /// The offset of output element `i` through `strides`, by index arithmetic.
    fn offset(shape: &[u64], strides: &[u64], mut i: u64) -> usize {
        let mut at = 0;
        for d in (0..shape.len()).rev() {
            at += (i % shape[d]) * strides[d];
            i /= shape[d];
        }
        at as usize
    }

    #[test]
    fn runs_over_merged_dimensions_match_the_index_arithmetic_in_every_layout() {
        // 16·1·97·3·29 = 135,024 outputs: past MIN_PARALLEL, so in pieces.
        let shape = vec![16, 1, 97, 3, 29];
        // a: a permuted contiguous tensor; b: broadcast along two dimensions.
        let a_strides = vec![29 * 3, 0, 16 * 29 * 3, 29, 1];
        let b_strides = vec![0, 0, 3, 1, 0];
        let a: Vec<f32> = (0..16 * 97 * 3 * 29).map(|v| v as f32 * 0.25).collect();
        let b: Vec<f32> = (0..97 * 3).map(|v| v as f32 + 1.0).collect();
        let spec = BroadcastSpec {
            op: BinaryOp::Div,
            shape: shape.clone(),
            a_strides: a_strides.clone(),
            b_strides: b_strides.clone(),
        };
        let mut out = vec![0.0; 135_024];
        broadcast_binary(&spec, &a, &b, &mut out).unwrap();
        for (i, &got) in out.iter().enumerate() {
            let i = i as u64;
            let want = a[offset(&shape, &a_strides, i)] / b[offset(&shape, &b_strides, i)];
            assert_eq!(got, want, "element {i}");
        }
        // The same permutation gathered, then summed over two dimensions.
        let mut spec = SumSpec {
            shape: shape.clone(),
            strides: a_strides.clone(),
            summed: vec![],
            summed_strides: vec![],
            scale: 2.0,
        };
        strided_sum(&spec, &a, &mut out).unwrap();
        for (i, &got) in out.iter().enumerate() {
            assert_eq!(got, 2.0 * a[offset(&shape, &a_strides, i as u64)]);
        }
        spec.shape = vec![16, 1, 29];
        spec.strides = vec![29 * 3, 0, 1];
        spec.summed = vec![97, 3];
        spec.summed_strides = vec![16 * 29 * 3, 29];
        let mut sums = vec![0.0; 16 * 29];
        strided_sum(&spec, &a, &mut sums).unwrap();
        for (i, &got) in sums.iter().enumerate() {
            let base = offset(&spec.shape, &spec.strides, i as u64);
            let mut want = 0.0f32;
            for r in 0..97 * 3 {
                want += a[base + offset(&spec.summed, &spec.summed_strides, r)];
            }
            assert_eq!(got, 2.0 * want, "sum {i}");
        }
    }

    #[test]
    fn a_nested_gather_reads_what_the_run_walker_reads() {
        let x: Vec<f32> = (0..2 * 3 * 4 * 5).map(|i| i as f32 - 7.5).collect();
        // Row-major [2, 3, 4, 5] read as permutes, a transpose, a narrow
        // view and a single element.
        let cases: [(&[u64], &[u64]); 6] = [
            (&[2, 4, 3, 5], &[60, 5, 20, 1]),
            (&[2, 3, 5, 4], &[60, 20, 1, 5]),
            (&[5, 2, 3, 4], &[1, 60, 20, 5]),
            (&[3, 2], &[1, 3]),
            (&[2, 2, 3], &[60, 20, 1]),
            (&[], &[]),
        ];
        for (shape, strides) in cases {
            let (dims, [kept]) = coalesce(shape, [strides]);
            let outputs = shape.iter().product::<u64>() as usize;
            let (mut nested, mut runs) = (vec![0.0; outputs], vec![1.0; outputs]);
            gather_nested(&dims, &kept, 2.0, &x, &mut nested);
            gather_runs(&dims, &kept, 2.0, &x, &mut runs);
            assert_eq!(nested, runs, "{shape:?} {strides:?}");
        }
    }
}
