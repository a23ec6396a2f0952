//! The server's book of captured graphs: the capture recording now, the
//! graphs recorded, and which allocations they hold.
//!
//! A graph holds every allocation its launches bind and every allocation
//! made during its capture. A held allocation is pinned in the memory
//! manager (compaction never moves it, so the graph's resolved locations
//! stay valid) and a free of it waits until its last holder is released.
//! Pure bookkeeping: the server applies what it answers to the manager.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use cistern_memory::{AllocationId, StreamId};

use crate::backend::{Launches, ResolvedLaunch};
use crate::graph::CaptureId;
use crate::kernel::{Access, KernelLaunch};
use cistern_memory::{IdHasher, IdMap};

/// The capture in progress: launches recorded, allocations held so far.
#[derive(Debug)]
pub(crate) struct Recording {
    pub(crate) id: CaptureId,
    pub(crate) stream: StreamId,
    pub(crate) launches: Vec<ResolvedLaunch>,
    /// The launches as sent, for the launch log.
    sources: Vec<KernelLaunch>,
    /// Each allocation held, and how the recorded launches use it (a write
    /// among them makes it written).
    allocations: HashMap<AllocationId, Access, BuildHasherDefault<IdHasher>>,
}

/// A recorded graph: its launches, resolved, and the allocations it holds.
#[derive(Debug)]
pub(crate) struct Graph {
    /// Shared with every replay in flight and marked recorded; the backend
    /// caches its own resolved form (on CUDA, a CUDA graph) beside them.
    pub(crate) launches: Launches,
    /// Shared, so a replay names them without copying the list; with how
    /// the graph uses each, for the cross-stream ordering of its replays.
    pub(crate) allocations: Arc<[(AllocationId, Access)]>,
    /// The launches as sent, for the launch log.
    pub(crate) sources: Arc<[KernelLaunch]>,
}

#[derive(Debug, Default)]
struct Hold {
    holders: u32,
    /// Its last handle was dropped: free it when the last holder goes.
    freed: bool,
}

/// What the memory manager must do after holders were released.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Released {
    /// No longer held: may move again.
    pub(crate) unpin: Vec<AllocationId>,
    /// No longer held and already dropped by its owner: free now.
    pub(crate) free: Vec<AllocationId>,
}

/// Every graph of one context generation, and the capture in progress.
#[derive(Debug, Default)]
pub(crate) struct Graphs {
    generation: u64,
    next_capture: u64,
    /// The first capture id of each generation after the first, and that
    /// generation, oldest first: names the generation an ended capture
    /// began in.
    eras: Vec<(u64, u64)>,
    next_graph: u64,
    recording: Option<Recording>,
    graphs: IdMap<u64, Graph>,
    holds: IdMap<AllocationId, Hold>,
}

impl Graphs {
    /// Forgets everything of an older generation (its memory is gone);
    /// ids keep counting, so an old capture or graph never names a new one.
    pub(crate) fn renew(&mut self, generation: u64) {
        if self.generation != generation {
            self.generation = generation;
            self.eras.push((self.next_capture, generation));
            self.recording = None;
            self.graphs.clear();
            self.holds.clear();
        }
    }

    /// The generation `capture` began in (for an id never issued, the
    /// newest).
    pub(crate) fn capture_generation(&self, capture: CaptureId) -> u64 {
        self.eras
            .iter()
            .rev()
            .find(|(first, _)| capture.0 >= *first)
            .map_or(0, |(_, generation)| *generation)
    }

    /// The generation the book holds graphs of.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// Starts recording on `stream`; the caller made the context `Capturing`.
    pub(crate) fn start(&mut self, stream: StreamId) -> CaptureId {
        debug_assert!(self.recording.is_none(), "captures do not nest");
        let id = CaptureId(self.next_capture);
        self.next_capture += 1;
        self.recording = Some(Recording {
            id,
            stream,
            launches: Vec::new(),
            sources: Vec::new(),
            allocations: HashMap::default(),
        });
        id
    }

    /// The recording stream of `capture`, if it is the capture in progress.
    pub(crate) fn recording_stream(&self, capture: CaptureId) -> Option<StreamId> {
        self.recording
            .as_ref()
            .filter(|recording| recording.id == capture)
            .map(|recording| recording.stream)
    }

    /// Records launches (resolved, and as sent) in the capture in progress.
    pub(crate) fn record(&mut self, launches: Vec<ResolvedLaunch>, sources: &[KernelLaunch]) {
        if let Some(recording) = &mut self.recording {
            recording.launches.extend(launches);
            recording.sources.extend_from_slice(sources);
        }
    }

