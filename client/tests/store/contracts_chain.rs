//! The device chain's contracts, each tested by name: a host loss makes
//! every earlier loss stale; a prediction moves one upload and one
//! download; a prediction or a loss read after a trapped step latches the
//! store; a prediction after an invalidate is `StaleDeviceGeneration`; a
//! resident input downloads only through its own store; an unrecoverable
//! device and a server panic are seen through the store.

use cistern_client::{BackendError, ComputeClient, DeviceParamStore, Tape};
use cistern_optim::SgdConfig;
use cistern_runtime::{DeviceOptions, FaultPlan, KernelLaunch};

use super::chain::chain;
use super::common::{Model, model, ok, open, open_with, store};

fn sgd() -> SgdConfig {
    SgdConfig {
        lr: 0.05,
        ..Default::default()
    }
}

fn chain_step(
    store: &mut DeviceParamStore,
    client: &ComputeClient,
    model: &Model,
) -> Result<cistern_client::TrainStepLoss, BackendError> {
    let tape = Tape::new(client);
    let leaves = store.snapshot_resident_params(&tape)?;
    store.train_step_device_chain(&chain(&leaves), &model.x, &model.y, &sgd())
}

fn predict(
    store: &DeviceParamStore,
    client: &ComputeClient,
    model: &Model,
) -> Result<(), BackendError> {
    let tape = Tape::new(client);
    let leaves = store.snapshot_resident_params(&tape)?;
    store
        .predict_device_chain(&chain(&leaves), &model.x)
        .map(|_| ())
}

#[test]
fn recording_a_host_loss_makes_every_earlier_chain_and_host_loss_stale() {
    let client = open();
    let model = model(0xE1);
    let mut store = store(&client, &model);
    let chained = ok(chain_step(&mut store, &client, &model), "chain step");
    let first_host = ok(store.record_host_train_step_loss(0.5), "host loss");
    assert!(matches!(
        store.read_train_step_loss(&chained),
        Err(BackendError::InvalidArgument(_))
    ));
    let second_host = ok(store.record_host_train_step_loss(0.25), "host loss");
    assert!(matches!(
        store.read_train_step_loss(&first_host),
        Err(BackendError::InvalidArgument(_))
    ));
    assert_eq!(ok(store.read_train_step_loss(&second_host), "latest"), 0.25);
    let next = ok(chain_step(&mut store, &client, &model), "chain step");
    assert!(matches!(
        store.read_train_step_loss(&second_host),
        Err(BackendError::InvalidArgument(_))
    ));
    assert!(ok(store.read_train_step_loss(&next), "latest").is_finite());
}

#[test]
fn a_prediction_moves_one_upload_and_one_download() {
    let client = open();
    let model = model(0xE2);
    let store = store(&client, &model);
    ok(predict(&store, &client, &model), "warm-up");
    let before = ok(client.server_stats(), "stats");
    ok(predict(&store, &client, &model), "predict");
    let after = ok(client.server_stats(), "stats");
    assert_eq!(
        (after.writes - before.writes, after.reads - before.reads),
        (1, 1),
        "uploads and downloads of one prediction"
    );
}

/// A store whose first chain step traps on the device, that step queued.
fn a_trapped_chain_step() -> (ComputeClient, DeviceParamStore, Model) {
    let model = model(0xE3);
    let client = open_with(
        DeviceOptions::with_memory_limit(64 << 20)
            .with_faults(FaultPlan::none().with_trap_at_launch(1)),
    );
    let store = store(&client, &model);
    (client, store, model)
}

#[test]
fn a_prediction_after_a_trapped_step_latches_the_store_and_keeps_refusing() {
    let (client, mut store, model) = a_trapped_chain_step();
    // The step returns once queued, or answers the trap itself.
    let _ = chain_step(&mut store, &client, &model);
    let first = predict(&store, &client, &model);
    assert!(
        matches!(
            first,
            Err(BackendError::DeviceContextPoisoned(_) | BackendError::StorePoisoned { .. })
        ),
        "{first:?}"
    );
    assert!(store.is_poisoned());
    assert!(matches!(
        predict(&store, &client, &model),
        Err(BackendError::StorePoisoned { .. })
    ));
}

