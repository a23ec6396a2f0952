//! `ServerCore` driven step by step over a fake backend whose executors run
//! nothing until the test says so. Every test runs on one thread: a core
//! that waited on an executor would hang here.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use cistern_memory::{
    AllocationPolicy, BackTrace, BookkeepingStorage, DevicePoison, MemoryConfig, SliceLocation,
    SliceUse, StreamId,
};

use super::{ContextState, ServerCore};
use crate::backend::{Backend, Completion, DeviceCounters, Refused, StreamWork, StrideLayout};
use crate::command::{BufferRef, EventId, Region, ServerId, StridedCopy};
use crate::sync::{Answer, Mutex, Reply, Sender, TryRecvError, reply_channel, unbounded};
use crate::{
    Binding, Command, DEFAULT_STREAM, Device, ErrorCode, FailureToken, FaultPlan, KernelLaunch,
    ServerError,
};

type Queue = Arc<Mutex<VecDeque<(StreamId, u64, StreamWork)>>>;

/// Queues work and runs none of it.
struct FakeBackend {
    queued: Queue,
    streams: HashSet<StreamId>,
}

impl Backend for FakeBackend {
    type Storage = BookkeepingStorage;

    fn device(&self) -> Device {
        Device::Cpu(0)
    }

    fn create_stream(&mut self, stream: StreamId) -> Result<(), ServerError> {
        self.streams.insert(stream);
        Ok(())
    }

    fn destroy_stream(&mut self, stream: StreamId) {
        self.streams.remove(&stream);
    }

    fn submit(
        &mut self,
        _storage: &BookkeepingStorage,
        stream: StreamId,
        sequence: u64,
        work: StreamWork,
    ) -> Result<(), Box<Refused>> {
        self.queued.lock().push_back((stream, sequence, work));
        Ok(())
    }

    fn supports_strides(&self, layout: &StrideLayout) -> bool {
        layout.shape.len() <= 2
    }

    fn relocate(
        &mut self,
        _storage: &BookkeepingStorage,
        _from: SliceLocation,
        _to: SliceLocation,
    ) -> Result<(), ServerError> {
        Ok(())
    }

    fn release_event(&mut self, _event: EventId) {}

    fn counters(&self) -> DeviceCounters {
        DeviceCounters::default()
    }
}

struct Harness {
    core: ServerCore<FakeBackend>,
    queued: Queue,
    completions: Sender<Completion>,
}

impl Harness {
    fn new() -> Self {
        let queued = Queue::default();
        let backend = FakeBackend {
            queued: queued.clone(),
            streams: HashSet::new(),
        };
        let (completions, completed) = unbounded();
        let core = ServerCore::new(
            ServerId(7),
            backend,
            BookkeepingStorage::default(),
            MemoryConfig::with_limit(64 << 20),
            completed,
            FaultPlan::default(),
        );
        match core {
            Ok(core) => Harness {
                core,
                queued,
                completions,
            },
            Err(error) => panic!("the core starts: {error}"),
        }
    }

    /// Handles the command `make` builds and returns where its answer will arrive.
    fn send<T>(&mut self, make: impl FnOnce(Reply<T>) -> Command) -> Answer<T> {
        let (reply, answer) = reply_channel();
        self.core.handle(make(reply));
        answer
    }

    /// Handles a command the server must answer itself, at once.
    fn call<T: std::fmt::Debug>(
        &mut self,
        make: impl FnOnce(Reply<T>) -> Command,
    ) -> Result<T, ServerError> {
        match self.send(make).try_recv() {
            Ok(result) => result,
            Err(error) => panic!("the server answered at once: {error:?}"),
        }
    }

    fn reserve(&mut self, size: u64, stream: StreamId) -> BufferRef {
        let reservation = self.call(|reply| Command::Reserve {
            size,
            policy: AllocationPolicy::Allow,
            stream,
            reply,
        });
        match reservation {
            Ok(reservation) => reservation.buffer,
            Err(error) => panic!("reserve failed: {error}"),
        }
    }

    fn create_stream(&mut self) -> StreamId {
        match self.call(|reply| Command::CreateStream { reply }) {
            Ok(stream) => stream,
            Err(error) => panic!("create_stream failed: {error}"),
        }
    }

    fn launch(&mut self, stream: StreamId, launch: KernelLaunch, token: Option<FailureToken>) {
        self.core.handle(Command::Launch {
            stream,
            launch,
            token,
        });
    }

