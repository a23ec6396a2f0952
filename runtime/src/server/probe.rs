//! The recovery probe: proves a retired context computes again, end to end.
//!
//! A 256-byte allocation; a pattern written host → device (the first half
//! distinct values, the second half different ones); the identity kernel
//! copying the first half onto the second; a read device → host; a compare.
//! All three are queued at once on the default stream and the server polls
//! the read's answer, so it never waits on the executor.

use cistern_memory::{AllocationId, AllocationPolicy};

use super::core::ServerCore;
use super::inject::trap;
use crate::backend::{Backend, ResolvedLaunch, StreamWork};
use crate::error::ServerError;
use crate::failure::{FailureToken, PendingToken};
use crate::fault::ProbeFault;
use crate::ids::DEFAULT_STREAM;
use crate::kernel::{Access, Kernel};
use crate::sync::{Answer, TryRecvError, reply_channel};

/// The probe's allocation, in bytes.
pub(super) const PROBE_BYTES: u64 = 256;

/// Probe attempts before an operation-local failure is final.
pub(super) const PROBE_ATTEMPTS: u32 = 3;

/// One probe attempt, queued.
#[derive(Debug)]
pub(super) struct Probe {
    /// Counting from 1.
    pub(super) attempt: u32,
    allocation: AllocationId,
    token: FailureToken,
    read: Answer<Vec<u8>>,
    expected: Vec<u8>,
}

/// Where a probe attempt stands.
pub(super) enum ProbeStatus {
    Pending,
    Passed,
    Failed(ProbeFailure),
}

/// Why a probe attempt failed, and whether another attempt may pass.
#[derive(Debug)]
pub(super) struct ProbeFailure {
    /// Operation-local (a transfer, an allocation): worth another attempt.
    /// Otherwise (a sticky fault, a mismatch, a lost executor) it is final.
    pub(super) local: bool,
    pub(super) message: String,
}

impl ProbeFailure {
    fn of(step: &str, error: &ServerError) -> Self {
        let fatal = error.is_device_poisoned()
            || matches!(
                error,
                ServerError::ServerPanicked { .. }
                    | ServerError::ServerGone { .. }
                    | ServerError::ContextUnrecoverable { .. }
            );
        ProbeFailure {
            local: !fatal,
            message: format!("the probe's {step} failed: {error}"),
        }
    }
}

impl<B: Backend> ServerCore<B> {
    /// Queues probe attempt `attempt` with an allocation of `generation`.
    pub(super) fn start_probe(
        &mut self,
        attempt: u32,
        generation: u64,
    ) -> Result<Probe, ProbeFailure> {
        let fault = self
            .faults
            .as_mut()
            .and_then(|faults| faults.next_probe_fault());
        if fault == Some(ProbeFault::OperationLocal) {
            return Err(ProbeFailure {
                local: true,
                message: "the probe's host-to-device transfer failed (injected)".to_string(),
            });
        }
        let allocation = self
            .memory
            .reserve(
                PROBE_BYTES,
                AllocationPolicy::Allow,
                generation,
                DEFAULT_STREAM,
            )
            .map_err(|error| ProbeFailure::of("allocation", &error.into()))?;
        let queued = self.queue_probe(attempt, allocation, fault);
        if queued.is_err() {
            let _ = self.memory.free(allocation);
        }
        queued
    }

