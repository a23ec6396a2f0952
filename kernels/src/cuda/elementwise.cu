// AMP's unscale; the plain element-wise kernels are made from their
// definitions (kernels/src/map/ops.rs, map/table.rs).

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
