//! A tape step recorded as a graph and replayed (`capture_step`,
//! `replay_step`): the same parameters and losses as recording every step
//! on the tape, bit for bit, and refusals that change nothing.

use cistern_client::{
    BackendError, BatchInput, Buffer, CrossEntropyOptions, DeviceParamStore, Gradients, GraphInput,
    StepGraph, Tape, Tensor, Var, WeightLayout,
};
use cistern_memory::SplitMix64;
use cistern_optim::{AdamWConfig, OptimizerConfig};
use cistern_runtime::{Activation, DeviceOptions, FaultPlan};

use super::common::{ok, open, open_with, random};

const INPUTS: usize = 5;
const CLASSES: usize = 4;

/// A batch: features, labels, and a constant the forward adds (uploaded
/// with the batch, recorded into a graph as it was at capture).
struct Batch {
    x: Vec<f32>,
    labels: Vec<i64>,
    shift: f32,
}

fn batch(rng: &mut SplitMix64, rows: usize, shift: f32) -> Batch {
    Batch {
        x: random(rng, &[rows, INPUTS]).into_data(),
        labels: (0..rows)
            .map(|_| rng.below(CLASSES as u64) as i64)
            .collect(),
        shift,
    }
}

fn adamw(lr: f64) -> OptimizerConfig {
    OptimizerConfig::AdamW(AdamWConfig {
        lr,
        weight_decay: 0.05,
        ..Default::default()
    })
}

/// A store of a `[5, 4]` weight and a `[4]` bias, and its step counter.
fn store(client: &cistern_client::ComputeClient) -> (DeviceParamStore, Buffer) {
    let mut rng = SplitMix64::new(4405);
    let params = [
        random(&mut rng, &[INPUTS, CLASSES]),
        random(&mut rng, &[CLASSES]),
    ];
    let refs: Vec<&Tensor<f32>> = params.iter().collect();
    let mut store = ok(
        DeviceParamStore::new(&Tape::new(client), &refs),
        "the store",
    );
    let counter = ok(store.step_counter(), "the step counter");
    (store, counter)
}

/// One step of `dropout(x·W + b + shift)` and cross-entropy on `tape`:
/// captured as a graph when `capture`, else stepped through the store.
fn record(
    store: &mut DeviceParamStore,
    tape: &Tape,
    counter: &Buffer,
    batch: &Batch,
    capture: bool,
) -> Result<(f32, Option<StepGraph>), BackendError> {
    let rows = batch.labels.len();
    let leaves = store.register_resident_params(tape)?;
    let x = tape.upload(&Tensor::new([rows, INPUTS], batch.x.clone())?)?;
    let shift = tape.upload(&Tensor::full([rows, CLASSES], batch.shift)?)?;
    let (w, b) = (leaves[0].var(), leaves[1].var());
    let h = tape.linear_with_layout(&x, &w, Some(&b), Activation::Identity, WeightLayout::InOut)?;
    let h = tape.dropout_counted(&tape.add(&h, &shift)?, 0.3, 11, counter)?;
    let targets = tape.class_targets(&batch.labels)?;
    let loss = tape.cross_entropy(&h, &targets, &CrossEntropyOptions::default())?;
    let gradients = store.backward(tape, &loss)?;
    let graph = if capture {
        let inputs = [GraphInput::Values(&x), GraphInput::Classes(&targets)];
        Some(store.capture_step(tape, &gradients, &adamw(1e-2), &loss, &inputs)?)
    } else {
        match adamw(1e-2) {
            OptimizerConfig::AdamW(config) => store.step_adamw(&gradients, &config)?,
            _ => unreachable!("an AdamW config"),
        }
        None
    };
    Ok((loss.item()?, graph))
}

