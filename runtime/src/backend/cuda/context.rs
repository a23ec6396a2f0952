//! `CudaContext`: one server's view of its device's primary context,
//! shared by its storage and its streams, with the kernels loaded in it.
//! The process holds each primary context once (`Primary`), whatever the
//! number of servers on it. A reset (recovery from a sticky fault) destroys
//! everything in the context, every server's; the epoch counts resets, so a
//! stream knows to make its CUDA stream afresh and a server whose context
//! another reset knows its memory is gone.

use std::ffi::CString;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use cudarc::driver::DriverError;
use cudarc::driver::sys::{CUcontext, CUdevice, CUfunction, CUresult};

use super::driver::{CudaUnavailable, device};
use super::ffi::{self, Driver};
use super::ptx;
use super::status::{FaultClass, classify, code, describe};
use crate::sync::Mutex;

/// Every kernel the module holds, by name: these, then the element-wise
/// ones ([`functions`]).
const FUNCTIONS: [&str; 40] = [
    "cistern_empty",
    "cistern_trap",
    "cistern_identity",
    "cistern_strided_copy",
    "cistern_amp_unscale",
    "cistern_activation_forward",
    "cistern_activation_backward",
    "cistern_mse_loss",
    "cistern_column_sum",
    "cistern_segment_sum",
    "cistern_gemm",
    "cistern_gemm_large",
    "cistern_sgd",
    "cistern_adam",
    "cistern_rmsprop",
    "cistern_adagrad",
    "cistern_lamb_measure",
    "cistern_lamb_write",
    "cistern_step_count_advance",
    "cistern_amp_unscale_by_device_scale",
    "cistern_amp_update_scale",
    "cistern_softmax",
    "cistern_softmax_backward",
    "cistern_class_loss",
    "cistern_class_loss_backward",
    "cistern_broadcast_binary",
    "cistern_strided_sum",
    "cistern_layer_norm",
    "cistern_layer_norm_backward",
    "cistern_embedding",
    "cistern_embedding_backward",
    "cistern_dropout",
    "cistern_dropout_counted",
    "cistern_batch_gather",
    "cistern_batch_gather_advance",
    "cistern_max_dim",
    "cistern_max_dim_backward",
    "cistern_attention",
    "cistern_attention_backward_queries",
    "cistern_attention_backward_keys",
];

/// Every kernel the module holds, in load order: [`FUNCTIONS`], then each
/// element-wise kernel's (made from its definition).
pub(super) fn functions() -> impl Iterator<Item = &'static str> {
    FUNCTIONS
        .into_iter()
        .chain(cistern_kernels::map::cuda_entries())
}

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
        let functions = functions()
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

    /// The kernel `name` (one of [`functions`]).
    pub(super) fn function(&self, name: &str) -> Option<CUfunction> {
        let at = functions().position(|known| known == name)?;
        self.functions.get(at).copied()
    }
}

/// The process's one hold on a device's primary context, shared by every
/// server on that device. A reset (cuDevicePrimaryCtxReset) is the whole
/// process's: it destroys every server's memory there, so it bumps `epoch`
/// here, where every server sees it.
#[derive(Debug)]
struct Primary {
    device: CUdevice,
    /// The context handle of the current epoch (a reset makes a new one).
    context: AtomicPtr<cudarc::driver::sys::CUctx_st>,
    /// Resets of this device's primary context in this process.
    epoch: AtomicU64,
    /// Held across a reset, so two servers never reset for one fault.
    resetting: Mutex<()>,
}

/// The live [`Primary`] of each ordinal.
static PRIMARIES: std::sync::Mutex<Vec<(usize, Weak<Primary>)>> = std::sync::Mutex::new(Vec::new());

impl Primary {
    /// This process's hold on `ordinal`'s primary context: the live one, or
    /// a new retain. A retain refused with a sticky fault (a context an
    /// earlier holder left faulted) is reset and retried once.
    fn of(ordinal: usize) -> Result<Arc<Primary>, CudaUnavailable> {
        let mut primaries = PRIMARIES.lock().unwrap_or_else(|e| e.into_inner());
        primaries.retain(|(_, weak)| weak.strong_count() > 0);
        if let Some(live) = primaries
            .iter()
            .find(|(at, _)| *at == ordinal)
            .and_then(|(_, weak)| weak.upgrade())
        {
            return Ok(live);
        }
        let device = device(ordinal)?;
        let retained = ffi::retain_primary(device).or_else(|error| {
            if classify(code(&error)) == FaultClass::OperationLocal {
                return Err(error);
            }
            ffi::reset_primary(device)?;
            ffi::retain_primary(device)
        });
        let context = retained.map_err(|e| CudaUnavailable {
            ordinal_absent: false,
            reason: format!("cuDevicePrimaryCtxRetain: {}", describe(&e)),
        })?;
        let primary = Arc::new(Primary {
            device,
            context: AtomicPtr::new(context),
            epoch: AtomicU64::new(0),
            resetting: Mutex::new(()),
        });
        primaries.push((ordinal, Arc::downgrade(&primary)));
        Ok(primary)
    }

    fn current(&self) -> CUcontext {
        self.context.load(Ordering::Acquire) as CUcontext
    }

    /// Resets the context unless it was reset since epoch `seen` (another
    /// server's recovery already did it); either way, the epoch after.
    fn reset_since(&self, seen: u64) -> Driver<u64> {
        let _resetting = self.resetting.lock();
        let epoch = self.epoch.load(Ordering::Acquire);
        if epoch != seen {
            return Ok(epoch);
        }
        // The old handle may be dead already, and the sync's error is the
        // fault being recovered from: neither stops the reset.
        if ffi::set_current(self.current()).is_ok() {
            let _ = ffi::synchronize_context();
        }
        ffi::reset_primary(self.device)?;
        // The reset keeps the retain but destroys the old handle: a second
        // retain gives the new context's handle, and its release keeps the
        // count at this process's one.
        let fresh = ffi::retain_primary(self.device)?;
        let _ = ffi::release_primary(self.device);
        self.context.store(fresh, Ordering::Release);
        self.epoch.store(epoch + 1, Ordering::Release);
        Ok(epoch + 1)
    }
}

