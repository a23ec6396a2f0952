//! Where the kernels' PTX comes from: the build's (compiled with NVRTC when
//! the build found it, embedded by `cistern-kernels`), else NVRTC at run
//! time for the device's own compute capability. Neither is
//! `CudaUnavailable`, with both reasons.

use std::ffi::CString;
use std::panic::{AssertUnwindSafe, catch_unwind};

use cudarc::nvrtc::result;

use super::driver::{CudaUnavailable, nvrtc_present};

/// The kernels as PTX text, compiled at run time for compute capability
/// `major.minor`.
pub(super) fn compile(major: i32, minor: i32) -> Result<CString, CudaUnavailable> {
    if !nvrtc_present() {
        return Err(CudaUnavailable {
            ordinal_absent: false,
            reason: "no NVRTC library to compile the CUDA kernels".to_string(),
        });
    }
    catch_unwind(AssertUnwindSafe(|| run_nvrtc(major, minor)))
        .unwrap_or_else(|_| Err("NVRTC panicked (a missing symbol?)".to_string()))
        .map_err(|reason| CudaUnavailable {
            ordinal_absent: false,
            reason: format!("the CUDA kernels did not compile: {reason}"),
        })
}

fn run_nvrtc(major: i32, minor: i32) -> Result<CString, String> {
    let source = CString::new(cistern_kernels::cuda::program()).map_err(|e| e.to_string())?;
    let name = CString::new("cistern.cu").map_err(|e| e.to_string())?;
    let program = result::create_program(&source, Some(&name)).map_err(|e| e.to_string())?;
    let mut options = vec![format!("--gpu-architecture=compute_{major}{minor}")];
    options.extend(
        cistern_kernels::cuda::NVRTC_OPTIONS
            .iter()
            .map(|o| o.to_string()),
    );
    // SAFETY: `program` was just created; it is destroyed once, below.
    let outcome = unsafe {
        match result::compile_program(program, &options) {
            Ok(()) => result::get_ptx(program).map_err(|e| e.to_string()),
            Err(error) => {
                let log = result::get_program_log(program).unwrap_or_default();
                Err(format!("{error}: {}", text(&log)))
            }
        }
    };
    // SAFETY: created above and not used after this; a failed destroy
    // leaks the program, which is all it can do.
    let _ = unsafe { result::destroy_program(program) };
    CString::new(text(&outcome?)).map_err(|e| e.to_string())
}

/// NVRTC's NUL-terminated bytes as text.
fn text(raw: &[std::ffi::c_char]) -> String {
    raw.iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8 as char)
        .collect()
}

/// The NVRTC library's version and the virtual architectures it compiles
/// for (`compute_XY` as `XY`); `None` without NVRTC or when it fails.
pub(super) fn supported_archs() -> Option<((i32, i32), Vec<i32>)> {
    use cudarc::nvrtc::sys;
    if !nvrtc_present() {
        return None;
    }
    let query = || {
        let (mut major, mut minor, mut count) = (0, 0, 0);
        // SAFETY: each call writes the ints it is given.
        let ok = unsafe {
            sys::nvrtcVersion(&mut major, &mut minor) == sys::nvrtcResult::NVRTC_SUCCESS
                && sys::nvrtcGetNumSupportedArchs(&mut count) == sys::nvrtcResult::NVRTC_SUCCESS
        };
        let mut archs = vec![0; usize::try_from(count).ok()?];
        // SAFETY: `archs` holds the `count` ints NVRTC writes.
        let listed = ok
            && unsafe { sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) }
                == sys::nvrtcResult::NVRTC_SUCCESS;
        listed.then_some(((major, minor), archs))
    };
    catch_unwind(query).ok().flatten()
}

/// The build's PTX, when the build compiled one.
pub(super) fn prebuilt() -> Option<CString> {
    cistern_kernels::cuda::prebuilt_ptx().and_then(|ptx| CString::new(ptx).ok())
}