/// `sum(x·W + b)` of six rows of `x` on `tape` and its backward: the
/// input, the loss and the gradients.
fn summed<'t>(
    store: &mut DeviceParamStore,
    tape: &'t Tape,
    x: &[f32],
) -> Result<(Var<'t>, Var<'t>, Gradients<'t>), BackendError> {
    let leaves = store.register_resident_params(tape)?;
    let x = tape.upload(&Tensor::new([6, INPUTS], x.to_vec())?)?;
    let (w, b) = (leaves[0].var(), leaves[1].var());
    let h = tape.linear_with_layout(&x, &w, Some(&b), Activation::Identity, WeightLayout::InOut)?;
    let loss = tape.sum(&h)?;
    let gradients = store.backward(tape, &loss)?;
    Ok((x, loss, gradients))
}

fn replay(
    store: &mut DeviceParamStore,
    graph: &StepGraph,
    batch: &Batch,
) -> Result<f32, BackendError> {
    let inputs = [
        BatchInput::Values(&batch.x),
        BatchInput::Classes(&batch.labels),
    ];
    let loss = store.replay_step(graph, &inputs)?;
    store.read_train_step_loss(&loss)
}

fn bits(store: &DeviceParamStore) -> Vec<u32> {
    let params = ok(store.sync_to_host(), "the parameters");
    params
        .iter()
        .flat_map(|tensor| tensor.data().iter().map(|v| v.to_bits()))
        .collect()
}

#[test]
fn replayed_steps_equal_steps_recorded_on_the_tape_bit_for_bit() {
    let client = open();
    let mut rng = SplitMix64::new(4406);
    // Six rows at shift 0.5, except step 2 at another shift, stepped on
    // the same tape after the capture: its buffers of the same sizes must
    // not be the graph's (whose constant would change), and the counter
    // is written again after it. Step 4 has three rows.
    let batches: Vec<Batch> = (0..7)
        .map(|step| match step {
            2 => batch(&mut rng, 6, -3.0),
            4 => batch(&mut rng, 3, 0.5),
            _ => batch(&mut rng, 6, 0.5),
        })
        .collect();
    let (mut taped, taped_counter) = store(&client);
    let mut tape = Tape::on_stream(&client, taped.stream());
    let mut want = Vec::new();
    for batch in &batches {
        ok(tape.reset(), "reset");
        let (loss, _) = ok(
            record(&mut taped, &tape, &taped_counter, batch, false),
            "a tape step",
        );
        want.push(loss.to_bits());
    }
    let (mut replayed, counter) = store(&client);
    let mut tape = Tape::on_stream(&client, replayed.stream());
    let mut got = Vec::new();
    let mut graph = None;
    for (step, batch) in batches.iter().enumerate() {
        let loss = match (&graph, step) {
            (Some(graph), 3 | 5..) => ok(replay(&mut replayed, graph, batch), "a replay"),
            _ => {
                ok(tape.reset(), "reset");
                let recorded = record(&mut replayed, &tape, &counter, batch, step == 1);
                let (loss, captured) = ok(recorded, "a recorded step");
                graph = graph.or(captured);
                loss
            }
        };
        got.push(loss.to_bits());
    }
    assert_eq!(got, want, "the losses, step by step");
    assert_eq!(replayed.steps(), 7);
    assert_eq!(bits(&replayed), bits(&taped), "the parameters");
    let launches = graph.map(|graph| graph.launches()).unwrap_or(0);
    assert!(
        launches >= 8,
        "the graph holds the step's launches: {launches}"
    );
}

