//! `cistern bench gemm`: single-precision matrix products through the
//! server (`Kernel::Gemm`, no bias), against the kernel chosen for each
//! shape called directly on host buffers in the same run.
//!
//! Its last line is the cores' FMA peak at their widest vector
//! (`bench::peak`), the ceiling no GEMM can pass, measured before and
//! after the products (the faster of the two). Per shape: the
//! squares 512³, 1024³, 2048³ and the six products of an MLP 784-1024-1024-10
//! at batch 256 (forward, weight gradients with A transposed, input
//! gradients with B transposed). The direct reference is one call of the
//! kernel [`GemmKernel::chosen_for`] picks, on the same row-major host
//! matrices; the alternative kernel, forced through `gemm_with`, shows what
//! the choice is worth. Turns of the three alternate so all see the same
//! load, in every order in turn; a turn is two products, the second
//! sampled, so that each sample follows its own kind, as PyTorch's do (the
//! server's first, after other work, is `cold_gflops`). Each server sample
//! is a launch followed by a wait on its token (`gflops`: the median;
//! `best_gflops`: the fastest, to read against the peak).
//! Each round ends with a `pipelined_gflops` sample: 4 launches queued at
//! once and waited on together, the server's throughput without a round
//! trip per product. `device_gflops` counts the device's kernel time over
//! every server launch, the pipelined ones too.
//!
//! With `--device` other than the CPU (`wgpu:0`, `cuda:0`) the same lines
//! are printed, each naming its device, with the server's GEMM on that
//! device: the host references are the CPU's, so they are `null` there, and
//! `device_gflops` counts the device's own kernel time where it takes
//! timestamps. On a CUDA device `direct_gflops` is cuBLAS's `cublasSgemm`
//! on the same matrices in buffers of its own (`bench::cublas`), its samples
//! alternating with the server's, and the run fails unless both products
//! agree; where cuBLAS cannot be loaded it is `null` and
//! `reference_absent` says why.

use std::time::Instant;

use cistern_client::{Buffer, ComputeClient};
use cistern_kernels::{GemmKernel, GemmSpec, gemm_threads, gemm_with};
use cistern_memory::SplitMix64;
use cistern_runtime::{Device, DeviceOptions, KernelLaunch};

use super::cublas::Cublas;
use super::optim::{median, print_line};

/// One product `bench gemm` measures: m×n×k, and which operands are
/// transposed. Written `MxNxK`, with `,ta` and/or `,tb` for a transposed A
/// or B (`784x1024x256,ta`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape(pub usize, pub usize, pub usize, pub bool, pub bool);

impl std::str::FromStr for Shape {
    type Err = String;

    fn from_str(text: &str) -> Result<Shape, String> {
        let mut parts = text.split(',');
        let sizes = parts.next().unwrap_or_default();
        let sizes: Vec<&str> = sizes.split('x').collect();
        let [m, n, k] = sizes[..] else {
            return Err(format!(
                "`{text}` is not a shape: write MxNxK, then ,ta and/or ,tb (784x1024x256,ta)"
            ));
        };
        let size = |name: &str, value: &str| match value.parse::<usize>() {
            Ok(size) if size > 0 => Ok(size),
            _ => Err(format!(
                "`{text}`: {name} must be a whole number above 0, not `{value}`"
            )),
        };
        let mut shape = Shape(size("m", m)?, size("n", n)?, size("k", k)?, false, false);
        for flag in parts {
            match flag {
                "ta" if !shape.3 => shape.3 = true,
                "tb" if !shape.4 => shape.4 = true,
                _ => return Err(format!("`{text}`: `{flag}` is not ta or tb (once each)")),
            }
        }
        Ok(shape)
    }
}

