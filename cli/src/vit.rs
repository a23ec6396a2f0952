//! The small vision transformer of issue 44, on 8×8 images: one definition
//! for `examples/vit_digits.rs` and `cistern train --model vit`. Each image
//! is 8 row tokens of 8 pixels; a linear patch embedding, a class token and
//! learned position embeddings, 2 pre-norm encoder blocks (d = 64, 4 heads,
//! a GELU MLP of 128, dropout 0.1), a layer norm and a linear head on the
//! class token.
//!
//! The class token is a learned `[1, 1, 64]` parameter broadcast over the
//! batch and put first (`cat`); the head reads it back with `narrow`.

use cistern_client::{
    AutodiffError, BatchInput, Buffer, ComputeClient, CrossEntropyOptions, DeviceParamStore,
    GraphInput, ShapeError, StepGraph, Tape, Tensor, Var, WeightLayout,
};
use cistern_memory::SplitMix64;
use cistern_optim::OptimizerConfig;
use cistern_runtime::Activation;

/// Rows of an image: its patch tokens.
pub const ROWS: usize = 8;
/// Tokens: the class token and the rows.
pub const TOKENS: usize = ROWS + 1;
/// Pixels of a row: a token's input width.
pub const PIXELS: usize = 8;
/// The model width.
pub const D: usize = 64;
/// Attention heads.
pub const HEADS: usize = 4;
/// The MLP's hidden width.
pub const HIDDEN: usize = 128;
/// Classes of the head.
pub const CLASSES: usize = 10;
/// Encoder blocks.
pub const BLOCKS: usize = 2;
/// Dropout after attention and after the MLP, when training.
pub const DROPOUT: f32 = 0.1;

/// The parameters' initial values, in the order [`forward`] takes them: a
/// weight `[in, out]` uniform in ±1/√in, a bias or position table small,
/// a norm's weight 1 and bias 0.
pub fn parameters(rng: &mut SplitMix64) -> Result<Vec<Tensor<f32>>, ShapeError> {
    let mut params = Vec::new();
    let weight = |rng: &mut SplitMix64, shape: &[usize], bound: f64| {
        let n = shape.iter().product();
        let data = (0..n).map(|_| rng.uniform(-bound, bound) as f32).collect();
        Tensor::new(shape.to_vec(), data)
    };
    let linear = |rng: &mut SplitMix64, fan_in: usize, fan_out: usize, params: &mut Vec<_>| {
        let bound = 1.0 / (fan_in as f64).sqrt();
        params.push(weight(rng, &[fan_in, fan_out], bound));
        params.push(weight(rng, &[fan_out], bound));
    };
    linear(rng, PIXELS, D, &mut params);
    params.push(weight(rng, &[1, 1, D], 0.02));
    params.push(weight(rng, &[TOKENS, D], 0.02));
    for _ in 0..BLOCKS {
        params.push(Tensor::full([D], 1.0));
        params.push(Tensor::full([D], 0.0));
        for _ in 0..4 {
            linear(rng, D, D, &mut params);
        }
        params.push(Tensor::full([D], 1.0));
        params.push(Tensor::full([D], 0.0));
        linear(rng, D, HIDDEN, &mut params);
        linear(rng, HIDDEN, D, &mut params);
    }
    params.push(Tensor::full([D], 1.0));
    params.push(Tensor::full([D], 0.0));
    linear(rng, D, CLASSES, &mut params);
    params.into_iter().collect()
}

/// Where each dropout's seed comes from: a fresh one per call while
/// training, at the step a store's counter holds; none (no dropout) when
/// evaluating.
#[derive(Debug)]
pub struct Dropout {
    seed: Option<(u64, Buffer)>,
}

impl Dropout {
    /// Dropout on, its seeds counting up from `seed` (a forward takes 4),
    /// each at the step `counter` (a store's `step_counter`) holds when
    /// the kernel runs: every step draws new masks, replayed or not.
    pub fn training(seed: u64, counter: &Buffer) -> Self {
        Dropout {
            seed: Some((seed, counter.clone())),
        }
    }

    /// Dropout off.
    pub fn off() -> Self {
        Dropout { seed: None }
    }

