// Streaming element-wise kernels; each matches kernels/src/elementwise.rs.
// The bulk goes through float4 (16-byte) loads when every pointer allows.

extern "C" __global__ void cistern_fill(float* x, float value, u64 n) {
    if (cistern_aligned16(x)) {
        u64 quads = n / 4;
        float4 v = make_float4(value, value, value, value);
        CISTERN_GRID_STRIDE(q, quads) { reinterpret_cast<float4*>(x)[q] = v; }
        CISTERN_GRID_STRIDE(i, n - quads * 4) { x[quads * 4 + i] = value; }
    } else {
        CISTERN_GRID_STRIDE(i, n) { x[i] = value; }
    }
}

extern "C" __global__ void cistern_scale(float* x, float factor, u64 n) {
    if (cistern_aligned16(x)) {
        u64 quads = n / 4;
        CISTERN_GRID_STRIDE(q, quads) {
            float4 v = reinterpret_cast<float4*>(x)[q];
            v.x *= factor; v.y *= factor; v.z *= factor; v.w *= factor;
            reinterpret_cast<float4*>(x)[q] = v;
        }
        CISTERN_GRID_STRIDE(i, n - quads * 4) { x[quads * 4 + i] *= factor; }
    } else {
        CISTERN_GRID_STRIDE(i, n) { x[i] *= factor; }
    }
}

// a <- a + alpha * c, the product rounded before the add, as the CPU's
// `*a += s * c` (and --fmad=false keeps them apart).
extern "C" __global__ void cistern_axpy(float* a, float alpha, const float* c, u64 n) {
    if (cistern_aligned16(a) && cistern_aligned16(c)) {
        u64 quads = n / 4;
        CISTERN_GRID_STRIDE(q, quads) {
            float4 va = reinterpret_cast<float4*>(a)[q];
            float4 vc = reinterpret_cast<const float4*>(c)[q];
            va.x = va.x + alpha * vc.x; va.y = va.y + alpha * vc.y;
            va.z = va.z + alpha * vc.z; va.w = va.w + alpha * vc.w;
            reinterpret_cast<float4*>(a)[q] = va;
        }
        CISTERN_GRID_STRIDE(i, n - quads * 4) {
            u64 j = quads * 4 + i;
            a[j] = a[j] + alpha * c[j];
        }
    } else {
        CISTERN_GRID_STRIDE(i, n) { a[i] = a[i] + alpha * c[i]; }
    }
}

// op 0: out = a + b; op 1: out = a * b.
__device__ __forceinline__ float cistern_binary(int op, float a, float b) {
    return op == 0 ? a + b : a * b;
}

extern "C" __global__ void cistern_binary_op(
    int op, const float* a, const float* b, float* out, u64 n) {
    if (cistern_aligned16(a) && cistern_aligned16(b) && cistern_aligned16(out)) {
        u64 quads = n / 4;
        CISTERN_GRID_STRIDE(q, quads) {
            float4 va = reinterpret_cast<const float4*>(a)[q];
            float4 vb = reinterpret_cast<const float4*>(b)[q];
            float4 r;
            r.x = cistern_binary(op, va.x, vb.x); r.y = cistern_binary(op, va.y, vb.y);
            r.z = cistern_binary(op, va.z, vb.z); r.w = cistern_binary(op, va.w, vb.w);
            reinterpret_cast<float4*>(out)[q] = r;
        }
        CISTERN_GRID_STRIDE(i, n - quads * 4) {
            u64 j = quads * 4 + i;
            out[j] = cistern_binary(op, a[j], b[j]);
        }
    } else {
        CISTERN_GRID_STRIDE(i, n) { out[i] = cistern_binary(op, a[i], b[i]); }
    }
}

// AMP: grads *= inv_scale; found_inf[0] = 1 when any gradient is not finite.
extern "C" __global__ void cistern_amp_unscale(
    float* grads, float inv_scale, float* found_inf, u64 n) {
    bool bad = false;
    CISTERN_GRID_STRIDE(i, n) {
        float g = grads[i];
        bad |= !isfinite(g);
        grads[i] = g * inv_scale;
    }
    if (bad) { found_inf[0] = 1.0f; }
}