impl Drop for Primary {
    fn drop(&mut self) {
        // Through `result`: a failure here is reported by nothing, and
        // never panics in a destructor.
        let _ = ffi::release_primary(self.device);
    }
}

/// One server's view of its device's primary context: the kernels it
/// loaded there and the epoch it has seen. A reset by another server of
/// this process (the context, and this server's memory with it, gone) is a
/// sticky fault here until this server recovers.
#[derive(Debug)]
pub(super) struct CudaContext {
    pub(super) ordinal: usize,
    pub(super) device: CUdevice,
    primary: Arc<Primary>,
    /// The epoch of the primary context this server's state belongs to.
    seen: AtomicU64,
    ptx: CString,
    module: Mutex<Option<(u64, Arc<Module>)>>,
}

impl CudaContext {
    /// Opens device `ordinal`'s primary context and loads the kernels. A
    /// context an earlier server left faulted (the load fails sticky) is
    /// reset once first.
    pub(super) fn open(ordinal: usize) -> Result<Arc<CudaContext>, CudaUnavailable> {
        let primary = Primary::of(ordinal)?;
        let mut seen = primary.epoch.load(Ordering::Acquire);
        let mut loaded = load_in(&primary);
        if let Err(LoadError::Sticky(_)) = &loaded {
            seen = primary.reset_since(seen).map_err(|e| CudaUnavailable {
                ordinal_absent: false,
                reason: format!(
                    "an earlier server left the device's context faulted and the driver \
                     gave no working context after a reset ({}): restart the process \
                     to use cuda:{ordinal} again",
                    describe(&e)
                ),
            })?;
            loaded = load_in(&primary);
        }
        let (ptx, module) = loaded.map_err(LoadError::unavailable)?;
        Ok(Arc::new(CudaContext {
            ordinal,
            device: primary.device,
            primary,
            seen: AtomicU64::new(seen),
            ptx,
            module: Mutex::new(Some((seen, Arc::new(module)))),
        }))
    }

    /// Makes the context current on the calling thread; `Err` (context
    /// destroyed, sticky) once another server reset it under this one.
    pub(super) fn bind(&self) -> Driver<()> {
        if self.primary.epoch.load(Ordering::Acquire) != self.epoch() {
            return Err(DriverError(CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED));
        }
        ffi::set_current(self.primary.current())
    }

    /// The epoch of the context this server's state belongs to.
    pub(super) fn epoch(&self) -> u64 {
        self.seen.load(Ordering::Acquire)
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

    /// Waits for the device, then destroys everything in the context and
    /// starts a new epoch; where another server reset it since this one's
    /// epoch, that reset is this one's too.
    pub(super) fn reset(&self) -> Driver<()> {
        // The old module dies with the context: forget, never unload, it.
        *self.module.lock() = None;
        let epoch = self.primary.reset_since(self.epoch())?;
        self.seen.store(epoch, Ordering::Release);
        self.bind()
    }
}

/// Why the kernels did not load into a primary context.
enum LoadError {
    /// The context is faulted: a reset may recover it.
    Sticky(CudaUnavailable),
    /// Anything else.
    Other(CudaUnavailable),
}

impl LoadError {
    fn unavailable(self) -> CudaUnavailable {
        match self {
            LoadError::Sticky(why) | LoadError::Other(why) => why,
        }
    }
}

/// The kernels loaded in `primary`'s context.
fn load_in(primary: &Primary) -> Result<(CString, Module), LoadError> {
    if let Err(error) = ffi::set_current(primary.current()) {
        let why = CudaUnavailable {
            ordinal_absent: false,
            reason: format!("cuCtxSetCurrent: {}", describe(&error)),
        };
        return Err(match classify(code(&error)) {
            FaultClass::Sticky => LoadError::Sticky(why),
            FaultClass::OperationLocal => LoadError::Other(why),
        });
    }
    choose_ptx(primary.device)
}

/// The build's PTX if the driver takes it, else NVRTC's for this device;
/// with the module loaded from it in the current context.
fn choose_ptx(device: CUdevice) -> Result<(CString, Module), LoadError> {
    let mut reasons = Vec::new();
    if let Some(ptx) = ptx::prebuilt() {
        match Module::load(&ptx) {
            Ok(module) => return Ok((ptx, module)),
            Err(error) if classify(code(&error)) == FaultClass::Sticky => {
                return Err(LoadError::Sticky(CudaUnavailable {
                    ordinal_absent: false,
                    reason: format!("loading the kernels: {}", describe(&error)),
                }));
            }
            // A driver older than the build's NVRTC refuses its PTX.
            Err(error) => reasons.push(format!("the build's PTX: {}", describe(&error))),
        }
    } else {
        reasons.push("the build found no NVRTC".to_string());
    }
    let (major, minor) = compute_capability(device);
    let compiled = ptx::compile(major, minor).and_then(|ptx| {
        let module = Module::load(&ptx).map_err(|e| CudaUnavailable {
            ordinal_absent: false,
            reason: format!("NVRTC's PTX did not load: {}", describe(&e)),
        })?;
        Ok((ptx, module))
    });
    compiled.map_err(|e| {
        reasons.push(e.reason);
        LoadError::Other(CudaUnavailable {
            ordinal_absent: false,
            reason: format!("no loadable CUDA kernels ({})", reasons.join("; ")),
        })
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
