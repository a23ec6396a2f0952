// Multi-head attention over heads in place; matches kernels/src/attention.rs
// (every sum in order). q and the output are [batch, queries, heads,
// head_dim], k and v [batch, keys, heads, head_dim], the weights [batch,
// heads, queries, keys].

__device__ u64 cistern_attention_row(u64 b, u64 positions, u64 p, u64 h, u64 heads, u64 dim) {
    return ((b * positions + p) * heads + h) * dim;
}

// Row r = (b·heads + h)·positions + p as (b, h, p).
__device__ void cistern_attention_unpack(u64 r, u64 positions, u64 heads, u64* b, u64* h, u64* p) {
    *b = r / (positions * heads);
    *h = (r / positions) % heads;
    *p = r % positions;
}

// One thread per query row r = (b·heads + h)·queries + i.
extern "C" __global__ void cistern_attention(
    const float* q, const float* k, const float* v, float* out, float* weights,
    u64 batch, u64 heads, u64 queries, u64 keys, u64 dim, u64 causal, float scale) {
    CISTERN_GRID_STRIDE(r, batch * heads * queries) {
        u64 b, h, i;
        cistern_attention_unpack(r, queries, heads, &b, &h, &i);
        const float* query = q + cistern_attention_row(b, queries, i, h, heads, dim);
        float* w = weights + r * keys;
        u64 visible = causal ? (i + 1 < keys ? i + 1 : keys) : keys;
        float top = __int_as_float(0xff800000);
        for (u64 j = 0; j < visible; ++j) {
            const float* key = k + cistern_attention_row(b, keys, j, h, heads, dim);
            float dot = 0.0f;
            for (u64 e = 0; e < dim; ++e) { dot += query[e] * key[e]; }
            w[j] = dot * scale;
            top = fmaxf(top, w[j]);
        }
        float total = 0.0f;
        for (u64 j = 0; j < visible; ++j) { w[j] = expf(w[j] - top); total += w[j]; }
        for (u64 j = 0; j < visible; ++j) { w[j] /= total; }
        for (u64 j = visible; j < keys; ++j) { w[j] = 0.0f; }
        float* o = out + cistern_attention_row(b, queries, i, h, heads, dim);
        for (u64 e = 0; e < dim; ++e) {
            float acc = 0.0f;
            for (u64 j = 0; j < visible; ++j) {
                acc += w[j] * v[cistern_attention_row(b, keys, j, h, heads, dim) + e];
            }
            o[e] = acc;
        }
    }
}

// One thread per query row, as the forward.
extern "C" __global__ void cistern_attention_backward_queries(
    const float* k, const float* v, const float* weights, const float* grad_out,
    float* grad_scores, float* grad_q,
    u64 batch, u64 heads, u64 queries, u64 keys, u64 dim, u64 causal, float scale) {
    CISTERN_GRID_STRIDE(r, batch * heads * queries) {
        u64 b, h, i;
        cistern_attention_unpack(r, queries, heads, &b, &h, &i);
        const float* g = grad_out + cistern_attention_row(b, queries, i, h, heads, dim);
        const float* w = weights + r * keys;
        float* ds = grad_scores + r * keys;
        u64 visible = causal ? (i + 1 < keys ? i + 1 : keys) : keys;
        float weighted = 0.0f;
        for (u64 j = 0; j < visible; ++j) {
            const float* value = v + cistern_attention_row(b, keys, j, h, heads, dim);
            float dot = 0.0f;
            for (u64 e = 0; e < dim; ++e) { dot += g[e] * value[e]; }
            ds[j] = dot;
            weighted += w[j] * dot;
        }
        for (u64 j = 0; j < visible; ++j) { ds[j] = w[j] * (ds[j] - weighted); }
        for (u64 j = visible; j < keys; ++j) { ds[j] = 0.0f; }
        float* gq = grad_q + cistern_attention_row(b, queries, i, h, heads, dim);
        for (u64 e = 0; e < dim; ++e) {
            float acc = 0.0f;
            for (u64 j = 0; j < visible; ++j) {
                acc += ds[j] * k[cistern_attention_row(b, keys, j, h, heads, dim) + e];
            }
            gq[e] = acc * scale;
        }
    }
}

// One thread per key row r = (b·heads + h)·keys + j.
extern "C" __global__ void cistern_attention_backward_keys(
    const float* q, const float* weights, const float* grad_out, const float* grad_scores,
    float* grad_k, float* grad_v,
    u64 batch, u64 heads, u64 queries, u64 keys, u64 dim, u64 causal, float scale) {
    (void)causal;
    CISTERN_GRID_STRIDE(r, batch * heads * keys) {
        u64 b, h, j;
        cistern_attention_unpack(r, keys, heads, &b, &h, &j);
        u64 at = cistern_attention_row(b, keys, j, h, heads, dim);
        u64 first = (b * heads + h) * queries;
        for (u64 e = 0; e < dim; ++e) {
            float dk = 0.0f, dv = 0.0f;
            for (u64 i = 0; i < queries; ++i) {
                u64 w = (first + i) * keys + j;
                u64 row = cistern_attention_row(b, queries, i, h, heads, dim) + e;
                dk += grad_scores[w] * q[row];
                dv += weights[w] * grad_out[row];
            }
            grad_k[at + e] = dk * scale;
            grad_v[at + e] = dv;
        }
    }
}
