//! The pending forward: registration records it, a second one is refused
//! until a step consumes it, abandoning clears it, snapshots never touch
//! it, and its leaves are checked against its tape, store and device.

use cistern_client::{BackendError, Tape};
use cistern_optim::SgdConfig;
use cistern_runtime::Activation;

use super::common::{loss, model, ok, open, store, with_gradients};

#[test]
fn a_second_registration_before_a_step_is_pending_forward_unconsumed() {
    let client = open();
    let model = model(1);
    let mut store = store(&client, &model);
    let (first, second) = (Tape::new(&client), Tape::new(&client));
    ok(store.register_resident_params(&first), "register");
    assert_eq!(
        store.register_resident_params(&second).map(|_| ()),
        Err(BackendError::PendingForwardUnconsumed)
    );
    assert_eq!(
        store.register_resident_params(&first).map(|_| ()),
        Err(BackendError::PendingForwardUnconsumed)
    );
}

#[test]
fn a_step_consumes_the_pending_forward() {
    let client = open();
    let model = model(2);
    let mut store = store(&client, &model);
    with_gradients(&client, &mut store, &model, |store, gradients| {
        ok(store.step(gradients, &SgdConfig::default()), "step");
    });
    let tape = Tape::new(&client);
    ok(store.register_resident_params(&tape), "a new forward");
}

#[test]
fn abandoning_returns_whether_a_forward_was_pending_and_is_idempotent() {
    let client = open();
    let model = model(3);
    let mut store = store(&client, &model);
    assert_eq!(store.abandon_pending_forward(), Ok(false));
    let tape = Tape::new(&client);
    ok(store.register_resident_params(&tape), "register");
    assert_eq!(store.abandon_pending_forward(), Ok(true));
    assert_eq!(store.abandon_pending_forward(), Ok(false));
    ok(store.register_resident_params(&tape), "register again");
}

#[test]
fn a_snapshot_never_touches_the_pending_forward() {
    let client = open();
    let model = model(4);
    let mut store = store(&client, &model);
    let tape = Tape::new(&client);
    let snapshot = ok(store.snapshot_resident_params(&tape), "snapshot");
    assert!(snapshot.iter().all(|leaf| !leaf.is_tracked()));
    assert_eq!(store.abandon_pending_forward(), Ok(false));
    let registered = ok(store.register_resident_params(&tape), "register");
    ok(
        store.snapshot_resident_params(&tape),
        "a snapshot while pending",
    );
    // An evaluation forward over the snapshot needs no pending forward.
    let value = ok(loss(&store, &tape, &snapshot, &model), "eval forward");
    assert!(ok(value.item(), "the eval loss").is_finite());
    assert_eq!(store.abandon_pending_forward(), Ok(true));
    drop(registered);
}

#[test]
fn a_registered_leaf_on_another_tape_is_tape_mismatch() {
    let client = open();
    let model = model(5);
    let mut store = store(&client, &model);
    let (tape, other) = (Tape::new(&client), Tape::new(&client));
    let leaves = ok(store.register_resident_params(&tape), "register");
    let x = ok(other.upload(&model.x), "x");
    let on_other = store.linear_forward(&other, &x, &leaves[0], Some(&leaves[1]));
    assert_eq!(on_other.map(|_| ()), Err(BackendError::TapeMismatch));
    // A snapshot leaf of the other tape used with the pending tape's input.
    let snapshot = ok(store.snapshot_resident_params(&other), "snapshot");
    let x = ok(tape.upload(&model.x), "x");
    let mixed = store.linear_forward(&tape, &x, &snapshot[0], None);
    assert_eq!(mixed.map(|_| ()), Err(BackendError::TapeMismatch));
    let wrong_input = store.linear_forward(&other, &x, &snapshot[0], None);
    assert_eq!(wrong_input.map(|_| ()), Err(BackendError::TapeMismatch));
}

#[test]
fn a_leaf_of_another_store_is_an_invalid_argument() {
    let client = open();
    let model = model(6);
    let (mut mine, mut theirs) = (store(&client, &model), store(&client, &model));
    let tape = Tape::new(&client);
    ok(mine.register_resident_params(&tape), "register mine");
    let their_leaves = ok(theirs.register_resident_params(&tape), "register theirs");
    let x = ok(tape.upload(&model.x), "x");
    let borrowed = mine.linear_forward(&tape, &x, &their_leaves[0], None);
    assert!(matches!(borrowed, Err(BackendError::InvalidArgument(_))));
}

#[test]
fn a_leaf_of_an_abandoned_forward_is_an_invalid_argument() {
    let client = open();
    let model = model(7);
    let mut store = store(&client, &model);
    let tape = Tape::new(&client);
    let old = ok(store.register_resident_params(&tape), "register");
    assert_eq!(store.abandon_pending_forward(), Ok(true));
    let x = ok(tape.upload(&model.x), "x");
    let answer = store.linear_forward(&tape, &x, &old[0], None);
    assert!(matches!(answer, Err(BackendError::InvalidArgument(_))));
    ok(store.register_resident_params(&tape), "register again");
    let answer = store.linear_forward(&tape, &x, &old[0], None);
    assert!(matches!(answer, Err(BackendError::InvalidArgument(_))));
}

#[test]
fn a_tape_of_another_device_is_device_mismatch() {
    let (client, elsewhere) = (open(), open());
    let model = model(8);
    let mut store = store(&client, &model);
    let foreign = Tape::new(&elsewhere);
    assert_eq!(
        store.register_resident_params(&foreign).map(|_| ()),
        Err(BackendError::DeviceMismatch)
    );
    assert_eq!(
        store.snapshot_resident_params(&foreign).map(|_| ()),
        Err(BackendError::DeviceMismatch)
    );
    let tape = Tape::new(&client);
    let leaves = ok(store.register_resident_params(&tape), "register");
    let x = ok(foreign.upload(&model.x), "x");
    let answer =
        store.linear_forward_with_activation(&foreign, &x, &leaves[0], None, Activation::Relu);
    assert_eq!(answer.map(|_| ()), Err(BackendError::DeviceMismatch));
}

#[test]
fn a_validation_failure_changes_nothing_and_keeps_the_pending_forward() {
    let client = open();
    let model = model(9);
    let mut store = store(&client, &model);
    let before = ok(store.sync_to_host(), "before");
    let bad = SgdConfig {
        nesterov: true,
        ..SgdConfig::default()
    };
    with_gradients(&client, &mut store, &model, |store, gradients| {
        let refused = store.step(gradients, &bad);
        match refused {
            Err(BackendError::InvalidArgument(message)) => assert!(message.contains("nesterov")),
            other => panic!("an invalid config is refused, got {other:?}"),
        }
        assert_eq!(ok(store.sync_to_host(), "unchanged"), before);
        assert_eq!(store.steps(), 0);
        ok(
            store.step(gradients, &SgdConfig::default()),
            "the pending forward is kept",
        );
    });
    assert_eq!(store.steps(), 1);
    assert_ne!(ok(store.sync_to_host(), "stepped"), before);
}

#[test]
fn a_store_of_no_tensors_or_an_empty_one_is_an_invalid_argument() {
    let client = open();
    let tape = Tape::new(&client);
    assert!(matches!(
        cistern_client::DeviceParamStore::new(&tape, &[]),
        Err(BackendError::InvalidArgument(_))
    ));
    let empty = ok(
        cistern_client::Tensor::new([0, 3], Vec::new()),
        "an empty tensor",
    );
    assert!(matches!(
        cistern_client::DeviceParamStore::new(&tape, &[&empty]),
        Err(BackendError::InvalidArgument(_))
    ));
}
