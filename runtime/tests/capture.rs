//! Graph capture and replay, driven step by step over the test device: what
//! the server queues (nothing while recording, one batch per replay), what
//! it refuses, and how a graph holds memory. Every test runs on one thread.

use cistern_memory::{SliceUse, StreamId};
use cistern_runtime::backend::StreamWork;
use cistern_runtime::testing::TestServer;
use cistern_runtime::{
    AllocationPolicy, Binding, BufferRef, CaptureId, Command, ContextState, DEFAULT_STREAM,
    ErrorCode, FailureToken, FaultPlan, GraphInfo, Kernel, KernelLaunch, MapOp, Region,
    ServerError,
};

fn begin(harness: &mut TestServer, stream: StreamId) -> CaptureId {
    match harness.call(|reply| Command::BeginCapture { stream, reply }) {
        Ok(capture) => capture,
        Err(error) => panic!("begin_capture failed: {error}"),
    }
}

fn record(
    harness: &mut TestServer,
    capture: CaptureId,
    launches: Vec<KernelLaunch>,
) -> Result<(), ServerError> {
    harness.call(|reply| Command::CaptureLaunch {
        capture,
        launches,
        reply,
    })
}

fn end(harness: &mut TestServer, capture: CaptureId) -> GraphInfo {
    match harness.call(|reply| Command::EndCapture { capture, reply }) {
        Ok(info) => info,
        Err(error) => panic!("end_capture failed: {error}"),
    }
}

fn whole(buffer: BufferRef, size: u64) -> Binding {
    Binding {
        buffer,
        offset: 0,
        size,
    }
}

fn replay(harness: &mut TestServer, stream: StreamId, info: &GraphInfo) -> FailureToken {
    let token = FailureToken::new();
    harness.core.handle(Command::Replay {
        stream,
        graph: info.graph,
        token: Some(token.clone()),
    });
    token
}

#[test]
fn while_capturing_other_work_is_refused_transiently_and_nothing_is_queued() {
    let mut harness = TestServer::new();
    let buffer = harness.reserve(64);
    let other = harness.create_stream();
    let capture = begin(&mut harness, DEFAULT_STREAM);
    assert_eq!(
        harness.state(),
        ContextState::Capturing {
            generation: 0,
            stream: DEFAULT_STREAM
        }
    );
    let region = Region {
        buffer,
        offset: 0,
        size: 4,
    };
    let token = FailureToken::new();
    harness.core.handle(Command::Launch {
        stream: other,
        launch: KernelLaunch::fill(whole(buffer, 64), 1.0),
        token: Some(token.clone()),
    });
    let answers = [
        token.check().unwrap_or(Ok(())),
        harness
            .call(|reply| Command::Reserve {
                size: 64,
                policy: AllocationPolicy::Allow,
                stream: DEFAULT_STREAM,
                reply,
            })
            .map(|_| ()),
        harness.write(buffer, vec![0; 4]),
        harness.call(|reply| Command::Copy {
            stream: other,
            source: Box::new(region),
            target: Box::new(Region {
                offset: 8,
                ..region
            }),
            reply,
        }),
        harness
            .call(|reply| Command::CreateStream { reply })
            .map(|_| ()),
        harness
            .call(|reply| Command::RecordEvent {
                stream: other,
                reply,
            })
            .map(|_| ()),
        harness.call(|reply| Command::Compact { reply }).map(|_| ()),
        harness.call(|reply| Command::Reclaim { reply }).map(|_| ()),
        harness
            .call(|reply| Command::BeginCapture {
                stream: other,
                reply,
            })
            .map(|_| ()),
    ];
    let sync = harness.send(|reply| Command::Sync {
        stream: DEFAULT_STREAM,
        reply,
    });
    for answer in answers
        .into_iter()
        .chain([sync.try_recv().unwrap_or(Ok(()))])
    {
        assert_eq!(answer, Err(ServerError::CaptureInProgress { ordinal: 0 }));
    }
    assert_eq!(harness.queued_len(), 0, "nothing reached the device");
    assert!(harness.state().is_capturing(), "nothing changed the state");
    harness.core.handle(Command::AbortCapture { capture });
    assert_eq!(harness.state(), ContextState::Active { generation: 0 });
    assert!(harness.write(buffer, vec![0; 4]).is_ok());
}

