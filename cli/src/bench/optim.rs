//! `cistern bench optim --optimizer NAME --params N`: fused optimizer steps
//! through the server, against an in-place axpy through the same server
//! over the same number of elements, measured in the same run.
//!
//! A second reference, on every device: a copy of the parameter buffer
//! into another through the same server (`ComputeClient::copy`: 8 bytes
//! per element, read plus write; on wgpu a `copy_buffer_to_buffer`, on
//! CUDA a `cuMemcpyDtoDAsync`), in the same rotation.
//!
//! Both run on `--device` (`cpu:0` by default) over random non-zero data, and the axpy runs over
//! the step's own parameter and gradient buffers (`params += ±1e-3·grads`,
//! the sign alternating so parameters stay bounded): on this VM a buffer's
//! bandwidth depends on which physical memory it got, so the reference
//! must use the same memory. Each sample is one command followed by a wait
//! on its token (a synced step); step and axpy samples alternate, so both
//! medians see the same load from whatever else runs on the machine. Bytes are counted per parameter as the update must
//! move them at least once: parameters read and written, gradients read,
//! each state buffer read and written (Adam: 28). The axpy counts 12 per
//! element (`a` read and written, `c` read). On the CPU a diagnostic, the
//! same kernel called directly on host buffers, is sampled in the same
//! rotation, so the server's own cost shows apart from the machine's load.

use std::time::Instant;

use cistern_client::{Buffer, ComputeClient};
use cistern_kernels::StepContext;
use cistern_memory::SplitMix64;
use cistern_optim::{
    AdagradConfig, AdamConfig, AdamWConfig, LambConfig, OptimizerConfig, RmsPropConfig, SgdConfig,
};
use cistern_runtime::{Device, DeviceOptions, KernelLaunch, OptimizerStep, Segment};

const WARMUP: usize = 3;
const SAMPLES: usize = 25;

/// The optimizer `name` names, with PyTorch's defaults (SGD with momentum 0.9).
pub fn config_named(name: &str) -> Result<OptimizerConfig, String> {
    Ok(match name {
        "adam" => OptimizerConfig::Adam(AdamConfig::default()),
        "adamw" => OptimizerConfig::AdamW(AdamWConfig::default()),
        "sgd" => OptimizerConfig::Sgd(SgdConfig {
            momentum: 0.9,
            ..Default::default()
        }),
        "rmsprop" => OptimizerConfig::RmsProp(RmsPropConfig::default()),
        "adagrad" => OptimizerConfig::Adagrad(AdagradConfig::default()),
        "lamb" => OptimizerConfig::Lamb(LambConfig::default()),
        other => {
            return Err(format!(
                "unknown optimizer `{other}`: use adam, adamw, sgd, rmsprop, adagrad or lamb"
            ));
        }
    })
}