    fn apply<'t>(&mut self, tape: &'t Tape, x: &Var<'t>) -> Result<Var<'t>, AutodiffError> {
        match &mut self.seed {
            Some((seed, counter)) => {
                *seed += 1;
                tape.dropout_counted(x, DROPOUT, *seed, counter)
            }
            None => Ok(*x),
        }
    }
}

/// The training steps of the model on its store. A batch size's second
/// step with one config is recorded as a graph (`capture_step`) and later
/// ones replay it; the other steps are recorded on a tape (reset for each,
/// keeping its buffers) and stepped through the store. Dropout's masks
/// follow the store's step counter, so a replayed step draws the masks the
/// same step on a tape would.
#[derive(Debug)]
pub struct VitSteps {
    client: ComputeClient,
    counter: Buffer,
    seed: u64,
    replay: bool,
    tape: Option<Box<Tape>>,
    /// A recorded step per batch size.
    graphs: Vec<(usize, StepGraph)>,
    /// The config of the latest tape step, per batch size.
    stepped: Vec<(usize, OptimizerConfig)>,
    launches: usize,
}

impl VitSteps {
    /// Steps of `store`'s model, dropout seeded from `seed`; `replay`
    /// false records every step on the tape (to compare against).
    pub fn new(
        client: &ComputeClient,
        store: &mut DeviceParamStore,
        seed: u64,
        replay: bool,
    ) -> Result<Self, AutodiffError> {
        Ok(VitSteps {
            client: client.clone(),
            counter: store.step_counter()?,
            seed,
            replay,
            tape: None,
            graphs: Vec::new(),
            stepped: Vec::new(),
            launches: 0,
        })
    }

    /// The kernel launches of the latest step.
    pub fn launches(&self) -> usize {
        self.launches
    }

    /// One step on `images` (`[b, 8, 8]` row-major) and `labels`; the
    /// batch's loss before the update.
    pub fn step(
        &mut self,
        store: &mut DeviceParamStore,
        images: &[f32],
        labels: &[i64],
        options: &CrossEntropyOptions,
        config: &OptimizerConfig,
    ) -> Result<f32, AutodiffError> {
        let rows = labels.len();
        self.graphs.retain(|(_, graph)| graph.config() == config);
        if let Some((_, graph)) = self.graphs.iter().find(|(r, _)| *r == rows) {
            let batch = [BatchInput::Values(images), BatchInput::Classes(labels)];
            let loss = store.replay_step(graph, &batch)?;
            self.launches = graph.launches();
            return Ok(store.read_train_step_loss(&loss)?);
        }
        let capture = self.replay
            && !matches!(config, OptimizerConfig::Lamb(_))
            && self
                .stepped
                .iter()
                .any(|(r, stepped)| *r == rows && stepped == config);
        let reused = self
            .tape
            .take()
            .and_then(|mut tape| tape.reset().ok().map(|()| tape));
        let tape =
            reused.unwrap_or_else(|| Box::new(Tape::on_stream(&self.client, store.stream())));
        let (loss, graph) = self.record(&tape, store, images, labels, options, config, capture)?;
        self.launches = tape.launches().len();
        self.tape = Some(tape);
        self.stepped.retain(|(r, _)| *r != rows);
        self.stepped.push((rows, config.clone()));
        self.graphs.extend(graph.map(|graph| (rows, graph)));
        Ok(loss)
    }

    #[allow(clippy::too_many_arguments)]
    fn record(
        &self,
        tape: &Tape,
        store: &mut DeviceParamStore,
        images: &[f32],
        labels: &[i64],
        options: &CrossEntropyOptions,
        config: &OptimizerConfig,
        capture: bool,
    ) -> Result<(f32, Option<StepGraph>), AutodiffError> {
        let b = labels.len();
        let leaves = store.register_resident_params(tape)?;
        let params: Vec<Var<'_>> = leaves.iter().map(|leaf| leaf.var()).collect();
        let x = tape.upload(&Tensor::new([b, ROWS, PIXELS], images.to_vec())?)?;
        let zeros = tape.upload(&zeros(b)?)?;
        let mut dropout = Dropout::training(self.seed, &self.counter);
        let logits = forward(tape, &params, &x, &zeros, &mut dropout)?;
        let targets = tape.class_targets(labels)?;
        let loss = tape.cross_entropy(&logits, &targets, options)?;
        let gradients = store.backward(tape, &loss)?;
        let graph = if capture {
            let inputs = [GraphInput::Values(&x), GraphInput::Classes(&targets)];
            Some(store.capture_step(tape, &gradients, config, &loss, &inputs)?)
        } else {
            // The family's own step, from the gradients just staged.
            store.step_staged(config)?;
            None
        };
        Ok((loss.item()?, graph))
    }
}

