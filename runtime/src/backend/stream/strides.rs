//! The strided layouts a GPU backend's strided-copy kernel runs: one
//! predicate for wgpu and CUDA, so the two refuse the same patterns.

use crate::backend::StrideLayout;

/// The highest rank of a strided copy on a GPU backend; higher ranks
/// answer `UnsupportedStrides`.
pub const GPU_MAX_STRIDED_RANK: usize = 6;

/// Whether a GPU strided-copy kernel runs this layout: at most
/// [`GPU_MAX_STRIDED_RANK`] dimensions, a stride per dimension on each
/// side, and whole 32-bit words per element.
pub fn gpu_supports_strides(layout: &StrideLayout) -> bool {
    layout.shape.len() <= GPU_MAX_STRIDED_RANK
        && layout.source_strides.len() == layout.shape.len()
        && layout.target_strides.len() == layout.shape.len()
        && layout.element_size % 4 == 0
        && layout.element_size > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(rank: usize, element_size: u64) -> StrideLayout {
        StrideLayout {
            shape: vec![2; rank],
            source_strides: vec![1; rank],
            target_strides: vec![1; rank],
            element_size,
        }
    }

    #[test]
    fn whole_words_up_to_the_maximum_rank_are_supported() {
        assert!(gpu_supports_strides(&layout(0, 4)));
        assert!(gpu_supports_strides(&layout(GPU_MAX_STRIDED_RANK, 12)));
    }

    #[test]
    fn a_higher_rank_a_partial_word_or_a_missing_stride_is_not() {
        assert!(!gpu_supports_strides(&layout(GPU_MAX_STRIDED_RANK + 1, 4)));
        assert!(!gpu_supports_strides(&layout(2, 2)));
        assert!(!gpu_supports_strides(&layout(2, 6)));
        assert!(!gpu_supports_strides(&layout(2, 0)));
        let mut short = layout(2, 4);
        short.target_strides.pop();
        assert!(!gpu_supports_strides(&short));
    }
}
