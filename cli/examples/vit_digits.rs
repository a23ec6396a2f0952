//! A small vision transformer on the 8×8 handwritten digits, trained
//! through a `DeviceParamStore` with AdamW (issue 44). Each image is 8 row
//! tokens of 8 pixels; a linear patch embedding, a class token and learned
//! position embeddings, 2 pre-norm encoder blocks (d = 64, 4 heads, a GELU
//! MLP of 128, dropout 0.1), a layer norm and a linear head on the class
//! token. `cargo run --release -p cistern-cli --example vit_digits --
//! [--epochs N] [--device cpu:0|wgpu:0]`.
//!
//! The class token is a learned `[1, 1, 64]` parameter broadcast over the
//! batch and put first (`cat`); the head reads it back with `narrow`.

use std::time::Instant;

use cistern::client::{
    AutodiffError, ComputeClient, CrossEntropyOptions, DeviceParamStore, Tape, Tensor, Var,
};
use cistern::memory::SplitMix64;
use cistern::optim::AdamWConfig;
use cistern::runtime::{Device, DeviceOptions};

const ROWS: usize = 8;
const TOKENS: usize = ROWS + 1;
const PIXELS: usize = 8;
const D: usize = 64;
const HEADS: usize = 4;
const HIDDEN: usize = 128;
const CLASSES: usize = 10;
const BLOCKS: usize = 2;
const BATCH: usize = 64;
const DROPOUT: f32 = 0.1;

type Error = Box<dyn std::error::Error>;

/// The parameters' shapes, in store order, with how each starts: a
/// weight `[in, out]` uniform in ±1/√in, a bias or position table small,
/// a norm's weight 1 and bias 0.
fn parameters(rng: &mut SplitMix64) -> Result<Vec<Tensor<f32>>, Error> {
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
    Ok(params.into_iter().collect::<Result<_, _>>()?)
}

/// Where the next dropout's seed comes from: a fresh one per call, none
/// when evaluating.
struct Dropout {
    seed: Option<u64>,
}

impl Dropout {
    fn apply<'t>(&mut self, tape: &'t Tape, x: &Var<'t>) -> Result<Var<'t>, AutodiffError> {
        match &mut self.seed {
            Some(seed) => {
                *seed += 1;
                tape.dropout(x, DROPOUT, *seed)
            }
            None => Ok(*x),
        }
    }
}

/// `x·w + b` over the last dimension.
fn dense<'t>(
    tape: &'t Tape,
    x: &Var<'t>,
    p: &mut std::slice::Iter<'_, Var<'t>>,
) -> Result<Var<'t>, AutodiffError> {
    let (w, b) = (next(p)?, next(p)?);
    tape.add(&tape.matmul(x, &w)?, &b)
}

fn next<'t>(p: &mut std::slice::Iter<'_, Var<'t>>) -> Result<Var<'t>, AutodiffError> {
    p.next()
        .copied()
        .ok_or_else(|| AutodiffError::InvalidArgument("too few parameters".into()))
}

/// `[B, T, D]` as `[B, heads, T, D/heads]`, and back.
fn split_heads<'t>(tape: &'t Tape, x: &Var<'t>, b: usize) -> Result<Var<'t>, AutodiffError> {
    let x = tape.reshape(x, &[b as isize, TOKENS as isize, HEADS as isize, -1])?;
    tape.permute(&x, &[0, 2, 1, 3])
}

fn merge_heads<'t>(tape: &'t Tape, x: &Var<'t>, b: usize) -> Result<Var<'t>, AutodiffError> {
    let x = tape.permute(x, &[0, 2, 1, 3])?;
    tape.reshape(&x, &[b as isize, TOKENS as isize, D as isize])
}