fn doubling() -> Kernel {
    Kernel::map(MapOp::Scale, &[2.0])
}

#[test]
fn a_replay_queues_one_batch_and_the_fault_plan_counts_its_launches() {
    // The graph's own list is marked recorded (CUDA captures it into a CUDA
    // graph); the copy the fault plan changed is not.
    let mut harness = TestServer::with_faults(FaultPlan::none().with_trap_at_launch(5));
    let buffer = harness.reserve(64);
    let capture = begin(&mut harness, DEFAULT_STREAM);
    let scale = KernelLaunch::scale(whole(buffer, 64), 2.0);
    let launches = vec![scale.clone(), KernelLaunch::empty(), scale];
    assert_eq!(record(&mut harness, capture, launches), Ok(()));
    let info = end(&mut harness, capture);
    assert_eq!((info.launches, info.allocations), (3, 1));
    assert_eq!(harness.queued_len(), 0, "recording runs nothing");
    let other = harness.create_stream();
    replay(&mut harness, DEFAULT_STREAM, &info);
    replay(&mut harness, other, &info);
    let mut queued = harness.take_queued();
    // Both replays write the buffer: the second stream's waits for the first's.
    let wait = queued.remove(1);
    assert!(
        matches!(wait, (stream, _, StreamWork::WaitStream { stream: first, sequence: 1 })
            if stream == other && first == DEFAULT_STREAM),
        "{wait:?}"
    );
    let kernels: Vec<(StreamId, Vec<Kernel>, bool)> = queued
        .iter()
        .map(|(stream, _, work)| match work {
            StreamWork::Batch { launches, .. } => (
                *stream,
                launches
                    .iter()
                    .map(|launch| launch.kernel.clone())
                    .collect(),
                launches.is_recorded(),
            ),
            other => panic!("a replay is one batch, got {other:?}"),
        })
        .collect();
    assert_eq!(
        kernels,
        vec![
            (
                DEFAULT_STREAM,
                vec![doubling(), Kernel::Empty, doubling()],
                true
            ),
            (other, vec![doubling(), Kernel::Trap, doubling()], false),
        ]
    );
    assert_eq!(harness.core.stats().replays, 2);
}

#[test]
fn a_free_of_a_held_allocation_waits_for_the_graph_release() {
    let mut harness = TestServer::new();
    let used = harness.reserve(64);
    let capture = begin(&mut harness, DEFAULT_STREAM);
    let made = harness.call(|reply| Command::CaptureReserve {
        capture,
        size: 64,
        reply,
    });
    let made = match made {
        Ok(reservation) => reservation.buffer,
        Err(error) => panic!("a warmed reservation fits: {error}"),
    };
    let copy = KernelLaunch::copy(whole(used, 64), whole(made, 64));
    assert_eq!(record(&mut harness, capture, vec![copy]), Ok(()));
    let info = end(&mut harness, capture);
    assert_eq!(info.allocations, 2);
    let live = |harness: &TestServer| harness.core.memory().stats().live_allocations;
    let pinned = |harness: &TestServer| {
        let snapshot = harness.core.memory().snapshot();
        snapshot
            .pages
            .iter()
            .flat_map(|page| &page.slices)
            .filter(|slice| matches!(slice.state, SliceUse::Allocated { pinned: true, .. }))
            .count()
    };
    assert_eq!(pinned(&harness), 2);
    harness.core.handle(Command::Free { buffer: used });
    harness.core.handle(Command::Free { buffer: made });
    assert_eq!(live(&harness), 2, "the graph holds both");
    replay(&mut harness, DEFAULT_STREAM, &info);
    harness.run_normally();
    harness
        .core
        .handle(Command::ReleaseGraph { graph: info.graph });
    assert_eq!(live(&harness), 0, "released with the graph");
    assert_eq!(pinned(&harness), 0);
    let released = replay(&mut harness, DEFAULT_STREAM, &info).check();
    assert!(matches!(
        released,
        Some(Err(ServerError::InvalidArgument { .. }))
    ));
}

