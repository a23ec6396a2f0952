//! The tape's and `DeviceParamStore`'s contracts on every device: each
//! optimizer family through the store against the f64 reference fed the
//! same staged gradients, the device chain's train step against the tape
//! and `step`, the chain's prediction against the tape's forward, and a
//! trapped kernel latching the store so that nothing of it is readable, and
//! the tape's gradients against the CPU's.

use cistern::client::{
    BackendError, ComputeClient, DatasetLoss, DatasetTargets, DeviceParamStore, Gradients,
    ResidentLeaf, Tape, Tensor, Var,
};
use cistern::kernels::Segment;
use cistern::memory::SplitMix64;
use cistern::optim::reference::{self, ReferenceState};
use cistern::optim::{
    AdagradConfig, AdamConfig, AdamWConfig, LambConfig, OptimizerConfig, RmsPropConfig, SgdConfig,
};
use cistern::runtime::{Activation, Device, DeviceOptions, FaultPlan};

use super::common::{ok, open, open_with};
use super::optim_reference::{PARAM_FLOOR, cancelling_tolerance, max_relative_error};

/// `tanh(x·W1ᵀ + b1)·W2ᵀ + b2` on a small regression problem.
struct Model {
    x: Tensor<f32>,
    y: Tensor<f32>,
    /// W1 (6×4), b1 (6), W2 (3×6), b2 (3).
    params: Vec<Tensor<f32>>,
}

fn random(rng: &mut SplitMix64, shape: &[usize]) -> Tensor<f32> {
    let count = shape.iter().product();
    let data = (0..count)
        .map(|_| {
            let magnitude = rng.uniform(0.05, 1.0) as f32;
            if rng.chance(0.5) {
                magnitude
            } else {
                -magnitude
            }
        })
        .collect();
    ok(Tensor::new(shape.to_vec(), data), "a tensor")
}

fn model(seed: u64) -> Model {
    let mut rng = SplitMix64::new(seed);
    Model {
        x: random(&mut rng, &[8, 4]),
        y: random(&mut rng, &[8, 3]),
        params: vec![
            random(&mut rng, &[4, 6]),
            random(&mut rng, &[6]),
            random(&mut rng, &[6, 3]),
            random(&mut rng, &[3]),
        ],
    }
}

fn store(client: &ComputeClient, model: &Model) -> DeviceParamStore {
    let params: Vec<&Tensor<f32>> = model.params.iter().collect();
    ok(
        DeviceParamStore::new(&Tape::new(client), &params),
        "the store",
    )
}

/// The model's MSE on `tape` over the store's `leaves`.
fn loss<'t>(
    store: &DeviceParamStore,
    tape: &'t Tape,
    leaves: &[ResidentLeaf<'t>],
    model: &Model,
) -> Var<'t> {
    let x = ok(tape.upload(&model.x), "upload x");
    let y = ok(tape.upload(&model.y), "upload y");
    let tanh = Activation::Tanh;
    let h = store.linear_forward_with_activation(tape, &x, &leaves[0], Some(&leaves[1]), tanh);
    let pred = store.linear_forward(tape, &ok(h, "layer 1"), &leaves[2], Some(&leaves[3]));
    ok(tape.mse_loss(&ok(pred, "layer 2"), &y), "mse")
}

fn step_with(
    store: &mut DeviceParamStore,
    gradients: &Gradients<'_>,
    config: &OptimizerConfig,
) -> Result<(), BackendError> {
    match config {
        OptimizerConfig::Sgd(c) => store.step(gradients, c),
        OptimizerConfig::Adam(c) => store.step_adam(gradients, c),
        OptimizerConfig::AdamW(c) => store.step_adamw(gradients, c),
        OptimizerConfig::RmsProp(c) => store.step_rmsprop(gradients, c),
        OptimizerConfig::Adagrad(c) => store.step_adagrad(gradients, c),
        OptimizerConfig::Lamb(c) => store.step_lamb(gradients, c),
    }
}

fn flat(tensors: &[Tensor<f32>]) -> Vec<f32> {
    tensors.iter().flat_map(|t| t.data().to_vec()).collect()
}

fn wide(values: &[f32]) -> Vec<f64> {
    values.iter().map(|&v| f64::from(v)).collect()
}

