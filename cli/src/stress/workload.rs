//! The stress workload: a deterministic sequence of operations per
//! (seed, client), with reservation sizes drawn like the allocation traces
//! of `shared/traces/gen_trace.py`.
//!
//! Operations name buffers by [`Pick`]s and byte ranges by fractions
//! ([`Span`]), resolved against whatever the client holds when it runs
//! them, so the sequence does not depend on how the device answered: the
//! CLI's threads and a deterministic simulation over `ServerCore` can drive
//! the same mix.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::capture_plan::CapturePlan;
use cistern_memory::SplitMix64;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// Where reservation sizes come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Sizes {
    /// `gen_trace.py training`: layer weights and biases of 4–8 layers
    /// (widths 256–4096 floats), two optimizer moments each, then per step
    /// activations (batch 32–256, 1024 every 50th), 0–6 scratch buffers of
    /// 1–64 KiB, gradients, and activation gradients.
    Training,
    /// `gen_trace.py churn`: log-uniform from 256 B to 64 MiB.
    Churn,
    /// `gen_trace.py growth`: rounds of 2–8 workspaces of 0.5–1.5× a size
    /// that grows 7% a round from 4 KiB to 256 MiB and starts over, and now
    /// and then a buffer of the size itself.
    Growth,
    /// Log-uniform between `min` and `max` bytes.
    LogUniform {
        /// Smallest size.
        min: u64,
        /// Largest size.
        max: u64,
    },
}

impl Sizes {
    /// The largest size this source can draw before capping and rounding.
    #[cfg(test)]
    pub fn natural_max(self) -> u64 {
        match self {
            // The widest weight: 4096 × 4096 floats.
            Sizes::Training => 4096 * 4096 * 4,
            Sizes::Churn => 64 * MIB,
            // The last size under 256 MiB, grown once more, times 1.5.
            Sizes::Growth => (256.0 * 1.07 * 1.5 * MIB as f64) as u64,
            Sizes::LogUniform { max, .. } => max,
        }
    }
}

/// Relative weights of the operations in a workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mix {
    /// Reserve a buffer.
    pub reserve: u32,
    /// Write a pattern from the host.
    pub write: u32,
    /// Launch a fill kernel.
    pub fill: u32,
    /// Copy between buffers (kernels and the copy command).
    pub copy: u32,
    /// Read back and verify.
    pub read: u32,
    /// Free a buffer.
    pub free: u32,
    /// Capture a short graph on the client's stream and replay it.
    pub capture: u32,
    /// Take a training step of the client's `DeviceParamStore` and check it
    /// against the reference (0 by default: `--store-weight`).
    pub store: u32,
}

impl Default for Mix {
    /// Slightly more reservations than frees, so the live set grows until
    /// the memory limit pushes back: exhaustion is what this load is for.
    fn default() -> Self {
        Mix {
            reserve: 20,
            write: 18,
            fill: 10,
            copy: 12,
            read: 25,
            free: 15,
            capture: 2,
            store: 0,
        }
    }
}

/// Everything that shapes a workload besides its seed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadConfig {
    /// Where sizes come from.
    pub sizes: Sizes,
    /// Sizes above this are capped to it.
    pub max_size: Option<u64>,
    /// The operation weights.
    pub mix: Mix,
    /// The most bytes one client holds: before a reservation that would
    /// pass it, the client frees buffers at random (as `gen_trace.py churn`
    /// bounds its live set). `None` grows until the memory limit pushes back.
    pub client_budget: Option<u64>,
}

/// Names one of the buffers a client holds when the operation runs:
/// `pick % held`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pick(pub u64);

impl Pick {
    /// The index this pick names among `held` buffers; `None` if none is held.
    pub fn index(self, held: usize) -> Option<usize> {
        (held > 0).then(|| (self.0 % held as u64) as usize)
    }
}

/// A byte range as fractions of a buffer (in 1/2³² steps), resolved when
/// the buffer's size is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span {
    /// Where the range starts, as a fraction of the room left after it.
    pub start: u32,
    /// Its length, as a fraction of the buffer.
    pub len: u32,
}

