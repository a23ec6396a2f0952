//! Optimizer steps on CUDA: which `cistern_*` step kernel a config runs,
//! its per-step constants (computed on the host in f64 and rounded to f32
//! exactly as the CPU kernels do) and where each state buffer goes among
//! its pointer slots. One launch per run of adjacent segments. LAMB has
//! no plan: it runs its own passes with host decisions between them
//! (`lamb.rs`).
//!
//! A counted step passes the device's count: each block then computes the
//! step-dependent constants in double from it, and
//! `cistern_step_count_advance` is queued after the step (`launch.rs`).

use cistern_kernels::Segment;
use cistern_optim::OptimizerConfig;

use super::launch::Arg;

/// How one family's step kernel is launched.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct StepPlan {
    /// The `cistern_*` kernel.
    pub(super) name: &'static str,
    /// How many state pointers the kernel takes (absent ones are null).
    pub(super) state_slots: usize,
    /// For each state buffer in layout order, its pointer slot.
    pub(super) layout_slots: Vec<usize>,
    /// The arguments after the flag and count pointers, before the length.
    pub(super) scalars: Vec<Arg>,
}

fn sign(maximize: bool) -> f32 {
    if maximize { -1.0 } else { 1.0 }
}

fn bit(on: bool, value: i32) -> i32 {
    if on { value } else { 0 }
}

