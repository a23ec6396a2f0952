//! The operand every task of a split reads whole, packed once for all of
//! them ([`SharedOperand`]): op(B) of a split by rows before the tasks start, its
//! parts in parallel ([`pack_up_front`]); op(A) of a split by columns
//! block by block, each by the first task to reach it ([`LazyA`]).
//!
//! Both lay the operand out alike: its k blocks one after another, block
//! `pc` from `padded lanes · pc`, each its micro-panels in lane order.

use std::ops::Range;
use std::sync::atomic::{AtomicU8, Ordering};

use super::pack::{Operand, pack, packed_len};
use super::prefetch::Lines;
use super::simd::Micro;
use crate::gemm::kernel::SendPtr;

/// The operand packed once for every task of a split.
pub(super) enum SharedOperand<'a> {
    /// op(B) of a split by rows, packed whole before the tasks start.
    B(&'a [f32]),
    /// op(A) of a split by columns, packed as the tasks first need it.
    A(LazyA<'a>),
}

/// Where the packed block of `lanes` (from a multiple of the tile's width
/// `W`, of `all` lanes in total) by `kc` steps from step `pc` lies.
fn block_range<const W: usize>(
    lanes: &Range<usize>,
    all: usize,
    pc: usize,
    kc: usize,
) -> Range<usize> {
    let start = packed_len::<W>(all, pc) + lanes.start * kc;
    start..start + packed_len::<W>(lanes.len(), kc)
}

/// The block of `lanes` × `kc` steps from `pc` of an operand of `all`
/// lanes that [`pack_up_front`] packed into `packed`.
pub(super) fn block_of<const W: usize>(
    packed: &[f32],
    lanes: Range<usize>,
    all: usize,
    pc: usize,
    kc: usize,
) -> &[f32] {
    &packed[block_range::<W>(&lanes, all, pc, kc)]
}

/// Packs all `lanes` of `source` by every `kc` steps of `k` into `dst`,
/// the lanes cut into `tasks` parts packed in parallel (the caller taking
/// one, `fork_each`); returns `dst`.
pub(super) fn pack_up_front<'d, const W: usize>(
    micro: Micro,
    (source, lanes): (&Operand, usize),
    (k, kc_block): (usize, usize),
    tasks: usize,
    dst: &'d mut [f32],
) -> &'d [f32] {
    let part = lanes.div_ceil(tasks).div_ceil(W) * W;
    let mut parts: Vec<Vec<_>> = (0..lanes.div_ceil(part)).map(|_| Vec::new()).collect();
    let mut rest = &mut *dst;
    for pc in (0..k).step_by(kc_block) {
        let kc = kc_block.min(k - pc);
        for (first, units) in (0..lanes).step_by(part).zip(&mut parts) {
            let lane_range = first..(first + part).min(lanes);
            let len = packed_len::<W>(lane_range.len(), kc);
            let (unit, tail) = rest.split_at_mut(len);
            rest = tail;
            units.push((lane_range, pc..pc + kc, unit));
        }
    }
    debug_assert!(rest.is_empty());
    crate::parallel::fork_each(parts, |units| {
        for (lane_range, steps, unit) in units {
            pack::<W>(micro, source, lane_range, steps, unit);
        }
    });
    dst
}

/// No task has claimed the block.
const EMPTY: u8 = 0;
/// A task is packing it.
const PACKING: u8 = 1;
/// It is packed and will not change.
const READY: u8 = 2;
/// Its packer panicked.
const FAILED: u8 = 3;

/// op(A) packed once for all the tasks of a split by columns, block by
/// block (`mc_block` rows × `kc_block` steps): the first task to reach a
/// block packs it, and another waits only where it arrives while that
/// packing runs. Tasks walk the row blocks from different starts (see
/// `Task::first_row_block`), so that, running at once, they pack
/// different blocks and then compute on each other's. Nothing is packed
/// before the tasks start, so packing overlaps their products (the next
/// block's source prefetched meanwhile); every block is packed once.
pub(super) struct LazyA<'a> {
    micro: Micro,
    source: &'a Operand<'a>,
    packed: SendPtr<*mut f32>,
    claims: Vec<AtomicU8>,
    width: usize,
    rows: usize,
    k: usize,
    mc_block: usize,
    kc_block: usize,
}