#[test]
fn reading_the_loss_of_a_trapped_chain_step_latches_the_store() {
    let (client, mut store, model) = a_trapped_chain_step();
    let loss = match chain_step(&mut store, &client, &model) {
        Ok(loss) => loss,
        Err(error) => {
            // Refused at once: the store must be latched all the same.
            assert!(store.is_poisoned(), "{error:?} left the store open");
            return;
        }
    };
    let read = store.read_train_step_loss(&loss);
    assert!(
        matches!(read, Err(BackendError::DeviceContextPoisoned(_))),
        "{read:?}"
    );
    assert!(store.is_poisoned());
    assert!(matches!(
        store.read_train_step_loss(&loss),
        Err(BackendError::StorePoisoned { .. })
    ));
    assert!(matches!(
        store.sync_to_host().map(|_| ()),
        Err(BackendError::StorePoisoned { .. })
    ));
}

/// Another user of `client`'s device runs a launch that traps (the
/// device's plan traps its first launch) and sees the poison.
fn trap_the_device(client: &ComputeClient) {
    let scratch = ok(client.reserve(64), "scratch");
    let fill = KernelLaunch::fill(scratch.whole(), 1.0);
    ok(client.launch(client.default_stream(), fill), "launch");
    assert!(client.sync(client.default_stream()).is_err(), "the trap");
}

#[test]
fn a_prediction_after_an_invalidate_is_stale_device_generation() {
    let client = open_with(
        DeviceOptions::with_memory_limit(64 << 20)
            .with_faults(FaultPlan::none().with_trap_at_launch(1)),
    );
    let model = model(0xE4);
    let store = store(&client, &model);
    // Another user of the device traps it and recovers it.
    trap_the_device(&client);
    ok(client.invalidate(0), "invalidate");
    let stale = predict(&store, &client, &model);
    assert!(
        matches!(stale, Err(BackendError::StaleDeviceGeneration { .. })),
        "{stale:?}"
    );
}

#[test]
fn a_resident_input_downloads_only_through_the_store_and_device_that_own_it() {
    let client = open();
    let model = model(0xE5);
    let store = store(&client, &model);
    let other = super::common::store(&client, &model);
    let elsewhere_client = open();
    let elsewhere = super::common::store(&elsewhere_client, &model);
    let input = ok(store.upload_resident_input(&model.x), "upload");
    assert_eq!(ok(store.download_resident_input(&input), "own"), model.x);
    assert!(matches!(
        other.download_resident_input(&input),
        Err(BackendError::InvalidArgument(_))
    ));
    assert!(matches!(
        elsewhere.download_resident_input(&input),
        Err(BackendError::DeviceMismatch | BackendError::InvalidArgument(_))
    ));
}

#[test]
fn an_unrecoverable_device_is_seen_through_the_store() {
    use cistern_runtime::ProbeFault;
    let client = open_with(
        DeviceOptions::with_memory_limit(64 << 20).with_faults(
            FaultPlan::none()
                .with_trap_at_launch(1)
                .with_probe_faults([ProbeFault::Sticky]),
        ),
    );
    let model = model(0xE6);
    let store = store(&client, &model);
    trap_the_device(&client);
    let _ = client.invalidate(0);
    let seen = store.sync_to_host().map(|_| ());
    assert!(
        matches!(seen, Err(BackendError::DeviceContextUnrecoverable { .. })),
        "{seen:?}"
    );
    let again = predict(&store, &client, &model);
    assert!(
        matches!(
            again,
            Err(BackendError::DeviceContextUnrecoverable { .. }
                | BackendError::StorePoisoned { .. })
        ),
        "{again:?}"
    );
}

#[test]
fn a_server_panic_is_seen_through_the_store_and_latches_it() {
    let model = model(0xE7);
    let client = open_with(
        DeviceOptions::with_memory_limit(64 << 20)
            .with_faults(FaultPlan::none().with_server_panic_at_command(40)),
    );
    let store = store(&client, &model);
    let mut seen = Ok(());
    for _ in 0..40 {
        seen = predict(&store, &client, &model);
        if seen.is_err() {
            break;
        }
    }
    assert!(
        matches!(seen, Err(BackendError::ServerPanicked { .. })),
        "{seen:?}"
    );
    assert!(store.is_poisoned());
    assert_eq!(
        store.sync_to_host().map(|_| ()),
        seen.map_err(BackendError::store_poisoned),
        "later calls name the panic that latched the store"
    );
}