fn segments(params: &[Tensor<f32>]) -> Vec<Segment> {
    let mut offset = 0;
    params
        .iter()
        .map(|tensor| {
            offset += tensor.len();
            Segment::new(offset - tensor.len(), tensor.len())
        })
        .collect()
}

/// Ten steps of every family through the store on `device`, each checked
/// against the f64 reference fed the gradients the store staged.
pub fn every_optimizer_family_through_the_store_matches_the_reference(device: Device) {
    let lr = 1e-3;
    let configs = [
        OptimizerConfig::Sgd(SgdConfig {
            lr,
            momentum: 0.9,
            nesterov: true,
            weight_decay: 0.01,
            ..Default::default()
        }),
        OptimizerConfig::Adam(AdamConfig {
            lr,
            ..Default::default()
        }),
        OptimizerConfig::AdamW(AdamWConfig {
            lr,
            ..Default::default()
        }),
        OptimizerConfig::RmsProp(RmsPropConfig {
            lr,
            momentum: 0.5,
            ..Default::default()
        }),
        OptimizerConfig::Adagrad(AdagradConfig {
            lr,
            ..Default::default()
        }),
        OptimizerConfig::Lamb(LambConfig {
            lr,
            ..Default::default()
        }),
    ];
    let client = open(device);
    let model = model(0x5701);
    let segments = segments(&model.params);
    for config in configs {
        let mut store = store(&client, &model);
        let mut want = ReferenceState::new(&config, wide(&flat(&model.params)));
        for step in 1..=10 {
            let tape = Tape::new(&client);
            let leaves = ok(store.register_resident_params(&tape), "register");
            let value = loss(&store, &tape, &leaves, &model);
            let gradients = ok(store.backward(&tape, &value), "backward");
            let staged = ok(store.resident_grads_to_host(), "staged gradients");
            let staged: Vec<Tensor<f32>> = staged.into_iter().flatten().collect();
            assert_eq!(staged.len(), 4, "{device}: every slot is staged");
            ok(step_with(&mut store, &gradients, &config), "step");
            let grads = wide(&flat(&staged));
            ok(
                reference::step(&config, step, &segments, &grads, &mut want),
                "reference",
            );
            let got = flat(&ok(store.sync_to_host(), "sync_to_host"));
            let error = max_relative_error(&got, &want.params, PARAM_FLOOR);
            assert!(
                error <= cancelling_tolerance(device),
                "{device}, step {step} of {config:?}: {error:e}"
            );
        }
        assert_eq!(store.steps(), 10, "{device}: {config:?}");
    }
}

/// The chain's layers over a store's `leaves`: tanh, then identity.
fn chain<'t>(leaves: &[ResidentLeaf<'t>]) -> Vec<cistern::client::ChainLayer<'t>> {
    vec![
        (leaves[0].clone(), Some(leaves[1].clone()), Activation::Tanh),
        (
            leaves[2].clone(),
            Some(leaves[3].clone()),
            Activation::Identity,
        ),
    ]
}

/// Five SGD steps through `train_step_device_chain` (the later ones
/// replayed) give the losses and parameters of the tape and `step` on the
/// same device.
pub fn the_device_chain_step_matches_the_tape_and_step(device: Device) {
    let client = open(device);
    let model = model(0x5702);
    let (mut chained, mut taped) = (store(&client, &model), store(&client, &model));
    let config = SgdConfig {
        lr: 0.05,
        momentum: 0.9,
        ..Default::default()
    };
    let tolerance = cancelling_tolerance(device);
    for step in 1..=5 {
        let tape = Tape::new(&client);
        let leaves = ok(chained.snapshot_resident_params(&tape), "snapshot");
        let sent = chained.train_step_device_chain(&chain(&leaves), &model.x, &model.y, &config);
        let chain_loss = ok(
            chained.read_train_step_loss(&ok(sent, "chain step")),
            "loss",
        );
        let tape = Tape::new(&client);
        let leaves = ok(taped.register_resident_params(&tape), "register");
        let value = loss(&taped, &tape, &leaves, &model);
        let gradients = ok(taped.backward(&tape, &value), "backward");
        ok(taped.step(&gradients, &config), "step");
        let tape_loss = ok(value.item(), "tape loss");
        let error = max_relative_error(&[chain_loss], &[f64::from(tape_loss)], PARAM_FLOOR);
        assert!(
            error <= tolerance,
            "{device}, step {step}: loss {chain_loss} vs {tape_loss}"
        );
        let got = flat(&ok(chained.sync_to_host(), "chain params"));
        let want = wide(&flat(&ok(taped.sync_to_host(), "tape params")));
        let error = max_relative_error(&got, &want, PARAM_FLOOR);
        assert!(
            error <= tolerance,
            "{device}, step {step}: params {error:e}"
        );
    }
}

