//! The recovery probe's failure paths and the fault plan, driven step by
//! step over the test device.

use std::time::{Duration, Instant};

use cistern_runtime::backend::StreamWork;
use cistern_runtime::testing::{Run, TestServer, trap_poison};
use cistern_runtime::{
    AllocationPolicy, Binding, BufferRef, Command, ContextState, DEFAULT_DRAIN_TIMEOUT,
    DEFAULT_STREAM, ErrorCode, FailureToken, FaultPlan, Kernel, KernelLaunch, MapOp, ProbeFault,
    Region, ServerError,
};

/// Poisons, invalidates and runs the device as `run` says; returns the
/// invalidate's answer.
fn recover_with(harness: &mut TestServer, run: &Run) -> Result<ContextState, ServerError> {
    harness.poison();
    let seen = harness.state().generation();
    let answer = harness.invalidate(seen);
    harness.run(run);
    match answer.try_recv() {
        Ok(result) => result,
        Err(error) => panic!("the invalidate was answered: {error:?}"),
    }
}

fn probe_error(result: Result<ContextState, ServerError>) -> String {
    match result {
        Err(ServerError::ContextUnrecoverable { probe_error, .. }) => probe_error,
        other => panic!("expected an unrecoverable context, got {other:?}"),
    }
}

fn whole(buffer: BufferRef, size: u64) -> Binding {
    Binding {
        buffer,
        offset: 0,
        size,
    }
}

#[test]
fn three_operation_local_probe_failures_end_unrecoverable() {
    let plan = FaultPlan::none().with_probe_faults([ProbeFault::OperationLocal; 3]);
    let mut harness = TestServer::with_faults(plan);
    let error = probe_error(recover_with(&mut harness, &Run::Normal));
    assert!(error.contains("3 times"), "{error}");
    assert!(harness.state().is_unrecoverable());
    assert!(harness.device.kernels_run().is_empty());
}

#[test]
fn two_operation_local_probe_failures_then_a_pass_end_active() {
    let plan = FaultPlan::none().with_probe_faults([ProbeFault::OperationLocal; 2]);
    let mut harness = TestServer::with_faults(plan);
    assert_eq!(
        recover_with(&mut harness, &Run::Normal),
        Ok(ContextState::Active { generation: 1 })
    );
    assert_eq!(harness.device.kernels_run(), vec![Kernel::Identity]);
}

#[test]
fn a_probe_read_that_fails_operation_locally_is_retried_up_to_three_attempts() {
    let mut harness = TestServer::new();
    let failing = Run::FailReads(ServerError::TransferFailed {
        message: "bus reset".into(),
    });
    let error = probe_error(recover_with(&mut harness, &failing));
    assert!(
        error.contains("3 times") && error.contains("bus reset"),
        "{error}"
    );
    // Each attempt ran its kernel before its read failed.
    assert_eq!(harness.device.kernels_run(), vec![Kernel::Identity; 3]);
}

#[test]
fn a_sticky_probe_failure_ends_unrecoverable_without_a_second_attempt() {
    let plan = FaultPlan::none().with_probe_faults([ProbeFault::Sticky]);
    let mut harness = TestServer::with_faults(plan);
    let error = probe_error(recover_with(&mut harness, &Run::Normal));
    assert!(error.contains("kernel"), "{error}");
    assert!(harness.device.kernels_run().is_empty());
    assert!(harness.state().is_unrecoverable());
}

#[test]
fn a_probe_whose_read_answers_a_device_fault_ends_unrecoverable() {
    let mut harness = TestServer::new();
    let poisoned = Run::FailReads(ServerError::ContextPoisoned(trap_poison(1)));
    probe_error(recover_with(&mut harness, &poisoned));
    assert_eq!(harness.device.kernels_run(), vec![Kernel::Identity]);
}

#[test]
fn a_mismatching_probe_ends_unrecoverable() {
    let mut harness = TestServer::new();
    let error = probe_error(recover_with(&mut harness, &Run::CorruptReads));
    assert!(error.contains("wrong"), "{error}");
    assert_eq!(harness.device.kernels_run(), vec![Kernel::Identity]);
}

#[test]
fn an_injected_mismatch_runs_the_wrong_kernel_and_ends_unrecoverable() {
    let plan = FaultPlan::none().with_probe_faults([ProbeFault::Mismatch]);
    let mut harness = TestServer::with_faults(plan);
    let error = probe_error(recover_with(&mut harness, &Run::Normal));
    assert!(error.contains("wrong"), "{error}");
    assert_eq!(
        harness.device.kernels_run(),
        vec![Kernel::map(MapOp::Fill, &[0.0])]
    );
}

