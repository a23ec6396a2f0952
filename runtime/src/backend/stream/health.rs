//! `DeviceHealth`: the sticky fault state every executor of one device shares.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use cistern_memory::{BackTrace, DevicePoison};

use super::fault::KernelFault;
use crate::sync::Mutex;

/// Whether a device is faulted, and with what; the generation later faults
/// are labelled with.
#[derive(Debug)]
pub struct DeviceHealth {
    ordinal: usize,
    generation: AtomicU64,
    faulted: AtomicBool,
    fault: Mutex<Option<DevicePoison>>,
}

impl DeviceHealth {
    /// A healthy device `ordinal` in generation 0.
    pub fn new(ordinal: usize) -> Self {
        DeviceHealth {
            ordinal,
            generation: AtomicU64::new(0),
            faulted: AtomicBool::new(false),
            fault: Mutex::new(None),
        }
    }

    /// Whether a sticky fault is marked.
    pub fn is_faulted(&self) -> bool {
        self.faulted.load(Ordering::Acquire)
    }

    /// The poison later work is refused with, once faulted.
    pub fn poison(&self) -> Option<DevicePoison> {
        if self.is_faulted() {
            self.fault.lock().clone()
        } else {
            None
        }
    }

    /// Clears the sticky fault for a recovered context in `generation`.
    /// Call only once every stream is idle (the server's drain).
    pub fn reset(&self, generation: u64) {
        let mut fault = self.fault.lock();
        *fault = None;
        self.generation.store(generation, Ordering::Relaxed);
        self.faulted.store(false, Ordering::Release);
    }

    /// Marks the device faulted; the first poison is kept.
    pub(super) fn mark_faulted(&self, poison: DevicePoison) {
        let mut fault = self.fault.lock();
        if fault.is_none() {
            *fault = Some(poison);
        }
        self.faulted.store(true, Ordering::Release);
    }

    /// The poison of `fault` met in `operation`, in the current generation.
    pub(super) fn poison_for(&self, operation: &str, fault: &KernelFault) -> DevicePoison {
        DevicePoison {
            ordinal: self.ordinal,
            generation: self.generation.load(Ordering::Relaxed),
            operation: operation.to_string(),
            status: fault.to_string(),
            backtrace: BackTrace::capture(),
        }
    }
}
