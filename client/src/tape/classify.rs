//! Classification on the tape, with PyTorch's names and arguments:
//! `softmax` and `log_softmax` over the last dimension, `cross_entropy` and
//! `nll_loss` over class-index targets, `binary_cross_entropy_with_logits`.
//!
//! Class targets live in a buffer of their own ([`ClassTargets`]), as
//! `i32` words on the device and as labels on the host, where a target
//! out of range is refused naming its row before anything is queued.

use cistern_runtime::{ClassInput, ClassLossSpec, KernelLaunch, MapOp, Reduction, Segment};

use super::backward::Grad;
use super::node::Op;
use super::tape::{Tape, TapeId};
use super::var::Var;
use crate::compute::Buffer;
use crate::error::AutodiffError;
use crate::shape::ShapeError;

/// Class-index targets of one tape: one label per row, uploaded once as
/// `i32` words and kept on the host for the range checks of every loss
/// that reads them.
#[derive(Clone, Debug)]
pub struct ClassTargets {
    tape: TapeId,
    buffer: Buffer,
    labels: Vec<i64>,
}

impl ClassTargets {
    /// The labels, as given.
    pub fn labels(&self) -> &[i64] {
        &self.labels
    }

    /// Rows: one label each.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Never true: a tape holds no empty targets.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The tape they were uploaded to.
    pub fn tape_id(&self) -> TapeId {
        self.tape
    }

    /// The `i32` words on the device.
    pub(crate) fn buffer(&self) -> &Buffer {
        &self.buffer
    }
}

impl Tape {
    /// The classes and ignore index of every class loss on this tape that
    /// reads `targets`: what a label written into them later must respect.
    pub(crate) fn class_limits(&self, targets: &ClassTargets) -> Vec<(usize, i64)> {
        let words = targets.buffer.whole();
        self.with_nodes(|nodes| {
            nodes
                .iter()
                .filter_map(|node| match &node.op {
                    Op::ClassLoss { record, .. } if record.targets.whole() == words => {
                        Some((record.spec.classes, i64::from(record.spec.ignore_index)))
                    }
                    _ => None,
                })
                .collect()
        })
    }
}

/// `torch.nn.functional.cross_entropy`'s options, with its defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct CrossEntropyOptions {
    /// A weight per class (`weight`), or none.
    pub weight: Option<Vec<f32>>,
    /// Rows whose target is this contribute nothing (`ignore_index`, −100).
    pub ignore_index: i64,
    /// `reduction` (mean).
    pub reduction: Reduction,
    /// `label_smoothing` in `[0, 1]` (0).
    pub label_smoothing: f32,
}

impl Default for CrossEntropyOptions {
    fn default() -> Self {
        CrossEntropyOptions {
            weight: None,
            ignore_index: -100,
            reduction: Reduction::Mean,
            label_smoothing: 0.0,
        }
    }
}

/// `torch.nn.functional.nll_loss`'s options, with its defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct NllLossOptions {
    /// A weight per class (`weight`), or none.
    pub weight: Option<Vec<f32>>,
    /// Rows whose target is this contribute nothing (`ignore_index`, −100).
    pub ignore_index: i64,
    /// `reduction` (mean).
    pub reduction: Reduction,
}

impl Default for NllLossOptions {
    fn default() -> Self {
        NllLossOptions {
            weight: None,
            ignore_index: -100,
            reduction: Reduction::Mean,
        }
    }
}

/// `torch.nn.functional.binary_cross_entropy_with_logits`'s options.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BceWithLogitsOptions {
    /// A weight per element (`weight`): as many as the input, or one per
    /// column (broadcast over rows); none is 1.
    pub weight: Option<Vec<f32>>,
    /// `pos_weight`: one per column (the last dimension); none is 1.
    pub pos_weight: Option<Vec<f32>>,
    /// `reduction` (mean).
    pub reduction: Reduction,
}

/// What a class loss's backward needs.
#[derive(Clone, Debug)]
pub(super) struct ClassLossRecord {
    pub(super) spec: ClassLossSpec,
    pub(super) targets: Buffer,
    pub(super) weight: Option<Buffer>,
}

/// What a binary cross-entropy's backward needs.
#[derive(Clone, Debug)]
pub(super) struct BceRecord {
    pub(super) target: Buffer,
    pub(super) pos_weight: Buffer,
    pub(super) weight: Buffer,
    pub(super) reduction: Reduction,
}

