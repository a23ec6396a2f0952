//! A stream's work items: as the server queues them ([`StreamWork`], with
//! memory locations) and as an executor runs them ([`Task`], with the
//! device's own handles). One enum serves both, so a refusal answers either
//! the same way.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use cistern_memory::{SliceLocation, StreamId};

use super::progress::StreamProgress;
use super::runner::StreamDevice;
use crate::backend::{Launches, ResolvedLaunch, StrideLayout};
use crate::error::ServerError;
use crate::failure::{FailureToken, PendingToken};
use crate::ids::EventId;
use crate::kernel::Kernel;
use crate::sync::Reply;

/// What a work item's memory and events are named by.
pub trait Resolution {
    /// A range of memory.
    type Slice: fmt::Debug + Send;
    /// One kernel call.
    type Launch: fmt::Debug + Send;
    /// Kernel calls run as one batch.
    type Batch: fmt::Debug + Send;
    /// The recording side of an event.
    type Record: fmt::Debug + Send;
    /// The waiting side of an event.
    type Wait: fmt::Debug + Send;
    /// Another stream, as a wait for its progress sees it.
    type Stream: fmt::Debug + Send;
}

/// One item of a stream's in-order work.
#[derive(Debug)]
pub enum Work<R: Resolution> {
    /// Write `data` to `target` (`data.len()` is the target's size).
    Write {
        /// The memory written; no other stream's work on it is in flight.
        target: R::Slice,
        /// Exactly as many bytes as `target` spans (shared with the caller,
        /// who may write them elsewhere too).
        data: Arc<Vec<u8>>,
    },
    /// Read `source` and answer with its bytes.
    Read {
        /// The memory read; no other stream writes it meanwhile.
        source: R::Slice,
        /// Answered with the bytes or the stream's error.
        reply: Reply<Vec<u8>>,
    },
    /// Copy `source` to `target` (same size, not overlapping).
    Copy {
        /// Read; as long as `target`.
        source: R::Slice,
        /// Written; does not overlap `source`.
        target: R::Slice,
    },
    /// A strided copy; `layout` addresses elements from each slice's start.
    StridedCopy {
        /// The source's element zero onwards.
        source: R::Slice,
        /// The target's element zero onwards.
        target: R::Slice,
        /// Shape, strides and element size (boxed: rare, and wide).
        layout: Box<StrideLayout>,
    },
    /// Run one kernel.
    Launch {
        /// The kernel with its bindings, checked by the server.
        launch: R::Launch,
        /// Settled with the outcome.
        token: Option<PendingToken>,
    },
    /// Run kernels in order, stopping at the first failure.
    Batch {
        /// The calls (a replayed graph's are shared by all its replays).
        launches: R::Batch,
        /// Settled with the outcome of the whole batch.
        token: Option<PendingToken>,
        /// Earlier work the batch consumes: if any of it failed, the batch
        /// does not run and `token` fails with that error.
        requires: Vec<FailureToken>,
    },
    /// Fire an event (new: never recorded before) when the stream reaches this point.
    RecordEvent {
        /// Fired once the stream reaches it (or when dropped unrun).
        event: R::Record,
    },
    /// Hold the stream until an event has fired.
    WaitEvent {
        /// Recorded earlier on some stream; the wait ends when it fires.
        event: R::Wait,
    },
    /// Hold the stream until `stream` has completed everything up to
    /// `sequence`: the server orders conflicting uses of memory this way.
    WaitStream {
        /// The stream waited for.
        stream: R::Stream,
        /// Its item that must have completed.
        sequence: u64,
    },
    /// Answer once everything before it ran: the latched error (clearing
    /// it), the device's fault, or `Ok`.
    Sync {
        /// Answered by the executor.
        reply: Reply<()>,
    },
    /// Latch `error` on the stream (the server refused asynchronous work),
    /// unless an earlier error is latched.
    Fail {
        /// The refusal (boxed: rare, and as wide as every other item would become).
        error: Box<ServerError>,
    },
}

