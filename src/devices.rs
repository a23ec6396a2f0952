//! `cistern devices`: what is present on this machine.

/// Prints one line per device present.
pub(crate) fn print_devices() -> Result<(), String> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let memory = host_memory_bytes()
        .map_or_else(|| "unknown memory".to_string(), |b| format!("{:.1} GiB", gib(b)));
    println!("cpu:0  {cores} cores, {memory}");
    Ok(())
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

fn host_memory_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
