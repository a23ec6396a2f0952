//! The context state machine, driven step by step over the test device: one
//! test per arrow, and the refusals of each state. Every test runs on one
//! thread; a server that waited on an executor would hang here.

use std::time::{Duration, Instant};

use cistern_memory::StreamId;
use cistern_runtime::backend::StreamWork;
use cistern_runtime::sync::TryRecvError;
use cistern_runtime::testing::{Run, TestServer, trap_poison};
use cistern_runtime::{
    AllocationPolicy, BufferRef, Command, ContextState, DEFAULT_DRAIN_TIMEOUT, DEFAULT_STREAM,
    ErrorCode, EventId, FailureToken, KernelLaunch, Region, ServerError, StridedCopy,
};

fn unit<T>(result: Result<T, ServerError>) -> Result<(), ServerError> {
    result.map(|_| ())
}

fn region(buffer: BufferRef, offset: u64) -> Region {
    Region {
        buffer,
        offset,
        size: 4,
    }
}

/// Sends every command that touches the device or its memory and returns
/// what each answered (a launch through its token).
fn every_entry_point(
    harness: &mut TestServer,
    buffer: BufferRef,
) -> Vec<(&'static str, Result<(), ServerError>)> {
    let stream = DEFAULT_STREAM;
    let mut answers = vec![
        (
            "reserve",
            unit(harness.call(|reply| Command::Reserve {
                size: 64,
                policy: AllocationPolicy::Allow,
                stream,
                reply,
            })),
        ),
        ("write", harness.write(buffer, vec![0; 4])),
        (
            "read",
            unit(harness.call(|reply| Command::Read {
                stream,
                source: region(buffer, 0),
                reply,
            })),
        ),
        (
            "copy",
            harness.call(|reply| Command::Copy {
                stream,
                source: Box::new(region(buffer, 0)),
                target: Box::new(region(buffer, 4)),
                reply,
            }),
        ),
    ];
    let strided = StridedCopy {
        source: buffer,
        source_offset: 0,
        source_strides: vec![1],
        target: buffer,
        target_offset: 16,
        target_strides: vec![1],
        shape: vec![2],
        element_size: 4,
    };
    answers.push((
        "strided_copy",
        harness.call(|reply| Command::StridedCopy {
            stream,
            copy: Box::new(strided),
            reply,
        }),
    ));
    for (kind, batch) in [("launch", false), ("launch_batch", true)] {
        let token = FailureToken::new();
        let launch = KernelLaunch::empty();
        let command = if batch {
            Command::LaunchBatch {
                stream,
                launches: vec![launch],
                token: Some(token.clone()),
                requires: Vec::new(),
            }
        } else {
            Command::Launch {
                stream,
                launch,
                token: Some(token.clone()),
            }
        };
        harness.core.handle(command);
        let outcome = match token.check() {
            Some(outcome) => outcome,
            None => Ok(()),
        };
        answers.push((kind, outcome));
    }
    answers.push((
        "create_stream",
        unit(harness.call(|reply| Command::CreateStream { reply })),
    ));
    answers.push((
        "record_event",
        unit(harness.call(|reply| Command::RecordEvent { stream, reply })),
    ));
    answers.push((
        "wait_event",
        harness.call(|reply| Command::WaitEvent {
            stream,
            event: EventId(0),
            reply,
        }),
    ));
    // Pending (queued for the executor) counts as admitted.
    let sync = harness.send(|reply| Command::Sync { stream, reply });
    answers.push(("sync", sync.try_recv().unwrap_or(Ok(()))));
    answers.push((
        "compact",
        unit(harness.call(|reply| Command::Compact { reply })),
    ));
    answers.push((
        "reclaim",
        unit(harness.call(|reply| Command::Reclaim { reply })),
    ));
    answers
}

