//! Replica groups in one process: CPU ordinals as devices, the
//! `InProcess` engine.

mod common;

use cistern_client::{DeviceParamStore, Tape, Tensor};
use cistern_optim::{GradScaler, GradScalerConfig, OptimizerConfig, SgdConfig};
use cistern_parallel::{GroupError, InProcess, ReplicaGroup};
use cistern_runtime::FaultPlan;

use common::{ROWS, adam_steps, cpu, cpu_with, every_family, ok, problem, work};

fn group(devices: usize, seed: u64) -> (ReplicaGroup, common::Problem) {
    let problem = problem(seed);
    let clients = (0..devices).map(cpu).collect();
    let group = ok(
        ReplicaGroup::new(Box::new(InProcess), clients, &problem.params),
        "group",
    );
    (group, problem)
}

fn flat(tensors: &[Tensor<f32>]) -> Vec<f32> {
    tensors.iter().flat_map(|t| t.data().to_vec()).collect()
}

#[test]
fn replicas_stay_bit_identical_over_200_steps_of_every_family() {
    for config in every_family() {
        let (mut group, problem) = group(2, 7);
        let before = flat(&ok(group.parameters(), "params"));
        for step in 0..200 {
            let report = ok(
                group.step(&config, |replica| work(&problem, replica, 1.0)),
                "step",
            );
            assert_eq!(report.examples, ROWS);
            assert!(report.loss.is_finite(), "step {step} of {config:?}");
        }
        let digests = ok(group.replica_digests(), "digests");
        assert_eq!(digests.len(), 2);
        assert_eq!(digests[0], digests[1], "{config:?}");
        assert_eq!(group.steps(), 200);
        assert_ne!(flat(&ok(group.parameters(), "params")), before);
    }
}

#[test]
fn amp_steps_are_skipped_by_every_replica_together() {
    let (mut group, problem) = group(2, 8);
    let config = OptimizerConfig::Sgd(SgdConfig {
        lr: 0.01,
        ..Default::default()
    });
    let mut scaler = ok(GradScaler::new(GradScalerConfig::default()), "scaler");
    let mut skipped = 0;
    for step in 1..=200 {
        // Every tenth step overflows on replica 1 only.
        let scale = scaler.scale();
        let report = ok(
            group.step_amp(&config, &mut scaler, |replica| {
                let shard = work(&problem, replica, scale)?;
                if step % 10 == 0 && replica.index() == 1 {
                    replica.store_mut().write_staged(0, &[f32::INFINITY])?;
                }
                Ok(shard)
            }),
            "amp step",
        );
        skipped += u32::from(report.skipped);
    }
    assert_eq!(skipped, 20);
    assert_eq!(group.steps(), 180);
    let digests = ok(group.replica_digests(), "digests");
    assert_eq!(digests[0], digests[1]);
}

#[test]
fn a_group_of_one_device_steps_exactly_as_a_lone_store() {
    let (mut group, problem) = group(1, 9);
    let config = every_family().remove(1);
    let client = cpu(0);
    let refs: Vec<&Tensor<f32>> = problem.params.iter().collect();
    let mut lone = ok(DeviceParamStore::new(&Tape::new(&client), &refs), "store");
    for _ in 0..20 {
        ok(
            group.step(&config, |replica| work(&problem, replica, 1.0)),
            "group step",
        );
        lone_step(&problem, &mut lone, &Tape::new(&client));
        ok(lone.step_staged(&config), "lone step");
    }
    assert_eq!(
        flat(&ok(group.parameters(), "group")),
        flat(&ok(lone.sync_to_host(), "lone"))
    );
}