impl<R: Resolution> Work<R> {
    /// Answers this item's reply or token with `error` without running it.
    pub fn refuse(self, error: ServerError) {
        match self {
            Work::Read { reply, .. } => drop(reply.send(Err(error))),
            Work::Sync { reply } => drop(reply.send(Err(error))),
            Work::Launch { token, .. } | Work::Batch { token, .. } => {
                if let Some(token) = token {
                    token.fail(error);
                }
            }
            Work::Write { .. }
            | Work::Copy { .. }
            | Work::StridedCopy { .. }
            | Work::RecordEvent { .. }
            | Work::WaitEvent { .. }
            | Work::WaitStream { .. }
            | Work::Fail { .. } => {}
        }
    }

    /// Whether a caller is waiting on this item's answer (a read or a sync):
    /// a backend that gathers work sends such an item at once.
    pub fn is_urgent(&self) -> bool {
        matches!(self, Work::Read { .. } | Work::Sync { .. })
    }
}

/// Work as the server queues it: memory locations and event ids.
#[derive(Debug)]
pub struct Unresolved;

impl Resolution for Unresolved {
    type Slice = SliceLocation;
    type Launch = ResolvedLaunch;
    type Batch = Launches;
    type Record = EventId;
    type Wait = EventId;
    type Stream = StreamId;
}

/// Work as the server hands it to a backend.
pub type StreamWork = Work<Unresolved>;

/// Work as device `D`'s executor runs it.
pub struct OnDevice<D>(PhantomData<D>);

impl<D> fmt::Debug for OnDevice<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OnDevice")
    }
}

impl<D: StreamDevice> Resolution for OnDevice<D> {
    type Slice = D::Slice;
    type Launch = BoundLaunch<D::Slice>;
    type Batch = D::Batch;
    type Record = D::Signal;
    type Wait = D::Event;
    type Stream = Arc<StreamProgress>;
}

/// Work resolved to device `D`'s handles.
pub type Task<D> = Work<OnDevice<D>>;

/// One item of a stream's queue on its way to the executor.
#[derive(Debug)]
pub struct Job<D: StreamDevice> {
    /// Its place on the stream (rising by one per item the server queued).
    pub sequence: u64,
    /// What it does.
    pub task: Task<D>,
}

/// A kernel call with its bindings resolved to a device's slices.
#[derive(Clone, Debug)]
pub struct BoundLaunch<S> {
    /// The kernel and its arguments.
    pub kernel: Kernel,
    /// Each binding's memory, in signature order.
    pub bindings: Vec<S>,
}

/// Work a backend did not queue, handed back with the reason (boxed: it is
/// the rare path and carries the whole work item).
#[derive(Debug)]
pub struct Refused {
    /// Why it was not queued.
    pub error: ServerError,
    /// The work, unrun and unchanged.
    pub work: StreamWork,
}

/// The server-side lookups of a backend: locations to device slices, event
/// ids to the device's events. Each takes what it needs by reference, so a
/// failed lookup hands the work back as it came.
pub trait Resolver {
    /// The device the work runs on.
    type Device: StreamDevice;

    /// The device's handle of `location`.
    fn slice(
        &mut self,
        location: SliceLocation,
    ) -> Result<<Self::Device as StreamDevice>::Slice, ServerError>;

    /// An empty list for `len` bindings (a backend may recycle them).
    fn binding_list(&mut self, len: usize) -> Vec<<Self::Device as StreamDevice>::Slice> {
        Vec::with_capacity(len)
    }

    /// A batch's launches resolved; a graph's list keeps its resolved form
    /// across replays.
    fn batch(
        &mut self,
        launches: &Launches,
    ) -> Result<<Self::Device as StreamDevice>::Batch, ServerError>;

    /// The recording side of a new event.
    fn record(&mut self, event: EventId) -> <Self::Device as StreamDevice>::Signal;

    /// The waiting side of a recorded event.
    fn wait(
        &mut self,
        event: EventId,
    ) -> Result<<Self::Device as StreamDevice>::Event, ServerError>;

    /// The published progress of `stream`, for another stream to wait on.
    fn progress(&mut self, stream: StreamId) -> Result<Arc<StreamProgress>, ServerError>;
}

