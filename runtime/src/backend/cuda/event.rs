//! Events on CUDA: a driver event recorded on the recording stream, and a
//! host-side flag saying the record was queued, so a waiting stream never
//! waits on an event before it is recorded (a driver wait on an unrecorded
//! event would pass at once).

use cudarc::driver::sys::CUevent;

use super::ffi;
use crate::sync::{Condvar, Mutex};

/// Fires once, with the driver event recorded (or none, when dropped unrun).
#[derive(Debug, Default)]
pub(super) struct CudaEvent {
    /// `None` until fired; then the recorded event's handle, if any.
    fired: Mutex<Option<Option<usize>>>,
    changed: Condvar,
}

impl CudaEvent {
    /// Blocks until the record was queued (or dropped); the driver event.
    pub(super) fn recorded(&self) -> Option<CUevent> {
        let mut fired = self.fired.lock();
        loop {
            if let Some(event) = *fired {
                return event.map(|handle| handle as CUevent);
            }
            self.changed.wait(&mut fired);
        }
    }

    pub(super) fn fire(&self, event: Option<CUevent>) {
        let mut fired = self.fired.lock();
        if fired.is_none() {
            *fired = Some(event.map(|handle| handle as usize));
        }
        self.changed.notify_all();
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        if let Some(Some(handle)) = *self.fired.lock() {
            // A reset context already destroyed it: the error is expected.
            let _ = ffi::event_destroy(handle as CUevent);
        }
    }
}

/// The recording side: fires its event when the stream reaches it, and
/// also when dropped unrun, so no stream hangs on a stream that ended.
#[derive(Debug)]
pub(super) struct EventSignal(pub(super) std::sync::Arc<CudaEvent>);

impl Drop for EventSignal {
    fn drop(&mut self) {
        self.0.fire(None);
    }
}
