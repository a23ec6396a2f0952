//! Fetching the next block's operand into cache while the current block
//! computes, a few lines per tile, so that packing it reads from L2
//! rather than from memory: a packing pass on its own is memory-bound,
//! and on a shared host its operand is rarely still in L3.

use std::ops::Range;

use super::pack::Operand;

/// Floats in a 64-byte cache line.
const LINE: usize = 16;

/// A cursor over the cache lines of a region: `spans` runs of `span_len`
/// adjacent floats, `span_stride` apart, from `base`. The addresses are
/// only prefetched, never read.
pub(super) struct Lines {
    base: *const f32,
    span_stride: usize,
    span_len: usize,
    spans: usize,
    span: usize,
    offset: usize,
}

impl Lines {
    /// Nothing to fetch.
    pub(super) fn none() -> Lines {
        Lines::contiguous(std::ptr::null(), 0)
    }

    /// `len` adjacent floats from `base`.
    pub(super) fn contiguous(base: *const f32, len: usize) -> Lines {
        Lines {
            base,
            span_stride: 0,
            span_len: len,
            spans: usize::from(len > 0),
            span: 0,
            offset: 0,
        }
    }

    /// `lanes` × `steps` of `src`, span by span along whichever of the two
    /// is adjacent in memory (none where neither is).
    pub(super) fn of(src: &Operand, lanes: Range<usize>, steps: Range<usize>) -> Lines {
        let first = src.at + lanes.start * src.lane_stride + steps.start * src.step_stride;
        let (span_stride, span_len, spans) = if src.step_stride == 1 {
            (src.lane_stride, steps.len(), lanes.len())
        } else if src.lane_stride == 1 {
            (src.step_stride, lanes.len(), steps.len())
        } else {
            return Lines::none();
        };
        Lines {
            base: src.data.as_ptr().wrapping_add(first),
            span_stride,
            span_len,
            spans: if span_len == 0 { 0 } else { spans },
            span: 0,
            offset: 0,
        }
    }

    /// The lines left to fetch, counting each span's from its start.
    pub(super) fn len(&self) -> usize {
        (self.spans - self.span) * self.span_len.div_ceil(LINE)
    }

    /// The lines per call that fetch all of them in `calls` calls.
    pub(super) fn rate(&self, calls: usize) -> usize {
        self.len().div_ceil(calls.max(1))
    }

    /// Fetches the next `lines` lines (fewer at the end).
    #[inline]
    pub(super) fn advance(&mut self, lines: usize) {
        for _ in 0..lines {
            if self.span >= self.spans {
                return;
            }
            let at = self.span * self.span_stride + self.offset;
            fetch(self.base.wrapping_add(at));
            self.offset += LINE;
            if self.offset >= self.span_len {
                self.offset = 0;
                self.span += 1;
            }
        }
    }
}

/// Asks for the line holding `ptr` in the caches (L2 and up).
#[inline(always)]
fn fetch(ptr: *const f32) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults and reads nothing the program sees,
    // whatever the address.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T1, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T1>(ptr.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ptr;
}