impl StreamWork {
    /// This work with its locations and events resolved by `resolver`; on
    /// a failed lookup, the work itself comes back with the reason.
    pub fn resolve<R: Resolver>(self, resolver: &mut R) -> Result<Task<R::Device>, Box<Refused>> {
        match Lookup::of(&self, resolver) {
            Ok(found) => Ok(found.complete(self)),
            Err(error) => Err(Box::new(Refused { error, work: self })),
        }
    }
}

/// What a work item's lookups found, made before the item moves.
enum Lookup<D: StreamDevice> {
    Nothing,
    One(D::Slice),
    Two(D::Slice, D::Slice),
    Bindings(Vec<D::Slice>),
    Batch(D::Batch),
    Record(D::Signal),
    Wait(D::Event),
    Progress(Arc<StreamProgress>),
}

impl<D: StreamDevice> Lookup<D> {
    fn of<R: Resolver<Device = D>>(work: &StreamWork, r: &mut R) -> Result<Self, ServerError> {
        Ok(match work {
            Work::Write { target, .. } => Lookup::One(r.slice(*target)?),
            Work::Read { source, .. } => Lookup::One(r.slice(*source)?),
            Work::Copy { source, target } | Work::StridedCopy { source, target, .. } => {
                Lookup::Two(r.slice(*source)?, r.slice(*target)?)
            }
            Work::Launch { launch, .. } => {
                let mut bindings = r.binding_list(launch.bindings.len());
                for location in &launch.bindings {
                    bindings.push(r.slice(*location)?);
                }
                Lookup::Bindings(bindings)
            }
            Work::Batch { launches, .. } => Lookup::Batch(r.batch(launches)?),
            Work::RecordEvent { event } => Lookup::Record(r.record(*event)),
            Work::WaitEvent { event } => Lookup::Wait(r.wait(*event)?),
            Work::WaitStream { stream, .. } => Lookup::Progress(r.progress(*stream)?),
            Work::Sync { .. } | Work::Fail { .. } => Lookup::Nothing,
        })
    }

    /// The task of `work`, whose lookups these are.
    fn complete(self, work: StreamWork) -> Task<D> {
        match (work, self) {
            (Work::Write { data, .. }, Lookup::One(target)) => Work::Write { target, data },
            (Work::Read { reply, .. }, Lookup::One(source)) => Work::Read { source, reply },
            (Work::Copy { .. }, Lookup::Two(source, target)) => Work::Copy { source, target },
            (Work::StridedCopy { layout, .. }, Lookup::Two(source, target)) => Work::StridedCopy {
                source,
                target,
                layout,
            },
            (Work::Launch { launch, token }, Lookup::Bindings(bindings)) => Work::Launch {
                // The kernel moves: no clone of its arguments per launch.
                launch: BoundLaunch {
                    kernel: launch.kernel,
                    bindings,
                },
                token,
            },
            (
                Work::Batch {
                    token, requires, ..
                },
                Lookup::Batch(launches),
            ) => Work::Batch {
                launches,
                token,
                requires,
            },
            (Work::RecordEvent { .. }, Lookup::Record(event)) => Work::RecordEvent { event },
            (Work::WaitEvent { .. }, Lookup::Wait(event)) => Work::WaitEvent { event },
            (Work::WaitStream { sequence, .. }, Lookup::Progress(stream)) => {
                Work::WaitStream { stream, sequence }
            }
            (Work::Sync { reply }, Lookup::Nothing) => Work::Sync { reply },
            (Work::Fail { error }, Lookup::Nothing) => Work::Fail { error },
            (work, _) => unreachable!("a lookup completes the work it was made from: {work:?}"),
        }
    }
}

/// Resolves a batch's launches with `slice`, for [`Resolver::batch`].
pub fn bind_launches<S>(
    launches: &[ResolvedLaunch],
    mut slice: impl FnMut(SliceLocation) -> Result<S, ServerError>,
) -> Result<Arc<[BoundLaunch<S>]>, ServerError> {
    launches
        .iter()
        .map(|launch| {
            let bindings = launch
                .bindings
                .iter()
                .map(|location| slice(*location))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(BoundLaunch {
                kernel: launch.kernel.clone(),
                bindings,
            })
        })
        .collect()
}
