//! End-to-end tests of `cistern bench`, through the built binary: the CPU
//! lines keep their fields and same-run references, and a device that is
//! not here is a clear refusal, never a panic.

use cistern::runtime::{Device, list_devices};
use serde_json::Value;

mod cli;
use cli::{cistern, cistern_with_env, text};

#[test]
fn a_cuda_bench_without_cuda_fails_with_a_clear_message_and_no_panic() {
    if list_devices()
        .iter()
        .any(|info| matches!(info.device, Device::Cuda(_)))
    {
        eprintln!("a CUDA device is present: gpu-check.sh runs these benches");
        return;
    }
    for bench in [
        &["bench", "optim", "--device", "cuda:0", "--params", "1024"][..],
        &["bench", "gemm", "--device", "cuda:0"],
        &["bench", "roundtrip", "--device", "cuda:0"],
    ] {
        let output = cistern(bench);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{bench:?}: {stderr}");
        assert!(
            stderr.contains("--device cuda:0: not present on this machine"),
            "{bench:?}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{bench:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{bench:?} printed a result");
    }
}

#[test]
fn bench_optim_on_the_cpu_prints_one_line_with_its_same_run_references() {
    let output = cistern(&["bench", "optim", "--optimizer", "adam", "--params", "4096"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    let lines = json_lines(&stdout);
    assert_eq!(lines.len(), 1, "{stdout}");
    let line = &lines[0];
    assert_eq!(line["bench"], "optim");
    assert_eq!(line["device"], "cpu:0");
    assert_eq!(line["bytes_per_param"], 28);
    let figures = [
        "gb_per_s",
        "axpy_gb_per_s",
        "copy_gb_per_s",
        "vs_copy",
        "direct_ms_per_step",
    ];
    assert_positive(line, &figures);
}

#[test]
fn bench_gemm_at_one_shape_prints_the_peak_and_that_product_with_its_references() {
    let output = cistern(&["bench", "gemm", "--shape", "64x48x32,tb", "--samples", "2"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    let lines = json_lines(&stdout);
    assert_eq!(lines.len(), 2, "{stdout}");
    let line = &lines[0];
    assert_eq!(line["bench"], "gemm");
    let shape = [&line["m"], &line["n"], &line["k"]];
    assert_eq!(shape, [64, 48, 32], "{line}");
    assert_eq!(
        (&line["transpose_a"], &line["transpose_b"]),
        (&false.into(), &true.into())
    );
    assert!(line["kernel"].is_string(), "{line}");
    let figures = [
        "gflops",
        "best_gflops",
        "cold_gflops",
        "pipelined_gflops",
        "products_per_sample",
        "direct_gflops",
        "other_gflops",
    ];
    assert_positive(line, &figures);
    // The fastest sample is at least as fast as the median one.
    let (best, median) = (line["best_gflops"].as_f64(), line["gflops"].as_f64());
    assert!(best >= median, "{line}");
    // The peak comes last, the faster of its runs before and after.
    let peak = &lines[1];
    assert_eq!(peak["bench"], "fma_peak", "{stdout}");
    if !peak["gflops"].is_null() {
        let ends = [
            peak["before_gflops"].as_f64(),
            peak["after_gflops"].as_f64(),
        ];
        let fastest = ends.into_iter().flatten().fold(0.0, f64::max);
        assert_eq!(peak["gflops"].as_f64(), Some(fastest), "{peak}");
    }
}

#[test]
fn bench_gemm_measures_the_peak_on_as_many_threads_as_rayon_num_threads_gives_the_products() {
    let args = ["bench", "gemm", "--shape", "32x32x32", "--samples", "1"];
    let output = cistern_with_env(&args, &[("RAYON_NUM_THREADS", "1")]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    let lines = json_lines(&stdout);
    let peak = lines.last().expect("bench gemm printed nothing");
    assert_eq!(peak["bench"], "fma_peak", "{stdout}");
    assert_eq!(peak["threads"], 1, "{stdout}");
}

#[test]
fn bench_gemm_refuses_a_shape_it_cannot_read_and_says_how_to_write_one() {
    let output = cistern(&["bench", "gemm", "--shape", "64x48"]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("write MxNxK"), "{stderr}");
    assert!(output.stdout.is_empty());
}

/// Each line of `stdout` as JSON.
fn json_lines(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|line| match serde_json::from_str(line) {
            Ok(value) => value,
            Err(error) => panic!("not a JSON line ({error}): {line}"),
        })
        .collect()
}

/// Every one of `fields` in `line` is a number above 0.
fn assert_positive(line: &Value, fields: &[&str]) {
    for field in fields {
        assert!(
            line[field].as_f64().is_some_and(|x| x > 0.0),
            "{field} in {line}"
        );
    }
}

#[test]
fn bench_allreduce_prints_a_line_per_size_with_its_direct_reference() {
    let output = cistern(&["bench", "allreduce", "--max-bytes", "16384"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    let sizes: Vec<u64> = lines.iter().filter_map(|l| l["bytes"].as_u64()).collect();
    assert_eq!(sizes, vec![1024, 4096, 16384], "{stdout}");
    for line in &lines {
        assert_eq!(line["bench"], "allreduce");
        assert_eq!(line["engine"], "in-process");
        assert!(line["reductions"].as_u64().unwrap_or(0) >= 5, "{line}");
        assert!(
            line["vs_direct"].as_f64().is_some_and(f64::is_finite),
            "{line}"
        );
    }
}

#[test]
fn bench_allreduce_over_mpi_outside_an_mpi_build_or_launch_is_a_clear_error() {
    let output = cistern(&["bench", "allreduce", "--engine", "mpi"]);
    assert!(!output.status.success());
    assert!(
        text(&output.stderr).contains("mpirun"),
        "{}",
        text(&output.stderr)
    );
}
