//! `cistern stress`: many clients, a tight memory limit and injected faults
//! against one device, every byte read verified, every error handled the
//! way it says, with telemetry and a plot of memory over time.
//!
//! Private to the binary: `args` parses the command line into a run,
//! `workload` draws each client's seeded mix, `worker` runs it against its
//! own stream (and its own `DeviceParamStore`, checked against the f64
//! reference), `pattern` and `recording` model what every buffer must hold,
//! and `telemetry`, `monitor`, `plot` and `summary` report how it went.

mod args;
mod capture_plan;
mod counters;
mod handling;
mod monitor;
mod pattern;
mod plot;
mod recording;
mod run;
mod summary;
mod telemetry;
mod units;
mod worker;
mod workload;

pub use args::{StressArgs, run_command};
pub use telemetry::TelemetryFormat;
pub use telemetry::write_report;
