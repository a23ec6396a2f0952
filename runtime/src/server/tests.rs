//! `ServerCore` driven step by step over the test device, whose queue runs
//! nothing until the test says so. Every test runs on one thread: a core
//! that waited on an executor would hang here.

use std::sync::Arc;

use cistern_memory::{AllocationPolicy, SliceUse, StreamId};

use crate::backend::{Completion, StreamWork};
use crate::command::{Command, StridedCopy};
use crate::context_state::ContextState;
use crate::error::ServerError;
use crate::failure::FailureToken;
use crate::ids::{BufferRef, DEFAULT_STREAM, Region, ServerId};
use crate::kernel::{Binding, KernelLaunch};
use crate::sync::{Mutex, TryRecvError};
use crate::testing::{QueuedWork, TestOptions, TestServer, trap_poison};
use cistern_memory::ErrorCode;

/// A server whose device declines strided copies of more than two dimensions.
fn new_server() -> TestServer {
    TestServer::started(TestOptions {
        max_strided_dims: Some(2),
        ..TestOptions::default()
    })
}

/// The next queued work item.
fn next_work(harness: &TestServer) -> QueuedWork {
    match harness.device.take_next() {
        Some(item) => item,
        None => panic!("no work queued"),
    }
}

/// Reports that `stream` ran everything up to `sequence`.
fn complete(harness: &TestServer, stream: StreamId, sequence: u64) {
    harness.device.report(Completion {
        stream,
        sequence,
        fault: None,
    });
}

/// The page and offset of a live allocation's slice.
fn offset_of(
    harness: &TestServer,
    buffer: BufferRef,
) -> Option<(Option<cistern_memory::StorageId>, u64)> {
    let snapshot = harness.core.memory().snapshot();
    snapshot.pages.iter().find_map(|page| {
        page.slices.iter().find_map(|slice| match slice.state {
            SliceUse::Allocated { id, .. } if id == buffer.id => Some((page.storage, slice.offset)),
            _ => None,
        })
    })
}

fn whole(buffer: BufferRef, size: u64) -> Binding {
    Binding {
        buffer,
        offset: 0,
        size,
    }
}

#[test]
fn a_sync_is_answered_by_the_executor_not_the_server() {
    let mut harness = new_server();
    let answer = harness.send(|reply| Command::Sync {
        stream: DEFAULT_STREAM,
        reply,
    });
    assert!(matches!(answer.try_recv(), Err(TryRecvError::Empty)));
    let (stream, _, work) = next_work(&harness);
    assert_eq!(stream, DEFAULT_STREAM);
    let StreamWork::Sync { reply } = work else {
        panic!("a sync marker is queued, got {work:?}");
    };
    assert!(reply.send(Ok(())).is_ok());
    assert!(matches!(answer.try_recv(), Ok(Ok(()))));
}

#[test]
fn the_server_keeps_answering_while_stream_work_is_pending() {
    let mut harness = new_server();
    let buffer = harness.reserve(1024);
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
    let second = harness.reserve(512);
    assert_ne!(second.id, buffer.id);
    assert!(harness.call(|reply| Command::MemoryStats { reply }).is_ok());
    assert!(harness.call(|reply| Command::ServerStats { reply }).is_ok());
    assert!(matches!(sync.try_recv(), Err(TryRecvError::Empty)));
    assert_eq!(harness.queued_len(), 2);
}

#[test]
fn freed_memory_is_reused_at_once_on_the_stream_that_used_it() {
    let mut harness = new_server();
    let first = harness.reserve(1024);
    let place = offset_of(&harness, first);
    harness.launch(
        DEFAULT_STREAM,
        KernelLaunch::fill(whole(first, 1024), 1.0),
        None,
    );
    harness.free(first);
    let second = harness.reserve(1024);
    assert_eq!(offset_of(&harness, second), place);
}

#[test]
fn freed_memory_is_reused_by_another_stream_only_after_the_user_completes() {
    let mut harness = new_server();
    let other = harness.create_stream();
    let first = harness.reserve(1024);
    let place = offset_of(&harness, first);
    harness.launch(
        DEFAULT_STREAM,
        KernelLaunch::fill(whole(first, 1024), 1.0),
        None,
    );
    let (_, sequence, _) = next_work(&harness);
    harness.free(first);
    let early = harness.reserve_on(1024, other);
    assert_ne!(offset_of(&harness, early), place);
    complete(&harness, DEFAULT_STREAM, sequence);
    let late = harness.reserve_on(1024, other);
    assert_eq!(offset_of(&harness, late), place);
}

#[test]
fn a_fault_reported_by_an_executor_poisons_every_later_command() {
    let mut harness = new_server();
    harness.device.report(Completion {
        stream: DEFAULT_STREAM,
        sequence: 1,
        fault: Some(trap_poison(0)),
    });
    let reserve = harness.call(|reply| Command::Reserve {
        size: 64,
        policy: AllocationPolicy::Allow,
        stream: DEFAULT_STREAM,
        reply,
    });
    assert_eq!(reserve, Err(ServerError::ContextPoisoned(trap_poison(0))));
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
    let mut harness = new_server();
    let buffer = harness.reserve(64);
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
    let (_, _, work) = next_work(&harness);
    assert!(matches!(
        work,
        StreamWork::Fail { error } if matches!(*error, ServerError::InvalidProgram { .. })
    ));
}

