//! `Executors`: one thread per stream running the shared [`StreamRunner`]
//! over a backend's [`StreamDevice`], and the server's side of each stream's
//! queue (jobs gathered until a flush, published progress). Every backend
//! whose streams run on host threads shares it.

use std::sync::Arc;

use cistern_memory::{IdMap, IoError, StreamId};

use super::Completion;
use super::stream::{DeviceHealth, Job, StreamDevice, StreamProgress, StreamRunner, refuse_all};
use crate::error::ServerError;
use crate::sync::{Sender, unbounded};

/// A stream's gathered jobs are sent at the latest when this many wait, so
/// a busy server cannot hold work back for long.
const FLUSH_AT: usize = 64;

/// The server's side of one stream: jobs gathered since the last flush, the
/// channel to its executor thread, and what the backend keeps beside it.
#[derive(Debug)]
pub(crate) struct StreamQueue<D: StreamDevice, L> {
    jobs: Sender<Vec<Job<D>>>,
    pending: Vec<Job<D>>,
    /// The backend's own per-stream state (the CPU's recycled binding lists).
    extra: L,
    /// The sequence of the last job accepted for this stream.
    last_sequence: u64,
    progress: Arc<StreamProgress>,
}

/// Every stream of one device, each with its executor thread.
#[derive(Debug)]
pub(crate) struct Executors<D: StreamDevice, L> {
    ordinal: usize,
    /// Names the threads (`cpu`, `wgpu`).
    kind: &'static str,
    queues: IdMap<StreamId, StreamQueue<D, L>>,
    /// Every stream's published progress, kept after a stream is destroyed
    /// (its queued work still runs, and others may wait on it).
    progress: IdMap<StreamId, Arc<StreamProgress>>,
    pub(crate) health: Arc<DeviceHealth>,
    completions: Sender<Completion>,
}

impl<D: StreamDevice, L> Executors<D, L> {
    /// No streams yet, for device `ordinal` of `kind`, reporting to `completions`.
    pub(crate) fn new(ordinal: usize, kind: &'static str, completions: Sender<Completion>) -> Self {
        Executors {
            ordinal,
            kind,
            queues: IdMap::default(),
            progress: IdMap::default(),
            health: Arc::new(DeviceHealth::new(ordinal)),
            completions,
        }
    }

    /// Starts `stream`'s executor thread over `device`, keeping `extra` beside its queue.
    pub(crate) fn create(
        &mut self,
        stream: StreamId,
        device: D,
        extra: L,
    ) -> Result<(), ServerError> {
        let (jobs, queue) = unbounded();
        let progress = Arc::new(StreamProgress::default());
        let runner = StreamRunner::new(
            stream,
            device,
            self.health.clone(),
            self.completions.clone(),
            progress.clone(),
        );
        std::thread::Builder::new()
            .name(format!(
                "cistern-{}{}-stream{}",
                self.kind, self.ordinal, stream.0
            ))
            .spawn(move || runner.run(queue))
            .map_err(|e| {
                ServerError::Io(IoError::unknown(format!(
                    "could not start an executor thread: {e}"
                )))
            })?;
        self.progress.insert(stream, progress.clone());
        self.queues.insert(
            stream,
            StreamQueue {
                jobs,
                pending: Vec::new(),
                extra,
                last_sequence: 0,
                progress,
            },
        );
        Ok(())
    }

    /// Ends `stream` once its queued work has run.
    pub(crate) fn destroy(&mut self, stream: StreamId) {
        // Dropping the sender closes the queue: the executor runs what is
        // queued, reports, and exits.
        if let Some(mut queue) = self.queues.remove(&stream) {
            send_pending(self.ordinal, stream, &mut queue);
        }
    }

    /// What the backend keeps beside `stream`'s queue, with every stream's
    /// progress (for a resolver), if the stream exists.
    #[allow(clippy::type_complexity)] // two borrows of one struct, named
    pub(crate) fn resolving(
        &mut self,
        stream: StreamId,
    ) -> Option<(&mut L, &IdMap<StreamId, Arc<StreamProgress>>)> {
        let queue = self.queues.get_mut(&stream)?;
        Some((&mut queue.extra, &self.progress))
    }

    /// Queues `job` on `stream` (which exists); sends at once when `urgent`
    /// (every stream's gathered work then goes: an event may wait on it),
    /// or once a whole batch waits.
    pub(crate) fn push(&mut self, stream: StreamId, job: Job<D>, urgent: bool) {
        let ordinal = self.ordinal;
        let Some(queue) = self.queues.get_mut(&stream) else {
            return;
        };
        if queue.pending.len() == queue.pending.capacity() && !queue.pending.is_empty() {
            // Grow once to a whole batch, not by doubling through it.
            queue
                .pending
                .reserve_exact(FLUSH_AT.saturating_sub(queue.pending.len()).max(1));
        }
        queue.last_sequence = job.sequence;
        queue.pending.push(job);
        if urgent {
            self.flush();
        } else if queue.pending.len() >= FLUSH_AT {
            send_pending(ordinal, stream, queue);
        }
    }

    /// Sends every stream's gathered jobs.
    pub(crate) fn flush(&mut self) {
        let ordinal = self.ordinal;
        for (stream, queue) in self.queues.iter_mut() {
            if !queue.pending.is_empty() {
                send_pending(ordinal, *stream, queue);
            }
        }
    }

    /// Whether everything sent to `stream` has run and been reported, with
    /// nothing latched and no device fault.
    pub(crate) fn is_idle(&self, stream: StreamId) -> bool {
        self.queues.get(&stream).is_some_and(|queue| {
            queue.pending.is_empty()
                && queue.progress.is_clean_at(queue.last_sequence)
                && !self.health.is_faulted()
        })
    }
}

impl<D: StreamDevice, L> Drop for Executors<D, L> {
    fn drop(&mut self) {
        // Gathered work still runs (and answers) after the server ends.
        self.flush();
    }
}

/// The published progress of `stream` in `progress`, for another stream to wait on.
pub(crate) fn progress_of(
    progress: &IdMap<StreamId, Arc<StreamProgress>>,
    stream: StreamId,
) -> Result<Arc<StreamProgress>, ServerError> {
    progress
        .get(&stream)
        .cloned()
        .ok_or_else(|| unknown_stream(stream))
}

/// The error for a stream the backend does not know.
pub(crate) fn unknown_stream(stream: StreamId) -> ServerError {
    ServerError::InvalidArgument {
        message: format!("unknown stream {}", stream.0),
    }
}

/// Sends a stream's gathered jobs to its executor in one message.
fn send_pending<D: StreamDevice, L>(
    ordinal: usize,
    stream: StreamId,
    queue: &mut StreamQueue<D, L>,
) {
    let jobs = std::mem::take(&mut queue.pending);
    if let Err(unsent) = queue.jobs.send(jobs) {
        // The executor thread died (a bug outside any kernel): answer its
        // jobs here so no caller waits on them.
        let error = ServerError::ServerPanicked {
            ordinal,
            message: format!("the executor of stream {} ended", stream.0),
        };
        refuse_all(unsent.into_inner(), &error);
    }
}