/// The shapes measured by default.
const SHAPES: [Shape; 9] = [
    Shape(512, 512, 512, false, false),
    Shape(1024, 1024, 1024, false, false),
    Shape(2048, 2048, 2048, false, false),
    // MLP 784-1024-1024-10, batch 256: forward (X·W).
    Shape(256, 1024, 784, false, false),
    Shape(256, 1024, 1024, false, false),
    // Weight gradients (Xᵀ·dY).
    Shape(784, 1024, 256, true, false),
    Shape(1024, 1024, 256, true, false),
    // Input gradients (dY·Wᵀ).
    Shape(256, 784, 1024, false, true),
    Shape(256, 1024, 1024, false, true),
];
const WARMUP: usize = 2;
/// Launches queued together in a `pipelined_gflops` sample.
const PIPELINE: usize = 4;
/// The most floats a shape's A, B and C may hold together (4 GiB).
const MAX_FLOATS: usize = 1 << 30;
/// Samples per shape: about this many flops' worth, within the bounds below.
const FLOPS_PER_SHAPE: f64 = 3e10;
const MIN_SAMPLES: usize = 8;
const MAX_SAMPLES: usize = 60;

/// Runs the benchmark on `device` and prints one JSON line for the host's
/// peak and one per shape (`shapes`, or every default one where it is
/// empty); `samples` fixes the samples per shape (one warm-up then), for
/// devices too slow for the default budget.
pub fn run(device: Device, samples: Option<usize>, shapes: &[Shape]) -> Result<(), String> {
    let shapes = if shapes.is_empty() {
        &SHAPES[..]
    } else {
        shapes
    };
    let mut largest = 0u64;
    for &Shape(m, n, k, ..) in shapes {
        let floats = [(m, k), (k, n), (m, n)]
            .iter()
            .try_fold(0usize, |sum, &(rows, cols)| {
                rows.checked_mul(cols)
                    .and_then(|part| sum.checked_add(part))
            })
            .filter(|&floats| floats <= MAX_FLOATS)
            .ok_or_else(|| {
                format!(
                    "{m}x{n}x{k}: A, B and C hold over {MAX_FLOATS} floats; pick a smaller shape"
                )
            })?;
        largest = largest.max(floats as u64);
    }
    let limit = 4 * 2 * largest;
    let client = ComputeClient::open(device, DeviceOptions::with_memory_limit(limit))
        .map_err(|e| format!("cannot open {device}: {e}"))?;
    // As many threads as the products split over (`RAYON_NUM_THREADS`).
    let threads = gemm_threads();
    let before = super::peak::fma_peak(threads);
    // cuBLAS, the reference on a CUDA device, or why there is none.
    let mut cublas = match device {
        Device::Cuda(ordinal) => Some(Cublas::open(ordinal)),
        _ => None,
    };
    let mut rng = SplitMix64::new(0x6E33);
    for &Shape(m, n, k, transpose_a, transpose_b) in shapes {
        let spec = GemmSpec {
            m,
            n,
            k,
            transpose_a,
            transpose_b,
            ..Default::default()
        };
        measure(&client, device, samples, &mut rng, &spec, cublas.as_mut())?;
    }
    // Measured again after the products: a host that took a vCPU for the
    // first seconds (a peak read at half of what the products then ran at)
    // rarely takes it at both ends.
    let after = super::peak::fma_peak(threads);
    let fastest = [before, after]
        .into_iter()
        .flatten()
        .max_by(|x, y| x.gflops.total_cmp(&y.gflops));
    print_line(serde_json::json!({
        "bench": "fma_peak",
        "device": device.to_string(),
        "threads": threads,
        "vector_bits": fastest.map(|p| p.vector_bits),
        "gflops": fastest.map(|p| round1(p.gflops)),
        "before_gflops": before.map(|p| round1(p.gflops)),
        "after_gflops": after.map(|p| round1(p.gflops)),
    }));
    Ok(())
}

/// One of the three products a round of samples runs.
#[derive(Clone, Copy)]
enum Turn {
    Server,
    Direct,
    Other,
}

/// Every order of the three, one per round in turn.
const ORDERS: [[Turn; 3]; 6] = {
    use Turn::{Direct as D, Other as O, Server as S};
    [
        [S, D, O],
        [S, O, D],
        [D, S, O],
        [D, O, S],
        [O, S, D],
        [O, D, S],
    ]
};

