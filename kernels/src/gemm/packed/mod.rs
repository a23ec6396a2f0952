//! Cistern's own packed SGEMM (BLIS-style), for the shapes where it
//! measures faster than the crates (`GemmKernel::Packed`).
//!
//! Per task (one block of C per rayon thread, as the crates run): for each
//! `nc` columns, for each `kc` steps of k, op(B) is packed into `NR`-wide
//! micro-panels; for each `mc` rows op(A) is packed into `MR`-tall
//! micro-panels (kept in L2); then every `MR`×`NR` tile runs the
//! micro-kernel, a B micro-panel staying in L1 across the tiles of one
//! column (on AVX-512 an A micro-panel across those of a row:
//! `Blocking::a_resident`). On AVX2, while a block computes, the source
//! of the next one is prefetched into L2 (`prefetch`). Where C is split
//! among tasks, the operand each of them reads whole (op(A) for a split
//! by columns, op(B) by rows) is packed once for all of them (`shared`,
//! up to `SHARED_PACK_LIMIT`).
//! The bias and activation run on each tile after its last k step,
//! while it is in L1. The tile (`MR`×`NR`) is the micro-kernel's, and the
//! blocks (`Blocking`) are sized for the caches of the CPUs it runs on.

mod pack;
mod prefetch;
mod shared;
mod simd;
#[cfg(test)]
mod tests;

use std::cell::RefCell;

use pack::{Operand, pack, packed_len};
use prefetch::Lines;
use shared::{LazyA, SharedOperand, block_of, pack_up_front};
use simd::{AVX2_MR, AVX2_NR, AVX512_MR, AVX512_NR, Micro, Out, Tile};

use super::GemmSpec;
use super::kernel::{Block, SendPtr, Split, Strides, split_as, sub_problem};
use crate::Activation;

/// The cache blocks of one micro-kernel: `kc` steps of k per packed block,
/// `mc` rows of op(A) (a multiple of the tile's rows) and `nc` columns of
/// op(B) (a multiple of its columns). When `balanced`, k and m are cut
/// into blocks of nearly equal size no larger than these (so that k = 784
/// runs as 4 blocks of 208 or less, not 3 of 256 and one of 16, whose
/// pass over C costs as much as a full block's). When `a_resident`, the
/// tiles of a block run row by row, an A micro-panel staying in L1 while
/// B's stream from L2; else column by column, a B micro-panel staying.
/// When `prefetch_next`, the next block's source is fetched into L2 over
/// the current block's tiles (`prefetch`).
#[derive(Debug, Clone, Copy)]
struct Blocking {
    kc: usize,
    mc: usize,
    nc: usize,
    balanced: bool,
    a_resident: bool,
    prefetch_next: bool,
}

/// The block size, at most `block` and a multiple of `align` where it is
/// under `len`, that cuts `len` into as few and as equal blocks as it can.
fn balanced(len: usize, block: usize, align: usize) -> usize {
    let blocks = len.div_ceil(block).max(1);
    let size = len.div_ceil(blocks).div_ceil(align) * align;
    size.min(block)
}

/// AVX-512 (14×32 tiles): an A micro-panel (14 KiB) stays in L1 while
/// the B micro-panels (32 KiB each) stream from the packed B block
/// (256×1024, 1 MiB) in L2. Kept resident instead, a B micro-panel and
/// the A panels streaming past it overfill a 48 KiB L1: on Emerald
/// Rapids that order measured 10–15 % slower. Prefetching the next
/// block's source there left the packing's time unchanged and slowed
/// the tiles: 5–6 % on products with B transposed, 1 % with A.
const AVX512_BLOCKING: Blocking = Blocking {
    kc: 256,
    mc: 8 * AVX512_MR,
    nc: 32 * AVX512_NR,
    balanced: false,
    a_resident: true,
    prefetch_next: false,
};

