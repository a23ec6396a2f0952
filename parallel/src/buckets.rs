//! Buckets: the staged gradients cut into the runs that are reduced one
//! after another, as PyTorch DDP cuts them: whole slots, in reverse
//! registration order (the backward stages the last layers first), the
//! first bucket about 1 MiB and the rest about 25 MiB.

use std::ops::Range;

/// The first bucket's size: small, so its reduction starts early.
pub const FIRST_BUCKET_BYTES: usize = 1 << 20;

/// Every later bucket's size (DDP's `bucket_cap_mb` default).
pub const BUCKET_BYTES: usize = 25 << 20;

/// The buckets of slots at `slots` (contiguous ranges of `f32`s, in
/// registration order, tiling `0..total`): each a contiguous range of whole
/// slots, in the order they are reduced (the last slots first). A bucket
/// closes once it holds at least its cap; a slot larger than the cap is a
/// bucket of its own.
pub fn plan(slots: &[Range<usize>]) -> Vec<Range<usize>> {
    let mut buckets = Vec::new();
    let mut open: Option<Range<usize>> = None;
    for slot in slots.iter().rev() {
        let bucket = match open.take() {
            Some(bucket) => slot.start..bucket.end,
            None => slot.clone(),
        };
        let cap = match buckets.is_empty() {
            true => FIRST_BUCKET_BYTES,
            false => BUCKET_BYTES,
        };
        if bucket.len() * 4 >= cap {
            buckets.push(bucket);
        } else {
            open = Some(bucket);
        }
    }
    buckets.extend(open);
    buckets
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB_FLOATS: usize = (1 << 20) / 4;

    fn slots(lens: &[usize]) -> Vec<Range<usize>> {
        let mut start = 0;
        lens.iter()
            .map(|&len| {
                let slot = start..start + len;
                start += len;
                slot
            })
            .collect()
    }

    #[test]
    fn buckets_run_from_the_last_slot_with_a_small_first_one() {
        // The bench MLP: 784-1024-1024-10 with biases.
        let slots = slots(&[1024 * 784, 1024, 1024 * 1024, 1024, 10 * 1024, 10]);
        let buckets = plan(&slots);
        assert_eq!(buckets.len(), 2, "{buckets:?}");
        assert_eq!(buckets[0], slots[2].start..slots[5].end);
        assert_eq!(buckets[1], 0..slots[1].end);
    }

    #[test]
    fn buckets_tile_every_slot_once_in_reverse_order() {
        let lens = [
            3,
            MIB_FLOATS / 2,
            7,
            30 * MIB_FLOATS,
            5,
            20 * MIB_FLOATS,
            11,
        ];
        let slots = slots(&lens);
        let buckets = plan(&slots);
        let total: usize = lens.iter().sum();
        let mut end = total;
        for bucket in &buckets {
            assert_eq!(bucket.end, end, "{buckets:?}");
            assert!(slots.iter().any(|slot| slot.start == bucket.start));
            end = bucket.start;
        }
        assert_eq!(end, 0);
        // 11 + 20 MiB closes the first; 5 + 30 MiB the second; the rest is the last.
        assert_eq!(buckets.len(), 3, "{buckets:?}");
    }

    #[test]
    fn a_small_model_is_one_bucket() {
        assert_eq!(plan(&slots(&[24, 6, 18, 3])), vec![0..51]);
    }
}
