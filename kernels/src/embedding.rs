//! Embedding lookups: a gather of rows of a `vocab×dim` table by `i32`
//! indices, and its backward, a scatter-add that is deterministic: each
//! column of the table's gradient is summed by one thread in index order.
//! An index out of range is never read through: its row is NaN (callers
//! refuse such indices on the host first).

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::KernelError;

/// The shape of an embedding lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EmbeddingSpec {
    /// Indices looked up (rows of the output).
    pub rows: u64,
    /// Elements per embedding.
    pub dim: u64,
    /// Rows of the table.
    pub vocab: u64,
}

impl EmbeddingSpec {
    /// The output's (and its gradient's) element count.
    pub fn outputs(&self) -> Option<u64> {
        self.rows.checked_mul(self.dim)
    }

    /// The table's (and its gradient's) element count.
    pub fn table(&self) -> Option<u64> {
        self.vocab.checked_mul(self.dim)
    }

    fn dims(&self) -> Result<(usize, usize, usize), KernelError> {
        let size = |v: u64, field| {
            usize::try_from(v).map_err(|_| KernelError::invalid(field, "does not fit in usize"))
        };
        Ok((
            size(self.rows, "rows")?,
            size(self.dim, "dim")?,
            size(self.vocab, "vocab")?,
        ))
    }
}

fn lengths(
    spec: &EmbeddingSpec,
    table: usize,
    indices: usize,
    rows: usize,
) -> Result<(usize, usize, usize), KernelError> {
    let (n, dim, vocab) = spec.dims()?;
    let overflow = || KernelError::invalid("dim", "the sizes overflow");
    KernelError::check_len("table", vocab.checked_mul(dim).ok_or_else(overflow)?, table)?;
    KernelError::check_len("indices", n, indices)?;
    KernelError::check_len("out", n.checked_mul(dim).ok_or_else(overflow)?, rows)?;
    Ok((n, dim, vocab))
}

/// `out[i] ← weight[indices[i]]`, row by row; a row whose index is out
/// of range is NaN.
pub fn embedding(
    spec: &EmbeddingSpec,
    weight: &[f32],
    indices: &[i32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    let (_, dim, vocab) = lengths(spec, weight.len(), indices.len(), out.len())?;
    if dim == 0 {
        return Ok(());
    }
    out.par_chunks_mut(dim)
        .zip(indices.par_iter())
        .with_min_len(64)
        .for_each(|(row, &index)| match usize::try_from(index) {
            Ok(index) if index < vocab => {
                row.copy_from_slice(&weight[index * dim..(index + 1) * dim]);
            }
            _ => row.fill(f32::NAN),
        });
    Ok(())
}

/// `grad_weight ← Σ_i onehot(indices[i]) ⊗ grad_out[i]`, in index order
/// (a scatter-add the thread count does not change); out-of-range
/// indices add nothing.
pub fn embedding_backward(
    spec: &EmbeddingSpec,
    indices: &[i32],
    grad_out: &[f32],
    grad_weight: &mut [f32],
) -> Result<(), KernelError> {
    let (_, dim, vocab) = lengths(spec, grad_weight.len(), indices.len(), grad_out.len())?;
    grad_weight.fill(0.0);
    if dim == 0 {
        return Ok(());
    }
    for (&index, g) in indices.iter().zip(grad_out.chunks(dim)) {
        match usize::try_from(index) {
            Ok(index) if index < vocab => {
                let row = &mut grad_weight[index * dim..(index + 1) * dim];
                row.iter_mut().zip(g).for_each(|(w, g)| *w += g);
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: EmbeddingSpec = EmbeddingSpec {
        rows: 3,
        dim: 2,
        vocab: 2,
    };

    #[test]
    fn a_lookup_gathers_rows_and_an_out_of_range_index_is_nan() {
        let mut out = [0.0; 6];
        embedding(&SPEC, &[1.0, 2.0, 3.0, 4.0], &[1, 0, 2], &mut out).unwrap();
        assert_eq!(out[..4], [3.0, 4.0, 1.0, 2.0]);
        assert!(out[4].is_nan() && out[5].is_nan());
    }

    #[test]
    fn the_backward_adds_every_use_of_a_row() {
        let mut grad = [9.0; 4];
        let g = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        embedding_backward(&SPEC, &[1, 1, 0], &g, &mut grad).unwrap();
        assert_eq!(grad, [5.0, 6.0, 4.0, 6.0]);
    }
}