/// The lone store's forward and backward over the whole batch.
fn lone_step(problem: &common::Problem, store: &mut DeviceParamStore, tape: &Tape) {
    use cistern_runtime::Activation;
    let x = ok(Tensor::new([ROWS, 4], problem.x.clone()), "x");
    let y = ok(Tensor::new([ROWS, 3], problem.y.clone()), "y");
    let leaves = ok(store.register_resident_params(tape), "register");
    let x = ok(tape.upload(&x), "upload");
    let y = ok(tape.upload(&y), "upload");
    let h = ok(
        store.linear_forward_with_activation(
            tape,
            &x,
            &leaves[0],
            Some(&leaves[1]),
            Activation::Tanh,
        ),
        "layer 1",
    );
    let pred = ok(
        store.linear_forward(tape, &h, &leaves[2], Some(&leaves[3])),
        "layer 2",
    );
    let loss = ok(tape.mse_loss(&pred, &y), "loss");
    ok(store.backward(tape, &loss), "backward");
}

#[test]
fn two_replicas_train_as_one_device_on_the_whole_batch_within_rounding() {
    let (mut group, problem) = group(2, 10);
    let config = every_family().remove(1);
    let client = cpu(0);
    let refs: Vec<&Tensor<f32>> = problem.params.iter().collect();
    let mut lone = ok(DeviceParamStore::new(&Tape::new(&client), &refs), "store");
    for _ in 0..50 {
        ok(
            group.step(&config, |replica| work(&problem, replica, 1.0)),
            "group step",
        );
        lone_step(&problem, &mut lone, &Tape::new(&client));
        ok(lone.step_staged(&config), "lone step");
    }
    let (a, b) = (
        flat(&ok(group.parameters(), "group")),
        flat(&ok(lone.sync_to_host(), "lone")),
    );
    let worst = a
        .iter()
        .zip(&b)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(worst < 1e-4, "worst difference {worst}");
}

/// The parameters after `steps` Adam steps of a group of two, cpu:1's
/// device trapping at `trap` (none: no fault); the recoveries.
fn train_with_a_trap_on_cpu_1(trap: Option<u64>, steps: usize) -> (Vec<f32>, u64, usize) {
    let faults = trap.map_or_else(FaultPlan::none, |n| {
        FaultPlan::none().with_trap_at_launch(n)
    });
    let clients = vec![cpu(0), cpu_with(1, faults)];
    let (mut group, recovered) = adam_steps(Box::new(InProcess), clients, 11, steps);
    let digests = ok(group.replica_digests(), "digests");
    assert_eq!(digests[0], digests[1]);
    let params = flat(&ok(group.parameters(), "params"));
    (params, group.recoveries(), recovered)
}

#[test]
fn a_device_fault_on_one_replica_is_recovered_in_place_and_no_step_is_lost() {
    let (clean, none, _) = train_with_a_trap_on_cpu_1(None, 30);
    assert_eq!(none, 0);
    // cpu:1 traps on its 40th launch: a few steps in, mid-backward.
    let (faulted, recoveries, recovered) = train_with_a_trap_on_cpu_1(Some(40), 30);
    assert_eq!((recoveries, recovered), (1, 1));
    assert_eq!(faulted, clean, "bit-identical to a run without the fault");
}

#[test]
fn a_device_that_cannot_recover_ends_the_group_with_no_step_applied() {
    use cistern_runtime::ProbeFault;
    let problem = problem(16);
    let faults = FaultPlan::none()
        .with_trap_at_launch(40)
        .with_probe_faults([ProbeFault::Sticky]);
    let clients = vec![cpu(0), cpu_with(1, faults)];
    let mut group = ok(
        ReplicaGroup::new(Box::new(InProcess), clients, &problem.params),
        "group",
    );
    let config = every_family().remove(1);
    let mut before = flat(&ok(group.parameters(), "params"));
    let error = loop {
        match group.step(&config, |replica| work(&problem, replica, 1.0)) {
            Ok(_) => before = flat(&ok(group.parameters(), "params")),
            Err(error) => break error,
        }
    };
    match &error {
        GroupError::Ended(why) => assert!(why.contains("could not recover"), "{why}"),
        other => panic!("{other:?}"),
    }
    let healthy = ok(group.replicas()[0].store().sync_to_host(), "healthy");
    assert_eq!(
        flat(&healthy),
        before,
        "the healthy replica kept the last step all applied"
    );
    assert!(group.is_ended());
    match group.step(&config, |replica| work(&problem, replica, 1.0)) {
        Err(GroupError::Ended(_)) => {}
        other => panic!("{other:?}"),
    }
    assert!(matches!(group.replica_digests(), Err(GroupError::Ended(_))));
}

