//! CPU kernel throughput: the fused Adam step against in-place axpy, the
//! memory-bound baseline it should approach (issue 7), plus activations to
//! show what wider vector units buy on compute-bound kernels.
//!
//! Besides criterion's report, prints one JSON line per kernel:
//! `{"bench":"kernels","kernel":"adam","elements":N,"gb_per_s":X,...}`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use cistern_kernels::{Activation, Segment, StepContext, activation_forward, adam_step, axpy};
use cistern_optim::AdamConfig;
use criterion::{Criterion, Throughput};

const ELEMENTS: usize = 64 << 20;
const ACTIVATION_ELEMENTS: usize = 4 << 20;
const ADAM_BYTES: u64 = 28;
const AXPY_BYTES: u64 = 12;

/// Deterministic non-zero data in roughly [-1, 1].
fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2_654_435_761).max(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x as f32 / u32::MAX as f32) * 2.0 - 0.999
        })
        .collect()
}

struct AdamBuffers {
    params: Vec<f32>,
    grads: Vec<f32>,
    exp_avg: Vec<f32>,
    exp_avg_sq: Vec<f32>,
    step: u64,
}

impl AdamBuffers {
    fn new(n: usize) -> Self {
        Self {
            params: data(n, 1),
            grads: data(n, 2),
            exp_avg: data(n, 3),
            exp_avg_sq: data(n, 4).iter().map(|v| v.abs()).collect(),
            step: 0,
        }
    }

    fn step(&mut self, config: &AdamConfig, segments: &[Segment]) {
        self.step += 1;
        let ctx = StepContext {
            step: self.step,
            segments,
            found_inf: None,
        };
        let mut state = [&mut self.exp_avg[..], &mut self.exp_avg_sq[..]];
        let outcome = adam_step(config, &ctx, &mut self.params, &self.grads, &mut state);
        black_box(outcome).ok();
    }
}

/// Best-of-`runs` seconds for `f`, after one warm-up call.
fn best_seconds(runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn vector_width() -> &'static str {
    if cfg!(target_feature = "avx512f") {
        "avx512"
    } else if cfg!(target_feature = "avx2") {
        "avx2"
    } else {
        "baseline"
    }
}

fn json_line(kernel: &str, elements: usize, bytes_per_element: u64, seconds: f64) -> f64 {
    let gb_per_s = (elements as u64 * bytes_per_element) as f64 / seconds / 1e9;
    println!(
        "{{\"bench\":\"kernels\",\"kernel\":\"{kernel}\",\"elements\":{elements},\"gb_per_s\":{gb_per_s:.2},\"seconds\":{seconds:.5},\"codegen\":\"{}\",\"cpus\":{}}}",
        vector_width(),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    gb_per_s
}

fn main() {
    let mut criterion = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .configure_from_args();

    let config = AdamConfig::default();
    let segments = [Segment::new(0, ELEMENTS)];
    let mut adam = AdamBuffers::new(ELEMENTS);
    let mut a = data(ELEMENTS, 5);
    let c = data(ELEMENTS, 6);

    let mut group = criterion.benchmark_group("optimizer");
    group.throughput(Throughput::Bytes(ELEMENTS as u64 * ADAM_BYTES));
    group.bench_function("adam_64m", |b| b.iter(|| adam.step(&config, &segments)));
    group.throughput(Throughput::Bytes(ELEMENTS as u64 * AXPY_BYTES));
    group.bench_function("axpy_64m", |b| {
        b.iter(|| black_box(axpy(&mut a, 1e-3, &c)).ok())
    });
    group.finish();

    let x = data(ACTIVATION_ELEMENTS, 7);
    let mut y = vec![0.0f32; ACTIVATION_ELEMENTS];
    let activations = [
        ("gelu", Activation::Gelu),
        ("gelu_tanh", Activation::GeluTanh),
        ("relu", Activation::Relu),
    ];
    let mut group = criterion.benchmark_group("activation");
    group.throughput(Throughput::Bytes(ACTIVATION_ELEMENTS as u64 * 8));
    for (name, activation) in activations {
        group.bench_function(format!("{name}_4m"), |b| {
            b.iter(|| black_box(activation_forward(activation, &x, &mut y)).ok())
        });
    }
    group.finish();

    // Interleaved, best of several: the machine is shared, and a burst of
    // someone else's work should not land on one kernel only.
    let (mut adam_seconds, mut axpy_seconds) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..4 {
        adam_seconds = adam_seconds.min(best_seconds(3, || adam.step(&config, &segments)));
        axpy_seconds = axpy_seconds.min(best_seconds(3, || {
            black_box(axpy(&mut a, 1e-3, &c)).ok();
        }));
    }
    let adam_gb = json_line("adam", ELEMENTS, ADAM_BYTES, adam_seconds);
    let axpy_gb = json_line("axpy", ELEMENTS, AXPY_BYTES, axpy_seconds);
    println!(
        "{{\"bench\":\"kernels\",\"kernel\":\"adam_over_axpy\",\"ratio\":{:.3},\"target\":0.85}}",
        adam_gb / axpy_gb
    );
    for (name, activation) in activations {
        let seconds = best_seconds(5, || {
            black_box(activation_forward(activation, &x, &mut y)).ok();
        });
        json_line(name, ACTIVATION_ELEMENTS, 8, seconds);
    }
}