/// AVX2 + FMA (6×16 tiles), for Zen 3 and Haswell-class caches (32 KiB
/// L1d, 256–512 KiB L2): a B micro-panel is 16 KiB, in L1, and the packed
/// A block (`mc`×`kc`) 144 KiB, in L2. The next block's source is
/// prefetched: on Zen 3 packing from memory took 2–3 times as long.
const AVX2_BLOCKING: Blocking = Blocking {
    kc: 256,
    mc: 24 * AVX2_MR,
    nc: 64 * AVX2_NR,
    balanced: true,
    a_resident: false,
    prefetch_next: true,
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
    let operands = Operands {
        a: Operand {
            data: a,
            at: 0,
            lane_stride: strides.a_row as usize,
            step_stride: strides.a_col as usize,
        },
        b: Operand {
            data: b,
            at: 0,
            lane_stride: strides.b_col as usize,
            step_stride: strides.b_row as usize,
        },
    };
    match micro {
        Micro::Avx2Fma => {
            product_as::<AVX2_MR, AVX2_NR>(micro, AVX2_BLOCKING, spec, &operands, bias, c);
        }
        Micro::Avx512 | Micro::Portable => {
            product_as::<AVX512_MR, AVX512_NR>(micro, AVX512_BLOCKING, spec, &operands, bias, c);
        }
    }
}

/// op(A) (lanes: rows) and op(B) (lanes: columns) as the packing reads them.
struct Operands<'a> {
    a: Operand<'a>,
    b: Operand<'a>,
}

fn product_as<const MR: usize, const NR: usize>(
    micro: Micro,
    blocking: Blocking,
    spec: &GemmSpec,
    operands: &Operands,
    bias: Option<&[f32]>,
    c: &mut [f32],
) {
    let kc = if blocking.balanced {
        balanced(spec.k, blocking.kc, 16)
    } else {
        blocking.kc
    };
    let plan = Split::of(spec);
    let unshared = Job {
        micro,
        blocking,
        kc,
        shared: None,
    };
    let shared_len = shared_len::<MR, NR>(spec, plan);
    if plan.tasks <= 1 || shared_len > SHARED_PACK_LIMIT {
        return blocks::<MR, NR>(&unshared, spec, plan, operands, bias, c);
    }
    // Every task reads the whole of the operand along the side C is not
    // split on: pack it once, shared, rather than once per task.
    SHARED.with(|buffer| {
        // Only a re-entrant call finds it taken; its tasks pack their own.
        let Ok(mut buffer) = buffer.try_borrow_mut() else {
            return blocks::<MR, NR>(&unshared, spec, plan, operands, bias, c);
        };
        let packed = aligned(&mut buffer, shared_len);
        if plan.columns {
            let blocks_of_a = (row_block::<MR>(blocking, spec.m), kc);
            let lazy = LazyA::new::<MR>(micro, &operands.a, (spec.m, spec.k), blocks_of_a, packed);
            let job = Job {
                shared: Some(SharedOperand::A(lazy)),
                ..unshared
            };
            return blocks::<MR, NR>(&job, spec, plan, operands, bias, c);
        }
        let b = (&operands.b, spec.n);
        let packed = pack_up_front::<NR>(micro, b, (spec.k, kc), plan.tasks, packed);
        let job = Job {
            shared: Some(SharedOperand::B(packed)),
            ..unshared
        };
        blocks::<MR, NR>(&job, spec, plan, operands, bias, c);
    });
}

/// The rows of a block of op(A) for a task of `m` rows.
fn row_block<const MR: usize>(blocking: Blocking, m: usize) -> usize {
    if blocking.balanced {
        balanced(m, blocking.mc, MR)
    } else {
        blocking.mc
    }
}

/// The packed length of the operand every task of `plan` reads whole.
fn shared_len<const MR: usize, const NR: usize>(spec: &GemmSpec, plan: Split) -> usize {
    if plan.columns {
        packed_len::<MR>(spec.m, spec.k)
    } else {
        packed_len::<NR>(spec.n, spec.k)
    }
}

/// Whether `micro`'s product of `spec` packs an operand once for all its
/// tasks (on the current rayon pool), for tests.
#[cfg(test)]
fn shares_a_packed_operand(micro: Micro, spec: &GemmSpec) -> bool {
    let plan = Split::of(spec);
    let len = match micro {
        Micro::Avx2Fma => shared_len::<AVX2_MR, AVX2_NR>(spec, plan),
        Micro::Avx512 | Micro::Portable => shared_len::<AVX512_MR, AVX512_NR>(spec, plan),
    };
    plan.tasks > 1 && len <= SHARED_PACK_LIMIT
}

/// The largest operand (packed floats) packed once for every task: larger
/// ones are packed by each task for itself, the share of the work packing
/// it takes being small there.
const SHARED_PACK_LIMIT: usize = 1 << 21;

