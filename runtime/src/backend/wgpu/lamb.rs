//! LAMB on wgpu, all-or-nothing as on the CPU: the squared gradient norms
//! per segment, then each segment's parameter and update norms, are read
//! back and combined on the host in f64 (where a refusal is decided and
//! nothing has changed), then one write pass applies each segment's ratio.

use cistern_kernels::Segment;
use cistern_optim::LambConfig;

use super::context::GpuContext;
use super::dispatch::{Params, WORKGROUP};
use super::kernels::{Plan, u32_of};
use super::pipelines::{Entry, Module};
use super::slice::GpuSlice;
use crate::backend::stream::{KernelFault, LaunchError};
use crate::error::ServerError;
use crate::optimizer::OptimizerArgs;

const fn lamb_entry(name: &'static str) -> Entry {
    Entry {
        module: Module::Optimizer,
        name,
        buffers: 6,
        table: true,
        per_invocation: 1,
    }
}

/// The name a counted step's refusals carry, as the CPU's.
const COUNTED: &str = "optimizer_step_counted";

const MEASURE: Entry = lamb_entry("lamb_measure");
const WRITE: Entry = lamb_entry("lamb_write");

/// A refusal worded as the CPU kernel's.
fn refused(kernel: &str, field: String, reason: &str) -> LaunchError {
    let error = cistern_kernels::KernelError::invalid(field, reason);
    LaunchError::Refused(ServerError::InvalidArgument {
        message: format!("{kernel}: {error}"),
    })
}

/// The per-step constants, as apex's `multi_tensor_lamb` computes them.
fn floats(c: &LambConfig, step: u64, grad_norm: f64) -> Vec<f32> {
    c.step_constants(step, grad_norm).to_array().to_vec()
}

/// Whether the bytes of a flag word read back are a set flag (anything but
/// +0 or −0, as the CPU's `flag != 0.0`).
fn is_set(flag: &[u8]) -> bool {
    flag.iter().any(|byte| *byte != 0) && flag != [0, 0, 0, 0x80]
}

impl GpuContext {
    /// Runs one LAMB step over `bindings` (params, grads, the flag when
    /// AMP, exp_avg, exp_avg_sq).
    pub(super) fn lamb(
        &self,
        config: &LambConfig,
        args: &OptimizerArgs,
        bindings: &[GpuSlice],
    ) -> Result<(), LaunchError> {
        let first_state = if args.found_inf { 3 } else { 2 };
        if args.found_inf && is_set(&self.read(bindings.get(2).ok_or_else(malformed)?)?) {
            return Ok(());
        }
        let buffers = lamb_buffers(bindings, first_state)?;
        self.lamb_step("optimizer_step", config, args.step, &args.segments, buffers)
    }

    /// Runs one counted LAMB step over `bindings` (params, grads, flag,
    /// count, exp_avg, exp_avg_sq): skipped on the flag, otherwise step
    /// `count + 1`, advancing the count, as the CPU's counted step.
    pub(super) fn counted_lamb(
        &self,
        config: &LambConfig,
        args: &OptimizerArgs,
        bindings: &[GpuSlice],
    ) -> Result<(), LaunchError> {
        let buffers = lamb_buffers(bindings, 4)?;
        if is_set(&self.read(bindings.get(2).ok_or_else(malformed)?)?) {
            return Ok(());
        }
        let count_slice = bindings.get(3).ok_or_else(malformed)?;
        let count = match self.read(count_slice)?.as_slice() {
            &[a, b, c, d] => u32::from_le_bytes([a, b, c, d]),
            _ => return Err(malformed()),
        };
        let Some(step) = count.checked_add(1) else {
            return Err(refused(
                COUNTED,
                "count".into(),
                "the step count overflows u32",
            ));
        };
        self.lamb_step(COUNTED, config, u64::from(step), &args.segments, buffers)?;
        Ok(self.write(count_slice, &step.to_le_bytes())?)
    }

