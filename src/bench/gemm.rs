//! `cistern bench gemm`: square single-precision matrix products through
//! the server (`Kernel::Gemm`, no transpose, no bias), against the GEMM
//! crate called directly on host buffers in the same run.
//!
//! It first prints the cores' measured FMA peak (`bench::peak`), the
//! ceiling no GEMM can pass. The direct reference is one `matrixmultiply::sgemm` call on the same
//! row-major host matrices. Server and direct samples alternate so both see
//! the same load; each server sample is a launch followed by a wait on its
//! token.

use std::time::Instant;

use cistern_client::ComputeClient;
use cistern_kernels::GemmSpec;
use cistern_memory::SplitMix64;
use cistern_runtime::{Device, DeviceOptions, KernelLaunch};

use super::optim::{median, print_line};

/// The sizes measured (m = n = k) and the samples taken of each.
const SIZES: [(usize, usize); 3] = [(512, 60), (1024, 20), (2048, 8)];
const WARMUP: usize = 2;

/// Runs the benchmark and prints one JSON line per size.
pub fn run() -> Result<(), String> {
    let largest = SIZES.iter().map(|&(size, _)| size).max().unwrap_or(0) as u64;
    let limit = 4 * 3 * largest * largest * 2;
    let client = ComputeClient::open(Device::Cpu(0), DeviceOptions::with_memory_limit(limit))
        .map_err(|e| format!("cannot open cpu:0: {e}"))?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let peak = super::peak::fma_peak_gflops(threads);
    print_line(serde_json::json!({
        "bench": "fma_peak",
        "threads": threads,
        "gflops": peak.map(|g| (g * 10.0).round() / 10.0),
    }));
    let mut rng = SplitMix64::new(0x6E33);
    for (size, samples) in SIZES {
        measure(&client, &mut rng, size, samples)?;
    }
    Ok(())
}

fn measure(
    client: &ComputeClient,
    rng: &mut SplitMix64,
    size: usize,
    samples: usize,
) -> Result<(), String> {
    let spec = GemmSpec {
        m: size,
        n: size,
        k: size,
        ..Default::default()
    };
    let a = rng.non_zero_f32s(size * size, 1.0);
    let b = rng.non_zero_f32s(size * size, 1.0);
    let mut c = vec![0.0f32; size * size];
    let upload = |values: &[f32]| {
        client
            .upload_f32(values)
            .map_err(|e| format!("upload: {e}"))
    };
    let (da, db, dc) = (upload(&a)?, upload(&b)?, upload(&c)?);
    let stream = client.default_stream();
    let launch = KernelLaunch::gemm(spec, da.whole(), db.whole(), None, dc.whole());

    let served = || -> Result<f64, String> {
        let start = Instant::now();
        let token = client
            .launch_tracked(stream, launch.clone())
            .map_err(|e| format!("gemm: {e}"))?;
        token.wait().map_err(|e| format!("gemm: {e}"))?;
        Ok(start.elapsed().as_secs_f64())
    };
    let mut direct = || -> Result<f64, String> {
        let start = Instant::now();
        direct_sgemm(size, &a, &b, &mut c);
        Ok(start.elapsed().as_secs_f64())
    };
    for _ in 0..WARMUP {
        served()?;
        direct()?;
    }
    let mut server_samples = Vec::with_capacity(samples);
    let mut direct_samples = Vec::with_capacity(samples);
    for _ in 0..samples {
        server_samples.push(served()?);
        direct_samples.push(direct()?);
    }
    let flops = 2.0 * (size as f64).powi(3);
    let gflops = flops / median(&mut server_samples) / 1e9;
    let direct_gflops = flops / median(&mut direct_samples) / 1e9;
    print_line(serde_json::json!({
        "bench": "gemm",
        "m": size,
        "n": size,
        "k": size,
        "gflops": (gflops * 10.0).round() / 10.0,
        "direct_gflops": (direct_gflops * 10.0).round() / 10.0,
        "vs_direct": (gflops / direct_gflops * 1000.0).round() / 1000.0,
    }));
    Ok(())
}

/// `c = a · b` for row-major `size × size` matrices, by the GEMM crate itself.
fn direct_sgemm(size: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
    let cells = size * size;
    assert!(a.len() >= cells && b.len() >= cells && c.len() >= cells);
    let row = size as isize;
    // SAFETY: the three slices hold `size × size` elements (asserted above),
    // the strides describe row-major matrices within them, and `c` does not
    // alias `a` or `b` (distinct borrows).
    unsafe {
        matrixmultiply::sgemm(
            size,
            size,
            size,
            1.0,
            a.as_ptr(),
            row,
            1,
            b.as_ptr(),
            row,
            1,
            0.0,
            c.as_mut_ptr(),
            row,
            1,
        );
    }
}
