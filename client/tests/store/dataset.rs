//! Chain steps over data already on the device: a resident dataset whose
//! batches the device draws (parity with host batches of the same rows,
//! no bytes per step, the counter, refusals) and resident inputs.

use cistern_client::{
    BackendError, ComputeClient, CrossEntropyOptions, DatasetLoss, DatasetTargets,
    DeviceParamStore, ResidentDataset, Tape, Tensor,
};
use cistern_memory::SplitMix64;
use cistern_optim::SgdConfig;

use super::chain::chain;
use super::common::{Model, flat32, model, ok, open, random, store};

fn sgd() -> SgdConfig {
    SgdConfig {
        lr: 0.05,
        momentum: 0.9,
        ..Default::default()
    }
}

/// 20 rows of 4 features and 3 values.
fn data(seed: u64) -> (Tensor<f32>, Tensor<f32>) {
    let mut rng = SplitMix64::new(seed);
    (random(&mut rng, &[20, 4]), random(&mut rng, &[20, 3]))
}

/// The rows of `matrix` that `dataset` draws at `step`.
fn drawn(dataset: &ResidentDataset, matrix: &Tensor<f32>, step: u32) -> Tensor<f32> {
    let width = matrix.shape()[1];
    let values = (0..dataset.batch())
        .flat_map(|i| {
            let row = dataset.row(step, i).unwrap_or(usize::MAX);
            matrix.data()[row * width..(row + 1) * width].to_vec()
        })
        .collect();
    ok(Tensor::new(vec![dataset.batch(), width], values), "batch")
}

fn dataset_step(
    client: &ComputeClient,
    store: &mut DeviceParamStore,
    dataset: &ResidentDataset,
) -> f32 {
    let tape = Tape::new(client);
    let leaves = ok(store.snapshot_resident_params(&tape), "snapshot");
    let loss = ok(
        store.train_step_device_chain_dataset(&chain(&leaves), dataset, DatasetLoss::Mse, &sgd()),
        "dataset step",
    );
    ok(store.read_train_step_loss(&loss), "loss")
}

fn host_step(
    client: &ComputeClient,
    store: &mut DeviceParamStore,
    x: &Tensor<f32>,
    y: &Tensor<f32>,
) -> f32 {
    let tape = Tape::new(client);
    let leaves = ok(store.snapshot_resident_params(&tape), "snapshot");
    let loss = ok(
        store.train_step_device_chain(&chain(&leaves), x, y, &sgd()),
        "host step",
    );
    ok(store.read_train_step_loss(&loss), "loss")
}

fn upload(store: &DeviceParamStore, x: &Tensor<f32>, y: &Tensor<f32>) -> ResidentDataset {
    ok(
        store.upload_resident_dataset(x, DatasetTargets::Values(y), 6, 0xDA7A),
        "upload",
    )
}

#[test]
fn a_dataset_step_trains_as_host_batches_of_the_rows_it_draws() {
    let client = open();
    let model: Model = model(0xDA1);
    let (x, y) = data(1);
    let mut resident = store(&client, &model);
    let mut hosted = store(&client, &model);
    let dataset = upload(&resident, &x, &y);
    assert_eq!(dataset.per_epoch(), 3);
    // Three epochs: the warm-up, the recording and replays, new orders.
    for step in 0..9 {
        let got = dataset_step(&client, &mut resident, &dataset);
        let want = host_step(
            &client,
            &mut hosted,
            &drawn(&dataset, &x, step),
            &drawn(&dataset, &y, step),
        );
        assert_eq!(got, want, "the loss of step {step}");
    }
    assert_eq!(
        ok(resident.resident_dataset_position(&dataset), "position"),
        9
    );
    assert_eq!(
        flat32(&ok(resident.sync_to_host(), "resident")),
        flat32(&ok(hosted.sync_to_host(), "hosted"))
    );
}

#[test]
fn a_replayed_dataset_step_moves_no_bytes_but_its_loss_read() {
    let client = open();
    let model = model(0xDA2);
    let (x, y) = data(2);
    let mut store = store(&client, &model);
    let dataset = upload(&store, &x, &y);
    for _ in 0..3 {
        dataset_step(&client, &mut store, &dataset);
    }
    let before = ok(client.server_stats(), "stats");
    for _ in 0..10 {
        dataset_step(&client, &mut store, &dataset);
    }
    let after = ok(client.server_stats(), "stats");
    assert_eq!(
        (after.writes - before.writes, after.reads - before.reads),
        (0, 10),
        "writes and reads of ten steps"
    );
    assert_eq!(
        after.bytes_read - before.bytes_read,
        40,
        "ten 4-byte loss reads"
    );
}

#[test]
fn seeking_the_counter_draws_the_same_batches_again() {
    let client = open();
    let model = model(0xDA3);
    let (x, y) = data(3);
    let mut first = store(&client, &model);
    let mut second = store(&client, &model);
    let a = upload(&first, &x, &y);
    let b = upload(&second, &x, &y);
    // The second store starts at step 4, as a run resumed there would.
    ok(second.seek_resident_dataset(&b, 4), "seek");
    for _ in 0..4 {
        dataset_step(&client, &mut first, &a);
    }
    let rest: Vec<f32> = (0..5)
        .map(|_| dataset_step(&client, &mut first, &a))
        .collect();
    let resumed: Vec<f32> = (0..5)
        .map(|_| dataset_step(&client, &mut second, &b))
        .collect();
    assert_eq!(ok(second.resident_dataset_position(&b), "position"), 9);
    // The same batches; the parameters differ (the second never trained
    // steps 0–3), so compare the draw, not the losses.
    assert_eq!(rest.len(), resumed.len());
    for step in 4..9 {
        assert_eq!(drawn(&a, &x, step), drawn(&b, &x, step));
    }
    assert!(matches!(
        second.seek_resident_dataset(&b, u64::from(u32::MAX) + 1),
        Err(BackendError::InvalidArgument(_))
    ));
}