/// Asserts every entry point was refused with `code` and nothing reached the device.
fn assert_all_refused(harness: &mut TestServer, buffer: BufferRef, code: ErrorCode) {
    let queued = harness.queued_len();
    for (kind, answer) in every_entry_point(harness, buffer) {
        assert_eq!(answer.map_err(|e| e.code()), Err(code), "{kind}");
    }
    assert_eq!(
        harness.queued_len(),
        queued,
        "a refused command queued work"
    );
}

/// Asserts the queries and releases that never touch the device still answer.
fn assert_queries_answer(harness: &mut TestServer, buffer: BufferRef, stream: StreamId) {
    assert!(harness.call(|reply| Command::MemoryStats { reply }).is_ok());
    assert!(
        harness
            .call(|reply| Command::MemorySnapshot { reply })
            .is_ok()
    );
    assert!(harness.call(|reply| Command::ServerStats { reply }).is_ok());
    assert_eq!(
        harness.call(|reply| Command::DestroyStream { stream, reply }),
        Ok(())
    );
    harness.core.handle(Command::Free { buffer });
}

/// Poisons the harness, invalidates, runs the drain and the probe; returns
/// the invalidate's answer.
fn recover(harness: &mut TestServer) -> Result<ContextState, ServerError> {
    let seen = harness.state().generation();
    let answer = harness.invalidate(seen);
    harness.run_normally();
    match answer.try_recv() {
        Ok(result) => result,
        Err(error) => panic!("the invalidate was answered: {error:?}"),
    }
}

#[test]
fn a_sticky_fault_moves_an_active_context_to_poisoned() {
    let mut harness = TestServer::new();
    assert_eq!(harness.state(), ContextState::Active { generation: 0 });
    harness.report_fault(0);
    assert_eq!(
        harness.state(),
        ContextState::Poisoned {
            generation: 0,
            poison: trap_poison(0)
        }
    );
}

#[test]
fn an_operation_local_failure_never_poisons() {
    let mut harness = TestServer::new();
    let buffer = harness.reserve(64);
    let too_long = harness.write(buffer, vec![0; 128]);
    assert_eq!(
        too_long.map_err(|e| e.code()),
        Err(ErrorCode::InvalidArgument)
    );
    let huge = harness.call(|reply| Command::Reserve {
        size: 1 << 40,
        policy: AllocationPolicy::Allow,
        stream: DEFAULT_STREAM,
        reply,
    });
    assert!(huge.is_err());
    assert_eq!(harness.state(), ContextState::Active { generation: 0 });
}

#[test]
fn a_poisoned_context_refuses_every_entry_point_and_touches_nothing() {
    let mut harness = TestServer::new();
    let buffer = harness.reserve(64);
    let stream = harness.create_stream();
    harness.poison();
    assert_all_refused(&mut harness, buffer, ErrorCode::DevicePoisoned);
    assert_queries_answer(&mut harness, buffer, stream);
    assert!(harness.state().is_poisoned());
}

#[test]
fn an_invalidate_of_an_active_context_changes_nothing() {
    let mut harness = TestServer::new();
    let answer = harness.invalidate(0);
    assert_eq!(
        answer.try_recv().ok(),
        Some(Ok(ContextState::Active { generation: 0 }))
    );
    assert_eq!(harness.queued_len(), 0);
    assert!(harness.device.reset_generations().is_empty());
}

#[test]
fn an_invalidate_naming_another_generation_changes_nothing() {
    let mut harness = TestServer::new();
    harness.poison();
    let answer = harness.invalidate(7);
    assert!(matches!(
        answer.try_recv(),
        Ok(Ok(ContextState::Poisoned { generation: 0, .. }))
    ));
    assert_eq!(harness.queued_len(), 0);
    assert!(harness.state().is_poisoned());
}

#[test]
fn invalidate_moves_poisoned_to_retiring_and_queues_a_drain_marker_on_every_stream() {
    let mut harness = TestServer::new();
    let other = harness.create_stream();
    harness.poison();
    let answer = harness.invalidate(0);
    assert_eq!(harness.state(), ContextState::Retiring { generation: 0 });
    assert!(matches!(answer.try_recv(), Err(TryRecvError::Empty)));
    let markers: Vec<StreamId> = harness
        .take_queued()
        .into_iter()
        .filter_map(|(stream, _, work)| matches!(work, StreamWork::Sync { .. }).then_some(stream))
        .collect();
    assert_eq!(markers, vec![DEFAULT_STREAM, other]);
}

