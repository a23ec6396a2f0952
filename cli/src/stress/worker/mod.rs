//! One stress client: runs its workload against a shared device
//! ([`ops`]: every byte read is verified; [`store`]: every parameter store
//! step is checked against the reference), and handles every error the way
//! the error says ([`errors`]).

mod capture;
mod errors;
mod ops;
mod store;

use std::time::Duration;

use cistern_client::{BackendError, Buffer, ComputeClient};
use cistern_runtime::{FailureToken, ServerError, StreamId};

use super::counters::Counters;
use super::pattern::Expected;
use super::run::RunShared;
use super::workload::{Op, Workload};
use cistern_memory::SplitMix64;

/// Attempts of a reservation after an out-of-memory: release, release
/// harder, then back off.
const RELEASE_ATTEMPTS: u32 = 6;
/// Attempts of a transfer or submission that failed without harm.
const RETRY_ATTEMPTS: u32 = 3;
/// How long a client keeps retrying a transient refusal before giving up the operation.
const BUSY_PATIENCE: Duration = Duration::from_secs(2);
/// The deepest a too-big reservation is split (2⁴ pieces).
const MAX_SPLIT_DEPTH: u32 = 4;

/// Why a client stopped early: the device is gone for this process.
#[derive(Debug)]
pub(crate) struct Stopped;

/// What to do after an error was handled.
enum Next {
    /// Try the same call again.
    Retry,
    /// Give the operation up (its buffers may be gone).
    Done,
}

/// A buffer the client holds, with what it should contain.
struct Held {
    uid: u64,
    buffer: Buffer,
    expected: Expected,
}

impl Held {
    fn generation(&self) -> u64 {
        self.buffer.reference().generation
    }
}

/// A launch (or a replay) whose outcome the client has not looked at yet.
struct PendingLaunch {
    token: FailureToken,
    /// `(buffer, offset, len)` ranges whose modelled content assumes the
    /// launch ran: what it writes, and what copies took from that since.
    writes: Vec<(u64, u64, u64)>,
}

/// One client thread's state.
pub(crate) struct Worker<'a> {
    index: usize,
    shared: &'a RunShared,
    client: ComputeClient,
    stream: StreamId,
    held: Vec<Held>,
    pending: Vec<PendingLaunch>,
    workload: Workload,
    rng: SplitMix64,
    next_uid: u64,
    serial: u64,
    generation: u64,
    /// The client's parameter store and its reference, from its first store step.
    store: Option<store::StoreRun>,
}

impl<'a> Worker<'a> {
    /// Client `index` of `shared`'s run, on a stream of its own.
    pub(crate) fn new(
        index: usize,
        shared: &'a RunShared,
        client: ComputeClient,
        stream: StreamId,
    ) -> Self {
        let seed = shared.config.seed;
        Worker {
            index,
            shared,
            workload: Workload::new(seed, index as u64, shared.config.workload),
            rng: SplitMix64::derived(seed ^ 0xC1E7, index as u64),
            client,
            stream,
            held: Vec::new(),
            pending: Vec::new(),
            next_uid: (index as u64) << 40,
            serial: 0,
            generation: 0,
            store: None,
        }
    }

    /// Runs `ops` operations (or until the run stops), then settles and
    /// drops everything it holds.
    pub(crate) fn run(mut self, ops: Option<u64>) -> Result<(), Stopped> {
        let mut done = 0u64;
        let result = loop {
            if self.shared.should_stop() || ops.is_some_and(|ops| done >= ops) {
                break Ok(());
            }
            let op = self.workload.next().unwrap_or(Op::Free {
                target: super::workload::Pick(0),
            });
            done += 1;
            if let Err(stopped) = self.execute(op) {
                break Err(stopped);
            }
        };
        let finished = match result {
            Ok(()) => self.finish(),
            Err(stopped) => Err(stopped),
        };
        self.store = None;
        self.held.clear();
        finished
    }

    fn execute(&mut self, op: Op) -> Result<(), Stopped> {
        let counters = &self.shared.counters;
        let ran = match op {
            Op::Reserve { size } => {
                self.reserve(size, 0)?;
                true
            }
            Op::Write { target, span } => match target.index(self.held.len()) {
                Some(index) => {
                    self.write(index, span)?;
                    true
                }
                None => false,
            },
            Op::Fill { target, span } => match target.index(self.held.len()) {
                Some(index) => {
                    self.fill(index, span)?;
                    true
                }
                None => false,
            },
            Op::Copy {
                source,
                target,
                len,
                source_start,
                target_start,
                via,
            } => match (source.index(self.held.len()), target.index(self.held.len())) {
                (Some(from), Some(to)) if from != to => {
                    self.copy(from, to, (len, source_start, target_start), via)?;
                    true
                }
                _ => false,
            },
            Op::Read { target, span } => match target.index(self.held.len()) {
                Some(index) => {
                    self.read(index, span)?;
                    true
                }
                None => false,
            },
            Op::Free { target } => match target.index(self.held.len()) {
                Some(index) => {
                    self.held.swap_remove(index);
                    true
                }
                None => false,
            },
            Op::Capture { plan } => self.capture(plan)?,
            Op::StoreStep { seed } => {
                self.store_step(seed)?;
                true
            }
        };
        Counters::bump(if ran {
            &counters.ops
        } else {
            &counters.skipped_ops
        });
        Ok(())
    }

    /// Drops every buffer made before `generation`. Their launches stay
    /// pending: the recovery's drain settles them, and one never settled
    /// is a lost reply.
    fn drop_older_than(&mut self, generation: u64) {
        self.held.retain(|held| held.generation() >= generation);
        self.generation = self.generation.max(generation);
    }

    fn find(&mut self, uid: u64) -> Option<&mut Held> {
        self.held.iter_mut().find(|held| held.uid == uid)
    }

    /// Calls the device under the watchdog: a call that outlives the reply
    /// bound is counted lost by the run.
    fn call<T>(
        &self,
        f: impl FnOnce(&ComputeClient) -> Result<T, ServerError>,
    ) -> Result<T, ServerError> {
        self.watched(|| f(&self.client))
    }

    /// Runs `f` (calls to the device through the store or a tape) under the watchdog.
    fn watched<T>(&self, f: impl FnOnce() -> T) -> T {
        let watch = &self.shared.watches[self.index];
        watch.begin(self.shared.elapsed());
        let result = f();
        watch.end();
        result
    }

    /// Counts `error` and sends it to the telemetry file.
    fn record(&self, error: &ServerError) {
        Counters::bump(&self.shared.counters.errors);
        self.shared.telemetry(error.clone(), self.generation);
    }

    /// Counts a parameter store's `error` and sends it to the telemetry file.
    fn record_store(&self, error: &BackendError) {
        Counters::bump(&self.shared.counters.errors);
        self.shared.telemetry(error.clone(), self.generation);
    }
}
