//! `cistern stress`: many clients, a tight memory limit and injected faults
//! against one device, every byte read verified, every error handled the
//! way it says, with telemetry and a plot of memory over time.
//!
//! The workload generator ([`workload`]) and the pattern verifier
//! ([`pattern`]) are library code, so a deterministic simulation over
//! `ServerCore` can drive the same mix.

mod args;
pub mod capture_plan;
mod counters;
mod handling;
mod monitor;
pub mod pattern;
mod plot;
pub mod recording;
mod run;
mod summary;
mod telemetry;
pub mod units;
mod worker;
pub mod workload;

pub use args::{SizeKind, StressArgs, parse_device, run_command};
pub use counters::{ContextEvent, ContextEventKind};
pub use handling::{Handling, handling};
pub use monitor::Sample;
pub use plot::draw as draw_plot;
pub use run::{FaultSettings, StressConfig, StressOutcome, run};
pub use summary::Summary;
pub use telemetry::{TelemetryFormat, TelemetryWriter, write_report};
