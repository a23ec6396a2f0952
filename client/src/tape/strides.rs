//! Shapes and strides of the broadcasting and view operations: PyTorch's
//! broadcasting rule, and the strided walks (`BroadcastSpec`, `SumSpec`)
//! that run them. Pure functions over shapes; every tensor on a tape is
//! contiguous, row-major.

use cistern_runtime::{BinaryOp, BroadcastSpec, MAX_RANK, SumSpec};

use crate::error::AutodiffError;

/// The row-major strides of `shape`, in elements.
pub(super) fn contiguous(shape: &[usize]) -> Vec<u64> {
    let mut strides = vec![0u64; shape.len()];
    let mut step = 1u64;
    for (stride, &n) in strides.iter_mut().zip(shape).rev() {
        *stride = step;
        step = step.saturating_mul(n as u64);
    }
    strides
}

/// `InvalidArgument` unless `shape` has at most [`MAX_RANK`] dimensions.
pub(super) fn check_rank(op: &str, shape: &[usize]) -> Result<(), AutodiffError> {
    if shape.len() > MAX_RANK {
        return Err(AutodiffError::InvalidArgument(format!(
            "{op}: a tensor of shape {shape:?} has {} dimensions; at most {MAX_RANK}",
            shape.len()
        )));
    }
    Ok(())
}

/// The shape `a` and `b` broadcast to, by PyTorch's rule: aligned at
/// their last dimensions, each pair equal or one of them 1; missing
/// leading dimensions are 1. `InvalidArgument` naming both shapes else.
pub(super) fn broadcast_shape(
    op: &str,
    a: &[usize],
    b: &[usize],
) -> Result<Vec<usize>, AutodiffError> {
    if a == b {
        // The element-wise kernel runs equal shapes of any rank.
        return Ok(a.to_vec());
    }
    let rank = a.len().max(b.len());
    let dim = |shape: &[usize], d: usize| {
        (d + shape.len())
            .checked_sub(rank)
            .map_or(1, |index| shape[index])
    };
    let mut out = Vec::with_capacity(rank);
    for d in 0..rank {
        let (x, y) = (dim(a, d), dim(b, d));
        out.push(match (x, y) {
            _ if x == y => x,
            (1, _) => y,
            (_, 1) => x,
            _ => {
                return Err(AutodiffError::InvalidArgument(format!(
                    "{op}: shapes {a:?} and {b:?} do not broadcast: dimension {} is {x} \
                     against {y} (each pair must be equal or one of them 1)",
                    d as isize - rank as isize
                )));
            }
        });
    }
    check_rank(op, &out)?;
    Ok(out)
}

/// The strides through which a contiguous tensor of `shape` is read along
/// each dimension of `out` (which it broadcasts to): its own stride, or 0
/// where it is broadcast (a missing or size-1 dimension).
pub(super) fn broadcast_strides(shape: &[usize], out: &[usize]) -> Vec<u64> {
    let own = contiguous(shape);
    let lead = out.len() - shape.len();
    (0..out.len())
        .map(|d| match d.checked_sub(lead) {
            Some(index) if shape[index] == out[d] && out[d] != 1 => own[index],
            _ => 0,
        })
        .collect()
}

/// `a op b` over `out`, the shape both broadcast to.
pub(super) fn broadcast_spec(
    op: BinaryOp,
    a: &[usize],
    b: &[usize],
    out: &[usize],
) -> BroadcastSpec {
    BroadcastSpec {
        op,
        shape: out.iter().map(|&n| n as u64).collect(),
        a_strides: broadcast_strides(a, out),
        b_strides: broadcast_strides(b, out),
    }
}

/// The sum of a contiguous tensor of shape `from` down to `to` (a shape
/// that broadcasts to `from`), times `scale`: what a broadcast operand's
/// gradient is made of.
pub(super) fn sum_to_spec(from: &[usize], to: &[usize], scale: f32) -> SumSpec {
    let own = contiguous(from);
    let lead = from.len() - to.len();
    let mut spec = SumSpec {
        shape: Vec::new(),
        strides: Vec::new(),
        summed: Vec::new(),
        summed_strides: Vec::new(),
        scale,
    };
    for (d, &n) in from.iter().enumerate() {
        let kept = d.checked_sub(lead).is_some_and(|index| to[index] == n);
        if n == 1 {
            continue;
        }
        if kept {
            spec.shape.push(n as u64);
            spec.strides.push(own[d]);
        } else {
            spec.summed.push(n as u64);
            spec.summed_strides.push(own[d]);
        }
    }
    spec
}

