//! The per-step constants of every fused step in one place: computed once
//! on the host in f64 and rounded to f32 by each family's own struct, which
//! the CPU kernels use as they are and [`step_scalars`] packs, in the GPU
//! kernels' argument order, for the wgpu and CUDA backends. (The f64
//! reference in `cistern-optim` stays apart on purpose: it is the oracle.)

use cistern_optim::{OptimizerConfig, Segment};

use super::adagrad::AdagradScalars;
use super::adam::AdamScalars;
use super::rmsprop::RmsPropScalars;
use super::sgd::SgdScalars;

/// One step's constants as the GPU kernels take them.
#[derive(Debug, Clone, PartialEq)]
pub struct StepScalars {
    /// The family's floats, in its kernels' argument order.
    pub floats: Vec<f32>,
    /// Its option bits (per family: SGD 1 weight decay, 2 momentum buffer,
    /// 4 first step, 8 Nesterov; Adam 1 coupled decay, 2 amsgrad; RMSprop 1
    /// weight decay, 2 momentum buffer, 4 centered; Adagrad 1 weight decay).
    pub ops: u32,
    /// Each state buffer's slot, in layout order, among the GPU kernels'
    /// state pointers (SGD and Adagrad take one, Adam and RMSprop three:
    /// the ones a config leaves out are null).
    pub state_slots: Vec<usize>,
}

/// The constants of `config`'s step `step` (steps count from 1), or `None`
/// for LAMB, whose passes decide on the host between launches.
pub fn step_scalars(config: &OptimizerConfig, step: u64) -> Option<StepScalars> {
    let adam_slots = |amsgrad: bool| if amsgrad { vec![0, 1, 2] } else { vec![0, 1] };
    let ((floats, ops), state_slots) = match config {
        OptimizerConfig::Sgd(c) => {
            let momentum = !c.state_layout().buffers.is_empty();
            let slots = if momentum { vec![0] } else { vec![] };
            (SgdScalars::of(c, step).packed(momentum), slots)
        }
        OptimizerConfig::Adam(c) => (
            AdamScalars::of_adam(c, step).packed(c.amsgrad),
            adam_slots(c.amsgrad),
        ),
        OptimizerConfig::AdamW(c) => (
            AdamScalars::of_adamw(c, step).packed(c.amsgrad),
            adam_slots(c.amsgrad),
        ),
        OptimizerConfig::RmsProp(c) => {
            let momentum = c.momentum > 0.0;
            let slots = [Some(0), momentum.then_some(1), c.centered.then_some(2)];
            let packed = RmsPropScalars::of(c).packed(momentum, c.centered);
            (packed, slots.into_iter().flatten().collect())
        }
        OptimizerConfig::Adagrad(c) => (AdagradScalars::of(c, step).packed(), vec![0]),
        OptimizerConfig::Lamb(_) => return None,
    };
    Some(StepScalars {
        floats,
        ops,
        state_slots,
    })
}

/// Runs of adjacent non-empty segments: (first element, elements). An
/// element-wise step does not care where one tensor ends, so a GPU backend
/// launches once per run.
pub fn segment_runs(segments: &[Segment]) -> Vec<(u64, u64)> {
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

#[cfg(test)]
mod tests {
    use cistern_optim::{AdagradConfig, AdamConfig, AdamWConfig, LambConfig, SgdConfig};

    use super::*;

    #[test]
    fn adams_constants_are_the_f64_values_rounded_once() {
        let config = AdamConfig {
            lr: 1e-3,
            betas: (0.9, 0.999),
            ..AdamConfig::default()
        };
        let packed = step_scalars(&OptimizerConfig::Adam(config), 3).unwrap();
        let bias_correction1 = 1.0 - 0.9f64.powf(3.0);
        let bias_correction2 = 1.0 - 0.999f64.powf(3.0);
        assert_eq!(packed.floats.len(), 9);
        assert_eq!(packed.floats[3], (1.0 - 0.9f64) as f32);
        assert_eq!(packed.floats[6], (1e-3 / bias_correction1) as f32);
        assert_eq!(packed.floats[7], (1.0 / bias_correction2.sqrt()) as f32);
        assert_eq!(packed.ops, 0);
    }

    #[test]
    fn adamw_decays_the_parameter_where_adam_couples_the_decay() {
        let adamw = AdamWConfig {
            lr: 1e-2,
            weight_decay: 0.1,
            amsgrad: true,
            ..AdamWConfig::default()
        };
        let packed = step_scalars(&OptimizerConfig::AdamW(adamw), 1).unwrap();
        assert_eq!(
            (packed.floats[1], packed.floats[2]),
            (0.0, (1.0 - 1e-2 * 0.1f64) as f32)
        );
        assert_eq!(packed.ops, 2);
        let adam = AdamConfig {
            weight_decay: 0.1,
            ..AdamConfig::default()
        };
        let packed = step_scalars(&OptimizerConfig::Adam(adam), 1).unwrap();
        assert_eq!((packed.floats[1], packed.floats[2]), (0.1, 1.0));
        assert_eq!(packed.ops, 1);
    }

    #[test]
    fn sgds_first_step_and_momentum_buffer_are_op_bits() {
        let config = SgdConfig {
            momentum: 0.9,
            nesterov: true,
            ..SgdConfig::default()
        };
        let first = step_scalars(&OptimizerConfig::Sgd(config.clone()), 1).unwrap();
        assert_eq!(first.ops, 2 | 4 | 8);
        let later = step_scalars(&OptimizerConfig::Sgd(config), 2).unwrap();
        assert_eq!(later.ops, 2 | 8);
        let plain = step_scalars(&OptimizerConfig::Sgd(SgdConfig::default()), 1).unwrap();
        assert_eq!(plain.ops & 2, 0);
    }

    #[test]
    fn adagrads_learning_rate_decays_with_the_steps_before_this_one() {
        let config = AdagradConfig {
            lr: 0.1,
            lr_decay: 0.5,
            ..AdagradConfig::default()
        };
        let third = step_scalars(&OptimizerConfig::Adagrad(config), 3).unwrap();
        assert_eq!(third.floats[2], (0.1 / (1.0 + 2.0 * 0.5)) as f32);
    }

    #[test]
    fn lamb_has_no_single_launch_constants() {
        assert!(step_scalars(&OptimizerConfig::Lamb(LambConfig::default()), 1).is_none());
    }

    #[test]
    fn adjacent_segments_make_one_run_and_empty_ones_none() {
        let segment = |offset, len| Segment { offset, len };
        let runs = segment_runs(&[segment(0, 4), segment(4, 0), segment(4, 2), segment(10, 3)]);
        assert_eq!(runs, vec![(0, 6), (10, 3)]);
        assert!(segment_runs(&[]).is_empty());
    }
}
