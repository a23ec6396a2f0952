// Fused optimizer steps over one contiguous run of a segment table; each
// matches its CPU function in kernels/src/optimizer/ operation for
// operation (the program is compiled with --fmad=false, so no product is
// fused into an add the CPU keeps apart). The per-step constants come as
// arguments, computed on the host in f64 as the CPU does, except in a
// counted step (`count` non-null): there each block computes them in
// double from the device's count, and cistern_step_count_advance, queued
// after the step, advances the count.
//
// `flag` (AMP's found-inf, or null) set: the step changes nothing.
//
// Each step is one element function run over the whole range: through
// float4 (16-byte) loads and stores where every buffer it touches is
// 16-byte aligned, then element by element for the last n mod 4 (and for
// all of it otherwise). A buffer a step does not use may be null; it is
// never read, and a local stands in for its element.

// Lane k (0..3) of a float4.
__device__ __forceinline__ float& cistern_lane(float4& v, int k) {
    return k == 0 ? v.x : (k == 1 ? v.y : (k == 2 ? v.z : v.w));
}

// Whether p is null or 16-byte aligned: a buffer's float4 path is open.
__device__ __forceinline__ bool cistern_quads_ok(const float* p) {
    return p == 0 || cistern_aligned16(p);
}

// The float4 at quad q of p, or zeros for an unused (null) buffer.
__device__ __forceinline__ float4 cistern_quad(const float* p, u64 q) {
    return p == 0 ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : reinterpret_cast<const float4*>(p)[q];
}

// Stores a float4 at quad q of p, unless p is an unused (null) buffer.
__device__ __forceinline__ void cistern_store_quad(float* p, u64 q, float4 v) {
    if (p != 0) { reinterpret_cast<float4*>(p)[q] = v; }
}

// Element i of p, or 0 for an unused (null) buffer.
__device__ __forceinline__ float cistern_at(const float* p, u64 i) {
    return p == 0 ? 0.0f : p[i];
}

// Stores element i of p, unless p is an unused (null) buffer.
__device__ __forceinline__ void cistern_store(float* p, u64 i, float v) {
    if (p != 0) { p[i] = v; }
}

// Runs element(p, g, s0, s1, s2) over every index below n: p and the state
// buffers s0..s2 (null where unused) are read and written, g only read.
template <typename Element>
__device__ __forceinline__ void cistern_stream_step(
    float* p, const float* g, float* s0, float* s1, float* s2, u64 n, Element element) {
    u64 quads = 0;
    if (cistern_aligned16(p) && cistern_aligned16(g) && cistern_quads_ok(s0)
        && cistern_quads_ok(s1) && cistern_quads_ok(s2)) {
        quads = n / 4;
    }
    CISTERN_GRID_STRIDE(q, quads) {
        float4 vp = reinterpret_cast<float4*>(p)[q];
        float4 vg = reinterpret_cast<const float4*>(g)[q];
        float4 v0 = cistern_quad(s0, q), v1 = cistern_quad(s1, q), v2 = cistern_quad(s2, q);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            element(cistern_lane(vp, k), cistern_lane(vg, k), cistern_lane(v0, k),
                    cistern_lane(v1, k), cistern_lane(v2, k));
        }
        reinterpret_cast<float4*>(p)[q] = vp;
        cistern_store_quad(s0, q, v0);
        cistern_store_quad(s1, q, v1);
        cistern_store_quad(s2, q, v2);
    }
    CISTERN_GRID_STRIDE(r, n - quads * 4) {
        u64 i = quads * 4 + r;
        float vp = p[i], vg = g[i];
        float v0 = cistern_at(s0, i), v1 = cistern_at(s1, i), v2 = cistern_at(s2, i);
        element(vp, vg, v0, v1, v2);
        p[i] = vp;
        cistern_store(s0, i, v0);
        cistern_store(s1, i, v1);
        cistern_store(s2, i, v2);
    }
}

// Whether this step is skipped; *step is its count (counted steps only).
__device__ __forceinline__ bool cistern_step_skipped(
    const float* flag, const float* count, unsigned* step) {
    if (flag != 0 && flag[0] != 0.0f) { return true; }
    if (count != 0) {
        unsigned done = __float_as_uint(count[0]);
        // The CPU refuses a count that would overflow u32; the device skips.
        if (done == 0xffffffffu) { return true; }
        *step = done + 1u;
    }
    return false;
}

// One thread: count ← count + 1 unless the step was skipped (as above).
extern "C" __global__ void cistern_step_count_advance(const float* flag, float* count) {
    if (blockIdx.x != 0 || threadIdx.x != 0) { return; }
    if (flag[0] != 0.0f) { return; }
    unsigned done = __float_as_uint(count[0]);
    if (done != 0xffffffffu) { count[0] = __uint_as_float(done + 1u); }
}

