//! How well a classifier does, from its logits: accuracy, log-loss, the
//! majority-class baseline and the confusion matrix; and the summary a
//! classification run prints.

use serde::Serialize;

/// The class of each row: its largest logit (the first of equals).
pub fn predicted(logits: &[f32], classes: usize) -> Vec<usize> {
    logits
        .chunks(classes.max(1))
        .map(|row| {
            let mut best = 0;
            for (i, &v) in row.iter().enumerate() {
                if v > row[best] {
                    best = i;
                }
            }
            best
        })
        .collect()
}

/// The fraction of `predicted` equal to `labels`.
pub fn accuracy(predicted: &[usize], labels: &[usize]) -> f64 {
    let right = predicted.iter().zip(labels).filter(|(p, l)| p == l).count();
    right as f64 / labels.len().max(1) as f64
}

/// The mean cross-entropy of `labels` under softmax(`logits`), in f64
/// (scikit-learn's `log_loss` of the same probabilities).
pub fn log_loss(logits: &[f32], classes: usize, labels: &[usize]) -> f64 {
    let total: f64 = logits
        .chunks(classes.max(1))
        .zip(labels)
        .map(|(row, &label)| {
            let max = row
                .iter()
                .fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
            let sum: f64 = row.iter().map(|&v| (f64::from(v) - max).exp()).sum();
            let at = row.get(label).map_or(f64::NAN, |&v| f64::from(v));
            sum.ln() - (at - max)
        })
        .sum();
    total / labels.len().max(1) as f64
}

/// The most frequent class of `labels` (the first of equals) and its count.
pub fn majority(labels: &[usize], classes: usize) -> (usize, usize) {
    let mut counts = vec![0usize; classes.max(1)];
    for &label in labels {
        if let Some(count) = counts.get_mut(label) {
            *count += 1;
        }
    }
    let mut best = 0;
    for (class, &count) in counts.iter().enumerate() {
        if count > counts[best] {
            best = class;
        }
    }
    (best, counts[best])
}

/// `matrix[true][predicted]`: how many rows of each class were predicted as each.
pub fn confusion(predicted: &[usize], labels: &[usize], classes: usize) -> Vec<Vec<usize>> {
    let mut matrix = vec![vec![0; classes]; classes];
    for (&p, &l) in predicted.iter().zip(labels) {
        if let Some(cell) = matrix.get_mut(l).and_then(|row| row.get_mut(p)) {
            *cell += 1;
        }
    }
    matrix
}

/// What a classification run reports at the end (`--json`: one line).
#[derive(Clone, Debug, Serialize)]
pub struct ClassSummary {
    /// Always `"summary"`.
    pub event: &'static str,
    /// `"classify"`.
    pub task: &'static str,
    /// The data's name.
    pub dataset: String,
    /// The device trained on.
    pub device: String,
    /// `mlp` or `vit`.
    pub model: &'static str,
    /// Hidden widths (of an MLP).
    pub layers: Vec<usize>,
    /// Hidden activation.
    pub activation: String,
    /// Samples per step.
    pub batch: usize,
    /// Optimizer name.
    pub optimizer: &'static str,
    /// Learning rate.
    pub lr: f64,
    /// Steps taken.
    pub steps: u64,
    /// Parameters in the model.
    pub parameters: usize,
    /// The class names, by index.
    pub classes: Vec<String>,
    /// Rows trained on.
    pub train_rows: usize,
    /// Rows held out.
    pub val_rows: usize,
    /// Accuracy on the training part.
    pub train_accuracy: f64,
    /// Accuracy on the validation part.
    pub val_accuracy: f64,
    /// Log-loss on the training part.
    pub train_log_loss: f64,
    /// Log-loss on the validation part.
    pub val_log_loss: f64,
    /// Validation accuracy of always predicting the training part's most frequent class.
    pub baseline_accuracy: f64,
    /// That class's name.
    pub baseline_class: String,
    /// Validation rows by true class (rows) and predicted class (columns).
    pub confusion: Vec<Vec<usize>>,
    /// Seconds in the step loop.
    pub train_seconds: f64,
    /// Seconds in all.
    pub seconds: f64,
    /// Steps per second of the loop.
    pub steps_per_s: f64,
    /// How each step ran.
    pub step: &'static str,
    /// The step a `--resume` started from (`None`: a run from step 0).
    pub resumed_at: Option<u64>,
    /// Checkpoints saved by this run.
    pub checkpoints: u64,
}

