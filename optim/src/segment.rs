//! Segments: the per-tensor pieces of one concatenated parameter buffer.

use serde::{Deserialize, Serialize};

use crate::OptimError;

/// One parameter tensor inside a concatenated buffer: elements
/// `offset..offset + len`. Elements outside every segment are never touched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Segment {
    /// Index of the tensor's first element in the buffer.
    pub offset: usize,
    /// Number of elements of the tensor (may be 0).
    pub len: usize,
}

impl Segment {
    /// A segment of `len` elements starting at `offset`.
    pub const fn new(offset: usize, len: usize) -> Self {
        Self { offset, len }
    }

    /// One past the last element, or `None` when that overflows `usize`.
    pub const fn end(&self) -> Option<usize> {
        self.offset.checked_add(self.len)
    }
}

/// Checks that `segments` are sorted by offset, do not overlap and lie inside
/// a buffer of `total` elements. Every update requires this, because it lets
/// the buffers be split into disjoint pieces and updated in parallel.
pub fn validate_segments(segments: &[Segment], total: usize) -> Result<(), OptimError> {
    let mut previous_end = 0usize;
    for (index, segment) in segments.iter().enumerate() {
        let field = || format!("segments[{index}]");
        let end = segment
            .end()
            .ok_or_else(|| OptimError::invalid(field(), "offset + len overflows"))?;
        if segment.offset < previous_end {
            return Err(OptimError::invalid(
                field(),
                format!(
                    "starts at {} before the previous segment ends at {previous_end}: \
                     segments must be sorted and disjoint",
                    segment.offset
                ),
            ));
        }
        if end > total {
            return Err(OptimError::invalid(
                field(),
                format!("ends at {end}, past the buffer of {total} elements"),
            ));
        }
        previous_end = end;
    }
    Ok(())
}
