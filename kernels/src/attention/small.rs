//! Attention's loops where every head is small (at most 16 queries, 16
//! keys and 16 elements per head, as a transformer over a few tokens has):
//! a head's rows packed into sixteen-lane arrays, and each step taken for
//! every row of the head before the next step, so that the rows' sums run
//! side by side instead of one row's dependent additions waiting on each
//! other. Each element is summed in the order the general loops sum it,
//! so both give the same bits.

use super::Dims;
use crate::classify::exp;
use crate::small_products::{LANES, row_products};

type Row = [f32; LANES];
type Block = [Row; LANES];

const ZERO: Block = [[0.0; LANES]; LANES];

/// Whether `dims` fit these loops.
pub(super) fn fits(dims: &Dims) -> bool {
    dims.queries <= LANES && dims.keys <= LANES && dims.head_dim <= LANES
}

/// Head `h`'s first `positions` rows of a `[positions, heads, head_dim]`
/// block into `rows` (the lanes past `head_dim` are left as they are).
#[inline(always)]
fn pack_rows(dims: &Dims, x: &[f32], h: usize, positions: usize, rows: &mut Block) {
    for (j, row) in rows.iter_mut().enumerate().take(positions) {
        copy(&mut row[..dims.head_dim], &x[dims.row(j, h)..]);
    }
}

/// The transpose of [`pack_rows`]: `columns[e][j]` is row `j`'s element `e`.
#[inline(always)]
fn pack_columns(dims: &Dims, x: &[f32], h: usize, positions: usize, columns: &mut Block) {
    for j in 0..positions {
        let row = &x[dims.row(j, h)..][..dims.head_dim];
        for (column, &value) in columns.iter_mut().zip(row) {
            column[j] = value;
        }
    }
}

/// `to ← from[..to.len()]`: a whole row as one array copy (inlined, where a
/// copy of a length known only at run time calls `memmove`), else element
/// by element.
#[inline(always)]
fn copy(to: &mut [f32], from: &[f32]) {
    match (<&mut Row>::try_from(&mut *to), from.get(..LANES)) {
        (Ok(to), Some(from)) => {
            if let Ok(from) = <&Row>::try_from(from) {
                *to = *from;
            }
        }
        _ => {
            for (to, &from) in to.iter_mut().zip(from) {
                *to = from;
            }
        }
    }
}

/// `out[i] = Σ_t w(i, t)·rows[t]` for the first `count` rows of `out`,
/// over the first `terms` rows (the batched products' register-blocked
/// sums, `small_products::row_products`).
#[inline(always)]
fn products(
    out: &mut Block,
    count: usize,
    w: impl Fn(usize, usize) -> f32,
    rows: &Block,
    terms: usize,
) {
    row_products(count, &rows[..terms], w, |i, sum| out[i] = *sum);
}

/// One sequence's forward (see [`super::attention`]). The scores are
/// taken by key (`scores[j][i]`, a lane per query), so the softmax of
/// every query row of a head runs at once, lane by lane.
#[inline(always)]
pub(super) fn forward(dims: &Dims, [q, k, v]: [&[f32]; 3], out: &mut [f32], weights: &mut [f32]) {
    let (d, keys, queries) = (dims.head_dim, dims.keys, dims.queries);
    let (mut qt, mut k_rows, mut v_rows) = (ZERO, ZERO, ZERO);
    let (mut scores, mut o) = (ZERO, ZERO);
    // Query `i` (a lane) sees key `j`.
    let seen = |j: usize, i: usize| !dims.causal || j <= i;
    for h in 0..dims.heads {
        pack_columns(dims, q, h, queries, &mut qt);
        pack_rows(dims, k, h, keys, &mut k_rows);
        pack_rows(dims, v, h, keys, &mut v_rows);
        products(&mut scores, keys, |j, e| k_rows[j][e], &qt, d);
        let mut max = [f32::NEG_INFINITY; LANES];
        for (j, row) in scores.iter_mut().enumerate().take(keys) {
            for (i, (score, max)) in row.iter_mut().zip(&mut max).enumerate() {
                *score *= dims.scale;
                if seen(j, i) {
                    *max = max.max(*score);
                }
            }
        }
        let mut total = [0.0f32; LANES];
        for (j, row) in scores.iter_mut().enumerate().take(keys) {
            for (i, ((score, &max), total)) in row.iter_mut().zip(&max).zip(&mut total).enumerate()
            {
                *score = if seen(j, i) { exp(*score - max) } else { 0.0 };
                *total += *score;
            }
        }
        for row in scores.iter_mut().take(keys) {
            for (score, &total) in row.iter_mut().zip(&total) {
                *score /= total;
            }
        }
        for i in 0..queries {
            let kept = &mut weights[dims.weights_row(h, i)..][..keys];
            for (kept, row) in kept.iter_mut().zip(&scores) {
                *kept = row[i];
            }
        }
        products(&mut o, queries, |i, j| scores[j][i], &v_rows, keys);
        for (i, row) in o.iter().enumerate().take(queries) {
            copy(&mut out[dims.row(i, h)..][..d], row);
        }
    }
}

