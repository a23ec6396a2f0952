//! The end of a run: a short table for people, or one JSON summary line.

use serde::Serialize;

/// What a finished run reports.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// Always `"summary"`: the JSON line's event.
    pub event: &'static str,
    /// The dataset's name (or the CSV file).
    pub dataset: String,
    /// The device trained on (`cpu:0`).
    pub device: String,
    /// Hidden widths.
    pub layers: Vec<usize>,
    /// The hidden activation.
    pub activation: String,
    /// Samples per step.
    pub batch: usize,
    /// The optimizer's name.
    pub optimizer: &'static str,
    /// Learning rate.
    pub lr: f64,
    /// Steps taken.
    pub steps: u64,
    /// Parameters trained.
    pub parameters: usize,
    /// Training rows, validation rows.
    pub train_rows: usize,
    /// Validation rows.
    pub val_rows: usize,
    /// MSE on the training part, in the target's units.
    pub train_mse: f64,
    /// MSE on the validation part.
    pub val_mse: f64,
    /// The validation MSE of predicting the training part's mean.
    pub baseline_mse: f64,
    /// Wall time of the steps alone.
    pub train_seconds: f64,
    /// Wall time of the whole run (data, evaluation, steps).
    pub seconds: f64,
    /// Steps per second of the steps alone.
    pub steps_per_s: f64,
    /// The device's peak reserved bytes.
    pub peak_reserved: u64,
    /// The device's peak bytes in use.
    pub peak_in_use: u64,
    /// Reclaims the device's memory manager ran.
    pub reclaims: u64,
    /// How a step ran: `device-chain` (the store's replayed chain step),
    /// `tape` or `tape-amp` (a tape forward, the store's backward and step).
    pub step: &'static str,
    /// Mixed precision.
    pub amp: bool,
    /// AMP steps skipped for non-finite gradients (counted in `steps`).
    pub skipped_steps: u64,
    /// Replicas of a group recovered in place after a fault (0 on one device).
    pub recovered_replicas: u64,
    /// The step a `--resume` started from (`None`: a run from step 0).
    pub resumed_at: Option<u64>,
    /// Checkpoints saved by this run.
    pub checkpoints: u64,
    /// Seconds spent saving them (outside `train_seconds`).
    pub checkpoint_seconds: f64,
}

impl Summary {
    /// Prints the table.
    pub fn print(&self) {
        let rows = [
            (
                "dataset",
                format!(
                    "{} ({} train / {} validation rows)",
                    self.dataset, self.train_rows, self.val_rows
                ),
            ),
            (
                "device",
                match self.recovered_replicas {
                    0 => self.device.clone(),
                    n => format!("{} (recovered in place: {n}, no step lost)", self.device),
                },
            ),
            (
                "model",
                format!(
                    "MLP {:?} {}, {} parameters",
                    self.layers, self.activation, self.parameters
                ),
            ),
            (
                "optimizer",
                format!(
                    "{} lr {} batch {}, {} step{}",
                    self.optimizer,
                    self.lr,
                    self.batch,
                    self.step,
                    match self.amp {
                        true => format!(" ({} skipped)", self.skipped_steps),
                        false => String::new(),
                    }
                ),
            ),
            (
                "steps",
                match self.resumed_at {
                    None => format!(
                        "{} in {:.2} s ({:.0} steps/s)",
                        self.steps, self.train_seconds, self.steps_per_s
                    ),
                    Some(at) => format!(
                        "{} (resumed at step {at}) in {:.2} s ({:.0} steps/s)",
                        self.steps, self.train_seconds, self.steps_per_s
                    ),
                },
            ),
            (
                "checkpoints",
                format!(
                    "{} saved in {:.2} s",
                    self.checkpoints, self.checkpoint_seconds
                ),
            ),
            ("train MSE", format!("{:.4}", self.train_mse)),
            (
                "validation MSE",
                format!(
                    "{:.4}  ({:.1}% of the mean baseline {:.4})",
                    self.val_mse,
                    100.0 * self.val_mse / self.baseline_mse.max(f64::MIN_POSITIVE),
                    self.baseline_mse
                ),
            ),
            (
                "memory",
                format!(
                    "peak reserved {}, peak in use {}, {} reclaims",
                    bytes(self.peak_reserved),
                    bytes(self.peak_in_use),
                    self.reclaims
                ),
            ),
            ("total time", format!("{:.2} s", self.seconds)),
        ];
        for (name, value) in rows {
            if name == "checkpoints" && self.checkpoints == 0 {
                continue;
            }
            println!("{name:<15} {value}");
        }
    }
}

fn bytes(count: u64) -> String {
    const KIB: f64 = 1024.0;
    let count = count as f64;
    if count >= KIB * KIB {
        format!("{:.1} MiB", count / (KIB * KIB))
    } else {
        format!("{:.1} KiB", count / KIB)
    }
}