    fn free(&mut self, buffer: BufferRef) {
        self.core.handle(Command::Free { buffer });
    }

    /// The next queued work item.
    fn next_work(&mut self) -> (StreamId, u64, StreamWork) {
        match self.queued.lock().pop_front() {
            Some(item) => item,
            None => panic!("no work queued"),
        }
    }

    fn queued_len(&self) -> usize {
        self.queued.lock().len()
    }

    fn complete(&mut self, stream: StreamId, sequence: u64) {
        let sent = self.completions.send(Completion {
            stream,
            sequence,
            fault: None,
        });
        assert!(sent.is_ok());
    }

    /// The page offset of a live allocation's slice.
    fn offset_of(&self, buffer: BufferRef) -> Option<(Option<cistern_memory::StorageId>, u64)> {
        let snapshot = self.core.memory().snapshot();
        snapshot.pages.iter().find_map(|page| {
            page.slices.iter().find_map(|slice| match slice.state {
                SliceUse::Allocated { id, .. } if id == buffer.id => {
                    Some((page.storage, slice.offset))
                }
                _ => None,
            })
        })
    }
}

fn whole(buffer: BufferRef, size: u64) -> Binding {
    Binding {
        buffer,
        offset: 0,
        size,
    }
}

fn poison() -> DevicePoison {
    DevicePoison {
        ordinal: 0,
        generation: 0,
        operation: "launch trap".into(),
        status: "the kernel trapped".into(),
        backtrace: BackTrace::none(),
    }
}

#[test]
fn a_sync_is_answered_by_the_executor_not_the_server() {
    let mut harness = Harness::new();
    let answer = harness.send(|reply| Command::Sync {
        stream: DEFAULT_STREAM,
        reply,
    });
    assert!(matches!(answer.try_recv(), Err(TryRecvError::Empty)));
    let (stream, _, work) = harness.next_work();
    assert_eq!(stream, DEFAULT_STREAM);
    let StreamWork::Sync { reply } = work else {
        panic!("a sync marker is queued, got {work:?}");
    };
    assert!(reply.send(Ok(())).is_ok());
    assert!(matches!(answer.try_recv(), Ok(Ok(()))));
}

#[test]
fn the_server_keeps_answering_while_stream_work_is_pending() {
    let mut harness = Harness::new();
    let buffer = harness.reserve(1024, DEFAULT_STREAM);
    harness.launch(
        DEFAULT_STREAM,
        KernelLaunch::fill(whole(buffer, 1024), 1.0),
        None,
    );
    let sync = harness.send(|reply| Command::Sync {
        stream: DEFAULT_STREAM,
        reply,
    });
    // Nothing ran, yet every command that the server answers is answered.
    let second = harness.reserve(512, DEFAULT_STREAM);
    assert_ne!(second.id, buffer.id);
    assert!(harness.call(|reply| Command::MemoryStats { reply }).is_ok());
    assert!(harness.call(|reply| Command::ServerStats { reply }).is_ok());
    assert!(matches!(sync.try_recv(), Err(TryRecvError::Empty)));
    assert_eq!(harness.queued_len(), 2);
}

#[test]
fn freed_memory_is_reused_at_once_on_the_stream_that_used_it() {
    let mut harness = Harness::new();
    let first = harness.reserve(1024, DEFAULT_STREAM);
    let place = harness.offset_of(first);
    harness.launch(
        DEFAULT_STREAM,
        KernelLaunch::fill(whole(first, 1024), 1.0),
        None,
    );
    harness.free(first);
    let second = harness.reserve(1024, DEFAULT_STREAM);
    assert_eq!(harness.offset_of(second), place);
}

#[test]
fn freed_memory_is_reused_by_another_stream_only_after_the_user_completes() {
    let mut harness = Harness::new();
    let other = harness.create_stream();
    let first = harness.reserve(1024, DEFAULT_STREAM);
    let place = harness.offset_of(first);
    harness.launch(
        DEFAULT_STREAM,
        KernelLaunch::fill(whole(first, 1024), 1.0),
        None,
    );
    let (_, sequence, _) = harness.next_work();
    harness.free(first);
    let early = harness.reserve(1024, other);
    assert_ne!(harness.offset_of(early), place);
    harness.complete(DEFAULT_STREAM, sequence);
    let late = harness.reserve(1024, other);
    assert_eq!(harness.offset_of(late), place);
}

