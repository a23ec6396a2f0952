//! Classification kernels over the rows of a row-major `rows×classes`
//! matrix: softmax and log-softmax (and their backward), and the
//! class-index losses (cross-entropy from logits, NLL from
//! log-probabilities) with PyTorch's semantics, their backward fused.
//!
//! Every row is made stable by its maximum (log-sum-exp), so logits of
//! ±1e30 and rows of equal logits give finite values. Targets are `i32`
//! class indices; a target equal to `ignore_index` contributes nothing, and
//! one outside `0..classes` is never read through: its row's loss and
//! gradient are NaN (callers refuse such targets on the host first).

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::KernelError;
use crate::parallel::{MIN_PARALLEL, PIECE};

mod rows;

pub(crate) use rows::exp;
use rows::{narrow_softmax, row_log_sum_exp, scaled_softmax};

/// How a per-row loss is reduced, as PyTorch's `reduction`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Reduction {
    /// One loss per row (`'none'`).
    None,
    /// The weighted mean over the rows not ignored (`'mean'`, the default).
    #[default]
    Mean,
    /// The sum over the rows (`'sum'`).
    Sum,
}

impl Reduction {
    /// Elements of the loss: one per row for `None`, else one.
    pub fn outputs(self, rows: usize) -> usize {
        match self {
            Reduction::None => rows,
            Reduction::Mean | Reduction::Sum => 1,
        }
    }

    /// PyTorch's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Reduction::None => "none",
            Reduction::Mean => "mean",
            Reduction::Sum => "sum",
        }
    }
}

/// What a class loss's input rows hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ClassInput {
    /// Unnormalised scores: the loss is cross-entropy.
    Logits,
    /// Log-probabilities: the loss is the negative log-likelihood.
    LogProbabilities,
}

/// A class-index loss over `rows×classes` inputs: PyTorch's
/// `cross_entropy` (logits) or `nll_loss` (log-probabilities), with its
/// `reduction`, `ignore_index`, `label_smoothing` and optional `weight`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClassLossSpec {
    /// Rows (samples) of the input.
    pub rows: usize,
    /// Classes: the input's columns and the weights' length.
    pub classes: usize,
    /// Logits or log-probabilities.
    pub input: ClassInput,
    /// How the per-row losses are reduced.
    pub reduction: Reduction,
    /// Rows whose target equals it contribute nothing (PyTorch: −100).
    pub ignore_index: i32,
    /// In `[0, 1]`: the share of the target spread over every class
    /// (cross-entropy only; 0 for NLL).
    pub label_smoothing: f32,
    /// Whether a per-class weight binding comes after the targets.
    pub weighted: bool,
}

impl ClassLossSpec {
    /// Cross-entropy from logits with PyTorch's defaults: mean, ignore
    /// index −100, no smoothing, no weights.
    pub fn cross_entropy(rows: usize, classes: usize) -> Self {
        ClassLossSpec {
            rows,
            classes,
            input: ClassInput::Logits,
            reduction: Reduction::Mean,
            ignore_index: -100,
            label_smoothing: 0.0,
            weighted: false,
        }
    }

    /// NLL from log-probabilities with PyTorch's defaults.
    pub fn nll(rows: usize, classes: usize) -> Self {
        ClassLossSpec {
            input: ClassInput::LogProbabilities,
            ..Self::cross_entropy(rows, classes)
        }
    }

    /// Elements of the loss.
    pub fn outputs(&self) -> usize {
        self.reduction.outputs(self.rows)
    }

    /// Checks the values that do not depend on data: at least one row and
    /// class, a smoothing in `[0, 1]` (0 for NLL).
    pub fn validate(&self) -> Result<(), KernelError> {
        if self.rows == 0 || self.classes == 0 {
            return Err(KernelError::invalid(
                "rows×classes",
                format!(
                    "{}×{}: a loss needs rows and classes",
                    self.rows, self.classes
                ),
            ));
        }
        let smoothing = self.label_smoothing;
        if !(0.0..=1.0).contains(&smoothing) {
            return Err(KernelError::invalid(
                "label_smoothing",
                format!("{smoothing} is outside [0, 1]"),
            ));
        }
        if self.input == ClassInput::LogProbabilities && smoothing != 0.0 {
            return Err(KernelError::invalid(
                "label_smoothing",
                "nll_loss takes no label smoothing",
            ));
        }
        self.rows
            .checked_mul(self.classes)
            .ok_or_else(|| KernelError::invalid("rows×classes", "overflows"))?;
        Ok(())
    }

