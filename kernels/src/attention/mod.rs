//! Multi-head scaled dot-product attention in one kernel, reading the
//! heads where a linear layer left them: `q` and the output are
//! `[batch, queries, heads, head_dim]`, `k` and `v` `[batch, keys, heads,
//! head_dim]`, so splitting and merging the heads costs no copy. The
//! forward keeps the attention weights (`[batch, heads, queries, keys]`)
//! for the backward, which runs in two kernels: one per query row (the
//! scores' and the queries' gradients), one per key row (the keys' and the
//! values'). Every element is summed in one fixed order (the dot products
//! over the head's elements, the weighted rows over the keys or queries),
//! the same in the CPU's general loops, its small-head loops (`small.rs`)
//! and the GPU bodies, so a result does not depend on the thread count;
//! the CPU's exponential differs from the GPUs' in the last bits. The CPU
//! splits the work by sequence.

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::KernelError;
use crate::classify::exp;

/// Multiply-adds (of the scores' product) under which the sequences run on
/// the calling thread: waking the pool for a few small heads costs more
/// than their arithmetic (as for the batched products).
const PARALLEL_WORK: usize = 1 << 21;

mod small;

/// The shape and options of a multi-head attention.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AttentionSpec {
    /// Independent sequences.
    pub batch: u64,
    /// Heads per token.
    pub heads: u64,
    /// Query positions per sequence (`L`).
    pub queries: u64,
    /// Key and value positions per sequence (`S`).
    pub keys: u64,
    /// Elements per head (`q`, `k` and `v` alike).
    pub head_dim: u64,
    /// What the scores are multiplied by (PyTorch's default `1/√head_dim`).
    pub scale: f32,
    /// Whether query `i` sees only keys `0..=i` (PyTorch's `is_causal`).
    pub causal: bool,
}

impl AttentionSpec {
    /// Refuses an empty dimension, a non-finite scale and sizes past `u64`.
    pub fn validate(&self) -> Result<(), KernelError> {
        for (field, value) in [
            ("batch", self.batch),
            ("heads", self.heads),
            ("queries", self.queries),
            ("keys", self.keys),
            ("head_dim", self.head_dim),
        ] {
            if value == 0 {
                return Err(KernelError::invalid(field, "an empty dimension"));
            }
        }
        if !self.scale.is_finite() {
            return Err(KernelError::invalid("scale", "must be finite"));
        }
        match (self.query_elements(), self.key_elements(), self.weights()) {
            (Some(_), Some(_), Some(_)) => Ok(()),
            _ => Err(KernelError::invalid("batch", "the sizes overflow u64")),
        }
    }

    /// Elements of `q` and of the output.
    pub fn query_elements(&self) -> Option<u64> {
        self.batch
            .checked_mul(self.queries)?
            .checked_mul(self.heads)?
            .checked_mul(self.head_dim)
    }

    /// Elements of `k` and of `v`.
    pub fn key_elements(&self) -> Option<u64> {
        self.batch
            .checked_mul(self.keys)?
            .checked_mul(self.heads)?
            .checked_mul(self.head_dim)
    }

    /// Elements of the attention weights (and of their gradient).
    pub fn weights(&self) -> Option<u64> {
        self.batch
            .checked_mul(self.heads)?
            .checked_mul(self.queries)?
            .checked_mul(self.keys)
    }

    fn dims(&self) -> Result<Dims, KernelError> {
        self.validate()?;
        let size = |v: u64, field| {
            usize::try_from(v).map_err(|_| KernelError::invalid(field, "does not fit in usize"))
        };
        Ok(Dims {
            heads: size(self.heads, "heads")?,
            queries: size(self.queries, "queries")?,
            keys: size(self.keys, "keys")?,
            head_dim: size(self.head_dim, "head_dim")?,
            scale: self.scale,
            causal: self.causal,
        })
    }
}

/// One sequence's sizes, in `usize`.
#[derive(Clone, Copy)]
struct Dims {
    heads: usize,
    queries: usize,
    keys: usize,
    head_dim: usize,
    scale: f32,
    causal: bool,
}

