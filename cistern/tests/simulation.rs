//! The deterministic simulation of DESIGN §8: seeded command streams from
//! several clients, interleaved with the device's progress and injected
//! faults by a seeded scheduler, driving `ServerCore` on one thread, with
//! every invariant checked after every step.
//!
//! `CISTERN_SIM_SEEDS=N` and `CISTERN_SIM_STEPS=N` run more seeds and
//! longer runs (from seed `CISTERN_SIM_FIRST_SEED`, 0 unless set);
//! `CISTERN_SIM_SEED=N` replays one seed (with
//! `CISTERN_SIM_SKIP=a,b,..` to leave out the steps a shrink dropped). A
//! failing seed is shrunk to the shortest failing prefix, then single
//! client actions are dropped while it still fails; the report names the
//! seed, the steps, the dropped ones and the last actions.

#[path = "simulation/invariants.rs"]
mod invariants;
#[path = "simulation/model.rs"]
mod model;
#[path = "simulation/world.rs"]
mod world;

use std::collections::BTreeSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use cistern::memory::SplitMix64;
use world::World;

/// The CI run: seeds × steps, sized to stay within about 3 minutes in a
/// debug build on a loaded 2-core machine.
const SEEDS: u64 = 200;
const STEPS: usize = 2_000;

/// How long shrinking may drop single steps before it reports.
const SHRINK_BUDGET: Duration = Duration::from_secs(120);

/// Why a seed failed, and the client actions that led there.
struct SeedFailure {
    message: String,
    recent: Vec<String>,
}

