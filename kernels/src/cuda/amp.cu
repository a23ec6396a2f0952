// AMP on device words; each matches kernels/src/optimizer/amp.rs. The
// tracker and skipped counts are u32s stored in f32 words.

// grads *= (float)(1 / (double)scale[0]); found_inf[0] = 1 when any
// gradient is not finite (never cleared).
extern "C" __global__ void cistern_amp_unscale_by_device_scale(
    float* grads, float* found_inf, const float* scale, u64 n) {
    const float inv_scale = (float)(1.0 / (double)scale[0]);
    bool bad = false;
    CISTERN_GRID_STRIDE(i, n) {
        float g = grads[i];
        bad |= !isfinite(g);
        grads[i] = g * inv_scale;
    }
    if (bad) { found_inf[0] = 1.0f; }
}

__device__ __forceinline__ bool cistern_is_normal(float x) {
    unsigned exponent = (__float_as_uint(x) >> 23) & 0xffu;
    return exponent != 0u && exponent != 0xffu;
}

__device__ __forceinline__ unsigned cistern_saturating_increment(unsigned x) {
    return x == 0xffffffffu ? x : x + 1u;
}

// PyTorch's _amp_update_scale_, one thread; the products in double, as
// the CPU computes them.
extern "C" __global__ void cistern_amp_update_scale(
    const float* found_inf, float* scale, float* tracker, float* skipped,
    double growth_factor, double backoff_factor, unsigned growth_interval) {
    if (blockIdx.x != 0 || threadIdx.x != 0) { return; }
    if (found_inf[0] != 0.0f) {
        float backed_off = (float)((double)scale[0] * backoff_factor);
        if (cistern_is_normal(backed_off)) { scale[0] = backed_off; }
        tracker[0] = __uint_as_float(0u);
        skipped[0] = __uint_as_float(cistern_saturating_increment(__float_as_uint(skipped[0])));
        return;
    }
    unsigned successful = cistern_saturating_increment(__float_as_uint(tracker[0]));
    if (successful < growth_interval) {
        tracker[0] = __uint_as_float(successful);
        return;
    }
    tracker[0] = __uint_as_float(0u);
    float grown = (float)((double)scale[0] * growth_factor);
    if (isfinite(grown)) { scale[0] = grown; }
}
