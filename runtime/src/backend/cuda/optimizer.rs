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

use cistern_kernels::{StepScalars, step_scalars};
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

/// The floats of `scalars` as arguments.
fn floats(scalars: &StepScalars) -> Vec<Arg> {
    scalars.floats.iter().map(|&f| Arg::F32(f)).collect()
}

/// The op bits of `scalars` as the kernel's `int`.
fn ops(scalars: &StepScalars) -> Arg {
    Arg::I32(scalars.ops as i32)
}

/// The plan of `config`'s step as step `step` (steps count from 1), or
/// `None` for LAMB, which is not one launch per run (`lamb.rs`). The
/// constants are `cistern_kernels::step_scalars`'; a counted step's kernel
/// also takes the f64 configuration it recomputes them from.
pub(super) fn step_plan(config: &OptimizerConfig, step: u64) -> Option<StepPlan> {
    let packed = step_scalars(config, step)?;
    let mut scalars = floats(&packed);
    let (name, state_slots) = match config {
        OptimizerConfig::Sgd(_) => ("cistern_sgd", 1),
        OptimizerConfig::Adam(cistern_optim::AdamConfig { lr, betas, .. })
        | OptimizerConfig::AdamW(cistern_optim::AdamWConfig { lr, betas, .. }) => {
            scalars.extend([Arg::F64(*lr), Arg::F64(betas.0), Arg::F64(betas.1)]);
            ("cistern_adam", 3)
        }
        OptimizerConfig::RmsProp(_) => ("cistern_rmsprop", 3),
        OptimizerConfig::Adagrad(c) => {
            scalars.extend([Arg::F64(c.lr), Arg::F64(c.lr_decay)]);
            ("cistern_adagrad", 1)
        }
        OptimizerConfig::Lamb(_) => return None,
    };
    scalars.push(ops(&packed));
    Some(StepPlan {
        name,
        state_slots,
        layout_slots: packed.state_slots,
        scalars,
    })
}

#[cfg(test)]
mod tests {
    use cistern_optim::{
        AdagradConfig, AdamConfig, AdamWConfig, LambConfig, RmsPropConfig, SgdConfig,
    };

    use super::super::signature::{parameters, ptx_type};
    use super::*;

    fn ops(plan: &StepPlan) -> i32 {
        match plan.scalars.last() {
            Some(Arg::I32(value)) => *value,
            other => panic!("the last scalar is {other:?}, not the ops"),
        }
    }

    #[test]
    fn every_plan_packs_the_shared_constants_then_its_f64_config_and_the_ops() {
        let adam = AdamConfig {
            lr: 1e-3,
            weight_decay: 0.1,
            ..AdamConfig::default()
        };
        let adagrad = AdagradConfig {
            lr: 0.1,
            lr_decay: 0.5,
            ..AdagradConfig::default()
        };
        let cases = [
            (
                OptimizerConfig::Adam(adam),
                vec![Arg::F64(1e-3), Arg::F64(0.9), Arg::F64(0.999)],
            ),
            (
                OptimizerConfig::AdamW(AdamWConfig::default()),
                vec![Arg::F64(1e-3), Arg::F64(0.9), Arg::F64(0.999)],
            ),
            (
                OptimizerConfig::Adagrad(adagrad),
                vec![Arg::F64(0.1), Arg::F64(0.5)],
            ),
            (
                OptimizerConfig::Sgd(SgdConfig {
                    momentum: 0.9,
                    weight_decay: 0.01,
                    ..SgdConfig::default()
                }),
                vec![],
            ),
            (OptimizerConfig::RmsProp(RmsPropConfig::default()), vec![]),
        ];
        for (config, f64s) in cases {
            let shared = step_scalars(&config, 3).unwrap();
            let plan = step_plan(&config, 3).unwrap();
            let floats: Vec<Arg> = shared.floats.iter().map(|&f| Arg::F32(f)).collect();
            let mut want = floats;
            want.extend(f64s);
            want.push(Arg::I32(shared.ops as i32));
            assert_eq!(plan.scalars, want, "{}", plan.name);
        }
    }

    #[test]
    fn adams_and_sgds_state_buffers_take_their_own_slots() {
        let amsgrad = AdamWConfig {
            amsgrad: true,
            ..AdamWConfig::default()
        };
        let plan = step_plan(&OptimizerConfig::AdamW(amsgrad), 1).unwrap();
        assert_eq!(plan.layout_slots, vec![0, 1, 2]);
        assert_eq!(ops(&plan), 2);
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
}
