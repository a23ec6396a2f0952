//! `Streams`: the streams a server has, each with the last sequence number
//! it handed out, and the ids of new streams and events.
//!
//! Invariants: the default stream always exists; a stream's sequences rise
//! by one per item queued on it; stream and event ids are never reused; a
//! destroyed stream whose queued work may still run is kept, with the
//! marker queued last on it, until the marker is answered.

use cistern_memory::{IdMap, StreamId};

use crate::ids::{DEFAULT_STREAM, EventId};
use crate::sync::Answer;

/// The streams of one server and their sequence counters.
#[derive(Debug)]
pub(super) struct Streams {
    /// Each stream's last sequence number handed out.
    last: IdMap<StreamId, u64>,
    /// Destroyed streams whose queued work may still run, each with the
    /// answer of the sync marker queued last on it: a recovery's drain
    /// waits for these too, or their work would run after the reset.
    destroyed: Vec<(StreamId, Answer<()>)>,
    next_stream: u64,
    next_event: u64,
}

impl Streams {
    /// The default stream alone, nothing queued yet.
    pub(super) fn new() -> Self {
        Streams {
            last: IdMap::from_iter([(DEFAULT_STREAM, 0)]),
            destroyed: Vec::new(),
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

    /// Forgets `stream` (never the default stream). `last_marker`, the
    /// answer of a sync queued last on it (`None`: nothing left to run), is
    /// kept until answered; markers already answered are dropped (a lost
    /// one is kept: the next recovery's drain ends unrecoverable on it).
    pub(super) fn remove(&mut self, stream: StreamId, last_marker: Option<Answer<()>>) {
        debug_assert_ne!(stream, DEFAULT_STREAM, "the default stream stays");
        self.last.remove(&stream);
        self.destroyed
            .retain(|(_, marker)| marker.try_recv().is_err());
        if let Some(marker) = last_marker {
            self.destroyed.push((stream, marker));
        }
    }

    /// The last markers of destroyed streams, taken: a recovery's drain
    /// waits for each as for a marker of its own.
    pub(super) fn take_destroyed(&mut self) -> Vec<(StreamId, Answer<()>)> {
        std::mem::take(&mut self.destroyed)
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
        streams.remove(other, None);
        assert_eq!(streams.next_sequence(other), None);
        assert_ne!(streams.add(), other);
        assert_ne!(streams.next_event(), streams.next_event());
    }

    #[test]
    fn a_destroyed_streams_marker_is_kept_until_answered() {
        let mut streams = Streams::new();
        let (first, second) = (streams.add(), streams.add());
        let (answered, reached) = crate::sync::reply_channel();
        streams.remove(first, Some(reached));
        let (_waiting, unanswered) = crate::sync::reply_channel::<()>();
        assert!(answered.send(Ok(())).is_ok());
        // Removing another stream drops the marker already answered.
        streams.remove(second, Some(unanswered));
        let kept: Vec<StreamId> = streams.take_destroyed().iter().map(|(s, _)| *s).collect();
        assert_eq!(kept, vec![second]);
        assert!(streams.take_destroyed().is_empty());
    }
}