/// A chain step over a resident dataset draws on the device the rows the
/// CPU computes (`ResidentDataset::row`), through its own gather kernel
/// and counter: it trains exactly as host batches of those rows on the
/// same device, over two epochs of recorded replays.
pub fn a_resident_datasets_steps_draw_the_cpus_rows(device: Device) {
    let client = open(device);
    let model = model(0x5704);
    let mut rng = SplitMix64::new(0x5705);
    let (x, y) = (random(&mut rng, &[10, 4]), random(&mut rng, &[10, 3]));
    let (mut resident, mut hosted) = (store(&client, &model), store(&client, &model));
    let targets = DatasetTargets::Values(&y);
    let dataset = ok(
        resident.upload_resident_dataset(&x, targets, 4, 0x5EED),
        "upload",
    );
    let config = SgdConfig {
        lr: 0.05,
        ..Default::default()
    };
    let rows_of = |matrix: &Tensor<f32>, step: u32| {
        let width = matrix.shape()[1];
        let values = (0..4)
            .flat_map(|i| {
                let row = dataset.row(step, i).unwrap_or(usize::MAX);
                matrix.data()[row * width..(row + 1) * width].to_vec()
            })
            .collect();
        ok(Tensor::new(vec![4, width], values), "batch")
    };
    for step in 0..(2 * dataset.per_epoch() as u32 + 1) {
        let tape = Tape::new(&client);
        let leaves = ok(resident.snapshot_resident_params(&tape), "snapshot");
        let sent = resident.train_step_device_chain_dataset(
            &chain(&leaves),
            &dataset,
            DatasetLoss::Mse,
            &config,
        );
        let got = ok(
            resident.read_train_step_loss(&ok(sent, "dataset step")),
            "loss",
        );
        let tape = Tape::new(&client);
        let leaves = ok(hosted.snapshot_resident_params(&tape), "snapshot");
        let (bx, by) = (rows_of(&x, step), rows_of(&y, step));
        let sent = hosted.train_step_device_chain(&chain(&leaves), &bx, &by, &config);
        let want = ok(hosted.read_train_step_loss(&ok(sent, "host step")), "loss");
        assert_eq!(got, want, "{device}, step {step}");
    }
    assert_eq!(
        ok(resident.resident_dataset_position(&dataset), "position"),
        2 * dataset.per_epoch() as u64 + 1,
        "{device}"
    );
}

/// `predict_device_chain` gives the tape's forward over the same leaves.
pub fn the_device_chain_prediction_matches_the_tape_forward(device: Device) {
    let client = open(device);
    let model = model(0x5703);
    let store = store(&client, &model);
    let tape = Tape::new(&client);
    let leaves = ok(store.snapshot_resident_params(&tape), "snapshot");
    let predicted = ok(
        store.predict_device_chain(&chain(&leaves), &model.x),
        "predict",
    );
    let x = ok(tape.upload(&model.x), "upload x");
    let tanh = Activation::Tanh;
    let h = store.linear_forward_with_activation(&tape, &x, &leaves[0], Some(&leaves[1]), tanh);
    let out = store.linear_forward(&tape, &ok(h, "layer 1"), &leaves[2], Some(&leaves[3]));
    let want = ok(ok(out, "layer 2").to_host(), "forward");
    assert_eq!(predicted.shape(), want.shape(), "{device}");
    let error = max_relative_error(predicted.data(), &wide(want.data()), PARAM_FLOOR);
    assert!(error <= cancelling_tolerance(device), "{device}: {error:e}");
}