/// One sequence's backward per query row (see
/// [`super::attention_backward_queries`]).
#[inline(always)]
pub(super) fn queries(
    dims: &Dims,
    [k, v, weights, grad_out]: [&[f32]; 4],
    scores: &mut [f32],
    grad_q: &mut [f32],
) {
    let (d, keys, queries) = (dims.head_dim, dims.keys, dims.queries);
    let (mut g_rows, mut k_rows, mut vt) = (ZERO, ZERO, ZERO);
    let (mut dp, mut ds, mut dq) = (ZERO, ZERO, ZERO);
    for h in 0..dims.heads {
        pack_rows(dims, grad_out, h, queries, &mut g_rows);
        pack_rows(dims, k, h, keys, &mut k_rows);
        pack_columns(dims, v, h, keys, &mut vt);
        products(&mut dp, queries, |i, e| g_rows[i][e], &vt, d);
        for (i, (dp, ds)) in dp.iter().zip(&mut ds).take(queries).enumerate() {
            let visible = dims.visible(i);
            let at = dims.weights_row(h, i);
            let w = &weights[at..][..keys];
            let mut total = 0.0;
            for (&w, &p) in w.iter().zip(dp).take(visible) {
                total += w * p;
            }
            let kept = &mut scores[at..][..keys];
            for (((s, kept), &w), &p) in ds.iter_mut().zip(kept.iter_mut()).zip(w).zip(dp) {
                *s = w * (p - total);
                *kept = *s;
            }
            for (s, kept) in ds.iter_mut().zip(kept).skip(visible) {
                (*s, *kept) = (0.0, 0.0);
            }
        }
        products(&mut dq, queries, |i, j| ds[i][j], &k_rows, keys);
        for (i, row) in dq.iter_mut().enumerate().take(queries) {
            for x in row.iter_mut() {
                *x *= dims.scale;
            }
            copy(&mut grad_q[dims.row(i, h)..][..d], row);
        }
    }
}

/// One sequence's backward per key row (see
/// [`super::attention_backward_keys`]).
#[inline(always)]
pub(super) fn keys(
    dims: &Dims,
    [q, weights, grad_out, scores]: [&[f32]; 4],
    grad_k: &mut [f32],
    grad_v: &mut [f32],
) {
    let (d, keys, queries) = (dims.head_dim, dims.keys, dims.queries);
    let (mut q_rows, mut g_rows) = (ZERO, ZERO);
    let (mut st, mut wt, mut dk, mut dv) = (ZERO, ZERO, ZERO, ZERO);
    for h in 0..dims.heads {
        pack_rows(dims, q, h, queries, &mut q_rows);
        pack_rows(dims, grad_out, h, queries, &mut g_rows);
        // The weights and scores by key: column i of row j is query i's.
        for i in 0..queries {
            let at = dims.weights_row(h, i);
            for j in 0..keys {
                st[j][i] = scores[at + j];
                wt[j][i] = weights[at + j];
            }
        }
        products(&mut dk, keys, |j, i| st[j][i], &q_rows, queries);
        products(&mut dv, keys, |j, i| wt[j][i], &g_rows, queries);
        for j in 0..keys {
            let at = dims.row(j, h);
            for x in dk[j].iter_mut() {
                *x *= dims.scale;
            }
            copy(&mut grad_k[at..][..d], &dk[j]);
            copy(&mut grad_v[at..][..d], &dv[j]);
        }
    }
}
