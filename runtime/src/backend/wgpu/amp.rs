//! AMP on device words on wgpu, with no host synchronisation: unscaling by
//! the scale the device holds, `_amp_update_scale_`, and the counted
//! optimizer step: a one-invocation `step_count` dispatch reads the flag
//! and count, advances the count and writes the step's constants, then the
//! family's step dispatches read them in place of the flag (LAMB, which
//! reads its norms back anyway, reads the flag and count back: `lamb.rs`).

use cistern_kernels::ScaleRule;
use cistern_optim::OptimizerConfig;

use super::context::GpuContext;
use super::dispatch::Params;
use super::kernels::Plan;
use super::optimizer::Skip;
use super::pipelines::{Entry, Module};
use super::slice::GpuSlice;
use crate::backend::stream::{KernelFault, LaunchError};
use crate::optimizer::OptimizerArgs;

const fn amp_entry(name: &'static str, buffers: u32) -> Entry {
    Entry {
        module: Module::Amp,
        name,
        buffers,
        table: false,
        per_invocation: 1,
    }
}

const UNSCALE_BY_DEVICE_SCALE: Entry = amp_entry("amp_unscale_by_device_scale", 3);
const UPDATE_SCALE: Entry = amp_entry("amp_update_scale", 4);
const STEP_COUNT: Entry = amp_entry("step_count", 3);

/// `step_count`'s op codes: which per-step constants it writes.
const NO_CONSTANTS: u32 = 0;
const SGD_FIRST_STEP: u32 = 1;
const ADAM_BIAS_CORRECTIONS: u32 = 2;
const ADAGRAD_DECAY: u32 = 3;

fn malformed(kernel: &str) -> LaunchError {
    LaunchError::Fault(KernelFault::Malformed(format!(
        "{kernel}'s bindings do not match its signature"
    )))
}

/// The largest finite magnitude `s` for which `passes(s)` holds, where
/// `passes` holds up to some magnitude and not past it; -1 when none does.
fn largest_passing(passes: impl Fn(f32) -> bool) -> f32 {
    if !passes(0.0) {
        return -1.0;
    }
    let (mut good, mut bad) = (0u32, f32::MAX.to_bits());
    if passes(f32::MAX) {
        return f32::MAX;
    }
    while bad - good > 1 {
        let middle = good + (bad - good) / 2;
        if passes(f32::from_bits(middle)) {
            good = middle;
        } else {
            bad = middle;
        }
    }
    f32::from_bits(good)
}

/// The smallest positive finite magnitude `s` for which `passes(s)` holds,
/// where `passes` holds from some magnitude on; infinity when none does.
fn smallest_passing(passes: impl Fn(f32) -> bool) -> f32 {
    if !passes(f32::MAX) {
        return f32::INFINITY;
    }
    let (mut bad, mut good) = (0u32, f32::MAX.to_bits());
    while good - bad > 1 {
        let middle = bad + (good - bad) / 2;
        if passes(f32::from_bits(middle)) {
            good = middle;
        } else {
            bad = middle;
        }
    }
    f32::from_bits(good)
}

/// `amp_update_scale`'s floats: the factors as f32 and the thresholds at
/// which the CPU's f64 products stop being finite (growth) or normal
/// (backoff), so the device decides exactly as the CPU does.
fn update_floats(rule: &ScaleRule) -> [f32; 4] {
    let times = |s: f32, factor: f64| (f64::from(s) * factor) as f32;
    let grow_max = largest_passing(|s| times(s, rule.growth_factor).is_finite());
    let back_min = smallest_passing(|s| times(s, rule.backoff_factor).is_normal());
    [
        rule.growth_factor as f32,
        rule.backoff_factor as f32,
        grow_max,
        back_min,
    ]
}

/// `ln β` as f32 for `1 − β^t = −expm1(t·ln β)` on the device; `β = 0`
/// (whose powers are 0) becomes a logarithm whose multiples underflow `exp`.
fn log_of(beta: f64) -> f32 {
    beta.ln().max(-1e3) as f32
}

/// `step_count`'s op code and floats for `config`'s per-step constants.
fn step_constants(config: &OptimizerConfig) -> (u32, Vec<f32>) {
    match config {
        OptimizerConfig::Sgd(_) => (SGD_FIRST_STEP, vec![]),
        OptimizerConfig::Adam(c) => (
            ADAM_BIAS_CORRECTIONS,
            vec![c.lr as f32, log_of(c.betas.0), log_of(c.betas.1)],
        ),
        OptimizerConfig::AdamW(c) => (
            ADAM_BIAS_CORRECTIONS,
            vec![c.lr as f32, log_of(c.betas.0), log_of(c.betas.1)],
        ),
        OptimizerConfig::Adagrad(c) => (ADAGRAD_DECAY, vec![c.lr as f32, c.lr_decay as f32]),
        OptimizerConfig::RmsProp(_) | OptimizerConfig::Lamb(_) => (NO_CONSTANTS, vec![]),
    }
}