/// The sum of a contiguous tensor of `shape` over the dimensions `dims`
/// (each listed once, checked) times `scale`: its output is `shape` with
/// those dimensions 1, row-major.
pub(super) fn sum_dims_spec(shape: &[usize], dims: &[usize], scale: f32) -> SumSpec {
    let own = contiguous(shape);
    let mut spec = SumSpec {
        shape: Vec::new(),
        strides: Vec::new(),
        summed: Vec::new(),
        summed_strides: Vec::new(),
        scale,
    };
    for (d, &n) in shape.iter().enumerate() {
        if n == 1 {
            continue;
        }
        if dims.contains(&d) {
            spec.summed.push(n as u64);
            spec.summed_strides.push(own[d]);
        } else {
            spec.shape.push(n as u64);
            spec.strides.push(own[d]);
        }
    }
    spec
}

/// The copy of a contiguous tensor of `shape` with its dimensions
/// reordered: output dimension `i` is input dimension `order[i]`.
pub(super) fn permute_spec(shape: &[usize], order: &[usize]) -> SumSpec {
    let own = contiguous(shape);
    SumSpec {
        shape: order.iter().map(|&d| shape[d] as u64).collect(),
        strides: order.iter().map(|&d| own[d]).collect(),
        summed: Vec::new(),
        summed_strides: Vec::new(),
        scale: 1.0,
    }
}

/// The expansion of a contiguous tensor of `shape` (which broadcasts to
/// `out`) to `out`, times `scale`: the backward of a sum.
pub(super) fn expand_spec(shape: &[usize], out: &[usize], scale: f32) -> SumSpec {
    SumSpec {
        shape: out.iter().map(|&n| n as u64).collect(),
        strides: broadcast_strides(shape, out),
        summed: Vec::new(),
        summed_strides: Vec::new(),
        scale,
    }
}

/// `dim` as an index into a shape of `rank` dimensions, PyTorch's way
/// (negative counts from the end); `InvalidArgument` out of range.
pub(super) fn axis(op: &str, dim: isize, rank: usize) -> Result<usize, AutodiffError> {
    let resolved = if dim < 0 {
        dim.checked_add(rank as isize)
    } else {
        Some(dim)
    };
    match resolved {
        Some(d) if d >= 0 && (d as usize) < rank => Ok(d as usize),
        _ => Err(AutodiffError::InvalidArgument(format!(
            "{op}: dimension {dim} is out of range for a tensor of {rank} dimensions"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_broadcast_over_leading_and_size_one_dimensions() {
        assert_eq!(broadcast_shape("add", &[2, 3, 4], &[4]).unwrap(), [2, 3, 4]);
        assert_eq!(broadcast_shape("add", &[3, 1], &[1, 5]).unwrap(), [3, 5]);
        assert_eq!(broadcast_shape("add", &[], &[2, 2]).unwrap(), [2, 2]);
        let refused = broadcast_shape("mul", &[2, 3], &[4]).unwrap_err();
        let message = refused.to_string();
        assert!(
            message.contains("[2, 3]") && message.contains("[4]"),
            "{message}"
        );
    }

    #[test]
    fn a_broadcast_operand_is_read_with_zero_strides() {
        assert_eq!(broadcast_strides(&[3, 1], &[2, 3, 5]), [0, 1, 0]);
        assert_eq!(broadcast_strides(&[2, 3, 5], &[2, 3, 5]), [15, 5, 1]);
    }

    #[test]
    fn a_sum_to_a_broadcast_shape_sums_the_broadcast_dimensions() {
        let spec = sum_to_spec(&[2, 3, 5], &[3, 1], 1.0);
        assert_eq!((spec.shape, spec.strides), (vec![3], vec![5]));
        assert_eq!(
            (spec.summed, spec.summed_strides),
            (vec![2, 5], vec![15, 1])
        );
    }

    #[test]
    fn negative_dimensions_count_from_the_end() {
        assert_eq!(axis("sum", -1, 3).unwrap(), 2);
        assert!(axis("sum", 3, 3).is_err());
        assert!(axis("sum", -4, 3).is_err());
    }
}
