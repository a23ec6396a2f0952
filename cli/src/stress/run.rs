//! A stress run: opens the device, starts the clients and the memory
//! monitor, watches every call for a lost reply, and gathers the outcome.

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cistern_client::{CompactReport, ComputeClient, ReportedError};
use cistern_runtime::sync::{Mutex, RecvTimeoutError, unbounded};
use cistern_runtime::{Device, DeviceOptions, FaultPlan};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::counters::{ContextEvent, Counters, EventLog};
use super::monitor::{Monitor, Sample};
use super::summary::Summary;
use super::telemetry::{TelemetryFormat, TelemetryWriter};
use super::worker::Worker;
use super::workload::WorkloadConfig;
use cistern_memory::rng::mix;

/// Everything a stress run needs to know: a plain value, built by the CLI.
#[derive(Clone, Debug)]
pub struct StressConfig {
    /// The device under test.
    pub device: Device,
    /// Client threads.
    pub clients: usize,
    /// The device's memory limit in bytes.
    pub limit: u64,
    /// Operations in all (split evenly over the clients), if bounded.
    pub ops: Option<u64>,
    /// Seconds to run, if bounded.
    pub seconds: Option<f64>,
    /// The workload seed.
    pub seed: u64,
    /// Sizes and mix of the workload.
    pub workload: WorkloadConfig,
    /// Faults to inject, if any.
    pub faults: Option<FaultSettings>,
    /// A call not answered within this bound counts as a lost reply.
    pub reply_timeout: Duration,
    /// How often the monitor samples the memory stats.
    pub sample_interval: Duration,
    /// Where to write an `ErrorReport` per error, and how.
    pub telemetry: Option<(std::path::PathBuf, TelemetryFormat)>,
    /// Whether telemetry reports carry backtrace frames.
    pub telemetry_backtraces: bool,
    /// Whether to show a progress bar (on stderr, only if it is a terminal).
    pub progress: bool,
}

/// The faults `--faults SEED` injects.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FaultSettings {
    /// Seeds the trap draws and picks which reservation and transfer fail.
    pub seed: u64,
    /// The probability that each accepted launch traps.
    pub trap_rate: f64,
}

impl FaultSettings {
    /// The runtime's plan: launches trap at the rate, and one reservation
    /// and one transfer among the first hundred (picked by the seed) fail.
    pub fn plan(&self) -> FaultPlan {
        FaultPlan::none()
            .with_trap_rate(self.seed, self.trap_rate)
            .with_failed_reservation(1 + mix(self.seed ^ 1) % 100)
            .with_failed_transfer(1 + mix(self.seed ^ 2) % 100)
    }
}

/// What a run found.
#[derive(Debug)]
pub struct StressOutcome {
    /// The counters and figures.
    pub summary: Summary,
    /// The memory samples, for the plot.
    pub samples: Vec<Sample>,
    /// Poisons and recoveries.
    pub events: Vec<ContextEvent>,
    /// What went wrong, one line each (corruptions, lost replies, stopped
    /// clients, unexpected errors); capped.
    pub problems: Vec<String>,
}

impl StressOutcome {
    /// Whether the device held: no corrupted read, no store step that
    /// disagreed with the reference, no lost reply, no client stopped by a
    /// lost device, no unexpected error.
    pub fn held(&self) -> bool {
        let s = &self.summary;
        s.corrupted_reads == 0
            && s.store_mismatches == 0
            && s.lost_replies == 0
            && s.fatal_errors == 0
            && s.unexpected_errors == 0
    }
}

/// The most problem lines a run keeps.
const MAX_PROBLEMS: usize = 32;

/// When a client's current call began, for the watchdog.
#[derive(Debug, Default)]
pub(crate) struct Watch {
    /// Nanoseconds since the run started, plus one; 0 while no call is out.
    started: AtomicU64,
    /// Calls begun: tells one long call from two short ones.
    calls: AtomicU64,
}

impl Watch {
    pub(crate) fn begin(&self, since_start: Duration) {
        self.calls.fetch_add(1, Ordering::AcqRel);
        let nanos = u64::try_from(since_start.as_nanos()).unwrap_or(u64::MAX - 1);
        self.started.store(nanos + 1, Ordering::Release);
    }

