//! The checks every store call makes first, and the poison latch.
//!
//! Order: the store's own poison (the latch, then its queued work's
//! failures) → the device's published state → the generation of the
//! store's memory. A device-level failure latches the store; the transient
//! states (retiring, capturing) never do.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cistern_runtime::{ContextState, Health, ServerError};

use super::store::DeviceParamStore;
use super::work::Effect;
use crate::compute::ComputeClient;
use crate::error::BackendError;

/// The device's published state as an error, if work cannot run now:
/// poisoned and unrecoverable answer the context's own error (one round
/// trip, on that path only); retiring and capturing their transient ones;
/// a generation other than `generation` (when given) is stale.
pub(super) fn check_device(
    client: &ComputeClient,
    generation: Option<u64>,
) -> Result<(), BackendError> {
    let state = client.device_state();
    let ordinal = client.device().ordinal();
    match state.health {
        Health::Active => {}
        Health::Retiring => return Err(BackendError::DeviceContextRetiring { ordinal }),
        Health::Capturing => return Err(BackendError::DeviceContextCaptureInProgress { ordinal }),
        Health::Poisoned | Health::Unrecoverable => {
            let error = match client.context_state() {
                Ok(ContextState::Poisoned { poison, .. }) => ServerError::ContextPoisoned(poison),
                Ok(ContextState::Unrecoverable { probe_error, .. }) => {
                    ServerError::ContextUnrecoverable {
                        ordinal,
                        probe_error,
                    }
                }
                // The state moved on since it was published: check again.
                Ok(_) => return check_device_once_more(client, generation),
                Err(error) => error,
            };
            return Err(BackendError::from(error));
        }
    }
    match generation {
        Some(generation) if generation != state.generation => {
            Err(BackendError::StaleDeviceGeneration {
                ordinal,
                resource_generation: generation,
                current_generation: state.generation,
            })
        }
        _ => Ok(()),
    }
}

/// The generation check alone, after a state that moved on while read.
fn check_device_once_more(
    client: &ComputeClient,
    generation: Option<u64>,
) -> Result<(), BackendError> {
    let state = client.device_state();
    match (state.health, generation) {
        (Health::Active, Some(generation)) if generation != state.generation => {
            Err(BackendError::StaleDeviceGeneration {
                ordinal: client.device().ordinal(),
                resource_generation: generation,
                current_generation: state.generation,
            })
        }
        (Health::Active, _) => Ok(()),
        _ => Err(BackendError::DeviceContextRetiring {
            ordinal: client.device().ordinal(),
        }),
    }
}

/// The pauses between retries of a call refused by a transient state
/// (another client's capture, a recovery): 1 ms doubling to 20 ms, for up
/// to 2 s in all.
pub(super) struct Backoff {
    deadline: Instant,
    pause: Duration,
}

impl Backoff {
    /// A backoff whose 2 s start now.
    pub(super) fn new() -> Backoff {
        Backoff {
            deadline: Instant::now() + Duration::from_secs(2),
            pause: Duration::from_millis(1),
        }
    }

    /// Sleeps the next pause and answers true while time is left; false
    /// (without sleeping) once it has run out.
    pub(super) fn wait(&mut self) -> bool {
        if Instant::now() >= self.deadline {
            return false;
        }
        std::thread::sleep(self.pause);
        self.pause = (self.pause * 2).min(Duration::from_millis(20));
        true
    }
}

/// Whether `error` means the device may have half-applied the store's
/// work: those latch it. Refusals that changed nothing (caller errors,
/// allocation failures, transfer failures, a stale generation, the
/// transient states) do not.
pub(super) fn latches(error: &BackendError) -> bool {
    matches!(
        error,
        BackendError::DeviceContextPoisoned(_)
            | BackendError::DeviceContextUnrecoverable { .. }
            | BackendError::KernelLaunchFailed(_)
            | BackendError::KernelCompileFailed { .. }
            | BackendError::InvalidProgram(_)
            | BackendError::ServerPanicked { .. }
            | BackendError::ServerGone { .. }
            | BackendError::Unknown(_)
    )
}