/// Runs the benchmark and prints its JSON line.
pub fn run(optimizer: &str, params: u64, device: Device) -> Result<(), String> {
    let config = config_named(optimizer)?;
    if params == 0 {
        return Err("--params must be at least 1".into());
    }
    let numel = usize::try_from(params).map_err(|_| format!("{params} parameters"))?;
    let state_buffers = config.state_layout().len() as u64;
    let buffer_bytes = params * 4;
    // Parameters, gradients, state and the copy's target, with room for the pools' rounding.
    let limit = buffer_bytes * (3 + state_buffers) + (buffer_bytes / 4).max(64 << 20);
    let client = ComputeClient::open(device, DeviceOptions::with_memory_limit(limit))
        .map_err(|e| format!("cannot open {device}: {e}"))?;
    let stream = client.default_stream();
    let mut rng = SplitMix64::new(0x5EED);
    let upload = |rng: &mut SplitMix64, scale: f32| -> Result<Buffer, String> {
        client
            .upload_f32(&rng.non_zero_f32s(numel, scale))
            .map_err(|e| format!("upload: {e}"))
    };
    let weights = upload(&mut rng, 1.0)?;
    let grads = upload(&mut rng, 0.01)?;
    let state = client
        .optimizer_state(&config, params)
        .map_err(|e| format!("optimizer_state: {e}"))?;
    let segments = vec![Segment::new(0, numel)];

    let mut step_count = 0u64;
    let mut step = || -> Result<f64, String> {
        step_count += 1;
        let command = OptimizerStep::new(
            config.clone(),
            step_count,
            segments.clone(),
            weights.whole(),
            grads.whole(),
            state.bindings(),
        );
        let start = Instant::now();
        let token = client
            .optimizer_step(stream, command)
            .map_err(|e| format!("optimizer_step: {e}"))?;
        token.wait().map_err(|e| format!("step: {e}"))?;
        Ok(start.elapsed().as_secs_f64())
    };
    // Alternating signs keep `a` bounded however many samples run.
    let mut sign = 1.0f32;
    let mut axpy = || -> Result<f64, String> {
        sign = -sign;
        let start = Instant::now();
        let token = client
            .launch_tracked(
                stream,
                KernelLaunch::axpy(weights.whole(), sign * 1e-3, grads.whole()),
            )
            .map_err(|e| format!("axpy: {e}"))?;
        token.wait().map_err(|e| format!("axpy: {e}"))?;
        Ok(start.elapsed().as_secs_f64())
    };

    let spare = client
        .reserve(buffer_bytes)
        .map_err(|e| format!("reserve: {e}"))?;
    let copy = || -> Result<f64, String> {
        let start = Instant::now();
        client
            .copy(stream, (&weights, 0), (&spare, 0), buffer_bytes)
            .and_then(|()| client.sync(stream))
            .map_err(|e| format!("copy: {e}"))?;
        Ok(start.elapsed().as_secs_f64())
    };

    // Diagnostic, on the CPU only: the same kernel on host buffers.
    let on_cpu = matches!(device, Device::Cpu(_));
    let mut direct = on_cpu.then(|| HostStep::new(&config, numel, &mut rng));
    let mut samples: [Vec<f64>; 4] = Default::default();
    for round in 0..WARMUP + SAMPLES {
        let taken = [
            step()?,
            axpy()?,
            copy()?,
            match direct.as_mut() {
                Some(host) => host.time(&config, &segments)?,
                None => f64::NAN,
            },
        ];
        if round >= WARMUP {
            for (list, seconds) in samples.iter_mut().zip(taken) {
                list.push(seconds);
            }
        }
    }
    let [step_seconds, axpy_seconds, copy_seconds, direct_seconds] =
        samples.map(|mut s| median(&mut s));
    let copy_gb_per_s = (8 * params) as f64 / copy_seconds / 1e9;
    let direct = |value: f64| on_cpu.then(|| round(value));
    let bytes_per_param = 12 + 8 * state_buffers;
    let gb_per_s = (bytes_per_param * params) as f64 / step_seconds / 1e9;
    let axpy_gb_per_s = (12 * params) as f64 / axpy_seconds / 1e9;
    print_line(serde_json::json!({
        "bench": "optim",
        "device": device.to_string(),
        "optimizer": optimizer,
        "params": params,
        "ms_per_step": round(step_seconds * 1e3),
        "bytes_per_param": bytes_per_param,
        "gb_per_s": round(gb_per_s),
        "axpy_gb_per_s": round(axpy_gb_per_s),
        "vs_axpy": round(gb_per_s / axpy_gb_per_s),
        "copy_gb_per_s": round(copy_gb_per_s),
        "vs_copy": round(gb_per_s / copy_gb_per_s),
        "steps": step_count,
        "direct_ms_per_step": direct(direct_seconds * 1e3),
        "vs_direct": direct(direct_seconds / step_seconds),
    }));
    Ok(())
}

/// The step's kernel called directly on host buffers, without the server.
struct HostStep {
    params: Vec<f32>,
    grads: Vec<f32>,
    state: Vec<Vec<f32>>,
    steps: u64,
}

impl HostStep {
    fn new(config: &OptimizerConfig, numel: usize, rng: &mut SplitMix64) -> HostStep {
        HostStep {
            params: rng.non_zero_f32s(numel, 1.0),
            grads: rng.non_zero_f32s(numel, 0.01),
            state: config
                .state_layout()
                .buffers
                .iter()
                .map(|b| vec![b.initial_value as f32; numel])
                .collect(),
            steps: 0,
        }
    }

    /// Seconds for one step.
    fn time(&mut self, config: &OptimizerConfig, segments: &[Segment]) -> Result<f64, String> {
        self.steps += 1;
        let ctx = StepContext {
            step: self.steps,
            segments,
            found_inf: None,
        };
        let mut views: Vec<&mut [f32]> = self.state.iter_mut().map(|b| b.as_mut_slice()).collect();
        let start = Instant::now();
        cistern_kernels::optimizer_step(config, &ctx, &mut self.params, &self.grads, &mut views)
            .map_err(|e| format!("direct step: {e}"))?;
        Ok(start.elapsed().as_secs_f64())
    }
}

fn round(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

/// The median of `samples` (reordered).
pub(super) fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples.get(samples.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Prints one JSON result line.
pub(super) fn print_line(value: serde_json::Value) {
    println!("{value}");
}