    /// The capture in progress holds `id`, used as `access`; true when
    /// `id` was not held before (pin it now).
    pub(crate) fn hold_in_recording(&mut self, id: AllocationId, access: Access) -> bool {
        let Some(recording) = &mut self.recording else {
            return false;
        };
        match recording.allocations.entry(id) {
            Entry::Occupied(mut held) => {
                if access == Access::Write {
                    held.insert(Access::Write);
                }
                return false;
            }
            Entry::Vacant(vacant) => {
                vacant.insert(access);
            }
        }
        let hold = self.holds.entry(id).or_default();
        hold.holders += 1;
        hold.holders == 1
    }

    /// Takes the capture in progress if it is `capture`.
    pub(crate) fn finish(&mut self, capture: CaptureId) -> Option<Recording> {
        match &self.recording {
            Some(recording) if recording.id == capture => self.recording.take(),
            _ => None,
        }
    }

    /// Turns a recording into a graph (it keeps the recording's holds);
    /// answers the graph's id.
    pub(crate) fn insert(&mut self, recording: Recording) -> (u64, &Graph) {
        let id = self.next_graph;
        self.next_graph += 1;
        let graph = Graph {
            launches: Launches::recorded(recording.launches),
            allocations: recording.allocations.into_iter().collect(),
            sources: recording.sources.into(),
        };
        (id, self.graphs.entry(id).or_insert(graph))
    }

    /// The graph `id`, if it lives.
    pub(crate) fn get(&self, id: u64) -> Option<&Graph> {
        self.graphs.get(&id)
    }

    /// Forgets the graph `id`; answers what its holds leave to do.
    pub(crate) fn remove(&mut self, id: u64) -> Released {
        match self.graphs.remove(&id) {
            Some(graph) => self.release(graph.allocations.iter().map(|(id, _)| *id)),
            None => Released::default(),
        }
    }

    /// Drops a discarded recording's holds; answers what they leave to do.
    pub(crate) fn discard(&mut self, recording: Recording) -> Released {
        self.release(recording.allocations.into_keys())
    }

    /// A free of `id` arrived: true (and it waits) while a graph holds it.
    pub(crate) fn defer_free(&mut self, id: AllocationId) -> bool {
        match self.holds.get_mut(&id) {
            Some(hold) => {
                hold.freed = true;
                true
            }
            None => false,
        }
    }

    fn release(&mut self, allocations: impl Iterator<Item = AllocationId>) -> Released {
        let mut released = Released::default();
        for id in allocations {
            let Some(hold) = self.holds.get_mut(&id) else {
                debug_assert!(false, "a holder's allocation is held");
                continue;
            };
            hold.holders -= 1;
            if hold.holders == 0 {
                let freed = hold.freed;
                self.holds.remove(&id);
                released.unpin.push(id);
                if freed {
                    released.free.push(id);
                }
            }
        }
        released
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(graphs: &mut Graphs, ids: &[u64]) -> u64 {
        let capture = graphs.start(StreamId(0));
        for id in ids {
            graphs.hold_in_recording(AllocationId(*id), Access::Read);
        }
        let recording = graphs.finish(capture);
        assert!(recording.is_some());
        recording.map_or(0, |recording| graphs.insert(recording).0)
    }

    #[test]
    fn an_allocation_is_pinned_by_its_first_holder_and_freed_after_its_last() {
        let mut graphs = Graphs::default();
        let first = record(&mut graphs, &[1, 2]);
        let second = record(&mut graphs, &[2]);
        assert!(graphs.defer_free(AllocationId(2)));
        assert!(!graphs.defer_free(AllocationId(3)));
        let released = graphs.remove(first);
        assert_eq!(released.unpin, vec![AllocationId(1)]);
        assert!(released.free.is_empty());
        let released = graphs.remove(second);
        assert_eq!(released.unpin, vec![AllocationId(2)]);
        assert_eq!(released.free, vec![AllocationId(2)]);
        assert_eq!(graphs.remove(second), Released::default());
    }

    #[test]
    fn a_recording_holds_each_allocation_once() {
        let mut graphs = Graphs::default();
        let capture = graphs.start(StreamId(4));
        assert!(graphs.hold_in_recording(AllocationId(7), Access::Read));
        assert!(!graphs.hold_in_recording(AllocationId(7), Access::Read));
        assert_eq!(graphs.recording_stream(capture), Some(StreamId(4)));
        assert_eq!(graphs.recording_stream(CaptureId(99)), None);
        let Some(recording) = graphs.finish(capture) else {
            panic!("the capture in progress finishes");
        };
        assert_eq!(graphs.discard(recording).unpin, vec![AllocationId(7)]);
        assert!(graphs.finish(capture).is_none());
    }

    #[test]
    fn a_new_generation_forgets_graphs_and_holds_but_never_reuses_ids() {
        let mut graphs = Graphs::default();
        let first = record(&mut graphs, &[1]);
        graphs.renew(1);
        assert!(graphs.get(first).is_none());
        assert!(!graphs.defer_free(AllocationId(1)));
        assert_ne!(record(&mut graphs, &[]), first);
    }
}
