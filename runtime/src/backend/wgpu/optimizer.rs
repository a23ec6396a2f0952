//! Fused optimizer steps on wgpu: one dispatch per run of adjacent
//! segments (cut into chunks of bindings), with the per-step constants
//! computed on the host in f64 as the CPU kernels compute them.

use cistern_kernels::{segment_runs, step_scalars};
use cistern_optim::OptimizerConfig;

use super::context::GpuContext;
use super::dispatch::{Dispatch, PER_INVOCATION, Params, Window, unsupported};
use super::kernels::Plan;
use super::pipelines::{Entry, Module};
use super::slice::GpuSlice;
use crate::backend::stream::{KernelFault, LaunchError};
use crate::error::ServerError;
use crate::optimizer::OptimizerArgs;

const fn step_entry(name: &'static str) -> Entry {
    Entry {
        module: Module::Optimizer,
        name,
        buffers: 6,
        table: false,
        per_invocation: PER_INVOCATION,
    }
}

const ADAM: Entry = step_entry("adam");

/// The entry point, op flags, floats and state slots (binding index of
/// each state buffer in layout order, from 3) of one step.
struct Step {
    entry: Entry,
    op: u32,
    floats: Vec<f32>,
    slots: Vec<usize>,
}

/// The step's entry point and state slots, with the constants of
/// `cistern_kernels::step_scalars`; `None` for a family this backend does
/// not run as one dispatch per run (LAMB).
fn step_of(config: &OptimizerConfig, step: u64) -> Option<Step> {
    let packed = step_scalars(config, step)?;
    let entry = match config {
        OptimizerConfig::Sgd(_) => step_entry("sgd"),
        OptimizerConfig::Adam(_) | OptimizerConfig::AdamW(_) => ADAM,
        OptimizerConfig::RmsProp(_) => step_entry("rmsprop"),
        OptimizerConfig::Adagrad(_) => step_entry("adagrad"),
        OptimizerConfig::Lamb(_) => return None,
    };
    // The state bindings follow params, grads and the flag.
    let slots = packed.state_slots.iter().map(|slot| 3 + slot).collect();
    Some(Step {
        entry,
        op: packed.ops,
        floats: packed.floats,
        slots,
    })
}

/// The op bit of a counted step: per-step constants come from binding 3.
const COUNTED: u32 = 256;

/// What binding 3 of a step holds: the flag (or a zero placeholder), or the
/// constants a counted step's `step_count` wrote.
pub(super) enum Skip {
    Flag(Window),
    Counted(Window),
}

impl GpuContext {
    /// The dispatches of one optimizer step over `bindings` (params, grads,
    /// the flag when AMP, then the state in layout order).
    pub(super) fn optimizer_step(
        &self,
        args: &OptimizerArgs,
        bindings: &[GpuSlice],
    ) -> Result<Plan<'static>, LaunchError> {
        let first_state = if args.found_inf { 3 } else { 2 };
        let flag: Window = if args.found_inf {
            let flag = bindings.get(2).ok_or_else(malformed)?;
            self.window(flag).map_err(LaunchError::Refused)?
        } else {
            self.zero_window()
        };
        let dispatches =
            self.step_dispatches(args, args.step, bindings, first_state, Skip::Flag(flag))?;
        Ok(Plan::Dispatches(dispatches))
    }

    /// The dispatches of `args`' family as step `step` over `bindings`
    /// (params, grads, then the state from `first_state`), skipped as
    /// binding 3 says.
    pub(super) fn step_dispatches(
        &self,
        args: &OptimizerArgs,
        step: u64,
        bindings: &[GpuSlice],
        first_state: usize,
        skip: Skip,
    ) -> Result<Vec<Dispatch>, LaunchError> {
        let Some(mut step) = step_of(&args.config, step) else {
            return Err(LaunchError::Refused(unsupported(format!(
                "{} on wgpu",
                args.kernel_id().name()
            ))));
        };
        let skip = match skip {
            Skip::Flag(window) => window,
            Skip::Counted(window) => {
                step.op |= COUNTED;
                window
            }
        };
        let (params, grads) = match bindings {
            [params, grads, ..] => (params, grads),
            _ => return Err(malformed()),
        };
        // Bindings 4-6 hold the state at the entry point's slots.
        let mut state: [Option<&GpuSlice>; 3] = [None; 3];
        for (index, slot) in step.slots.iter().enumerate() {
            let buffer = bindings.get(first_state + index).ok_or_else(malformed)?;
            state[slot - 3] = Some(buffer);
        }
        let mut dispatches = Vec::new();
        let params_value = Params::new(step.op, &step.floats);
        for (first, len) in segment_runs(&args.segments) {
            let part = |slice: &GpuSlice| slice.part(4 * first, 4 * len);
            let (p, g) = (part(params), part(grads));
            let state: Vec<Option<GpuSlice>> = state.iter().map(|s| s.map(part)).collect();
            let windows_of = |first: u64, count: u64| -> Result<Vec<Window>, ServerError> {
                let window = |slice: &GpuSlice| self.window(&slice.part(4 * first, 4 * count));
                let mut windows = vec![window(&p)?, window(&g)?, skip.clone()];
                for buffer in &state {
                    windows.push(match buffer {
                        Some(buffer) => window(buffer)?,
                        None => self.zero_window(),
                    });
                }
                Ok(windows)
            };
            let chunk = self.chunk_elements();
            let mut done = 0;
            while done < len {
                let elements = chunk.min(len - done);
                let chunk_dispatches = self
                    .streamed(step.entry, params_value, done, elements, &windows_of)
                    .map_err(LaunchError::Refused)?;
                dispatches.extend(chunk_dispatches);
                done += elements;
            }
        }
        Ok(dispatches)
    }
}

fn malformed() -> LaunchError {
    LaunchError::Fault(KernelFault::Malformed(
        "an optimizer step's bindings do not match its layout".into(),
    ))
}
