//! `Event`: a point recorded on a stream that other streams can wait for.

use std::sync::Arc;

use cistern_runtime::{Command, EventId};

use super::client::ClientShared;

/// An event recorded on a stream; it fires when the stream reaches it.
/// Dropping it tells the server no one will wait for it any more.
#[derive(Debug)]
pub struct Event {
    id: EventId,
    owner: Arc<ClientShared>,
}

impl Event {
    pub(crate) fn new(id: EventId, owner: Arc<ClientShared>) -> Self {
        Event { id, owner }
    }

    /// Its id on the server.
    pub fn id(&self) -> EventId {
        self.id
    }

    pub(crate) fn belongs_to(&self, owner: &Arc<ClientShared>) -> bool {
        Arc::ptr_eq(&self.owner, owner)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _ = self
            .owner
            .server
            .send(Command::ReleaseEvent { event: self.id });
    }
}
