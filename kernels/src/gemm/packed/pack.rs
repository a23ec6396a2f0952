//! Packing a block of op(A) or op(B) into contiguous micro-panels.
//!
//! A micro-panel is `W` lanes (rows of op(A), `MR` of them, or columns of
//! op(B), `NR`) by `kc` steps of the contracted dimension, stored step by
//! step: the micro-kernel reads it front to back, whatever the operand's
//! transpose. Lanes past the operand's edge are zero, so the kernel always
//! runs whole panels and only its stores are masked.

use std::ops::Range;

use super::simd::{Micro, copy_steps, transpose_steps};

/// A row-major operand seen as a matrix of lanes × steps: element
/// (`lane`, `step`) is `data[at + lane·lane_stride + step·step_stride]`.
pub(super) struct Operand<'a> {
    pub data: &'a [f32],
    pub at: usize,
    pub lane_stride: usize,
    pub step_stride: usize,
}

/// The length of the packed block of `lanes` lanes by `kc` steps.
pub(super) fn packed_len<const W: usize>(lanes: usize, kc: usize) -> usize {
    lanes.div_ceil(W) * W * kc
}

/// How many lanes of each step a lanes-contiguous operand's packing
/// copies per pass over the steps (whole panels, at least one): 512
/// bytes of each source row at a time, rather than one panel's 56 or
/// 128 (2.4× faster for op(A), 1.6× for op(B) from rows 4 KiB apart,
/// Zen 4), and not a whole block's, whose 16 op(B) panels 32 KiB apart
/// written at once measured 2× slower.
const COPIED_LANES: usize = 128;

/// Packs `lanes` × `steps` of `src` into `dst` (`packed_len` long): one
/// micro-panel of `W` lanes after another.
pub(super) fn pack<const W: usize>(
    micro: Micro,
    src: &Operand,
    lanes: Range<usize>,
    steps: Range<usize>,
    dst: &mut [f32],
) {
    let kc = steps.len();
    debug_assert_eq!(dst.len(), packed_len::<W>(lanes.len(), kc));
    if src.lane_stride == 1 && kc > 0 {
        // Each step's lanes adjacent in the source: copied step by step,
        // `COPIED_LANES` of them at a time.
        let group = (COPIED_LANES / W).max(1) * W;
        for (index, panels) in dst.chunks_mut(group * kc).enumerate() {
            let first = lanes.start + index * group;
            let live = group.min(lanes.end - first);
            let base = src.at + first + steps.start * src.step_stride;
            copy_steps::<W>(
                micro,
                (&src.data[base..], src.step_stride, live),
                kc,
                panels,
            );
        }
        return;
    }
    for (panel_index, panel) in dst.chunks_exact_mut(W * kc).enumerate() {
        let first = lanes.start + panel_index * W;
        let live = W.min(lanes.end - first);
        let base = src.at + first * src.lane_stride + steps.start * src.step_stride;
        if src.step_stride == 1 {
            transposed::<W>(micro, src, base, live, panel);
        } else {
            lane_by_lane::<W>(src, base, live, 0, panel);
        }
    }
}

/// Lanes apart in the source (its steps adjacent, as a row of A or a
/// column of a transposed B are): read lane by lane, write every `W`-th
/// element.
fn lane_by_lane<const W: usize>(
    src: &Operand,
    base: usize,
    live: usize,
    first_step: usize,
    panel: &mut [f32],
) {
    let kc = panel.len() / W;
    if first_step == kc {
        return;
    }
    let panel = &mut panel[first_step * W..];
    for lane in 0..W {
        if lane < live {
            let from = base + lane * src.lane_stride + first_step * src.step_stride;
            let source = src.data[from..].iter().step_by(src.step_stride);
            let source = source.take(kc - first_step);
            for (dst, &x) in panel[lane..].iter_mut().step_by(W).zip(source) {
                *dst = x;
            }
        } else {
            panel[lane..]
                .iter_mut()
                .step_by(W)
                .for_each(|dst| *dst = 0.0);
        }
    }
}

/// Steps adjacent in the source (a row of A, a column of a transposed
/// B): 16 lanes at a time through register transposes of 16 steps, the
/// last `kc mod 16` steps lane by lane.
fn transposed<const W: usize>(
    micro: Micro,
    src: &Operand,
    base: usize,
    live: usize,
    panel: &mut [f32],
) {
    let kc = panel.len() / W;
    let whole = kc / 16 * 16;
    for first_lane in (0..W).step_by(16) {
        let count = live.saturating_sub(first_lane).min(16);
        let width = (W - first_lane).min(16);
        let dst = &mut panel[first_lane..];
        if count == 0 {
            // Lanes past the operand's edge: zero.
            for step in dst.chunks_mut(W).take(whole) {
                step[..width].fill(0.0);
            }
            continue;
        }
        let source = &src.data[base + first_lane * src.lane_stride..];
        let lanes = (source, src.lane_stride, count);
        transpose_steps(micro, lanes, whole, (dst, W, width));
    }
    lane_by_lane::<W>(src, base, live, whole, panel);
}
