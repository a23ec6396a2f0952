//! Host events: a flag and a condition variable. Backends whose streams
//! finish each item before the next (the CPU, wgpu) fire them on the host.

use std::sync::Arc;

use cistern_memory::IdMap;

use crate::error::ServerError;
use crate::ids::EventId;
use crate::sync::{Condvar, Mutex};

/// The recorded event `event` of `events`, for a stream to wait on.
pub(crate) fn event_of(
    events: &IdMap<EventId, Arc<HostEvent>>,
    event: EventId,
) -> Result<Arc<HostEvent>, ServerError> {
    events
        .get(&event)
        .cloned()
        .ok_or_else(|| ServerError::InvalidArgument {
            message: format!("unknown event {}", event.0),
        })
}

/// Records a new event in `events`: its recording side.
pub(crate) fn record_in(
    events: &mut IdMap<EventId, Arc<HostEvent>>,
    event: EventId,
) -> EventSignal {
    let cell = Arc::new(HostEvent::default());
    events.insert(event, cell.clone());
    EventSignal(cell)
}

/// Fires once; waiters block until it has.
#[derive(Debug, Default)]
pub(crate) struct HostEvent {
    fired: Mutex<bool>,
    changed: Condvar,
}

impl HostEvent {
    /// Blocks until the event has fired.
    pub(crate) fn wait(&self) {
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
pub(crate) struct EventSignal(pub(crate) Arc<HostEvent>);

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
        let event = Arc::new(HostEvent::default());
        let signal = EventSignal(event.clone());
        let waiter = std::thread::spawn(move || event.wait());
        drop(signal);
        assert!(waiter.join().is_ok());
    }
}
