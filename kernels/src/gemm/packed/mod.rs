//! Cistern's own packed SGEMM (BLIS-style), for the shapes where it
//! measures faster than the crates (`GemmKernel::Packed`).
//!
//! Per task (one block of C per rayon thread, as the crates run): for each
//! `nc` columns, for each `kc` steps of k, op(B) is packed into `NR`-wide
//! micro-panels; for each `mc` rows op(A) is packed into `MR`-tall
//! micro-panels (kept in L2); then every `MR`×`NR` tile runs the
//! micro-kernel, a B micro-panel staying in L1 across the tiles of one
//! column. The bias and activation run on each tile after its last k step,
//! while it is in L1. The tile (`MR`×`NR`) is the micro-kernel's, and the
//! blocks (`Blocking`) are sized for the caches of the CPUs it runs on.

mod pack;
mod simd;
#[cfg(test)]
mod tests;

use std::cell::RefCell;

use pack::{Operand, pack, packed_len};
use simd::{AVX2_MR, AVX2_NR, AVX512_MR, AVX512_NR, Micro, Out, Tile};

use super::GemmSpec;
use super::kernel::{Shared, Strides, split, sub_problem};
use crate::Activation;

/// The cache blocks of one micro-kernel: `kc` steps of k per packed block,
/// `mc` rows of op(A) (a multiple of the tile's rows) and `nc` columns of
/// op(B) (a multiple of its columns). When `balanced`, k and m are cut
/// into blocks of nearly equal size no larger than these (so that k = 784
/// runs as 4 blocks of 208 or less, not 3 of 256 and one of 16, whose
/// pass over C costs as much as a full block's).
#[derive(Debug, Clone, Copy)]
struct Blocking {
    kc: usize,
    mc: usize,
    nc: usize,
    balanced: bool,
}

/// The block size, at most `block` and a multiple of `align` where it is
/// under `len`, that cuts `len` into as few and as equal blocks as it can.
fn balanced(len: usize, block: usize, align: usize) -> usize {
    let blocks = len.div_ceil(block).max(1);
    let size = len.div_ceil(blocks).div_ceil(align) * align;
    size.min(block)
}

/// AVX-512 (14×32 tiles): a B micro-panel is 32 KiB, the packed B block
/// (256×1024) 1 MiB, in L2.
const AVX512_BLOCKING: Blocking = Blocking {
    kc: 256,
    mc: 8 * AVX512_MR,
    nc: 32 * AVX512_NR,
    balanced: false,
};

/// AVX2 + FMA (6×16 tiles), for Zen 3 and Haswell-class caches (32 KiB
/// L1d, 256–512 KiB L2): a B micro-panel is 16 KiB, in L1, and the packed
/// A block (`mc`×`kc`) 144 KiB, in L2.
const AVX2_BLOCKING: Blocking = Blocking {
    kc: 256,
    mc: 24 * AVX2_MR,
    nc: 64 * AVX2_NR,
    balanced: true,
};

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
    product_on(Micro::detect(), spec, strides, a, b, bias, c);
}

/// [`product`] on the micro-kernel `micro`, which the CPU must run (one of
/// [`Micro::available`]).
fn product_on(
    micro: Micro,
    spec: &GemmSpec,
    strides: &Strides,
    a: &[f32],
    b: &[f32],
    bias: Option<&[f32]>,
    c: &mut [f32],
) {
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
            let (a, b) = &mut *buffers;
            blocked(job, out, (m, n), Buffers { a, b });
        }
        // Only a re-entrant call finds them taken; it packs into its own.
        Err(_) => {
            let buffers = Buffers {
                a: &mut vec![],
                b: &mut vec![],
            };
            blocked(job, out, (m, n), buffers);
        }
    });
}

/// The packing buffers of one task.
struct Buffers<'a> {
    a: &'a mut Vec<f32>,
    b: &'a mut Vec<f32>,
}

fn blocked(job: &Job, out: &mut Out, size: (usize, usize), buffers: Buffers) {
    match job.micro {
        Micro::Avx2Fma => {
            blocked_as::<AVX2_MR, AVX2_NR>(job, AVX2_BLOCKING, out, size, buffers);
        }
        Micro::Avx512 | Micro::Portable => {
            blocked_as::<AVX512_MR, AVX512_NR>(job, AVX512_BLOCKING, out, size, buffers);
        }
    }
}

fn blocked_as<const MR: usize, const NR: usize>(
    job: &Job,
    blocking: Blocking,
    out: &mut Out,
    (m, n): (usize, usize),
    buffers: Buffers,
) {
    let Job {
        micro,
        ref a,
        ref b,
        k,
        ref epilogue,
    } = *job;
    let Blocking {
        kc: kc_block,
        mc: mc_block,
        nc: nc_block,
        balanced: _,
    } = blocking;
    debug_assert!(mc_block % MR == 0 && nc_block % NR == 0);
    let Buffers {
        a: a_buffer,
        b: b_buffer,
    } = buffers;
    let (kc_block, mc_block) = if blocking.balanced {
        (balanced(k, kc_block, 16), balanced(m, mc_block, MR))
    } else {
        (kc_block, mc_block)
    };
    for jc in (0..n).step_by(nc_block) {
        let nc = nc_block.min(n - jc);
        for pc in (0..k).step_by(kc_block) {
            let kc = kc_block.min(k - pc);
            let b_packed = aligned(b_buffer, packed_len::<NR>(nc, kc));
            pack::<NR>(micro, b, jc..jc + nc, pc..pc + kc, b_packed);
            for ic in (0..m).step_by(mc_block) {
                let mc = mc_block.min(m - ic);
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
                        simd::tile::<MR, NR>(micro, out, &tile, a_panel, b_panel);
                        if pc + kc == k {
                            epilogue.apply(out, &tile);
                        }
                    }
                }
            }
        }
    }
}
