//! `cistern devices`: every device present with what a user needs to pick
//! one, then a line per backend that is absent saying why; and the choice
//! behind `--device` (`cpu`, `auto`, `kind:N`).

use cistern_runtime::{Device, DeviceInfo, absent_backends, list_devices};

/// Prints the devices present, then each backend with none and why.
pub(crate) fn print_devices() -> Result<(), String> {
    let devices = list_devices();
    for info in &devices {
        println!("{}", describe(info));
    }
    for absent in absent_backends() {
        println!("{}: absent: {}", absent.backend, absent.reason);
    }
    Ok(())
}

fn describe(info: &DeviceInfo) -> String {
    let limit = format!("memory limit {}", gib(info.default_memory_limit));
    match info.device {
        Device::Cpu(_) => {
            let memory = info.memory_bytes.map_or_else(
                || "memory unknown".to_string(),
                |b| format!("{} host memory", gib(b)),
            );
            format!(
                "{}  {} ({}): {} cores, {} vectors, {memory}, {limit}",
                info.device,
                info.name,
                cpu_model().unwrap_or_else(|| "model unknown".into()),
                info.compute_units,
                vector_width(),
            )
        }
        _ => {
            let memory = info
                .memory_bytes
                .map_or_else(|| "memory unknown".to_string(), gib);
            let kind = if is_cpu_type(info) {
                "CPU-type adapter"
            } else {
                "GPU"
            };
            format!(
                "{}  {}: {kind}, {} compute units, {memory}, {limit}",
                info.device, info.name, info.compute_units
            )
        }
    }
}

/// Whether a non-CPU device is a software rasteriser posing as a GPU
/// (lavapipe, llvmpipe, SwiftShader): slower than the CPU backend.
fn is_cpu_type(info: &DeviceInfo) -> bool {
    let name = info.name.to_ascii_lowercase();
    ["llvmpipe", "lavapipe", "swiftshader", "software", "cpu"]
        .iter()
        .any(|word| name.contains(word))
}

/// The rank of a device for `--device auto`: higher is better. A CPU-type
/// adapter ranks below the CPU backend.
fn rank(info: &DeviceInfo) -> u8 {
    match info.device {
        Device::Cuda(_) => 3,
        Device::Wgpu(_) if is_cpu_type(info) => 0,
        Device::Wgpu(_) => 2,
        Device::Cpu(_) => 1,
    }
}

/// The best of `devices` by [`rank`]; the first listed among equals.
fn best(devices: &[DeviceInfo]) -> Option<Device> {
    let mut best: Option<&DeviceInfo> = None;
    for info in devices {
        if best.is_none_or(|b| rank(info) > rank(b)) {
            best = Some(info);
        }
    }
    best.map(|info| info.device)
}

/// The device `spec` names: `cpu`, `auto` (the best present), or
/// `cpu:N`, `wgpu:N`, `cuda:N`. A device not present is an error listing
/// those that are.
pub(crate) fn choose(spec: &str) -> Result<Device, String> {
    // The CPU backend is always present: no probe of the other backends.
    if spec == "cpu" {
        return Ok(Device::Cpu(0));
    }
    // Every CPU ordinal is a share of the same cores (`--devices cpu:0,cpu:1`).
    if let Some(Device::Cpu(ordinal)) = parse(spec) {
        return match ordinal < cistern_runtime::backend::cpu::MAX_CPU_ORDINALS {
            true => Ok(Device::Cpu(ordinal)),
            false => Err(format!(
                "{spec}: the CPU is cpu:0 to cpu:{}, each a share of its cores",
                cistern_runtime::backend::cpu::MAX_CPU_ORDINALS - 1
            )),
        };
    }
    let devices = list_devices();
    let present = || {
        devices
            .iter()
            .map(|d| d.device.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let device = match spec {
        "auto" => return best(&devices).ok_or_else(|| "no device is present".to_string()),
        _ => parse(spec).ok_or_else(|| {
            format!("--device {spec}: expected cpu, auto, cpu:N, wgpu:N or cuda:N")
        })?,
    };
    if devices.iter().any(|d| d.device == device) {
        Ok(device)
    } else {
        Err(format!(
            "--device {spec}: not present on this machine (present: {}; `cistern devices` says why)",
            present()
        ))
    }
}

fn parse(spec: &str) -> Option<Device> {
    let (kind, ordinal) = spec.split_once(':')?;
    let ordinal = ordinal.parse().ok()?;
    match kind {
        "cpu" => Some(Device::Cpu(ordinal)),
        "wgpu" => Some(Device::Wgpu(ordinal)),
        "cuda" => Some(Device::Cuda(ordinal)),
        _ => None,
    }
}

/// The CPU's model name, from `/proc/cpuinfo` where there is one.
fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("model name"))?;
    Some(line.split_once(':')?.1.trim().to_string())
}

/// The widest vector unit this CPU has, as the GEMM kernels would use it.
fn vector_width() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return "AVX-512 (512-bit)";
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            return "AVX2 (256-bit)";
        }
        "SSE2 (128-bit)"
    }
    #[cfg(target_arch = "aarch64")]
    {
        "NEON (128-bit)"
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        "scalar"
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(device: Device, name: &str) -> DeviceInfo {
        DeviceInfo {
            device,
            name: name.into(),
            compute_units: 1,
            memory_bytes: None,
            default_memory_limit: 1,
        }
    }

    #[test]
    fn auto_never_ranks_a_cpu_type_adapter_above_the_cpu() {
        let devices = [
            info(Device::Wgpu(0), "llvmpipe (LLVM 15.0.6, 256 bits)"),
            info(Device::Cpu(0), "host CPU"),
        ];
        assert_eq!(best(&devices), Some(Device::Cpu(0)));
        let devices = [
            info(Device::Cpu(0), "host CPU"),
            info(Device::Wgpu(1), "NVIDIA H200"),
        ];
        assert_eq!(best(&devices), Some(Device::Wgpu(1)));
    }

    #[test]
    fn a_device_spec_is_parsed_or_refused_with_the_forms_it_takes() {
        assert_eq!(choose("cpu"), Ok(Device::Cpu(0)));
        assert_eq!(choose("cpu:0"), Ok(Device::Cpu(0)));
        assert!(choose("auto").is_ok());
        let error = choose("tpu").expect_err("no such kind");
        assert!(error.contains("expected cpu, auto"), "{error}");
        let error = choose("cuda:3").expect_err("absent");
        assert!(error.contains("not present"), "{error}");
    }
}