/// Adam's and AdamW's constants for step `step`, as the CPU's `AdamScalars`.
fn adam_scalars(step: u64, lr: f64, betas: (f64, f64), eps: f64, maximize: bool) -> [f32; 9] {
    let t = step as f64;
    let bias_correction1 = 1.0 - betas.0.powf(t);
    let bias_correction2 = 1.0 - betas.1.powf(t);
    [
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

fn adam_plan(floats: [f32; 9], lr: f64, betas: (f64, f64), amsgrad: bool) -> StepPlan {
    let coupled = floats[1] != 0.0;
    let mut scalars: Vec<Arg> = floats.iter().map(|&f| Arg::F32(f)).collect();
    scalars.extend([
        Arg::F64(lr),
        Arg::F64(betas.0),
        Arg::F64(betas.1),
        Arg::I32(bit(coupled, 1) | bit(amsgrad, 2)),
    ]);
    StepPlan {
        name: "cistern_adam",
        state_slots: 3,
        layout_slots: if amsgrad { vec![0, 1, 2] } else { vec![0, 1] },
        scalars,
    }
}

/// The plan of `config`'s step as step `step` (steps count from 1), or
/// `None` for LAMB, which is not one launch per run (`lamb.rs`).
pub(super) fn step_plan(config: &OptimizerConfig, step: u64) -> Option<StepPlan> {
    Some(match config {
        OptimizerConfig::Sgd(c) => {
            let weight_decay = c.weight_decay as f32;
            let momentum = !c.state_layout().buffers.is_empty();
            let ops = bit(weight_decay != 0.0, 1)
                | bit(momentum, 2)
                | bit(step == 1, 4)
                | bit(c.nesterov, 8);
            StepPlan {
                name: "cistern_sgd",
                state_slots: 1,
                layout_slots: if momentum { vec![0] } else { vec![] },
                scalars: vec![
                    Arg::F32(sign(c.maximize)),
                    Arg::F32(weight_decay),
                    Arg::F32(c.lr as f32),
                    Arg::F32(c.momentum as f32),
                    Arg::F32((1.0 - c.dampening) as f32),
                    Arg::I32(ops),
                ],
            }
        }
        OptimizerConfig::Adam(c) => {
            let mut floats = adam_scalars(step, c.lr, c.betas, c.eps, c.maximize);
            floats[1] = c.weight_decay as f32;
            adam_plan(floats, c.lr, c.betas, c.amsgrad)
        }
        OptimizerConfig::AdamW(c) => {
            let mut floats = adam_scalars(step, c.lr, c.betas, c.eps, c.maximize);
            floats[2] = (1.0 - c.lr * c.weight_decay) as f32;
            adam_plan(floats, c.lr, c.betas, c.amsgrad)
        }
        OptimizerConfig::RmsProp(c) => {
            let weight_decay = c.weight_decay as f32;
            let momentum = c.momentum > 0.0;
            let mut layout_slots = vec![0];
            if momentum {
                layout_slots.push(1);
            }
            if c.centered {
                layout_slots.push(2);
            }
            StepPlan {
                name: "cistern_rmsprop",
                state_slots: 3,
                layout_slots,
                scalars: vec![
                    Arg::F32(sign(c.maximize)),
                    Arg::F32(weight_decay),
                    Arg::F32(c.lr as f32),
                    Arg::F32(c.alpha as f32),
                    Arg::F32((1.0 - c.alpha) as f32),
                    Arg::F32(c.eps as f32),
                    Arg::F32(c.momentum as f32),
                    Arg::I32(bit(weight_decay != 0.0, 1) | bit(momentum, 2) | bit(c.centered, 4)),
                ],
            }
        }
        OptimizerConfig::Adagrad(c) => {
            let weight_decay = c.weight_decay as f32;
            let decay_steps = step.saturating_sub(1) as f64;
            StepPlan {
                name: "cistern_adagrad",
                state_slots: 1,
                layout_slots: vec![0],
                scalars: vec![
                    Arg::F32(sign(c.maximize)),
                    Arg::F32(weight_decay),
                    Arg::F32((c.lr / (1.0 + decay_steps * c.lr_decay)) as f32),
                    Arg::F32(c.eps as f32),
                    Arg::F64(c.lr),
                    Arg::F64(c.lr_decay),
                    Arg::I32(bit(weight_decay != 0.0, 1)),
                ],
            }
        }
        OptimizerConfig::Lamb(_) => return None,
    })
}

/// Runs of adjacent non-empty segments: (first element, elements). An
/// element-wise step does not care where one tensor ends.
pub(super) fn runs(segments: &[Segment]) -> Vec<(u64, u64)> {
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
    use cistern_optim::{
        AdagradConfig, AdamConfig, AdamWConfig, LambConfig, RmsPropConfig, SgdConfig,
    };

    use super::super::signature::{parameters, ptx_type};
    use super::*;

    fn f32_at(plan: &StepPlan, index: usize) -> f32 {
        match plan.scalars.get(index) {
            Some(Arg::F32(value)) => *value,
            other => panic!("scalar {index} is {other:?}, not an f32"),
        }
    }

    fn ops(plan: &StepPlan) -> i32 {
        match plan.scalars.last() {
            Some(Arg::I32(value)) => *value,
            other => panic!("the last scalar is {other:?}, not the ops"),
        }
    }

    #[test]
    fn adams_constants_are_the_cpus_f64_values_rounded_once() {
        let config = AdamConfig {
            lr: 1e-3,
            betas: (0.9, 0.999),
            ..AdamConfig::default()
        };
        let plan = step_plan(&OptimizerConfig::Adam(config), 3).unwrap();
        assert_eq!(plan.name, "cistern_adam");
        let bias_correction1 = 1.0 - 0.9f64.powf(3.0);
        let bias_correction2 = 1.0 - 0.999f64.powf(3.0);
        assert_eq!(f32_at(&plan, 6), (1e-3 / bias_correction1) as f32);
        assert_eq!(f32_at(&plan, 7), (1.0 / bias_correction2.sqrt()) as f32);
        assert_eq!(f32_at(&plan, 3), (1.0 - 0.9f64) as f32);
        // The f64 config follows for a counted step, then the ops.
        assert_eq!(plan.scalars[9], Arg::F64(1e-3));
        assert_eq!(plan.scalars[10], Arg::F64(0.9));
        assert_eq!(plan.scalars[11], Arg::F64(0.999));
        assert_eq!(ops(&plan), 0);
        assert_eq!(plan.layout_slots, vec![0, 1]);
    }

    #[test]
    fn adamw_decays_the_parameter_and_adam_couples_the_decay_into_the_gradient() {
        let adamw = AdamWConfig {
            lr: 1e-2,
            weight_decay: 0.1,
            amsgrad: true,
            ..AdamWConfig::default()
        };
        let plan = step_plan(&OptimizerConfig::AdamW(adamw), 1).unwrap();
        assert_eq!(f32_at(&plan, 1), 0.0);
        assert_eq!(f32_at(&plan, 2), (1.0 - 1e-2 * 0.1f64) as f32);
        assert_eq!(ops(&plan), 2);
        assert_eq!(plan.layout_slots, vec![0, 1, 2]);
        let adam = AdamConfig {
            weight_decay: 0.1,
            ..AdamConfig::default()
        };
        let plan = step_plan(&OptimizerConfig::Adam(adam), 1).unwrap();
        assert_eq!(f32_at(&plan, 1), 0.1);
        assert_eq!(f32_at(&plan, 2), 1.0);
        assert_eq!(ops(&plan), 1);
    }

    #[test]
    fn sgds_first_step_and_momentum_buffer_are_op_bits() {
        let config = SgdConfig {
            lr: 0.1,
            momentum: 0.9,
            dampening: 0.25,
            weight_decay: 0.01,
            ..SgdConfig::default()
        };
        let first = step_plan(&OptimizerConfig::Sgd(config.clone()), 1).unwrap();
        assert_eq!(ops(&first), 1 | 2 | 4);
        assert_eq!(f32_at(&first, 4), 0.75);
        let later = step_plan(&OptimizerConfig::Sgd(config), 2).unwrap();
        assert_eq!(ops(&later), 1 | 2);
        let plain = step_plan(&OptimizerConfig::Sgd(SgdConfig::default()), 1).unwrap();
        assert_eq!(plain.layout_slots, Vec::<usize>::new());
        assert_eq!(ops(&plain) & 2, 0);
    }

    #[test]
    fn rmsprops_state_buffers_take_their_own_slots() {
        let centered = RmsPropConfig {
            centered: true,
            ..RmsPropConfig::default()
        };
        let plan = step_plan(&OptimizerConfig::RmsProp(centered), 1).unwrap();
        assert_eq!(plan.layout_slots, vec![0, 2]);
        assert_eq!(ops(&plan), 4);
        let both = RmsPropConfig {
            centered: true,
            momentum: 0.5,
            ..RmsPropConfig::default()
        };
        let plan = step_plan(&OptimizerConfig::RmsProp(both.clone()), 1).unwrap();
        assert_eq!(plan.layout_slots, vec![0, 1, 2]);
        assert_eq!(plan.layout_slots.len(), both.state_layout().len());
        assert_eq!(ops(&plan), 2 | 4);
    }

    #[test]
    fn adagrads_learning_rate_decays_with_the_steps_before_this_one() {
        let config = AdagradConfig {
            lr: 0.1,
            lr_decay: 0.5,
            ..AdagradConfig::default()
        };
        let plan = step_plan(&OptimizerConfig::Adagrad(config), 3).unwrap();
        assert_eq!(f32_at(&plan, 2), (0.1 / (1.0 + 2.0 * 0.5f64)) as f32);
        assert_eq!(plan.scalars[4], Arg::F64(0.1));
        assert_eq!(plan.scalars[5], Arg::F64(0.5));
    }

    #[test]
    fn every_plan_has_a_slot_per_state_buffer_and_lamb_runs_its_own_passes() {
        let configs = [
            OptimizerConfig::Sgd(SgdConfig {
                momentum: 0.9,
                ..SgdConfig::default()
            }),
            OptimizerConfig::Adam(AdamConfig::default()),
            OptimizerConfig::AdamW(AdamWConfig::default()),
            OptimizerConfig::RmsProp(RmsPropConfig::default()),
            OptimizerConfig::Adagrad(AdagradConfig::default()),
        ];
        for config in configs {
            let plan = step_plan(&config, 1).unwrap();
            assert_eq!(plan.layout_slots.len(), config.state_layout().len());
            assert!(
                plan.layout_slots
                    .iter()
                    .all(|&slot| slot < plan.state_slots)
            );
        }
        assert!(step_plan(&OptimizerConfig::Lamb(LambConfig::default()), 1).is_none());
    }

    #[test]
    fn every_step_kernel_takes_the_arguments_the_host_packs_for_it() {
        let Some(ptx) = cistern_kernels::cuda::prebuilt_ptx() else {
            eprintln!("cuda tests: SKIPPING the step kernels' signatures: no build-time PTX");
            return;
        };
        let configs = [
            OptimizerConfig::Sgd(SgdConfig::default()),
            OptimizerConfig::Adam(AdamConfig::default()),
            OptimizerConfig::AdamW(AdamWConfig::default()),
            OptimizerConfig::RmsProp(RmsPropConfig::default()),
            OptimizerConfig::Adagrad(AdagradConfig::default()),
        ];
        for config in configs {
            let plan = step_plan(&config, 1).unwrap();
            // params, grads, the state slots, flag, count, scalars, length:
            // as `Launcher::step` packs them.
            let mut packed = vec![Arg::Pointer(0); 2 + plan.state_slots + 2];
            packed.extend(plan.scalars.iter().copied());
            packed.push(Arg::U64(0));
            let want: Vec<&str> = packed.iter().map(ptx_type).collect();
            assert_eq!(parameters(ptx, plan.name), want, "{}", plan.name);
        }
    }

    #[test]
    fn the_lamb_kernels_take_the_arguments_the_host_packs_for_them() {
        use super::super::lamb::{LambBuffers, ScratchLayout, measure_args, write_args};
        use super::super::launch::CudaSlice;
        let Some(ptx) = cistern_kernels::cuda::prebuilt_ptx() else {
            eprintln!("cuda tests: SKIPPING the LAMB kernels' signatures: no build-time PTX");
            return;
        };
        let slice = CudaSlice { address: 0, len: 4 };
        let buffers = LambBuffers {
            params: slice,
            grads: slice,
            exp_avg: slice,
            exp_avg_sq: slice,
        };
        let layout = ScratchLayout::new(1, 1).unwrap();
        let floats = [0.0; 9];
        let measure = measure_args(&buffers, 0, &layout, 1, 0, true, &floats);
        let write = write_args(&buffers, 0, &layout, 1, true, &floats);
        for (name, packed) in [
            ("cistern_lamb_measure", measure),
            ("cistern_lamb_write", write),
        ] {
            let want: Vec<&str> = packed.iter().map(ptx_type).collect();
            assert_eq!(parameters(ptx, name), want, "{name}");
        }
    }

    #[test]
    fn adjacent_segments_make_one_run_and_empty_ones_none() {
        let segments = [
            Segment::new(0, 3),
            Segment::new(3, 2),
            Segment::new(5, 0),
            Segment::new(8, 4),
        ];
        assert_eq!(runs(&segments), vec![(0, 5), (8, 4)]);
        assert!(runs(&[Segment::new(0, 0)]).is_empty());
    }
}