#[test]
fn a_classifier_steps_over_a_dataset_of_classes_as_over_host_batches() {
    let client = open();
    let model = model(0xDA4);
    let (x, _) = data(4);
    let classes: Vec<i64> = (0..20).map(|row| row % 3).collect();
    let mut resident = store(&client, &model);
    let mut hosted = store(&client, &model);
    let dataset = ok(
        resident.upload_resident_dataset(&x, DatasetTargets::Classes(&classes), 5, 9),
        "upload",
    );
    let options = CrossEntropyOptions::default();
    for step in 0..6u32 {
        let tape = Tape::new(&client);
        let leaves = ok(resident.snapshot_resident_params(&tape), "snapshot");
        let loss = DatasetLoss::CrossEntropy(&options);
        let got = ok(
            resident.train_step_device_chain_dataset(&chain(&leaves), &dataset, loss, &sgd()),
            "dataset step",
        );
        let got = ok(resident.read_train_step_loss(&got), "loss");
        let targets: Vec<i64> = (0..5)
            .map(|i| classes[dataset.row(step, i).unwrap_or(0)])
            .collect();
        let tape = Tape::new(&client);
        let leaves = ok(hosted.snapshot_resident_params(&tape), "snapshot");
        let loss = cistern_client::ChainLoss::CrossEntropy {
            targets: &targets,
            options: &options,
        };
        let want = ok(
            hosted.train_step_device_chain_with_loss(
                &chain(&leaves),
                &drawn(&dataset, &x, step),
                loss,
                &sgd(),
            ),
            "host step",
        );
        assert_eq!(got, ok(hosted.read_train_step_loss(&want), "loss"));
    }
}

#[test]
fn a_dataset_that_does_not_fit_the_step_is_refused_before_anything_changes() {
    let client = open();
    let model = model(0xDA5);
    let (x, y) = data(5);
    let other = store(&client, &model);
    let mut store = store(&client, &model);
    let foreign = upload(&other, &x, &y);
    let classes: Vec<i64> = (0..20).map(|row| row % 7).collect();
    let of_classes = ok(
        store.upload_resident_dataset(&x, DatasetTargets::Classes(&classes), 4, 1),
        "classes",
    );
    let tape = Tape::new(&client);
    let leaves = ok(store.snapshot_resident_params(&tape), "snapshot");
    let options = CrossEntropyOptions::default();
    let refusals = [
        store.train_step_device_chain_dataset(&chain(&leaves), &foreign, DatasetLoss::Mse, &sgd()),
        store.train_step_device_chain_dataset(
            &chain(&leaves),
            &of_classes,
            DatasetLoss::Mse,
            &sgd(),
        ),
        // Class 6 past the chain's three outputs.
        store.train_step_device_chain_dataset(
            &chain(&leaves),
            &of_classes,
            DatasetLoss::CrossEntropy(&options),
            &sgd(),
        ),
    ];
    for refusal in refusals {
        assert!(
            matches!(refusal, Err(BackendError::InvalidArgument(_))),
            "{refusal:?}"
        );
    }
    assert_eq!(store.steps(), 0);
    assert_eq!(
        ok(store.resident_dataset_position(&of_classes), "position"),
        0
    );
    let upload_refusals = [
        store.upload_resident_dataset(&x, DatasetTargets::Values(&y), 21, 0),
        store.upload_resident_dataset(&x, DatasetTargets::Values(&y), 0, 0),
        store.upload_resident_dataset(&x, DatasetTargets::Classes(&[-1; 20]), 4, 0),
        store.upload_resident_dataset(&x, DatasetTargets::Classes(&[0; 19]), 4, 0),
    ];
    for refusal in upload_refusals {
        assert!(refusal.is_err(), "{refusal:?}");
    }
}

#[test]
fn a_step_over_resident_inputs_equals_the_host_step_and_uploads_nothing() {
    let client = open();
    let model = model(0xDA6);
    let mut resident = store(&client, &model);
    let mut hosted = store(&client, &model);
    let x = ok(resident.upload_resident_input(&model.x), "x");
    let y = ok(resident.upload_resident_input(&model.y), "y");
    let steps = |store: &mut DeviceParamStore, count: usize, on_device: bool| {
        for _ in 0..count {
            let tape = Tape::new(&client);
            let leaves = ok(store.snapshot_resident_params(&tape), "snapshot");
            let loss = if on_device {
                store.train_step_device_chain_resident(&chain(&leaves), &x, &y, &sgd())
            } else {
                store.train_step_device_chain(&chain(&leaves), &model.x, &model.y, &sgd())
            };
            ok(store.read_train_step_loss(&ok(loss, "step")), "loss");
        }
    };
    steps(&mut resident, 3, true);
    let before = ok(client.server_stats(), "stats");
    steps(&mut resident, 5, true);
    let after = ok(client.server_stats(), "stats");
    assert_eq!(after.writes - before.writes, 0, "uploads of five steps");
    steps(&mut hosted, 8, false);
    assert_eq!(
        flat32(&ok(resident.sync_to_host(), "resident")),
        flat32(&ok(hosted.sync_to_host(), "hosted"))
    );
}
