//! `matmul` over leading batch dimensions, PyTorch's `torch.matmul` for
//! operands of rank 2 or more: the last two dimensions multiply, the
//! leading ones broadcast. A right operand without batch dimensions (a
//! weight) makes one GEMM over every row of the left one; otherwise one
//! batched GEMM launch, each product at its offsets into the operands'
//! buffers (no copy). Backward: the same GEMMs transposed, a broadcast operand's
//! gradient summed over the batch dimensions it was broadcast along.

use cistern_runtime::{BatchedGemmSpec, GemmSpec, KernelLaunch};

use super::backward::Grad;
use super::node::{Op, VarIndex};
use super::rules::{Contributions, product};
use super::sinks::Sinks;
use super::strides::{broadcast_shape, broadcast_strides, check_rank};
use super::tape::{Tape, checked_len};
use super::var::Var;
use crate::compute::Buffer;
use crate::error::AutodiffError;
use crate::shape::ShapeError;

/// How two operands multiply: their batch dimensions, the batch they
/// broadcast to, and each matrix's `m×k`·`k×n`.
#[derive(Debug)]
struct Batched {
    a_batch: Vec<usize>,
    b_batch: Vec<usize>,
    batch: Vec<usize>,
    m: usize,
    k: usize,
    n: usize,
}

impl Batched {
    fn of(a: &[usize], b: &[usize]) -> Result<Batched, AutodiffError> {
        let ((a_batch, m, k), (b_batch, rows, n)) = (split(a)?, split(b)?);
        if rows != k {
            return Err(AutodiffError::ShapeMismatch(
                ShapeError::DimensionMismatch {
                    axis: 0,
                    expected: k,
                    actual: rows,
                },
            ));
        }
        let batch = broadcast_shape("matmul", a_batch, b_batch)?;
        let plan = Batched {
            a_batch: a_batch.to_vec(),
            b_batch: b_batch.to_vec(),
            batch,
            m,
            k,
            n,
        };
        if !plan.b_batch.is_empty() {
            check_rank("matmul", &plan.shape(plan.m, plan.k))?;
        }
        Ok(plan)
    }

    /// The batch followed by `rows×cols`.
    fn shape(&self, rows: usize, cols: usize) -> Vec<usize> {
        let mut shape = self.batch.clone();
        shape.extend([rows, cols]);
        shape
    }

    /// Rows of `a` stacked over its batch (where `b` has none).
    fn stacked_rows(&self) -> usize {
        self.a_batch.iter().product::<usize>() * self.m
    }

    /// For each batch element, the element of `a`'s and of `b`'s batch it reads.
    fn pairs(&self) -> Vec<(usize, usize)> {
        let (a, b) = (
            broadcast_strides(&self.a_batch, &self.batch),
            broadcast_strides(&self.b_batch, &self.batch),
        );
        let count: usize = self.batch.iter().product();
        (0..count)
            .map(|mut i| {
                let (mut at_a, mut at_b) = (0, 0);
                for d in (0..self.batch.len()).rev() {
                    let index = (i % self.batch[d]) as u64;
                    i /= self.batch[d];
                    at_a += index * a[d];
                    at_b += index * b[d];
                }
                (at_a as usize, at_b as usize)
            })
            .collect()
    }
}

/// A matrix operand's batch dimensions and its last two; `RankMismatch`
/// below rank 2.
fn split(shape: &[usize]) -> Result<(&[usize], usize, usize), AutodiffError> {
    match shape.len() {
        rank if rank >= 2 => Ok((&shape[..rank - 2], shape[rank - 2], shape[rank - 1])),
        rank => Err(AutodiffError::ShapeMismatch(ShapeError::RankMismatch {
            expected: 2,
            actual: rank,
        })),
    }
}