impl Span {
    /// The whole buffer.
    pub const WHOLE: Span = Span {
        start: 0,
        len: u32::MAX,
    };

    /// `(offset, len)` in a buffer of `size` bytes, both multiples of
    /// `align`, `len` at least `align` (`size` must be a positive multiple of `align`).
    pub fn resolve(self, size: u64, align: u64) -> (u64, u64) {
        debug_assert!(align > 0 && size >= align && size % align == 0);
        let units = size / align;
        let len = scale(units, self.len).clamp(1, units) * align;
        (place(size, len, self.start, align), len)
    }

    pub(crate) fn draw(rng: &mut SplitMix64) -> Span {
        if rng.chance(0.5) {
            Span::WHOLE
        } else {
            Span {
                start: rng.next_u64() as u32,
                len: rng.next_u64() as u32,
            }
        }
    }
}

/// The offset of a `len`-byte range in a `size`-byte buffer, `start` of
/// the way into the room left, a multiple of `align` (`len <= size`).
pub fn place(size: u64, len: u64, start: u32, align: u64) -> u64 {
    debug_assert!(len <= size && align > 0);
    scale((size - len) / align, start) * align
}

/// `units × fraction / (2³² − 1)`, rounded up so a full fraction is all units.
fn scale(units: u64, fraction: u32) -> u64 {
    let product = u128::from(units) * u128::from(fraction);
    product.div_ceil(u128::from(u32::MAX)) as u64
}

/// How a copy is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CopyVia {
    /// The `Copy` kernel (bytes).
    CopyKernel,
    /// The `Identity` kernel (`f32`s, so 4-byte aligned).
    IdentityKernel,
    /// The server's copy command.
    Command,
}

/// One operation of a client's workload.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Op {
    /// Reserve `size` bytes (a positive multiple of 4).
    Reserve { size: u64 },
    /// Write a fresh pattern over `span` of `target`.
    Write { target: Pick, span: Span },
    /// Fill `span` of `target` with a fresh `f32` value by a kernel.
    Fill {
        target: Pick,
        /// The bytes filled (4-byte aligned).
        span: Span,
    },
    /// Copy `len` of the smaller buffer's size from `source` to `target`.
    Copy {
        source: Pick,
        target: Pick,
        /// How many bytes, as a fraction of the smaller buffer.
        len: u32,
        /// Where in the source, as a fraction of the room left.
        source_start: u32,
        /// Where in the target, as a fraction of the room left.
        target_start: u32,
        /// Which path copies.
        via: CopyVia,
    },
    /// Read `span` of `target` and verify it.
    Read { target: Pick, span: Span },
    /// Drop the client's handle of `target`.
    Free { target: Pick },
    /// Capture a graph on the client's stream, replay it, and verify.
    Capture {
        /// What the graph records and how often it is replayed.
        plan: CapturePlan,
    },
    /// One training step of the client's parameter store, its gradients
    /// (and whether an AMP step gets a non-finite one) drawn from `seed`.
    StoreStep { seed: u64 },
}

/// A client's workload: an endless, deterministic sequence of [`Op`]s.
#[derive(Clone, Debug)]
pub struct Workload {
    rng: SplitMix64,
    sizes: SizeSampler,
    config: WorkloadConfig,
    total_weight: u64,
}

impl Workload {
    /// The workload of client `client` under `seed`: the same arguments give
    /// the same sequence.
    pub fn new(seed: u64, client: u64, config: WorkloadConfig) -> Self {
        let mut rng = SplitMix64::derived(seed, client);
        let sizes = SizeSampler::new(config.sizes, &mut rng);
        let mix = config.mix;
        let total_weight = [
            mix.reserve,
            mix.write,
            mix.fill,
            mix.copy,
            mix.read,
            mix.free,
            mix.capture,
            mix.store,
        ]
        .iter()
        .map(|&w| u64::from(w))
        .sum();
        Workload {
            rng,
            sizes,
            config,
            total_weight,
        }
    }

