//! A batch of GEMMs of one shape in one launch: `C_i ← op(A_i)·op(B_i)`,
//! each `A_i` and `B_i` at its own element offset into its binding (so a
//! broadcast operand repeats an offset) and each `C_i` the `i`-th `m×n`
//! block of the output. What a batched `matmul` and attention's products
//! run: one launch where one per batch element cost a launch each.

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::{GemmSpec, KernelError, gemm, small_products};

/// The shape shared by every product, and where each one's operands start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchedGemmSpec {
    /// Every product's shape, transposes and activation (no bias).
    pub gemm: GemmSpec,
    /// Element offset of each `A_i` in `a`.
    pub a_offsets: Vec<u64>,
    /// Element offset of each `B_i` in `b` (as many as `a_offsets`).
    pub b_offsets: Vec<u64>,
}

impl BatchedGemmSpec {
    /// Products in the batch.
    pub fn batch(&self) -> usize {
        self.a_offsets.len()
    }

    /// Refuses an empty batch and offset lists of different lengths.
    pub fn validate(&self) -> Result<(), KernelError> {
        if self.a_offsets.is_empty() || self.a_offsets.len() != self.b_offsets.len() {
            return Err(KernelError::invalid(
                "offsets",
                format!(
                    "{} offsets into a and {} into b; one each per product, at least one",
                    self.a_offsets.len(),
                    self.b_offsets.len()
                ),
            ));
        }
        Ok(())
    }

    /// The elements `a` must hold (`None` on overflow).
    pub fn a_extent(&self) -> Option<u64> {
        extent(
            &self.a_offsets,
            (self.gemm.m as u64).checked_mul(self.gemm.k as u64)?,
        )
    }

    /// The elements `b` must hold (`None` on overflow).
    pub fn b_extent(&self) -> Option<u64> {
        extent(
            &self.b_offsets,
            (self.gemm.k as u64).checked_mul(self.gemm.n as u64)?,
        )
    }

    /// The output's elements: `batch·m·n` (`None` on overflow).
    pub fn outputs(&self) -> Option<u64> {
        (self.batch() as u64)
            .checked_mul(self.gemm.m as u64)?
            .checked_mul(self.gemm.n as u64)
    }
}

fn extent(offsets: &[u64], block: u64) -> Option<u64> {
    offsets
        .iter()
        .map(|&offset| offset.checked_add(block))
        .max()?
}

/// Runs the batch on the CPU, the products spread over the thread pool.
pub fn batched_gemm(
    spec: &BatchedGemmSpec,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
) -> Result<(), KernelError> {
    spec.validate()?;
    let GemmSpec { m, n, k, .. } = spec.gemm;
    let size = |v: Option<u64>, field: &str| {
        v.and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| KernelError::invalid(field, "its size overflows"))
    };
    KernelError::check_len("c", size(spec.outputs(), "c")?, c.len())?;
    for (name, extent, len) in [
        ("a", spec.a_extent(), a.len()),
        ("b", spec.b_extent(), b.len()),
    ] {
        if size(extent, name)? > len {
            return Err(KernelError::invalid(name, "an offset reaches past its end"));
        }
    }
    if m * n == 0 {
        return Ok(());
    }
    let (a_block, b_block) = (m * k, k * n);
    let operands = |at_a: &u64, at_b: &u64| {
        let (at_a, at_b) = (*at_a as usize, *at_b as usize);
        (&a[at_a..at_a + a_block], &b[at_b..at_b + b_block])
    };
    let product = |(c, (at_a, at_b)): (&mut [f32], (&u64, &u64))| {
        let (a, b) = operands(at_a, at_b);
        gemm(&spec.gemm, a, b, None, c)
    };
    let offsets = spec.a_offsets.iter().zip(&spec.b_offsets);
    if spec.batch().saturating_mul(m * n * k) < PARALLEL_BATCH {
        let blocks = c
            .chunks_mut(m * n)
            .zip(offsets.clone())
            .map(|(c, (at_a, at_b))| {
                let (a, b) = operands(at_a, at_b);
                (a, b, c)
            });
        if small_products::run(&spec.gemm, blocks) {
            return Ok(());
        }
        return c.chunks_mut(m * n).zip(offsets).try_for_each(product);
    }
    c.par_chunks_mut(m * n)
        .zip(spec.a_offsets.par_iter().zip(&spec.b_offsets))
        .try_for_each(product)
}