/// The logits `[B, 10]` of `images` (`[B, 8, 8]`); `zeros` is `[B, 1, 64]`.
fn forward<'t>(
    tape: &'t Tape,
    params: &[Var<'t>],
    images: &Var<'t>,
    zeros: &Var<'t>,
    dropout: &mut Dropout,
) -> Result<Var<'t>, AutodiffError> {
    let b = images.shape()[0];
    let mut p = params.iter();
    let patches = dense(tape, images, &mut p)?;
    let class = tape.add(zeros, &next(&mut p)?)?;
    let mut x = tape.cat(&[&class, &patches], 1)?;
    x = tape.add(&x, &next(&mut p)?)?;
    for _ in 0..BLOCKS {
        let (g, beta) = (next(&mut p)?, next(&mut p)?);
        let h = tape.layer_norm(&x, &[D], Some(&g), Some(&beta), 1e-5)?;
        let q = split_heads(tape, &dense(tape, &h, &mut p)?, b)?;
        let k = split_heads(tape, &dense(tape, &h, &mut p)?, b)?;
        let v = split_heads(tape, &dense(tape, &h, &mut p)?, b)?;
        let attended = tape.scaled_dot_product_attention(&q, &k, &v, None, false)?;
        let attended = dense(tape, &merge_heads(tape, &attended, b)?, &mut p)?;
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

/// The digits, scaled to [0, 1], each image as its 8 rows of 8 pixels,
/// split 80/20 by a seeded shuffle.
struct Digits {
    train: (Vec<f32>, Vec<usize>),
    validation: (Vec<f32>, Vec<usize>),
}

fn digits(rng: &mut SplitMix64) -> Digits {
    let data = smartcore::dataset::digits::load_dataset();
    let n = data.num_samples;
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let split = n * 4 / 5;
    let take = |indices: &[usize]| {
        let mut images = Vec::with_capacity(indices.len() * ROWS * PIXELS);
        let mut labels = Vec::with_capacity(indices.len());
        for &i in indices {
            images.extend(data.data[i * 64..(i + 1) * 64].iter().map(|&v| v / 16.0));
            labels.push(data.target[i].max(0.0) as usize);
        }
        (images, labels)
    };
    Digits {
        train: take(&order[..split]),
        validation: take(&order[split..]),
    }
}

/// `[b, 1, 64]` zeros, over which the class token is broadcast.
fn zeros(b: usize) -> Result<Tensor<f32>, Error> {
    Ok(Tensor::full([b, 1, D], 0.0)?)
}

/// Accuracy of the store's parameters on `images`/`labels`, no dropout.
fn accuracy(
    client: &ComputeClient,
    store: &DeviceParamStore,
    (images, labels): &(Vec<f32>, Vec<usize>),
) -> Result<f64, Error> {
    let mut correct = 0;
    for (chunk, chunk_labels) in images.chunks(256 * ROWS * PIXELS).zip(labels.chunks(256)) {
        let b = chunk_labels.len();
        let tape = Tape::new(client);
        let leaves = store.snapshot_resident_params(&tape)?;
        let params: Vec<Var<'_>> = leaves.iter().map(|leaf| leaf.var()).collect();
        let x = tape.upload(&Tensor::new([b, ROWS, PIXELS], chunk.to_vec())?)?;
        let zeros = tape.upload(&zeros(b)?)?;
        let logits = forward(&tape, &params, &x, &zeros, &mut Dropout { seed: None })?;
        let logits = logits.to_host()?;
        for (row, &label) in logits.data().chunks(CLASSES).zip(chunk_labels) {
            let best = (0..CLASSES)
                .max_by(|&a, &b| row[a].total_cmp(&row[b]))
                .unwrap_or(0);
            correct += usize::from(best == label);
        }
    }
    Ok(correct as f64 / labels.len() as f64)
}

/// `cpu:N`, `wgpu:N` or `cuda:N`.
fn parse_device(name: &str) -> Result<Device, Error> {
    let (kind, ordinal) = name.split_once(':').unwrap_or((name, "0"));
    let ordinal: usize = ordinal.parse()?;
    match kind {
        "cpu" => Ok(Device::Cpu(ordinal)),
        "wgpu" => Ok(Device::Wgpu(ordinal)),
        "cuda" => Ok(Device::Cuda(ordinal)),
        _ => Err(format!("no device kind {kind}: cpu, wgpu or cuda").into()),
    }
}

fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let (mut epochs, mut device) = (60usize, Device::Cpu(0));
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--epochs", Some(n)) => epochs = n.parse()?,
            ("--device", Some(name)) => device = parse_device(&name)?,
            _ => return Err(format!("unknown argument {arg}; see the file's doc").into()),
        }
    }
    let client = ComputeClient::open(device, DeviceOptions::with_memory_limit(1 << 30))?;
    let mut rng = SplitMix64::new(44);
    let data = digits(&mut rng);
    let params = parameters(&mut rng)?;
    let count: usize = params.iter().map(Tensor::len).sum();
    let refs: Vec<&Tensor<f32>> = params.iter().collect();
    let mut store = DeviceParamStore::new(&Tape::new(&client), &refs)?;
    let config = AdamWConfig {
        lr: 1e-3,
        weight_decay: 0.05,
        ..Default::default()
    };
    println!(
        "vit on digits: {} train / {} validation images, {count} parameters, {device}",
        data.train.1.len(),
        data.validation.1.len()
    );
    let (images, labels) = &data.train;
    let n = labels.len();
    let mut seed = 0u64;
    let started = Instant::now();
    let (mut steps, mut launches, mut evaluating) = (0usize, 0usize, 0.0);
    for epoch in 1..=epochs {
        let mut order: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let mut total = 0.0;
        for batch in order.chunks(BATCH) {
            let mut x = Vec::with_capacity(batch.len() * ROWS * PIXELS);
            let mut y = Vec::with_capacity(batch.len());
            for &i in batch {
                x.extend_from_slice(&images[i * ROWS * PIXELS..(i + 1) * ROWS * PIXELS]);
                y.push(labels[i] as i64);
            }
            let tape = Tape::new(&client);
            let leaves = store.register_resident_params(&tape)?;
            let p: Vec<Var<'_>> = leaves.iter().map(|leaf| leaf.var()).collect();
            let input = tape.upload(&Tensor::new([batch.len(), ROWS, PIXELS], x)?)?;
            let zeros = tape.upload(&zeros(batch.len())?)?;
            seed += 1 << 20;
            let mut dropout = Dropout { seed: Some(seed) };
            let logits = forward(&tape, &p, &input, &zeros, &mut dropout)?;
            let targets = tape.class_targets(&y)?;
            let loss = tape.cross_entropy(&logits, &targets, &CrossEntropyOptions::default())?;
            let gradients = store.backward(&tape, &loss)?;
            store.step_adamw(&gradients, &config)?;
            total += f64::from(loss.item()?);
            launches = tape.launches().len();
            steps += 1;
        }
        let batches = n.div_ceil(BATCH) as f64;
        if epoch % 10 == 0 || epoch == epochs {
            let began = Instant::now();
            let validation = accuracy(&client, &store, &data.validation)?;
            println!(
                "epoch {epoch:3}  train loss {:.4}  validation accuracy {:.2}%",
                total / batches,
                100.0 * validation
            );
            evaluating += began.elapsed().as_secs_f64();
        }
    }
    let seconds = started.elapsed().as_secs_f64() - evaluating;
    println!(
        "{steps} steps in {seconds:.1} s ({:.1} ms a step, batch {BATCH}, {launches} kernel launches a step)",
        1000.0 * seconds / steps.max(1) as f64
    );
    Ok(())
}