/// The generator of step `step` of `seed`: each step draws from its own, so
/// a step left out by shrinking does not shift the draws of the others.
fn step_rng(seed: u64, step: usize) -> SplitMix64 {
    let mut mix = SplitMix64::new(seed ^ (step as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    SplitMix64::new(mix.next_u64())
}

/// Runs `steps` steps of `seed`, leaving out those in `skip`, and drains.
fn run_seed(seed: u64, steps: usize, skip: &BTreeSet<usize>) -> Result<World, SeedFailure> {
    let mut world = World::new(seed).map_err(|message| SeedFailure {
        message,
        recent: Vec::new(),
    })?;
    let fail = |world: &World, message: String| SeedFailure {
        message,
        recent: world.recent.iter().cloned().collect(),
    };
    for step in 0..steps {
        if skip.contains(&step) {
            continue;
        }
        world.step = step;
        world.rng = step_rng(seed, step);
        if let Err(failure) = world.step() {
            return Err(fail(&world, format!("seed {seed}, step {step}: {failure}")));
        }
    }
    world.step = steps;
    world.rng = step_rng(seed, steps);
    if let Err(failure) = world.drain() {
        return Err(fail(&world, format!("seed {seed}, final drain: {failure}")));
    }
    Ok(world)
}

/// A seed's outcome, a panic inside the core included.
fn outcome(seed: u64, steps: usize, skip: &BTreeSet<usize>) -> Result<World, SeedFailure> {
    match catch_unwind(AssertUnwindSafe(|| run_seed(seed, steps, skip))) {
        Ok(result) => result,
        Err(payload) => {
            let message = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(SeedFailure {
                message: format!("seed {seed}: panicked: {message}"),
                recent: Vec::new(),
            })
        }
    }
}

/// The shortest failing prefix of `seed` (runs are deterministic, so a
/// binary search over the step count), then single steps dropped from it,
/// last first, while it still fails, within [`SHRINK_BUDGET`].
fn shrink(seed: u64, steps: usize, first: SeedFailure) -> String {
    let none = BTreeSet::new();
    let (mut passing, mut failing, mut failure) = (0, steps, first);
    if let Err(at_zero) = outcome(seed, 0, &none) {
        (failing, failure) = (0, at_zero);
    }
    while failing > passing + 1 {
        let middle = passing + (failing - passing) / 2;
        match outcome(seed, middle, &none) {
            Ok(_) => passing = middle,
            Err(found) => (failing, failure) = (middle, found),
        }
    }
    let mut skip = BTreeSet::new();
    let started = Instant::now();
    for step in (0..failing.saturating_sub(1)).rev() {
        if started.elapsed() > SHRINK_BUDGET {
            break;
        }
        skip.insert(step);
        match outcome(seed, failing, &skip) {
            Err(found) => failure = found,
            Ok(_) => {
                skip.remove(&step);
            }
        }
    }
    let skipped = ranges(&skip);
    format!(
        "{}\n  shrunk to {failing} steps of seed {seed}, {} of them left out; replay with \
         CISTERN_SIM_SEED={seed} CISTERN_SIM_STEPS={failing} CISTERN_SIM_SKIP={}\n  \
         its last actions:\n    {}",
        failure.message,
        skip.len(),
        skipped,
        failure.recent.join("\n    ")
    )
}

/// `steps` as `a-b` ranges: `0-3,7,9-12`.
fn ranges(steps: &BTreeSet<usize>) -> String {
    let mut parts: Vec<(usize, usize)> = Vec::new();
    for &step in steps {
        match parts.last_mut() {
            Some((_, end)) if *end + 1 == step => *end = step,
            _ => parts.push((step, step)),
        }
    }
    let text: Vec<String> = parts
        .iter()
        .map(|&(start, end)| {
            if start == end {
                start.to_string()
            } else {
                format!("{start}-{end}")
            }
        })
        .collect();
    text.join(",")
}

fn env_number(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    match text.trim().parse() {
        Ok(value) => Some(value),
        Err(_) => panic!("{name} must be a number, got {text:?}"),
    }
}

/// The seeds and step count this run uses, from the environment.
fn plan() -> (Vec<u64>, usize, BTreeSet<usize>) {
    let steps = env_number("CISTERN_SIM_STEPS").map_or(STEPS, |steps| steps as usize);
    let seeds = match env_number("CISTERN_SIM_SEED") {
        Some(seed) => vec![seed],
        None => {
            let first = env_number("CISTERN_SIM_FIRST_SEED").unwrap_or(0);
            (first..first + env_number("CISTERN_SIM_SEEDS").unwrap_or(SEEDS)).collect()
        }
    };
    let skip = std::env::var("CISTERN_SIM_SKIP")
        .map(|text| {
            text.split(',')
                .flat_map(|part| {
                    let (start, end) = part.split_once('-').unwrap_or((part, part));
                    match (start.trim().parse::<usize>(), end.trim().parse::<usize>()) {
                        (Ok(start), Ok(end)) => start..=end,
                        _ => panic!("CISTERN_SIM_SKIP takes steps and ranges, got {part:?}"),
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    (seeds, steps, skip)
}

#[test]
fn every_seeded_interleaving_keeps_every_invariant() {
    let (seeds, steps, skip) = plan();
    let started = Instant::now();
    let mut failures = Vec::new();
    let mut total = world::Coverage::default();
    let (mut recoveries, mut lost) = (0, 0);
    for (done, &seed) in seeds.iter().enumerate() {
        if done > 0 && done % 1000 == 0 {
            // Long runs report as they go, so a cut-short run still says
            // exactly what ran.
            eprintln!(
                "{done} seeds x {steps} steps in {:.1} s, {} failed: {total:?}, recoveries: {recoveries}, unrecoverable: {lost}",
                started.elapsed().as_secs_f64(),
                failures.len()
            );
        }
        match outcome(seed, steps, &skip) {
            Ok(world) => {
                total.add(&world.seen);
                recoveries += world.core.context().generation();
                lost += u64::from(world.core.context().is_unrecoverable());
            }
            Err(failure) if failures.is_empty() => failures.push(shrink(seed, steps, failure)),
            Err(failure) => failures.push(failure.message),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} seeds failed (add CISTERN_SIM_TRACE=1 to see each step):\n{}",
        failures.len(),
        seeds.len(),
        failures.join("\n")
    );
    // Every run ends active, its baseline checked, or lost, where nothing
    // can be checked: none skips the check silently.
    assert_eq!(
        total.baseline_checks + lost,
        seeds.len() as u64,
        "every run ends with its baseline checked or unrecoverable"
    );
    println!(
        "{} seeds x {steps} steps in {:.1} s: {total:?}, recoveries: {recoveries}, unrecoverable: {lost} (the baseline checked on each of the other {})",
        seeds.len(),
        started.elapsed().as_secs_f64(),
        total.baseline_checks
    );
    if seeds.len() as u64 >= SEEDS && steps >= STEPS {
        // Without these the invariants could hold vacuously.
        assert!(total.reads_verified > 10_000, "{total:?}");
        assert!(total.gate_refusals > 500, "{total:?}");
        assert!(total.stale_refusals > 100, "{total:?}");
        assert!(total.device_failures > 100, "{total:?}");
        assert!(total.injected > 50, "{total:?}");
        assert!(total.compacted > 0, "{total:?}");
        assert!(
            total.batches > 1000 && total.batches_refused > 10,
            "{total:?}"
        );
        assert!(total.events > 100 && total.streams > 100, "{total:?}");
        assert!(total.graphs > 100 && total.replays > 100, "{total:?}");
        assert!(total.stale_graph_refusals > 0, "{total:?}");
        assert!(total.lost_refusals > 100, "{total:?}");
        assert!(total.predicted_recoveries > 10, "{total:?}");
        assert!(total.baseline_checks > seeds.len() as u64 / 2, "{total:?}");
        assert!(
            recoveries >= 100 && lost >= 5,
            "{recoveries} recoveries, {lost} lost"
        );
    }
}

#[test]
fn the_same_seed_replays_the_same_run_byte_for_byte() {
    let none = BTreeSet::new();
    let run = |seed| {
        outcome(seed, STEPS, &none)
            .map(|world| {
                (
                    world.trace_hash,
                    world.seen,
                    world.core.stats(),
                    world.core.context().clone(),
                )
            })
            .map_err(|failure| failure.message)
    };
    let mut hashes = BTreeSet::new();
    for seed in [3, 17, 40] {
        let first = run(seed);
        assert_eq!(first, run(seed), "seed {seed}");
        if let Ok((hash, ..)) = first {
            hashes.insert(hash);
        }
    }
    // The hash covers the run: different seeds give different traces.
    assert_eq!(hashes.len(), 3);
}