    /// The next reservation size alone (for a caller that needs only sizes).
    pub fn next_size(&mut self) -> u64 {
        let size = self.sizes.next(&mut self.rng);
        let capped = self.config.max_size.map_or(size, |max| size.min(max));
        capped.max(4).next_multiple_of(4)
    }

    fn next_op(&mut self) -> Op {
        let mix = self.config.mix;
        if self.total_weight == 0 {
            return Op::Reserve {
                size: self.next_size(),
            };
        }
        let mut roll = self.rng.below(self.total_weight);
        let mut take = |weight: u32| {
            let hit = roll < u64::from(weight);
            roll = roll.saturating_sub(u64::from(weight));
            hit
        };
        let pick = |rng: &mut SplitMix64| Pick(rng.next_u64());
        if take(mix.reserve) {
            Op::Reserve {
                size: self.next_size(),
            }
        } else if take(mix.write) {
            Op::Write {
                target: pick(&mut self.rng),
                span: Span::draw(&mut self.rng),
            }
        } else if take(mix.fill) {
            Op::Fill {
                target: pick(&mut self.rng),
                span: Span::draw(&mut self.rng),
            }
        } else if take(mix.copy) {
            let rng = &mut self.rng;
            Op::Copy {
                source: pick(rng),
                target: pick(rng),
                len: if rng.chance(0.5) {
                    u32::MAX
                } else {
                    rng.next_u64() as u32
                },
                source_start: rng.next_u64() as u32,
                target_start: rng.next_u64() as u32,
                via: rng.choose(&[
                    CopyVia::CopyKernel,
                    CopyVia::IdentityKernel,
                    CopyVia::Command,
                ]),
            }
        } else if take(mix.read) {
            Op::Read {
                target: pick(&mut self.rng),
                span: Span::draw(&mut self.rng),
            }
        } else if take(mix.free) {
            Op::Free {
                target: pick(&mut self.rng),
            }
        } else if take(mix.store) {
            Op::StoreStep {
                seed: self.rng.next_u64(),
            }
        } else {
            // Small, so that a capture reservation usually fits the pages
            // already held and sometimes does not.
            let cap = self.config.max_size.unwrap_or(u64::MAX).max(4);
            let size = log_uniform(&mut self.rng, 256, 256 * KIB).min(cap);
            Op::Capture {
                plan: CapturePlan::draw(&mut self.rng, size),
            }
        }
    }
}

impl Iterator for Workload {
    type Item = Op;

    fn next(&mut self) -> Option<Op> {
        Some(self.next_op())
    }
}

/// Draws sizes the way one `gen_trace.py` workload reserves them, in order.
#[derive(Clone, Debug)]
struct SizeSampler {
    kind: Sizes,
    queue: VecDeque<u64>,
    training: Option<TrainingModel>,
    growth: f64,
}

/// The model `training` draws once: its layer widths and parameter sizes.
#[derive(Clone, Debug)]
struct TrainingModel {
    widths: Vec<u64>,
    params: Vec<u64>,
    step: u64,
}

impl SizeSampler {
    fn new(kind: Sizes, rng: &mut SplitMix64) -> Self {
        let mut sampler = SizeSampler {
            kind,
            queue: VecDeque::new(),
            training: None,
            growth: (4 * KIB) as f64,
        };
        if kind == Sizes::Training {
            let layers = rng.range_inclusive(4, 8);
            let widths: Vec<u64> = (0..layers)
                .map(|_| rng.choose(&[256, 512, 768, 1024, 2048, 4096]))
                .collect();
            let params: Vec<u64> = widths
                .windows(2)
                .flat_map(|pair| [pair[0] * pair[1] * 4, pair[1] * 4])
                .collect();
            // Parameters, then two optimizer moments of each.
            sampler.queue.extend(params.iter().copied());
            sampler
                .queue
                .extend(params.iter().flat_map(|&size| [size, size]));
            sampler.training = Some(TrainingModel {
                widths,
                params,
                step: 0,
            });
        }
        sampler
    }

