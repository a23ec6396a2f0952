//! Fused optimizer steps on wgpu: one dispatch per run of adjacent
//! segments (cut into chunks of bindings), with the per-step constants
//! computed on the host in f64 as the CPU kernels compute them.

use cistern_kernels::Segment;
use cistern_optim::OptimizerConfig;

use super::context::GpuContext;
use super::dispatch::{Dispatch, PER_INVOCATION, Params, Window, unsupported};
use super::kernels::Plan;
use super::pipelines::{Entry, Module};
use super::slice::GpuSlice;
use crate::backend::stream::{KernelFault, LaunchError};
use crate::{OptimizerArgs, ServerError};

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

fn sign(maximize: bool) -> f32 {
    if maximize { -1.0 } else { 1.0 }
}

fn bit(on: bool, value: u32) -> u32 {
    if on { value } else { 0 }
}

fn adam_floats(step: u64, lr: f64, betas: (f64, f64), eps: f64, maximize: bool) -> Vec<f32> {
    let t = step as f64;
    let bias_correction1 = 1.0 - betas.0.powf(t);
    let bias_correction2 = 1.0 - betas.1.powf(t);
    vec![
        sign(maximize),
        0.0,
        1.0,
        (1.0 - betas.0) as f32,
        betas.1 as f32,
        (1.0 - betas.1) as f32,
        (lr / bias_correction1) as f32,
        (1.0 / bias_correction2.sqrt()) as f32,
        eps as f32,
    ]
}

fn adam_slots(amsgrad: bool) -> Vec<usize> {
    if amsgrad { vec![3, 4, 5] } else { vec![3, 4] }
}

/// The step's constants, or `None` for a family this backend does not run.
fn step_of(config: &OptimizerConfig, step: u64) -> Option<Step> {
    Some(match config {
        OptimizerConfig::Sgd(c) => Step {
            entry: step_entry("sgd"),
            op: bit(c.weight_decay != 0.0, 1)
                | bit(c.momentum != 0.0, 2)
                | bit(step == 1, 4)
                | bit(c.nesterov, 8),
            floats: vec![
                sign(c.maximize),
                c.weight_decay as f32,
                c.lr as f32,
                c.momentum as f32,
                (1.0 - c.dampening) as f32,
            ],
            slots: if c.momentum != 0.0 { vec![3] } else { vec![] },
        },
        OptimizerConfig::Adam(c) => {
            let mut floats = adam_floats(step, c.lr, c.betas, c.eps, c.maximize);
            floats[1] = c.weight_decay as f32;
            Step {
                entry: ADAM,
                op: bit(c.weight_decay != 0.0, 1) | bit(c.amsgrad, 2),
                floats,
                slots: adam_slots(c.amsgrad),
            }
        }
        OptimizerConfig::AdamW(c) => {
            let mut floats = adam_floats(step, c.lr, c.betas, c.eps, c.maximize);
            floats[2] = (1.0 - c.lr * c.weight_decay) as f32;
            Step {
                entry: ADAM,
                op: bit(c.amsgrad, 2),
                floats,
                slots: adam_slots(c.amsgrad),
            }
        }
        OptimizerConfig::RmsProp(c) => {
            let momentum = c.momentum > 0.0;
            let mut slots = vec![3];
            if momentum {
                slots.push(4);
            }
            if c.centered {
                slots.push(5);
            }
            Step {
                entry: step_entry("rmsprop"),
                op: bit(c.weight_decay != 0.0, 1) | bit(momentum, 2) | bit(c.centered, 4),
                floats: vec![
                    sign(c.maximize),
                    c.weight_decay as f32,
                    c.lr as f32,
                    c.alpha as f32,
                    (1.0 - c.alpha) as f32,
                    c.eps as f32,
                    c.momentum as f32,
                ],
                slots,
            }
        }
        OptimizerConfig::Adagrad(c) => Step {
            entry: step_entry("adagrad"),
            op: bit(c.weight_decay != 0.0, 1),
            floats: vec![
                sign(c.maximize),
                c.weight_decay as f32,
                (c.lr / (1.0 + (step - 1) as f64 * c.lr_decay)) as f32,
                c.eps as f32,
            ],
            slots: vec![3],
        },
        OptimizerConfig::Lamb(_) => return None,
    })
}

/// Runs of adjacent non-empty segments: (first element, elements).
fn runs(segments: &[Segment]) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for segment in segments.iter().filter(|s| s.len > 0) {
        let (offset, len) = (segment.offset as u64, segment.len as u64);
        match runs.last_mut() {
            Some((start, run)) if *start + *run == offset => *run += len,
            _ => runs.push((offset, len)),
        }
    }
    runs
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
        for (first, len) in runs(&args.segments) {
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
