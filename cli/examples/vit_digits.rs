//! A small vision transformer on the 8×8 handwritten digits, trained
//! through a `DeviceParamStore` with AdamW (issue 44); the model is
//! `cistern_cli::vit`, which `cistern train --model vit` trains too.
//! `cargo run --release -p cistern-cli --example vit_digits --
//! [--epochs N] [--device cpu:0|wgpu:0] [--no-graph]`: a batch size's
//! second step is recorded as a graph and later ones replay it
//! (`--no-graph`: every step recorded on the tape, to compare).

use std::time::Instant;

use cistern::client::{ComputeClient, CrossEntropyOptions, DeviceParamStore, Tape, Tensor, Var};
use cistern::memory::SplitMix64;
use cistern::optim::{AdamWConfig, OptimizerConfig};
use cistern::runtime::{Device, DeviceOptions};
use cistern_cli::vit::{self, CLASSES, Dropout, PIXELS, ROWS, VitSteps, forward, zeros};

const BATCH: usize = 64;

type Error = Box<dyn std::error::Error>;

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
        let logits = forward(&tape, &params, &x, &zeros, &mut Dropout::off())?;
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
    let (mut epochs, mut device, mut graph) = (60usize, Device::Cpu(0), true);
    while let Some(arg) = args.next() {
        if arg == "--no-graph" {
            graph = false;
            continue;
        }
        match (arg.as_str(), args.next()) {
            ("--epochs", Some(n)) => epochs = n.parse()?,
            ("--device", Some(name)) => device = parse_device(&name)?,
            _ => return Err(format!("unknown argument {arg}; see the file's doc").into()),
        }
    }
    let client = ComputeClient::open(device, DeviceOptions::with_memory_limit(1 << 30))?;
    let mut rng = SplitMix64::new(44);
    let data = digits(&mut rng);
    let params = vit::parameters(&mut rng)?;
    let count: usize = params.iter().map(Tensor::len).sum();
    let refs: Vec<&Tensor<f32>> = params.iter().collect();
    let mut store = DeviceParamStore::new(&Tape::new(&client), &refs)?;
    let config = OptimizerConfig::AdamW(AdamWConfig {
        lr: 1e-3,
        weight_decay: 0.05,
        ..Default::default()
    });
    println!(
        "vit on digits: {} train / {} validation images, {count} parameters, {device}",
        data.train.1.len(),
        data.validation.1.len()
    );
    let (images, labels) = &data.train;
    let n = labels.len();
    let mut steps_of = VitSteps::new(&client, &mut store, 1 << 20, graph)?;
    let options = CrossEntropyOptions::default();
    let started = Instant::now();
    let (mut steps, mut evaluating) = (0usize, 0.0);
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
            total += f64::from(steps_of.step(&mut store, &x, &y, &options, &config)?);
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
        "{steps} steps in {seconds:.1} s ({:.2} ms a step, batch {BATCH}, {} kernel launches a step, {})",
        1000.0 * seconds / steps.max(1) as f64,
        steps_of.launches(),
        if graph {
            "replayed as one graph"
        } else {
            "recorded on the tape"
        }
    );
    Ok(())
}
