//! `cistern stress`'s arguments, checked into a [`StressConfig`], and the
//! command itself: run, print, plot, and fail unless the device held.

use std::path::PathBuf;
use std::time::Duration;

use cistern_runtime::Device;
use serde_json::json;

use super::counters::{ContextEvent, ContextEventKind};
use super::run::{FaultSettings, StressConfig, StressOutcome, run};
use super::telemetry::TelemetryFormat;
use super::units::parse_bytes;
use super::workload::{Mix, Sizes, WorkloadConfig};

/// Where `--sizes` draws reservation sizes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SizeKind {
    /// Like `gen_trace.py training`: parameters, optimizer state, activations.
    Training,
    /// Like `gen_trace.py churn`: log-uniform 256 B – 64 MiB.
    Churn,
    /// Like `gen_trace.py growth`: growing autotuning workspaces.
    Growth,
    /// Log-uniform between `--min-size` and `--max-size`.
    LogUniform,
}

/// Stress a device with many clients, a tight memory limit and injected
/// faults; verify every byte read and count how the device held.
#[derive(Debug, clap::Args)]
pub struct StressArgs {
    /// The device to stress.
    #[arg(long, default_value = "cpu:0", value_parser = parse_device)]
    pub device: Device,
    /// Client threads, each with its own stream and seeded workload.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub clients: u32,
    /// The device's memory limit (bytes, or with a unit: 64MiB, 1.5GiB).
    #[arg(long, default_value = "64MiB", value_parser = parse_bytes)]
    pub limit: u64,
    /// Operations in all, split evenly over the clients.
    #[arg(long)]
    pub ops: Option<u64>,
    /// Seconds to run (10 when neither --ops nor --seconds is given).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Seeds every client's workload.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Where reservation sizes come from.
    #[arg(long, value_enum, default_value = "log-uniform")]
    pub sizes: SizeKind,
    /// Smallest size of `--sizes log-uniform`.
    #[arg(long, default_value = "256", value_parser = parse_bytes)]
    pub min_size: u64,
    /// Largest size: the top of `log-uniform` (default 1MiB), a cap for the others.
    #[arg(long, value_parser = parse_bytes)]
    pub max_size: Option<u64>,
    /// The most bytes one client holds; past it, it frees buffers at random
    /// before reserving (peak demand is then at most clients × budget).
    #[arg(long, value_parser = parse_bytes)]
    pub client_budget: Option<u64>,
    /// How often a client captures a short graph and replays it, as a weight
    /// against the other operations' (they sum to 100); 0 never captures.
    #[arg(long, default_value_t = Mix::default().capture)]
    pub capture_weight: u32,
    /// How often a client takes a `DeviceParamStore` training step (of a
    /// small store of its own, checked against the f64 reference), as a
    /// weight like --capture-weight; 0 (the default) never does.
    #[arg(long, default_value_t = Mix::default().store)]
    pub store_weight: u32,
    /// Inject faults seeded by SEED: launches trap at --trap-rate, and one
    /// reservation and one transfer fail.
    #[arg(long, value_name = "SEED")]
    pub faults: Option<u64>,
    /// The probability that a launch traps, with --faults.
    #[arg(long, default_value_t = 0.002, requires = "faults")]
    pub trap_rate: f64,
    /// Write a compact error report (code, id, message, device, generation,
    /// time) for every error seen to FILE.
    #[arg(long, value_name = "FILE")]
    pub telemetry: Option<PathBuf>,
    /// The telemetry file's encoding.
    #[arg(long, value_enum, default_value = "jsonl", requires = "telemetry")]
    pub telemetry_format: TelemetryFormat,
    /// Include each error's backtrace frames in the telemetry (about 10 KB a report).
    #[arg(long, requires = "telemetry")]
    pub telemetry_backtraces: bool,
    /// Draw reserved and in-use bytes over time, with poisons and recoveries, to FILE.svg.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Print JSON lines (events, then one summary line) instead of a table; no progress bar.
    #[arg(long)]
    pub json: bool,
    /// Seconds a call may go unanswered before its reply counts as lost.
    #[arg(long, default_value_t = 10.0)]
    pub reply_timeout: f64,
    /// Milliseconds between memory samples (for the plot and the peak).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub sample_ms: u64,
}

