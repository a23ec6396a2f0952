//! What a client does about each error: release memory and retry, retry
//! shortly, recover a poisoned context, drop stale handles, or stop.

use std::time::{Duration, Instant};

use cistern_client::ErrorCode;
use cistern_runtime::{ContextState, ServerError};

use super::{BUSY_PATIENCE, Next, RELEASE_ATTEMPTS, RETRY_ATTEMPTS, Stopped, Worker};
use crate::stress::counters::Counters;
use crate::stress::handling::{Handling, handling};

impl Worker<'_> {
    /// Handles `error`, met on the `attempt`th try of an operation on
    /// buffer `keep` (which a release must not drop).
    pub(super) fn handle(
        &mut self,
        error: &ServerError,
        attempt: u32,
        keep: Option<u64>,
    ) -> Result<Next, Stopped> {
        self.record(error);
        if matches!(error, ServerError::CaptureInProgress { .. }) {
            Counters::bump(&self.shared.counters.capture_refusals);
        }
        self.act(handling(error), error.code(), attempt, keep, error)
    }

    /// Does what `handling` asks for an error of `code` (shown as `error`),
    /// met on the `attempt`th try of an operation on buffer `keep`.
    pub(super) fn act(
        &mut self,
        handling: Handling,
        code: ErrorCode,
        attempt: u32,
        keep: Option<u64>,
        error: &dyn std::fmt::Display,
    ) -> Result<Next, Stopped> {
        let counters = &self.shared.counters;
        Ok(match handling {
            Handling::Release => {
                Counters::bump(&counters.ooms);
                if attempt + 1 >= RELEASE_ATTEMPTS {
                    Counters::bump(&counters.backoffs);
                    return Ok(Next::Done);
                }
                self.release(attempt, keep)?;
                Counters::bump(&counters.retries);
                Next::Retry
            }
            Handling::Retry => {
                // A failed submission is retried once, a failed transfer a few times.
                let attempts = if code == ErrorCode::DispatchFailed {
                    2
                } else {
                    RETRY_ATTEMPTS
                };
                if attempt + 1 >= attempts {
                    return Ok(Next::Done);
                }
                Counters::bump(&counters.retries);
                Next::Retry
            }
            Handling::RetryShortly => {
                Counters::bump(&counters.busy_retries);
                let pause = Duration::from_micros(50 << attempt.min(7));
                if pause * attempt > BUSY_PATIENCE {
                    return Ok(Next::Done);
                }
                std::thread::sleep(pause);
                Next::Retry
            }
            Handling::Recover { generation } => {
                Counters::bump(&counters.poison_errors);
                // A poison of a generation already left behind (a launch
                // token read late) needs nothing more.
                if generation >= self.generation {
                    self.recover(generation)?;
                }
                Next::Done
            }
            Handling::DropStale { current } => {
                Counters::bump(&counters.stale_refusals);
                self.drop_older_than(current);
                Next::Done
            }
            // The store's own code rebuilds it once it sees it latched.
            Handling::Split | Handling::Rebuild => Next::Done,
            Handling::AbortCapture => {
                Counters::bump(&counters.forbidden_reservations);
                Next::Done
            }
            Handling::Stop => {
                Counters::bump(&counters.fatal_errors);
                self.shared
                    .problem(format!("client {} stopped: {error}", self.index));
                return Err(Stopped);
            }
            Handling::Unexpected => {
                Counters::bump(&counters.unexpected_errors);
                self.shared
                    .problem(format!("client {}: unexpected error: {error}", self.index));
                Next::Done
            }
        })
    }

    /// Makes room after an out-of-memory: the first attempts drop half of
    /// this client's buffers (then reclaim too), a later one drops them all;
    /// past that, back off and let the other clients finish.
    fn release(&mut self, attempt: u32, keep: Option<u64>) -> Result<(), Stopped> {
        let counters = &self.shared.counters;
        match attempt {
            0 | 1 => {
                let droppable = self.held.iter().filter(|h| Some(h.uid) != keep).count();
                let mut drop_count = droppable.div_ceil(2);
                while drop_count > 0 {
                    let index = self.rng.below(self.held.len() as u64) as usize;
                    if Some(self.held[index].uid) != keep {
                        self.held.swap_remove(index);
                        Counters::bump(&counters.released_buffers);
                        drop_count -= 1;
                    }
                }
                if attempt == 1 {
                    self.reclaim()?;
                }
            }
            2 => {
                let before = self.held.len();
                self.held.retain(|held| Some(held.uid) == keep);
                Counters::add(
                    &counters.released_buffers,
                    (before - self.held.len()) as u64,
                );
                self.reclaim()?;
            }
            _ => {
                let jitter = self.rng.below(1000);
                std::thread::sleep(Duration::from_micros(
                    (500 << (attempt - 3).min(4)) + jitter,
                ));
            }
        }
        Ok(())
    }

    fn reclaim(&mut self) -> Result<(), Stopped> {
        Counters::bump(&self.shared.counters.reclaims);
        match self.call(|client| client.reclaim()) {
            Ok(_) => Ok(()),
            Err(error) => {
                // Only the context's own state can refuse a reclaim; handle
                // it, but do not retry the reclaim itself.
                self.handle(&error, RELEASE_ATTEMPTS, None)?;
                Ok(())
            }
        }
    }

    /// The context is poisoned in `seen`: every handle of that generation is
    /// dropped first (none may be used again), then `invalidate(seen)` until
    /// the context is active in a later generation.
    fn recover(&mut self, seen: u64) -> Result<(), Stopped> {
        let counters = &self.shared.counters;
        self.shared.events.poisoned(seen);
        self.drop_older_than(seen + 1);
        let started = Instant::now();
        let mut seen = seen;
        loop {
            match self.call(|client| client.invalidate(seen)) {
                Ok(ContextState::Active { generation }) if generation > seen => {
                    self.shared.events.recovered(generation);
                    self.generation = generation;
                    return Ok(());
                }
                Ok(ContextState::Poisoned { generation, .. }) if generation > seen => {
                    // Recovered, and poisoned again since: retire that one too.
                    self.shared.events.recovered(generation);
                    self.shared.events.poisoned(generation);
                    self.drop_older_than(generation + 1);
                    seen = generation;
                }
                Ok(ContextState::Unrecoverable { probe_error, .. }) => {
                    Counters::bump(&counters.fatal_errors);
                    self.shared.problem(format!(
                        "client {}: the device is unrecoverable: {probe_error}",
                        self.index
                    ));
                    return Err(Stopped);
                }
                Ok(state) => {
                    // Retiring (or an answer that names no newer generation):
                    // ask again shortly.
                    if started.elapsed() > BUSY_PATIENCE * 10 {
                        Counters::bump(&counters.fatal_errors);
                        self.shared.problem(format!(
                            "client {}: recovery from generation {seen} did not end; last state {state:?}",
                            self.index
                        ));
                        return Err(Stopped);
                    }
                    std::thread::sleep(Duration::from_micros(200));
                }
                Err(error) => {
                    self.record(&error);
                    match handling(&error) {
                        Handling::RetryShortly => std::thread::sleep(Duration::from_micros(200)),
                        Handling::Recover { generation } if generation > seen => {
                            self.drop_older_than(generation + 1);
                            seen = generation;
                        }
                        _ => {
                            Counters::bump(&counters.fatal_errors);
                            self.shared.problem(format!(
                                "client {}: invalidate failed: {error}",
                                self.index
                            ));
                            return Err(Stopped);
                        }
                    }
                }
            }
        }
    }
}