    pub(crate) fn end(&self) {
        self.started.store(0, Ordering::Release);
    }
}

/// What the clients of a run share.
pub(crate) struct RunShared {
    pub(crate) config: StressConfig,
    pub(crate) counters: Counters,
    pub(crate) events: EventLog,
    pub(crate) watches: Vec<Watch>,
    start: Instant,
    deadline: Option<Instant>,
    stop: AtomicBool,
    telemetry: Mutex<Option<TelemetryWriter>>,
    problems: Mutex<Vec<String>>,
}

impl RunShared {
    /// Whether clients should stop taking new operations.
    pub(crate) fn should_stop(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// Time since the run started.
    pub(crate) fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Sends a report of `error` to the telemetry file, if there is one.
    pub(crate) fn telemetry(&self, error: impl Into<ReportedError>, generation: u64) {
        if self.config.telemetry.is_none() {
            return;
        }
        let mut report = CompactReport::new(
            error,
            Some(self.config.device.ordinal()),
            None,
            self.config.telemetry_backtraces,
        );
        report.generation = report.generation.or(Some(generation));
        if let Some(writer) = self.telemetry.lock().as_ref() {
            writer.send(report);
        }
    }

    /// Notes a corrupted read.
    pub(crate) fn corruption(&self, line: String) {
        self.problem(format!("corrupted read: {line}"));
    }

    /// Notes a lost reply.
    pub(crate) fn lost(&self, line: String) {
        self.problem(format!("lost reply: {line}"));
    }

    /// Notes anything else that went wrong.
    pub(crate) fn problem(&self, line: String) {
        let mut problems = self.problems.lock();
        if problems.len() < MAX_PROBLEMS {
            problems.push(line);
        }
    }
}

/// Runs the stress test `config` describes. `on_event` sees each poison
/// and recovery as the run notices it (the CLI prints them as JSON lines).
/// The error is a setup failure (the device cannot be opened, the
/// telemetry file cannot be created); what the device did wrong under load
/// is in the outcome.
pub fn run(
    config: StressConfig,
    mut on_event: impl FnMut(&ContextEvent),
) -> Result<StressOutcome, String> {
    if config.clients == 0 {
        return Err("--clients must be at least 1".into());
    }
    let options = DeviceOptions {
        memory_limit: Some(config.limit),
        faults: config.faults.map_or_else(FaultPlan::none, |f| f.plan()),
        ..DeviceOptions::default()
    };
    let client = ComputeClient::open(config.device, options)
        .map_err(|e| format!("cannot open {}: {e}", config.device))?;
    let streams = (0..config.clients)
        .map(|_| client.create_stream())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("cannot create the clients' streams: {e}"))?;
    let telemetry = match &config.telemetry {
        Some((path, format)) => Some(TelemetryWriter::create(path, *format)?),
        None => None,
    };
    let start = Instant::now();
    let shared = Arc::new(RunShared {
        deadline: config.seconds.map(|s| start + Duration::from_secs_f64(s)),
        watches: (0..config.clients).map(|_| Watch::default()).collect(),
        counters: Counters::default(),
        events: EventLog::new(start),
        start,
        stop: AtomicBool::new(false),
        telemetry: Mutex::new(telemetry),
        problems: Mutex::new(Vec::new()),
        config,
    });
    let config = &shared.config;
    let monitor = Monitor::start(client.clone(), start, config.sample_interval)?;
    let (done, finished) = unbounded::<usize>();
    for (index, stream) in streams.into_iter().enumerate() {
        let shared = shared.clone();
        let client = client.clone();
        let done = done.clone();
        let ops = config.ops.map(|ops| {
            let clients = config.clients as u64;
            ops / clients + u64::from((index as u64) < ops % clients)
        });
        std::thread::Builder::new()
            .name(format!("cistern-stress-{index}"))
            .spawn(move || {
                // A stopped client has said why in the shared problems.
                let _ = Worker::new(index, &shared, client, stream).run(ops);
                let _ = done.send(index);
            })
            .map_err(|e| format!("cannot start client thread {index}: {e}"))?;
    }
    drop(done);

