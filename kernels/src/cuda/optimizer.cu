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
    CISTERN_GRID_STRIDE(i, n) {
        float d = g[i] * sign;
        if (ops & 1) { d = d + weight_decay * p[i]; }
        if (ops & 2) {
            float b = first ? d : momentum * buf[i] + one_minus_dampening * d;
            buf[i] = b;
            float s = (ops & 8) ? d + momentum * b : b;
            p[i] = p[i] - lr * s;
        } else {
            p[i] = p[i] - lr * d;
        }
    }
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
    CISTERN_GRID_STRIDE(i, n) {
        float grad = g[i] * sign;
        if (ops & 1) { grad = grad + coupled_decay * p[i]; }
        float param = p[i] * decay_factor;
        float m_i = m[i] + one_minus_beta1 * (grad - m[i]);
        float v_i = v[i] * beta2 + one_minus_beta2 * grad * grad;
        m[i] = m_i;
        v[i] = v_i;
        float second = v_i;
        if (ops & 2) {
            // NaN in v wins, as with torch.maximum.
            float old = max_v[i];
            second = old >= v_i ? old : v_i;
            max_v[i] = second;
        }
        float denom = sqrtf(second) * inv_bias_correction2_sqrt + eps;
        p[i] = param - step_size * (m_i / denom);
    }
}

// RMSprop. ops: 1 weight decay, 2 momentum buffer, 4 centered (grad_avg).
extern "C" __global__ void cistern_rmsprop(
    float* p, const float* g, float* square_avg, float* momentum_buffer, float* grad_avg,
    const float* flag, const float* count,
    float sign, float weight_decay, float lr, float alpha, float one_minus_alpha,
    float eps, float momentum, int ops, u64 n) {
    unsigned step = 0;
    if (cistern_step_skipped(flag, count, &step)) { return; }
    CISTERN_GRID_STRIDE(i, n) {
        float grad = g[i] * sign;
        if (ops & 1) { grad = grad + weight_decay * p[i]; }
        float sq = square_avg[i] * alpha + one_minus_alpha * grad * grad;
        square_avg[i] = sq;
        float avg;
        if (ops & 4) {
            float ga = grad_avg[i] + one_minus_alpha * (grad - grad_avg[i]);
            grad_avg[i] = ga;
            avg = sqrtf(sq - ga * ga) + eps;
        } else {
            avg = sqrtf(sq) + eps;
        }
        if (ops & 2) {
            float b = momentum_buffer[i] * momentum + grad / avg;
            momentum_buffer[i] = b;
            p[i] = p[i] - lr * b;
        } else {
            p[i] = p[i] - lr * (grad / avg);
        }
    }
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
    CISTERN_GRID_STRIDE(i, n) {
        float grad = g[i] * sign;
        if (ops & 1) { grad = grad + weight_decay * p[i]; }
        float total = sum[i] + grad * grad;
        sum[i] = total;
        p[i] = p[i] - clr * (grad / (sqrtf(total) + eps));
    }
}