    /// LAMB's passes as step `step` over params, grads, exp_avg, exp_avg_sq.
    fn lamb_step(
        &self,
        kernel: &str,
        config: &LambConfig,
        step: u64,
        segments: &[Segment],
        [params, grads, m, v]: [&GpuSlice; 4],
    ) -> Result<(), LaunchError> {
        let grad_norm = self
            .sum_squares(grads, segments)?
            .iter()
            .map(|s| f64::from(*s))
            .sum::<f64>()
            .sqrt();
        if !grad_norm.is_finite() {
            return Err(refused(
                kernel,
                "grads".into(),
                "the global gradient norm is not finite",
            ));
        }
        let floats = floats(config, step, grad_norm);
        let params_value = Params::new(u32::from(config.adam_w_mode), &floats);
        let sums = self.scratch(2 * segments.len() as u64);
        self.segment_pass(
            MEASURE,
            [params, grads, m, v, &sums],
            segments,
            params_value,
        )?;
        let norms = bytes_to_f32(&self.read(&sums)?);
        let trust_ratio = config.use_nvlamb || config.weight_decay != 0.0;
        let mut ratios = Vec::with_capacity(segments.len());
        for (index, pair) in norms.chunks_exact(2).enumerate() {
            let param_norm = f64::from(pair[0]).sqrt();
            let update_norm = f64::from(pair[1]).sqrt();
            let ratio = if trust_ratio && param_norm != 0.0 && update_norm != 0.0 {
                config.lr * (param_norm / update_norm)
            } else {
                config.lr
            };
            if !(param_norm.is_finite() && update_norm.is_finite() && ratio.is_finite()) {
                return Err(refused(
                    kernel,
                    format!("segments[{index}]"),
                    "a moment, norm or trust ratio would be non-finite",
                ));
            }
            ratios.push(ratio as f32);
        }
        let ratio_buffer = self.scratch(ratios.len() as u64);
        let bytes: Vec<u8> = ratios.iter().flat_map(|r| r.to_le_bytes()).collect();
        self.write(&ratio_buffer, &bytes)?;
        self.segment_pass(
            WRITE,
            [params, grads, m, v, &ratio_buffer],
            segments,
            params_value,
        )
    }

    /// Per-segment sums of squares of `x`, read back.
    fn sum_squares(&self, x: &GpuSlice, segments: &[Segment]) -> Result<Vec<f32>, LaunchError> {
        let out = self.scratch(segments.len() as u64);
        match self
            .segment_sum(x, segments, &out, 1)
            .map_err(LaunchError::Refused)?
        {
            Plan::Dispatches(dispatches) => self.run_now(&dispatches)?,
            Plan::Nothing
            | Plan::Submissions(..)
            | Plan::Copy(..)
            | Plan::Lamb(..)
            | Plan::CountedLamb(..) => {}
        }
        Ok(bytes_to_f32(&self.read(&out)?))
    }

    /// One workgroup per segment of `entry` over p, g, m, v and an output.
    fn segment_pass(
        &self,
        entry: Entry,
        [p, g, m, v, out]: [&GpuSlice; 5],
        segments: &[Segment],
        params: Params,
    ) -> Result<(), LaunchError> {
        let build = || -> Result<_, ServerError> {
            let mut words = Vec::with_capacity(2 * segments.len());
            for segment in segments {
                words.push(u32_of(segment.offset as u64)?);
                words.push(u32_of(segment.len as u64)?);
            }
            let windows = vec![
                self.window(p)?,
                self.window(g)?,
                self.zero_window(),
                self.window(m)?,
                self.window(v)?,
                self.window(out)?,
            ];
            let count = segments.len() as u64;
            let table = Some(self.table(&words));
            let mut dispatch = self.dispatch(entry, windows, table, params, count)?;
            dispatch.groups = self.groups_for(count * WORKGROUP)?;
            Ok(dispatch)
        };
        let dispatch = build().map_err(LaunchError::Refused)?;
        self.run_now(&[dispatch])
    }

    /// A zeroed buffer of `elements` f32s for intermediate results.
    pub(super) fn scratch(&self, elements: u64) -> GpuSlice {
        let size = (4 * elements).max(4);
        let buffer = self.device.create_buffer(&::wgpu::BufferDescriptor {
            label: Some("cistern scratch"),
            size,
            usage: ::wgpu::BufferUsages::STORAGE
                | ::wgpu::BufferUsages::COPY_SRC
                | ::wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        GpuSlice {
            buffer,
            offset: 0,
            size: 4 * elements,
        }
    }
}

fn malformed() -> LaunchError {
    LaunchError::Fault(KernelFault::Malformed(
        "a lamb step's bindings do not match its layout".into(),
    ))
}

/// params, grads, exp_avg, exp_avg_sq: the first two and the state from
/// `first_state`.
fn lamb_buffers(bindings: &[GpuSlice], first_state: usize) -> Result<[&GpuSlice; 4], LaunchError> {
    let at = |index: usize| bindings.get(index).ok_or_else(malformed);
    Ok([at(0)?, at(1)?, at(first_state)?, at(first_state + 1)?])
}

fn bytes_to_f32(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}
