//! Strided copies on CUDA: a layout as `cistern_strided_copy`'s arguments
//! (`kernels/src/cuda/strided.cu`). The shape and both strides are padded
//! at the front to [`GPU_MAX_STRIDED_RANK`] dimensions (size 1, stride 0);
//! the kernel copies 32-bit words, or bytes where either view is not
//! word-aligned, since a misaligned access would be a sticky fault.

use std::iter::repeat_n;

use super::launch::{Arg, CudaSlice};
use crate::backend::StrideLayout;
use crate::backend::stream::{GPU_MAX_STRIDED_RANK, KernelFault, gpu_supports_strides};

/// The strided-copy kernel's name in the module.
pub(super) const KERNEL: &str = "cistern_strided_copy";

/// One strided copy as a launch of [`KERNEL`].
#[derive(Debug, PartialEq)]
pub(super) struct StridedLaunch {
    /// The kernel's arguments, in its parameters' order.
    pub(super) args: Vec<Arg>,
    /// The units copied: the length the grid strides over.
    pub(super) units: u64,
}

/// `layout` copied from `source` to `target`, each addressed from its
/// element zero, as a launch; `None` when it copies nothing. A layout the
/// GPU predicate refuses, or a view past its slice, is `Malformed`: the
/// server's checks make both impossible.
pub(super) fn strided_launch(
    source: &CudaSlice,
    target: &CudaSlice,
    layout: &StrideLayout,
) -> Result<Option<StridedLaunch>, KernelFault> {
    if !gpu_supports_strides(layout) {
        return Err(malformed("unsupported stride layout"));
    }
    let elements = layout
        .shape
        .iter()
        .try_fold(1u64, |count, n| count.checked_mul(*n))
        .ok_or_else(|| malformed("strided copy shape overflows"))?;
    if elements == 0 {
        return Ok(None);
    }
    check_span(source, &layout.source_strides, layout, "source")?;
    check_span(target, &layout.target_strides, layout, "target")?;
    let (unit_bytes, unit) = if source.address % 4 == 0 && target.address % 4 == 0 {
        (4, 4)
    } else {
        (1, 1)
    };
    let per_element = layout.element_size / unit;
    let units = elements
        .checked_mul(per_element)
        .ok_or_else(|| malformed("strided copy too long"))?;
    let pad = GPU_MAX_STRIDED_RANK.saturating_sub(layout.shape.len());
    let padded = |values: &[u64], fill: u64| {
        repeat_n(fill, pad)
            .chain(values.iter().copied())
            .map(Arg::U64)
            .collect::<Vec<_>>()
    };
    let mut args = vec![
        Arg::Pointer(source.address),
        Arg::Pointer(target.address),
        Arg::I32(unit_bytes),
    ];
    args.extend(padded(&layout.shape, 1));
    args.extend(padded(&layout.source_strides, 0));
    args.extend(padded(&layout.target_strides, 0));
    args.extend([Arg::U64(per_element), Arg::U64(units)]);
    Ok(Some(StridedLaunch { args, units }))
}

/// Checks that the view along `strides`, element zero to the end of its
/// last element, lies inside `slice` (every dimension non-empty).
fn check_span(
    slice: &CudaSlice,
    strides: &[u64],
    layout: &StrideLayout,
    side: &str,
) -> Result<(), KernelFault> {
    let last = layout
        .shape
        .iter()
        .zip(strides)
        .try_fold(0u64, |at, (n, stride)| {
            n.saturating_sub(1)
                .checked_mul(*stride)
                .and_then(|step| at.checked_add(step))
        });
    let end = last
        .and_then(|last| last.checked_add(1))
        .and_then(|count| count.checked_mul(layout.element_size));
    match end {
        Some(end) if end <= slice.len => Ok(()),
        _ => Err(malformed(&format!(
            "strided copy {side} view past its slice"
        ))),
    }
}

fn malformed(message: &str) -> KernelFault {
    KernelFault::Malformed(message.to_string())
}

#[cfg(test)]
mod tests {
    use super::super::launch::{BLOCK, MAX_GRID, grid_of};
    use super::super::signature::{parameters, ptx_type};
    use super::*;

    fn slice(address: u64, len: u64) -> CudaSlice {
        CudaSlice { address, len }
    }

    /// A 3×5 row-major matrix into a 5×3 one, of `element_size`-byte elements.
    fn transpose(element_size: u64) -> StrideLayout {
        StrideLayout {
            shape: vec![3, 5],
            source_strides: vec![5, 1],
            target_strides: vec![1, 3],
            element_size,
        }
    }

    fn launch_of(source: CudaSlice, target: CudaSlice, layout: &StrideLayout) -> StridedLaunch {
        match strided_launch(&source, &target, layout) {
            Ok(Some(launch)) => launch,
            other => panic!("expected a launch, got {other:?}"),
        }
    }