#[test]
fn a_probe_past_its_bound_ends_unrecoverable() {
    let mut harness = TestServer::new();
    harness.poison();
    let answer = harness.invalidate(0);
    // Answer only the drain markers: the probe's work stays queued.
    let markers: Vec<_> = harness
        .take_queued()
        .into_iter()
        .filter_map(|(_, _, work)| match work {
            StreamWork::Sync { reply } => Some(reply),
            _ => None,
        })
        .collect();
    for marker in markers {
        assert!(marker.send(Ok(())).is_ok());
    }
    harness.core.tick(Instant::now());
    assert_eq!(harness.state(), ContextState::Retiring { generation: 0 });
    assert!(
        harness.queued_len() >= 3,
        "the probe's write, kernel and read are queued"
    );
    harness
        .core
        .tick(Instant::now() + DEFAULT_DRAIN_TIMEOUT + Duration::from_secs(1));
    let error = probe_error(match answer.try_recv() {
        Ok(result) => result,
        Err(error) => panic!("answered: {error:?}"),
    });
    assert!(error.contains("probe attempt 1"), "{error}");
}

#[test]
fn the_nth_accepted_launch_traps_and_refused_launches_do_not_count() {
    let mut harness = TestServer::with_faults(FaultPlan::none().with_trap_at_launch(2));
    let buffer = harness.reserve(64);
    // Refused (past the end): not executed, not counted.
    harness.core.handle(Command::Launch {
        stream: DEFAULT_STREAM,
        launch: KernelLaunch::fill(whole(buffer, 128), 1.0),
        token: None,
    });
    let tokens: Vec<FailureToken> = (0..3)
        .map(|_| {
            let token = FailureToken::new();
            harness.core.handle(Command::Launch {
                stream: DEFAULT_STREAM,
                launch: KernelLaunch::fill(whole(buffer, 64), 1.0),
                token: Some(token.clone()),
            });
            token
        })
        .collect();
    harness.run_normally();
    assert_eq!(tokens[0].check(), Some(Ok(())));
    assert!(tokens[1].wait().is_err_and(|e| e.is_device_poisoned()));
    assert!(tokens[2].wait().is_err_and(|e| e.is_device_poisoned()));
    assert_eq!(
        harness.device.kernels_run(),
        vec![Kernel::map(MapOp::Fill, &[1.0])]
    );
    assert!(harness.state().is_poisoned());
}

#[test]
fn a_trap_inside_a_batch_poisons_and_no_later_launch_of_the_batch_runs() {
    let mut harness = TestServer::with_faults(FaultPlan::none().with_trap_at_launch(2));
    let token = FailureToken::new();
    harness.core.handle(Command::LaunchBatch {
        stream: DEFAULT_STREAM,
        launches: vec![KernelLaunch::empty(); 3],
        token: Some(token.clone()),
        requires: Vec::new(),
    });
    harness.run_normally();
    assert!(token.wait().is_err_and(|e| e.is_device_poisoned()));
    assert_eq!(harness.device.kernels_run(), vec![Kernel::Empty]);
    assert!(harness.state().is_poisoned());
}

#[test]
fn the_nth_reservation_fails_out_of_memory_without_poisoning() {
    let mut harness = TestServer::with_faults(FaultPlan::none().with_failed_reservation(2));
    harness.reserve(64);
    let second = harness.call(|reply| Command::Reserve {
        size: 64,
        policy: AllocationPolicy::Allow,
        stream: DEFAULT_STREAM,
        reply,
    });
    assert_eq!(
        second.map(|_| ()).map_err(|e| e.code()),
        Err(ErrorCode::DeviceOutOfMemory)
    );
    harness.reserve(64);
    assert_eq!(harness.state(), ContextState::Active { generation: 0 });
}

#[test]
fn the_nth_transfer_fails_without_poisoning_or_touching_the_device() {
    let mut harness = TestServer::with_faults(FaultPlan::none().with_failed_transfer(2));
    let buffer = harness.reserve(64);
    assert_eq!(harness.write(buffer, vec![1; 64]), Ok(()));
    let queued = harness.queued_len();
    let read = harness.call(|reply| Command::Read {
        stream: DEFAULT_STREAM,
        source: Region {
            buffer,
            offset: 0,
            size: 64,
        },
        reply,
    });
    assert!(matches!(read, Err(ServerError::TransferFailed { .. })));
    assert_eq!(harness.queued_len(), queued);
    assert_eq!(harness.write(buffer, vec![2; 64]), Ok(()));
    assert_eq!(harness.state(), ContextState::Active { generation: 0 });
}

/// The indices (from 1) of the launches that trapped, one launch and one
/// recovery at a time.
fn trapped_launches(seed: u64, launches: u64) -> Vec<u64> {
    let mut harness = TestServer::with_faults(FaultPlan::none().with_trap_rate(seed, 0.2));
    let mut trapped = Vec::new();
    for index in 1..=launches {
        let token = FailureToken::new();
        harness.core.handle(Command::Launch {
            stream: DEFAULT_STREAM,
            launch: KernelLaunch::empty(),
            token: Some(token.clone()),
        });
        harness.run_normally();
        if token.wait().is_err() {
            trapped.push(index);
            let generation = harness.state().generation();
            let answer = harness.invalidate(generation);
            harness.run_normally();
            assert!(answer.try_recv().is_ok_and(|result| result.is_ok()));
        }
    }
    trapped
}

#[test]
fn a_seeded_trap_rate_traps_the_same_launches_every_run() {
    let first = trapped_launches(7, 60);
    assert_eq!(first, trapped_launches(7, 60));
    assert_ne!(first, trapped_launches(8, 60));
    assert!(!first.is_empty() && first.len() < 60, "{first:?}");
}
