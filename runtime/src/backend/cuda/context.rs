//! `CudaContext`: one device's primary context, shared by its storage and
//! its streams, with the kernels loaded in it. A reset (recovery from a
//! sticky fault) destroys everything in the context; the epoch counts
//! resets, so a stream knows to make its CUDA stream afresh.

use std::ffi::CString;
use std::sync::Arc;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use cudarc::driver::DriverError;
use cudarc::driver::sys::{CUcontext, CUdevice, CUfunction};

use super::driver::{CudaUnavailable, device};
use super::ffi::{self, Driver};
use super::ptx;
use super::status::describe;
use crate::sync::Mutex;

/// Every kernel the module holds, by name.
pub(super) const FUNCTIONS: [&str; 25] = [
    "cistern_empty",
    "cistern_trap",
    "cistern_identity",
    "cistern_strided_copy",
    "cistern_fill",
    "cistern_scale",
    "cistern_axpy",
    "cistern_binary_op",
    "cistern_amp_unscale",
    "cistern_activation_forward",
    "cistern_activation_backward",
    "cistern_mse_loss",
    "cistern_mse_loss_backward",
    "cistern_column_sum",
    "cistern_segment_sum",
    "cistern_gemm",
    "cistern_sgd",
    "cistern_adam",
    "cistern_rmsprop",
    "cistern_adagrad",
    "cistern_lamb_measure",
    "cistern_lamb_write",
    "cistern_step_count_advance",
    "cistern_amp_unscale_by_device_scale",
    "cistern_amp_update_scale",
];

/// The kernels loaded in one epoch of the context.
#[derive(Debug)]
pub(super) struct Module {
    functions: Vec<CUfunction>,
}

// SAFETY: driver handles may be used from any thread on which their
// context is current; every user binds the context first.
unsafe impl Send for Module {}
// SAFETY: as for `Send`; the handles are never mutated after loading.
unsafe impl Sync for Module {}

impl Module {
    fn load(ptx: &CString) -> Driver<Module> {
        let module = ffi::module_load(ptx)?;
        let functions = FUNCTIONS
            .iter()
            .map(|name| ffi::function(module, name))
            .collect::<Result<Vec<_>, _>>();
        match functions {
            // The module lives as long as the context: a reset destroys it.
            Ok(functions) => Ok(Module { functions }),
            Err(error) => {
                let _ = ffi::module_unload(module);
                Err(error)
            }
        }
    }

    /// The kernel `name` (one of [`FUNCTIONS`]).
    pub(super) fn function(&self, name: &str) -> Option<CUfunction> {
        let at = FUNCTIONS.iter().position(|known| *known == name)?;
        self.functions.get(at).copied()
    }
}

/// One device's context, its kernels and its reset count.
#[derive(Debug)]
pub(super) struct CudaContext {
    pub(super) ordinal: usize,
    pub(super) device: CUdevice,
    context: AtomicPtr<cudarc::driver::sys::CUctx_st>,
    epoch: AtomicU64,
    ptx: CString,
    module: Mutex<Option<(u64, Arc<Module>)>>,
}

impl CudaContext {
    /// Opens device `ordinal`'s primary context and loads the kernels.
    pub(super) fn open(ordinal: usize) -> Result<Arc<CudaContext>, CudaUnavailable> {
        let device = device(ordinal)?;
        let unavailable = |what: &str, e: DriverError| CudaUnavailable {
            reason: format!("{what}: {}", describe(&e)),
        };
        let context =
            ffi::retain_primary(device).map_err(|e| unavailable("cuDevicePrimaryCtxRetain", e))?;
        let loaded = ffi::set_current(context)
            .map_err(|e| unavailable("cuCtxSetCurrent", e))
            .and_then(|()| choose_ptx(device));
        let (ptx, module) = match loaded {
            Ok(loaded) => loaded,
            Err(error) => {
                let _ = ffi::release_primary(device);
                return Err(error);
            }
        };
        Ok(Arc::new(CudaContext {
            ordinal,
            device,
            context: AtomicPtr::new(context),
            epoch: AtomicU64::new(0),
            ptx,
            module: Mutex::new(Some((0, Arc::new(module)))),
        }))
    }

    /// Makes the context current on the calling thread.
    pub(super) fn bind(&self) -> Driver<()> {
        ffi::set_current(self.context.load(Ordering::Acquire) as CUcontext)
    }

    /// How many resets the context has been through.
    pub(super) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// The kernels of the current epoch, loaded on first use after a reset.
    pub(super) fn module(&self) -> Driver<Arc<Module>> {
        let epoch = self.epoch();
        let mut slot = self.module.lock();
        if let Some((loaded, module)) = slot.as_ref()
            && *loaded == epoch
        {
            return Ok(module.clone());
        }
        self.bind()?;
        let module = Arc::new(Module::load(&self.ptx)?);
        *slot = Some((epoch, module.clone()));
        Ok(module)
    }

    /// Waits for the device, then destroys everything in the context (the
    /// sync's error is the fault being recovered from, so it is ignored)
    /// and starts a new epoch.
    pub(super) fn reset(&self) -> Driver<()> {
        self.bind()?;
        let _ = ffi::synchronize_context();
        // The old module dies with the context: forget, never unload, it.
        *self.module.lock() = None;
        ffi::reset_primary(self.device)?;
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.bind()
    }
}

impl Drop for CudaContext {
    fn drop(&mut self) {
        // Through `result`: a failure here is reported by nothing, and
        // never panics in a destructor.
        let _ = ffi::release_primary(self.device);
    }
}

/// The build's PTX if the driver takes it, else NVRTC's for this device;
/// with the module loaded from it in the current context.
fn choose_ptx(device: CUdevice) -> Result<(CString, Module), CudaUnavailable> {
    let mut reasons = Vec::new();
    if let Some(ptx) = ptx::prebuilt() {
        match Module::load(&ptx) {
            Ok(module) => return Ok((ptx, module)),
            // A driver older than the build's NVRTC refuses its PTX.
            Err(error) => reasons.push(format!("the build's PTX: {}", describe(&error))),
        }
    } else {
        reasons.push("the build found no NVRTC".to_string());
    }
    let (major, minor) = compute_capability(device);
    let compiled = ptx::compile(major, minor).and_then(|ptx| {
        let module = Module::load(&ptx).map_err(|e| CudaUnavailable {
            reason: format!("NVRTC's PTX did not load: {}", describe(&e)),
        })?;
        Ok((ptx, module))
    });
    compiled.map_err(|e| {
        reasons.push(e.reason);
        CudaUnavailable {
            reason: format!("no loadable CUDA kernels ({})", reasons.join("; ")),
        }
    })
}

/// The device's compute capability (7.0 when the driver does not say).
fn compute_capability(device: CUdevice) -> (i32, i32) {
    use cudarc::driver::sys::CUdevice_attribute as A;
    let attribute = |attribute, default| {
        // SAFETY: `device` came from `cuDeviceGet`.
        unsafe { cudarc::driver::result::device::get_attribute(device, attribute) }
            .unwrap_or(default)
    };
    (
        attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 7),
        attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0),
    )
}