fn invalid(message: String) -> AutodiffError {
    AutodiffError::InvalidArgument(message)
}

impl Tape {
    /// Uploads class-index `labels` (one per row) as the targets of
    /// `cross_entropy` and `nll_loss`; no labels, or a label outside
    /// `i32`, is `InvalidArgument` naming the row.
    pub fn class_targets(&self, labels: &[i64]) -> Result<ClassTargets, AutodiffError> {
        let mut bytes = Vec::with_capacity(4 * labels.len());
        for (row, &label) in labels.iter().enumerate() {
            let word = i32::try_from(label)
                .map_err(|_| invalid(format!("row {row}'s target {label} does not fit in i32")))?;
            bytes.extend(word.to_ne_bytes());
        }
        let buffer = self.upload_words(&bytes, labels.len())?;
        Ok(ClassTargets {
            tape: self.id(),
            buffer,
            labels: labels.to_vec(),
        })
    }

    /// `softmax(input, dim=-1)`: each row of the last dimension normalised.
    pub fn softmax(&self, input: &Var<'_>) -> Result<Var<'_>, AutodiffError> {
        self.softmax_rows(input, false)
    }

    /// `log_softmax(input, dim=-1)`, stable for any finite input.
    pub fn log_softmax(&self, input: &Var<'_>) -> Result<Var<'_>, AutodiffError> {
        self.softmax_rows(input, true)
    }

    fn softmax_rows(&self, input: &Var<'_>, log: bool) -> Result<Var<'_>, AutodiffError> {
        let index = self.index_of(input)?;
        let (value, shape) = self.with_node(index, |node| (node.value.clone(), node.shape.clone()));
        let (rows, cols) = rows_and_last(&shape)?;
        let out = self.reserve(rows * cols)?;
        let launch =
            KernelLaunch::softmax(value.whole(), rows as u64, cols as u64, log, out.whole());
        self.launch(launch)?;
        let op = Op::Softmax {
            input: index,
            rows,
            cols,
            log,
        };
        Ok(self.record(out, shape, op))
    }

    /// `cross_entropy(input, target, ...)` over `rows×classes` logits and
    /// one class index per row. A target outside `0..classes` (other than
    /// `ignore_index`), a weight not one per class or a smoothing outside
    /// `[0, 1]` is `InvalidArgument`, before anything is queued.
    pub fn cross_entropy(
        &self,
        input: &Var<'_>,
        targets: &ClassTargets,
        options: &CrossEntropyOptions,
    ) -> Result<Var<'_>, AutodiffError> {
        let settings = ClassLossSettings {
            input: ClassInput::Logits,
            weight: options.weight.as_deref(),
            ignore_index: options.ignore_index,
            reduction: options.reduction,
            label_smoothing: options.label_smoothing,
        };
        self.class_loss(input, targets, settings)
    }

    /// `nll_loss(input, target, ...)` over `rows×classes` log-probabilities
    /// (a `log_softmax`'s output), with `cross_entropy`'s checks.
    pub fn nll_loss(
        &self,
        input: &Var<'_>,
        targets: &ClassTargets,
        options: &NllLossOptions,
    ) -> Result<Var<'_>, AutodiffError> {
        let settings = ClassLossSettings {
            input: ClassInput::LogProbabilities,
            weight: options.weight.as_deref(),
            ignore_index: options.ignore_index,
            reduction: options.reduction,
            label_smoothing: 0.0,
        };
        self.class_loss(input, targets, settings)
    }

    fn class_loss(
        &self,
        input: &Var<'_>,
        targets: &ClassTargets,
        settings: ClassLossSettings<'_>,
    ) -> Result<Var<'_>, AutodiffError> {
        let index = self.index_of(input)?;
        if targets.tape != self.id() {
            return Err(AutodiffError::TapeMismatch);
        }
        let (value, shape) = self.with_node(index, |node| (node.value.clone(), node.shape.clone()));
        let (rows, classes) = match shape[..] {
            [rows, classes] => (rows, classes),
            _ => {
                return Err(AutodiffError::ShapeMismatch(ShapeError::RankMismatch {
                    expected: 2,
                    actual: shape.len(),
                }));
            }
        };
        if targets.len() != rows {
            return Err(AutodiffError::ShapeMismatch(
                ShapeError::DimensionMismatch {
                    axis: 0,
                    expected: rows,
                    actual: targets.len(),
                },
            ));
        }
        let ignore_index = i32::try_from(settings.ignore_index).map_err(|_| {
            invalid(format!(
                "ignore_index {} does not fit in i32",
                settings.ignore_index
            ))
        })?;
        cistern_runtime::check_targets(&targets.labels, classes, settings.ignore_index)
            .map_err(|error| invalid(error.to_string()))?;
        let spec = ClassLossSpec {
            rows,
            classes,
            input: settings.input,
            reduction: settings.reduction,
            ignore_index,
            label_smoothing: settings.label_smoothing,
            weighted: settings.weight.is_some(),
        };
        spec.validate()
            .map_err(|error| invalid(error.to_string()))?;
        let weight = match settings.weight {
            Some(weight) if weight.len() != classes => {
                return Err(invalid(format!(
                    "weight has {} elements, one per class is {classes}",
                    weight.len()
                )));
            }
            Some(weight) => Some(self.upload_f32s(weight)?),
            None => None,
        };
        let out_shape = match settings.reduction {
            Reduction::None => vec![rows],
            Reduction::Mean | Reduction::Sum => Vec::new(),
        };
        let out = self.reserve(spec.outputs())?;
        let launch = KernelLaunch::class_loss(
            spec,
            value.whole(),
            targets.buffer.whole(),
            weight.as_ref().map(Buffer::whole),
            out.whole(),
        );
        self.launch(launch)?;
        let record = ClassLossRecord {
            spec,
            targets: targets.buffer.clone(),
            weight,
        };
        let op = Op::ClassLoss {
            input: index,
            record: Box::new(record),
        };
        Ok(self.record(out, out_shape, op))
    }

