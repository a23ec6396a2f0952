//! Layer normalisation over the rows of a `rows×cols` matrix, PyTorch's
//! `layer_norm` with the normalised dimensions flattened into `cols`, and
//! its fused backward. Each row is one unit of work: its mean, then the
//! biased variance of the centred values (two passes, in `f32`, as the GPU
//! bodies), so a row's result does not depend on the thread count.

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::KernelError;

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

/// The mean and `1/sqrt(var + eps)` of `row`.
fn row_stats(row: &[f32], eps: f32) -> (f32, f32) {
    let n = row.len() as f32;
    let mean = row.iter().sum::<f32>() / n;
    let var = row.iter().map(|&x| (x - mean) * (x - mean)).sum::<f32>() / n;
    (mean, 1.0 / (var + eps).sqrt())
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
    (y.par_chunks_mut(cols), x.par_chunks(cols))
        .into_par_iter()
        .zip(means.par_iter_mut().zip(rstds.par_iter_mut()))
        .with_min_len(64)
        .for_each(|((y, x), (mean, rstd))| {
            (*mean, *rstd) = row_stats(x, spec.eps);
            for (c, (out, &v)) in y.iter_mut().zip(x).enumerate() {
                let xhat = (v - *mean) * *rstd;
                *out = match affine {
                    Some((weight, bias)) => xhat * weight[c] + bias[c],
                    None => xhat,
                };
            }
        });
    Ok(())
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
    let n = cols as f32;
    (grad_x.par_chunks_mut(cols), weighted.par_chunks_mut(cols))
        .into_par_iter()
        .zip((x.par_chunks(cols), grad_y.par_chunks(cols)).into_par_iter())
        .zip(means.par_iter().zip(rstds.par_iter()))
        .with_min_len(64)
        .for_each(|(((dx, gx), (x, g)), (&mean, &rstd))| {
            let (mut sum_h, mut sum_hx) = (0.0f32, 0.0f32);
            for c in 0..cols {
                let xhat = (x[c] - mean) * rstd;
                let h = g[c] * weight.map_or(1.0, |w| w[c]);
                sum_h += h;
                sum_hx += h * xhat;
                gx[c] = g[c] * xhat;
            }
            let (mean_h, mean_hx) = (sum_h / n, sum_hx / n);
            for c in 0..cols {
                let xhat = (x[c] - mean) * rstd;
                let h = g[c] * weight.map_or(1.0, |w| w[c]);
                dx[c] = rstd * (h - mean_h - xhat * mean_hx);
            }
        });
    Ok(())
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
}