    fn check(
        &self,
        input: &[f32],
        targets: &[i32],
        weights: Option<&[f32]>,
    ) -> Result<(), KernelError> {
        self.validate()?;
        KernelError::check_len("input", self.rows * self.classes, input.len())?;
        KernelError::check_len("targets", self.rows, targets.len())?;
        match (self.weighted, weights) {
            (true, Some(weights)) => KernelError::check_len("weight", self.classes, weights.len()),
            (false, None) => Ok(()),
            (true, None) => Err(KernelError::invalid("weight", "the spec is weighted")),
            (false, Some(_)) => Err(KernelError::invalid("weight", "the spec is unweighted")),
        }
    }
}

/// Runs `body(row index, input row, output row)` over the rows, in
/// parallel when the matrix is large.
fn for_rows(
    input: &[f32],
    out: &mut [f32],
    cols: usize,
    body: impl Fn(usize, &[f32], &mut [f32]) + Sync,
) {
    if cols == 0 {
        return;
    }
    if input.len() < MIN_PARALLEL {
        for (i, (x, y)) in input.chunks(cols).zip(out.chunks_mut(cols)).enumerate() {
            body(i, x, y);
        }
    } else {
        input
            .par_chunks(cols)
            .zip(out.par_chunks_mut(cols))
            .enumerate()
            .for_each(|(i, (x, y))| body(i, x, y));
    }
}

/// Runs `body(input rows, output rows, cols)` over blocks of whole rows,
/// in parallel when the matrix is large.
fn for_row_blocks(
    input: &[f32],
    out: &mut [f32],
    cols: usize,
    body: impl Fn(&[f32], usize, &mut [f32]) + Sync,
) {
    if cols == 0 {
        return;
    }
    if input.len() < MIN_PARALLEL {
        body(input, cols, out);
    } else {
        let block = (PIECE / cols).max(1) * cols;
        input
            .par_chunks(block)
            .zip(out.par_chunks_mut(block))
            .for_each(|(x, y)| body(x, cols, y));
    }
}

/// Row-wise softmax (`log = false`) or log-softmax (`log = true`) of a
/// `rows×cols` matrix, as PyTorch's `softmax(x, dim=-1)`.
pub fn softmax(
    x: &[f32],
    rows: usize,
    cols: usize,
    log: bool,
    out: &mut [f32],
) -> Result<(), KernelError> {
    let size = matrix_size(rows, cols)?;
    KernelError::check_len("x", size, x.len())?;
    KernelError::check_len("out", size, out.len())?;
    if !log && cols < rows::LANES {
        for_row_blocks(x, out, cols, narrow_softmax);
        return Ok(());
    }
    for_rows(x, out, cols, |_, x, y| {
        if log {
            let (max, log_sum) = row_log_sum_exp(x);
            for (y, &x) in y.iter_mut().zip(x) {
                *y = x - max - log_sum;
            }
        } else {
            scaled_softmax(x, 1.0, y);
        }
    });
    Ok(())
}

/// The gradient of [`softmax`] given its output `y` and the output's
/// gradient `g`: `y ⊙ (g − Σ y⊙g)` for softmax, `g − exp(y)·Σ g` for
/// log-softmax, per row.
pub fn softmax_backward(
    y: &[f32],
    g: &[f32],
    rows: usize,
    cols: usize,
    log: bool,
    grad: &mut [f32],
) -> Result<(), KernelError> {
    let size = matrix_size(rows, cols)?;
    KernelError::check_len("y", size, y.len())?;
    KernelError::check_len("grad_output", size, g.len())?;
    KernelError::check_len("grad_input", size, grad.len())?;
    for_rows(y, grad, cols, |i, y, out| {
        let g = &g[i * cols..(i + 1) * cols];
        if log {
            let total: f32 = g.iter().sum();
            for ((out, &y), &g) in out.iter_mut().zip(y).zip(g) {
                *out = g - exp(y) * total;
            }
        } else {
            let dot: f32 = y.iter().zip(g).map(|(&y, &g)| y * g).sum();
            for ((out, &y), &g) in out.iter_mut().zip(y).zip(g) {
                *out = y * (g - dot);
            }
        }
    });
    Ok(())
}

