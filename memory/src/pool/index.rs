//! A TLSF-style two-level index of free slices: O(1) insert, remove and find.
//!
//! The first level is the power of two of a size (in alignment units), the
//! second splits each power into 16 classes. Bitmaps say which class lists
//! are non-empty, so a find never scans lists it cannot use.

use super::records::{NIL, SliceArena};

const SL_BITS: u32 = 4;
const SL: usize = 1 << SL_BITS;
const FL: usize = 64;
/// Free slices of the request's own class looked at for a better fit.
const BEST_FIT_SCAN: usize = 8;

pub(crate) struct FreeIndex {
    shift: u32,
    fl_bitmap: u64,
    sl_bitmaps: [u32; FL],
    heads: Box<[[u32; SL]; FL]>,
}

fn class(units: u64) -> (usize, usize) {
    if units < SL as u64 {
        (0, units as usize)
    } else {
        let log = 63 - units.leading_zeros();
        (
            (log - SL_BITS + 1) as usize,
            ((units >> (log - SL_BITS)) as usize) & (SL - 1),
        )
    }
}

impl FreeIndex {
    pub(crate) fn new(alignment: u64) -> Self {
        FreeIndex {
            shift: alignment.max(1).trailing_zeros(),
            fl_bitmap: 0,
            sl_bitmaps: [0; FL],
            heads: Box::new([[NIL; SL]; FL]),
        }
    }

    pub(crate) fn clear(&mut self) {
        self.fl_bitmap = 0;
        self.sl_bitmaps = [0; FL];
        *self.heads = [[NIL; SL]; FL];
    }

    pub(crate) fn insert(&mut self, slices: &mut SliceArena, key: u32) {
        let (f, s) = class(slices[key].size >> self.shift);
        let head = self.heads[f][s];
        slices[key].link_prev = NIL;
        slices[key].link_next = head;
        if head != NIL {
            slices[head].link_prev = key;
        }
        self.heads[f][s] = key;
        self.sl_bitmaps[f] |= 1 << s;
        self.fl_bitmap |= 1 << f;
    }

    pub(crate) fn remove(&mut self, slices: &mut SliceArena, key: u32) {
        let (prev, next) = (slices[key].link_prev, slices[key].link_next);
        if next != NIL {
            slices[next].link_prev = prev;
        }
        if prev != NIL {
            slices[prev].link_next = next;
        } else {
            let (f, s) = class(slices[key].size >> self.shift);
            debug_assert_eq!(self.heads[f][s], key, "a free slice heads its class list");
            self.heads[f][s] = next;
            if next == NIL {
                self.sl_bitmaps[f] &= !(1 << s);
                if self.sl_bitmaps[f] == 0 {
                    self.fl_bitmap &= !(1 << f);
                }
            }
        }
        slices[key].link_prev = NIL;
        slices[key].link_next = NIL;
    }

    /// A free slice of at least `size` bytes: the best of a few in the
    /// request's own class, else the first of the next non-empty class
    /// (every slice there fits).
    pub(crate) fn find(&self, slices: &SliceArena, size: u64) -> Option<u32> {
        let (f, s) = class(size >> self.shift);
        let mut best = NIL;
        let mut best_size = u64::MAX;
        let mut key = self.heads[f][s];
        for _ in 0..BEST_FIT_SCAN {
            if key == NIL {
                break;
            }
            let candidate = slices[key].size;
            if candidate >= size && candidate < best_size {
                best = key;
                best_size = candidate;
                if candidate == size {
                    break;
                }
            }
            key = slices[key].link_next;
        }
        if best != NIL {
            return Some(best);
        }
        let (f, s) = if s + 1 < SL { (f, s + 1) } else { (f + 1, 0) };
        let (f, s) = self.first_class_from(f, s)?;
        Some(self.heads[f][s])
    }

    fn first_class_from(&self, f: usize, s: usize) -> Option<(usize, usize)> {
        if f >= FL {
            return None;
        }
        let sl_map = self.sl_bitmaps[f] & (u32::MAX << s);
        if sl_map != 0 {
            return Some((f, sl_map.trailing_zeros() as usize));
        }
        let fl_map = if f + 1 >= FL {
            0
        } else {
            self.fl_bitmap & (u64::MAX << (f + 1))
        };
        if fl_map == 0 {
            return None;
        }
        let f = fl_map.trailing_zeros() as usize;
        Some((f, self.sl_bitmaps[f].trailing_zeros() as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_grow_monotonically_with_size() {
        let mut last = (0, 0);
        for units in 1..100_000u64 {
            let c = class(units);
            assert!(c >= last, "class of {units} went down");
            last = c;
        }
        assert!(class(u64::MAX).0 < FL);
    }
}
