//! Whether CUDA is here: the driver library, an initialised driver, the
//! devices. Probing is the first thing any CUDA path does, because every
//! other cudarc call panics when the library is missing; each probe is also
//! wrapped in `catch_unwind`, so a library missing a symbol is an answer.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;

use cudarc::driver::result;
use cudarc::driver::sys::{self, CUdevice};

use super::status::describe;

/// Why CUDA cannot be used here (no library, no device, an old driver):
/// pick another device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaUnavailable {
    /// What was missing, in one line.
    pub reason: String,
    /// True when CUDA works but the ordinal asked for is past its devices.
    pub ordinal_absent: bool,
}

impl CudaUnavailable {
    fn new(reason: impl Into<String>) -> Self {
        CudaUnavailable {
            reason: reason.into(),
            ordinal_absent: false,
        }
    }
}

/// What one CUDA device is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaDeviceInfo {
    /// Its ordinal.
    pub ordinal: usize,
    /// The driver's name for it.
    pub name: String,
    /// Streaming multiprocessors.
    pub multiprocessors: usize,
    /// Total memory in bytes.
    pub memory_bytes: u64,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
}

/// Runs a probe, turning a cudarc panic into a reason.
fn guarded<T>(
    what: &str,
    probe: impl FnOnce() -> Result<T, CudaUnavailable>,
) -> Result<T, CudaUnavailable> {
    catch_unwind(AssertUnwindSafe(probe)).unwrap_or_else(|_| {
        Err(CudaUnavailable::new(format!(
            "{what}: the CUDA library panicked (a missing symbol?)"
        )))
    })
}

/// The driver, loaded and initialised once per process; every later call
/// gets the same answer.
pub(super) fn driver() -> Result<(), CudaUnavailable> {
    static READY: OnceLock<Result<(), CudaUnavailable>> = OnceLock::new();
    READY
        .get_or_init(|| {
            // SAFETY: only tries to open the library by its usual names.
            if !unsafe { sys::is_culib_present() } {
                return Err(CudaUnavailable::new(
                    "no CUDA driver library (libcuda) on this machine",
                ));
            }
            guarded("cuInit", || {
                result::init().map_err(|e| {
                    CudaUnavailable::new(format!(
                        "the CUDA driver did not initialise: {}",
                        describe(&e)
                    ))
                })
            })
        })
        .clone()
}

/// Whether an NVRTC library can be loaded (run-time kernel compilation).
pub(super) fn nvrtc_present() -> bool {
    // SAFETY: only tries to open the library by its usual names.
    catch_unwind(|| unsafe { cudarc::nvrtc::sys::is_culib_present() }).unwrap_or(false)
}

/// The driver's handle of device `ordinal`.
pub(super) fn device(ordinal: usize) -> Result<CUdevice, CudaUnavailable> {
    driver()?;
    let count = device_count()?;
    if ordinal >= count {
        return Err(CudaUnavailable {
            ordinal_absent: true,
            ..CudaUnavailable::new(format!(
                "cuda:{ordinal} is not present ({count} CUDA device(s))"
            ))
        });
    }
    guarded("cuDeviceGet", || {
        let index =
            i32::try_from(ordinal).map_err(|_| CudaUnavailable::new("ordinal too large"))?;
        result::device::get(index).map_err(|e| CudaUnavailable::new(describe(&e)))
    })
}

fn device_count() -> Result<usize, CudaUnavailable> {
    guarded("cuDeviceGetCount", || {
        let count = result::device::get_count().map_err(|e| {
            CudaUnavailable::new(format!("cannot count CUDA devices: {}", describe(&e)))
        })?;
        Ok(usize::try_from(count).unwrap_or(0))
    })
}

/// Every CUDA device, or why there are none.
pub fn devices() -> Result<Vec<CudaDeviceInfo>, CudaUnavailable> {
    driver()?;
    let count = device_count()?;
    if count == 0 {
        return Err(CudaUnavailable::new("the CUDA driver reports no device"));
    }
    (0..count).map(info).collect()
}

fn info(ordinal: usize) -> Result<CudaDeviceInfo, CudaUnavailable> {
    let handle = device(ordinal)?;
    guarded("device attributes", || {
        let unavailable = |e: cudarc::driver::DriverError| CudaUnavailable::new(describe(&e));
        let attribute = |attribute| {
            // SAFETY: `handle` came from `cuDeviceGet`.
            unsafe { result::device::get_attribute(handle, attribute) }.map_err(unavailable)
        };
        use sys::CUdevice_attribute as A;
        Ok(CudaDeviceInfo {
            ordinal,
            name: result::device::get_name(handle).map_err(unavailable)?,
            multiprocessors: usize::try_from(attribute(
                A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )?)
            .unwrap_or(0),
            // SAFETY: `handle` came from `cuDeviceGet`.
            memory_bytes: unsafe { result::device::total_mem(handle) }.map_err(unavailable)? as u64,
            compute_capability: (
                attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            ),
        })
    })
}