#[test]
fn a_batch_with_one_bad_launch_queues_none_of_it() {
    let mut harness = new_server();
    let buffer = harness.reserve(64);
    let token = FailureToken::new();
    harness.core.handle(Command::LaunchBatch {
        stream: DEFAULT_STREAM,
        launches: vec![
            KernelLaunch::fill(whole(buffer, 64), 1.0),
            KernelLaunch::fill(whole(buffer, 65), 1.0),
        ],
        token: Some(token.clone()),
        requires: Vec::new(),
    });
    assert!(token.is_failed());
    let (_, _, work) = next_work(&harness);
    assert!(matches!(work, StreamWork::Fail { .. }));
    assert_eq!(harness.queued_len(), 0);
}

#[test]
fn a_good_batch_is_queued_as_one_item() {
    let mut harness = new_server();
    let buffer = harness.reserve(64);
    harness.core.handle(Command::LaunchBatch {
        stream: DEFAULT_STREAM,
        launches: vec![
            KernelLaunch::fill(whole(buffer, 64), 1.0),
            KernelLaunch::empty(),
        ],
        token: None,
        requires: Vec::new(),
    });
    let (_, _, work) = next_work(&harness);
    assert!(matches!(work, StreamWork::Batch { ref launches, .. }
        if launches.len() == 2 && !launches.is_recorded()));
}

#[test]
fn a_handle_of_another_server_or_generation_is_refused() {
    let mut harness = new_server();
    let buffer = harness.reserve(64);
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
    let write = |harness: &mut TestServer, buffer| {
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
    let mut harness = new_server();
    let buffer = harness.reserve(64);
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
    let mut harness = new_server();
    let source = harness.reserve(64);
    let target = harness.reserve(64);
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
    let mut harness = new_server();
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
    let mut harness = new_server();
    let buffer = harness.reserve(64);
    harness.launch(DEFAULT_STREAM, KernelLaunch::empty(), None);
    harness.launch(
        DEFAULT_STREAM,
        KernelLaunch::fill(whole(buffer, 64), 2.0),
        None,
    );
    let sequences: Vec<u64> = (0..2).map(|_| next_work(&harness).1).collect();
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
        let mut harness = new_server();
        // Other tests of this binary hit the same callsites on other
        // threads with no subscriber; one that registers a callsite while
        // this dispatcher is being made, or while the cache is rebuilt,
        // may cache "never" for it. A command without a span would miss
        // it every time; a raced cache misses it once.
        for _ in 0..5 {
            tracing::callsite::rebuild_interest_cache();
            capture.spans.lock().clear();
            let refused = harness.call(|reply| Command::Reserve {
                size: 0,
                policy: AllocationPolicy::Allow,
                stream: DEFAULT_STREAM,
                reply,
            });
            assert!(matches!(refused, Err(ServerError::InvalidArgument { .. })));
            if !capture.spans.lock().is_empty() {
                break;
            }
        }
    });
    assert_eq!(capture.spans.lock().clone(), vec!["command:reserve"]);
    let invalid_argument = u64::from(ErrorCode::InvalidArgument.stable_id());
    assert!(capture.codes.lock().contains(&invalid_argument));
}

#[test]
fn an_upload_used_at_once_on_another_stream_is_queued_behind_a_wait_for_it() {
    let mut harness = new_server();
    let buffer = harness.reserve(64);
    let other = harness.create_stream();
    assert_eq!(harness.write(buffer, vec![1; 64]), Ok(()));
    harness.launch(other, KernelLaunch::scale(whole(buffer, 64), 2.0), None);
    let queued = harness.take_queued();
    assert!(matches!(
        queued[0],
        (DEFAULT_STREAM, 1, StreamWork::Write { .. })
    ));
    assert!(
        matches!(
            queued[1],
            (stream, 1, StreamWork::WaitStream { stream: waited, sequence: 1 })
                if stream == other && waited == DEFAULT_STREAM
        ),
        "{:?}",
        queued[1]
    );
    assert!(matches!(queued[2], (stream, 2, StreamWork::Launch { .. }) if stream == other));
    assert_eq!(harness.core.stats().ordering_waits, 1);
}

#[test]
fn work_after_the_other_stream_completed_needs_no_wait() {
    let mut harness = new_server();
    let buffer = harness.reserve(64);
    let other = harness.create_stream();
    assert_eq!(harness.write(buffer, vec![1; 64]), Ok(()));
    complete(&harness, DEFAULT_STREAM, 1);
    harness.launch(other, KernelLaunch::scale(whole(buffer, 64), 2.0), None);
    let queued = harness.take_queued();
    assert_eq!(queued.len(), 2, "{queued:?}");
    assert!(matches!(queued[1], (stream, 1, StreamWork::Launch { .. }) if stream == other));
    assert_eq!(harness.core.stats().ordering_waits, 0);
}