#[test]
fn a_replica_that_fails_every_retry_ends_the_group_with_no_step_applied() {
    let (mut group, problem) = group(2, 12);
    let config = every_family().remove(0);
    let before = flat(&ok(group.parameters(), "params"));
    let tries = std::sync::atomic::AtomicUsize::new(0);
    let result = group.step(&config, |replica| {
        let shard = work(&problem, replica, 1.0)?;
        match replica.index() {
            0 => {
                tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Err(cistern_client::BackendError::TransferFailed(
                    "injected".into(),
                ))
            }
            _ => Ok(shard),
        }
    });
    assert!(
        matches!(result, Err(GroupError::Replica { replica: 0, .. })),
        "{result:?}"
    );
    // The first try and one retry after each of the allowed recoveries.
    let allowed = cistern_parallel::MAX_RECOVERIES_PER_STEP;
    assert_eq!(tries.into_inner(), 1 + allowed);
    assert_eq!(group.recoveries(), allowed as u64);
    for replica in group.replicas() {
        assert_eq!(flat(&ok(replica.store().sync_to_host(), "params")), before);
    }
    assert_eq!(group.steps(), 0);
    assert!(group.is_ended());
}

#[test]
fn an_invalid_config_is_refused_before_any_work_and_the_group_goes_on() {
    let (mut group, problem) = group(2, 13);
    let bad = OptimizerConfig::Sgd(SgdConfig {
        lr: -1.0,
        ..Default::default()
    });
    let refused = group.step(&bad, |_| panic!("no work runs"));
    assert!(
        matches!(refused, Err(GroupError::InvalidArgument(_))),
        "{refused:?}"
    );
    let config = every_family().remove(0);
    ok(
        group.step(&config, |replica| work(&problem, replica, 1.0)),
        "then a step",
    );
    assert_eq!(group.steps(), 1);
}

#[test]
fn a_group_without_devices_is_refused() {
    let problem = problem(14);
    let refused = ReplicaGroup::new(Box::new(InProcess), Vec::new(), &problem.params);
    assert!(matches!(refused, Err(GroupError::InvalidArgument(_))));
}

#[test]
fn rank_zero_s_parameters_reach_every_replica() {
    let (group, problem) = group(3, 15);
    for replica in group.replicas() {
        assert_eq!(
            flat(&ok(replica.store().sync_to_host(), "params")),
            flat(&problem.params)
        );
    }
    assert_eq!(group.count(), 3);
    assert_eq!(group.replicas()[2].index(), 2);
}

#[test]
fn a_group_restored_from_a_checkpoint_goes_on_as_the_group_it_was_taken_from() {
    let config = every_family().remove(1);
    let (mut original, problem) = group(2, 12);
    for _ in 0..5 {
        ok(
            original.step(&config, |replica| work(&problem, replica, 1.0)),
            "step",
        );
    }
    let checkpoint = ok(original.replicas()[0].store().checkpoint(), "checkpoint");
    let clients = (2..4).map(cpu).collect();
    let mut restored = ok(
        ReplicaGroup::restore(Box::new(InProcess), clients, &checkpoint),
        "restore",
    );
    assert_eq!(restored.steps(), 5);
    for _ in 0..5 {
        for group in [&mut original, &mut restored] {
            ok(
                group.step(&config, |replica| work(&problem, replica, 1.0)),
                "step",
            );
        }
    }
    let (a, b) = (
        ok(original.replica_digests(), "digests"),
        ok(restored.replica_digests(), "digests"),
    );
    assert_eq!((a[0], a[1]), (b[0], b[1]));
    assert_eq!(restored.steps(), 10);
    let mut short = checkpoint;
    short.params.pop();
    let clients = (4..6).map(cpu).collect();
    assert!(matches!(
        ReplicaGroup::restore(Box::new(InProcess), clients, &short),
        Err(GroupError::Replica { .. })
    ));
}
