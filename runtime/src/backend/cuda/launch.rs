//! Each kernel of the catalogue as CUDA launches: which `cistern_*`
//! function, its grid, its arguments. Matched exhaustively: a kernel with
//! no CUDA version answers `Unsupported` in its own arm.

use std::ffi::c_void;

use cistern_kernels::Activation;
use cudarc::driver::sys::CUstream;

use super::context::Module;
use super::ffi;
use super::status::{fault, launch_error};
use crate::backend::stream::{BoundLaunch, KernelFault, LaunchError};
use crate::{Kernel, ServerError};

/// A resolved range of device memory: its address and length in bytes.
/// The manager frees memory only once every stream that used it has
/// completed past its last use, so the address stays valid while queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct CudaSlice {
    pub(super) address: u64,
    pub(super) len: u64,
}

impl CudaSlice {
    fn floats(&self) -> u64 {
        self.len / 4
    }
}

/// Threads per block of every kernel (the reductions assume it).
const BLOCK: u32 = 256;
/// The most blocks a grid-stride kernel is given.
const MAX_GRID: u64 = 8192;

/// One kernel argument, kept in a 64-bit slot the kernel reads its own
/// width from (little-endian: a 4-byte argument is the slot's first bytes).
#[derive(Clone, Copy)]
enum Arg {
    Pointer(u64),
    U64(u64),
    F32(f32),
    I32(i32),
}

impl Arg {
    fn slot(self) -> u64 {
        match self {
            Arg::Pointer(value) | Arg::U64(value) => value,
            Arg::F32(value) => u64::from(value.to_bits()),
            Arg::I32(value) => u64::from(value as u32),
        }
    }
}

/// Launches one kernel on a stream.
pub(super) struct Launcher<'a> {
    pub(super) module: &'a Module,
    pub(super) stream: CUstream,
}

impl Launcher<'_> {
    fn call(&self, name: &str, grid: u64, args: &[Arg]) -> Result<(), LaunchError> {
        let function = self
            .module
            .function(name)
            .ok_or_else(|| fault(name, &ffi::not_found()))?;
        let mut slots: Vec<u64> = args.iter().map(|arg| arg.slot()).collect();
        let mut params: Vec<*mut c_void> = slots
            .iter_mut()
            .map(|slot| (slot as *mut u64).cast())
            .collect();
        let grid = u32::try_from(grid.clamp(1, MAX_GRID)).unwrap_or(1);
        // SAFETY: every `cistern_*` kernel's parameters are, in order, the
        // `args` given for it below (pointers, u64 counts, f32, int), each
        // slot lives until the launch is queued (the driver copies them),
        // and the server checked every binding spans what the sizes say.
        unsafe { ffi::launch(function, grid, BLOCK, self.stream, &mut params) }
            .map_err(|e| launch_error(name, &e))
    }

    /// A grid-stride kernel over `n` elements.
    fn stride(&self, name: &str, n: u64, args: &[Arg]) -> Result<(), LaunchError> {
        self.call(name, n.div_ceil(u64::from(BLOCK)), args)
    }

    /// Queues `launch` on the stream.
    pub(super) fn run(&self, launch: &BoundLaunch<CudaSlice>) -> Result<(), LaunchError> {
        let b = Bound(launch);
        let p = |index| b.pointer(index);
        match &launch.kernel {
            &Kernel::Fill { value } => {
                let n = b.floats(0)?;
                self.stride(
                    "cistern_fill",
                    n.div_ceil(4),
                    &[p(0)?, Arg::F32(value), Arg::U64(n)],
                )
            }
            Kernel::Copy => {
                let (source, target) = (b.slice(0)?, b.slice(1)?);
                let len = usize::try_from(source.len.min(target.len))
                    .map_err(|_| malformed("copy too long"))?;
                ffi::copy(source.address, target.address, len, self.stream)
                    .map_err(|e| launch_error("copy", &e))
            }
            Kernel::Identity => {
                let n = b.same_floats(&[0, 1])?;
                self.stride("cistern_identity", n, &[p(0)?, p(1)?, Arg::U64(n)])
            }
            Kernel::Empty => self.call("cistern_empty", 1, &[]),
            Kernel::Trap => self.call("cistern_trap", 1, &[]),
            &Kernel::Scale { factor } => {
                let n = b.floats(0)?;
                self.stride(
                    "cistern_scale",
                    n.div_ceil(4),
                    &[p(0)?, Arg::F32(factor), Arg::U64(n)],
                )
            }
            &Kernel::Axpy { alpha } => {
                let n = b.same_floats(&[0, 1])?;
                self.stride(
                    "cistern_axpy",
                    n.div_ceil(4),
                    &[p(0)?, Arg::F32(alpha), p(1)?, Arg::U64(n)],
                )
            }
            Kernel::Add | Kernel::Mul => {
                let op = Arg::I32(i32::from(matches!(launch.kernel, Kernel::Mul)));
                let n = b.same_floats(&[0, 1, 2])?;
                self.stride(
                    "cistern_binary_op",
                    n.div_ceil(4),
                    &[op, p(0)?, p(1)?, p(2)?, Arg::U64(n)],
                )
            }
            &Kernel::ActivationForward { activation } => {
                let (kind, slope) = activation_code(activation);
                let n = b.same_floats(&[0, 1])?;
                self.stride(
                    "cistern_activation_forward",
                    n,
                    &[kind, slope, p(0)?, p(1)?, Arg::U64(n)],
                )
            }
            &Kernel::ActivationBackward { activation } => {
                let (kind, slope) = activation_code(activation);
                let n = b.same_floats(&[0, 1, 2])?;
                let args = [kind, slope, p(0)?, p(1)?, p(2)?, Arg::U64(n)];
                self.stride("cistern_activation_backward", n, &args)
            }
            Kernel::Gemm { .. } => Err(unsupported("gemm")),
            &Kernel::ColumnSum { rows, cols } => {
                let fits = rows.checked_mul(cols) == Some(b.floats(0)?) && b.floats(1)? == cols;
                if !fits {
                    return Err(refused(
                        "column_sum: x is not rows×cols or out not cols long",
                    ));
                }
                self.stride(
                    "cistern_column_sum",
                    cols,
                    &[p(0)?, Arg::U64(rows), Arg::U64(cols), p(1)?],
                )
            }
            Kernel::MseLoss => {
                let n = b.same_floats(&[0, 1])?;
                if n == 0 {
                    return Err(refused("mse_loss: the mean of no elements is undefined"));
                }
                self.call("cistern_mse_loss", 1, &[p(0)?, p(1)?, p(2)?, Arg::U64(n)])
            }
            &Kernel::MseLossBackward { grad_output } => {
                let n = b.same_floats(&[0, 1, 2])?;
                // As the CPU: the factor in f64, then rounded once.
                let factor = (2.0 * f64::from(grad_output) / n.max(1) as f64) as f32;
                let args = [p(0)?, p(1)?, Arg::F32(factor), p(2)?, Arg::U64(n)];
                self.stride("cistern_mse_loss_backward", n, &args)
            }
            Kernel::SegmentSum { segments } => self.segment_sums(&b, segments, false),
            Kernel::SegmentSumSquares { segments } => self.segment_sums(&b, segments, true),
            &Kernel::AmpUnscale { inv_scale } => {
                let n = b.floats(0)?;
                self.stride(
                    "cistern_amp_unscale",
                    n,
                    &[p(0)?, Arg::F32(inv_scale), p(1)?, Arg::U64(n)],
                )
            }
            Kernel::OptimizerStep(_) => Err(unsupported("optimizer_step")),
            Kernel::AmpUnscaleByDeviceScale => Err(unsupported("amp_unscale_by_device_scale")),
            Kernel::AmpUpdateScale { .. } => Err(unsupported("amp_update_scale")),
            Kernel::OptimizerStepCounted(_) => Err(unsupported("optimizer_step_counted")),
        }
    }

    /// One block per segment, each writing its own output element.
    fn segment_sums(
        &self,
        b: &Bound<'_>,
        segments: &[cistern_kernels::Segment],
        squares: bool,
    ) -> Result<(), LaunchError> {
        let x = b.slice(0)?;
        let out = b.slice(1)?;
        let total = usize::try_from(x.floats()).map_err(|_| malformed("x too long"))?;
        cistern_optim::validate_segments(segments, total).map_err(|e| refused(&e.to_string()))?;
        if out.floats() != segments.len() as u64 {
            return Err(refused("segment sums: out needs one element per segment"));
        }
        for (index, segment) in segments.iter().enumerate() {
            let args = [
                Arg::Pointer(x.address + 4 * segment.offset as u64),
                Arg::U64(segment.len as u64),
                Arg::I32(i32::from(squares)),
                Arg::Pointer(out.address + 4 * index as u64),
            ];
            self.call("cistern_segment_sum", 1, &args)?;
        }
        Ok(())
    }
}

