//! A seeded simulation of replica groups under faults: per seed, a group
//! of 2 to 4 CPU replicas in one process, one optimizer family, and a
//! fault plan on one or more replicas (a trap at a seeded launch, a failed
//! transfer, a seeded trap rate), trained until the group ends or the steps
//! run out.
//!
//! The invariant, checked after every step: the replicas are identical, or
//! every one refuses. A failed replica is recovered in place and the step
//! retried: every completed step counts once (no step lost) and every
//! replica's parameters are bit-identical to the others'. Where recovery
//! is impossible (a trap rate that strikes again, a device that stays
//! down) the group ends: no healthy replica applied the failed step unless
//! it failed inside a step kernel, the healthy replicas are identical, and
//! every later call is refused.
//!
//! `CISTERN_GROUP_SIM_SEEDS=N` runs more seeds; `CISTERN_GROUP_SIM_SEED=N`
//! replays one.

mod common;

use cistern_client::Tensor;
use cistern_memory::SplitMix64;
use cistern_parallel::{GroupError, InProcess, ReplicaGroup};
use cistern_runtime::FaultPlan;

use common::{cpu_with, every_family, ok, problem, work};

const SEEDS: u64 = 24;
const STEPS: usize = 30;

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn flat(tensors: &[Tensor<f32>]) -> Vec<f32> {
    tensors.iter().flat_map(|t| t.data().to_vec()).collect()
}

/// A seeded fault plan, or none (about half the replicas are healthy).
fn faults(rng: &mut SplitMix64) -> FaultPlan {
    match rng.next_u64() % 6 {
        0 => FaultPlan::none().with_trap_at_launch(1 + rng.next_u64() % 400),
        1 => FaultPlan::none().with_failed_transfer(1 + rng.next_u64() % 200),
        2 => FaultPlan::none().with_trap_rate(rng.next_u64(), 0.002),
        _ => FaultPlan::none(),
    }
}

/// One seed's run; what it saw, for the report.
fn simulate(seed: u64) -> String {
    let mut rng = SplitMix64::new(seed);
    let replicas = 2 + (rng.next_u64() % 3) as usize;
    let plans: Vec<FaultPlan> = (0..replicas).map(|_| faults(&mut rng)).collect();
    let families = every_family();
    let config = families[(rng.next_u64() as usize) % families.len()].clone();
    let problem = problem(seed);
    let clients = plans
        .iter()
        .enumerate()
        .map(|(n, plan)| cpu_with(n, plan.clone()))
        .collect();
    let mut group = match ReplicaGroup::new(Box::new(InProcess), clients, &problem.params) {
        Ok(group) => group,
        // A fault may already strike the stores' upload: nothing was built.
        Err(error) => return format!("seed {seed}: refused at creation: {error}"),
    };
    let mut applied = flat(&problem.params);
    let (mut completed, mut recovered) = (0u64, 0usize);
    for step in 0..STEPS {
        // A fault the step's kernels met after the step was queued shows at
        // the digests' read (the group ends there, the step applied by the
        // healthy replicas alike); one met before shows at the step, which
        // no replica then applied.
        let outcome = group
            .step(&config, |replica| work(&problem, replica, 1.0))
            .map(|report| {
                completed += 1;
                recovered += report.recovered;
            });
        let (error, before) = match outcome {
            Ok(()) => match group.replica_digests() {
                Ok(digests) => {
                    assert!(
                        digests.iter().all(|&d| d == digests[0]),
                        "seed {seed} step {step}: replicas differ: {digests:?}"
                    );
                    applied = flat(&ok(group.parameters(), "parameters"));
                    assert_eq!(group.steps(), completed, "seed {seed}: a step was lost");
                    continue;
                }
                Err(error) => (error, None),
            },
            Err(error) => (error, Some(&applied)),
        };
        // A fault inside a step kernel that the step waits for (LAMB's,
        // AMP's flag) comes after the healthy replicas applied it: they are
        // a step ahead of the group's count, and identical.
        let held: Vec<(u64, Vec<f32>)> = group
            .replicas()
            .iter()
            .filter_map(|replica| {
                let values = replica.store().sync_to_host().ok()?;
                Some((replica.store().steps(), flat(&values)))
            })
            .collect();
        for (steps, values) in &held {
            assert_eq!(
                values, &held[0].1,
                "seed {seed} step {step}: healthy replicas differ"
            );
            if let (Some(before), true) = (before, *steps == group.steps()) {
                assert_eq!(values, before, "seed {seed} step {step}: {error}");
            }
        }
        let again = group.step(&config, |_| panic!("no work after the end"));
        assert!(
            matches!(again, Err(GroupError::Ended(_))),
            "seed {seed}: {again:?}"
        );
        assert!(matches!(group.replica_digests(), Err(GroupError::Ended(_))));
        return format!("seed {seed}: {replicas} replicas ended at step {step}: {error}");
    }
    format!("seed {seed}: {replicas} replicas ran {STEPS} steps, {recovered} recovered")
}

#[test]
fn replicas_stay_identical_or_every_replica_refuses_under_seeded_faults() {
    let seeds: Vec<u64> = match env_number("CISTERN_GROUP_SIM_SEED") {
        Some(seed) => vec![seed],
        None => (0..env_number("CISTERN_GROUP_SIM_SEEDS").unwrap_or(SEEDS)).collect(),
    };
    let outcomes: Vec<String> = seeds.into_iter().map(simulate).collect();
    let ended = outcomes.iter().filter(|o| o.contains("ended")).count();
    let ran = outcomes.iter().filter(|o| o.contains("ran")).count();
    let recovered = outcomes
        .iter()
        .filter(|o| o.contains("ran") && !o.ends_with(" 0 recovered"))
        .count();
    // The seeds cover every side of the invariant.
    assert!(ended > 0 && ran > 0 && recovered > 0, "{outcomes:#?}");
}
