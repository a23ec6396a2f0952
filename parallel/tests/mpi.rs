//! Replica groups over MPI, one process per rank: each test launches this
//! test binary under `mpirun` (2 or 3 ranks) and runs its rank body there.

#![cfg(feature = "mpi")]

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cistern_client::Tensor;
use cistern_optim::{GradScaler, GradScalerConfig, OptimizerConfig, SgdConfig};
use cistern_parallel::mpi::{Mpi, PEER_LOST_EXIT_STATUS};
use cistern_parallel::{Collective, CollectiveError, GroupError, InProcess, ReplicaGroup};
use cistern_runtime::FaultPlan;

use common::{adam_steps, cpu, cpu_with, every_family, ok, problem, work};

/// The longest a launch may take before the test calls it a hang.
const LAUNCH_LIMIT: Duration = Duration::from_secs(180);

/// Whether this process is a rank that `launch` started.
fn is_rank() -> bool {
    std::env::var_os("CISTERN_TEST_RANK").is_some()
}

/// What a launch printed and how it ended.
struct Launched {
    status: Option<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
}

/// Runs the test `name` of this binary as `ranks` MPI ranks.
fn launch(name: &str, ranks: usize) -> Launched {
    let exe = ok(std::env::current_exe(), "this test binary");
    let started = Instant::now();
    let mut child = ok(
        Command::new("mpirun")
            .args(["--allow-run-as-root", "--oversubscribe"])
            .args(["--mca", "btl_vader_single_copy_mechanism", "none"])
            .args(["-np", &ranks.to_string()])
            .arg(exe)
            .args([name, "--exact", "--nocapture", "--test-threads=1"])
            .env("CISTERN_TEST_RANK", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn(),
        "mpirun (install openmpi-bin)",
    );
    let status = loop {
        if let Some(status) = ok(child.try_wait(), "wait") {
            break status.code();
        }
        if started.elapsed() > LAUNCH_LIMIT {
            let _ = child.kill();
            panic!("{name} under mpirun ran past {LAUNCH_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (mut stdout, mut stderr) = (String::new(), String::new());
    if let Some(mut out) = child.stdout.take() {
        let _ = out.read_to_string(&mut stdout);
    }
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut stderr);
    }
    Launched {
        status,
        stdout,
        stderr,
        took: started.elapsed(),
    }
}

fn succeeded(name: &str, ranks: usize) -> Launched {
    let launched = launch(name, ranks);
    assert_eq!(
        launched.status,
        Some(0),
        "{name} on {ranks} ranks\nstdout:\n{}\nstderr:\n{}",
        launched.stdout,
        launched.stderr
    );
    launched
}

/// What the ranks printed after `tag`, a line each (the test harness may
/// print its own words before it on the line).
fn tagged(stdout: &str, tag: &str) -> Vec<String> {
    stdout
        .lines()
        .filter_map(|line| line.find(tag).map(|at| line[at + tag.len()..].to_string()))
        .collect()
}

/// One MPI rank's group over cpu:0 (one thread) with `params`.
fn rank_group(engine: Box<dyn Collective>, params: &[Tensor<f32>]) -> ReplicaGroup {
    ok(ReplicaGroup::new(engine, vec![cpu(0)], params), "group")
}

/// Every family for `steps` steps on a fresh group; the digests, all equal.
fn every_family_digests(
    mut engine: Box<dyn Collective>,
    devices: impl Fn() -> Vec<cistern_client::ComputeClient>,
    steps: usize,
) -> Vec<u64> {
    let problem = problem(21);
    let mut digests = Vec::new();
    for config in every_family() {
        let mut group = ok(
            ReplicaGroup::new(engine, devices(), &problem.params),
            "group",
        );
        for _ in 0..steps {
            ok(
                group.step(&config, |replica| work(&problem, replica, 1.0)),
                "step",
            );
        }
        let all = ok(group.replica_digests(), "digests");
        assert!(all.iter().all(|&d| d == all[0]), "{config:?}: {all:?}");
        digests.push(all[0]);
        engine = group.into_engine();
    }
    digests
}

#[test]
fn two_ranks_stay_bit_identical_over_200_steps_of_every_family_as_in_process() {
    if is_rank() {
        let engine = Box::new(ok(Mpi::init(), "mpi"));
        let rank = engine.rank();
        let digests = every_family_digests(engine, || vec![cpu(0)], 200);
        if rank == 0 {
            println!("DIGESTS {digests:?}");
        }
        return;
    }
    let launched = succeeded(
        "two_ranks_stay_bit_identical_over_200_steps_of_every_family_as_in_process",
        2,
    );
    let in_process = every_family_digests(Box::new(InProcess), || vec![cpu(0), cpu(1)], 200);
    assert_eq!(
        tagged(&launched.stdout, "DIGESTS "),
        vec![format!("{in_process:?}")]
    );
}

#[test]
fn three_ranks_stay_bit_identical_over_every_family() {
    if is_rank() {
        let engine = Box::new(ok(Mpi::init(), "mpi"));
        assert_eq!(engine.size(), 3);
        let digests = every_family_digests(engine, || vec![cpu(0)], 50);
        println!("DIGESTS {digests:?}");
        return;
    }
    let launched = succeeded("three_ranks_stay_bit_identical_over_every_family", 3);
    let lines = tagged(&launched.stdout, "DIGESTS ");
    assert_eq!(lines.len(), 3, "{}", launched.stdout);
    assert!(lines.iter().all(|line| *line == lines[0]), "{lines:?}");
}

#[test]
fn amp_skips_on_one_rank_are_skipped_by_every_rank() {
    if is_rank() {
        let mut engine = ok(Mpi::init(), "mpi");
        let rank = engine.rank();
        engine.barrier();
        let problem = problem(22);
        let mut group = rank_group(Box::new(engine), &problem.params);
        let config = OptimizerConfig::Sgd(SgdConfig {
            lr: 0.01,
            ..Default::default()
        });
        let mut scaler = ok(GradScaler::new(GradScalerConfig::default()), "scaler");
        let mut skipped = 0;
        for step in 1..=200 {
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
        assert_eq!(skipped, 20, "rank {rank}");
        assert_eq!(group.steps(), 180);
        let digests = ok(group.replica_digests(), "digests");
        assert_eq!(digests[0], digests[1]);
        println!("SKIPPED rank {rank}: {skipped}");
        return;
    }
    let launched = succeeded("amp_skips_on_one_rank_are_skipped_by_every_rank", 2);
    assert_eq!(tagged(&launched.stdout, "SKIPPED ").len(), 2);
}

#[test]
fn a_layout_that_differs_on_a_rank_is_refused_on_every_rank_naming_it() {
    if is_rank() {
        let engine = ok(Mpi::init(), "mpi");
        let rank = engine.rank();
        let mut params = problem(23).params;
        if rank == 1 {
            params[3] = ok(Tensor::new([4], vec![0.0; 4]), "a wider bias");
        }
        match ReplicaGroup::new(Box::new(engine), vec![cpu(0)], &params) {
            Err(GroupError::InvalidArgument(why)) => {
                assert!(why.contains("rank 1"), "{why}");
                println!("REFUSED on rank {rank}: {why}");
            }
            other => panic!("rank {rank}: {other:?}"),
        }
        return;
    }
    let launched = succeeded(
        "a_layout_that_differs_on_a_rank_is_refused_on_every_rank_naming_it",
        2,
    );
    assert_eq!(tagged(&launched.stdout, "REFUSED ").len(), 2);
}

/// 30 Adam steps of a group over `clients` and `engine`; its digests and
/// recoveries.
fn thirty_steps(
    engine: Box<dyn Collective>,
    clients: Vec<cistern_client::ComputeClient>,
) -> (Vec<u64>, u64) {
    let (mut group, _) = adam_steps(engine, clients, 24, 30);
    (ok(group.replica_digests(), "digests"), group.recoveries())
}

#[test]
fn a_device_fault_on_one_rank_is_recovered_in_place_from_a_peer_and_no_step_is_lost() {
    if is_rank() {
        let engine = ok(Mpi::init(), "mpi");
        let rank = engine.rank();
        let faults = match rank {
            1 => FaultPlan::none().with_trap_at_launch(40),
            _ => FaultPlan::none(),
        };
        let (digests, recoveries) = thirty_steps(Box::new(engine), vec![cpu_with(0, faults)]);
        assert_eq!(digests[0], digests[1]);
        println!("RECOVERED rank {rank}: {recoveries} {}", digests[0]);
        return;
    }
    let launched = succeeded(
        "a_device_fault_on_one_rank_is_recovered_in_place_from_a_peer_and_no_step_is_lost",
        2,
    );
    let (clean, _) = thirty_steps(Box::new(InProcess), vec![cpu(0), cpu(1)]);
    let lines = tagged(&launched.stdout, "RECOVERED ");
    assert_eq!(lines.len(), 2, "{}", launched.stdout);
    for line in lines {
        // One recovery, and the parameters of a run that never faulted.
        assert!(line.ends_with(&format!(": 1 {}", clean[0])), "{line}");
    }
}

#[test]
fn a_device_that_cannot_recover_ends_the_group_on_every_rank_with_no_step_applied() {
    if is_rank() {
        use cistern_runtime::ProbeFault;
        let engine = ok(Mpi::init(), "mpi");
        let rank = engine.rank();
        let faults = match rank {
            1 => FaultPlan::none()
                .with_trap_at_launch(40)
                .with_probe_faults([ProbeFault::Sticky]),
            _ => FaultPlan::none(),
        };
        let problem = problem(24);
        let mut group = ok(
            ReplicaGroup::new(Box::new(engine), vec![cpu_with(0, faults)], &problem.params),
            "group",
        );
        let config = every_family().remove(1);
        let mut before = ok(group.parameters(), "params");
        let error = loop {
            match group.step(&config, |replica| work(&problem, replica, 1.0)) {
                Ok(_) => before = ok(group.parameters(), "params"),
                Err(error) => break error,
            }
        };
        match &error {
            GroupError::Ended(why) => assert!(why.contains("[1] could not recover"), "{why}"),
            other => panic!("rank {rank}: {other:?}"),
        }
        if rank == 0 {
            let kept = ok(group.replicas()[0].store().sync_to_host(), "kept");
            assert_eq!(kept, before, "rank 0 kept the last step all applied");
        }
        assert!(matches!(
            group.step(&config, |_| panic!("no work after the end")),
            Err(GroupError::Ended(_))
        ));
        println!("ENDED rank {rank} after {} steps: {error}", group.steps());
        return;
    }
    let launched = succeeded(
        "a_device_that_cannot_recover_ends_the_group_on_every_rank_with_no_step_applied",
        2,
    );
    let lines = tagged(&launched.stdout, "ENDED ");
    assert_eq!(lines.len(), 2, "{}", launched.stdout);
    let steps: Vec<&str> = lines
        .iter()
        .map(|line| line.split(" steps").next().unwrap_or(""))
        .map(|head| head.rsplit(' ').next().unwrap_or(""))
        .collect();
    assert_eq!(
        steps[0], steps[1],
        "both ranks applied the same steps: {lines:?}"
    );
}

/// A rank body that trains until `rank 1` misbehaves by `misbehave`.
fn train_until_rank_one(misbehave: fn()) {
    let engine = ok(Mpi::with_timeout(Duration::from_secs(2)), "mpi");
    let rank = engine.rank();
    let problem = problem(25);
    let mut group = rank_group(Box::new(engine), &problem.params);
    let config = every_family().remove(0);
    for step in 0..1_000 {
        if rank == 1 && step == 5 {
            misbehave();
        }
        ok(
            group.step(&config, |replica| work(&problem, replica, 1.0)),
            "step",
        );
    }
    panic!("rank {rank} trained past its peer's end");
}

#[test]
fn a_hung_rank_ends_every_other_rank_with_peer_lost_within_the_timeout() {
    if is_rank() {
        train_until_rank_one(|| std::thread::sleep(Duration::from_secs(60)));
        return;
    }
    let launched = launch(
        "a_hung_rank_ends_every_other_rank_with_peer_lost_within_the_timeout",
        2,
    );
    // mpirun ends with the status of the first rank to fail: the watchdog's.
    assert_eq!(
        launched.status,
        Some(PEER_LOST_EXIT_STATUS),
        "{}",
        launched.stderr
    );
    assert!(
        launched.stderr.contains("PeerLost (1020)") || launched.stdout.contains("PeerLost (1020)"),
        "stderr:\n{}",
        launched.stderr
    );
    assert!(
        launched.took < Duration::from_secs(40),
        "took {:?}",
        launched.took
    );
}

#[test]
fn a_rank_that_dies_ends_every_other_rank_instead_of_hanging() {
    if is_rank() {
        train_until_rank_one(|| std::process::exit(3));
        return;
    }
    let launched = launch(
        "a_rank_that_dies_ends_every_other_rank_instead_of_hanging",
        2,
    );
    assert_ne!(launched.status, Some(0), "{}", launched.stderr);
    assert!(
        launched.took < Duration::from_secs(40),
        "took {:?}",
        launched.took
    );
}

#[test]
fn outside_mpirun_the_engine_names_the_launcher() {
    if is_rank() {
        return;
    }
    match Mpi::init() {
        Err(CollectiveError::NotLaunched(why)) => assert!(why.contains("mpirun -np"), "{why}"),
        other => panic!("{other:?}"),
    }
}
