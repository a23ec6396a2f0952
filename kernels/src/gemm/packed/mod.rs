//! Cistern's own packed SGEMM (BLIS-style), for the shapes where it
//! measures faster than the crates (`GemmKernel::Packed`).
//!
//! Per task (one block of C per rayon thread, as the crates run): for each
//! `NC` columns, for each `KC` steps of k, op(B) is packed into `NR`-wide
//! micro-panels (kept in L2); for each `MC` rows op(A) is packed into
//! `MR`-tall micro-panels; then every `MR`×`NR` tile runs the micro-kernel,
//! a B micro-panel staying in L1 across the tiles of one column. The bias
//! and activation run on each tile after its last k step, while it is in L1.

mod pack;
mod simd;

use std::cell::RefCell;

use pack::{Operand, pack, packed_len};
use simd::{Micro, Out, Tile};

use super::GemmSpec;
use super::kernel::{Shared, Strides, split, sub_problem};
use crate::Activation;

/// Rows of a micro-tile (one broadcast of A each).
const MR: usize = 14;
/// Columns of a micro-tile (two AVX-512 vectors).
const NR: usize = 32;
/// Steps of k per packed block: a B micro-panel is `KC·NR` floats (32 KiB).
const KC: usize = 256;
/// Rows of op(A) per packed block.
const MC: usize = 8 * MR;
/// Columns of op(B) per packed block (`KC·NC` floats, 1 MiB, in L2).
const NC: usize = 32 * NR;

/// `c ← act(op(a)·op(b) + bias)` for a spec whose lengths the caller has
/// checked, with m, n and k non-zero.
pub(super) fn product(
    spec: &GemmSpec,
    strides: &Strides,
    a: &[f32],
    b: &[f32],
    bias: Option<&[f32]>,
    c: &mut [f32],
) {
    let micro = Micro::detect();
    let c_ptr = Shared(c.as_mut_ptr());
    split(spec, |block, _| {
        let (m, n, c_at, a_at, b_at) = sub_problem(spec, strides, block);
        let a = Operand {
            data: a,
            at: a_at as usize,
            lane_stride: strides.a_row as usize,
            step_stride: strides.a_col as usize,
        };
        let b = Operand {
            data: b,
            at: b_at as usize,
            lane_stride: strides.b_col as usize,
            step_stride: strides.b_row as usize,
        };
        let bias = match bias {
            Some(bias) if block.columns => Some(&bias[block.start..block.start + block.len]),
            other => other,
        };
        let job = Job {
            micro,
            a,
            b,
            k: spec.k,
            epilogue: Epilogue {
                activation: spec.activation,
                bias,
            },
        };
        // SAFETY: `sub_problem` places the block's m rows of n elements,
        // `spec.n` apart, inside C (which the caller checked is m·n long),
        // and the blocks of one split are disjoint, so this task alone
        // touches them while `c` stays borrowed for the whole split.
        let mut out = unsafe { Out::new(c_ptr.get().add(c_at), m, n, spec.n) };
        run_block(&job, &mut out, (m, n));
    });
}

/// The bias (this block's columns of it) and activation of C.
struct Epilogue<'a> {
    activation: Activation,
    bias: Option<&'a [f32]>,
}

impl Epilogue<'_> {
    fn apply(&self, out: &mut Out, tile: &Tile) {
        if self.bias.is_none() && self.activation == Activation::Identity {
            return;
        }
        for row in tile.row..tile.row + tile.rows {
            let values = out.row_mut(row, tile.col, tile.cols);
            match self.bias {
                Some(bias) => self
                    .activation
                    .apply_with_bias(values, &bias[tile.col..tile.col + tile.cols]),
                None => self.activation.apply_in_place(values),
            }
        }
    }
}

thread_local! {
    /// Each thread's packing buffers, kept between products so that large
    /// ones are not faulted in afresh on every call.
    static BUFFERS: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// The first `len` floats of `buffer` from a 64-byte boundary (whole
/// cache lines, so that the kernel's vector loads never split one).
fn aligned(buffer: &mut Vec<f32>, len: usize) -> &mut [f32] {
    const SLACK: usize = 16;
    if buffer.len() < len + SLACK {
        buffer.resize(len + SLACK, 0.0);
    }
    let start = buffer.as_ptr().align_offset(64).min(SLACK);
    &mut buffer[start..start + len]
}

/// What every block of one product shares: the micro-kernel, the two
/// operands (offset to the block), k and the epilogue.
struct Job<'a> {
    micro: Micro,
    a: Operand<'a>,
    b: Operand<'a>,
    k: usize,
    epilogue: Epilogue<'a>,
}

/// One task's block: `out` (m×n) ← act(op(A)·op(B) + bias).
fn run_block(job: &Job, out: &mut Out, (m, n): (usize, usize)) {
    BUFFERS.with(|buffers| match buffers.try_borrow_mut() {
        Ok(mut buffers) => {
            let (a_buffer, b_buffer) = &mut *buffers;
            blocked(job, out, (m, n), a_buffer, b_buffer);
        }
        // Only a re-entrant call finds them taken; it packs into its own.
        Err(_) => blocked(job, out, (m, n), &mut vec![], &mut vec![]),
    });
}

fn blocked(
    job: &Job,
    out: &mut Out,
    (m, n): (usize, usize),
    a_buffer: &mut Vec<f32>,
    b_buffer: &mut Vec<f32>,
) {
    let Job {
        micro,
        ref a,
        ref b,
        k,
        ref epilogue,
    } = *job;
    for jc in (0..n).step_by(NC) {
        let nc = NC.min(n - jc);
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            let b_packed = aligned(b_buffer, packed_len::<NR>(nc, kc));
            pack::<NR>(micro, b, jc..jc + nc, pc..pc + kc, b_packed);
            for ic in (0..m).step_by(MC) {
                let mc = MC.min(m - ic);
                let a_packed = aligned(a_buffer, packed_len::<MR>(mc, kc));
                pack::<MR>(micro, a, ic..ic + mc, pc..pc + kc, a_packed);
                for (jr, b_panel) in b_packed.chunks_exact(NR * kc).enumerate() {
                    for (ir, a_panel) in a_packed.chunks_exact(MR * kc).enumerate() {
                        let tile = Tile {
                            row: ic + ir * MR,
                            col: jc + jr * NR,
                            rows: MR.min(mc - ir * MR),
                            cols: NR.min(nc - jr * NR),
                            kc,
                            accumulate: pc > 0,
                        };
                        simd::tile(micro, out, &tile, a_panel, b_panel);
                        if pc + kc == k {
                            epilogue.apply(out, &tile);
                        }
                    }
                }
            }
        }
    }
}