/// `Activation`'s code in `activation.cu`, and its slope.
fn activation_code(activation: Activation) -> (Arg, Arg) {
    let (kind, slope) = match activation {
        Activation::Identity => (0, 0.0),
        Activation::Relu => (1, 0.0),
        Activation::LeakyRelu { negative_slope } => (2, negative_slope),
        Activation::Gelu => (3, 0.0),
        Activation::GeluTanh => (4, 0.0),
        Activation::Tanh => (5, 0.0),
        Activation::Sigmoid => (6, 0.0),
    };
    (Arg::I32(kind), Arg::F32(slope))
}

struct Bound<'a>(&'a BoundLaunch<CudaSlice>);

impl Bound<'_> {
    fn slice(&self, index: usize) -> Result<CudaSlice, LaunchError> {
        self.0
            .bindings
            .get(index)
            .copied()
            .ok_or_else(|| malformed(&format!("{} has no binding {index}", self.0.kernel.name())))
    }

    fn pointer(&self, index: usize) -> Result<Arg, LaunchError> {
        Ok(Arg::Pointer(self.slice(index)?.address))
    }

    fn floats(&self, index: usize) -> Result<u64, LaunchError> {
        Ok(self.slice(index)?.floats())
    }

    /// The element count every binding of `indices` shares.
    fn same_floats(&self, indices: &[usize]) -> Result<u64, LaunchError> {
        let first = self.floats(indices.first().copied().unwrap_or(0))?;
        for &index in indices {
            if self.floats(index)? != first {
                return Err(refused(&format!(
                    "{}: bindings differ in length",
                    self.0.kernel.name()
                )));
            }
        }
        Ok(first)
    }
}

fn malformed(message: &str) -> LaunchError {
    LaunchError::Fault(KernelFault::Malformed(message.to_string()))
}

fn refused(message: &str) -> LaunchError {
    LaunchError::Refused(ServerError::InvalidArgument {
        message: message.to_string(),
    })
}

fn unsupported(kernel: &str) -> LaunchError {
    LaunchError::Refused(ServerError::UnsupportedOperation {
        operation: format!("{kernel} on CUDA (not written yet)"),
    })
}
