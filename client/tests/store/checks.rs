//! The order of the checks in every store call: the store's own poison →
//! the device state → the generation → tape / store / slot → the arguments.

use cistern_client::{BackendError, ComputeClient, Gradients, Tape};
use cistern_optim::SgdConfig;
use cistern_runtime::{DeviceOptions, FaultPlan, KernelLaunch};

use super::common::{model, ok, open, open_with, store};

/// A device whose first launch traps.
fn trapping() -> ComputeClient {
    open_with(
        DeviceOptions::with_memory_limit(64 << 20)
            .with_faults(FaultPlan::none().with_trap_at_launch(1)),
    )
}

/// Poisons `client`'s device with a trapped launch; its generation.
fn poison(client: &ComputeClient) -> u64 {
    let scratch = ok(client.reserve(64), "scratch");
    let stream = client.default_stream();
    ok(
        client.launch(stream, KernelLaunch::fill(scratch.whole(), 1.0)),
        "launch",
    );
    match client.sync(stream) {
        Err(error) => BackendError::from(error)
            .poisoned_generation()
            .unwrap_or(u64::MAX),
        Ok(()) => panic!("the launch traps"),
    }
}

fn bad_config() -> SgdConfig {
    SgdConfig {
        lr: -1.0,
        ..SgdConfig::default()
    }
}

#[test]
fn the_stores_own_poison_comes_before_the_device_state_and_the_generation() {
    let client = trapping();
    let model = model(30);
    let mut store = store(&client, &model);
    let generation = poison(&client);
    let first = match store.wait_device() {
        Err(error @ BackendError::DeviceContextPoisoned(_)) => error,
        other => panic!("the poison is the answer, got {other:?}"),
    };
    let poisoned = Err(BackendError::store_poisoned(first));
    assert_eq!(store.wait_device(), poisoned);
    ok(client.invalidate(generation), "invalidate");
    let foreign = Tape::new(&open());
    assert_eq!(
        store.register_resident_params(&foreign).map(|_| ()),
        poisoned
    );
}

#[test]
fn a_device_poisoned_by_another_client_latches_the_store() {
    let client = trapping();
    let model = model(31);
    let store = store(&client, &model);
    poison(&client.clone());
    let first = match store.sync_to_host() {
        Err(error @ BackendError::DeviceContextPoisoned(_)) => error,
        other => panic!("the poison is the answer, got {other:?}"),
    };
    assert_eq!(
        store.sync_to_host().map(|_| ()),
        Err(BackendError::store_poisoned(first))
    );
}

#[test]
fn the_device_state_comes_before_the_tape_and_the_arguments() {
    let client = open();
    let model = model(32);
    let mut store = store(&client, &model);
    let stream = ok(client.create_stream(), "stream");
    let (_token, guard) = ok(client.begin_capture(stream), "capture");
    let foreign = Tape::new(&open());
    assert!(matches!(
        store.register_resident_params(&foreign),
        Err(BackendError::DeviceContextCaptureInProgress { .. })
    ));
    let gradients = ok(Gradients::from_host(&foreign, []), "foreign gradients");
    assert!(matches!(
        store.step(&gradients, &bad_config()),
        Err(BackendError::DeviceContextCaptureInProgress { .. })
    ));
    ok(client.end_capture(guard), "end capture");
    assert!(!store.is_poisoned());
}

#[test]
fn the_generation_comes_before_the_tape_and_the_arguments() {
    let client = trapping();
    let model = model(33);
    let mut store = store(&client, &model);
    let generation = poison(&client);
    ok(client.invalidate(generation), "invalidate");
    let foreign = Tape::new(&open());
    assert!(matches!(
        store.register_resident_params(&foreign),
        Err(BackendError::StaleDeviceGeneration { .. })
    ));
    let gradients = ok(Gradients::from_host(&foreign, []), "foreign gradients");
    assert!(matches!(
        store.step(&gradients, &bad_config()),
        Err(BackendError::StaleDeviceGeneration { .. })
    ));
    assert!(!store.is_poisoned(), "a stale store is not poisoned");
}

#[test]
fn the_tape_comes_before_the_store_and_the_slot() {
    let client = open();
    let model = model(34);
    let (mut mine, mut theirs) = (store(&client, &model), store(&client, &model));
    let (tape, other) = (Tape::new(&client), Tape::new(&client));
    ok(mine.register_resident_params(&tape), "register mine");
    let their_leaves = ok(theirs.register_resident_params(&other), "register theirs");
    let x = ok(tape.upload(&model.x), "x");
    let answer = mine.linear_forward(&tape, &x, &their_leaves[0], None);
    assert_eq!(answer.map(|_| ()), Err(BackendError::TapeMismatch));
}

#[test]
fn the_store_and_slot_come_before_the_arguments() {
    let client = open();
    let model = model(35);
    let (mut mine, mut theirs) = (store(&client, &model), store(&client, &model));
    let tape = Tape::new(&client);
    ok(mine.register_resident_params(&tape), "register mine");
    let their_leaves = ok(theirs.register_resident_params(&tape), "register theirs");
    // The input's shape does not fit W2: the store check answers first.
    let x = ok(tape.upload(&model.x), "x");
    let answer = mine.linear_forward(&tape, &x, &their_leaves[2], None);
    assert!(matches!(answer, Err(BackendError::InvalidArgument(_))));
    let other = Tape::new(&client);
    let gradients = ok(Gradients::from_host(&other, []), "other tape's gradients");
    assert_eq!(
        mine.step(&gradients, &bad_config()),
        Err(BackendError::TapeMismatch)
    );
    let none = ok(Gradients::from_host(&tape, []), "no gradients");
    assert!(matches!(
        mine.step(&none, &bad_config()),
        Err(BackendError::MissingGradient(_))
    ));
}