impl Dims {
    /// Where row `position`, head `head` starts in a `[positions, heads,
    /// head_dim]` block.
    fn row(&self, position: usize, head: usize) -> usize {
        (position * self.heads + head) * self.head_dim
    }

    /// Where query `i`'s weights for `head` start in a `[heads, queries,
    /// keys]` block.
    fn weights_row(&self, head: usize, i: usize) -> usize {
        (head * self.queries + i) * self.keys
    }

    /// Elements from one position's row of a head to the next's.
    fn stride(&self) -> usize {
        self.heads * self.head_dim
    }

    /// The keys query `i` sees.
    fn visible(&self, i: usize) -> usize {
        if self.causal {
            (i + 1).min(self.keys)
        } else {
            self.keys
        }
    }

    fn query_block(&self) -> usize {
        self.queries * self.heads * self.head_dim
    }

    fn key_block(&self) -> usize {
        self.keys * self.heads * self.head_dim
    }

    fn weights_block(&self) -> usize {
        self.heads * self.queries * self.keys
    }

    /// Multiply-adds of one sequence's pass (for the parallel threshold).
    fn work(&self) -> usize {
        self.weights_block() * self.head_dim
    }
}

/// Lanes summed in registers at a time by [`weighted_rows`].
const LANES: usize = 16;

/// `out = Σ_t weights[t]·row_t`, row `t` being `rows[t·stride..]` (at
/// least `out.len()` long), each element summed in order of `t` from zero.
/// The sums of each run of [`LANES`] elements stay in registers over all
/// the terms (accumulating into `out` term by term would wait on a store
/// and a load for every term).
#[inline(always)]
fn weighted_rows(out: &mut [f32], weights: &[f32], rows: &[f32], stride: usize) {
    let width = out.len();
    let mut start = 0;
    let mut chunks = out.chunks_exact_mut(LANES);
    for chunk in &mut chunks {
        let mut sums = [0.0f32; LANES];
        for (t, &w) in weights.iter().enumerate() {
            let row: &[f32; LANES] = match rows[t * stride + start..][..LANES].try_into() {
                Ok(row) => row,
                Err(_) => unreachable!("a run of LANES elements"),
            };
            for (sum, &r) in sums.iter_mut().zip(row) {
                *sum += w * r;
            }
        }
        chunk.copy_from_slice(&sums);
        start += LANES;
    }
    let tail = chunks.into_remainder();
    tail.fill(0.0);
    for (t, &w) in weights.iter().enumerate() {
        let row = &rows[t * stride + start..][..width - start];
        for (sum, &r) in tail.iter_mut().zip(row) {
            *sum += w * r;
        }
    }
}

/// Runs `each` over the sequences (one block of each slice per sequence),
/// in parallel where the work is large enough.
fn per_sequence<A: Send, B: Send>(
    dims: &Dims,
    first: Vec<A>,
    second: Vec<B>,
    each: impl Fn(usize, A, B) + Sync + Send,
) {
    let batch = first.len();
    if dims.work().saturating_mul(batch) < PARALLEL_WORK {
        for (b, (x, y)) in first.into_iter().zip(second).enumerate() {
            each(b, x, y);
        }
    } else {
        first
            .into_par_iter()
            .zip(second)
            .enumerate()
            .for_each(|(b, (x, y))| each(b, x, y));
    }
}