impl DeviceParamStore {
    /// The entry checks of a `&self` call.
    pub(super) fn enter(&self) -> Result<(), BackendError> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(BackendError::StorePoisoned);
        }
        self.check_work()?;
        self.check_device_state()
    }

    /// The entry checks of a `&mut self` call: as [`enter`](Self::enter),
    /// after forgetting the queued work that succeeded and putting back
    /// the state from before a step the device refused as transient.
    pub(super) fn enter_mut(&mut self) -> Result<(), BackendError> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(BackendError::StorePoisoned);
        }
        self.settle()?;
        self.check_device_state()
    }

    fn check_device_state(&self) -> Result<(), BackendError> {
        check_device(&self.client, Some(self.params.generation())).map_err(|error| self.fail(error))
    }

    /// The first failure of the store's queued work: transient ones are
    /// returned as they are, any other latches the store.
    /// Whether the store's queued work was refused by a transient state:
    /// it changed nothing and is put back on the next `&mut self` call.
    pub(super) fn work_refused_transiently(&self) -> bool {
        self.work
            .first_failure()
            .map(BackendError::from)
            .is_some_and(|error| error.is_transient())
    }

    pub(super) fn check_work(&self) -> Result<(), BackendError> {
        match self.work.first_failure().map(BackendError::from) {
            None => Ok(()),
            Some(error) if error.is_transient() => Err(error),
            Some(error) => Err(self.latch(error)),
        }
    }

    /// Forgets settled work; puts back what a transiently refused step or
    /// staging copy consumed (and answers its error once); latches on any
    /// other failure.
    fn settle(&mut self) -> Result<(), BackendError> {
        let mut transient = None;
        let mut index = 0;
        while index < self.work.items.len() {
            match self.work.items[index].token.check() {
                None => index += 1,
                Some(Ok(())) => {
                    self.work.items.remove(index);
                }
                Some(Err(error)) => {
                    let error = BackendError::from(error);
                    if !error.is_transient() {
                        return Err(self.latch(error));
                    }
                    let item = self.work.items.remove(index);
                    self.put_back(item.work);
                    transient.get_or_insert(error);
                }
            }
        }
        transient.map_or(Ok(()), Err)
    }

    pub(super) fn put_back(&mut self, work: Effect) {
        match work {
            Effect::Staging { serial } => {
                if self
                    .staged
                    .as_ref()
                    .is_some_and(|staged| staged.serial == serial)
                {
                    self.staged = None;
                }
            }
            Effect::Step(restore) => self.restore(*restore),
            Effect::ChainStep {
                restore,
                loss_serial,
            } => {
                self.restore(*restore);
                self.loss_serial = loss_serial;
                // The recorded step may hold the refused launches' state.
                self.chain = None;
            }
        }
    }

    fn restore(&mut self, restore: super::work::Restore) {
        self.pending = restore.pending;
        self.staged = restore.staged;
        self.optimizer = restore.optimizer;
    }

    /// `error`, latching the store first when it is device-level.
    pub(super) fn fail(&self, error: BackendError) -> BackendError {
        if latches(&error) {
            self.latch(error)
        } else {
            error
        }
    }

    /// Latches the store: the call that latches it gets `error`, every
    /// other (concurrent or later) call `StorePoisoned`.
    pub(super) fn latch(&self, error: BackendError) -> BackendError {
        if self.poisoned.swap(true, Ordering::AcqRel) {
            BackendError::StorePoisoned
        } else {
            error
        }
    }

    /// The answer of a `&self` call that waited on the device with
    /// `waited`: its own failure (latched when device-level), else the first
    /// failure of the store's queued work, else the value.
    pub(super) fn after_wait<T>(&self, waited: Result<T, ServerError>) -> Result<T, BackendError> {
        let value = waited.map_err(|error| self.fail(BackendError::from(error)))?;
        self.check_work()?;
        if self.poisoned.load(Ordering::Acquire) {
            return Err(BackendError::StorePoisoned);
        }
        Ok(value)
    }
}
