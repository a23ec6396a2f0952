//! Layer normalisation over the rows of a `rows×cols` matrix, PyTorch's
//! `layer_norm` with the normalised dimensions flattened into `cols`, and
//! its fused backward. Each row is one unit of work: its mean, then the
//! biased variance of the centred values (two passes, in `f32`, as the GPU
//! bodies; each sum in 16 partial sums, so that it vectorises), so a row's
//! result does not depend on the thread count.

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::KernelError;
use crate::parallel::{MIN_PARALLEL, PIECE, with_wide_vectors};

/// The shape and options of a layer normalisation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LayerNormSpec {
    /// Rows normalised independently.
    pub rows: u64,
    /// Elements per row (the normalised dimensions' product).
    pub cols: u64,
    /// Added to the variance before its square root (PyTorch's 1e-5).
    pub eps: f32,
    /// Whether a weight and a bias (`cols` each) scale and shift the result.
    pub affine: bool,
}

impl LayerNormSpec {
    /// Refuses an empty row and a non-finite or negative `eps`.
    pub fn validate(&self) -> Result<(), KernelError> {
        if self.cols == 0 {
            return Err(KernelError::invalid("cols", "a row of no elements"));
        }
        if !(self.eps.is_finite() && self.eps >= 0.0) {
            return Err(KernelError::invalid(
                "eps",
                "must be finite and not negative",
            ));
        }
        Ok(())
    }

    /// The matrix's element count (`None` on overflow).
    pub fn elements(&self) -> Option<u64> {
        self.rows.checked_mul(self.cols)
    }

    fn dims(&self) -> Result<(usize, usize), KernelError> {
        self.validate()?;
        let size = |v: u64, field| {
            usize::try_from(v).map_err(|_| KernelError::invalid(field, "does not fit in usize"))
        };
        Ok((size(self.rows, "rows")?, size(self.cols, "cols")?))
    }
}

/// Independent accumulators of a row's sums, so that they vectorise (one
/// running sum would be a chain of dependent additions).
const LANES: usize = 16;

/// `Σ term(x)` over `row`, in [`LANES`] partial sums added at the end.
#[inline(always)]
fn lane_sum(row: &[f32], term: impl Fn(f32) -> f32) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane += term(x);
        }
    }
    lanes_total(lanes) + tail.iter().map(|&x| term(x)).sum::<f32>()
}

/// The sum of `lanes`, halving them pairwise: four dependent additions
/// where one running sum over them would be sixteen (a row of 64 spent
/// most of its time there).
#[inline(always)]
fn lanes_total(mut lanes: [f32; LANES]) -> f32 {
    let mut width = LANES / 2;
    while width > 0 {
        let (low, high) = lanes.split_at_mut(width);
        for (low, &high) in low.iter_mut().zip(&high[..width]) {
            *low += high;
        }
        width /= 2;
    }
    lanes[0]
}

/// The mean and `1/sqrt(var + eps)` of `row`.
#[inline(always)]
fn row_stats(row: &[f32], eps: f32) -> (f32, f32) {
    let n = row.len() as f32;
    let mean = lane_sum(row, |x| x) / n;
    let var = lane_sum(row, |x| (x - mean) * (x - mean)) / n;
    (mean, 1.0 / (var + eps).sqrt())
}

/// Rows of `cols` elements per piece of parallel work.
fn rows_per_piece(cols: usize) -> usize {
    (PIECE / cols).max(1)
}

/// `y ← (x − mean)·rstd·weight + bias` over each row of `x`, writing each
/// row's mean and rstd to `stats` (`2·rows`: means, then rstds).
/// `weight` and `bias` are given exactly when `spec.affine`.
pub fn layer_norm(
    spec: &LayerNormSpec,
    x: &[f32],
    affine: Option<(&[f32], &[f32])>,
    y: &mut [f32],
    stats: &mut [f32],
) -> Result<(), KernelError> {
    let (rows, cols) = spec.dims()?;
    check_common(spec, rows, cols, x, affine.map(|(w, _)| w))?;
    if let Some((_, bias)) = affine {
        KernelError::check_len("bias", cols, bias.len())?;
    }
    KernelError::check_len("y", rows * cols, y.len())?;
    KernelError::check_len("stats", 2 * rows, stats.len())?;
    let (means, rstds) = stats.split_at_mut(rows);
    let eps = spec.eps;
    let piece = |y: &mut [f32], x: &[f32], means: &mut [f32], rstds: &mut [f32]| {
        with_wide_vectors(
            #[inline(always)]
            || normalise_rows(eps, affine, x, y, means, rstds),
        )
    };
    if x.len() < MIN_PARALLEL {
        piece(y, x, means, rstds);
    } else {
        let per = rows_per_piece(cols);
        (y.par_chunks_mut(per * cols), x.par_chunks(per * cols))
            .into_par_iter()
            .zip(means.par_chunks_mut(per).zip(rstds.par_chunks_mut(per)))
            .for_each(|((y, x), (means, rstds))| piece(y, x, means, rstds));
    }
    Ok(())
}