    fn queue_probe(
        &mut self,
        attempt: u32,
        allocation: AllocationId,
        fault: Option<ProbeFault>,
    ) -> Result<Probe, ProbeFailure> {
        let half = PROBE_BYTES / 2;
        let locate = |core: &mut Self, offset, size| {
            core.slice(allocation, offset, size)
                .map_err(|error| ProbeFailure::of("allocation", &error))
        };
        let whole = locate(self, 0, PROBE_BYTES)?;
        let source = locate(self, 0, half)?;
        let target = locate(self, half, half)?;
        let data = pattern(attempt);
        let mut expected = data[..half as usize].to_vec();
        expected.extend_from_within(..);

        let write = StreamWork::Write {
            target: whole,
            data: data.into(),
        };
        self.submit(DEFAULT_STREAM, write, &[(allocation, Access::Write)])
            .map_err(|error| ProbeFailure::of("host-to-device transfer", &error))?;

        let launch = match fault {
            Some(ProbeFault::Sticky) => trap(),
            // The wrong kernel, run for real: the read-back mismatches.
            Some(ProbeFault::Mismatch) => ResolvedLaunch {
                kernel: Kernel::map(cistern_kernels::MapOp::Fill, &[0.0]),
                bindings: vec![target],
            },
            _ => ResolvedLaunch {
                kernel: Kernel::Identity,
                bindings: vec![source, target],
            },
        };
        let token = FailureToken::new();
        let work = StreamWork::Launch {
            launch,
            token: Some(PendingToken::new(token.clone(), self.ordinal)),
        };
        self.submit(DEFAULT_STREAM, work, &[(allocation, Access::Write)])
            .map_err(|error| ProbeFailure::of("kernel", &error))?;

        let (reply, read) = reply_channel();
        let work = StreamWork::Read {
            source: whole,
            reply,
        };
        self.submit(DEFAULT_STREAM, work, &[(allocation, Access::Read)])
            .map_err(|error| ProbeFailure::of("device-to-host transfer", &error))?;
        self.backend.flush();
        Ok(Probe {
            attempt,
            allocation,
            token,
            read,
            expected,
        })
    }

    /// Looks at the probe's read without waiting.
    pub(super) fn poll_probe(&self, probe: &Probe) -> ProbeStatus {
        // The kernel ran before the read in stream order: its own error,
        // when it has one, says more than the read's.
        let kernel_failure = || match probe.token.check() {
            Some(Err(error)) => Some(ProbeFailure::of("kernel", &error)),
            _ => None,
        };
        match probe.read.try_recv() {
            Err(TryRecvError::Empty) => ProbeStatus::Pending,
            Err(TryRecvError::Disconnected) => ProbeStatus::Failed(ProbeFailure {
                local: false,
                message: "the probe's read was dropped unanswered: its executor ended".to_string(),
            }),
            Ok(Err(error)) => ProbeStatus::Failed(
                kernel_failure()
                    .unwrap_or_else(|| ProbeFailure::of("device-to-host transfer", &error)),
            ),
            Ok(Ok(bytes)) => {
                if let Some(failure) = kernel_failure() {
                    return ProbeStatus::Failed(failure);
                }
                if bytes == probe.expected {
                    return ProbeStatus::Passed;
                }
                let wrong = if bytes.len() == probe.expected.len() {
                    bytes
                        .iter()
                        .zip(&probe.expected)
                        .filter(|(a, b)| a != b)
                        .count()
                } else {
                    bytes.len().max(probe.expected.len())
                };
                ProbeStatus::Failed(ProbeFailure {
                    local: false,
                    message: format!(
                        "the probe read back {wrong} of {PROBE_BYTES} bytes wrong (attempt {})",
                        probe.attempt
                    ),
                })
            }
        }
    }

    /// Frees a probe's allocation (reused once its stream is past it).
    pub(super) fn release_probe(&mut self, probe: &Probe) {
        let _ = self.memory.free(probe.allocation);
    }
}

/// The bytes the probe writes: `f32`s whose first half differs from its
/// second, so a kernel that did not run is seen.
fn pattern(attempt: u32) -> Vec<u8> {
    let count = (PROBE_BYTES / 4) as usize;
    (0..count)
        .map(|i| {
            if i < count / 2 {
                1.0 + i as f32 * 0.25 + attempt as f32
            } else {
                -1.0 - i as f32
            }
        })
        .flat_map(f32::to_ne_bytes)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pattern_fills_the_allocation_and_its_halves_differ() {
        let bytes = pattern(1);
        assert_eq!(bytes.len() as u64, PROBE_BYTES);
        let half = bytes.len() / 2;
        assert_ne!(bytes[..half], bytes[half..]);
    }

    #[test]
    fn a_poisoned_or_lost_device_fails_the_probe_for_good_and_a_transfer_does_not() {
        let transfer = ServerError::TransferFailed {
            message: "bus".into(),
        };
        assert!(ProbeFailure::of("read", &transfer).local);
        let gone = ServerError::ServerGone { ordinal: 0 };
        assert!(!ProbeFailure::of("read", &gone).local);
    }
}
