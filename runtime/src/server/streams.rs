//! `Streams`: the streams a server has, each with the last sequence number
//! it handed out, and the ids of new streams and events.
//!
//! Invariants: the default stream always exists; a stream's sequences rise
//! by one per item queued on it; stream and event ids are never reused.

use cistern_memory::{IdMap, StreamId};

use crate::DEFAULT_STREAM;
use crate::command::EventId;

/// The streams of one server and their sequence counters.
#[derive(Debug)]
pub(super) struct Streams {
    /// Each stream's last sequence number handed out.
    last: IdMap<StreamId, u64>,
    next_stream: u64,
    next_event: u64,
}

impl Streams {
    /// The default stream alone, nothing queued yet.
    pub(super) fn new() -> Self {
        Streams {
            last: IdMap::from_iter([(DEFAULT_STREAM, 0)]),
            next_stream: DEFAULT_STREAM.0 + 1,
            next_event: 0,
        }
    }

    /// Whether `stream` exists.
    pub(super) fn contains(&self, stream: StreamId) -> bool {
        self.last.contains_key(&stream)
    }

    /// Whether more than one stream exists (only then can uses conflict).
    pub(super) fn several(&self) -> bool {
        self.last.len() > 1
    }

    /// Every stream, in ascending order.
    pub(super) fn ids(&self) -> Vec<StreamId> {
        let mut streams: Vec<StreamId> = self.last.keys().copied().collect();
        streams.sort_unstable();
        streams
    }

    /// The id the next stream will get; [`add`](Self::add) takes it.
    pub(super) fn next_id(&self) -> StreamId {
        StreamId(self.next_stream)
    }

    /// Adds the stream [`next_id`](Self::next_id) named.
    pub(super) fn add(&mut self) -> StreamId {
        let stream = self.next_id();
        self.next_stream += 1;
        self.last.insert(stream, 0);
        stream
    }

    /// Forgets `stream` (never the default stream).
    pub(super) fn remove(&mut self, stream: StreamId) {
        debug_assert_ne!(stream, DEFAULT_STREAM, "the default stream stays");
        self.last.remove(&stream);
    }

    /// The next sequence number of `stream`, taken; `None` for an unknown stream.
    pub(super) fn next_sequence(&mut self, stream: StreamId) -> Option<u64> {
        let last = self.last.get_mut(&stream)?;
        *last += 1;
        Some(*last)
    }

    /// A new event id.
    pub(super) fn next_event(&mut self) -> EventId {
        let event = EventId(self.next_event);
        self.next_event += 1;
        event
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_rise_by_one_per_stream_and_ids_are_never_reused() {
        let mut streams = Streams::new();
        let other = streams.add();
        assert_eq!(streams.next_sequence(DEFAULT_STREAM), Some(1));
        assert_eq!(streams.next_sequence(DEFAULT_STREAM), Some(2));
        assert_eq!(streams.next_sequence(other), Some(1));
        streams.remove(other);
        assert_eq!(streams.next_sequence(other), None);
        assert_ne!(streams.add(), other);
        assert_ne!(streams.next_event(), streams.next_event());
    }
}