    fn next(&mut self, rng: &mut SplitMix64) -> u64 {
        loop {
            if let Some(size) = self.queue.pop_front() {
                return size;
            }
            match self.kind {
                Sizes::Training => self.training_step(rng),
                Sizes::Churn => return log_uniform(rng, 256, 64 * MIB),
                Sizes::Growth => self.growth_round(rng),
                Sizes::LogUniform { min, max } => return log_uniform(rng, min, max),
            }
        }
    }

    fn training_step(&mut self, rng: &mut SplitMix64) {
        let Some(model) = self.training.as_mut() else {
            debug_assert!(false, "a training sampler has its model");
            return;
        };
        let batch = if model.step % 50 == 0 {
            1024
        } else {
            rng.choose(&[32, 64, 128, 256])
        };
        let activations: Vec<u64> = model.widths.iter().map(|w| batch * w * 4).collect();
        self.queue.extend(activations.iter().copied());
        for _ in 0..rng.range_inclusive(0, 6) {
            self.queue.push_back(rng.range_inclusive(1, 64) * KIB);
        }
        self.queue.extend(model.params.iter().copied());
        // Activation gradients, in reverse.
        self.queue.extend(activations.iter().rev().copied());
        model.step += 1;
    }

    fn growth_round(&mut self, rng: &mut SplitMix64) {
        for _ in 0..rng.range_inclusive(2, 8) {
            self.queue
                .push_back((self.growth * rng.uniform(0.5, 1.5)) as u64);
        }
        if rng.chance(0.3) {
            self.queue.push_back(self.growth as u64);
        }
        self.growth = if self.growth < (256 * MIB) as f64 {
            self.growth * 1.07
        } else {
            (4 * KIB) as f64
        };
    }
}