/// One SGD step of `store`; the launches it queued, from the launch log.
fn one_step(client: &ComputeClient, store: &mut DeviceParamStore, model: &Model) -> Vec<String> {
    ok(client.take_launch_log(true), "launch log on");
    let tape = Tape::new(client);
    let leaves = ok(store.register_resident_params(&tape), "register");
    let value = loss(store, &tape, &leaves, model);
    let gradients = ok(store.backward(&tape, &value), "backward");
    ok(store.step(&gradients, &SgdConfig::default()), "step");
    let log = ok(client.take_launch_log(false), "launch log");
    log.iter()
        .map(|launch| launch.kernel.name().to_string())
        .collect()
}

/// The step's own kernel traps (the last launch of a step, counted on a
/// clean client first): the store latches, every later call refuses, and
/// no parameter byte is readable again.
pub fn a_trapped_step_latches_the_store_and_nothing_of_it_is_readable(device: Device) {
    let model = model(0x5704);
    let clean = open(device);
    let launches = one_step(&clean, &mut store(&clean, &model), &model);
    assert_eq!(
        launches.last().map(String::as_str),
        Some("optimizer_step"),
        "{launches:?}"
    );
    let faults = FaultPlan {
        trap_launch: Some(launches.len() as u64),
        ..FaultPlan::none()
    };
    let client = open_with(
        device,
        DeviceOptions::with_memory_limit(64 << 20).with_faults(faults),
    );
    let mut store = store(&client, &model);
    one_step(&client, &mut store, &model);
    assert!(
        store.wait_device().is_err(),
        "{device}: the trap reaches the store"
    );
    assert!(store.is_poisoned(), "{device}: the store latched");
    assert!(
        matches!(
            store.sync_to_host(),
            Err(BackendError::StorePoisoned { .. })
        ),
        "{device}: a latched store's bytes are never read"
    );
    let tape = Tape::new(&client);
    assert!(
        matches!(
            store.register_resident_params(&tape),
            Err(BackendError::StorePoisoned { .. })
        ),
        "{device}: nor is it registered again"
    );
}

/// The store's staged gradients of one backward on `device`.
fn staged_gradients(device: Device, model: &Model) -> Vec<f32> {
    let client = open(device);
    let mut store = store(&client, model);
    let tape = Tape::new(&client);
    let leaves = ok(store.register_resident_params(&tape), "register");
    let value = loss(&store, &tape, &leaves, model);
    ok(store.backward(&tape, &value), "backward");
    let staged = ok(store.resident_grads_to_host(), "staged gradients");
    flat(&staged.into_iter().flatten().collect::<Vec<_>>())
}

/// The tape's backward through the store's layers gives the CPU's
/// gradients on every device.
pub fn the_tapes_gradients_match_the_cpus(device: Device) {
    let model = model(0x5705);
    let got = staged_gradients(device, &model);
    let want = staged_gradients(Device::Cpu(0), &model);
    assert_eq!(
        got.len(),
        6 * 4 + 6 + 3 * 6 + 3,
        "{device}: every slot's gradient"
    );
    let error = max_relative_error(&got, &wide(&want), PARAM_FLOOR);
    assert!(error <= cancelling_tolerance(device), "{device}: {error:e}");
}

/// Parameters and device AMP words after `steps` AdamW steps of the
/// store's no-sync AMP form on `device`, the loss scaled by the scaler's
/// scale.
fn device_amp_run(device: Device, model: &Model, steps: u64) -> (Vec<f32>, String) {
    use cistern::optim::{GradScaler, GradScalerConfig};
    let client = open(device);
    let mut store = store(&client, model);
    let scaler = GradScaler::new(GradScalerConfig {
        init_scale: 1024.0,
        growth_interval: 2,
        ..GradScalerConfig::default()
    });
    let scaler = ok(scaler, "a scaler");
    let config = AdamWConfig {
        lr: 1e-3,
        ..Default::default()
    };
    for _ in 0..steps {
        let tape = Tape::new(&client);
        let leaves = ok(store.register_resident_params(&tape), "register");
        let value = loss(&store, &tape, &leaves, model);
        let scaled = ok(tape.scale(&value, scaler.scale()), "scaled loss");
        let gradients = ok(store.backward(&tape, &scaled), "backward");
        ok(
            store.step_adamw_amp_on_device(&gradients, &config, &scaler),
            "AMP step",
        );
    }
    let words = ok(store.device_amp_state(), "device AMP state");
    let params = flat(&ok(store.sync_to_host(), "sync_to_host"));
    (params, format!("{words:?}"))
}