fn check(
    spec: &AttentionSpec,
    lengths: &[(&'static str, usize, Option<u64>)],
) -> Result<Dims, KernelError> {
    let dims = spec.dims()?;
    for &(name, len, expected) in lengths {
        let expected = expected.and_then(|e| usize::try_from(e).ok());
        KernelError::check_len(name, expected.unwrap_or(usize::MAX), len)?;
    }
    Ok(dims)
}

/// `out = softmax(q·kᵀ·scale)·v` per sequence and head, the weights kept
/// in `weights`.
pub fn attention(
    spec: &AttentionSpec,
    [q, k, v]: [&[f32]; 3],
    out: &mut [f32],
    weights: &mut [f32],
) -> Result<(), KernelError> {
    let dims = check(
        spec,
        &[
            ("q", q.len(), spec.query_elements()),
            ("k", k.len(), spec.key_elements()),
            ("v", v.len(), spec.key_elements()),
            ("out", out.len(), spec.query_elements()),
            ("weights", weights.len(), spec.weights()),
        ],
    )?;
    let (qb, kb, wb) = (dims.query_block(), dims.key_block(), dims.weights_block());
    let outs: Vec<_> = out.chunks_mut(qb).collect();
    let rows: Vec<_> = weights.chunks_mut(wb).collect();
    per_sequence(&dims, outs, rows, |b, out, weights| {
        let (q, k, v) = (&q[b * qb..][..qb], &k[b * kb..][..kb], &v[b * kb..][..kb]);
        (bodies().forward)(&dims, [q, k, v], out, weights);
    });
    Ok(())
}

#[inline(always)]
fn forward_sequence(dims: &Dims, inputs: [&[f32]; 3], out: &mut [f32], weights: &mut [f32]) {
    if small::fits(dims) {
        small::forward(dims, inputs, out, weights);
    } else {
        general_forward(dims, inputs, out, weights);
    }
}

/// One sequence's forward for heads of any size, a query row at a time.
#[inline(always)]
fn general_forward(dims: &Dims, [q, k, v]: [&[f32]; 3], out: &mut [f32], weights: &mut [f32]) {
    let d = dims.head_dim;
    let mut kt = Transposed::new(dims);
    let mut scores = vec![0.0; kt.width];
    for h in 0..dims.heads {
        kt.fill(dims, k, h);
        for i in 0..dims.queries {
            let p = &mut weights[dims.weights_row(h, i)..][..dims.keys];
            let visible = dims.visible(i);
            kt.dots(&q[dims.row(i, h)..][..d], &mut scores);
            let mut max = f32::NEG_INFINITY;
            for score in &mut scores[..visible] {
                *score *= dims.scale;
                max = max.max(*score);
            }
            // Every lane's exponential at once (the hidden ones unused).
            for score in &mut scores {
                *score = exp(*score - max);
            }
            let total: f32 = scores[..visible].iter().fold(0.0, |sum, &e| sum + e);
            for (w, &e) in p[..visible].iter_mut().zip(&scores) {
                *w = e / total;
            }
            p[visible..].fill(0.0);
            let row = &mut out[dims.row(i, h)..][..d];
            weighted_rows(row, &p[..visible], &v[dims.row(0, h)..], dims.stride());
        }
    }
}

/// One head of a `[keys, heads, head_dim]` block as `head_dim×width`
/// (`width` the keys rounded up to whole vectors, the rest zeros), so that
/// a row's dot products with every key run across the keys, in full
/// vectors.
struct Transposed {
    width: usize,
    values: Vec<f32>,
}

impl Transposed {
    fn new(dims: &Dims) -> Transposed {
        let width = dims.keys.next_multiple_of(LANES);
        Transposed {
            width,
            values: vec![0.0; width * dims.head_dim],
        }
    }

    /// Holds head `h` of `x`.
    #[inline(always)]
    fn fill(&mut self, dims: &Dims, x: &[f32], h: usize) {
        for j in 0..dims.keys {
            let row = &x[dims.row(j, h)..][..dims.head_dim];
            for (e, &value) in row.iter().enumerate() {
                self.values[e * self.width + j] = value;
            }
        }
    }

    /// `out[j] = Σ_e a[e]·t[e][j]` for every column (`out` is `width`
    /// long), each sum in order of `e`: the bits of one dot product at a
    /// time, as the GPU bodies take it.
    #[inline(always)]
    fn dots(&self, a: &[f32], out: &mut [f32]) {
        weighted_rows(out, a, &self.values, self.width);
    }
}

/// The backward's first half, per query row: the scores' gradient
/// `grad_scores = w ⊙ (grad_out·vᵀ − Σ w ⊙ grad_out·vᵀ)` (before the
/// scale) and `grad_q = scale·grad_scores·k`.
pub fn attention_backward_queries(
    spec: &AttentionSpec,
    [k, v, weights, grad_out]: [&[f32]; 4],
    grad_scores: &mut [f32],
    grad_q: &mut [f32],
) -> Result<(), KernelError> {
    let dims = check(
        spec,
        &[
            ("k", k.len(), spec.key_elements()),
            ("v", v.len(), spec.key_elements()),
            ("weights", weights.len(), spec.weights()),
            ("grad_out", grad_out.len(), spec.query_elements()),
            ("grad_scores", grad_scores.len(), spec.weights()),
            ("grad_q", grad_q.len(), spec.query_elements()),
        ],
    )?;
    let (qb, kb, wb) = (dims.query_block(), dims.key_block(), dims.weights_block());
    let scores: Vec<_> = grad_scores.chunks_mut(wb).collect();
    let queries: Vec<_> = grad_q.chunks_mut(qb).collect();
    per_sequence(&dims, scores, queries, |b, scores, grad_q| {
        let (k, v) = (&k[b * kb..][..kb], &v[b * kb..][..kb]);
        let (weights, grad_out) = (&weights[b * wb..][..wb], &grad_out[b * qb..][..qb]);
        (bodies().queries)(&dims, [k, v, weights, grad_out], scores, grad_q);
    });
    Ok(())
}

/// The backward's second half, per key row: `grad_k = scale·grad_scoresᵀ·q`
/// and `grad_v = weightsᵀ·grad_out`.
pub fn attention_backward_keys(
    spec: &AttentionSpec,
    [q, weights, grad_out, grad_scores]: [&[f32]; 4],
    grad_k: &mut [f32],
    grad_v: &mut [f32],
) -> Result<(), KernelError> {
    let dims = check(
        spec,
        &[
            ("q", q.len(), spec.query_elements()),
            ("weights", weights.len(), spec.weights()),
            ("grad_out", grad_out.len(), spec.query_elements()),
            ("grad_scores", grad_scores.len(), spec.weights()),
            ("grad_k", grad_k.len(), spec.key_elements()),
            ("grad_v", grad_v.len(), spec.key_elements()),
        ],
    )?;
    let (qb, kb, wb) = (dims.query_block(), dims.key_block(), dims.weights_block());
    let keys: Vec<_> = grad_k.chunks_mut(kb).collect();
    let values: Vec<_> = grad_v.chunks_mut(kb).collect();
    per_sequence(&dims, keys, values, |b, grad_k, grad_v| {
        let (q, grad_out) = (&q[b * qb..][..qb], &grad_out[b * qb..][..qb]);
        let (weights, scores) = (&weights[b * wb..][..wb], &grad_scores[b * wb..][..wb]);
        (bodies().keys)(&dims, [q, weights, grad_out, scores], grad_k, grad_v);
    });
    Ok(())
}

/// One sequence's [`attention_backward_queries`]: `k`, `v` its key block,
/// `weights` and `grad_out` its own.
#[inline(always)]
fn queries_sequence(dims: &Dims, inputs: [&[f32]; 4], scores: &mut [f32], grad_q: &mut [f32]) {
    if small::fits(dims) {
        small::queries(dims, inputs, scores, grad_q);
    } else {
        general_queries(dims, inputs, scores, grad_q);
    }
}

/// [`queries_sequence`] for heads of any size.
#[inline(always)]
fn general_queries(
    dims: &Dims,
    [k, v, weights, grad_out]: [&[f32]; 4],
    scores: &mut [f32],
    grad_q: &mut [f32],
) {
    let d = dims.head_dim;
    let mut vt = Transposed::new(dims);
    let mut products = vec![0.0; vt.width];
    for h in 0..dims.heads {
        vt.fill(dims, v, h);
        for i in 0..dims.queries {
            let at = dims.weights_row(h, i);
            let (w, ds) = (&weights[at..][..dims.keys], &mut scores[at..][..dims.keys]);
            let visible = dims.visible(i);
            vt.dots(&grad_out[dims.row(i, h)..][..d], &mut products);
            ds[..visible].copy_from_slice(&products[..visible]);
            let mut weighted = 0.0;
            for (&w, &s) in w.iter().zip(&ds[..visible]) {
                weighted += w * s;
            }
            for (s, &w) in ds[..visible].iter_mut().zip(w) {
                *s = w * (*s - weighted);
            }
            ds[visible..].fill(0.0);
            let row = &mut grad_q[dims.row(i, h)..][..d];
            weighted_rows(row, &ds[..visible], &k[dims.row(0, h)..], dims.stride());
            for x in row {
                *x *= dims.scale;
            }
        }
    }
}

/// One sequence's [`attention_backward_keys`].
#[inline(always)]
fn keys_sequence(dims: &Dims, inputs: [&[f32]; 4], grad_k: &mut [f32], grad_v: &mut [f32]) {
    if small::fits(dims) {
        small::keys(dims, inputs, grad_k, grad_v);
    } else {
        general_keys(dims, inputs, grad_k, grad_v);
    }
}

/// [`keys_sequence`] for heads of any size.
#[inline(always)]
fn general_keys(
    dims: &Dims,
    [q, weights, grad_out, scores]: [&[f32]; 4],
    grad_k: &mut [f32],
    grad_v: &mut [f32],
) {
    let d = dims.head_dim;
    let (mut score_column, mut weight_column) = (vec![0.0; dims.queries], vec![0.0; dims.queries]);
    for h in 0..dims.heads {
        for j in 0..dims.keys {
            let at = dims.row(j, h);
            let (dk, dv) = (&mut grad_k[at..][..d], &mut grad_v[at..][..d]);
            for i in 0..dims.queries {
                let w = dims.weights_row(h, i) + j;
                (score_column[i], weight_column[i]) = (scores[w], weights[w]);
            }
            let first = dims.row(0, h);
            weighted_rows(dk, &score_column, &q[first..], dims.stride());
            weighted_rows(dv, &weight_column, &grad_out[first..], dims.stride());
            for x in dk {
                *x *= dims.scale;
            }
        }
    }
}

/// The per-sequence loops, compiled for the widest vector unit present:
/// the same source (`*_sequence`, inlined into each), so the same rounding
/// (Rust never contracts to FMA), only more lanes at a time.
struct Bodies {
    forward: Body<3>,
    queries: Body<4>,
    keys: Body<4>,
}

/// One sequence's loop: its inputs, then its two outputs.
type Body<const INPUTS: usize> = fn(&Dims, [&[f32]; INPUTS], &mut [f32], &mut [f32]);

fn bodies() -> &'static Bodies {
    static BODIES: std::sync::OnceLock<Bodies> = std::sync::OnceLock::new();
    BODIES.get_or_init(|| {
        crate::wide::widest!(
            avx512: wide::AVX512,
            avx2: wide::AVX2,
            plain: Bodies {
                forward: forward_sequence,
                queries: queries_sequence,
                keys: keys_sequence,
            },
        )
    })
}

/// The AVX2 and AVX-512 instances of the per-sequence loops.
#[cfg(target_arch = "x86_64")]
mod wide {
    use super::{Bodies, Dims, forward_sequence, keys_sequence, queries_sequence};

    crate::wide::x86_instances!(
        forward_sequence(d: &Dims, x: [&[f32]; 3], a: &mut [f32], b: &mut [f32]);
        "avx2" => forward_avx2,
        "avx512f" => forward_avx512,
    );
    crate::wide::x86_instances!(
        queries_sequence(d: &Dims, x: [&[f32]; 4], a: &mut [f32], b: &mut [f32]);
        "avx2" => queries_avx2,
        "avx512f" => queries_avx512,
    );
    crate::wide::x86_instances!(
        keys_sequence(d: &Dims, x: [&[f32]; 4], a: &mut [f32], b: &mut [f32]);
        "avx2" => keys_avx2,
        "avx512f" => keys_avx512,
    );

    pub(super) const AVX2: Bodies = Bodies {
        forward: forward_avx2,
        queries: queries_avx2,
        keys: keys_avx2,
    };
    pub(super) const AVX512: Bodies = Bodies {
        forward: forward_avx512,
        queries: queries_avx512,
        keys: keys_avx512,
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(len: usize, seed: u32) -> Vec<f32> {
        (0..len)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed) as f32 / u32::MAX as f32 - 0.5)
            .collect()
    }

    fn spec(causal: bool) -> AttentionSpec {
        AttentionSpec {
            batch: 2,
            heads: 3,
            queries: 4,
            keys: 5,
            head_dim: 6,
            scale: 0.4,
            causal,
        }
    }

    /// The loss `Σ out ⊙ r` in f64 for the given inputs, by the definition.
    fn reference(spec: &AttentionSpec, [q, k, v]: [&[f64]; 3], r: &[f64]) -> f64 {
        let (b, h, l, s, d) = (
            spec.batch as usize,
            spec.heads as usize,
            spec.queries as usize,
            spec.keys as usize,
            spec.head_dim as usize,
        );
        let at = |n: usize, p: usize, x: usize, e: usize| ((n * p + x) * h) * d + e;
        let mut loss = 0.0;
        for n in 0..b {
            for head in 0..h {
                for i in 0..l {
                    let visible = if spec.causal { (i + 1).min(s) } else { s };
                    let scores: Vec<f64> = (0..visible)
                        .map(|j| {
                            (0..d)
                                .map(|e| {
                                    q[at(n, l, i, 0) + head * d + e]
                                        * k[at(n, s, j, 0) + head * d + e]
                                })
                                .sum::<f64>()
                                * f64::from(spec.scale)
                        })
                        .collect();
                    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let total: f64 = scores.iter().map(|x| (x - max).exp()).sum();
                    for e in 0..d {
                        let o: f64 = (0..visible)
                            .map(|j| {
                                (scores[j] - max).exp() / total * v[at(n, s, j, 0) + head * d + e]
                            })
                            .sum();
                        loss += o * r[at(n, l, i, 0) + head * d + e];
                    }
                }
            }
        }
        loss
    }

    #[test]
    fn the_forward_and_both_backward_halves_match_finite_differences_of_the_definition() {
        // The first shape fits the small heads' loops, the second does not.
        let shapes = [
            spec(false),
            AttentionSpec {
                keys: 17,
                head_dim: 18,
                ..spec(false)
            },
        ];
        for (spec, causal) in shapes.into_iter().flat_map(|s| [(s, false), (s, true)]) {
            let spec = AttentionSpec { causal, ..spec };
            let (qn, kn, wn) = (
                spec.query_elements().unwrap_or(0) as usize,
                spec.key_elements().unwrap_or(0) as usize,
                spec.weights().unwrap_or(0) as usize,
            );
            let (q, k, v, r) = (values(qn, 1), values(kn, 2), values(kn, 3), values(qn, 4));
            let (mut out, mut weights) = (vec![0.0; qn], vec![0.0; wn]);
            assert!(attention(&spec, [&q, &k, &v], &mut out, &mut weights).is_ok());
            let wide = |x: &[f32]| x.iter().map(|&v| f64::from(v)).collect::<Vec<f64>>();
            let (q64, k64, v64, r64) = (wide(&q), wide(&k), wide(&v), wide(&r));
            let loss: f64 = out.iter().zip(&r64).map(|(&o, r)| f64::from(o) * r).sum();
            let want = reference(&spec, [&q64, &k64, &v64], &r64);
            assert!(
                (loss - want).abs() < 1e-5,
                "causal {causal}: {loss} vs {want}"
            );
            let (mut ds, mut dq) = (vec![0.0; wn], vec![0.0; qn]);
            let inputs = [&k[..], &v, &weights, &r];
            assert!(attention_backward_queries(&spec, inputs, &mut ds, &mut dq).is_ok());
            let (mut dk, mut dv) = (vec![0.0; kn], vec![0.0; kn]);
            let inputs = [&q[..], &weights, &r, &ds];
            assert!(attention_backward_keys(&spec, inputs, &mut dk, &mut dv).is_ok());
            let step = 1e-6;
            for (which, grad) in [(0, &dq), (1, &dk), (2, &dv)] {
                for index in (0..grad.len()).step_by(7) {
                    let mut moved = [q64.clone(), k64.clone(), v64.clone()];
                    moved[which][index] += step;
                    let up = reference(&spec, [&moved[0], &moved[1], &moved[2]], &r64);
                    moved[which][index] -= 2.0 * step;
                    let down = reference(&spec, [&moved[0], &moved[1], &moved[2]], &r64);
                    let numeric = (up - down) / (2.0 * step);
                    let got = f64::from(grad[index]);
                    assert!(
                        (got - numeric).abs() < 1e-4,
                        "causal {causal}, input {which}, element {index}: {got} vs {numeric}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_parallel_path_gives_each_sequence_the_bits_of_the_serial_one() {
        let run = |batch: u64, seeds: [u32; 3]| {
            let spec = AttentionSpec {
                batch,
                ..spec(true)
            };
            let qn = spec.query_elements().unwrap_or(0) as usize;
            let kn = spec.key_elements().unwrap_or(0) as usize;
            let wn = spec.weights().unwrap_or(0) as usize;
            let (q, k, v) = (
                values(qn, seeds[0]),
                values(kn, seeds[1]),
                values(kn, seeds[2]),
            );
            let (mut out, mut w) = (vec![0.0; qn], vec![0.0; wn]);
            assert!(attention(&spec, [&q, &k, &v], &mut out, &mut w).is_ok());
            (out, w)
        };
        // 8000 sequences pass the parallel threshold (8000·360 multiply-adds
        // ≥ PARALLEL_WORK); the first two are the inputs of the
        // two-sequence (serial) run.
        let wide = AttentionSpec {
            batch: 8000,
            ..spec(true)
        };
        assert!(
            wide.dims()
                .is_ok_and(|dims| dims.work() * 8000 >= PARALLEL_WORK)
        );
        let (wide_out, wide_w) = run(8000, [5, 6, 7]);
        let (out, w) = run(2, [5, 6, 7]);
        assert_eq!(wide_out[..out.len()], out[..]);
        assert_eq!(wide_w[..w.len()], w[..]);
    }

    #[test]
    fn the_small_heads_loops_give_the_bits_of_the_general_ones() {
        for causal in [false, true] {
            let spec = AttentionSpec {
                queries: 9,
                keys: 9,
                head_dim: 16,
                ..spec(causal)
            };
            let Ok(dims) = spec.dims() else {
                panic!("a valid spec");
            };
            assert!(small::fits(&dims));
            let (qn, kn, wn) = (dims.query_block(), dims.key_block(), dims.weights_block());
            let (q, k, v, g) = (values(qn, 8), values(kn, 9), values(kn, 10), values(qn, 11));
            let run = |small_loops: bool| {
                let (mut out, mut w) = (vec![0.0; qn], vec![0.0; wn]);
                let (mut ds, mut dq) = (vec![0.0; wn], vec![0.0; qn]);
                let (mut dk, mut dv) = (vec![0.0; kn], vec![0.0; kn]);
                if small_loops {
                    small::forward(&dims, [&q, &k, &v], &mut out, &mut w);
                    small::queries(&dims, [&k, &v, &w, &g], &mut ds, &mut dq);
                    small::keys(&dims, [&q, &w, &g, &ds], &mut dk, &mut dv);
                } else {
                    general_forward(&dims, [&q, &k, &v], &mut out, &mut w);
                    general_queries(&dims, [&k, &v, &w, &g], &mut ds, &mut dq);
                    general_keys(&dims, [&q, &w, &g, &ds], &mut dk, &mut dv);
                }
                [out, w, ds, dq, dk, dv]
            };
            assert_eq!(run(true), run(false), "causal {causal}");
        }
    }

    #[test]
    fn a_wrong_length_or_an_empty_dimension_is_refused() {
        let spec = spec(false);
        let (q, k) = (vec![0.0; 10], vec![0.0; 10]);
        let (mut out, mut w) = (vec![0.0; 10], vec![0.0; 10]);
        assert!(attention(&spec, [&q, &k, &k], &mut out, &mut w).is_err());
        let empty = AttentionSpec { heads: 0, ..spec };
        assert!(empty.validate().is_err());
        let unscaled = AttentionSpec {
            scale: f32::NAN,
            ..spec
        };
        assert!(unscaled.validate().is_err());
    }
}