impl ClassSummary {
    /// Prints the table and the confusion matrix.
    pub fn print(&self) {
        let rows = [
            (
                "dataset",
                format!(
                    "{} ({} train / {} validation rows, {} classes)",
                    self.dataset,
                    self.train_rows,
                    self.val_rows,
                    self.classes.len()
                ),
            ),
            ("device", self.device.clone()),
            (
                "model",
                match self.model {
                    "vit" => format!(
                        "ViT (digits, d 64, 4 heads, 2 blocks), {} parameters",
                        self.parameters
                    ),
                    _ => format!(
                        "MLP {:?} {}, {} parameters",
                        self.layers, self.activation, self.parameters
                    ),
                },
            ),
            (
                "optimizer",
                format!(
                    "{} lr {} batch {}, {} step, cross-entropy",
                    self.optimizer, self.lr, self.batch, self.step
                ),
            ),
            (
                "steps",
                format!(
                    "{}{} in {:.2} s ({:.0} steps/s){}",
                    self.steps,
                    self.resumed_at
                        .map_or(String::new(), |at| format!(" (resumed at step {at})")),
                    self.train_seconds,
                    self.steps_per_s,
                    match self.checkpoints {
                        0 => String::new(),
                        n => format!(", {n} checkpoints saved"),
                    }
                ),
            ),
            (
                "train",
                format!(
                    "accuracy {:.2}%  log-loss {:.4}",
                    100.0 * self.train_accuracy,
                    self.train_log_loss
                ),
            ),
            (
                "validation",
                format!(
                    "accuracy {:.2}%  log-loss {:.4}  (majority class `{}`: {:.2}%)",
                    100.0 * self.val_accuracy,
                    self.val_log_loss,
                    self.baseline_class,
                    100.0 * self.baseline_accuracy
                ),
            ),
            ("total time", format!("{:.2} s", self.seconds)),
        ];
        for (name, value) in rows {
            println!("{name:<15} {value}");
        }
        println!("confusion (validation; rows: true class, columns: predicted)");
        let width = self
            .classes
            .iter()
            .map(String::len)
            .chain(self.confusion.iter().flatten().map(|c| c.to_string().len()))
            .max()
            .unwrap_or(1)
            .max(3);
        let mut line = format!("{:>width$}", "");
        for class in &self.classes {
            line.push_str(&format!(" {class:>width$}"));
        }
        println!("{line}");
        for (class, row) in self.classes.iter().zip(&self.confusion) {
            let mut line = format!("{class:>width$}");
            for count in row {
                line.push_str(&format!(" {count:>width$}"));
            }
            println!("{line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accuracy_log_loss_majority_and_confusion_count_what_they_say() {
        let logits = [2.0, 0.0, 0.0, 1.0, 5.0, 5.0];
        let guess = predicted(&logits, 2);
        assert_eq!(guess, [0, 1, 0]);
        assert_eq!(accuracy(&guess, &[0, 1, 1]), 2.0 / 3.0);
        let want = ((1.0 + (-2f64).exp()).ln() + (1.0 + (-1f64).exp()).ln() + 2f64.ln()) / 3.0;
        assert!((log_loss(&logits, 2, &[0, 1, 1]) - want).abs() < 1e-12);
        assert_eq!(majority(&[2, 1, 2, 0], 3), (2, 2));
        assert_eq!(confusion(&guess, &[0, 1, 1], 2), [[1, 0], [1, 1]]);
    }
}
