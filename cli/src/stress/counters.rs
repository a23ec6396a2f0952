//! What a stress run counts, shared by its client threads, and the
//! poison / recovery events it saw.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use cistern_runtime::sync::Mutex;
use serde::{Deserialize, Serialize};

/// Counters every client thread adds to; read once the run ends.
#[derive(Debug, Default)]
pub struct Counters {
    /// Workload operations run.
    pub ops: AtomicU64,
    /// Workload operations skipped: a buffer operation drawn while the
    /// client held no buffer (or a copy needing two).
    pub skipped_ops: AtomicU64,
    /// Successful reservations.
    pub reservations: AtomicU64,
    /// Bytes written from the host.
    pub bytes_written: AtomicU64,
    /// Bytes read back to the host.
    pub bytes_read: AtomicU64,
    /// Bytes filled or copied on the device.
    pub bytes_on_device: AtomicU64,
    /// Bytes read back whose content was known and checked.
    pub verified_bytes: AtomicU64,
    /// Errors seen, of every kind.
    pub errors: AtomicU64,
    /// Out-of-memory answers (including exhausted page sizes).
    pub ooms: AtomicU64,
    /// Buffers a client dropped to make room after an out-of-memory.
    pub released_buffers: AtomicU64,
    /// `reclaim` calls after an out-of-memory.
    pub reclaims: AtomicU64,
    /// Retries of an operation after a release, a transfer failure or a
    /// failed submission.
    pub retries: AtomicU64,
    /// Reservations given up after releasing and backing off did not make room.
    pub backoffs: AtomicU64,
    /// Reservations split in two because they could never fit.
    pub splits: AtomicU64,
    /// Retries after a transient refusal (context retiring or capturing).
    pub busy_retries: AtomicU64,
    /// Poisoned answers seen (several per poison: every client sees it).
    pub poison_errors: AtomicU64,
    /// Stale handles refused by the server (then dropped, never used again).
    pub stale_refusals: AtomicU64,
    /// Graphs captured (ended into a graph).
    pub captures: AtomicU64,
    /// Replays of captured graphs accepted for sending.
    pub replays: AtomicU64,
    /// Replays whose effects were read back afterwards and matched the model.
    pub replays_verified: AtomicU64,
    /// `CaptureInProgress` answers (another client was capturing): transient.
    pub capture_refusals: AtomicU64,
    /// Captures aborted because a capture reservation did not fit the pages held.
    pub forbidden_reservations: AtomicU64,
    /// Parameter stores built (a client's first, and one per family change).
    pub store_builds: AtomicU64,
    /// Parameter stores rebuilt from their last good values after a latch,
    /// a stale generation or a mismatch.
    pub store_rebuilds: AtomicU64,
    /// Parameter store training steps run.
    pub store_steps: AtomicU64,
    /// Store steps after which the store read back the reference's values.
    pub store_verified: AtomicU64,
    /// AMP steps skipped on the device for non-finite gradients, as the reference.
    pub store_amp_skips: AtomicU64,
    /// Store steps refused without latching (out of memory, a failed
    /// transfer, a busy context): the store read back unchanged.
    pub store_declined: AtomicU64,
    /// Queued store steps the device refused as transient, which the store
    /// put back (and the reference with it).
    pub store_put_back: AtomicU64,
    /// Store steps after which the store was latched and refused every call.
    pub store_refused: AtomicU64,
    /// Stores whose memory an invalidate took (built in an older
    /// generation): they refused to read, and were rebuilt.
    pub store_stale: AtomicU64,
    /// Store steps that read back other values than the reference's, or a
    /// latched store that answered a call: must be 0.
    pub store_mismatches: AtomicU64,
    /// Reads that did not return what was written: must be 0.
    pub corrupted_reads: AtomicU64,
    /// Replies not received within the bound: must be 0.
    pub lost_replies: AtomicU64,
    /// Errors the tool does not expect under this load (a wrong argument,
    /// an unknown handle): must be 0.
    pub unexpected_errors: AtomicU64,
    /// Errors that ended a client (device lost, server gone): must be 0.
    pub fatal_errors: AtomicU64,
}

impl Counters {
    /// Adds `n` to `counter`.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Adds one to `counter`.
    pub fn bump(counter: &AtomicU64) {
        Counters::add(counter, 1);
    }

    /// The value of `counter`.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// A context event on the run's clock.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ContextEvent {
    /// Seconds since the run started.
    pub seconds: f64,
    pub kind: ContextEventKind,
    /// The generation poisoned, or the generation recovery reached.
    pub generation: u64,
}

/// Which context event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ContextEventKind {
    /// A client first saw the context poisoned in this generation.
    Poison,
    /// A client first saw the context active in this generation after a poison.
    Recovery,
}

/// The poisons and recoveries of a run, each generation once however many
/// clients saw it.
#[derive(Debug)]
pub struct EventLog {
    start: Instant,
    inner: Mutex<EventLogInner>,
}

#[derive(Debug, Default)]
struct EventLogInner {
    poisoned: BTreeSet<u64>,
    recovered: BTreeSet<u64>,
    events: Vec<ContextEvent>,
}

impl EventLog {
    /// An empty log whose clock starts at `start`.
    pub fn new(start: Instant) -> Self {
        EventLog {
            start,
            inner: Mutex::new(EventLogInner::default()),
        }
    }

    /// Seconds since the run started.
    pub fn seconds(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// The context was seen poisoned in `generation`.
    pub fn poisoned(&self, generation: u64) {
        let seconds = self.seconds();
        let mut inner = self.inner.lock();
        if inner.poisoned.insert(generation) {
            inner.events.push(ContextEvent {
                seconds,
                kind: ContextEventKind::Poison,
                generation,
            });
        }
    }

    /// The context was seen active in `generation` after a recovery.
    pub fn recovered(&self, generation: u64) {
        let seconds = self.seconds();
        let mut inner = self.inner.lock();
        if inner.recovered.insert(generation) {
            inner.events.push(ContextEvent {
                seconds,
                kind: ContextEventKind::Recovery,
                generation,
            });
        }
    }

    /// Distinct generations poisoned.
    pub fn poisons(&self) -> u64 {
        self.inner.lock().poisoned.len() as u64
    }

    /// Distinct generations reached by recovery.
    pub fn recoveries(&self) -> u64 {
        self.inner.lock().recovered.len() as u64
    }

    /// The events from index `from` on, in the order they were seen.
    pub fn events_since(&self, from: usize) -> Vec<ContextEvent> {
        self.inner.lock().events.get(from..).unwrap_or(&[]).to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generation_is_logged_once_however_many_clients_see_it() {
        let log = EventLog::new(Instant::now());
        log.poisoned(0);
        log.poisoned(0);
        log.recovered(1);
        log.recovered(1);
        log.poisoned(1);
        assert_eq!(log.poisons(), 2);
        assert_eq!(log.recoveries(), 1);
        let kinds: Vec<_> = log.events_since(0).iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [
                ContextEventKind::Poison,
                ContextEventKind::Recovery,
                ContextEventKind::Poison
            ]
        );
        assert_eq!(log.events_since(2).len(), 1);
        assert!(log.events_since(9).is_empty());
    }
}