#[test]
fn a_fault_reported_by_an_executor_poisons_every_later_command() {
    let mut harness = Harness::new();
    assert!(
        harness
            .completions
            .send(Completion {
                stream: DEFAULT_STREAM,
                sequence: 1,
                fault: Some(poison()),
            })
            .is_ok()
    );
    let reserve = harness.call(|reply| Command::Reserve {
        size: 64,
        policy: AllocationPolicy::Allow,
        stream: DEFAULT_STREAM,
        reply,
    });
    assert_eq!(reserve, Err(ServerError::ContextPoisoned(poison())));
    assert!(harness.core.context().is_poisoned());
    let sync = harness.call(|reply| Command::Sync {
        stream: DEFAULT_STREAM,
        reply,
    });
    assert_eq!(sync.map_err(|e| e.code()), Err(ErrorCode::DevicePoisoned));
    assert_eq!(harness.queued_len(), 0);
}

#[test]
fn a_refused_launch_settles_its_token_and_latches_on_its_stream() {
    let mut harness = Harness::new();
    let buffer = harness.reserve(64, DEFAULT_STREAM);
    let token = FailureToken::new();
    let too_long = whole(buffer, 128);
    harness.launch(
        DEFAULT_STREAM,
        KernelLaunch::fill(too_long, 1.0),
        Some(token.clone()),
    );
    assert!(matches!(
        token.check(),
        Some(Err(ServerError::InvalidProgram { .. }))
    ));
    let (_, _, work) = harness.next_work();
    assert!(matches!(
        work,
        StreamWork::Fail { error } if matches!(*error, ServerError::InvalidProgram { .. })
    ));
}

#[test]
fn a_batch_with_one_bad_launch_queues_none_of_it() {
    let mut harness = Harness::new();
    let buffer = harness.reserve(64, DEFAULT_STREAM);
    let token = FailureToken::new();
    harness.core.handle(Command::LaunchBatch {
        stream: DEFAULT_STREAM,
        launches: vec![
            KernelLaunch::fill(whole(buffer, 64), 1.0),
            KernelLaunch::fill(whole(buffer, 65), 1.0),
        ],
        token: Some(token.clone()),
    });
    assert!(token.is_failed());
    let (_, _, work) = harness.next_work();
    assert!(matches!(work, StreamWork::Fail { .. }));
    assert_eq!(harness.queued_len(), 0);
}

#[test]
fn a_good_batch_is_queued_as_one_item() {
    let mut harness = Harness::new();
    let buffer = harness.reserve(64, DEFAULT_STREAM);
    harness.core.handle(Command::LaunchBatch {
        stream: DEFAULT_STREAM,
        launches: vec![
            KernelLaunch::fill(whole(buffer, 64), 1.0),
            KernelLaunch::empty(),
        ],
        token: None,
    });
    let (_, _, work) = harness.next_work();
    assert!(matches!(work, StreamWork::Batch { ref launches, .. } if launches.len() == 2));
}

#[test]
fn a_handle_of_another_server_or_generation_is_refused() {
    let mut harness = Harness::new();
    let buffer = harness.reserve(64, DEFAULT_STREAM);
    let region = |buffer| Region {
        buffer,
        offset: 0,
        size: 4,
    };
    let foreign = BufferRef {
        server: ServerId(99),
        ..buffer
    };
    let stale = BufferRef {
        generation: 3,
        ..buffer
    };
    let write = |harness: &mut Harness, buffer| {
        harness.call(|reply| Command::Write {
            stream: DEFAULT_STREAM,
            target: region(buffer),
            data: vec![0; 4].into(),
            reply,
        })
    };
    assert!(matches!(
        write(&mut harness, foreign),
        Err(ServerError::DeviceMismatch { .. })
    ));
    assert!(matches!(
        write(&mut harness, stale),
        Err(ServerError::StaleGeneration {
            resource_generation: 3,
            current_generation: 0,
            ..
        })
    ));
    assert_eq!(write(&mut harness, buffer), Ok(()));
}

#[test]
fn a_freed_handle_is_not_found() {
    let mut harness = Harness::new();
    let buffer = harness.reserve(64, DEFAULT_STREAM);
    harness.free(buffer);
    let read = harness.call(|reply| Command::Read {
        stream: DEFAULT_STREAM,
        source: Region {
            buffer,
            offset: 0,
            size: 4,
        },
        reply,
    });
    assert_eq!(read.map_err(|e| e.code()), Err(ErrorCode::HandleNotFound));
}