fn log_uniform(rng: &mut SplitMix64, min: u64, max: u64) -> u64 {
    let (low, high) = ((min.max(1)) as f64, (max.max(min).max(1)) as f64);
    let size = (rng.uniform(low.ln(), high.ln())).exp() as u64;
    size.clamp(min, max.max(min))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(sizes: Sizes) -> WorkloadConfig {
        WorkloadConfig {
            sizes,
            max_size: None,
            mix: Mix::default(),
            client_budget: None,
        }
    }

    const KINDS: [Sizes; 4] = [
        Sizes::Training,
        Sizes::Churn,
        Sizes::Growth,
        Sizes::LogUniform {
            min: 100,
            max: 5000,
        },
    ];

    #[test]
    fn a_workload_is_the_same_for_the_same_seed_and_client() {
        for kind in KINDS {
            let a: Vec<Op> = Workload::new(42, 3, config(kind)).take(2000).collect();
            let b: Vec<Op> = Workload::new(42, 3, config(kind)).take(2000).collect();
            assert_eq!(a, b);
        }
    }

    #[test]
    fn clients_and_seeds_get_different_workloads() {
        let base: Vec<Op> = Workload::new(42, 0, config(Sizes::Churn))
            .take(200)
            .collect();
        let other_client: Vec<Op> = Workload::new(42, 1, config(Sizes::Churn))
            .take(200)
            .collect();
        let other_seed: Vec<Op> = Workload::new(43, 0, config(Sizes::Churn))
            .take(200)
            .collect();
        assert_ne!(base, other_client);
        assert_ne!(base, other_seed);
    }

    #[test]
    fn sizes_are_positive_multiples_of_four_within_each_distribution() {
        for kind in KINDS {
            let mut workload = Workload::new(9, 0, config(kind));
            let max = kind.natural_max().next_multiple_of(4);
            for _ in 0..5000 {
                let size = workload.next_size();
                assert!(size >= 4 && size % 4 == 0, "{kind:?}: {size}");
                assert!(size <= max, "{kind:?}: {size} > {max}");
            }
        }
    }

    #[test]
    fn log_uniform_sizes_cover_their_range_evenly_in_log_space() {
        let mut workload = Workload::new(1, 0, config(Sizes::Churn));
        let sizes: Vec<u64> = (0..20_000).map(|_| workload.next_size()).collect();
        assert!(sizes.iter().all(|&s| (256..=64 * MIB).contains(&s)));
        // 2^8 .. 2^26: each of the 18 octaves holds about 1/18 of the draws.
        let below_64k = sizes.iter().filter(|&&s| s < 64 * KIB).count() as f64;
        let fraction = below_64k / sizes.len() as f64;
        assert!((fraction - 8.0 / 18.0).abs() < 0.03, "{fraction}");
    }

    #[test]
    fn training_sizes_start_with_parameters_and_their_two_moments() {
        let mut workload = Workload::new(5, 0, config(Sizes::Training));
        let first: Vec<u64> = (0..64).map(|_| workload.next_size()).collect();
        let widths = [256u64, 512, 768, 1024, 2048, 4096];
        let is_weight = |size: u64| {
            widths
                .iter()
                .any(|a| widths.iter().any(|b| a * b * 4 == size))
        };
        // Some layer count (4–8) gives `params` sizes, then each twice.
        let fits = (4..=8).any(|layers: usize| {
            let params = &first[..2 * (layers - 1)];
            let moments = &first[params.len()..3 * params.len()];
            params.chunks(2).all(|pair| is_weight(pair[0]))
                && moments
                    .chunks(2)
                    .zip(params)
                    .all(|(twice, &size)| twice == [size, size])
        });
        assert!(fits, "{first:?}");
    }

    #[test]
    fn the_size_cap_applies_to_every_kind() {
        for kind in KINDS {
            let capped = WorkloadConfig {
                max_size: Some(1000),
                ..config(kind)
            };
            let mut workload = Workload::new(2, 0, capped);
            assert!((0..2000).all(|_| workload.next_size() <= 1000));
        }
    }

    #[test]
    fn spans_resolve_inside_the_buffer_and_aligned() {
        let mut rng = SplitMix64::new(11);
        for _ in 0..10_000 {
            let span = Span::draw(&mut rng);
            let size = (rng.range_inclusive(1, 1000)) * 4;
            let (offset, len) = span.resolve(size, 4);
            assert!(len >= 4 && offset % 4 == 0 && len % 4 == 0);
            assert!(offset + len <= size);
        }
        assert_eq!(Span::WHOLE.resolve(400, 4), (0, 400));
    }

    #[test]
    fn every_operation_kind_appears_in_the_default_mix() {
        let ops: Vec<Op> = Workload::new(8, 0, config(Sizes::Churn))
            .take(1000)
            .collect();
        let has = |f: fn(&Op) -> bool| ops.iter().any(f);
        assert!(has(|op| matches!(op, Op::Reserve { .. })));
        assert!(has(|op| matches!(op, Op::Write { .. })));
        assert!(has(|op| matches!(op, Op::Fill { .. })));
        assert!(has(|op| matches!(op, Op::Copy { .. })));
        assert!(has(|op| matches!(op, Op::Read { .. })));
        assert!(has(|op| matches!(op, Op::Free { .. })));
        assert!(has(|op| matches!(op, Op::Capture { .. })));
        assert!(!has(|op| matches!(op, Op::StoreStep { .. })));
    }

    #[test]
    fn a_store_weight_draws_store_steps_in_about_its_share() {
        let mix = Mix {
            store: 10,
            ..Mix::default()
        };
        let ops: Vec<Op> = Workload::new(
            8,
            0,
            WorkloadConfig {
                mix,
                ..config(Sizes::Churn)
            },
        )
        .take(10_000)
        .collect();
        let steps = ops
            .iter()
            .filter(|op| matches!(op, Op::StoreStep { .. }))
            .count() as f64;
        // 10 of 112.
        let share = steps / ops.len() as f64;
        assert!((share - 10.0 / 112.0).abs() < 0.01, "{share}");
        assert!(ops.iter().any(|op| matches!(op, Op::Capture { .. })));
    }
}