thread_local! {
    /// The calling thread's buffer for the shared packed operand, kept
    /// between products (up to `SHARED_PACK_LIMIT` floats).
    static SHARED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs every task's block of C, cut as `plan` says.
fn blocks<const MR: usize, const NR: usize>(
    job: &Job,
    spec: &GemmSpec,
    plan: Split,
    operands: &Operands,
    bias: Option<&[f32]>,
    c: &mut [f32],
) {
    let c = SendPtr(c.as_mut_ptr());
    split_as(spec, plan, |block, _| {
        // SAFETY: `c` is C (m·n long, checked by the caller), borrowed for
        // the whole split, whose blocks are disjoint.
        unsafe { one_block::<MR, NR>(job, spec, operands, bias, c, block) };
    });
}

/// One block of C: act(op(A)·op(B) + bias) over its rows or columns.
///
/// # Safety
/// `c` points at C (`spec.m · spec.n` floats), and no other thread reads
/// or writes `block`'s part of it while this runs.
unsafe fn one_block<const MR: usize, const NR: usize>(
    job: &Job,
    spec: &GemmSpec,
    operands: &Operands,
    bias: Option<&[f32]>,
    c: SendPtr<*mut f32>,
    block: Block,
) {
    let (m, n, c_at, a_at, b_at) = sub_problem(spec, &Strides::of(spec), block);
    let operands = Operands {
        a: Operand {
            at: a_at as usize,
            ..operands.a
        },
        b: Operand {
            at: b_at as usize,
            ..operands.b
        },
    };
    let bias = match bias {
        Some(bias) if block.columns => Some(&bias[block.start..block.start + block.len]),
        other => other,
    };
    // A task's share of a split by columns starts at its own fraction of
    // the row blocks of the shared op(A).
    let first_row_block = match &job.shared {
        Some(SharedOperand::A(lazy)) => block.start * lazy.row_blocks() / spec.n,
        _ => 0,
    };
    let task = Task {
        job,
        operands: &operands,
        k: spec.k,
        all_n: spec.n,
        first_row_block,
        epilogue: Epilogue {
            activation: spec.activation,
            bias,
        },
    };
    // SAFETY: `sub_problem` places the block's m rows of n elements,
    // `spec.n` apart, inside C, which only this call touches there (the
    // caller's promise).
    let mut out = unsafe { Out::new(c.get().add(c_at), m, n, spec.n) };
    run_block::<MR, NR>(&task, &mut out, (m, n));
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

/// What every block of one product shares: the micro-kernel, its blocks,
/// the k block and the operand packed once for all tasks, if any.
struct Job<'a> {
    micro: Micro,
    blocking: Blocking,
    kc: usize,
    shared: Option<SharedOperand<'a>>,
}

/// One task's share: the job, the operands offset to its block, k, C's
/// columns, the row block it starts from and the epilogue.
struct Task<'a> {
    job: &'a Job<'a>,
    operands: &'a Operands<'a>,
    k: usize,
    all_n: usize,
    first_row_block: usize,
    epilogue: Epilogue<'a>,
}

/// One task's block: `out` (m×n) ← act(op(A)·op(B) + bias).
fn run_block<const MR: usize, const NR: usize>(task: &Task, out: &mut Out, size: (usize, usize)) {
    BUFFERS.with(|buffers| match buffers.try_borrow_mut() {
        Ok(mut buffers) => {
            let (a, b) = &mut *buffers;
            blocked_as::<MR, NR>(task, out, size, Buffers { a, b });
        }
        // Only a re-entrant call finds them taken; it packs into its own.
        Err(_) => {
            let buffers = Buffers {
                a: &mut vec![],
                b: &mut vec![],
            };
            blocked_as::<MR, NR>(task, out, size, buffers);
        }
    });
}

/// The packing buffers of one task.
struct Buffers<'a> {
    a: &'a mut Vec<f32>,
    b: &'a mut Vec<f32>,
}

