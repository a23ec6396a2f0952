//! What a run shows while it trains: an indicatif bar (loss, steps per
//! second) on a terminal, or JSON lines with `--json`.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;

/// The live output of one run.
#[derive(Debug)]
pub enum Output {
    /// A progress bar on stderr (hidden when stderr is not a terminal).
    Bar(ProgressBar),
    /// JSON lines on stdout.
    Json,
    /// Nothing: a rank of a group other than rank 0.
    Silent,
}

impl Output {
    /// The output for a run of `steps` steps.
    pub fn new(json: bool, steps: u64) -> Self {
        if json {
            return Output::Json;
        }
        if !std::io::stderr().is_terminal() {
            return Output::Bar(ProgressBar::hidden());
        }
        let bar = ProgressBar::with_draw_target(Some(steps), ProgressDrawTarget::stderr());
        let template = "{spinner} {bar:30} {pos}/{len} steps  {msg}";
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style);
        }
        Output::Bar(bar)
    }

    /// The output of a rank that shows nothing.
    pub fn silent() -> Self {
        Output::Silent
    }

    /// After each step.
    pub fn step(&self, step: u64, loss: f64, steps_per_s: f64) {
        if let Output::Bar(bar) = self {
            bar.set_position(step);
            if step % 8 == 0 || step == 1 {
                bar.set_message(format!("loss {loss:.4}  {steps_per_s:.0} steps/s"));
            }
        }
    }

    /// After each evaluation of the validation part.
    pub fn eval(&self, step: u64, train_loss: f64, val_mse: f64, steps_per_s: f64) {
        match self {
            Output::Json => println!(
                "{}",
                json!({
                    "event": "eval",
                    "step": step,
                    "train_loss": train_loss,
                    "val_mse": val_mse,
                    "steps_per_s": steps_per_s,
                })
            ),
            Output::Bar(bar) => bar.set_message(format!(
                "loss {train_loss:.4}  val {val_mse:.4}  {steps_per_s:.0} steps/s"
            )),
            Output::Silent => {}
        }
    }

    /// A line about the run (a resume, a checkpoint): `fields` as JSON, or
    /// `text` above the bar (on stderr where the bar is hidden).
    pub fn notice(&self, fields: serde_json::Value, text: &str) {
        match self {
            Output::Json => println!("{fields}"),
            Output::Bar(bar) if bar.is_hidden() => eprintln!("{text}"),
            Output::Bar(bar) => bar.println(text),
            Output::Silent => {}
        }
    }

    /// A record for JSON lines only (what is about to train, a checkpoint
    /// saved): the bar stays quiet.
    pub fn record(&self, fields: serde_json::Value) {
        if let Output::Json = self {
            println!("{fields}");
        }
    }

    /// Ends the bar, leaving the terminal clean for the summary.
    pub fn finish(&self) {
        if let Output::Bar(bar) = self {
            bar.finish_and_clear();
        }
    }
}
