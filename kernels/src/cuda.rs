//! The CUDA C sources of the kernels, as text for NVRTC, and the PTX that
//! the build compiled from them when it found an NVRTC library.
//!
//! Every source is compiled as one program ([`program`]); each kernel is
//! `extern "C"`, named `cistern_*`, and matches its CPU function in this
//! crate. The runtime's CUDA backend loads the PTX through the driver.

/// Each source file's name and text, the prelude first.
pub const SOURCES: &[(&str, &str)] = &[
    ("prelude.cuh", include_str!("cuda/prelude.cuh")),
    ("control.cu", include_str!("cuda/control.cu")),
    ("elementwise.cu", include_str!("cuda/elementwise.cu")),
    ("strided.cu", include_str!("cuda/strided.cu")),
    ("activation.cu", include_str!("cuda/activation.cu")),
    ("reduce.cu", include_str!("cuda/reduce.cu")),
    ("classify.cu", include_str!("cuda/classify.cu")),
    ("broadcast.cu", include_str!("cuda/broadcast.cu")),
    ("norm.cu", include_str!("cuda/norm.cu")),
    ("max.cu", include_str!("cuda/max.cu")),
    ("attention.cu", include_str!("cuda/attention.cu")),
    ("gemm.cu", include_str!("cuda/gemm.cu")),
    ("optimizer.cu", include_str!("cuda/optimizer.cu")),
    ("lamb.cu", include_str!("cuda/lamb.cu")),
    ("amp.cu", include_str!("cuda/amp.cu")),
];

/// The virtual architecture the build-time PTX targets where NVRTC offers
/// it: the driver JITs it for any newer device (Volta onwards).
pub const PTX_ARCH: i32 = 70;

/// NVRTC options every compile passes besides the architecture. With
/// `--fmad=false` no product is fused into an add unless the source says
/// `fmaf`, as Rust never fuses: the kernels round as the CPU's do.
pub const NVRTC_OPTIONS: &[&str] = &["--fmad=false"];

/// The architecture the build-time PTX targets, given the ones an NVRTC
/// supports (`compute_XY` as `XY`): [`PTX_ARCH`], or the oldest supported
/// past it (NVRTC 13 dropped `compute_70`: its oldest is `compute_75`);
/// `None` when it supports nothing that new.
pub fn ptx_arch(supported: &[i32]) -> Option<i32> {
    supported
        .iter()
        .copied()
        .filter(|&arch| arch >= PTX_ARCH)
        .min()
}

/// Every source as one CUDA C program, in [`SOURCES`] order, then the
/// element-wise kernels made from their definitions (`map/ops.rs`).
pub fn program() -> String {
    let mut text = String::new();
    for (name, source) in SOURCES {
        text.push_str("// ---- ");
        text.push_str(name);
        text.push('\n');
        text.push_str(source);
        text.push('\n');
    }
    text.push_str(&crate::map::cuda_source());
    text
}

/// The PTX compiled from [`program`] at build time for [`PTX_ARCH`], when
/// the build found an NVRTC library; `None` otherwise (the runtime then
/// compiles with NVRTC itself, if it finds one).
pub fn prebuilt_ptx() -> Option<&'static str> {
    #[cfg(cistern_prebuilt_ptx)]
    {
        Some(include_str!(concat!(env!("OUT_DIR"), "/cistern.ptx")))
    }
    #[cfg(not(cistern_prebuilt_ptx))]
    {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_source_is_part_of_the_program_and_declares_c_kernels() {
        let program = program();
        for (name, source) in SOURCES {
            assert!(program.contains(source), "{name} is missing");
        }
        assert!(program.contains("extern \"C\" __global__ void cistern_trap()"));
    }

    #[test]
    fn the_ptx_targets_compute_70_or_the_oldest_arch_past_it_that_nvrtc_has() {
        assert_eq!(ptx_arch(&[50, 60, 70, 75, 80]), Some(70));
        assert_eq!(ptx_arch(&[75, 80, 90, 100]), Some(75));
        assert_eq!(ptx_arch(&[90, 80]), Some(80));
        assert_eq!(ptx_arch(&[50, 61]), None);
        assert_eq!(ptx_arch(&[]), None);
    }
}