fn measure(
    client: &ComputeClient,
    device: Device,
    fixed_samples: Option<usize>,
    rng: &mut SplitMix64,
    spec: &GemmSpec,
    cublas: Option<&mut Result<Cublas, String>>,
) -> Result<(), String> {
    let GemmSpec { m, n, k, .. } = *spec;
    let on_cpu = matches!(device, Device::Cpu(_));
    let kernel = GemmKernel::chosen_for(spec);
    let other = alternative(kernel);
    let a = rng.non_zero_f32s(m * k, 1.0);
    let b = rng.non_zero_f32s(k * n, 1.0);
    let mut c = vec![0.0f32; m * n];
    let upload = |values: &[f32]| {
        client
            .upload_f32(values)
            .map_err(|e| format!("upload: {e}"))
    };
    let (da, db, dc) = (upload(&a)?, upload(&b)?, upload(&c)?);
    let stream = client.default_stream();
    let launch = KernelLaunch::gemm(*spec, da.whole(), db.whole(), None, dc.whole());

    let served = || -> Result<f64, String> {
        let start = Instant::now();
        let token = client
            .launch_tracked(stream, launch.clone())
            .map_err(|e| format!("gemm: {e}"))?;
        token.wait().map_err(|e| format!("gemm: {e}"))?;
        Ok(start.elapsed().as_secs_f64())
    };
    // The server's throughput apart from its latency: `PIPELINE` launches
    // queued at once, then their tokens waited on; a sample is the mean.
    let pipelined = || -> Result<f64, String> {
        let start = Instant::now();
        let tokens = (0..PIPELINE)
            .map(|_| client.launch_tracked(stream, launch.clone()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("gemm: {e}"))?;
        for token in tokens {
            token.wait().map_err(|e| format!("gemm: {e}"))?;
        }
        Ok(start.elapsed().as_secs_f64() / PIPELINE as f64)
    };
    let mut direct = || -> Result<f64, String> {
        let start = Instant::now();
        direct_product(kernel, spec, &a, &b, &mut c)?;
        Ok(start.elapsed().as_secs_f64())
    };
    let mut c_other = vec![0.0f32; m * n];
    let mut forced = || -> Result<f64, String> {
        let start = Instant::now();
        gemm_with(other, spec, &a, &b, None, &mut c_other).map_err(|e| format!("gemm: {e}"))?;
        Ok(start.elapsed().as_secs_f64())
    };
    // The host references only mean something beside the CPU's own GEMM.
    let host = |run: &mut dyn FnMut() -> Result<f64, String>| {
        if on_cpu { run() } else { Ok(f64::NAN) }
    };
    // cuBLAS on buffers of its own holding the same matrices, where it opened.
    let (mut cublas, reference_absent) = match cublas {
        Some(Ok(blas)) => {
            blas.prepare(spec, &a, &b)?;
            (Some(blas), None)
        }
        Some(Err(reason)) => (None, Some(reason.clone())),
        None => (None, None),
    };
    let mut on_device = || match cublas.as_mut() {
        Some(blas) => blas.time(),
        None => Ok(f64::NAN),
    };
    let warmup = if fixed_samples.is_some() { 1 } else { WARMUP };
    for _ in 0..warmup {
        served()?;
        host(&mut direct)?;
        host(&mut forced)?;
        on_device()?;
    }
    let flops = 2.0 * (m * n * k) as f64;
    let samples = fixed_samples.map_or_else(
        || ((FLOPS_PER_SHAPE / flops) as usize).clamp(MIN_SAMPLES, MAX_SAMPLES),
        |n| n.max(1),
    );
    let (mut server_samples, mut direct_samples, mut other_samples) = (vec![], vec![], vec![]);
    let mut cublas_samples = vec![];
    let mut pipelined_samples = vec![];
    let mut cold_samples = vec![];
    let device_ns_before = kernel_device_ns(client)?;
    for round in 0..samples {
        // A product right after the alternative kernel's measured up to 10%
        // slower at the 2–4 ms shapes: the rounds cycle through every order
        // of the three, so the server's and the direct product follow each
        // of the others equally often.
        for &turn in &ORDERS[round % ORDERS.len()] {
            // Two products a turn: the first follows other work (the
            // server's is `cold_gflops`), the second its own, as PyTorch's
            // samples follow each other.
            match turn {
                Turn::Server => {
                    cold_samples.push(served()?);
                    server_samples.push(served()?);
                }
                Turn::Direct => {
                    host(&mut direct)?;
                    direct_samples.push(host(&mut direct)?);
                }
                Turn::Other => {
                    host(&mut forced)?;
                    other_samples.push(host(&mut forced)?);
                }
            }
        }
        cublas_samples.push(on_device()?);
        pipelined_samples.push(pipelined()?);
    }
    let device_ns = kernel_device_ns(client)?
        .zip(device_ns_before)
        .map(|(after, before)| after.saturating_sub(before));
    let max_abs_diff = match cublas.as_ref() {
        Some(blas) => Some(agreement(client, &dc, blas, k)?),
        None => None,
    };
    // Per round: two server launches, the pipelined ones, two of each host
    // product, one cuBLAS call.
    let products_per_sample =
        2 + PIPELINE + if on_cpu { 4 } else { 0 } + usize::from(cublas.is_some());
    let gflops = flops / median(&mut server_samples) / 1e9;
    // The fastest server sample: what the product does on cores no other
    // guest took, read against the FMA peak, itself the fastest of its runs.
    let best_gflops = flops / fastest(&server_samples) / 1e9;
    let direct_gflops = if cublas.is_some() {
        Some(flops / median(&mut cublas_samples) / 1e9)
    } else {
        on_cpu.then(|| flops / median(&mut direct_samples) / 1e9)
    };
    let other_gflops = flops / median(&mut other_samples) / 1e9;
    // Under 1 GFLOPS (a CPU Vulkan driver; a tiny product in a debug build
    // on a busy machine) one decimal would read 0: keep three figures there.
    let figure = |value: f64| {
        if value >= 1.0 {
            round1(value)
        } else {
            round3(value)
        }
    };
    let host_figure = |value: f64| on_cpu.then(|| figure(value));
    let (kernel_name, reference) = match device {
        Device::Cpu(_) => (kernel.name(), Some("direct")),
        Device::Wgpu(_) => ("wgsl_tiled", None),
        Device::Cuda(_) => ("cuda_tiled", Some("cublas")),
    };
    print_line(serde_json::json!({
        "bench": "gemm",
        "device": device.to_string(),
        "kernel": kernel_name,
        "vector_bits": on_cpu.then(GemmKernel::cpu_vector_bits),
        "m": m,
        "n": n,
        "k": k,
        "transpose_a": spec.transpose_a,
        "transpose_b": spec.transpose_b,
        "gflops": figure(gflops),
        "best_gflops": figure(best_gflops),
        "products_per_sample": products_per_sample,
        "cold_gflops": figure(flops / median(&mut cold_samples) / 1e9),
        "pipelined_gflops": figure(flops / median(&mut pipelined_samples) / 1e9),
        "device_gflops": device_ns
            .filter(|&ns| ns > 0)
            .map(|ns| figure(flops * (samples * (2 + PIPELINE)) as f64 / ns as f64)),
        "reference": reference,
        "reference_absent": reference_absent,
        "direct_gflops": direct_gflops.map(figure),
        "vs_direct": direct_gflops.map(|direct| (gflops / direct * 1000.0).round() / 1000.0),
        "reference_max_abs_diff": max_abs_diff,
        "other_kernel": on_cpu.then(|| other.name()),
        "other_gflops": host_figure(other_gflops),
    }));
    Ok(())
}

/// The shortest of `samples` (seconds), NaN for none.
fn fastest(samples: &[f64]) -> f64 {
    samples.iter().copied().reduce(f64::min).unwrap_or(f64::NAN)
}

/// The largest difference between the server's C and cuBLAS's; an error
/// past what rounding over `k` products explains (the inputs lie in
/// ±[0.5, 1.5), so a wrong transpose is off by whole units).
fn agreement(
    client: &ComputeClient,
    served: &Buffer,
    blas: &Cublas,
    k: usize,
) -> Result<f64, String> {
    let ours = client
        .download_f32(served)
        .map_err(|e| format!("download: {e}"))?;
    let theirs = blas.result()?;
    if ours.len() != theirs.len() {
        return Err(format!(
            "C has {} elements through the server, {} from cuBLAS",
            ours.len(),
            theirs.len()
        ));
    }
    if let Some(index) = (0..ours.len()).find(|&i| !(ours[i].is_finite() && theirs[i].is_finite()))
    {
        return Err(format!(
            "C[{index}] is {} through the server, {} from cuBLAS",
            ours[index], theirs[index]
        ));
    }
    let worst = ours
        .iter()
        .zip(&theirs)
        .map(|(x, y)| f64::from((x - y).abs()))
        .fold(0.0, f64::max);
    let tolerance = 1e-5 * k as f64;
    if worst > tolerance {
        return Err(format!(
            "the server's GEMM and cuBLAS differ by {worst} (more than {tolerance})"
        ));
    }
    Ok(round3(worst))
}

/// The device's kernel time so far, where it takes timestamps.
fn kernel_device_ns(client: &ComputeClient) -> Result<Option<u64>, String> {
    client
        .server_stats()
        .map(|stats| stats.kernel_device_ns)
        .map_err(|e| format!("server_stats: {e}"))
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// `x` to three significant figures.
fn round3(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let scale = 10f64.powi(2 - x.abs().log10().floor() as i32);
    (x * scale).round() / scale
}

/// The kernel whose figures show what choosing `kernel` is worth: the
/// `gemm` crate against the packed kernel; where the packed one is not
/// chosen, the packed kernel at 256 bits and more (it has AVX-512 and
/// AVX2 + FMA micro-kernels), else the two crates against each other.
fn alternative(kernel: GemmKernel) -> GemmKernel {
    match (kernel, GemmKernel::cpu_vector_bits()) {
        (GemmKernel::Packed, _) => GemmKernel::Gemm,
        (_, bits) if bits >= 256 => GemmKernel::Packed,
        (GemmKernel::Gemm, _) => GemmKernel::MatrixMultiply,
        _ => GemmKernel::Gemm,
    }
}

/// `c = op(a)·op(b)` by the kernel itself, as one call: the `gemm` crate
/// with its own threading on rayon's pool, `matrixmultiply` on the calling
/// thread (it has no threads of its own without its `threading` feature,
/// which Cistern leaves off), the packed kernel through `gemm_with` (it is
/// Cistern's own, so that is the direct call).
fn direct_product(
    kernel: GemmKernel,
    spec: &GemmSpec,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
) -> Result<(), String> {
    let GemmSpec { m, n, k, .. } = *spec;
    if a.len() != m * k || b.len() != k * n || c.len() != m * n || m * n * k == 0 {
        return Err(format!("direct gemm: buffers do not match {spec:?}"));
    }
    // Strides of op(A) (m×k) and op(B) (k×n) over their row-major storage.
    let (a_row, a_col) = if spec.transpose_a { (1, m) } else { (k, 1) };
    let (b_row, b_col) = if spec.transpose_b { (1, k) } else { (n, 1) };
    let (a_row, a_col, b_row, b_col) = (
        a_row as isize,
        a_col as isize,
        b_row as isize,
        b_col as isize,
    );
    match kernel {
        // SAFETY: the three slices hold op(A), op(B) and C exactly (checked
        // above), the strides address those matrices within them, and `c`
        // does not alias `a` or `b` (distinct borrows).
        // The crate wants a column-major destination: Cᵀ = op(B)ᵀ·op(A)ᵀ,
        // as the `gemm` facade computes a row-major C.
        GemmKernel::Gemm => unsafe {
            gemm_f32::gemm::f32::get_gemm_fn()(
                n,
                m,
                k,
                c.as_mut_ptr(),
                n as isize,
                1,
                false,
                b.as_ptr(),
                b_row,
                b_col,
                a.as_ptr(),
                a_row,
                a_col,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm_common::Parallelism::Rayon(0),
            )
        },
        GemmKernel::Packed => {
            gemm_with(kernel, spec, a, b, None, c).map_err(|e| format!("gemm: {e}"))?
        }
        // SAFETY: as above.
        GemmKernel::MatrixMultiply => unsafe {
            matrixmultiply::sgemm(
                m,
                k,
                n,
                1.0,
                a.as_ptr(),
                a_row,
                a_col,
                b.as_ptr(),
                b_row,
                b_col,
                0.0,
                c.as_mut_ptr(),
                n as isize,
                1,
            )
        },
    }
    Ok(())
}