#[test]
fn a_retiring_context_refuses_every_entry_point_with_the_transient_retiring_error() {
    let mut harness = TestServer::new();
    let buffer = harness.reserve(64);
    let stream = harness.create_stream();
    harness.poison();
    let _answer = harness.invalidate(0);
    assert_all_refused(&mut harness, buffer, ErrorCode::ContextBusy);
    let sync = harness.call(|reply| Command::Sync {
        stream: DEFAULT_STREAM,
        reply,
    });
    assert!(sync.is_err_and(|e| e.is_transient()));
    assert_queries_answer(&mut harness, buffer, stream);
}

#[test]
fn a_drained_and_probed_context_becomes_active_in_the_next_generation() {
    let mut harness = TestServer::new();
    let old = harness.reserve(1024);
    harness.poison();
    let in_use_before = harness.core.memory().stats();
    assert!(in_use_before.in_use_bytes >= 1024);
    assert_eq!(
        recover(&mut harness),
        Ok(ContextState::Active { generation: 1 })
    );
    assert_eq!(harness.state(), ContextState::Active { generation: 1 });
    // The backend cleared its sticky state for the new generation, once.
    assert_eq!(harness.device.reset_generations(), vec![1]);
    // The probe ran the identity kernel for real on the test device.
    assert_eq!(
        harness.device.kernels_run(),
        vec![cistern_runtime::Kernel::Identity]
    );
    // The old generation's memory is gone: only the probe's may linger until freed.
    assert!(harness.core.memory().stats().in_use_bytes <= 256);
    // An old handle is stale and reaches nothing; a fresh one works.
    let queued = harness.queued_len();
    let stale = harness.write(old, vec![0; 4]);
    assert_eq!(
        stale,
        Err(ServerError::StaleGeneration {
            ordinal: 0,
            resource_generation: 0,
            current_generation: 1
        })
    );
    assert_eq!(harness.queued_len(), queued);
    let fresh = harness.reserve(64);
    assert_eq!(fresh.generation, 1);
    assert_eq!(harness.write(fresh, vec![1; 64]), Ok(()));
}

#[test]
fn a_stale_handle_is_refused_by_every_entry_point_that_names_one() {
    let mut harness = TestServer::new();
    let old = harness.reserve(64);
    harness.poison();
    assert!(recover(&mut harness).is_ok());
    let queued = harness.queued_len();
    for (kind, answer) in every_entry_point(&mut harness, old) {
        let names_a_handle = matches!(kind, "write" | "read" | "copy" | "strided_copy");
        if names_a_handle {
            assert_eq!(
                answer.map_err(|e| e.code()),
                Err(ErrorCode::StaleHandle),
                "{kind}"
            );
        }
    }
    // Only work that names no handle (the launches of `Empty`, the event, the sync) was queued.
    let queued_now = harness.take_queued();
    assert!(queued_now.len() > queued);
    assert!(queued_now.iter().all(|(_, _, work)| !matches!(
        work,
        StreamWork::Write { .. }
            | StreamWork::Read { .. }
            | StreamWork::Copy { .. }
            | StreamWork::StridedCopy { .. }
    )));
}

#[test]
fn invalidates_during_a_recovery_share_its_outcome() {
    let mut harness = TestServer::new();
    harness.poison();
    let first = harness.invalidate(0);
    let second = harness.invalidate(0);
    let late = harness.invalidate(5);
    harness.run_normally();
    for answer in [first, second, late] {
        assert_eq!(
            answer.try_recv().ok(),
            Some(Ok(ContextState::Active { generation: 1 }))
        );
    }
    assert_eq!(harness.device.reset_generations(), vec![1]);
}

