//! `scripts/gpu-build.sh` gathers every binary `scripts/gpu-check.sh` runs,
//! the checks' time bounds fit the GPU machine's 8 minutes, and the check
//! runs the benchmarks on CUDA. (That each `cistern` command line in it
//! parses is a unit test of the CLI: `src/cli.rs`.)

fn script(name: &str) -> String {
    let path = format!("{}/../scripts/{name}", env!("CARGO_MANIFEST_DIR"));
    match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(error) => panic!("{path}: {error}"),
    }
}

/// The names in gpu-build.sh's `BINARIES="..."` line.
fn built() -> Vec<String> {
    let build = script("gpu-build.sh");
    let line = build
        .lines()
        .find_map(|line| line.strip_prefix("BINARIES=\""))
        .and_then(|rest| rest.strip_suffix('"'));
    match line {
        Some(names) => names.split_whitespace().map(str::to_string).collect(),
        None => panic!("gpu-build.sh has no BINARIES line"),
    }
}

/// `(binary, seconds)` of every `check` line of gpu-check.sh.
fn checks() -> Vec<(String, u64)> {
    script("gpu-check.sh")
        .lines()
        .filter_map(|line| line.trim().strip_prefix("check "))
        .map(|rest| {
            let mut words = rest.split_whitespace();
            let binary = words.next().unwrap_or_default().to_string();
            let seconds = words
                .next()
                .and_then(|s| s.parse().ok())
                .unwrap_or(u64::MAX);
            (binary, seconds)
        })
        .collect()
}

#[test]
fn the_gpu_build_folder_holds_every_binary_the_gpu_check_runs() {
    let built = built();
    let build = script("gpu-build.sh");
    let checks = checks();
    assert!(!checks.is_empty(), "gpu-check.sh runs nothing");
    for (binary, _) in &checks {
        assert!(
            built.contains(binary),
            "gpu-check.sh runs {binary}, which gpu-build.sh does not list"
        );
        assert!(
            build.contains(&format!("\"$OUT/{binary}\"")),
            "gpu-build.sh lists {binary} but never copies it into its folder"
        );
    }
}

/// The seconds of every `step` line of gpu-check.sh (commands that are not
/// gathered binaries: nvcc, python3).
fn steps() -> Vec<u64> {
    script("gpu-check.sh")
        .lines()
        .filter_map(|line| line.trim().strip_prefix("step "))
        .map(|rest| {
            rest.split_whitespace()
                .next()
                .and_then(|s| s.parse().ok())
                .unwrap_or(u64::MAX)
        })
        .collect()
}

/// The seconds of every literal `timeout N` in gpu-check.sh (outside `check`).
fn other_bounds() -> Vec<u64> {
    let check = script("gpu-check.sh");
    check
        .split("timeout ")
        .skip(1)
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .collect()
}

#[test]
fn the_gpu_checks_fit_in_eight_minutes() {
    let checks: u64 = checks().iter().map(|(_, seconds)| *seconds).sum();
    let others: u64 = other_bounds().iter().chain(&steps()).sum();
    let total = checks + others;
    assert!(
        total < 8 * 60,
        "the checks may take {checks} s, the rest {others} s"
    );
}

#[test]
fn the_gpu_check_runs_every_benchmark_on_cuda() {
    let lines: Vec<String> = script("gpu-check.sh")
        .lines()
        .filter(|line| line.trim().starts_with("check cistern "))
        .map(str::to_string)
        .collect();
    for bench in [
        "bench optim --device cuda:0 --optimizer adam --params 268435456",
        "bench gemm --device cuda:0",
        "bench roundtrip --device cuda:0",
    ] {
        assert!(
            lines
                .iter()
                .any(|line| line.ends_with(bench) || line.contains(&format!("{bench} "))),
            "gpu-check.sh does not run `{bench}`"
        );
    }
}
