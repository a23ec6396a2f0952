//! Kernel throughput as JSON lines, without criterion: every optimizer
//! family's fused step against in-place axpy over 64M elements, and
//! activations over 4M.
//! Run: `cargo run --release -p cistern-kernels --example kernel_throughput`
//! (add `RUSTFLAGS="-C target-cpu=native"` to see what wider vectors buy).
//! `benches/kernels.rs` prints the Adam and activation lines after its
//! criterion report.
//!
//! Each optimizer line carries `traffic_ratio`: its time over the time axpy's
//! GB/s (measured in the same run) needs to move the step's bytes. 1.0 is
//! memory-bound; the target is ≤ 1.3.

use std::hint::black_box;
use std::time::Instant;

use cistern_kernels::{Activation, Segment, StepContext, activation_forward, axpy, optimizer_step};
use cistern_optim::{
    AdagradConfig, AdamConfig, AdamWConfig, LambConfig, OptimizerConfig, RmsPropConfig, SgdConfig,
};

const ELEMENTS: usize = 64 << 20;
const ACTIVATION_ELEMENTS: usize = 4 << 20;
const AXPY_BYTES: u64 = 12;
/// Interleaved rounds; each kernel's figure is its best call over all.
const ROUNDS: usize = 4;

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

/// One optimizer under test, with the bytes its step must move per element.
struct Case {
    name: &'static str,
    config: OptimizerConfig,
    bytes_per_element: u64,
}

fn cases() -> Vec<Case> {
    let case = |name, config, bytes_per_element| Case {
        name,
        config,
        bytes_per_element,
    };
    vec![
        case(
            "sgd_momentum",
            OptimizerConfig::Sgd(SgdConfig {
                momentum: 0.9,
                ..SgdConfig::default()
            }),
            20,
        ),
        case("adam", OptimizerConfig::Adam(AdamConfig::default()), 28),
        case("adamw", OptimizerConfig::AdamW(AdamWConfig::default()), 28),
        case(
            "rmsprop",
            OptimizerConfig::RmsProp(RmsPropConfig::default()),
            20,
        ),
        case(
            "rmsprop_centered_momentum",
            OptimizerConfig::RmsProp(RmsPropConfig {
                momentum: 0.9,
                centered: true,
                ..RmsPropConfig::default()
            }),
            36,
        ),
        case(
            "adagrad",
            OptimizerConfig::Adagrad(AdagradConfig::default()),
            20,
        ),
        // The gradient norm reads g (4), the measuring pass p, g, m, v (16),
        // the write pass is Adam's (28): see `kernels/src/optimizer/lamb.rs`.
        case("lamb", OptimizerConfig::Lamb(LambConfig::default()), 48),
    ]
}

struct Buffers {
    params: Vec<f32>,
    grads: Vec<f32>,
    state: Vec<Vec<f32>>,
    step: u64,
}

impl Buffers {
    fn new(n: usize, state_buffers: usize) -> Self {
        Self {
            params: data(n, 1),
            grads: data(n, 2),
            state: (0..state_buffers)
                .map(|i| data(n, 3 + i as u32).iter().map(|v| v.abs()).collect())
                .collect(),
            step: 0,
        }
    }

    fn step(&mut self, config: &OptimizerConfig, segments: &[Segment]) {
        self.step += 1;
        let ctx = StepContext {
            step: self.step,
            segments,
            found_inf: None,
        };
        let mut state: Vec<&mut [f32]> = self.state.iter_mut().map(|b| &mut b[..]).collect();
        let outcome = optimizer_step(config, &ctx, &mut self.params, &self.grads, &mut state);
        if let Err(error) = black_box(outcome) {
            eprintln!("step failed: {error}");
        }
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

fn gb_per_s(elements: usize, bytes_per_element: u64, seconds: f64) -> f64 {
    (elements as u64 * bytes_per_element) as f64 / seconds / 1e9
}

fn json_line(kernel: &str, elements: usize, bytes_per_element: u64, seconds: f64, extra: &str) {
    println!(
        "{{\"bench\":\"kernels\",\"kernel\":\"{kernel}\",\"elements\":{elements},\"bytes_per_element\":{bytes_per_element},\"gb_per_s\":{:.2},\"seconds\":{seconds:.5}{extra},\"codegen\":\"{}\",\"cpus\":{}}}",
        gb_per_s(elements, bytes_per_element, seconds),
        vector_width(),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
}

fn main() {
    let only: Option<String> = std::env::args().nth(1);
    let segments = [Segment::new(0, ELEMENTS)];
    let mut a = data(ELEMENTS, 5);
    let c = data(ELEMENTS, 6);
    let mut axpy_seconds = f64::INFINITY;
    let mut measure_axpy = || {
        best_seconds(3, || {
            black_box(axpy(&mut a, 1e-3, &c)).ok();
        })
    };
    let mut results = Vec::new();
    for case in cases() {
        if only.as_deref().is_some_and(|o| o != case.name) {
            continue;
        }
        let mut buffers = Buffers::new(ELEMENTS, case.config.state_layout().len());
        // Interleaved, best of several: the machine is shared, and a burst of
        // someone else's work should not land on one kernel only.
        let mut seconds = f64::INFINITY;
        for _ in 0..ROUNDS {
            seconds = seconds.min(best_seconds(3, || buffers.step(&case.config, &segments)));
            axpy_seconds = axpy_seconds.min(measure_axpy());
        }
        results.push((case, seconds));
    }
    let axpy_gb = gb_per_s(ELEMENTS, AXPY_BYTES, axpy_seconds);
    json_line("axpy", ELEMENTS, AXPY_BYTES, axpy_seconds, "");
    for (case, seconds) in results {
        let traffic_seconds = (ELEMENTS as u64 * case.bytes_per_element) as f64 / (axpy_gb * 1e9);
        let extra = format!(
            ",\"over_axpy_gb_per_s\":{:.3},\"traffic_ratio\":{:.3}",
            gb_per_s(ELEMENTS, case.bytes_per_element, seconds) / axpy_gb,
            seconds / traffic_seconds
        );
        json_line(case.name, ELEMENTS, case.bytes_per_element, seconds, &extra);
    }
    if only.is_some() {
        return;
    }
    let x = data(ACTIVATION_ELEMENTS, 7);
    let mut y = vec![0.0f32; ACTIVATION_ELEMENTS];
    let activations = [
        ("gelu", Activation::Gelu),
        ("gelu_tanh", Activation::GeluTanh),
        ("relu", Activation::Relu),
    ];
    for (name, activation) in activations {
        let seconds = best_seconds(5, || {
            black_box(activation_forward(activation, &x, &mut y)).ok();
        });
        json_line(name, ACTIVATION_ELEMENTS, 8, seconds, "");
    }
}
