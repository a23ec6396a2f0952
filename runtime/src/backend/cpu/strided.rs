//! Strided copies on the CPU: any rank up to [`MAX_STRIDED_RANK`].

use crate::backend::StrideLayout;
use crate::backend::stream::KernelFault;

/// The highest rank the CPU copies; higher ranks answer `UnsupportedStrides`.
pub const MAX_STRIDED_RANK: usize = 6;

/// Whether the CPU runs this layout.
pub(super) fn supports(layout: &StrideLayout) -> bool {
    layout.shape.len() <= MAX_STRIDED_RANK
        && layout.source_strides.len() == layout.shape.len()
        && layout.target_strides.len() == layout.shape.len()
}

/// Copies every element of `layout` from `source` to `target`, both
/// addressed from their element zero.
pub(super) fn strided_copy(
    source: &[u8],
    target: &mut [u8],
    layout: &StrideLayout,
) -> Result<(), KernelFault> {
    if !supports(layout) {
        return Err(KernelFault::Malformed("unsupported stride layout".into()));
    }
    if layout.shape.contains(&0) {
        return Ok(());
    }
    let element = to_usize(layout.element_size)?;
    let rank = layout.shape.len();
    let mut index = [0u64; MAX_STRIDED_RANK];
    loop {
        let source_at = offset(&index[..rank], &layout.source_strides, element)?;
        let target_at = offset(&index[..rank], &layout.target_strides, element)?;
        let from = source_at
            .checked_add(element)
            .and_then(|end| source.get(source_at..end))
            .ok_or_else(|| out_of_range("source"))?;
        target_at
            .checked_add(element)
            .and_then(|end| target.get_mut(target_at..end))
            .ok_or_else(|| out_of_range("target"))?
            .copy_from_slice(from);
        // Odometer step: the last dimension moves fastest.
        let mut dimension = rank;
        loop {
            if dimension == 0 {
                return Ok(());
            }
            dimension -= 1;
            index[dimension] += 1;
            if layout
                .shape
                .get(dimension)
                .is_some_and(|n| index[dimension] < *n)
            {
                break;
            }
            index[dimension] = 0;
        }
    }
}

fn offset(index: &[u64], strides: &[u64], element: usize) -> Result<usize, KernelFault> {
    let mut elements = 0u64;
    for (i, stride) in index.iter().zip(strides) {
        elements = i
            .checked_mul(*stride)
            .and_then(|step| elements.checked_add(step))
            .ok_or_else(|| out_of_range("offset"))?;
    }
    to_usize(elements)?
        .checked_mul(element)
        .ok_or_else(|| out_of_range("offset"))
}

fn to_usize(value: u64) -> Result<usize, KernelFault> {
    usize::try_from(value).map_err(|_| out_of_range("value"))
}

fn out_of_range(what: &str) -> KernelFault {
    KernelFault::Malformed(format!("strided copy {what} out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transpose_moves_every_element() {
        // 2x3 row-major source into a 3x2 row-major target.
        let source: Vec<u8> = (0..6).collect();
        let mut target = vec![0u8; 6];
        let layout = StrideLayout {
            shape: vec![2, 3],
            source_strides: vec![3, 1],
            target_strides: vec![1, 2],
            element_size: 1,
        };
        assert!(strided_copy(&source, &mut target, &layout).is_ok());
        assert_eq!(target, vec![0, 3, 1, 4, 2, 5]);
    }

    #[test]
    fn a_rank_beyond_the_maximum_is_not_supported() {
        let rank = MAX_STRIDED_RANK + 1;
        let layout = StrideLayout {
            shape: vec![1; rank],
            source_strides: vec![1; rank],
            target_strides: vec![1; rank],
            element_size: 4,
        };
        assert!(!supports(&layout));
    }

    #[test]
    fn an_out_of_range_view_is_a_fault_not_a_panic() {
        let layout = StrideLayout {
            shape: vec![4],
            source_strides: vec![1],
            target_strides: vec![1],
            element_size: 4,
        };
        assert!(strided_copy(&[0; 8], &mut [0; 16], &layout).is_err());
    }
}