fn blocked_as<const MR: usize, const NR: usize>(
    task: &Task,
    out: &mut Out,
    (m, n): (usize, usize),
    buffers: Buffers,
) {
    let Task {
        job,
        operands,
        k,
        all_n,
        first_row_block,
        ref epilogue,
    } = *task;
    let Job {
        micro,
        blocking,
        kc: kc_block,
        ref shared,
    } = *job;
    debug_assert!(blocking.mc % MR == 0 && blocking.nc % NR == 0);
    let Buffers {
        a: a_buffer,
        b: b_buffer,
    } = buffers;
    let (lazy_a, shared_b) = match shared {
        Some(SharedOperand::A(lazy)) => (Some(lazy), None),
        Some(SharedOperand::B(packed)) => (None, Some(*packed)),
        None => (None, None),
    };
    let mc_block = row_block::<MR>(blocking, m);
    debug_assert!(lazy_a.is_none_or(|lazy| lazy.mc_block() == mc_block));
    let nc_block = blocking.nc;
    let row_blocks = m.div_ceil(mc_block);
    // The rows of the block a task computes on its `turn`-th.
    let rows_at = |turn: usize| (first_row_block + turn) % row_blocks * mc_block;
    for jc in (0..n).step_by(nc_block) {
        let nc = nc_block.min(n - jc);
        for pc in (0..k).step_by(kc_block) {
            let kc = kc_block.min(k - pc);
            let b_packed = match shared_b {
                Some(packed) => block_of::<NR>(packed, jc..jc + nc, all_n, pc, kc),
                None => pack_into::<NR>(micro, &operands.b, jc..jc + nc, pc..pc + kc, b_buffer),
            };
            // The next block of op(B), fetched over this one's tiles.
            let mut next_b = match shared_b {
                _ if !blocking.prefetch_next => Lines::none(),
                Some(_) => Lines::none(),
                None if pc + kc < k => {
                    let steps = pc + kc..k.min(pc + kc + kc_block);
                    Lines::of(&operands.b, jc..jc + nc, steps)
                }
                None if jc + nc < n => {
                    let lanes = jc + nc..n.min(jc + nc + nc_block);
                    Lines::of(&operands.b, lanes, 0..k.min(kc_block))
                }
                None => Lines::none(),
            };
            let b_rate = next_b.rate(m.div_ceil(MR) * nc.div_ceil(NR));
            for turn in 0..row_blocks {
                let ic = rows_at(turn);
                let mc = mc_block.min(m - ic);
                let a_packed = match lazy_a {
                    Some(lazy) => lazy.block::<MR>(ic, pc),
                    None => pack_into::<MR>(micro, &operands.a, ic..ic + mc, pc..pc + kc, a_buffer),
                };
                // The next block of op(A) this task reaches, fetched over
                // this one's tiles.
                let next = if turn + 1 < row_blocks {
                    Some((rows_at(turn + 1), pc))
                } else if pc + kc < k {
                    Some((rows_at(0), pc + kc))
                } else if jc + nc < n {
                    Some((rows_at(0), 0))
                } else {
                    None
                };
                let mut next_a = match (next, lazy_a) {
                    _ if !blocking.prefetch_next => Lines::none(),
                    (None, _) => Lines::none(),
                    (Some((ic, pc)), Some(lazy)) => lazy.lines::<MR>(ic, pc),
                    (Some((ic, pc)), None) => {
                        let rows = ic..m.min(ic + mc_block);
                        Lines::of(&operands.a, rows, pc..k.min(pc + kc_block))
                    }
                };
                let a_rate = next_a.rate(mc.div_ceil(MR) * nc.div_ceil(NR));
                let (a_panels, b_panels) = (mc.div_ceil(MR), nc.div_ceil(NR));
                for index in 0..a_panels * b_panels {
                    let (ir, jr) = if blocking.a_resident {
                        (index / b_panels, index % b_panels)
                    } else {
                        (index % a_panels, index / a_panels)
                    };
                    let tile = Tile {
                        row: ic + ir * MR,
                        col: jc + jr * NR,
                        rows: MR.min(mc - ir * MR),
                        cols: NR.min(nc - jr * NR),
                        kc,
                        accumulate: pc > 0,
                    };
                    let a_panel = &a_packed[ir * MR * kc..][..MR * kc];
                    let b_panel = &b_packed[jr * NR * kc..][..NR * kc];
                    simd::tile::<MR, NR>(micro, out, &tile, a_panel, b_panel);
                    if pc + kc == k {
                        epilogue.apply(out, &tile);
                    }
                    next_a.advance(a_rate);
                    next_b.advance(b_rate);
                }
            }
        }
    }
}

/// Packs `lanes` × `steps` of `operand` into `buffer` (a task's own) and
/// returns the packed panels.
fn pack_into<'p, const W: usize>(
    micro: Micro,
    operand: &Operand,
    lanes: std::ops::Range<usize>,
    steps: std::ops::Range<usize>,
    buffer: &'p mut Vec<f32>,
) -> &'p [f32] {
    let packed = aligned(buffer, packed_len::<W>(lanes.len(), steps.len()));
    pack::<W>(micro, operand, lanes, steps, packed);
    packed
}
