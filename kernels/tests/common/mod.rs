//! Helpers shared by the kernel tests (their seeded data comes from
//! `cistern_memory::SplitMix64`).
#![allow(dead_code)]

use cistern_kernels::Segment;

/// Segments of the given lengths, `gap` unused elements between neighbours;
/// returns them with the buffer length.
pub fn segments(lens: &[usize], gap: usize) -> (Vec<Segment>, usize) {
    let mut offset = 0;
    let mut out = Vec::with_capacity(lens.len());
    for &len in lens {
        out.push(Segment::new(offset, len));
        offset += len + gap;
    }
    (out, offset)
}