#[test]
fn a_late_invalidate_after_recovery_changes_nothing() {
    let mut harness = TestServer::new();
    harness.poison();
    assert!(recover(&mut harness).is_ok());
    let late = harness.invalidate(0);
    assert_eq!(
        late.try_recv().ok(),
        Some(Ok(ContextState::Active { generation: 1 }))
    );
    assert_eq!(harness.queued_len(), 0);
    assert_eq!(harness.device.reset_generations(), vec![1]);
}

#[test]
fn frees_of_old_handles_after_recovery_are_ignored() {
    let mut harness = TestServer::new();
    let old = harness.reserve(64);
    harness.poison();
    assert!(recover(&mut harness).is_ok());
    let fresh = harness.reserve(64);
    let before = harness.core.memory().stats();
    harness.core.handle(Command::Free { buffer: old });
    harness.core.handle(Command::Free { buffer: old });
    assert_eq!(
        harness.core.memory().stats().in_use_bytes,
        before.in_use_bytes
    );
    assert_eq!(harness.write(fresh, vec![3; 64]), Ok(()));
}

#[test]
fn a_fault_reported_while_retiring_does_not_poison_the_recovered_context() {
    let mut harness = TestServer::new();
    harness.poison();
    let answer = harness.invalidate(0);
    // A late report of the old generation's fault, seen during the drain.
    harness.report_fault(0);
    harness.run_normally();
    assert_eq!(
        answer.try_recv().ok(),
        Some(Ok(ContextState::Active { generation: 1 }))
    );
    assert_eq!(harness.state(), ContextState::Active { generation: 1 });
}

#[test]
fn a_drain_past_its_bound_ends_unrecoverable() {
    let mut harness = TestServer::new();
    harness.poison();
    let answer = harness.invalidate(0);
    harness.run(&Run::HoldSyncs);
    // Before the bound nothing changes, however often the server ticks.
    harness.core.tick(Instant::now());
    assert_eq!(harness.state(), ContextState::Retiring { generation: 0 });
    harness
        .core
        .tick(Instant::now() + DEFAULT_DRAIN_TIMEOUT + Duration::from_secs(1));
    assert!(harness.state().is_unrecoverable());
    assert!(matches!(
        answer.try_recv(),
        Ok(Err(ServerError::ContextUnrecoverable { ordinal: 0, .. }))
    ));
    // A marker answered after the end changes nothing.
    for held in harness.device.take_held_syncs() {
        let _ = held.send(Ok(()));
    }
    harness.core.tick(Instant::now());
    assert!(harness.state().is_unrecoverable());
    assert!(harness.device.reset_generations().is_empty());
}

#[test]
fn a_configured_drain_bound_is_the_one_used() {
    let mut harness = TestServer::with_drain_timeout(Duration::from_millis(10));
    harness.poison();
    let _answer = harness.invalidate(0);
    harness.run(&Run::HoldSyncs);
    harness
        .core
        .tick(Instant::now() + Duration::from_millis(50));
    assert!(harness.state().is_unrecoverable());
}

#[test]
fn a_lost_drain_marker_ends_unrecoverable() {
    let mut harness = TestServer::new();
    harness.poison();
    let answer = harness.invalidate(0);
    harness.run(&Run::LoseSyncs);
    let Ok(Err(ServerError::ContextUnrecoverable { probe_error, .. })) = answer.try_recv() else {
        panic!("a lost marker ends the recovery unrecoverable");
    };
    assert!(probe_error.contains("drain"), "{probe_error}");
}

#[test]
fn a_failed_sync_after_the_drain_ends_unrecoverable() {
    let mut harness = TestServer::new();
    harness
        .device
        .fail_resets_with(Some(ServerError::TransferFailed {
            message: "synchronize failed".into(),
        }));
    harness.poison();
    let answer = harness.invalidate(0);
    harness.run_normally();
    let Ok(Err(ServerError::ContextUnrecoverable { probe_error, .. })) = answer.try_recv() else {
        panic!("a failed sync ends the recovery unrecoverable");
    };
    assert!(probe_error.contains("synchronize failed"), "{probe_error}");
}

