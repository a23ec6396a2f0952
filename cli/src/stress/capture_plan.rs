//! The capture operation of the workload: a short graph recorded on the
//! client's own stream (fill and copy launches, maybe a reservation made
//! through the capture token), then replayed a few times.
//!
//! Like every [`Op`](super::workload::Op), a plan names buffers by
//! [`Pick`]s resolved when it runs, so drawing it never depends on how the
//! device answered.

use serde::{Deserialize, Serialize};

use super::workload::{Pick, Span};
use cistern_memory::SplitMix64;

/// The most steps one captured graph records.
pub const MAX_CAPTURE_STEPS: usize = 4;

/// One step recorded into a graph.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum CaptureStep {
    /// Reserve `size` bytes through the capture token (`Forbidden`: only
    /// from pages already held); later steps may pick the new buffer.
    Reserve {
        /// Bytes (a positive multiple of 4).
        size: u64,
    },
    /// Fill `span` of `target` with a fresh `f32` value.
    Fill {
        target: Pick,
        /// The bytes filled (4-byte aligned).
        span: Span,
    },
    /// Copy from `source` to `target` (distinct buffers) by a kernel.
    Copy {
        source: Pick,
        target: Pick,
        /// How many bytes, as a fraction of the smaller buffer.
        len: u32,
        /// Where in the source, as a fraction of the room left.
        source_start: u32,
        /// Where in the target, as a fraction of the room left.
        target_start: u32,
        /// The `Identity` kernel (`f32`s) rather than the `Copy` kernel (bytes).
        identity: bool,
    },
}

/// A graph to capture and replay.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CapturePlan {
    steps: [Option<CaptureStep>; MAX_CAPTURE_STEPS],
    /// How many times the graph is replayed (1–4).
    pub replays: u32,
}

impl CapturePlan {
    /// The steps, in recording order.
    pub fn steps(&self) -> impl Iterator<Item = CaptureStep> + '_ {
        self.steps.iter().flatten().copied()
    }

    /// Draws a plan: 1–4 steps, each a fill or a copy, the first maybe a
    /// reservation of `reserve_size` bytes.
    pub(crate) fn draw(rng: &mut SplitMix64, reserve_size: u64) -> Self {
        let mut steps = [None; MAX_CAPTURE_STEPS];
        let count = rng.range_inclusive(1, MAX_CAPTURE_STEPS as u64) as usize;
        for (index, step) in steps.iter_mut().take(count).enumerate() {
            let pick = |rng: &mut SplitMix64| Pick(rng.next_u64());
            *step = Some(if index == 0 && rng.chance(0.3) {
                CaptureStep::Reserve {
                    size: reserve_size.max(4).next_multiple_of(4),
                }
            } else if rng.chance(0.5) {
                CaptureStep::Fill {
                    target: pick(rng),
                    span: Span::draw(rng),
                }
            } else {
                CaptureStep::Copy {
                    source: pick(rng),
                    target: pick(rng),
                    len: if rng.chance(0.5) {
                        u32::MAX
                    } else {
                        rng.next_u64() as u32
                    },
                    source_start: rng.next_u64() as u32,
                    target_start: rng.next_u64() as u32,
                    identity: rng.chance(0.5),
                }
            });
        }
        CapturePlan {
            steps,
            replays: rng.range_inclusive(1, 4) as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_has_one_to_four_steps_and_only_the_first_may_reserve() {
        let mut rng = SplitMix64::new(4);
        let mut reserved = false;
        for _ in 0..2000 {
            let plan = CapturePlan::draw(&mut rng, 100);
            let steps: Vec<CaptureStep> = plan.steps().collect();
            assert!((1..=MAX_CAPTURE_STEPS).contains(&steps.len()));
            assert!((1..=4).contains(&plan.replays));
            assert!(
                steps[1..]
                    .iter()
                    .all(|s| !matches!(s, CaptureStep::Reserve { .. }))
            );
            if let CaptureStep::Reserve { size } = steps[0] {
                assert_eq!(size, 100);
                reserved = true;
            }
        }
        assert!(reserved);
    }
}
