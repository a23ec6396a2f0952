//! Events on the CPU: a flag and a condition variable.

use std::sync::Arc;

use crate::sync::{Condvar, Mutex};

/// Fires once; waiters block until it has.
#[derive(Debug, Default)]
pub(super) struct CpuEvent {
    fired: Mutex<bool>,
    changed: Condvar,
}

impl CpuEvent {
    /// Blocks until the event has fired.
    pub(super) fn wait(&self) {
        let mut fired = self.fired.lock();
        while !*fired {
            self.changed.wait(&mut fired);
        }
    }

    fn fire(&self) {
        *self.fired.lock() = true;
        self.changed.notify_all();
    }
}

/// The recording side of an event: fires it when the stream reaches it,
/// and also when dropped unrun, so a waiting stream can never hang on a
/// stream that ended.
#[derive(Debug)]
pub(super) struct EventSignal(pub(super) Arc<CpuEvent>);

impl Drop for EventSignal {
    fn drop(&mut self) {
        self.0.fire();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_signal_releases_its_waiters() {
        let event = Arc::new(CpuEvent::default());
        let signal = EventSignal(event.clone());
        let waiter = std::thread::spawn(move || event.wait());
        drop(signal);
        assert!(waiter.join().is_ok());
    }
}