fn matrix_size(rows: usize, cols: usize) -> Result<usize, KernelError> {
    rows.checked_mul(cols)
        .ok_or_else(|| KernelError::invalid("rows*cols", "overflows"))
}

/// What a row contributes: its loss and its weight in a mean's denominator.
struct RowLoss {
    loss: f64,
    weight: f64,
}

/// The weight of class `class` (1 unweighted).
fn class_weight(weights: Option<&[f32]>, class: usize) -> f64 {
    weights
        .and_then(|w| w.get(class))
        .map_or(1.0, |&w| f64::from(w))
}

/// The target of a row as a class index: `Ok(None)` when ignored,
/// `Err(())` when out of range.
fn target_class(spec: &ClassLossSpec, target: i32) -> Result<Option<usize>, ()> {
    if target == spec.ignore_index {
        return Ok(None);
    }
    match usize::try_from(target) {
        Ok(class) if class < spec.classes => Ok(Some(class)),
        _ => Err(()),
    }
}

fn row_loss(spec: &ClassLossSpec, x: &[f32], target: i32, weights: Option<&[f32]>) -> RowLoss {
    let class = match target_class(spec, target) {
        Ok(Some(class)) => class,
        Ok(None) => {
            return RowLoss {
                loss: 0.0,
                weight: 0.0,
            };
        }
        Err(()) => {
            return RowLoss {
                loss: f64::NAN,
                weight: f64::NAN,
            };
        }
    };
    let weight = class_weight(weights, class);
    match spec.input {
        ClassInput::LogProbabilities => RowLoss {
            loss: -weight * f64::from(x[class]),
            weight,
        },
        ClassInput::Logits => {
            let (max, log_sum) = row_log_sum_exp(x);
            // −log p = log_sum − (x − max): shifted first, as PyTorch's
            // log_softmax, so two maxima of 1e30 still give ln 2.
            let minus_log_p = |v: f32| f64::from(log_sum) - f64::from(v - max);
            let nll = weight * minus_log_p(x[class]);
            let eps = f64::from(spec.label_smoothing);
            let loss = if eps == 0.0 {
                nll
            } else {
                let smooth: f64 = (x.iter().enumerate())
                    .map(|(c, &v)| class_weight(weights, c) * minus_log_p(v))
                    .sum();
                (1.0 - eps) * nll + eps / spec.classes as f64 * smooth
            };
            RowLoss { loss, weight }
        }
    }
}

/// The class loss of `spec` into `out` (`spec.outputs()` elements): per
/// row, `(1−ε)·w[t]·(−log p[t]) + ε/C·Σ_c w[c]·(−log p[c])` for logits,
/// `−w[t]·x[t]` for log-probabilities; the mean divides the sum by the
/// weights of the targets not ignored (NaN when every row is ignored, as
/// PyTorch).
pub fn class_loss(
    spec: &ClassLossSpec,
    input: &[f32],
    targets: &[i32],
    weights: Option<&[f32]>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    spec.check(input, targets, weights)?;
    KernelError::check_len("out", spec.outputs(), out.len())?;
    let cols = spec.classes;
    let losses: Vec<RowLoss> = if input.len() < MIN_PARALLEL {
        (input.chunks(cols).zip(targets))
            .map(|(x, &t)| row_loss(spec, x, t, weights))
            .collect()
    } else {
        (input.par_chunks(cols).zip(targets.par_iter()))
            .map(|(x, &t)| row_loss(spec, x, t, weights))
            .collect()
    };
    match spec.reduction {
        Reduction::None => {
            for (out, row) in out.iter_mut().zip(&losses) {
                *out = row.loss as f32;
            }
        }
        Reduction::Sum | Reduction::Mean => {
            let total: f64 = losses.iter().map(|row| row.loss).sum();
            let value = if spec.reduction == Reduction::Mean {
                total / losses.iter().map(|row| row.weight).sum::<f64>()
            } else {
                total
            };
            if let Some(out) = out.first_mut() {
                *out = value as f32;
            }
        }
    }
    Ok(())
}