impl StressArgs {
    /// The run these arguments ask for; the error says which argument is wrong.
    pub fn config(&self) -> Result<StressConfig, String> {
        if self.limit == 0 {
            return Err("--limit must be positive".into());
        }
        if self.ops == Some(0) {
            return Err("--ops must be positive".into());
        }
        if let Some(seconds) = self.seconds.filter(|s| !(s.is_finite() && *s > 0.0)) {
            return Err(format!(
                "--seconds must be a positive number, not {seconds}"
            ));
        }
        if !(0.0..=1.0).contains(&self.trap_rate) {
            return Err(format!(
                "--trap-rate must be a probability in [0, 1], not {}",
                self.trap_rate
            ));
        }
        if !(self.reply_timeout.is_finite() && self.reply_timeout > 0.0) {
            return Err(format!(
                "--reply-timeout must be a positive number of seconds, not {}",
                self.reply_timeout
            ));
        }
        let sizes = match self.sizes {
            SizeKind::Training => Sizes::Training,
            SizeKind::Churn => Sizes::Churn,
            SizeKind::Growth => Sizes::Growth,
            SizeKind::LogUniform => {
                let max = self.max_size.unwrap_or(1 << 20);
                if self.min_size == 0 || self.min_size > max {
                    return Err(format!(
                        "--min-size ({}) must be positive and at most --max-size ({max})",
                        self.min_size
                    ));
                }
                Sizes::LogUniform {
                    min: self.min_size,
                    max,
                }
            }
        };
        if self.client_budget == Some(0) {
            return Err("--client-budget must be positive".into());
        }
        if self.max_size == Some(0) {
            return Err("--max-size must be positive".into());
        }
        let seconds = match (self.ops, self.seconds) {
            (None, None) => Some(10.0),
            (_, seconds) => seconds,
        };
        Ok(StressConfig {
            device: self.device,
            clients: self.clients as usize,
            limit: self.limit,
            ops: self.ops,
            seconds,
            seed: self.seed,
            workload: WorkloadConfig {
                sizes,
                max_size: self.max_size,
                mix: Mix {
                    capture: self.capture_weight,
                    store: self.store_weight,
                    ..Mix::default()
                },
                client_budget: self.client_budget,
            },
            faults: self.faults.map(|seed| FaultSettings {
                seed,
                trap_rate: self.trap_rate,
            }),
            reply_timeout: Duration::from_secs_f64(self.reply_timeout),
            sample_interval: Duration::from_millis(self.sample_ms),
            telemetry: self
                .telemetry
                .clone()
                .map(|path| (path, self.telemetry_format)),
            telemetry_backtraces: self.telemetry_backtraces,
            progress: !self.json,
        })
    }
}

/// Parses `cpu:0`, `wgpu:1`, `cuda:0` (a bare kind means ordinal 0).
pub fn parse_device(text: &str) -> Result<Device, String> {
    let (kind, ordinal) = text.split_once(':').unwrap_or((text, "0"));
    let ordinal: usize = ordinal
        .parse()
        .map_err(|_| format!("`{text}`: the ordinal after `:` must be a number"))?;
    match kind {
        "cpu" => Ok(Device::Cpu(ordinal)),
        "wgpu" => Ok(Device::Wgpu(ordinal)),
        "cuda" => Ok(Device::Cuda(ordinal)),
        _ => Err(format!(
            "`{text}`: the device kind must be cpu, wgpu or cuda"
        )),
    }
}

/// `cistern stress`: runs, prints the table (or JSON lines), draws the
/// plot, and fails unless the device held.
pub fn run_command(args: &StressArgs) -> Result<(), String> {
    let config = args.config()?;
    let json = args.json;
    if json {
        print_line(&json!({
            "event": "start",
            "device": config.device.to_string(),
            "clients": config.clients,
            "limit": config.limit,
            "ops": config.ops,
            "seconds": config.seconds,
            "seed": config.seed,
            "sizes": format!("{:?}", config.workload.sizes),
            "faults": config.faults.map(|f| f.seed),
            "trap_rate": config.faults.map(|f| f.trap_rate),
            "store_weight": config.workload.mix.store,
        }));
    }
    let title = format!(
        "cistern stress: {} clients, limit {}, {}",
        config.clients,
        super::units::format_bytes(config.limit),
        match config.faults {
            Some(f) => format!("faults seed {} (trap rate {})", f.seed, f.trap_rate),
            None => "no faults".to_string(),
        }
    );
    let outcome = run(config, |event| {
        if json {
            print_line(&event_json(event));
        }
    })?;
    if let Some(path) = &args.plot {
        super::plot::draw(
            path,
            &title,
            &outcome.samples,
            &outcome.events,
            outcome.summary.limit,
        )?;
    }
    report(&outcome, json)?;
    if outcome.held() {
        Ok(())
    } else {
        let s = &outcome.summary;
        Err(format!(
            "the device did not hold: {} corrupted reads, {} store mismatches, {} lost replies, \
             {} unexpected errors, {} clients stopped",
            s.corrupted_reads,
            s.store_mismatches,
            s.lost_replies,
            s.unexpected_errors,
            s.fatal_errors
        ))
    }
}

fn report(outcome: &StressOutcome, json: bool) -> Result<(), String> {
    if json {
        for problem in &outcome.problems {
            print_line(&json!({"event": "problem", "message": problem}));
        }
        let line = serde_json::to_string(&outcome.summary)
            .map_err(|e| format!("cannot encode the summary: {e}"))?;
        println!("{line}");
    } else {
        print!("{}", outcome.summary.table());
        for problem in &outcome.problems {
            eprintln!("cistern stress: {problem}");
        }
    }
    Ok(())
}

fn event_json(event: &ContextEvent) -> serde_json::Value {
    let kind = match event.kind {
        ContextEventKind::Poison => "poison",
        ContextEventKind::Recovery => "recovery",
    };
    json!({"event": kind, "seconds": event.seconds, "generation": event.generation})
}

fn print_line(value: &serde_json::Value) {
    println!("{value}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_with_or_without_an_ordinal() {
        assert_eq!(parse_device("cpu:0"), Ok(Device::Cpu(0)));
        assert_eq!(parse_device("cuda"), Ok(Device::Cuda(0)));
        assert_eq!(parse_device("wgpu:2"), Ok(Device::Wgpu(2)));
        assert!(parse_device("tpu:0").is_err());
        assert!(parse_device("cpu:x").is_err());
    }
}