// SGD. ops: 1 weight decay, 2 momentum buffer, 4 first step, 8 nesterov.
extern "C" __global__ void cistern_sgd(
    float* p, const float* g, float* buf, const float* flag, const float* count,
    float sign, float weight_decay, float lr, float momentum,
    float one_minus_dampening, int ops, u64 n) {
    unsigned step = 0;
    if (cistern_step_skipped(flag, count, &step)) { return; }
    bool first = (ops & 4) != 0;
    if (count != 0) { first = step == 1u; }
    float* momentum_buffer = (ops & 2) ? buf : 0;
    cistern_stream_step(p, g, momentum_buffer, 0, 0, n,
        [=](float& param, float grad, float& b_i, float&, float&) {
            float d = grad * sign;
            if (ops & 1) { d = d + weight_decay * param; }
            if (ops & 2) {
                float b = first ? d : momentum * b_i + one_minus_dampening * d;
                b_i = b;
                float s = (ops & 8) ? d + momentum * b : b;
                param = param - lr * s;
            } else {
                param = param - lr * d;
            }
        });
}

// Adam and AdamW. ops: 1 coupled (L2) decay, 2 amsgrad. A counted step
// computes step_size and inv_bias_correction2_sqrt from lr, beta1, beta2.
extern "C" __global__ void cistern_adam(
    float* p, const float* g, float* m, float* v, float* max_v,
    const float* flag, const float* count,
    float sign, float coupled_decay, float decay_factor, float one_minus_beta1,
    float beta2, float one_minus_beta2, float step_size,
    float inv_bias_correction2_sqrt, float eps,
    double lr, double beta1_64, double beta2_64, int ops, u64 n) {
    __shared__ float constants[2];
    unsigned step = 0;
    if (cistern_step_skipped(flag, count, &step)) { return; }
    if (count != 0) {
        if (threadIdx.x == 0) {
            double t = (double)step;
            double bias_correction1 = 1.0 - pow(beta1_64, t);
            double bias_correction2 = 1.0 - pow(beta2_64, t);
            constants[0] = (float)(lr / bias_correction1);
            constants[1] = (float)(1.0 / sqrt(bias_correction2));
        }
        __syncthreads();
        step_size = constants[0];
        inv_bias_correction2_sqrt = constants[1];
    }
    float* max_second = (ops & 2) ? max_v : 0;
    cistern_stream_step(p, g, m, v, max_second, n,
        [=](float& p_i, float g_i, float& m_old, float& v_old, float& max_i) {
            float grad = g_i * sign;
            if (ops & 1) { grad = grad + coupled_decay * p_i; }
            float param = p_i * decay_factor;
            float m_i = m_old + one_minus_beta1 * (grad - m_old);
            float v_i = v_old * beta2 + one_minus_beta2 * grad * grad;
            m_old = m_i;
            v_old = v_i;
            float second = v_i;
            if (ops & 2) {
                // NaN in v wins, as with torch.maximum.
                float old = max_i;
                second = old >= v_i ? old : v_i;
                max_i = second;
            }
            float denom = sqrtf(second) * inv_bias_correction2_sqrt + eps;
            p_i = param - step_size * (m_i / denom);
        });
}

// RMSprop. ops: 1 weight decay, 2 momentum buffer, 4 centered (grad_avg).
extern "C" __global__ void cistern_rmsprop(
    float* p, const float* g, float* square_avg, float* momentum_buffer, float* grad_avg,
    const float* flag, const float* count,
    float sign, float weight_decay, float lr, float alpha, float one_minus_alpha,
    float eps, float momentum, int ops, u64 n) {
    unsigned step = 0;
    if (cistern_step_skipped(flag, count, &step)) { return; }
    float* buffer = (ops & 2) ? momentum_buffer : 0;
    float* average = (ops & 4) ? grad_avg : 0;
    cistern_stream_step(p, g, square_avg, buffer, average, n,
        [=](float& p_i, float g_i, float& sq_i, float& b_i, float& ga_i) {
            // PyTorch's CPU order, with the FMAs its kernels form
            // (kernels/src/optimizer/rmsprop.rs).
            float grad = g_i * sign;
            if (ops & 1) { grad = fmaf(p_i, weight_decay, grad); }
            float sq = fmaf(one_minus_alpha * grad, grad, sq_i * alpha);
            sq_i = sq;
            float avg;
            if (ops & 4) {
                float ga = fmaf(one_minus_alpha, grad - ga_i, ga_i);
                ga_i = ga;
                avg = sqrtf(fmaf(-ga, ga, sq)) + eps;
            } else {
                avg = sqrtf(sq) + eps;
            }
            if (ops & 2) {
                float b = b_i * momentum + grad / avg;
                b_i = b;
                p_i = fmaf(b, -lr, p_i);
            } else {
                p_i = p_i + (-lr * grad) / avg;
            }
        });
}

// Adagrad. ops: 1 weight decay. A counted step computes the decayed
// learning rate from lr and lr_decay.
extern "C" __global__ void cistern_adagrad(
    float* p, const float* g, float* sum, const float* flag, const float* count,
    float sign, float weight_decay, float clr, float eps,
    double lr, double lr_decay, int ops, u64 n) {
    unsigned step = 0;
    if (cistern_step_skipped(flag, count, &step)) { return; }
    if (count != 0) { clr = (float)(lr / (1.0 + (double)(step - 1u) * lr_decay)); }
    cistern_stream_step(p, g, sum, 0, 0, n,
        [=](float& p_i, float g_i, float& sum_i, float&, float&) {
            float grad = g_i * sign;
            if (ops & 1) { grad = grad + weight_decay * p_i; }
            float total = sum_i + grad * grad;
            sum_i = total;
            p_i = p_i - clr * (grad / (sqrtf(total) + eps));
        });
}
