//! The end of a stress run: its figures as one JSON line, or as a table
//! for people.

use cistern_runtime::MemoryStats;
use serde::{Deserialize, Serialize};

use super::counters::{Counters, EventLog};
use super::monitor::Sample;
use super::run::StressConfig;
use super::units::format_bytes;

/// A stress run's figures. Serialized as the `--json` summary line; the
/// first fields are the stable ones scripts read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Always `"summary"`.
    pub event: String,
    /// Workload operations run.
    pub ops: u64,
    /// Out-of-memory answers handled.
    pub ooms: u64,
    /// `reclaim` calls made to handle them.
    pub reclaims: u64,
    /// Distinct context generations poisoned.
    pub poisons: u64,
    /// Distinct generations reached by recovering from a poison.
    pub recoveries: u64,
    /// The most bytes of pages the device held, over the run.
    pub peak_reserved: u64,
    /// The device's memory limit.
    pub limit: u64,
    /// The most bytes of live allocations' slices, over the run: the
    /// demand the limit had to meet.
    pub peak_in_use: u64,
    /// Reads that did not return what was written: must be 0.
    pub corrupted_reads: u64,
    /// Parameter store steps that disagreed with the reference (or a latched
    /// store that answered): must be 0.
    pub store_mismatches: u64,
    /// Replies not received within the bound: must be 0.
    pub lost_replies: u64,
    /// Client threads.
    pub clients: usize,
    /// Seconds the run took.
    pub seconds: f64,
    /// Operations per second.
    pub ops_per_s: f64,
    /// Operations skipped (no buffer held to operate on).
    pub skipped_ops: u64,
    /// Successful reservations.
    pub reservations: u64,
    /// Bytes written, read, filled and copied.
    pub bytes_moved: u64,
    /// Bytes read back whose content was known and checked.
    pub verified_bytes: u64,
    /// Errors seen, of every kind.
    pub errors: u64,
    /// Buffers dropped to make room.
    pub released_buffers: u64,
    /// Retries after a release, a failed transfer or a failed submission.
    pub retries: u64,
    /// Reservations given up after backing off.
    pub backoffs: u64,
    /// Too-big reservations split in two.
    pub splits: u64,
    /// Retries after a transient refusal.
    pub busy_retries: u64,
    /// Poisoned answers seen (every client sees each poison).
    pub poison_errors: u64,
    /// Stale handles refused (then dropped).
    pub stale_refusals: u64,
    /// Graphs captured.
    pub captures: u64,
    /// Replays of captured graphs.
    pub replays: u64,
    /// Replays whose effects were read back and matched.
    pub replays_verified: u64,
    /// Transient `CaptureInProgress` answers (another client was capturing).
    pub capture_refusals: u64,
    /// Captures aborted: a capture reservation did not fit the warmed pools.
    pub forbidden_reservations: u64,
    /// Errors the tool did not expect: must be 0.
    pub unexpected_errors: u64,
    /// Clients stopped by a lost device: must be 0.
    pub fatal_errors: u64,
    /// Parameter store training steps run.
    pub store_steps: u64,
    /// Store steps the reference confirmed.
    pub store_verified: u64,
    /// AMP store steps skipped for non-finite gradients.
    pub store_amp_skips: u64,
    /// Store steps refused without latching; the store read back unchanged.
    pub store_declined: u64,
    /// Queued store steps put back after a transient refusal.
    pub store_put_back: u64,
    /// Store steps after which the store was latched and refused every call.
    pub store_refused: u64,
    /// Stores an invalidate made stale: they refused to read, and were rebuilt.
    pub store_stale: u64,
    /// Parameter stores built.
    pub store_builds: u64,
    /// Latched, stale or mismatched stores rebuilt.
    pub store_rebuilds: u64,
    /// Bytes in use once every client had dropped everything (0: back at
    /// the baseline); `None` if a client was left behind.
    pub final_in_use: Option<u64>,
    /// Bytes of pages held then, after a reclaim; `None` as above.
    pub final_reserved: Option<u64>,
    /// Reports written to the telemetry file, if one was asked for.
    pub telemetry_reports: Option<u64>,
}