impl GpuContext {
    /// `grads ← grads / scale[0]` over bindings (grads, flag, scale).
    pub(super) fn unscale_by_device_scale(
        &self,
        bindings: &[GpuSlice],
    ) -> Result<Plan<'static>, LaunchError> {
        let [grads, flag, scale] = bindings else {
            return Err(malformed("amp_unscale_by_device_scale"));
        };
        let whole = [self.window(flag), self.window(scale)];
        let whole = whole
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(LaunchError::Refused)?;
        let params = Params::new(0, &[]);
        self.elementwise(
            UNSCALE_BY_DEVICE_SCALE,
            &[grads],
            &whole,
            grads.size / 4,
            params,
        )
        .map(Plan::Dispatches)
        .map_err(LaunchError::Refused)
    }

    /// `_amp_update_scale_` over bindings (flag, scale, tracker, skipped).
    pub(super) fn update_scale(
        &self,
        rule: &ScaleRule,
        bindings: &[GpuSlice],
    ) -> Result<Plan<'static>, LaunchError> {
        if bindings.len() != 4 {
            return Err(malformed("amp_update_scale"));
        }
        let windows = bindings
            .iter()
            .map(|slice| self.window(slice))
            .collect::<Result<Vec<_>, _>>()
            .map_err(LaunchError::Refused)?;
        let mut params = Params::new(0, &update_floats(rule));
        params.u[8] = rule.growth_interval;
        let dispatch = self
            .dispatch(UPDATE_SCALE, windows, None, params, 1)
            .map_err(LaunchError::Refused)?;
        Ok(Plan::Dispatches(vec![dispatch]))
    }

    /// A counted step over bindings (params, grads, flag, count, state):
    /// `step_count`, then the family's dispatches reading its constants.
    pub(super) fn counted_step<'a>(
        &self,
        args: &'a OptimizerArgs,
        bindings: &[GpuSlice],
    ) -> Result<Plan<'a>, LaunchError> {
        if let OptimizerConfig::Lamb(config) = &args.config {
            return Ok(Plan::CountedLamb(config, args));
        }
        let (Some(flag), Some(count)) = (bindings.get(2), bindings.get(3)) else {
            return Err(malformed("optimizer_step_counted"));
        };
        let constants = self.scratch(4);
        let windows = [
            self.window(flag),
            self.window(count),
            self.window(&constants),
        ];
        let windows = windows
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(LaunchError::Refused)?;
        let constants = windows[2].clone();
        let (op, floats) = step_constants(&args.config);
        let first = self
            .dispatch(STEP_COUNT, windows, None, Params::new(op, &floats), 1)
            .map_err(LaunchError::Refused)?;
        let mut dispatches = vec![first];
        dispatches.extend(self.step_dispatches(args, 1, bindings, 4, Skip::Counted(constants))?);
        Ok(Plan::Dispatches(dispatches))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_update_thresholds_are_where_the_cpus_products_change_kind() {
        let rule = ScaleRule {
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 1,
        };
        let [_, _, grow_max, back_min] = update_floats(&rule);
        assert_eq!(grow_max, f32::MAX / 2.0);
        // Half of the next magnitude down is a tie that rounds up to normal.
        assert_eq!(
            back_min,
            f32::from_bits((f32::MIN_POSITIVE * 2.0).to_bits() - 1)
        );
        let odd = ScaleRule {
            growth_factor: 3.1,
            backoff_factor: 0.3,
            growth_interval: 1,
        };
        let times = |s: f32, f: f64| (f64::from(s) * f) as f32;
        for rule in [rule, odd] {
            let [_, _, grow_max, back_min] = update_floats(&rule);
            let (growth, backoff) = (rule.growth_factor, rule.backoff_factor);
            assert!(times(grow_max, growth).is_finite());
            assert!(!times(f32::from_bits(grow_max.to_bits() + 1), growth).is_finite());
            assert!(times(back_min, backoff).is_normal());
            assert!(!times(f32::from_bits(back_min.to_bits() - 1), backoff).is_normal());
        }
    }

    #[test]
    fn a_logarithm_of_zero_is_finite_and_underflows_every_power() {
        assert_eq!(log_of(0.0), -1e3);
        assert_eq!(log_of(1.0), 0.0);
    }
}
