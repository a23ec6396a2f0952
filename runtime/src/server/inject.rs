//! Where the server carries out a [`FaultPlan`](crate::fault::FaultPlan): each hook
//! tests one `Option` when no plan is installed, and the injector's own work
//! stays out of line, off the hot path.

use cistern_memory::IoError;

use super::core::ServerCore;
use crate::backend::{Backend, ResolvedLaunch, StreamWork};
use crate::error::ServerError;
use crate::fault::FaultInjector;
use crate::kernel::Kernel;

impl<B: Backend> ServerCore<B> {
    /// A reservation that passed its checks: `OutOfMemory` if the plan says so.
    #[inline]
    pub(super) fn inject_reservation_fault(&mut self, size: u64) -> Result<(), ServerError> {
        match &mut self.faults {
            None => Ok(()),
            Some(faults) => reservation_fault(faults, size),
        }
    }

    /// A transfer that passed its checks: `TransferFailed` if the plan says so.
    #[inline]
    pub(super) fn inject_transfer_fault(&mut self) -> Result<(), ServerError> {
        match &mut self.faults {
            None => Ok(()),
            Some(faults) => transfer_fault(faults),
        }
    }

    /// A launch batch: `CaptureInProgress` if the plan says it is refused
    /// as a racing capture would refuse it.
    #[inline]
    pub(super) fn inject_busy_batch(&mut self) -> Result<(), ServerError> {
        self.busy_if(FaultInjector::batch_busy)
    }

    /// A single launch: `CaptureInProgress` if the plan says it is
    /// refused as a racing capture would refuse it.
    #[inline]
    pub(super) fn inject_busy_launch(&mut self) -> Result<(), ServerError> {
        self.busy_if(FaultInjector::single_busy)
    }

    /// A graph replay: `CaptureInProgress` if the plan says it is refused
    /// as a racing capture would refuse it.
    #[inline]
    pub(super) fn inject_busy_replay(&mut self) -> Result<(), ServerError> {
        self.busy_if(FaultInjector::replay_busy)
    }

    /// `CaptureInProgress` where the plan's `counts` says this one is busy.
    fn busy_if(&mut self, counts: fn(&mut FaultInjector) -> bool) -> Result<(), ServerError> {
        match self.faults.as_mut().is_some_and(|faults| counts(faults)) {
            true => Err(ServerError::CaptureInProgress {
                ordinal: self.ordinal,
            }),
            false => Ok(()),
        }
    }

    /// Accepted launch work: each launch the plan says traps is replaced
    /// by the `Trap` kernel, so the device faults for real.
    #[inline]
    pub(super) fn inject_launch_faults(&mut self, work: &mut StreamWork) {
        if let Some(faults) = &mut self.faults {
            trap_launches(faults, work);
        }
    }
}

#[inline(never)]
fn reservation_fault(faults: &mut FaultInjector, size: u64) -> Result<(), ServerError> {
    if faults.reservation_fails() {
        Err(ServerError::Io(IoError::out_of_memory(size)))
    } else {
        Ok(())
    }
}

#[inline(never)]
fn transfer_fault(faults: &mut FaultInjector) -> Result<(), ServerError> {
    if faults.transfer_fails() {
        Err(ServerError::TransferFailed {
            message: "injected transfer failure".to_string(),
        })
    } else {
        Ok(())
    }
}

#[inline(never)]
fn trap_launches(faults: &mut FaultInjector, work: &mut StreamWork) {
    match work {
        StreamWork::Launch { launch, .. } if faults.launch_traps() => *launch = trap(),
        StreamWork::Batch { launches, .. } => {
            // Every launch counts; the list (a graph's, shared) is copied
            // only when one of them traps.
            let trapped: Vec<usize> = (0..launches.len())
                .filter(|_| faults.launch_traps())
                .collect();
            if !trapped.is_empty() {
                let list = launches.make_mut();
                for index in trapped {
                    list[index] = trap();
                }
            }
        }
        _ => {}
    }
}

/// The `Trap` kernel's launch.
pub(super) fn trap() -> ResolvedLaunch {
    ResolvedLaunch {
        kernel: Kernel::Trap,
        bindings: Vec::new(),
    }
}
