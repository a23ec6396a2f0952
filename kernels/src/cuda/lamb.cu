// LAMB (apex FusedLAMB), matching kernels/src/optimizer/lamb.rs: two
// passes of cistern_lamb_measure, read back by the host between them,
// then cistern_lamb_write. Nothing is written to p, m or v before the host
// has seen every norm, so a refusal changes nothing.
//
// The work is a table of items, three u64 each (first element, elements,
// segment): each block takes items in turn, sums its share in double,
// reduces the block in a fixed order and adds the total to its segment's
// slot with one atomicAdd. Launched with CISTERN_REDUCE_THREADS threads.

// The constants of one step, as the CPU's LambScalars.
struct CisternLamb {
    int adam_w;
    float inv_clip, decay, beta1, beta2, beta3, one_minus_beta2;
    float inv_bias_correction1, inv_bias_correction2, eps;
};

// The update direction of one element; *m and *v become the new moments.
__device__ __forceinline__ float cistern_lamb_update(
    const CisternLamb& s, float p, float g, float* m, float* v) {
    g = g * s.inv_clip;
    if (!s.adam_w) { g = g + s.decay * p; }
    float m_i = *m * s.beta1 + s.beta3 * g;
    float v_i = *v * s.beta2 + s.one_minus_beta2 * g * g;
    float denom = sqrtf(v_i * s.inv_bias_correction2) + s.eps;
    float u = (m_i * s.inv_bias_correction1) / denom;
    if (s.adam_w) { u = u + s.decay * p; }
    *m = m_i;
    *v = v_i;
    return u;
}

// pass 0: sums[segment] += sum g^2. pass 1: sums[segments + segment] +=
// sum p^2 and sums[2 * segments + segment] += sum u^2, where u is NaN when
// a new moment is not finite (as the CPU's `measure`). sums starts zeroed.
extern "C" __global__ void cistern_lamb_measure(
    const float* p, const float* g, const float* m, const float* v,
    const u64* items, u64 item_count, double* sums, u64 segments, int pass,
    int adam_w, float inv_clip, float decay, float beta1, float beta2, float beta3,
    float one_minus_beta2, float inv_bias_correction1, float inv_bias_correction2,
    float eps) {
    const CisternLamb s = {adam_w, inv_clip, decay, beta1, beta2, beta3,
                           one_minus_beta2, inv_bias_correction1,
                           inv_bias_correction2, eps};
    for (u64 item = blockIdx.x; item < item_count; item += gridDim.x) {
        const u64 first = items[3 * item];
        const u64 len = items[3 * item + 1];
        const u64 segment = items[3 * item + 2];
        double first_acc = 0.0;
        double second_acc = 0.0;
        for (u64 i = threadIdx.x; i < len; i += CISTERN_REDUCE_THREADS) {
            const u64 e = first + i;
            if (pass == 0) {
                double gd = (double)g[e];
                first_acc += gd * gd;
            } else {
                float m_i = m[e];
                float v_i = v[e];
                float u = cistern_lamb_update(s, p[e], g[e], &m_i, &v_i);
                // x * 0 is +-0 for a finite x and NaN otherwise.
                u = u + (m_i * 0.0f + v_i * 0.0f);
                double pd = (double)p[e];
                double ud = (double)u;
                first_acc += pd * pd;
                second_acc += ud * ud;
            }
        }
        double first_total = cistern_block_sum(first_acc);
        __syncthreads();
        if (pass == 0) {
            if (threadIdx.x == 0) { atomicAdd(&sums[segment], first_total); }
        } else {
            double second_total = cistern_block_sum(second_acc);
            if (threadIdx.x == 0) {
                atomicAdd(&sums[segments + segment], first_total);
                atomicAdd(&sums[2 * segments + segment], second_total);
            }
        }
        // The next item's block sum reuses the shared partials.
        __syncthreads();
    }
}

// p <- p - ratios[segment] * u, with the new moments, over every item.
extern "C" __global__ void cistern_lamb_write(
    float* p, const float* g, float* m, float* v,
    const u64* items, u64 item_count, const float* ratios,
    int adam_w, float inv_clip, float decay, float beta1, float beta2, float beta3,
    float one_minus_beta2, float inv_bias_correction1, float inv_bias_correction2,
    float eps) {
    const CisternLamb s = {adam_w, inv_clip, decay, beta1, beta2, beta3,
                           one_minus_beta2, inv_bias_correction1,
                           inv_bias_correction2, eps};
    for (u64 item = blockIdx.x; item < item_count; item += gridDim.x) {
        const u64 first = items[3 * item];
        const u64 len = items[3 * item + 1];
        const float ratio = ratios[items[3 * item + 2]];
        for (u64 i = threadIdx.x; i < len; i += blockDim.x) {
            const u64 e = first + i;
            float m_i = m[e];
            float v_i = v[e];
            float param = p[e];
            float u = cistern_lamb_update(s, param, g[e], &m_i, &v_i);
            m[e] = m_i;
            v[e] = v_i;
            p[e] = param - ratio * u;
        }
    }
}