    let progress = progress_bar(config);
    let mut watchdog = Watchdog::new(config.clients);
    let mut running = config.clients;
    let mut printed = 0;
    let mut stopped_at: Option<Instant> = None;
    while running > 0 {
        match finished.recv_timeout(Duration::from_millis(50)) {
            Ok(_) => running -= 1,
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        watchdog.check(&shared);
        for event in shared.events.events_since(printed) {
            on_event(&event);
            printed += 1;
        }
        update_progress(&progress, &shared);
        if shared.should_stop() {
            let since = *stopped_at.get_or_insert_with(Instant::now);
            // Clients finish their current operation and sync; one that
            // cannot within twice the reply bound is stuck on a lost reply
            // (the watchdog has counted it): leave it behind.
            if since.elapsed() > config.reply_timeout * 2 + Duration::from_secs(1) {
                shared.problem(format!("{running} clients did not finish; left behind"));
                break;
            }
        }
    }
    progress.finish_and_clear();
    shared.stop.store(true, Ordering::Relaxed);
    let seconds = shared.elapsed().as_secs_f64();
    let samples = monitor.stop(config.reply_timeout);
    for event in shared.events.events_since(printed) {
        on_event(&event);
    }
    let final_stats = if running == 0 {
        // Every client has dropped everything: what is left shows whether
        // memory came back to the baseline.
        let _ = client.reclaim();
        client.memory_stats().ok()
    } else {
        None
    };
    drop(client);
    let writer = shared.telemetry.lock().take();
    let reports = writer.map(TelemetryWriter::finish).transpose()?;
    Ok(StressOutcome {
        summary: Summary::new(
            config,
            &shared.counters,
            &shared.events,
            seconds,
            &samples,
            final_stats.as_ref(),
            reports,
        ),
        events: shared.events.events_since(0),
        problems: shared.problems.lock().clone(),
        samples,
    })
}

/// Counts a lost reply for every call out longer than the bound, once per call.
struct Watchdog {
    flagged: Vec<u64>,
}

impl Watchdog {
    fn new(clients: usize) -> Self {
        Watchdog {
            flagged: vec![0; clients],
        }
    }

    fn check(&mut self, shared: &RunShared) {
        let now = shared.elapsed();
        for (index, watch) in shared.watches.iter().enumerate() {
            let call = watch.calls.load(Ordering::Acquire);
            let started = watch.started.load(Ordering::Acquire);
            if started == 0
                || call != watch.calls.load(Ordering::Acquire)
                || self.flagged[index] == call
            {
                continue;
            }
            let out_for = now.saturating_sub(Duration::from_nanos(started - 1));
            if out_for > shared.config.reply_timeout {
                self.flagged[index] = call;
                Counters::bump(&shared.counters.lost_replies);
                shared.lost(format!(
                    "client {index}: no reply after {:.1} s",
                    out_for.as_secs_f64()
                ));
            }
        }
    }
}

fn progress_bar(config: &StressConfig) -> ProgressBar {
    if !config.progress || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let (len, template) = match (config.ops, config.seconds) {
        (Some(ops), _) => (ops, "{spinner} {bar:30} {pos}/{len} ops  {msg}"),
        (None, Some(seconds)) => (
            (seconds * 1000.0) as u64,
            "{spinner} {bar:30} {elapsed}  {msg}",
        ),
        (None, None) => (0, "{spinner} {elapsed}  {msg}"),
    };
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar
}

fn update_progress(bar: &ProgressBar, shared: &RunShared) {
    if bar.is_hidden() {
        return;
    }
    let counters = &shared.counters;
    let ops = Counters::get(&counters.ops) + Counters::get(&counters.skipped_ops);
    match shared.config.ops {
        Some(_) => bar.set_position(ops),
        None => bar.set_position(shared.elapsed().as_millis() as u64),
    }
    bar.set_message(format!(
        "{} ops  {} OOMs  {} poisons  {} recoveries  {} corrupted  {} lost",
        ops,
        Counters::get(&counters.ooms),
        shared.events.poisons(),
        shared.events.recoveries(),
        Counters::get(&counters.corrupted_reads),
        Counters::get(&counters.lost_replies),
    ));
}