/// The store's no-sync AMP step gives the CPU's parameters and the same
/// scale, tracker, skips and step count on every device.
pub fn the_stores_device_amp_step_matches_the_cpus(device: Device) {
    let model = model(0x5706);
    let (got, got_words) = device_amp_run(device, &model, 5);
    let (want, want_words) = device_amp_run(Device::Cpu(0), &model, 5);
    assert_eq!(got_words, want_words, "{device}: the device AMP words");
    let error = max_relative_error(&got, &wide(&want), PARAM_FLOOR);
    assert!(error <= cancelling_tolerance(device), "{device}: {error:e}");
}

/// A replica group of two stores on `device`, each on the whole batch:
/// the mean of two equal gradients is the gradient, so after ten Adam
/// steps both replicas hold, bit for bit, what a lone store holds (the
/// staged gradients read, written back and stepped from on the device).
pub fn a_replica_group_on_this_device_steps_as_a_lone_store(device: Device) {
    use cistern::parallel::{InProcess, ReplicaGroup, Shard};
    let model = model(0x6E);
    let config = OptimizerConfig::Adam(AdamConfig {
        lr: 0.01,
        ..Default::default()
    });
    let clients = vec![open(device), open(device)];
    let mut group = ok(
        ReplicaGroup::new(Box::new(InProcess), clients, &model.params),
        "the group",
    );
    let client = open(device);
    let mut lone = store(&client, &model);
    for _ in 0..10 {
        let stepped = group.step(&config, |replica| {
            let tape = Tape::new(replica.client());
            let store = replica.store_mut();
            let leaves = store.register_resident_params(&tape)?;
            let loss = loss(store, &tape, &leaves, &model);
            store.backward(&tape, &loss).map_err(BackendError::from)?;
            Ok(Shard {
                loss: 0.0,
                examples: 8,
            })
        });
        ok(stepped, "a group step");
        let tape = Tape::new(&client);
        let leaves = ok(lone.register_resident_params(&tape), "register");
        let loss = loss(&lone, &tape, &leaves, &model);
        let gradients = ok(lone.backward(&tape, &loss), "backward");
        ok(step_with(&mut lone, &gradients, &config), "a lone step");
    }
    let digests = ok(group.replica_digests(), "digests");
    assert_eq!(digests[0], digests[1], "{device}");
    assert_eq!(
        flat(&ok(group.parameters(), "group")),
        flat(&ok(lone.sync_to_host(), "lone")),
        "{device}"
    );
}

/// A store's checkpoint, saved streamed into a checkpoint file on
/// `device` and restored from it on the same device: three more Adam
/// steps of each leave both bit-identical.
pub fn a_store_restored_from_its_checkpoint_file_steps_as_the_original(device: Device) {
    use cistern::client::{CheckpointDir, read_checkpoint};
    let model = model(0xC4E);
    let config = OptimizerConfig::Adam(AdamConfig::default());
    let client = open(device);
    let mut original = store(&client, &model);
    let adam_step = |store: &mut DeviceParamStore| {
        let tape = Tape::new(&client);
        let leaves = ok(store.register_resident_params(&tape), "register");
        let loss = loss(store, &tape, &leaves, &model);
        let gradients = ok(store.backward(&tape, &loss), "backward");
        ok(step_with(store, &gradients, &config), "step");
    };
    for _ in 0..3 {
        adam_step(&mut original);
    }
    let dir = std::env::temp_dir().join(format!(
        "cistern-conformance-checkpoint-{}-{}",
        std::process::id(),
        device.to_string().replace(':', "-")
    ));
    let checkpoints = ok(CheckpointDir::create(&dir, 1), "checkpoint dir");
    let path = ok(
        checkpoints.save_store(3, &original, &serde_json::json!({})),
        "save",
    );
    let read = ok(read_checkpoint(&ok(std::fs::read(&path), "file")), "read");
    let _ = std::fs::remove_dir_all(&dir);
    let mut restored = ok(
        DeviceParamStore::restore(&Tape::new(&client), &read.store),
        "restore",
    );
    for _ in 0..3 {
        adam_step(&mut original);
        adam_step(&mut restored);
    }
    assert_eq!(
        ok(restored.checkpoint(), "restored"),
        ok(original.checkpoint(), "original"),
        "{device}"
    );
}
