//! Compiles the CUDA C kernels to PTX when an NVRTC library is found, for
//! the runtime to embed; skips silently otherwise. It never fails the build:
//! without the PTX the runtime compiles with NVRTC itself, if it can.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(cistern_prebuilt_ptx)");
    println!("cargo::rerun-if-changed=src/cuda");
    println!("cargo::rerun-if-changed=src/cuda.rs");
    println!("cargo::rerun-if-changed=src/map");
    println!("cargo::rerun-if-env-changed=LD_LIBRARY_PATH");
    println!("cargo::rerun-if-env-changed=CISTERN_SKIP_PTX");
    #[cfg(feature = "cuda-ptx")]
    ptx::build();
}

#[cfg(feature = "cuda-ptx")]
#[allow(dead_code, unexpected_cfgs)] // the build uses only the sources
#[path = "src/cuda.rs"]
mod cuda;

#[cfg(feature = "cuda-ptx")]
#[allow(dead_code)] // the build uses only the CUDA source
#[path = "src/map/table.rs"]
mod map;

#[cfg(feature = "cuda-ptx")]
mod ptx {
    use std::ffi::CString;
    use std::panic::{AssertUnwindSafe, catch_unwind};
    use std::path::PathBuf;

    use cudarc::nvrtc::{result, sys};

    pub fn build() {
        if std::env::var_os("CISTERN_SKIP_PTX").is_some() {
            return;
        }
        let Some(out) = std::env::var_os("OUT_DIR").map(PathBuf::from) else {
            return;
        };
        // SAFETY: only tries to open the library by its usual names.
        if !unsafe { sys::is_culib_present() } {
            return;
        }
        // cudarc panics on a symbol the library lacks: that is a skip too.
        let compiled = catch_unwind(AssertUnwindSafe(compile))
            .unwrap_or_else(|_| Err("the NVRTC library lacks a symbol cudarc needs".to_string()));
        match compiled {
            Ok(ptx) => {
                if std::fs::write(out.join("cistern.ptx"), ptx).is_ok() {
                    println!("cargo::rustc-cfg=cistern_prebuilt_ptx");
                }
            }
            Err(reason) => println!("cargo::warning=CUDA kernels not precompiled: {reason}"),
        }
    }

    fn compile() -> Result<String, String> {
        let source = CString::new(super::cuda::program()).map_err(|e| e.to_string())?;
        let name = CString::new("cistern.cu").map_err(|e| e.to_string())?;
        let program = result::create_program(&source, Some(&name)).map_err(|e| e.to_string())?;
        let supported = supported_archs()?;
        let arch = super::cuda::ptx_arch(&supported).ok_or_else(|| {
            format!("this NVRTC compiles for none of compute_70 on: {supported:?}")
        })?;
        let mut options = vec![format!("--gpu-architecture=compute_{arch}")];
        options.extend(super::cuda::NVRTC_OPTIONS.iter().map(|o| o.to_string()));
        // SAFETY: `program` was just created and is destroyed once, below.
        let outcome = unsafe {
            match result::compile_program(program, &options) {
                Ok(()) => result::get_ptx(program).map_err(|e| e.to_string()),
                Err(e) => Err(format!("{e}: {}", log(program))),
            }
        };
        // SAFETY: created above, not used after this.
        let _ = unsafe { result::destroy_program(program) };
        let ptx = outcome?;
        let bytes: Vec<u8> = ptx
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8(bytes).map_err(|e| e.to_string())
    }

    /// The virtual architectures this NVRTC compiles for (`compute_XY` as `XY`).
    fn supported_archs() -> Result<Vec<i32>, String> {
        let mut count = 0;
        // SAFETY: writes one int.
        let counted = unsafe { sys::nvrtcGetNumSupportedArchs(&mut count) };
        if counted != sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(format!("nvrtcGetNumSupportedArchs: {counted:?}"));
        }
        let mut archs = vec![0; usize::try_from(count).unwrap_or(0)];
        // SAFETY: `archs` holds the `count` ints NVRTC writes.
        let listed = unsafe { sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) };
        if listed != sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(format!("nvrtcGetSupportedArchs: {listed:?}"));
        }
        Ok(archs)
    }

    /// The compiler's log of `program`.
    ///
    /// # Safety
    /// `program` is a live NVRTC program.
    unsafe fn log(program: sys::nvrtcProgram) -> String {
        // SAFETY: the caller's.
        let raw = unsafe { result::get_program_log(program) }.unwrap_or_default();
        raw.iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8 as char)
            .collect()
    }
}
