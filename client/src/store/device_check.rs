//! The device's published state as the store's answer (`check_device`),
//! and the retry pacing for its transient states (`Backoff`).

use std::time::{Duration, Instant};

use cistern_runtime::{ContextState, Health, ServerError};

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

/// `call`, retried while it is refused by a transient state (another
/// client's capture, a recovery) with [`Backoff`]'s pauses: its answer, or
/// the transient refusal once 2 s have passed.
pub(super) fn retry_transient<T>(
    mut call: impl FnMut() -> Result<T, BackendError>,
) -> Result<T, BackendError> {
    let mut backoff = Backoff::new();
    loop {
        match call() {
            Err(error) if error.is_transient() && backoff.wait() => {}
            answer => return answer,
        }
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