#[test]
fn an_unrecoverable_context_refuses_every_call_and_every_invalidate() {
    let mut harness = TestServer::new();
    let buffer = harness.reserve(64);
    let stream = harness.create_stream();
    harness.poison();
    let _answer = harness.invalidate(0);
    harness.run(&Run::LoseSyncs);
    assert!(harness.state().is_unrecoverable());
    assert_all_refused(&mut harness, buffer, ErrorCode::DeviceLost);
    for seen in [0, 1] {
        let again = harness.invalidate(seen);
        assert!(matches!(
            again.try_recv(),
            Ok(Err(ServerError::ContextUnrecoverable { .. }))
        ));
    }
    assert_queries_answer(&mut harness, buffer, stream);
    assert_eq!(harness.queued_len(), 0);
}

#[test]
fn a_launch_refused_while_retiring_is_not_latched_on_its_stream() {
    let mut harness = TestServer::new();
    harness.poison();
    let answer = harness.invalidate(0);
    let token = FailureToken::new();
    harness.core.handle(Command::Launch {
        stream: DEFAULT_STREAM,
        launch: KernelLaunch::empty(),
        token: Some(token.clone()),
    });
    assert_eq!(
        token.check().map(|outcome| outcome.map_err(|e| e.code())),
        Some(Err(ErrorCode::ContextBusy))
    );
    harness.run_normally();
    assert!(answer.try_recv().is_ok_and(|result| result.is_ok()));
    // The first sync of the new generation finds no stale latch.
    let sync = harness.send(|reply| Command::Sync {
        stream: DEFAULT_STREAM,
        reply,
    });
    assert!(
        harness
            .take_queued()
            .iter()
            .all(|(_, _, work)| !matches!(work, StreamWork::Fail { .. }))
    );
    drop(sync);
}

/// Runs `stream`'s queued work on the device, delivering completions and
/// letting the server step after each item, until nothing of it is left.
fn run_stream(harness: &mut TestServer, stream: StreamId) {
    while harness.device.busy_streams().contains(&stream) {
        harness.device.run_next(stream, &Run::Normal);
        harness.device.deliver(usize::MAX);
        harness.core.tick(Instant::now());
    }
}

#[test]
fn a_read_queued_on_a_stream_destroyed_before_an_invalidate_never_answers_bytes_after_the_reset() {
    let mut harness = TestServer::new();
    let other = harness.create_stream();
    let buffer = harness.reserve_on(64, other);
    let write = harness.call(|reply| Command::Write {
        stream: other,
        target: Region {
            buffer,
            offset: 0,
            size: 64,
        },
        data: vec![7; 64].into(),
        reply,
    });
    assert_eq!(write, Ok(()));
    harness.launch(other, KernelLaunch::trap(), None);
    let read = harness.send(|reply| Command::Read {
        stream: other,
        source: Region {
            buffer,
            offset: 0,
            size: 64,
        },
        reply,
    });
    // The write and the trap run; the read stays queued behind them.
    harness.device.run_next(other, &Run::Normal);
    harness.device.run_next(other, &Run::Normal);
    assert!(harness.state().is_poisoned());
    let destroyed = harness.call(|reply| Command::DestroyStream {
        stream: other,
        reply,
    });
    assert_eq!(destroyed, Ok(()));
    let answer = harness.invalidate(0);
    // The default stream drains first: the recovery must still wait for the
    // work queued on the stream it no longer knows.
    run_stream(&mut harness, DEFAULT_STREAM);
    assert_eq!(harness.state(), ContextState::Retiring { generation: 0 });
    assert!(harness.device.reset_generations().is_empty());
    harness.run_normally();
    assert_eq!(
        read.try_recv().ok(),
        Some(Err(ServerError::ContextPoisoned(trap_poison(0))))
    );
    assert_eq!(
        answer.try_recv().ok(),
        Some(Ok(ContextState::Active { generation: 1 }))
    );
}
