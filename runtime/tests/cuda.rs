//! The CUDA backend where this machine has no GPU (and where it has one):
//! absence is an answer, never a panic, and the kernels compile with NVRTC
//! whenever an NVRTC library is found.
#![cfg(feature = "cuda")]

use cistern_runtime::backend::cuda;
use cistern_runtime::{Device, DeviceOptions, ServerError, absent_backends, list_devices, open};

/// Says a skip past the test harness's capture, so it is seen.
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "cuda tests: {line}");
}

fn cuda_listed() -> bool {
    list_devices()
        .iter()
        .any(|info| matches!(info.device, Device::Cuda(_)))
}

#[test]
fn cuda_is_either_listed_or_absent_with_a_reason() {
    let absent: Vec<_> = absent_backends()
        .into_iter()
        .filter(|a| a.backend == "cuda")
        .collect();
    assert_eq!(cuda_listed(), absent.is_empty());
    for why in absent {
        assert!(!why.reason.is_empty());
    }
}

#[test]
fn opening_cuda_where_it_is_absent_is_cuda_unavailable_with_the_reason() {
    if cuda_listed() {
        say("CUDA is present; the absence path is not taken here");
        return;
    }
    match open(Device::Cuda(0), DeviceOptions::default()) {
        Err(ServerError::CudaUnavailable { reason }) => assert!(!reason.is_empty()),
        Err(other) => panic!("expected CudaUnavailable, got {other}"),
        Ok(_) => panic!("cuda:0 opened with no CUDA device listed"),
    }
}

#[test]
fn probing_cuda_again_gives_the_same_answer() {
    let first = cuda::devices();
    let second = cuda::devices();
    assert_eq!(first, second);
}

#[test]
fn an_ordinal_past_the_devices_present_is_device_unavailable_where_cuda_works() {
    let opened = open(Device::Cuda(64), DeviceOptions::default()).map(|_| ());
    if cuda_listed() {
        assert!(matches!(opened, Err(ServerError::DeviceUnavailable { .. })));
    } else {
        say("CUDA is absent: cuda:64 is CudaUnavailable, as any ordinal");
        assert!(matches!(opened, Err(ServerError::CudaUnavailable { .. })));
    }
}

/// The `.entry` names of a PTX text.
fn entries(ptx: &str) -> Vec<&str> {
    ptx.lines()
        .filter_map(|line| line.trim().strip_prefix(".visible .entry "))
        .map(|rest| rest.split('(').next().unwrap_or(rest).trim())
        .collect()
}

#[test]
fn every_cuda_kernel_compiles_with_nvrtc_when_the_library_is_found() {
    let Some(((major, minor), supported)) = cuda::nvrtc_supported_archs() else {
        say("SKIPPING the NVRTC compile check: no NVRTC library found");
        return;
    };
    say(&format!("NVRTC {major}.{minor} compiles for {supported:?}"));
    let mut compiled = 0;
    for (major, minor) in [(7, 0), (7, 5), (8, 0), (9, 0)] {
        if !supported.contains(&(major * 10 + minor)) {
            say(&format!(
                "SKIPPING compute_{major}{minor}: this NVRTC does not offer it"
            ));
            continue;
        }
        match cuda::compile_kernels(major, minor) {
            Ok(ptx) => {
                let found = entries(&ptx);
                for name in cuda::kernel_names() {
                    assert!(
                        found.contains(&name),
                        "{name} missing for sm_{major}{minor}"
                    );
                }
                compiled += 1;
            }
            Err(why) => panic!(
                "the CUDA kernels do not compile for compute_{major}{minor}: {}",
                why.reason
            ),
        }
    }
    assert!(
        compiled > 0,
        "NVRTC offers none of the architectures checked"
    );
}

#[test]
fn the_build_time_ptx_holds_every_kernel_when_the_build_made_one() {
    match cistern_kernels::cuda::prebuilt_ptx() {
        Some(ptx) => {
            let found = entries(ptx);
            for name in cuda::kernel_names() {
                assert!(found.contains(&name), "{name} missing from the build's PTX");
            }
        }
        None => say("the build found no NVRTC: no build-time PTX to check"),
    }
}