#[test]
fn a_stride_pattern_the_backend_declines_is_unsupported_strides() {
    let mut harness = Harness::new();
    let source = harness.reserve(64, DEFAULT_STREAM);
    let target = harness.reserve(64, DEFAULT_STREAM);
    let copy = StridedCopy {
        source,
        source_offset: 0,
        source_strides: vec![4, 2, 1],
        target,
        target_offset: 0,
        target_strides: vec![4, 2, 1],
        shape: vec![2, 2, 2],
        element_size: 4,
    };
    let result = harness.call(|reply| Command::StridedCopy {
        stream: DEFAULT_STREAM,
        copy: Box::new(copy),
        reply,
    });
    assert!(matches!(
        result,
        Err(ServerError::Io(
            cistern_memory::IoError::UnsupportedStrides { .. }
        ))
    ));
}

#[test]
fn work_on_an_unknown_or_destroyed_stream_is_an_invalid_argument() {
    let mut harness = Harness::new();
    let stream = harness.create_stream();
    assert_eq!(
        harness.call(|reply| Command::DestroyStream { stream, reply }),
        Ok(())
    );
    let sync = harness.call(|reply| Command::Sync { stream, reply });
    assert!(matches!(sync, Err(ServerError::InvalidArgument { .. })));
    let default = harness.call(|reply| Command::DestroyStream {
        stream: DEFAULT_STREAM,
        reply,
    });
    assert!(matches!(default, Err(ServerError::InvalidArgument { .. })));
}

#[test]
fn sequences_rise_by_one_per_stream_and_uses_are_recorded() {
    let mut harness = Harness::new();
    let buffer = harness.reserve(64, DEFAULT_STREAM);
    harness.launch(DEFAULT_STREAM, KernelLaunch::empty(), None);
    harness.launch(
        DEFAULT_STREAM,
        KernelLaunch::fill(whole(buffer, 64), 2.0),
        None,
    );
    let sequences: Vec<u64> = (0..2).map(|_| harness.next_work().1).collect();
    assert_eq!(sequences, vec![1, 2]);
    let stats = harness.call(|reply| Command::ServerStats { reply });
    assert!(matches!(stats, Ok(ref s) if s.launches == 2 && s.commands == 4));
    assert_eq!(
        harness.core.context(),
        &ContextState::Active { generation: 0 }
    );
}

/// Records every event's `code` field and every span's name and `kind`.
#[derive(Clone, Default)]
struct Capture {
    codes: Arc<Mutex<Vec<u64>>>,
    spans: Arc<Mutex<Vec<String>>>,
}

struct Fields<'a>(&'a mut Vec<(String, String)>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0
            .push((field.name().to_string(), format!("{value:?}")));
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.push((field.name().to_string(), value.to_string()));
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut fields = Vec::new();
        event.record(&mut Fields(&mut fields));
        for (name, value) in fields {
            if let ("code", Ok(code)) = (name.as_str(), value.parse()) {
                self.codes.lock().push(code);
            }
        }
    }

    fn on_new_span(
        &self,
        attributes: &tracing::span::Attributes<'_>,
        _: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = Vec::new();
        attributes.record(&mut Fields(&mut fields));
        for (name, value) in fields {
            if name == "kind" {
                let span = format!("{}:{value}", attributes.metadata().name());
                self.spans.lock().push(span);
            }
        }
    }
}

#[test]
fn each_command_has_a_span_and_a_refusal_carries_its_stable_code() {
    use tracing_subscriber::layer::SubscriberExt;

    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    tracing::subscriber::with_default(subscriber, || {
        let mut harness = Harness::new();
        let refused = harness.call(|reply| Command::Reserve {
            size: 0,
            policy: AllocationPolicy::Allow,
            stream: DEFAULT_STREAM,
            reply,
        });
        assert!(matches!(refused, Err(ServerError::InvalidArgument { .. })));
    });
    assert_eq!(capture.spans.lock().clone(), vec!["command:reserve"]);
    let invalid_argument = u64::from(ErrorCode::InvalidArgument.stable_id());
    assert!(capture.codes.lock().contains(&invalid_argument));
}
