//! The device-chain train step: parity with the tape and `step`, one read
//! per step, graph replay, losses, validation and another client's capture.

use std::time::Duration;

use cistern_client::{BackendError, Tape, Tensor};
use cistern_optim::SgdConfig;

use super::chain::chain;
use super::common::{flat32, model, ok, open, store, with_gradients};

fn sgd() -> SgdConfig {
    SgdConfig {
        lr: 0.05,
        momentum: 0.9,
        ..Default::default()
    }
}

#[test]
fn an_mlp_trained_with_the_device_chain_equals_the_tape_and_step() {
    let client = open();
    let model = model(0xD1);
    let mut chained = store(&client, &model);
    let mut taped = store(&client, &model);
    for _ in 0..10 {
        let tape = Tape::new(&client);
        let leaves = ok(chained.snapshot_resident_params(&tape), "snapshot");
        let loss = ok(
            chained.train_step_device_chain(&chain(&leaves), &model.x, &model.y, &sgd()),
            "chain step",
        );
        assert!(ok(chained.read_train_step_loss(&loss), "loss").is_finite());
        with_gradients(&client, &mut taped, &model, |store, gradients| {
            ok(store.step(gradients, &sgd()), "step");
        });
    }
    let got = flat32(&ok(chained.sync_to_host(), "chain params"));
    let want = flat32(&ok(taped.sync_to_host(), "tape params"));
    for (got, want) in got.iter().zip(&want) {
        assert!(
            (got - want).abs() <= 1e-5 * want.abs().max(1.0),
            "{got} vs {want}"
        );
    }
    assert_eq!(chained.steps(), 10);
}

#[test]
fn a_step_synchronises_once_with_its_loss_read_and_never_without() {
    let client = open();
    let model = model(0xD2);
    let mut store = store(&client, &model);
    let waits = |client: &cistern_client::ComputeClient| {
        let stats = ok(client.server_stats(), "stats");
        stats.reads + stats.syncs
    };
    for step in 0..6 {
        let tape = Tape::new(&client);
        let leaves = ok(store.snapshot_resident_params(&tape), "snapshot");
        let before = waits(&client);
        let loss = ok(
            store.train_step_device_chain(&chain(&leaves), &model.x, &model.y, &sgd()),
            "step",
        );
        assert_eq!(
            waits(&client) - before,
            0,
            "step {step} queued without waiting"
        );
        if step % 2 == 0 {
            ok(store.read_train_step_loss(&loss), "loss");
            assert_eq!(waits(&client) - before, 1, "step {step}: the loss read");
        }
    }
}

#[test]
fn later_steps_replay_the_recorded_step_and_a_new_batch_shape_records_again() {
    let client = open();
    let model = model(0xD3);
    let mut store = store(&client, &model);
    let replays = |client: &cistern_client::ComputeClient| ok(client.server_stats(), "s").replays;
    let step = |store: &mut cistern_client::DeviceParamStore, x: &Tensor<f32>, y: &Tensor<f32>| {
        let tape = Tape::new(&client);
        let leaves = ok(store.snapshot_resident_params(&tape), "snapshot");
        ok(
            store.train_step_device_chain(&chain(&leaves), x, y, &sgd()),
            "step",
        );
    };
    let start = replays(&client);
    step(&mut store, &model.x, &model.y);
    assert_eq!(replays(&client), start, "the warm-up runs directly");
    for _ in 0..3 {
        step(&mut store, &model.x, &model.y);
    }
    assert_eq!(replays(&client) - start, 3, "recorded, then replayed");
    let half = |t: &Tensor<f32>| {
        let cols = t.shape()[1];
        ok(
            Tensor::new(vec![4, cols], t.data()[..4 * cols].to_vec()),
            "half",
        )
    };
    let (x, y) = (half(&model.x), half(&model.y));
    step(&mut store, &x, &y);
    assert_eq!(replays(&client) - start, 3, "a new shape warms up again");
    step(&mut store, &x, &y);
    assert_eq!(replays(&client) - start, 4);
    ok(store.wait_device(), "every step ran");
    assert_eq!(store.steps(), 6);
}

