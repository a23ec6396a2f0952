//! `cistern devices`: what is present on this machine, as the runtime lists it.

use cistern_runtime::{absent_backends, list_devices};

/// Prints one line per device present, then one per backend built in with
/// no device here, saying why.
pub(crate) fn print_devices() -> Result<(), String> {
    for info in list_devices() {
        let memory = info.memory_bytes.map_or_else(
            || "unknown memory".to_string(),
            |b| format!("{:.1} GiB", gib(b)),
        );
        println!(
            "{}  {}: {} compute units, {memory}, default limit {:.1} GiB",
            info.device,
            info.name,
            info.compute_units,
            gib(info.default_memory_limit)
        );
    }
    for absent in absent_backends() {
        println!("{}  none: {}", absent.backend, absent.reason);
    }
    Ok(())
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}