#[test]
fn a_replay_that_does_not_fit_its_graph_is_refused_and_changes_nothing() {
    let client = open();
    let mut rng = SplitMix64::new(4407);
    let (mut store, counter) = store(&client);
    let tape = Tape::on_stream(&client, store.stream());
    let first = batch(&mut rng, 6, 0.5);
    let (_, graph) = ok(record(&mut store, &tape, &counter, &first, true), "capture");
    let graph = graph.expect("a graph");
    let before = bits(&store);
    let next = batch(&mut rng, 6, 0.5);
    let short = &next.x[..6];
    let out_of_range = vec![CLASSES as i64; 6];
    let refusals: [&[BatchInput<'_>]; 4] = [
        &[BatchInput::Values(&next.x)],
        &[BatchInput::Values(short), BatchInput::Classes(&next.labels)],
        &[
            BatchInput::Classes(&next.labels),
            BatchInput::Values(&next.x),
        ],
        &[
            BatchInput::Values(&next.x),
            BatchInput::Classes(&out_of_range),
        ],
    ];
    for (i, batch) in refusals.iter().enumerate() {
        let refused = store.replay_step(&graph, batch);
        assert!(
            matches!(refused, Err(BackendError::InvalidArgument(_))),
            "refusal {i}: {refused:?}"
        );
    }
    let (mut other, _) = self::store(&client);
    let foreign = other.replay_step(&graph, &[BatchInput::Values(&next.x)]);
    assert!(
        matches!(foreign, Err(BackendError::InvalidArgument(_))),
        "{foreign:?}"
    );
    let pending = Tape::on_stream(&client, store.stream());
    ok(
        store.register_resident_params(&pending),
        "a pending forward",
    );
    let refused = replay(&mut store, &graph, &next);
    assert!(
        matches!(refused, Err(BackendError::PendingForwardUnconsumed)),
        "{refused:?}"
    );
    ok(store.abandon_pending_forward(), "abandoned");
    assert_eq!(store.steps(), 1, "no refusal stepped");
    assert_eq!(bits(&store), before, "no refusal changed a parameter");
    ok(replay(&mut store, &graph, &next), "a fitting replay");
    assert_eq!(store.steps(), 2);
    assert_ne!(bits(&store), before);
}

#[test]
fn a_graph_is_refused_after_a_step_with_another_config() {
    let client = open();
    let mut rng = SplitMix64::new(4408);
    let (mut store, counter) = store(&client);
    let mut tape = Tape::on_stream(&client, store.stream());
    let first = batch(&mut rng, 6, 0.5);
    let (_, graph) = ok(record(&mut store, &tape, &counter, &first, true), "capture");
    let graph = graph.expect("a graph");
    ok(tape.reset(), "reset");
    let (_, _, gradients) = ok(summed(&mut store, &tape, &first.x), "a summed forward");
    let OptimizerConfig::AdamW(slower) = adamw(1e-3) else {
        unreachable!("an AdamW config")
    };
    ok(
        store.step_adamw(&gradients, &slower),
        "a step with another lr",
    );
    let refused = replay(&mut store, &graph, &first);
    assert!(
        matches!(refused, Err(BackendError::InvalidArgument(_))),
        "{refused:?}"
    );
    assert_eq!(store.steps(), 2);
}

#[test]
fn a_step_is_captured_only_on_the_stores_stream_and_never_for_lamb() {
    let client = open();
    let mut rng = SplitMix64::new(4409);
    let (mut store, _) = store(&client);
    let first = batch(&mut rng, 6, 0.5);
    let tape = Tape::new(&client);
    let (x, loss, gradients) = ok(summed(&mut store, &tape, &first.x), "a summed forward");
    let inputs = [GraphInput::Values(&x)];
    let refused = store.capture_step(&tape, &gradients, &adamw(1e-2), &loss, &inputs);
    assert!(
        matches!(refused, Err(BackendError::InvalidArgument(_))),
        "{refused:?}"
    );
    let lamb = OptimizerConfig::Lamb(Default::default());
    let refused = store.capture_step(&tape, &gradients, &lamb, &loss, &inputs);
    assert!(
        matches!(refused, Err(BackendError::InvalidArgument(_))),
        "{refused:?}"
    );
    assert_eq!(store.steps(), 0, "nothing stepped");
    let OptimizerConfig::AdamW(config) = adamw(1e-2) else {
        unreachable!("an AdamW config")
    };
    ok(
        store.step_adamw(&gradients, &config),
        "the step, uncaptured",
    );
}

/// A capture on step 0, then a replay of each batch; the parameters' bits
/// and the losses. `retry` replays a batch again when its loss read
/// answers a transient refusal (the refused step was put back).
fn captured_run(
    client: &cistern_client::ComputeClient,
    batches: &[Batch],
    retry: bool,
) -> (Vec<u32>, Vec<f32>, u64, usize) {
    let (mut store, counter) = store(client);
    let mut refused = 0;
    let tape = Tape::on_stream(client, store.stream());
    let (first, rest) = batches.split_first().expect("batches");
    let (loss, graph) = ok(record(&mut store, &tape, &counter, first, true), "capture");
    let graph = graph.expect("a graph");
    let mut losses = vec![loss];
    for batch in rest {
        let mut read = replay(&mut store, &graph, batch);
        if retry
            && matches!(
                read,
                Err(BackendError::DeviceContextCaptureInProgress { .. })
            )
        {
            assert!(!store.is_poisoned(), "a transient refusal never latches");
            refused += 1;
            // The next `&mut` call puts the refused step back and answers
            // the refusal once; `replay_step` then runs the batch again.
            read = replay(&mut store, &graph, batch);
        }
        losses.push(ok(read, "a replay's loss"));
    }
    (bits(&store), losses, store.steps(), refused)
}

#[test]
fn a_replay_refused_as_transient_is_put_back_and_its_retry_trains_as_a_clean_run() {
    let mut rng = SplitMix64::new(4412);
    let batches: Vec<Batch> = (0..4).map(|_| batch(&mut rng, 6, 0.5)).collect();
    let want = captured_run(&open(), &batches, false);
    let refusing = open_with(
        DeviceOptions::with_memory_limit(64 << 20)
            .with_faults(FaultPlan::none().with_busy_replay(1)),
    );
    let (bits, losses, steps, refused) = captured_run(&refusing, &batches, true);
    assert_eq!(refused, 1, "the first replay was refused");
    let got = (bits, losses, steps, 0);
    assert_eq!(got, want, "the parameters' bits, the losses and the steps");
}

#[test]
fn a_trap_inside_a_replayed_step_latches_the_store_and_nothing_of_it_is_readable() {
    let mut rng = SplitMix64::new(4413);
    let batches: Vec<Batch> = (0..2).map(|_| batch(&mut rng, 6, 0.5)).collect();
    // The kernels the capture's step runs, counted on a clean device: the
    // trap lands on the third launch of the first replay.
    let clean = open();
    let (mut store, counter) = store(&clean);
    let tape = Tape::on_stream(&clean, store.stream());
    ok(
        record(&mut store, &tape, &counter, &batches[0], true),
        "capture",
    );
    ok(store.wait_device(), "the captured step ran");
    let before = ok(clean.server_stats(), "stats").kernels_run;
    let trapping = open_with(
        DeviceOptions::with_memory_limit(64 << 20)
            .with_faults(FaultPlan::none().with_trap_at_launch(before + 3)),
    );
    let (mut store, counter) = self::store(&trapping);
    let tape = Tape::on_stream(&trapping, store.stream());
    let (_, graph) = ok(
        record(&mut store, &tape, &counter, &batches[0], true),
        "capture",
    );
    let graph = graph.expect("a graph");
    let read = replay(&mut store, &graph, &batches[1]);
    assert!(
        read.is_err(),
        "the trapped replay's loss is refused: {read:?}"
    );
    assert!(store.is_poisoned(), "a trap latches the store");
    assert!(store.sync_to_host().is_err(), "no parameter is readable");
    let again = store.replay_step(&graph, &[]);
    assert!(
        matches!(again, Err(BackendError::StorePoisoned { .. })),
        "{again:?}"
    );
}