impl<'a> LazyA<'a> {
    /// op(A) = `source`, `rows` × `k`, to be packed into `dst`
    /// (`packed_len::<W>(rows, k)` floats) for `W`-row tiles.
    pub(super) fn new<const W: usize>(
        micro: Micro,
        source: &'a Operand<'a>,
        (rows, k): (usize, usize),
        (mc_block, kc_block): (usize, usize),
        dst: &'a mut [f32],
    ) -> LazyA<'a> {
        assert_eq!(dst.len(), packed_len::<W>(rows, k));
        assert!(mc_block.is_multiple_of(W) && mc_block > 0 && kc_block > 0);
        let blocks = rows.div_ceil(mc_block) * k.div_ceil(kc_block);
        LazyA {
            micro,
            source,
            packed: SendPtr(dst.as_mut_ptr()),
            claims: (0..blocks).map(|_| AtomicU8::new(EMPTY)).collect(),
            width: W,
            rows,
            k,
            mc_block,
            kc_block,
        }
    }

    /// How many blocks of rows op(A) has.
    pub(super) fn row_blocks(&self) -> usize {
        self.rows.div_ceil(self.mc_block)
    }

    /// The rows of a block.
    pub(super) fn mc_block(&self) -> usize {
        self.mc_block
    }

    /// The claim and the place in the buffer of the block whose rows start
    /// at `ic` and steps at `pc` (multiples of the blocks).
    fn locate<const W: usize>(
        &self,
        ic: usize,
        pc: usize,
    ) -> (&AtomicU8, Range<usize>, Range<usize>, Range<usize>) {
        debug_assert!(
            W == self.width && ic.is_multiple_of(self.mc_block) && pc.is_multiple_of(self.kc_block)
        );
        let rows = ic..self.rows.min(ic + self.mc_block);
        let steps = pc..self.k.min(pc + self.kc_block);
        let index = pc / self.kc_block * self.row_blocks() + ic / self.mc_block;
        let range = block_range::<W>(&rows, self.rows, pc, steps.len());
        (&self.claims[index], range, rows, steps)
    }

    /// The packed block at (`ic`, `pc`): packed now if no task has claimed
    /// it, else once the task packing it is done.
    pub(super) fn block<const W: usize>(&self, ic: usize, pc: usize) -> &[f32] {
        let (claim, range, rows, steps) = self.locate::<W>(ic, pc);
        let claimed = claim.compare_exchange(EMPTY, PACKING, Ordering::Acquire, Ordering::Acquire);
        if claimed.is_ok() {
            let _done = Done(claim);
            // SAFETY: the claim makes this call the only one to touch the
            // block until `_done` marks it ready; blocks are disjoint
            // ranges of the buffer (`block_range`), which outlives `self`.
            let dst = unsafe {
                std::slice::from_raw_parts_mut(self.packed.get().add(range.start), range.len())
            };
            pack::<W>(self.micro, self.source, rows, steps, dst);
        } else {
            wait_until_ready(claim);
        }
        // SAFETY: the block is ready (observed with Acquire, or packed just
        // above): nothing writes it again while `self` lives.
        unsafe { std::slice::from_raw_parts(self.packed.get().add(range.start), range.len()) }
    }

    /// The lines to prefetch for the block at (`ic`, `pc`): its packed
    /// form where a task has claimed it, else its source.
    pub(super) fn lines<const W: usize>(&self, ic: usize, pc: usize) -> Lines {
        let (claim, range, rows, steps) = self.locate::<W>(ic, pc);
        if claim.load(Ordering::Relaxed) == EMPTY {
            Lines::of(self.source, rows, steps)
        } else {
            Lines::contiguous(self.packed.get().wrapping_add(range.start), range.len())
        }
    }
}

/// Marks a claimed block ready once its packing ends, or failed if it
/// panicked, so that no task waits on it for ever.
struct Done<'c>(&'c AtomicU8);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        let state = if std::thread::panicking() {
            FAILED
        } else {
            READY
        };
        self.0.store(state, Ordering::Release);
    }
}

/// Waits for another task's packing of a block to end.
fn wait_until_ready(claim: &AtomicU8) {
    crate::parallel::spin_until(|| claim.load(Ordering::Acquire) != PACKING);
    // Only after a panic in our own packing, which rayon re-raises.
    assert_eq!(
        claim.load(Ordering::Acquire),
        READY,
        "the task packing a shared block of A panicked"
    );
}