/// The gradient of [`class_loss`] with respect to its input, given the
/// loss's gradient `grad_output` (one element for mean and sum, one per row
/// for none), into `grad` (`rows×classes`), in one pass: for logits
/// `s·[(1−ε)·w[t]·(p − onehot(t)) + ε/C·(W·p − w)]` (`p` the row's softmax,
/// `W = Σ w`), for log-probabilities `−s·w[t]·onehot(t)`, where `s` is the
/// row's upstream gradient (divided by the mean's denominator); ignored
/// rows get zeros.
pub fn class_loss_backward(
    spec: &ClassLossSpec,
    input: &[f32],
    targets: &[i32],
    weights: Option<&[f32]>,
    grad_output: &[f32],
    grad: &mut [f32],
) -> Result<(), KernelError> {
    spec.check(input, targets, weights)?;
    KernelError::check_len("grad_output", spec.outputs(), grad_output.len())?;
    KernelError::check_len("grad_input", input.len(), grad.len())?;
    let denominator = match spec.reduction {
        Reduction::Mean => targets
            .iter()
            .map(|&t| match target_class(spec, t) {
                Ok(Some(class)) => class_weight(weights, class),
                Ok(None) => 0.0,
                Err(()) => f64::NAN,
            })
            .sum::<f64>(),
        Reduction::Sum | Reduction::None => 1.0,
    };
    let total_weight: f64 = match weights {
        Some(w) => w.iter().map(|&w| f64::from(w)).sum(),
        None => spec.classes as f64,
    };
    let upstream = |row: usize| {
        let g = match spec.reduction {
            Reduction::None => grad_output.get(row),
            Reduction::Mean | Reduction::Sum => grad_output.first(),
        };
        f64::from(g.copied().unwrap_or(f32::NAN)) / denominator
    };
    for_rows(input, grad, spec.classes, |i, x, out| {
        row_gradient(spec, x, targets[i], weights, upstream(i), total_weight, out);
    });
    Ok(())
}

fn row_gradient(
    spec: &ClassLossSpec,
    x: &[f32],
    target: i32,
    weights: Option<&[f32]>,
    scale: f64,
    total_weight: f64,
    out: &mut [f32],
) {
    let class = match target_class(spec, target) {
        Ok(Some(class)) => class,
        Ok(None) => return out.fill(0.0),
        Err(()) => return out.fill(f32::NAN),
    };
    let weight = class_weight(weights, class);
    match spec.input {
        ClassInput::LogProbabilities => {
            out.fill(0.0);
            out[class] = (-scale * weight) as f32;
        }
        ClassInput::Logits => {
            let eps = f64::from(spec.label_smoothing);
            let hard = (1.0 - eps) * weight;
            let soft = eps / spec.classes as f64;
            // s·[(hard + soft·W)·p − hard·onehot − soft·w]: p's coefficient
            // once per row, so the element loop is one multiply of an exp.
            let coefficient = (scale * (hard + soft * total_weight)) as f32;
            scaled_softmax(x, coefficient, out);
            out[class] -= (scale * hard) as f32;
            if soft != 0.0 {
                for (c, out) in out.iter_mut().enumerate() {
                    *out -= (scale * soft * class_weight(weights, c)) as f32;
                }
            }
        }
    }
}