/// Batches of fewer multiply-adds run on the calling thread: waking the
/// pool for attention's 256 products of `9×9×16` cost more than they do.
const PARALLEL_BATCH: usize = 1 << 21;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_product_reads_its_own_offsets_and_a_shared_operand_repeats_one() {
        // Two 1×2 by 2×1 products; B is shared (offset 0 twice).
        let spec = BatchedGemmSpec {
            gemm: GemmSpec {
                m: 1,
                n: 1,
                k: 2,
                ..GemmSpec::default()
            },
            a_offsets: vec![0, 2],
            b_offsets: vec![0, 0],
        };
        let mut c = [0.0; 2];
        batched_gemm(&spec, &[1.0, 2.0, 3.0, 4.0], &[10.0, 100.0], &mut c).unwrap();
        assert_eq!(c, [210.0, 430.0]);
    }

    #[test]
    fn small_products_match_one_gemm_each_in_every_transpose_and_row_count() {
        let mut seed = 11u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        let transposes = [(false, false), (true, false), (false, true), (true, true)];
        for (m, n, k) in [
            (9, 9, 16),
            (16, 9, 9),
            (9, 16, 9),
            (1, 5, 3),
            (16, 16, 64),
            (7, 13, 1),
        ] {
            for (transpose_a, transpose_b) in transposes {
                let batch = 3;
                let a: Vec<f32> = (0..batch * m * k).map(|_| next()).collect();
                let b: Vec<f32> = (0..batch * k * n).map(|_| next()).collect();
                let gemm_spec = GemmSpec {
                    m,
                    n,
                    k,
                    transpose_a,
                    transpose_b,
                    ..GemmSpec::default()
                };
                let spec = BatchedGemmSpec {
                    gemm: gemm_spec,
                    a_offsets: (0..batch as u64).map(|i| i * (m * k) as u64).collect(),
                    // The last product shares the first's B, as a broadcast does.
                    b_offsets: (0..batch as u64)
                        .map(|i| (i % 2) * (k * n) as u64)
                        .collect(),
                };
                let mut c = vec![f32::NAN; batch * m * n];
                batched_gemm(&spec, &a, &b, &mut c).unwrap();
                for (i, c) in c.chunks(m * n).enumerate() {
                    let (at_a, at_b) = (i * m * k, (i % 2) * k * n);
                    let mut want = vec![0.0; m * n];
                    let (a, b) = (&a[at_a..at_a + m * k], &b[at_b..at_b + k * n]);
                    gemm(&gemm_spec, a, b, None, &mut want).unwrap();
                    for (x, y) in c.iter().zip(&want) {
                        assert!(
                            (x - y).abs() < 1e-5,
                            "{gemm_spec:?} product {i}: {x} vs {y}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_batch_large_enough_for_the_pool_gives_each_product_as_one_gemm_does() {
        let (m, n, k, batch) = (64, 48, 32, 40);
        assert!(batch * m * n * k >= PARALLEL_BATCH);
        let a: Vec<f32> = (0..batch * m * k).map(|i| (i % 13) as f32 - 6.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 7) as f32 * 0.5).collect();
        let spec = BatchedGemmSpec {
            gemm: GemmSpec {
                m,
                n,
                k,
                ..GemmSpec::default()
            },
            a_offsets: (0..batch as u64).map(|i| i * (m * k) as u64).collect(),
            b_offsets: vec![0; batch],
        };
        let mut c = vec![0.0; batch * m * n];
        batched_gemm(&spec, &a, &b, &mut c).unwrap();
        for (i, c) in c.chunks(m * n).enumerate() {
            let mut want = vec![0.0; m * n];
            gemm(
                &spec.gemm,
                &a[i * m * k..(i + 1) * m * k],
                &b,
                None,
                &mut want,
            )
            .unwrap();
            assert_eq!(c, &want[..], "product {i}");
        }
    }

    #[test]
    fn an_offset_past_an_operand_or_unequal_offset_lists_are_refused() {
        let mut spec = BatchedGemmSpec {
            gemm: GemmSpec {
                m: 1,
                n: 1,
                k: 2,
                ..GemmSpec::default()
            },
            a_offsets: vec![0, 3],
            b_offsets: vec![0, 0],
        };
        let mut c = [0.0; 2];
        assert!(batched_gemm(&spec, &[0.0; 4], &[0.0; 2], &mut c).is_err());
        spec.a_offsets = vec![0];
        assert!(batched_gemm(&spec, &[0.0; 4], &[0.0; 2], &mut c).is_err());
    }
}