#[test]
fn a_loss_of_an_older_step_or_another_store_is_refused_and_a_host_loss_needs_no_sync() {
    let client = open();
    let model = model(0xD4);
    let mut store = store(&client, &model);
    let mut other = super::common::store(&client, &model);
    let tape = Tape::new(&client);
    let leaves = ok(store.snapshot_resident_params(&tape), "snapshot");
    let first = ok(
        store.train_step_device_chain(&chain(&leaves), &model.x, &model.y, &sgd()),
        "step",
    );
    let second = ok(
        store.train_step_device_chain(&chain(&leaves), &model.x, &model.y, &sgd()),
        "step",
    );
    assert!(matches!(
        store.read_train_step_loss(&first),
        Err(BackendError::InvalidArgument(_))
    ));
    assert!(matches!(
        other.read_train_step_loss(&second),
        Err(BackendError::InvalidArgument(_))
    ));
    assert!(ok(store.read_train_step_loss(&second), "loss").is_finite());
    let host = ok(other.record_host_train_step_loss(0.25), "host loss");
    let before = ok(client.server_stats(), "stats");
    assert_eq!(ok(other.read_train_step_loss(&host), "read"), 0.25);
    let after = ok(client.server_stats(), "stats");
    assert_eq!((after.reads, after.syncs), (before.reads, before.syncs));
}

#[test]
fn validation_refuses_what_the_step_refuses_and_changes_nothing() {
    let client = open();
    let model = model(0xD5);
    let mut store = store(&client, &model);
    let tape = Tape::new(&client);
    let leaves = ok(store.snapshot_resident_params(&tape), "snapshot");
    let full = chain(&leaves);
    ok(
        store.validate_train_step_device_chain(&full, &model.x, &model.y, &sgd()),
        "a valid step",
    );
    let partial = vec![full[0].clone()];
    let narrow = ok(Tensor::new(vec![8, 6], vec![0.0; 48]), "target");
    let bad_lr = SgdConfig { lr: -1.0, ..sgd() };
    for (chain, target, config) in [(&partial, &model.y, sgd()), (&full, &model.y, bad_lr)] {
        let checked = store.validate_train_step_device_chain(chain, &model.x, target, &config);
        assert!(matches!(checked, Err(BackendError::InvalidArgument(_))));
    }
    assert!(matches!(
        store.validate_train_step_device_chain(&full, &model.x, &narrow, &sgd()),
        Err(BackendError::ShapeMismatch(_))
    ));
    assert!(matches!(
        store.train_step_device_chain(&full, &model.x, &narrow, &sgd()),
        Err(BackendError::ShapeMismatch(_))
    ));
    assert_eq!(store.steps(), 0);
    assert_eq!(
        flat32(&ok(store.sync_to_host(), "params")),
        flat32(&model.params)
    );
}

#[test]
fn a_step_waits_out_another_clients_capture_and_retries_without_a_partial_result() {
    let client = open();
    let model = model(0xD6);
    let mut contended = store(&client, &model);
    let mut quiet = store(&client, &model);
    for round in 0..4 {
        let tape = Tape::new(&client);
        let leaves = ok(contended.snapshot_resident_params(&tape), "snapshot");
        let other = client.clone();
        let stream = ok(other.create_stream(), "a stream");
        let (_token, guard) = ok(other.begin_capture(stream), "capture");
        let ender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            ok(other.end_capture(guard), "the capture ends");
        });
        let loss = contended.train_step_device_chain(&chain(&leaves), &model.x, &model.y, &sgd());
        let loss = ok(loss, &format!("round {round}: the retried step"));
        ok(ender.join().map_err(|_| "the ender panicked"), "join");
        let tape = Tape::new(&client);
        let leaves = ok(quiet.snapshot_resident_params(&tape), "snapshot");
        let want = ok(
            quiet.train_step_device_chain(&chain(&leaves), &model.x, &model.y, &sgd()),
            "step",
        );
        assert_eq!(
            ok(contended.read_train_step_loss(&loss), "loss"),
            ok(quiet.read_train_step_loss(&want), "loss")
        );
    }
    assert!(!contended.is_poisoned());
    assert_eq!(contended.steps(), 4);
    assert_eq!(
        flat32(&ok(contended.sync_to_host(), "params")),
        flat32(&ok(quiet.sync_to_host(), "params"))
    );
}