impl Summary {
    /// The summary of a run from its counters, events, samples and the
    /// device's stats at the end.
    pub fn new(
        config: &StressConfig,
        counters: &Counters,
        events: &EventLog,
        seconds: f64,
        samples: &[Sample],
        final_stats: Option<&MemoryStats>,
        telemetry_reports: Option<u64>,
    ) -> Self {
        let get = Counters::get;
        let ops = get(&counters.ops);
        let peak_reserved = samples
            .iter()
            .map(|s| s.peak_reserved_bytes.max(s.reserved_bytes))
            .chain(final_stats.map(|stats| stats.peak_reserved_bytes))
            .max()
            .unwrap_or(0);
        let peak_in_use = samples
            .iter()
            .map(|s| s.in_use_bytes)
            .chain(final_stats.map(|stats| stats.peak_in_use_bytes))
            .max()
            .unwrap_or(0);
        Summary {
            event: "summary".into(),
            ops,
            ooms: get(&counters.ooms),
            reclaims: get(&counters.reclaims),
            poisons: events.poisons(),
            recoveries: events.recoveries(),
            peak_reserved,
            limit: config.limit,
            peak_in_use,
            corrupted_reads: get(&counters.corrupted_reads),
            store_mismatches: get(&counters.store_mismatches),
            lost_replies: get(&counters.lost_replies),
            clients: config.clients,
            seconds,
            ops_per_s: if seconds > 0.0 {
                ops as f64 / seconds
            } else {
                0.0
            },
            skipped_ops: get(&counters.skipped_ops),
            reservations: get(&counters.reservations),
            bytes_moved: get(&counters.bytes_written)
                + get(&counters.bytes_read)
                + get(&counters.bytes_on_device),
            verified_bytes: get(&counters.verified_bytes),
            errors: get(&counters.errors),
            released_buffers: get(&counters.released_buffers),
            retries: get(&counters.retries),
            backoffs: get(&counters.backoffs),
            splits: get(&counters.splits),
            busy_retries: get(&counters.busy_retries),
            poison_errors: get(&counters.poison_errors),
            stale_refusals: get(&counters.stale_refusals),
            captures: get(&counters.captures),
            replays: get(&counters.replays),
            replays_verified: get(&counters.replays_verified),
            capture_refusals: get(&counters.capture_refusals),
            forbidden_reservations: get(&counters.forbidden_reservations),
            unexpected_errors: get(&counters.unexpected_errors),
            fatal_errors: get(&counters.fatal_errors),
            store_steps: get(&counters.store_steps),
            store_verified: get(&counters.store_verified),
            store_amp_skips: get(&counters.store_amp_skips),
            store_declined: get(&counters.store_declined),
            store_put_back: get(&counters.store_put_back),
            store_refused: get(&counters.store_refused),
            store_stale: get(&counters.store_stale),
            store_builds: get(&counters.store_builds),
            store_rebuilds: get(&counters.store_rebuilds),
            final_in_use: final_stats.map(|stats| stats.in_use_bytes),
            final_reserved: final_stats.map(|stats| stats.reserved_bytes),
            telemetry_reports,
        }
    }

    /// The summary as a table for people, one figure a line.
    pub fn table(&self) -> String {
        let peak_share = if self.limit > 0 {
            100.0 * self.peak_reserved as f64 / self.limit as f64
        } else {
            0.0
        };
        let must_be_zero = |n: u64| {
            if n == 0 {
                "0".to_string()
            } else {
                format!("{n}  <-- must be 0")
            }
        };
        let rows: Vec<(&str, String)> = vec![
            ("clients", self.clients.to_string()),
            ("seconds", format!("{:.2}", self.seconds)),
            ("operations", self.ops.to_string()),
            ("operations / s", format!("{:.0}", self.ops_per_s)),
            ("skipped (nothing held)", self.skipped_ops.to_string()),
            ("reservations", self.reservations.to_string()),
            ("bytes moved", format_bytes(self.bytes_moved)),
            ("bytes verified", format_bytes(self.verified_bytes)),
            ("errors seen", self.errors.to_string()),
            ("out of memory", self.ooms.to_string()),
            ("  buffers released", self.released_buffers.to_string()),
            ("  reclaims", self.reclaims.to_string()),
            ("  backed off", self.backoffs.to_string()),
            ("too big, split", self.splits.to_string()),
            ("retries", self.retries.to_string()),
            ("busy retries", self.busy_retries.to_string()),
            ("poisons", self.poisons.to_string()),
            ("  poisoned answers", self.poison_errors.to_string()),
            ("recoveries", self.recoveries.to_string()),
            ("stale handles refused", self.stale_refusals.to_string()),
            ("graphs captured", self.captures.to_string()),
            ("  replays", self.replays.to_string()),
            ("  replays verified", self.replays_verified.to_string()),
            ("  refused: capturing", self.capture_refusals.to_string()),
            (
                "  reservation forbidden",
                self.forbidden_reservations.to_string(),
            ),
            (
                "peak reserved / limit",
                format!(
                    "{} / {} ({peak_share:.0}%)",
                    format_bytes(self.peak_reserved),
                    format_bytes(self.limit)
                ),
            ),
            ("store steps", self.store_steps.to_string()),
            ("  verified", self.store_verified.to_string()),
            ("  AMP skips", self.store_amp_skips.to_string()),
            ("  declined, unchanged", self.store_declined.to_string()),
            ("  put back (transient)", self.store_put_back.to_string()),
            ("  latched, refused all", self.store_refused.to_string()),
            ("  stale, refused", self.store_stale.to_string()),
            (
                "  stores built / rebuilt",
                format!("{} / {}", self.store_builds, self.store_rebuilds),
            ),
            ("peak in use", format_bytes(self.peak_in_use)),
            (
                "in use / reserved at end",
                match (self.final_in_use, self.final_reserved) {
                    (Some(in_use), Some(reserved)) => {
                        format!("{} / {}", format_bytes(in_use), format_bytes(reserved))
                    }
                    _ => "unknown (a client was left behind)".to_string(),
                },
            ),
            ("corrupted reads", must_be_zero(self.corrupted_reads)),
            ("store mismatches", must_be_zero(self.store_mismatches)),
            ("lost replies", must_be_zero(self.lost_replies)),
            ("unexpected errors", must_be_zero(self.unexpected_errors)),
            ("clients stopped", must_be_zero(self.fatal_errors)),
        ];
        let width = rows.iter().map(|(label, _)| label.len()).max().unwrap_or(0);
        let mut table = String::new();
        for (label, value) in rows {
            table.push_str(&format!("{label:<width$}  {value}\n"));
        }
        if let Some(reports) = self.telemetry_reports {
            table.push_str(&format!("{:<width$}  {reports}\n", "telemetry reports"));
        }
        table
    }
}