/// [`layer_norm`] of the rows of `x` (as many as `means`).
#[inline(always)]
fn normalise_rows(
    eps: f32,
    affine: Option<(&[f32], &[f32])>,
    x: &[f32],
    y: &mut [f32],
    means: &mut [f32],
    rstds: &mut [f32],
) {
    let cols = x.len() / means.len().max(1);
    let rows = x.chunks_exact(cols).zip(y.chunks_exact_mut(cols));
    for ((x, y), (mean, rstd)) in rows.zip(means.iter_mut().zip(rstds.iter_mut())) {
        let (m, r) = row_stats(x, eps);
        (*mean, *rstd) = (m, r);
        match affine {
            Some((weight, bias)) => {
                for (((out, &v), &w), &b) in y.iter_mut().zip(x).zip(weight).zip(bias) {
                    *out = (v - m) * r * w + b;
                }
            }
            None => {
                for (out, &v) in y.iter_mut().zip(x) {
                    *out = (v - m) * r;
                }
            }
        }
    }
}

/// The fused backward of [`layer_norm`]: from `x`, its `stats` and the
/// output's gradient `grad_y`, writes the input's gradient `grad_x` and
/// `grad_y ⊙ x̂` (`weighted`, whose column sums are the weight's gradient;
/// the bias's are `grad_y`'s column sums). With `h = grad_y ⊙ weight`:
/// `grad_x = rstd·(h − mean(h) − x̂·mean(h ⊙ x̂))`.
pub fn layer_norm_backward(
    spec: &LayerNormSpec,
    x: &[f32],
    weight: Option<&[f32]>,
    stats: &[f32],
    grad_y: &[f32],
    grad_x: &mut [f32],
    weighted: &mut [f32],
) -> Result<(), KernelError> {
    let (rows, cols) = spec.dims()?;
    check_common(spec, rows, cols, x, weight)?;
    KernelError::check_len("stats", 2 * rows, stats.len())?;
    KernelError::check_len("grad_y", rows * cols, grad_y.len())?;
    KernelError::check_len("grad_x", rows * cols, grad_x.len())?;
    KernelError::check_len("weighted", rows * cols, weighted.len())?;
    let (means, rstds) = stats.split_at(rows);
    let ones;
    let weight = match weight {
        Some(weight) => weight,
        None => {
            ones = vec![1.0f32; cols];
            &ones
        }
    };
    // `((x, grad_y), (grad_x, weighted)), (means, rstds)` of a run of rows.
    let piece = |((x, grad_y), (grad_x, weighted)), (means, rstds)| {
        let rows = RowsBackward {
            x,
            grad_y,
            means,
            rstds,
            grad_x,
            weighted,
        };
        with_wide_vectors(
            #[inline(always)]
            || backward_rows(weight, rows),
        )
    };
    if x.len() < MIN_PARALLEL {
        piece(((x, grad_y), (grad_x, weighted)), (means, rstds));
    } else {
        let per = rows_per_piece(cols);
        let inputs = (x.par_chunks(per * cols), grad_y.par_chunks(per * cols));
        let outputs = (
            grad_x.par_chunks_mut(per * cols),
            weighted.par_chunks_mut(per * cols),
        );
        (inputs.into_par_iter(), outputs.into_par_iter())
            .into_par_iter()
            .zip(means.par_chunks(per).zip(rstds.par_chunks(per)))
            .for_each(|(rows, stats)| piece(rows, stats));
    }
    Ok(())
}