/// `[b, 1, 64]` zeros, over which the class token is broadcast.
pub fn zeros(b: usize) -> Result<Tensor<f32>, ShapeError> {
    Tensor::full([b, 1, D], 0.0)
}

/// `x·w + b` over the last dimension: one GEMM with its bias fused (the
/// leading dimensions flattened into rows, a view).
fn dense<'t>(
    tape: &'t Tape,
    x: &Var<'t>,
    p: &mut std::slice::Iter<'_, Var<'t>>,
) -> Result<Var<'t>, AutodiffError> {
    let (w, b) = (next(p)?, next(p)?);
    let mut shape: Vec<isize> = x.shape().iter().map(|&d| d as isize).collect();
    let width = shape.last().copied().unwrap_or(0);
    let rows = tape.reshape(x, &[-1, width])?;
    let y = tape.linear_with_layout(
        &rows,
        &w,
        Some(&b),
        Activation::Identity,
        WeightLayout::InOut,
    )?;
    if let (Some(last), Some(&out)) = (shape.last_mut(), w.shape().last()) {
        *last = out as isize;
    }
    tape.reshape(&y, &shape)
}

fn next<'t>(p: &mut std::slice::Iter<'_, Var<'t>>) -> Result<Var<'t>, AutodiffError> {
    p.next()
        .copied()
        .ok_or_else(|| AutodiffError::InvalidArgument("vit: too few parameters".into()))
}

/// The logits `[B, 10]` of `images` (`[B, 8, 8]`) under `params` (as
/// [`parameters`] orders them); `zeros` is [`zeros`]`(B)` on the tape.
pub fn forward<'t>(
    tape: &'t Tape,
    params: &[Var<'t>],
    images: &Var<'t>,
    zeros: &Var<'t>,
    dropout: &mut Dropout,
) -> Result<Var<'t>, AutodiffError> {
    let b = images.shape().first().copied().unwrap_or(0);
    let mut p = params.iter();
    let patches = dense(tape, images, &mut p)?;
    let class = tape.add(zeros, &next(&mut p)?)?;
    let mut x = tape.cat(&[&class, &patches], 1)?;
    x = tape.add(&x, &next(&mut p)?)?;
    for _ in 0..BLOCKS {
        let (g, beta) = (next(&mut p)?, next(&mut p)?);
        let h = tape.layer_norm(&x, &[D], Some(&g), Some(&beta), 1e-5)?;
        let q = dense(tape, &h, &mut p)?;
        let k = dense(tape, &h, &mut p)?;
        let v = dense(tape, &h, &mut p)?;
        // The heads split, attended and merged in one kernel, in place.
        let attended = tape.multi_head_attention(&q, &k, &v, HEADS, false)?;
        let attended = dense(tape, &attended, &mut p)?;
        x = tape.add(&x, &dropout.apply(tape, &attended)?)?;
        let (g, beta) = (next(&mut p)?, next(&mut p)?);
        let h = tape.layer_norm(&x, &[D], Some(&g), Some(&beta), 1e-5)?;
        let h = tape.gelu(&dense(tape, &h, &mut p)?)?;
        let h = dense(tape, &h, &mut p)?;
        x = tape.add(&x, &dropout.apply(tape, &h)?)?;
    }
    let (g, beta) = (next(&mut p)?, next(&mut p)?);
    let x = tape.layer_norm(&x, &[D], Some(&g), Some(&beta), 1e-5)?;
    let token = tape.reshape(&tape.narrow(&x, 1, 0, 1)?, &[b as isize, D as isize])?;
    dense(tape, &token, &mut p)
}
