//! Cutting the segment table into disjoint pieces of the buffers, so rayon
//! can update them in parallel without unsafe code.

use std::ops::Range;

use cistern_optim::Segment;

use crate::KernelError;
use crate::parallel::PIECE;

/// Ranges covering every segment: adjacent segments are merged (elementwise
/// updates do not care where one tensor ends), then cut into pieces of at
/// most [`PIECE`] elements.
pub(crate) fn element_pieces(segments: &[Segment]) -> Vec<Range<usize>> {
    let mut runs: Vec<Range<usize>> = Vec::new();
    for s in segments.iter().filter(|s| s.len > 0) {
        let range = s.offset..s.offset + s.len;
        match runs.last_mut() {
            Some(last) if last.end == range.start => last.end = range.end,
            _ => runs.push(range),
        }
    }
    runs.into_iter().flat_map(cut).collect()
}

/// Pieces of at most [`PIECE`] elements, each inside one segment and tagged
/// with that segment's index; empty segments have none.
pub(crate) fn segment_pieces(segments: &[Segment]) -> Vec<(usize, Range<usize>)> {
    segments
        .iter()
        .enumerate()
        .flat_map(|(i, s)| cut(s.offset..s.offset + s.len).map(move |r| (i, r)))
        .collect()
}

fn cut(range: Range<usize>) -> impl Iterator<Item = Range<usize>> {
    let end = range.end;
    range
        .clone()
        .step_by(PIECE)
        .map(move |start| start..(start + PIECE).min(end))
}

/// Mutable views of `buf` at `ranges`, which must be sorted and disjoint.
pub(crate) fn split_mut<'a>(
    buf: &'a mut [f32],
    ranges: &[Range<usize>],
) -> Result<Vec<&'a mut [f32]>, KernelError> {
    let out_of_bounds = || KernelError::invalid("segments", "a piece lies outside the buffer");
    let mut rest = buf;
    let mut position = 0;
    let mut views = Vec::with_capacity(ranges.len());
    for range in ranges {
        let skip = range
            .start
            .checked_sub(position)
            .ok_or_else(out_of_bounds)?;
        let (_, tail) = std::mem::take(&mut rest)
            .split_at_mut_checked(skip)
            .ok_or_else(out_of_bounds)?;
        let (view, tail) = tail
            .split_at_mut_checked(range.len())
            .ok_or_else(out_of_bounds)?;
        views.push(view);
        rest = tail;
        position = range.end;
    }
    Ok(views)
}

/// Like [`split_mut`] for a buffer that may be absent: `None` per piece then.
pub(crate) fn split_optional<'a>(
    buf: Option<&'a mut [f32]>,
    ranges: &[Range<usize>],
) -> Result<Vec<Option<&'a mut [f32]>>, KernelError> {
    Ok(match buf {
        Some(buf) => split_mut(buf, ranges)?.into_iter().map(Some).collect(),
        None => ranges.iter().map(|_| None).collect(),
    })
}

/// Shared views of `buf` at `ranges` (already known to be inside it).
pub(crate) fn split<'a>(buf: &'a [f32], ranges: &[Range<usize>]) -> Vec<&'a [f32]> {
    ranges
        .iter()
        .map(|r| buf.get(r.clone()).unwrap_or_default())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adjacent_segments_merge_and_long_runs_are_cut() {
        let segments = [
            Segment::new(0, 3),
            Segment::new(3, PIECE),
            Segment::new(PIECE + 10, 0),
            Segment::new(PIECE + 10, 2),
        ];
        let pieces = element_pieces(&segments);
        assert_eq!(
            pieces,
            vec![0..PIECE, PIECE..PIECE + 3, PIECE + 10..PIECE + 12]
        );
    }

    #[test]
    fn split_mut_returns_the_requested_views() {
        let mut buf: Vec<f32> = (0..10).map(|i| i as f32).collect();
        let views = split_mut(&mut buf, &[1..3, 5..6, 9..10]).unwrap();
        assert_eq!(views.len(), 3);
        assert_eq!(&*views[0], &[1.0, 2.0]);
        assert_eq!(&*views[1], &[5.0]);
        assert_eq!(&*views[2], &[9.0]);
        assert!(split_mut(&mut buf, std::slice::from_ref(&(5..12))).is_err());
        assert!(split_mut(&mut buf, &[5..6, 2..3]).is_err());
    }
}
