//! The context state machine through the public API: a poisoned device is
//! recovered by `invalidate`, once however many callers ask, and a failed
//! probe leaves it unrecoverable.

use std::sync::{Arc, Barrier};
use std::thread;

use cistern::client::ComputeClient;
use cistern::runtime::{
    Binding, ContextState, Device, DeviceOptions, ErrorCode, FaultPlan, Health, KernelLaunch,
    ProbeFault, ServerError,
};

use super::common::{ok, open, open_with};

/// Traps the device and returns the generation it was poisoned in.
fn poison(client: &ComputeClient) -> u64 {
    let token = ok(
        client.launch_tracked(client.default_stream(), KernelLaunch::trap()),
        "launch",
    );
    match token.wait() {
        Err(ServerError::ContextPoisoned(poison)) => poison.generation,
        other => panic!("a trap poisons the device, got {other:?}"),
    }
}

fn probe_error(result: Result<ContextState, ServerError>) -> String {
    match result {
        Err(ServerError::ContextUnrecoverable { probe_error, .. }) => probe_error,
        other => panic!("expected an unrecoverable device, got {other:?}"),
    }
}

pub fn a_poisoned_device_recovers_and_only_fresh_handles_work(device: Device) {
    let client = open(device);
    let stream = ok(client.create_stream(), "create_stream");
    let old = ok(client.upload_f32(&[1.0; 16]), "upload");
    // An operation-local refusal latched on a stream before the fault.
    let past_the_end = Binding {
        size: 128,
        ..old.whole()
    };
    ok(
        client.launch(stream, KernelLaunch::fill(past_the_end, 1.0)),
        "launch",
    );
    let seen = poison(&client);
    assert_eq!(seen, 0);
    assert!(ok(client.context_state(), "context_state").is_poisoned());
    assert_eq!(
        ok(client.invalidate(seen), "invalidate"),
        ContextState::Active { generation: 1 }
    );
    assert_eq!(
        ok(client.context_state(), "context_state"),
        ContextState::Active { generation: 1 }
    );
    // Old handles are stale: take fresh ones; their frees are harmless.
    let stale = client.download(&old).map(|_| ());
    assert_eq!(
        stale,
        Err(ServerError::StaleGeneration {
            ordinal: device.ordinal(),
            resource_generation: 0,
            current_generation: 1,
        })
    );
    drop(old);
    // Latched errors were cleared with the old generation.
    ok(client.sync(stream), "sync");
    ok(client.sync(client.default_stream()), "sync");
    let fresh = ok(client.upload_f32(&[2.0; 16]), "upload");
    // The upload is ordered on the default stream only; `stream` writes after it.
    ok(client.sync(client.default_stream()), "sync upload");
    ok(
        client.launch(stream, KernelLaunch::fill(fresh.whole(), 3.0)),
        "launch",
    );
    ok(client.sync(stream), "sync");
    assert_eq!(ok(client.download_f32(&fresh), "download"), vec![3.0; 16]);
    // A second fault is poisoned in the new generation and recovers to the next.
    assert_eq!(poison(&client), 1);
    assert_eq!(
        ok(client.invalidate(1), "invalidate"),
        ContextState::Active { generation: 2 }
    );
}

pub fn concurrent_invalidates_advance_the_generation_exactly_once(device: Device) {
    let client = open(device);
    let seen = poison(&client);
    let callers = 8;
    let barrier = Arc::new(Barrier::new(callers));
    let threads: Vec<_> = (0..callers)
        .map(|_| {
            let client = client.clone();
            let barrier = barrier.clone();
            thread::spawn(move || {
                barrier.wait();
                client.invalidate(seen)
            })
        })
        .collect();
    for thread in threads {
        let answer = match thread.join() {
            Ok(answer) => answer,
            Err(_) => panic!("an invalidating thread panicked"),
        };
        assert_eq!(answer, Ok(ContextState::Active { generation: 1 }));
    }
    assert_eq!(
        ok(client.context_state(), "context_state"),
        ContextState::Active { generation: 1 }
    );
}

pub fn a_late_invalidate_after_recovery_changes_nothing(device: Device) {
    let client = open(device);
    let seen = poison(&client);
    ok(client.invalidate(seen), "invalidate");
    let fresh = ok(client.upload_f32(&[4.0; 8]), "upload");
    for late in [seen, seen, 1] {
        assert_eq!(
            ok(client.invalidate(late), "late invalidate"),
            ContextState::Active { generation: 1 }
        );
    }
    assert_eq!(ok(client.download_f32(&fresh), "download"), vec![4.0; 8]);
}

