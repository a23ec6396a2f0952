//! The host's memory, as the CPU device and a CPU adapter size their
//! default limits from it. A leaf.

/// Half the host memory, or 1 GiB when the platform does not say.
pub(crate) fn default_cpu_memory_limit() -> u64 {
    host_memory_bytes().map_or(1 << 30, |bytes| bytes / 2)
}

/// Total host memory in bytes, from `/proc/meminfo` where there is one.
pub fn host_memory_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}