/// Checks host labels against `classes` before anything is uploaded:
/// every label is `ignore_index` or in `0..classes`; the error names the
/// first row that is not.
pub fn check_targets(
    targets: &[i64],
    classes: usize,
    ignore_index: i64,
) -> Result<(), KernelError> {
    for (row, &target) in targets.iter().enumerate() {
        if target == ignore_index {
            continue;
        }
        let in_range = usize::try_from(target).is_ok_and(|class| class < classes);
        if !in_range {
            return Err(KernelError::invalid(
                "target",
                format!(
                    "row {row} has class {target}, outside 0..{classes} (and not the ignore_index {ignore_index})"
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_out_of_range_is_refused_naming_its_row() {
        assert!(check_targets(&[0, 2, -100, 1], 3, -100).is_ok());
        let Err(error) = check_targets(&[0, 1, 3], 3, -100) else {
            panic!("class 3 of 3 is out of range");
        };
        assert!(error.to_string().contains("row 2 has class 3"), "{error}");
        assert!(check_targets(&[-1], 3, -100).is_err());
    }

    #[test]
    fn the_vectorisable_exp_is_within_two_ulp_of_the_library_exp() {
        let mut worst = 0.0f64;
        for i in 0..=200_000 {
            let x = -87.0 + 95.0 * i as f32 / 200_000.0;
            let (got, want) = (f64::from(exp(x)), f64::from(x.exp()));
            worst = worst.max((got - want).abs() / want);
        }
        assert!(
            worst <= 2.0 * f64::from(f32::EPSILON),
            "relative error {worst:e}"
        );
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(f32::NAN).is_nan());
        assert!(exp(-1e30) < 1e-37 && exp(-1e30) >= 0.0);
    }

    #[test]
    fn a_mean_over_rows_all_ignored_is_nan_as_pytorch() {
        let spec = ClassLossSpec::cross_entropy(2, 2);
        let mut out = [0.0];
        class_loss(&spec, &[1.0, 2.0, 3.0, 4.0], &[-100, -100], None, &mut out).unwrap();
        assert!(out[0].is_nan());
    }

    #[test]
    fn rows_of_equal_logits_give_log_of_the_class_count() {
        let spec = ClassLossSpec::cross_entropy(2, 4);
        let mut out = [0.0];
        class_loss(&spec, &[7.0; 8], &[0, 3], None, &mut out).unwrap();
        assert!((out[0] - 4f32.ln()).abs() < 1e-6, "{out:?}");
        let mut grad = [0.0; 8];
        class_loss_backward(&spec, &[7.0; 8], &[0, 3], None, &[1.0], &mut grad).unwrap();
        assert_eq!(
            grad,
            [-0.375, 0.125, 0.125, 0.125, 0.125, 0.125, 0.125, -0.375]
        );
    }

    #[test]
    fn a_weight_binding_must_match_the_spec() {
        let spec = ClassLossSpec::cross_entropy(1, 2);
        let mut out = [0.0];
        assert!(class_loss(&spec, &[0.0, 1.0], &[0], Some(&[1.0, 1.0]), &mut out).is_err());
        let weighted = ClassLossSpec {
            weighted: true,
            ..spec
        };
        assert!(class_loss(&weighted, &[0.0, 1.0], &[0], None, &mut out).is_err());
        assert!(class_loss(&weighted, &[0.0, 1.0], &[0], Some(&[1.0]), &mut out).is_err());
    }

    #[test]
    fn narrow_rows_give_the_bits_of_the_row_by_row_softmax_serial_and_in_parallel() {
        // 9 columns (attention over 9 tokens): 150 rows span three blocks;
        // 15,000 rows reach the parallel path.
        for rows in [1usize, 150, 15_000] {
            let cols = 9;
            let x: Vec<f32> = (0..rows * cols)
                .map(|i| ((i * 7_919) % 1_000) as f32 / 50.0 - 10.0)
                .collect();
            let mut out = vec![0.0; rows * cols];
            softmax(&x, rows, cols, false, &mut out).unwrap();
            let mut want = vec![0.0; cols];
            for (x, got) in x.chunks(cols).zip(out.chunks(cols)) {
                rows::scaled_softmax(x, 1.0, &mut want);
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{got:?} vs {want:?}");
            }
        }
    }
}