    /// `binary_cross_entropy_with_logits(input, target, ...)`: `target`
    /// has the input's shape and takes no gradient (detach it);
    /// `pos_weight` has one element per column, `weight` one per element
    /// or per column.
    pub fn binary_cross_entropy_with_logits(
        &self,
        input: &Var<'_>,
        target: &Var<'_>,
        options: &BceWithLogitsOptions,
    ) -> Result<Var<'_>, AutodiffError> {
        let (index, target_index) = (self.index_of(input)?, self.index_of(target)?);
        let (value, shape) = self.with_node(index, |node| (node.value.clone(), node.shape.clone()));
        let (target_value, target_shape, target_tracked) = self.with_node(target_index, |node| {
            (node.value.clone(), node.shape.clone(), node.tracked)
        });
        ShapeError::check_dims(&shape, &target_shape)?;
        if target_tracked {
            return Err(invalid(
                "the target of binary_cross_entropy_with_logits takes no gradient: detach it"
                    .into(),
            ));
        }
        let (_, cols) = rows_and_last(&shape)?;
        let n = shape.iter().product::<usize>();
        let pos_weight =
            self.broadcast_columns(options.pos_weight.as_deref(), n, cols, "pos_weight", false)?;
        let weight = self.broadcast_columns(options.weight.as_deref(), n, cols, "weight", true)?;
        let losses = self.reserve(n)?;
        let bindings = vec![
            value.whole(),
            target_value.whole(),
            pos_weight.whole(),
            weight.whole(),
            losses.whole(),
        ];
        self.launch(KernelLaunch::map(
            MapOp::BceWithLogits,
            &[1.0, 0.5],
            bindings,
        ))?;
        let (out, out_shape) = match options.reduction {
            Reduction::None => (losses, shape.clone()),
            Reduction::Sum | Reduction::Mean => {
                let total = self.reserve(1)?;
                let segments = vec![Segment::new(0, n)];
                self.launch(KernelLaunch::segment_sum(
                    losses.whole(),
                    segments,
                    total.whole(),
                ))?;
                if options.reduction == Reduction::Mean {
                    self.launch(KernelLaunch::scale(total.whole(), 1.0 / n as f32))?;
                }
                (total, Vec::new())
            }
        };
        let record = BceRecord {
            target: target_value,
            pos_weight,
            weight,
            reduction: options.reduction,
        };
        let op = Op::BceWithLogits {
            input: index,
            record: Box::new(record),
        };
        Ok(self.record(out, out_shape, op))
    }

    /// `values` (one per column, or `n` when `per_element` allows) as `n`
    /// elements on the device; none is all ones.
    fn broadcast_columns(
        &self,
        values: Option<&[f32]>,
        n: usize,
        cols: usize,
        name: &str,
        per_element: bool,
    ) -> Result<Buffer, AutodiffError> {
        let expanded: Vec<f32> = match values {
            None => vec![1.0; n],
            Some(values) if values.len() == cols => {
                values.iter().copied().cycle().take(n).collect()
            }
            Some(values) if per_element && values.len() == n => values.to_vec(),
            Some(values) => {
                let per = if per_element {
                    format!(" or {n}")
                } else {
                    String::new()
                };
                return Err(invalid(format!(
                    "{name} has {} elements, expected {cols} (one per column){per}",
                    values.len()
                )));
            }
        };
        self.upload_f32s(&expanded)
    }

    /// The gradient of a softmax's input, from its output `y`.
    pub(super) fn softmax_gradient(
        &self,
        y: &Buffer,
        grad: &Grad,
        (rows, cols, log): (usize, usize, bool),
    ) -> Result<Buffer, AutodiffError> {
        let g = self.materialize(grad, rows * cols)?;
        let out = self.reserve(rows * cols)?;
        let launch = KernelLaunch::softmax_backward(
            y.whole(),
            g.whole(),
            rows as u64,
            cols as u64,
            log,
            out.whole(),
        );
        self.launch(launch)?;
        Ok(out)
    }

    /// The gradient of a class loss's input: one fused kernel.
    pub(super) fn class_loss_gradient(
        &self,
        input: &Buffer,
        grad: &Grad,
        record: &ClassLossRecord,
    ) -> Result<Buffer, AutodiffError> {
        let spec = record.spec;
        let grad_output = self.materialize(grad, spec.outputs())?;
        let out = self.reserve(spec.rows * spec.classes)?;
        let launch = KernelLaunch::class_loss_backward(
            spec,
            input.whole(),
            record.targets.whole(),
            record.weight.as_ref().map(Buffer::whole),
            grad_output.whole(),
            out.whole(),
        );
        self.launch(launch)?;
        Ok(out)
    }

    /// The gradient of a binary cross-entropy's input: the element-wise
    /// backward, times the upstream gradient where it is on the device.
    pub(super) fn bce_gradient(
        &self,
        input: &Buffer,
        grad: &Grad,
        record: &BceRecord,
        n: usize,
    ) -> Result<Buffer, AutodiffError> {
        let per_element = match record.reduction {
            Reduction::Mean => 1.0 / n as f32,
            Reduction::Sum | Reduction::None => 1.0,
        };
        let factor = match (grad, record.reduction) {
            (Grad::Constant(value), Reduction::Mean | Reduction::Sum) => value * per_element,
            _ => per_element,
        };
        let out = self.reserve(n)?;
        let bindings = vec![
            input.whole(),
            record.target.whole(),
            record.pos_weight.whole(),
            record.weight.whole(),
            out.whole(),
        ];
        self.launch(KernelLaunch::map(
            MapOp::BceWithLogitsBackward,
            &[factor, 1.0],
            bindings,
        ))?;
        match (grad, record.reduction) {
            (Grad::Constant(_), Reduction::Mean | Reduction::Sum) => Ok(out),
            (Grad::Device(g), Reduction::Mean | Reduction::Sum) => self.times_scalar(&out, g, n),
            (grad, Reduction::None) => {
                let g = self.materialize(grad, n)?;
                let product = self.reserve(n)?;
                self.launch(KernelLaunch::mul(out.whole(), g.whole(), product.whole()))?;
                Ok(product)
            }
        }
    }
}

/// What `cross_entropy` and `nll_loss` share.
struct ClassLossSettings<'a> {
    input: ClassInput,
    weight: Option<&'a [f32]>,
    ignore_index: i64,
    reduction: Reduction,
    label_smoothing: f32,
}

/// `(rows, last)`: the last dimension and the product of the others (1 for
/// a vector); a scalar is `RankMismatch`.
fn rows_and_last(shape: &[usize]) -> Result<(usize, usize), AutodiffError> {
    match shape.split_last() {
        Some((&last, rest)) => Ok((rest.iter().product(), last)),
        None => Err(AutodiffError::ShapeMismatch(ShapeError::RankMismatch {
            expected: 1,
            actual: 0,
        })),
    }
}
