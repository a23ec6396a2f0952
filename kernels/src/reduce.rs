//! Reductions: bias gradients, MSE loss, per-segment sums.

use rayon::prelude::*;

use crate::parallel::{MIN_PARALLEL, PIECE, map, sum, sum_squares};
use crate::{KernelError, Segment};
use cistern_optim::validate_segments;

/// `out[j] ← Σ_i x[i][j]` over a row-major `rows×cols` matrix: the gradient
/// of a bias broadcast over rows.
pub fn column_sum(x: &[f32], rows: usize, cols: usize, out: &mut [f32]) -> Result<(), KernelError> {
    let size = rows
        .checked_mul(cols)
        .ok_or_else(|| KernelError::invalid("rows*cols", "overflows"))?;
    KernelError::check_len("x", size, x.len())?;
    KernelError::check_len("out", cols, out.len())?;
    if cols == 0 {
        return Ok(());
    }
    let add_rows = rows_loop();
    let block_sum = |block: &[f32]| {
        let mut acc = vec![0.0f64; cols];
        add_rows(block, &mut acc);
        acc
    };
    let totals = if size < MIN_PARALLEL {
        block_sum(x)
    } else {
        let rows_per_task = (PIECE / cols).max(1);
        x.par_chunks(rows_per_task * cols).map(block_sum).reduce(
            || vec![0.0; cols],
            |mut a, b| {
                a.iter_mut().zip(&b).for_each(|(a, b)| *a += b);
                a
            },
        )
    };
    for (o, t) in out.iter_mut().zip(totals) {
        *o = t as f32;
    }
    Ok(())
}

/// Adds each row of `block` (rows of `acc.len()`) into `acc`, in f64.
type RowsLoop = fn(&[f32], &mut [f64]);

/// [`add_rows`] for the widest vector unit present (the same bits: each
/// column sums its rows in order).
fn rows_loop() -> RowsLoop {
    static CHOSEN: std::sync::OnceLock<RowsLoop> = std::sync::OnceLock::new();
    *CHOSEN.get_or_init(|| {
        crate::wide::widest!(
            avx512: wide::add_rows_avx512 as RowsLoop,
            avx2: wide::add_rows_avx2 as RowsLoop,
            plain: add_rows,
        )
    })
}

#[inline(always)]
fn add_rows(block: &[f32], acc: &mut [f64]) {
    for row in block.chunks_exact(acc.len()) {
        for (a, &v) in acc.iter_mut().zip(row) {
            *a += f64::from(v);
        }
    }
}

/// The AVX2 and AVX-512 instances of [`add_rows`].
#[cfg(target_arch = "x86_64")]
mod wide {
    use super::add_rows;

    crate::wide::x86_instances!(
        add_rows(block: &[f32], acc: &mut [f64]);
        "avx2" => add_rows_avx2,
        "avx512f" => add_rows_avx512,
    );
}

/// Mean squared error `Σ (pred − target)² / n` (PyTorch's `reduction='mean'`).
pub fn mse_loss(pred: &[f32], target: &[f32]) -> Result<f32, KernelError> {
    KernelError::check_len("target", pred.len(), target.len())?;
    if pred.is_empty() {
        return Err(KernelError::invalid(
            "pred",
            "the mean of no elements is undefined",
        ));
    }
    let square_error = |(p, t): (&[f32], &[f32])| {
        p.iter()
            .zip(t)
            .map(|(&p, &t)| {
                let d = f64::from(p) - f64::from(t);
                d * d
            })
            .sum::<f64>()
    };
    let total: f64 = if pred.len() < MIN_PARALLEL {
        square_error((pred, target))
    } else {
        pred.par_chunks(PIECE)
            .zip(target.par_chunks(PIECE))
            .map(square_error)
            .sum()
    };
    Ok((total / pred.len() as f64) as f32)
}

/// `grad ← grad_output · 2(pred − target) / n`, the gradient of [`mse_loss`].
pub fn mse_loss_backward(
    pred: &[f32],
    target: &[f32],
    grad_output: f32,
    grad: &mut [f32],
) -> Result<(), KernelError> {
    KernelError::check_len("target", pred.len(), target.len())?;
    let factor = mse_backward_factor(grad_output, pred.len());
    crate::map(
        crate::MapOp::MseLossBackward,
        grad,
        &[pred, target],
        &[factor],
    )
}

/// MSE backward's scalar over `n` elements: `2·grad_output / n`, in f64
/// and rounded once (every backend's launch uses this one).
pub fn mse_backward_factor(grad_output: f32, n: usize) -> f32 {
    (2.0 * f64::from(grad_output) / n.max(1) as f64) as f32
}

/// `out[s] ← Σ x[segment s]`, accumulated in f64.
pub fn segment_sum(x: &[f32], segments: &[Segment], out: &mut [f32]) -> Result<(), KernelError> {
    per_segment(x, segments, out, sum)
}

/// `out[s] ← Σ x[segment s]²`, accumulated in f64 (squared L2 norms per tensor).
pub fn segment_sum_squares(
    x: &[f32],
    segments: &[Segment],
    out: &mut [f32],
) -> Result<(), KernelError> {
    per_segment(x, segments, out, sum_squares)
}

fn per_segment(
    x: &[f32],
    segments: &[Segment],
    out: &mut [f32],
    reduce: fn(&[f32]) -> f64,
) -> Result<(), KernelError> {
    validate_segments(segments, x.len())?;
    KernelError::check_len("out", segments.len(), out.len())?;
    let totals = segment_totals(x, segments, reduce);
    for (o, t) in out.iter_mut().zip(totals) {
        *o = t as f32;
    }
    Ok(())
}

/// Per-segment totals of `reduce` over pieces, deterministic for any thread
/// count. `segments` must be valid for `x`.
pub(crate) fn segment_totals(
    x: &[f32],
    segments: &[Segment],
    reduce: fn(&[f32]) -> f64,
) -> Vec<f64> {
    let pieces = crate::optimizer::segment_pieces(segments);
    let total_len: usize = segments.iter().map(|s| s.len).sum();
    let partial = map(pieces, total_len >= MIN_PARALLEL, |(s, range)| {
        (s, x.get(range).map_or(0.0, reduce))
    });
    let mut totals = vec![0.0; segments.len()];
    for (s, value) in partial {
        totals[s] += value;
    }
    totals
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vector_instance_of_the_column_sums_adds_as_the_plain_loop() {
        let (rows, cols) = (97, 67);
        let x: Vec<f32> = (0..rows * cols)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761) as f32 / u32::MAX as f32) - 0.5)
            .collect();
        let (mut plain, mut wide) = (vec![0.0f64; cols], vec![0.0f64; cols]);
        add_rows(&x, &mut plain);
        (rows_loop())(&x, &mut wide);
        assert_eq!(plain, wide);
        let mut out = vec![0.0f32; cols];
        column_sum(&x, rows, cols, &mut out).unwrap();
        for (c, &got) in out.iter().enumerate() {
            let want: f64 = (0..rows).map(|r| f64::from(x[r * cols + c])).sum();
            assert_eq!(got, want as f32, "column {c}");
        }
    }
}