/// A run of whole rows of [`layer_norm_backward`]'s operands.
struct RowsBackward<'a> {
    x: &'a [f32],
    grad_y: &'a [f32],
    means: &'a [f32],
    rstds: &'a [f32],
    grad_x: &'a mut [f32],
    weighted: &'a mut [f32],
}

/// [`layer_norm_backward`] of a run of rows: the two row sums in lanes,
/// then the input's gradient.
#[inline(always)]
fn backward_rows(weight: &[f32], rows: RowsBackward<'_>) {
    let cols = weight.len();
    let n = cols as f32;
    let inputs = rows
        .x
        .chunks_exact(cols)
        .zip(rows.grad_y.chunks_exact(cols));
    let outputs = rows
        .grad_x
        .chunks_exact_mut(cols)
        .zip(rows.weighted.chunks_exact_mut(cols));
    let stats = rows.means.iter().zip(rows.rstds);
    for (((x, g), (dx, gx)), (&mean, &rstd)) in inputs.zip(outputs).zip(stats) {
        let (mut sum_h, mut sum_hx) = ([0.0f32; LANES], [0.0f32; LANES]);
        let full = (cols / LANES) * LANES;
        let lanes = x[..full]
            .chunks_exact(LANES)
            .zip(g[..full].chunks_exact(LANES));
        let lanes_out = gx[..full]
            .chunks_exact_mut(LANES)
            .zip(weight[..full].chunks_exact(LANES));
        for ((x, g), (gx, w)) in lanes.zip(lanes_out) {
            let sums = sum_h.iter_mut().zip(sum_hx.iter_mut());
            for (((sum_h, sum_hx), gx), ((&x, &g), &w)) in sums.zip(gx).zip(x.iter().zip(g).zip(w))
            {
                let xhat = (x - mean) * rstd;
                let h = g * w;
                *sum_h += h;
                *sum_hx += h * xhat;
                *gx = g * xhat;
            }
        }
        let (mut tail_h, mut tail_hx) = (0.0f32, 0.0f32);
        for c in full..cols {
            let xhat = (x[c] - mean) * rstd;
            let h = g[c] * weight[c];
            tail_h += h;
            tail_hx += h * xhat;
            gx[c] = g[c] * xhat;
        }
        let mean_h = (lanes_total(sum_h) + tail_h) / n;
        let mean_hx = (lanes_total(sum_hx) + tail_hx) / n;
        for (((dx, &x), &g), &w) in dx.iter_mut().zip(x).zip(g).zip(weight) {
            let xhat = (x - mean) * rstd;
            *dx = rstd * (g * w - mean_h - xhat * mean_hx);
        }
    }
}