    #[test]
    fn a_transpose_pads_its_shape_and_strides_at_the_front() {
        let launch = launch_of(slice(0x1000, 60), slice(0x2000, 60), &transpose(4));
        let u = Arg::U64;
        let want = vec![
            Arg::Pointer(0x1000),
            Arg::Pointer(0x2000),
            Arg::I32(4),
            // shape
            u(1),
            u(1),
            u(1),
            u(1),
            u(3),
            u(5),
            // source strides
            u(0),
            u(0),
            u(0),
            u(0),
            u(5),
            u(1),
            // target strides
            u(0),
            u(0),
            u(0),
            u(0),
            u(1),
            u(3),
            // words per element, words
            u(1),
            u(15),
        ];
        assert_eq!(launch.args, want);
        assert_eq!(launch.units, 15);
    }

    #[test]
    fn an_element_of_several_words_is_copied_word_by_word() {
        let launch = launch_of(slice(0x1000, 180), slice(0x2000, 180), &transpose(12));
        assert_eq!(launch.args[2], Arg::I32(4));
        assert_eq!(launch.args[21], Arg::U64(3));
        assert_eq!(launch.units, 45);
        assert_eq!(launch.args.last(), Some(&Arg::U64(45)));
    }

    #[test]
    fn a_view_off_a_word_boundary_is_copied_byte_by_byte() {
        let launch = launch_of(slice(0x1002, 60), slice(0x2000, 60), &transpose(4));
        assert_eq!(launch.args[2], Arg::I32(1));
        assert_eq!(launch.args[21], Arg::U64(4));
        assert_eq!(launch.units, 60);
    }

    #[test]
    fn a_full_rank_layout_is_passed_as_it_is() {
        let layout = StrideLayout {
            shape: vec![2; GPU_MAX_STRIDED_RANK],
            source_strides: (0..6).rev().map(|k| 1 << k).collect(),
            target_strides: (0..6).map(|k| 1 << k).collect(),
            element_size: 4,
        };
        let launch = launch_of(slice(0, 256), slice(256, 256), &layout);
        let values = |at: usize| -> Vec<Arg> { launch.args[at..at + 6].to_vec() };
        assert_eq!(values(3), vec![Arg::U64(2); 6]);
        let source: Vec<Arg> = layout.source_strides.iter().map(|s| Arg::U64(*s)).collect();
        let target: Vec<Arg> = layout.target_strides.iter().map(|s| Arg::U64(*s)).collect();
        assert_eq!(values(9), source);
        assert_eq!(values(15), target);
        assert_eq!(launch.units, 64);
    }

    #[test]
    fn a_rank_zero_copy_moves_its_one_element() {
        let layout = StrideLayout {
            shape: vec![],
            source_strides: vec![],
            target_strides: vec![],
            element_size: 8,
        };
        let launch = launch_of(slice(0, 8), slice(64, 8), &layout);
        assert_eq!(launch.args[3..9].to_vec(), vec![Arg::U64(1); 6]);
        assert_eq!(launch.units, 2);
    }

    #[test]
    fn an_empty_shape_launches_nothing() {
        let mut layout = transpose(4);
        layout.shape = vec![3, 0];
        assert_eq!(
            strided_launch(&slice(0, 0), &slice(0, 0), &layout),
            Ok(None)
        );
    }

    #[test]
    fn a_view_past_its_slice_or_a_partial_word_is_malformed_not_launched() {
        let short = strided_launch(&slice(0, 56), &slice(64, 60), &transpose(4));
        assert!(matches!(short, Err(KernelFault::Malformed(_))));
        let short = strided_launch(&slice(0, 60), &slice(64, 59), &transpose(4));
        assert!(matches!(short, Err(KernelFault::Malformed(_))));
        let halves = strided_launch(&slice(0, 30), &slice(64, 30), &transpose(2));
        assert!(matches!(halves, Err(KernelFault::Malformed(_))));
    }

    #[test]
    fn the_grid_covers_every_word_up_to_the_cap() {
        let blocks = |units: u64| grid_of(units.div_ceil(u64::from(BLOCK)));
        let small = launch_of(slice(0, 60), slice(64, 60), &transpose(4));
        assert_eq!(blocks(small.units), 1);
        // 1024×1024 of 16-byte elements: 4 Mi words, past the cap.
        let layout = StrideLayout {
            shape: vec![1024, 1024],
            source_strides: vec![1024, 1],
            target_strides: vec![1, 1024],
            element_size: 16,
        };
        let len = 1024 * 1024 * 16;
        let large = launch_of(slice(0, len), slice(len, len), &layout);
        assert_eq!(large.units, 4 << 20);
        assert_eq!(blocks(large.units), MAX_GRID as u32);
        assert_eq!(blocks(1000 * u64::from(BLOCK) + 1), 1001);
    }

    #[test]
    fn the_strided_copy_kernel_takes_the_arguments_the_host_packs_for_it() {
        let Some(ptx) = cistern_kernels::cuda::prebuilt_ptx() else {
            eprintln!("cuda tests: SKIPPING the strided copy's signature: no build-time PTX");
            return;
        };
        let launch = launch_of(slice(0, 60), slice(64, 60), &transpose(4));
        let want: Vec<&str> = launch.args.iter().map(ptx_type).collect();
        assert_eq!(parameters(ptx, KERNEL), want);
    }
}