pub fn the_poisoned_state_holds_under_load_from_other_clients(device: Device) {
    let client = open(device);
    let buffer = Arc::new(ok(client.upload_f32(&[1.0; 64]), "upload"));
    let seen = poison(&client);
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let client = client.clone();
            let buffer = buffer.clone();
            thread::spawn(move || {
                let stream = client.default_stream();
                let mut answers = Vec::new();
                for _ in 0..100 {
                    answers.push(client.upload_f32(&[2.0; 64]).map(|_| ()));
                    answers.push(client.download(&buffer).map(|_| ()));
                    answers.push(client.sync(stream));
                    answers.push(client.create_stream().map(|_| ()));
                    let token = client.launch_tracked(stream, KernelLaunch::empty());
                    answers.push(token.and_then(|token| token.wait()));
                }
                answers
            })
        })
        .collect();
    for worker in workers {
        let answers = match worker.join() {
            Ok(answers) => answers,
            Err(_) => panic!("a client thread panicked"),
        };
        for answer in answers {
            assert_eq!(answer.map_err(|e| e.code()), Err(ErrorCode::DevicePoisoned));
        }
    }
    assert!(ok(client.context_state(), "context_state").is_poisoned());
    assert_eq!(
        ok(client.invalidate(seen), "invalidate"),
        ContextState::Active { generation: 1 }
    );
}

fn open_with_probe_faults(device: Device, faults: Vec<ProbeFault>) -> ComputeClient {
    let options = DeviceOptions::with_memory_limit(64 << 20)
        .with_faults(FaultPlan::none().with_probe_faults(faults));
    open_with(device, options)
}

pub fn three_operation_local_probe_failures_leave_the_device_unrecoverable(device: Device) {
    let client = open_with_probe_faults(device, vec![ProbeFault::OperationLocal; 3]);
    let seen = poison(&client);
    let error = probe_error(client.invalidate(seen));
    assert!(error.contains("3 times"), "{error}");
    // For the life of the process: every later call, invalidate included.
    let later = client.reserve(64).map(|_| ());
    assert_eq!(later.map_err(|e| e.code()), Err(ErrorCode::DeviceLost));
    probe_error(client.invalidate(seen));
    assert!(ok(client.context_state(), "context_state").is_unrecoverable());
}

pub fn two_operation_local_probe_failures_then_a_pass_recover(device: Device) {
    let client = open_with_probe_faults(device, vec![ProbeFault::OperationLocal; 2]);
    let seen = poison(&client);
    assert_eq!(
        ok(client.invalidate(seen), "invalidate"),
        ContextState::Active { generation: 1 }
    );
    let fresh = ok(client.upload_f32(&[5.0; 4]), "upload");
    assert_eq!(ok(client.download_f32(&fresh), "download"), vec![5.0; 4]);
}

pub fn a_sticky_probe_failure_leaves_the_device_unrecoverable(device: Device) {
    let client = open_with_probe_faults(device, vec![ProbeFault::Sticky]);
    let seen = poison(&client);
    probe_error(client.invalidate(seen));
    let later = client.sync(client.default_stream());
    assert_eq!(later.map_err(|e| e.code()), Err(ErrorCode::DeviceLost));
}

pub fn a_mismatching_probe_leaves_the_device_unrecoverable(device: Device) {
    let client = open_with_probe_faults(device, vec![ProbeFault::Mismatch]);
    let seen = poison(&client);
    let error = probe_error(client.invalidate(seen));
    assert!(error.contains("wrong"), "{error}");
}

pub fn the_published_device_state_follows_poison_and_recovery(device: Device) {
    let client = open(device);
    let fresh = client.device_state();
    assert_eq!((fresh.generation, fresh.health), (0, Health::Active));
    let buffer = ok(client.upload_f32(&[1.0; 4]), "upload");
    assert_eq!(buffer.generation(), 0);
    let seen = poison(&client);
    // Any answered command means the server has taken in the fault.
    assert!(ok(client.context_state(), "context_state").is_poisoned());
    let poisoned = client.device_state();
    assert_eq!(
        (poisoned.generation, poisoned.health),
        (seen, Health::Poisoned)
    );
    ok(client.invalidate(seen), "invalidate");
    let recovered = client.device_state();
    assert_eq!(
        (recovered.generation, recovered.health),
        (seen + 1, Health::Active)
    );
    assert_ne!(
        buffer.generation(),
        recovered.generation,
        "the old buffer is stale"
    );
    let again = ok(client.upload_f32(&[1.0; 4]), "upload");
    assert_eq!(again.generation(), recovered.generation);
}