fn check_common(
    spec: &LayerNormSpec,
    rows: usize,
    cols: usize,
    x: &[f32],
    weight: Option<&[f32]>,
) -> Result<(), KernelError> {
    let elements = rows
        .checked_mul(cols)
        .ok_or_else(|| KernelError::invalid("rows", "rows×cols overflows"))?;
    KernelError::check_len("x", elements, x.len())?;
    if spec.affine != weight.is_some() {
        return Err(KernelError::invalid(
            "affine",
            "a weight and a bias are given exactly when affine",
        ));
    }
    if let Some(weight) = weight {
        KernelError::check_len("weight", cols, weight.len())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_row_is_centred_scaled_and_shifted() {
        let spec = LayerNormSpec {
            rows: 2,
            cols: 2,
            eps: 0.0,
            affine: true,
        };
        let (mut y, mut stats) = ([0.0; 4], [0.0; 4]);
        let affine = Some((&[2.0, 1.0][..], &[0.5, 0.0][..]));
        layer_norm(&spec, &[1.0, 3.0, -2.0, -4.0], affine, &mut y, &mut stats).unwrap();
        assert_eq!(y, [-1.5, 1.0, 2.5, -1.0]);
        assert_eq!(stats, [2.0, -3.0, 1.0, 1.0]);
    }

    #[test]
    fn the_input_gradient_of_a_constant_upstream_gradient_is_zero() {
        let spec = LayerNormSpec {
            rows: 1,
            cols: 3,
            eps: 1e-5,
            affine: false,
        };
        let x = [0.5, -1.0, 2.0];
        let (mut y, mut stats) = ([0.0; 3], [0.0; 2]);
        layer_norm(&spec, &x, None, &mut y, &mut stats).unwrap();
        let (mut dx, mut weighted) = ([9.0; 3], [0.0; 3]);
        layer_norm_backward(&spec, &x, None, &stats, &[1.0; 3], &mut dx, &mut weighted).unwrap();
        assert!(dx.iter().all(|v| v.abs() < 1e-6), "{dx:?}");
        assert_eq!(weighted, y);
    }

    #[test]
    fn a_weight_without_affine_or_an_empty_row_is_refused() {
        let mut spec = LayerNormSpec {
            rows: 1,
            cols: 2,
            eps: 1e-5,
            affine: false,
        };
        let (mut y, mut stats) = ([0.0; 2], [0.0; 2]);
        let affine = Some((&[1.0, 1.0][..], &[0.0, 0.0][..]));
        assert!(layer_norm(&spec, &[1.0, 2.0], affine, &mut y, &mut stats).is_err());
        spec.cols = 0;
        assert!(layer_norm(&spec, &[], None, &mut [], &mut stats).is_err());
    }

    /// The forward and backward of a row in f64, for comparison.
    fn reference(x: &[f32], w: &[f32], b: &[f32], g: &[f32]) -> (Vec<f64>, Vec<f64>) {
        let n = x.len() as f64;
        let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
        let var = x
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / n;
        let rstd = 1.0 / (var + 1e-5).sqrt();
        let xhat: Vec<f64> = x.iter().map(|&v| (f64::from(v) - mean) * rstd).collect();
        let y = (0..x.len())
            .map(|c| xhat[c] * f64::from(w[c]) + f64::from(b[c]))
            .collect();
        let h: Vec<f64> = (0..x.len()).map(|c| f64::from(g[c] * w[c])).collect();
        let mean_h = h.iter().sum::<f64>() / n;
        let mean_hx = h.iter().zip(&xhat).map(|(h, x)| h * x).sum::<f64>() / n;
        let dx = (0..x.len())
            .map(|c| rstd * (h[c] - mean_h - xhat[c] * mean_hx))
            .collect();
        (y, dx)
    }

    #[test]
    fn rows_in_lanes_with_a_tail_and_in_parallel_match_an_f64_reference() {
        // 37 columns: two runs of lanes and a tail of 5; 4,000 rows reach
        // the parallel path.
        for rows in [3usize, 4_000] {
            let cols = 37;
            let spec = LayerNormSpec {
                rows: rows as u64,
                cols: cols as u64,
                eps: 1e-5,
                affine: true,
            };
            let value = |i: usize, salt: usize| ((i * 7_919 + salt) % 1_000) as f32 / 250.0 - 2.0;
            let x: Vec<f32> = (0..rows * cols).map(|i| value(i, 3)).collect();
            let g: Vec<f32> = (0..rows * cols).map(|i| value(i, 11)).collect();
            let w: Vec<f32> = (0..cols).map(|c| 0.5 + c as f32 / 40.0).collect();
            let b: Vec<f32> = (0..cols).map(|c| c as f32 / 80.0 - 0.2).collect();
            let (mut y, mut stats) = (vec![0.0; rows * cols], vec![0.0; 2 * rows]);
            layer_norm(&spec, &x, Some((&w, &b)), &mut y, &mut stats).unwrap();
            let (mut dx, mut weighted) = (vec![0.0; rows * cols], vec![0.0; rows * cols]);
            layer_norm_backward(&spec, &x, Some(&w), &stats, &g, &mut dx, &mut weighted).unwrap();
            for row in [0, rows / 2, rows - 1] {
                let at = row * cols..(row + 1) * cols;
                let (want_y, want_dx) = reference(&x[at.clone()], &w, &b, &g[at.clone()]);
                for c in 0..cols {
                    let i = row * cols + c;
                    assert!((f64::from(y[i]) - want_y[c]).abs() < 1e-5, "y[{row}][{c}]");
                    assert!(
                        (f64::from(dx[i]) - want_dx[c]).abs() < 1e-4,
                        "dx[{row}][{c}]"
                    );
                    let xhat = (f64::from(y[i]) - f64::from(b[c])) / f64::from(w[c]);
                    assert!((f64::from(weighted[i]) - f64::from(g[i]) * xhat).abs() < 1e-4);
                }
            }
        }
    }
}