#[test]
fn a_capture_reservation_never_adds_a_page() {
    let mut harness = TestServer::new();
    let capture = begin(&mut harness, DEFAULT_STREAM);
    let cold = harness.call(|reply| Command::CaptureReserve {
        capture,
        size: 64,
        reply,
    });
    assert_eq!(
        cold.map(|_| ()).map_err(|error| error.code()),
        Err(ErrorCode::AllocationForbidden)
    );
    assert_eq!(harness.core.memory().stats().storage_allocs, 0);
    assert!(harness.state().is_capturing(), "an operation-local refusal");
}

#[test]
fn commands_through_an_ended_capture_are_invalid_arguments() {
    let mut harness = TestServer::new();
    let capture = begin(&mut harness, DEFAULT_STREAM);
    let _ = end(&mut harness, capture);
    let late = record(&mut harness, capture, vec![KernelLaunch::empty()]);
    assert!(matches!(late, Err(ServerError::InvalidArgument { .. })));
    let again = harness.call(|reply| Command::EndCapture { capture, reply });
    assert!(matches!(again, Err(ServerError::InvalidArgument { .. })));
    // A late abort (a guard dropped after its capture ended) changes nothing.
    let next = begin(&mut harness, DEFAULT_STREAM);
    harness.core.handle(Command::AbortCapture { capture });
    assert!(harness.state().is_capturing());
    assert_eq!(
        record(&mut harness, next, vec![KernelLaunch::empty()]),
        Ok(())
    );
}

#[test]
fn a_bad_launch_is_refused_when_recorded_and_nothing_of_its_batch_is_kept() {
    let mut harness = TestServer::new();
    let buffer = harness.reserve(64);
    let capture = begin(&mut harness, DEFAULT_STREAM);
    let past_the_end = Binding {
        buffer,
        offset: 32,
        size: 64,
    };
    let batch = vec![KernelLaunch::empty(), KernelLaunch::fill(past_the_end, 1.0)];
    let refused = record(&mut harness, capture, batch);
    assert!(matches!(refused, Err(ServerError::InvalidProgram { .. })));
    assert!(
        harness.state().is_capturing(),
        "a refused recording keeps capturing"
    );
    let info = end(&mut harness, capture);
    assert_eq!((info.launches, info.allocations), (0, 0));
}

#[test]
fn a_capture_a_fault_and_a_recovery_ended_is_refused_as_stale() {
    let mut harness = TestServer::new();
    let capture = begin(&mut harness, DEFAULT_STREAM);
    harness.report_fault(0);
    // Another client recovers before the capturing one calls again.
    let answer = harness.invalidate(0);
    harness.run_normally();
    assert!(matches!(
        answer.try_recv(),
        Ok(Ok(ContextState::Active { generation: 1 }))
    ));
    let late = record(&mut harness, capture, vec![KernelLaunch::empty()]);
    assert!(
        matches!(
            late,
            Err(ServerError::StaleGeneration {
                resource_generation: 0,
                current_generation: 1,
                ..
            })
        ),
        "{late:?}"
    );
    let ended = harness.call(|reply| Command::EndCapture { capture, reply });
    assert_eq!(
        ended.map(|_| ()).map_err(|e| e.code()),
        Err(ErrorCode::StaleHandle)
    );
    // A capture of the new generation that ended is still an invalid argument.
    let fresh = begin(&mut harness, DEFAULT_STREAM);
    let _ = end(&mut harness, fresh);
    let after = record(&mut harness, fresh, vec![KernelLaunch::empty()]);
    assert!(matches!(after, Err(ServerError::InvalidArgument { .. })));
}

#[test]
fn a_fault_while_capturing_poisons_and_an_abort_leaves_it_poisoned() {
    let mut harness = TestServer::new();
    let capture = begin(&mut harness, DEFAULT_STREAM);
    harness.report_fault(0);
    assert!(harness.state().is_poisoned());
    let recorded = record(&mut harness, capture, vec![KernelLaunch::empty()]);
    assert!(matches!(recorded, Err(ServerError::ContextPoisoned(_))));
    harness.core.handle(Command::AbortCapture { capture });
    assert!(harness.state().is_poisoned());
}
