//! A dataset resident on the device, batched on the device: the batch of
//! step `s` is rows `π_e(p)` for the positions `p` of slot `s mod
//! per_epoch`, where `π_e` is a seeded permutation of the rows drawn anew
//! each epoch `e = s / per_epoch` and the step `s` is a counter in device
//! memory that the same launch advances. A recorded step therefore draws
//! a new batch on every replay with no host involvement.
//!
//! `π_e` is a four-round Feistel network over the smallest even-bit domain
//! holding the rows, its round function `lowbias32` keyed by `(seed, e)`,
//! walked until it lands on a row (a permutation of the domain restricted
//! to the rows stays a permutation). Integer arithmetic only, so the CPU,
//! WGSL and CUDA bodies draw the same rows.

use serde::{Deserialize, Serialize};

use crate::KernelError;
use crate::dropout::{hash, mix};

/// The shape and seed of a device-side batch gather.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GatherSpec {
    /// Rows of the dataset.
    pub rows: u32,
    /// Features per row.
    pub width: u32,
    /// 4-byte target words per row (`f32` values or `i32` class indices).
    pub target_width: u32,
    /// Rows per batch (at most `rows`); an epoch is `rows / batch` full batches.
    pub batch: u32,
    /// The permutations' key.
    pub seed: u64,
}

impl GatherSpec {
    /// Refuses an empty dataset or row, a batch of 0 or past the rows,
    /// and sizes past `u32`.
    pub fn validate(&self) -> Result<(), KernelError> {
        if self.rows == 0 || self.width == 0 || self.target_width == 0 {
            return Err(KernelError::invalid(
                "rows",
                "a dataset needs rows, features and targets",
            ));
        }
        if self.batch == 0 || self.batch > self.rows {
            return Err(KernelError::invalid(
                "batch",
                format!("{} is not in 1..={}", self.batch, self.rows),
            ));
        }
        for (field, width) in [("width", self.width), ("target_width", self.target_width)] {
            if u64::from(self.rows) * u64::from(width) > u64::from(u32::MAX) {
                return Err(KernelError::invalid(
                    field,
                    "the dataset has more than 2^32 words",
                ));
            }
        }
        Ok(())
    }

    /// Full batches per epoch.
    pub fn per_epoch(&self) -> u32 {
        (self.rows / self.batch.max(1)).max(1)
    }

    /// The dataset row of batch position `i` at step `step`.
    pub fn row(&self, step: u32, i: u32) -> u32 {
        let per_epoch = self.per_epoch();
        let (epoch, slot) = (step / per_epoch, step % per_epoch);
        shuffled(slot * self.batch + i, self.rows, hash(self.seed, epoch))
    }
}

/// Position `position` (< `rows`) of the permutation of `0..rows` keyed by `key`.
pub fn shuffled(position: u32, rows: u32, key: u32) -> u32 {
    let bits = (32 - rows.saturating_sub(1).leading_zeros()).max(2);
    let half = bits.div_ceil(2);
    let mask = (1u32 << half) - 1;
    let mut x = position;
    // Ends: `x` walks the cycle of a permutation through `position < rows`.
    loop {
        let (mut left, mut right) = (x >> half, x & mask);
        for round in 0..4u32 {
            let f = mix(right ^ key.wrapping_add(round.wrapping_mul(0x9e37_79b9))) & mask;
            (left, right) = (right, left ^ f);
        }
        x = (left << half) | right;
        if x < rows {
            return x;
        }
    }
}

/// Gathers the batch of step `counter[0]` (a `u32` held in an `f32`'s
/// bits) into `x` (`batch×width`) and `y` (`batch×target_width`, copied as
/// 4-byte words), then advances the counter by one.
pub fn batch_gather(
    spec: &GatherSpec,
    features: &[f32],
    targets: &[f32],
    counter: &mut [f32],
    x: &mut [f32],
    y: &mut [f32],
) -> Result<(), KernelError> {
    spec.validate()?;
    let (rows, width, tw, batch) = (
        spec.rows as usize,
        spec.width as usize,
        spec.target_width as usize,
        spec.batch as usize,
    );
    KernelError::check_len("features", rows * width, features.len())?;
    KernelError::check_len("targets", rows * tw, targets.len())?;
    KernelError::check_len("counter", 1, counter.len())?;
    KernelError::check_len("x", batch * width, x.len())?;
    KernelError::check_len("y", batch * tw, y.len())?;
    let step = counter[0].to_bits();
    for i in 0..batch {
        let row = spec.row(step, i as u32) as usize;
        x[i * width..(i + 1) * width].copy_from_slice(&features[row * width..(row + 1) * width]);
        let words = targets[row * tw..(row + 1) * tw]
            .iter()
            .map(|v| v.to_bits());
        for (out, word) in y[i * tw..(i + 1) * tw].iter_mut().zip(words) {
            *out = f32::from_bits(word);
        }
    }
    counter[0] = f32::from_bits(step.wrapping_add(1));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(rows: u32, batch: u32, seed: u64) -> GatherSpec {
        GatherSpec {
            rows,
            width: 2,
            target_width: 1,
            batch,
            seed,
        }
    }

    #[test]
    fn every_epoch_is_a_permutation_of_the_rows() {
        for rows in [1, 2, 3, 5, 17, 64, 1279, 4096, 5000] {
            let mut seen = vec![0u32; rows as usize];
            for p in 0..rows {
                seen[shuffled(p, rows, 0xdead_beef) as usize] += 1;
            }
            assert!(seen.iter().all(|&n| n == 1), "rows {rows}");
        }
    }

    #[test]
    fn epochs_and_seeds_draw_different_orders() {
        let s = spec(1000, 10, 7);
        let first: Vec<u32> = (0..100).map(|i| s.row(0, i)).collect();
        let next_epoch: Vec<u32> = (0..100).map(|i| s.row(100, i)).collect();
        let other: Vec<u32> = (0..100).map(|i| spec(1000, 10, 8).row(0, i)).collect();
        assert_ne!(first, next_epoch);
        assert_ne!(first, other);
        assert_ne!(first, (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn a_gather_copies_the_drawn_rows_and_advances_the_counter() {
        let s = spec(5, 2, 3);
        let features: Vec<f32> = (0..10).map(|v| v as f32).collect();
        let targets: Vec<f32> = [10, 11, 12, 13, 14]
            .map(|c: i32| f32::from_bits(c as u32))
            .to_vec();
        let mut counter = [f32::from_bits(4)];
        let (mut x, mut y) = ([0.0; 4], [0.0; 2]);
        batch_gather(&s, &features, &targets, &mut counter, &mut x, &mut y).unwrap();
        for i in 0..2 {
            let row = s.row(4, i as u32) as usize;
            assert_eq!(x[2 * i], (2 * row) as f32);
            assert_eq!(y[i].to_bits(), 10 + row as u32);
        }
        assert_eq!(counter[0].to_bits(), 5);
    }

    #[test]
    fn the_permutation_is_pinned_so_every_backend_can_match_it() {
        // Golden rows, computed independently (Python, 32-bit wrapping); the
        // WGSL and CUDA bodies are checked against the CPU in conformance.
        let s = spec(10, 3, 1);
        let rows: Vec<u32> = (0..3).map(|i| s.row(0, i)).collect();
        assert_eq!(rows, GOLDEN);
    }

    const GOLDEN: [u32; 3] = [0, 6, 5];

    #[test]
    fn bad_specs_are_refused() {
        assert!(spec(0, 1, 0).validate().is_err());
        assert!(spec(3, 4, 0).validate().is_err());
        assert!(spec(3, 0, 0).validate().is_err());
    }
}
