//! A tape step recorded as a graph and replayed (`capture_step`,
//! `replay_step`), on every device: it trains as the same steps recorded
//! on the tape do, dropout's masks included (they follow the store's step
//! counter on the device).

use cistern::client::{
    BackendError, BatchInput, Buffer, ComputeClient, CrossEntropyOptions, DeviceParamStore,
    GraphInput, StepGraph, Tape, Tensor, WeightLayout,
};
use cistern::memory::SplitMix64;
use cistern::optim::{AdamWConfig, OptimizerConfig};
use cistern::runtime::{Activation, Device};

use super::common::{ok, open};

const ROWS: usize = 24;
const INPUTS: usize = 7;
const CLASSES: usize = 5;
const STEPS: usize = 6;

fn config() -> OptimizerConfig {
    OptimizerConfig::AdamW(AdamWConfig {
        lr: 1e-2,
        weight_decay: 0.05,
        ..Default::default()
    })
}

/// A store of a `[7, 5]` weight and a `[5]` bias, and its step counter.
fn store(client: &ComputeClient) -> (DeviceParamStore, Buffer) {
    let mut rng = SplitMix64::new(4410);
    let mut draw =
        |n: usize| -> Vec<f32> { (0..n).map(|_| rng.uniform(-0.5, 0.5) as f32).collect() };
    let w = ok(Tensor::new([INPUTS, CLASSES], draw(INPUTS * CLASSES)), "w");
    let b = ok(Tensor::new([CLASSES], draw(CLASSES)), "b");
    let mut store = ok(
        DeviceParamStore::new(&Tape::new(client), &[&w, &b]),
        "the store",
    );
    let counter = ok(store.step_counter(), "the step counter");
    (store, counter)
}

/// One step of cross-entropy over `dropout(x·W + b)` on `tape`: captured
/// when `capture`, else the store's AdamW step.
fn record(
    store: &mut DeviceParamStore,
    tape: &Tape,
    counter: &Buffer,
    (x, labels): (&[f32], &[i64]),
    capture: bool,
) -> Result<(f32, Option<StepGraph>), BackendError> {
    let leaves = store.register_resident_params(tape)?;
    let x = tape.upload(&Tensor::new([ROWS, INPUTS], x.to_vec())?)?;
    let (w, b) = (leaves[0].var(), leaves[1].var());
    let h = tape.linear_with_layout(&x, &w, Some(&b), Activation::Identity, WeightLayout::InOut)?;
    let h = tape.dropout_counted(&h, 0.25, 3, counter)?;
    let targets = tape.class_targets(labels)?;
    let loss = tape.cross_entropy(&h, &targets, &CrossEntropyOptions::default())?;
    let gradients = store.backward(tape, &loss)?;
    let graph = if capture {
        let inputs = [GraphInput::Values(&x), GraphInput::Classes(&targets)];
        Some(store.capture_step(tape, &gradients, &config(), &loss, &inputs)?)
    } else {
        store.step_staged(&config())?;
        None
    };
    Ok((loss.item()?, graph))
}

pub fn a_replayed_tape_step_trains_as_the_tape_steps(device: Device) {
    let client = open(device);
    let mut rng = SplitMix64::new(4411);
    let batches: Vec<(Vec<f32>, Vec<i64>)> = (0..STEPS)
        .map(|_| {
            let x = (0..ROWS * INPUTS)
                .map(|_| rng.uniform(-1.0, 1.0) as f32)
                .collect();
            let labels = (0..ROWS)
                .map(|_| rng.below(CLASSES as u64) as i64)
                .collect();
            (x, labels)
        })
        .collect();
    let run = |replay: bool| {
        let (mut store, counter) = store(&client);
        let mut tape = Tape::on_stream(&client, store.stream());
        let (mut losses, mut graph) = (Vec::new(), None);
        for (step, (x, labels)) in batches.iter().enumerate() {
            let loss = match &graph {
                Some(graph) => {
                    let batch = [BatchInput::Values(x), BatchInput::Classes(labels)];
                    let loss = ok(store.replay_step(graph, &batch), "a replay");
                    ok(store.read_train_step_loss(&loss), "its loss")
                }
                None => {
                    ok(tape.reset(), "reset");
                    let capture = replay && step == 1;
                    let recorded = record(&mut store, &tape, &counter, (x, labels), capture);
                    let (loss, captured) = ok(recorded, "a tape step");
                    graph = captured;
                    loss
                }
            };
            losses.push(loss);
        }
        let params: Vec<f32> = ok(store.sync_to_host(), "the parameters")
            .iter()
            .flat_map(|tensor| tensor.data().to_vec())
            .collect();
        (losses, params, store.steps())
    };
    let (want_losses, want_params, want_steps) = run(false);
    let (losses, params, steps) = run(true);
    assert_eq!(steps, want_steps, "{device}: the steps counted");
    let close = |a: f32, b: f32| (a - b).abs() <= 1e-5 * (1.0 + b.abs());
    for (step, (&got, &want)) in losses.iter().zip(&want_losses).enumerate() {
        assert!(
            close(got, want),
            "{device}: step {step}'s loss {got} against {want}"
        );
    }
    for (i, (&got, &want)) in params.iter().zip(&want_params).enumerate() {
        assert!(
            close(got, want),
            "{device}: parameter {i}: {got} against {want}"
        );
    }
}