impl Tape {
    /// The matrix product over batches, as `torch.matmul` for operands of
    /// rank 2 or more: `a` is `[..., m, k]`, `b` is `[..., k, n]`, the
    /// leading dimensions broadcast (PyTorch's rule) and the result is
    /// `[batch..., m, n]`. A rank below 2 is `RankMismatch`, unequal inner
    /// dimensions `DimensionMismatch`, batches that do not broadcast
    /// `InvalidArgument`.
    pub fn matmul(&self, a: &Var<'_>, b: &Var<'_>) -> Result<Var<'_>, AutodiffError> {
        let (a, b) = (self.operand(a)?, self.operand(b)?);
        let plan = Batched::of(&a.shape, &b.shape)?;
        let shape = plan.shape(plan.m, plan.n);
        let out = self.reserve(checked_len(&shape)?)?;
        let (m, k, n) = (plan.m, plan.k, plan.n);
        if plan.b_batch.is_empty() {
            let spec = product(plan.stacked_rows(), n, k, false, false);
            let launch =
                KernelLaunch::gemm(spec, a.value.whole(), b.value.whole(), None, out.whole());
            self.launch(launch)?;
        } else {
            let pairs = plan.pairs();
            let offsets = |block: usize, pick: fn(&(usize, usize)) -> usize| {
                pairs
                    .iter()
                    .map(|pair| (pick(pair) * block) as u64)
                    .collect()
            };
            let spec = BatchedGemmSpec {
                gemm: product(m, n, k, false, false),
                a_offsets: offsets(m * k, |pair| pair.0),
                b_offsets: offsets(k * n, |pair| pair.1),
            };
            let launch =
                KernelLaunch::batched_gemm(spec, a.value.whole(), b.value.whole(), out.whole());
            self.launch(launch)?;
        }
        let op = Op::MatMul {
            a: a.index,
            b: b.index,
        };
        Ok(self.record(out, shape, op))
    }

    /// The contributions of `a·b` to its reached operands, given its
    /// gradient: `∂a = g·bᵀ`, `∂b = aᵀ·g`, per batch element, summed over
    /// a broadcast operand's batch dimensions.
    pub(super) fn matmul_gradients(
        &self,
        (a, b): (VarIndex, VarIndex),
        grad: &Grad,
        reached: impl Fn(VarIndex) -> bool,
        sinks: &mut Sinks,
    ) -> Result<Contributions, AutodiffError> {
        let (a_value, a_shape) = self.with_node(a, |node| (node.value.clone(), node.shape.clone()));
        let (b_value, b_shape) = self.with_node(b, |node| (node.value.clone(), node.shape.clone()));
        let plan = Batched::of(&a_shape, &b_shape)?;
        let (m, k, n) = (plan.m, plan.k, plan.n);
        let g = self.materialize(grad, plan.batch.iter().product::<usize>() * m * n)?;
        let mut out = Contributions::new();
        if plan.b_batch.is_empty() {
            let rows = plan.stacked_rows();
            if reached(a) {
                let spec = product(rows, k, n, false, true);
                let grad = self.gemm_into(a, spec, (&g, &b_value), rows * k, sinks)?;
                out.push((a, Grad::Device(grad)));
            }
            if reached(b) {
                let spec = product(k, n, rows, true, false);
                let grad = self.gemm_into(b, spec, (&a_value, &g), k * n, sinks)?;
                out.push((b, Grad::Device(grad)));
            }
            return Ok(out);
        }
        let pairs = plan.pairs();
        let each = |block: usize| (0..pairs.len()).map(|i| (i * block) as u64).collect();
        let at = |block: usize, pick: fn(&(usize, usize)) -> usize| {
            pairs
                .iter()
                .map(|pair| (pick(pair) * block) as u64)
                .collect()
        };
        if reached(a) {
            // ∂a_i = g_i·b_iᵀ
            let full = self.reserve(pairs.len() * m * k)?;
            let spec = BatchedGemmSpec {
                gemm: product(m, k, n, false, true),
                a_offsets: each(m * n),
                b_offsets: at(k * n, |pair| pair.1),
            };
            let launch = KernelLaunch::batched_gemm(spec, g.whole(), b_value.whole(), full.whole());
            self.launch(launch)?;
            let from = plan.shape(m, k);
            let grad = self.sum_to((a, &a_shape), &full, &from, 1.0, sinks)?;
            out.push((a, Grad::Device(grad)));
        }
        if reached(b) {
            // ∂b_i = a_iᵀ·g_i
            let full = self.reserve(pairs.len() * k * n)?;
            let spec = BatchedGemmSpec {
                gemm: product(k, n, m, true, false),
                a_offsets: at(m * k, |pair| pair.0),
                b_offsets: each(m * n),
            };
            let launch = KernelLaunch::batched_gemm(spec, a_value.whole(), g.whole(), full.whole());
            self.launch(launch)?;
            let from = plan.shape(k, n);
            let grad = self.sum_to((b, &b_shape), &full, &from, 1.0, sinks)?;
            out.push((b, Grad::Device(grad)));
        }
        Ok(out)
    }

    /// `op(x)·op(y)` as `spec` says into `input`'s gradient (its sink
    /// where it has one).
    fn gemm_into(
        &self,
        input: VarIndex,
        spec: GemmSpec,
        (x, y): (&Buffer, &Buffer),
        len: usize,
        sinks: &mut Sinks,
    ) -> Result<Buffer, AutodiffError> {
        self.gradient_of(input, len, sinks, |out| {
            KernelLaunch::gemm(spec, x.whole(), y.whole(), None, out)
        })
    }
}
