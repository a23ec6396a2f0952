// Control kernels: the launch-overhead probe, the trap, the probe's identity.

extern "C" __global__ void cistern_empty() {}

// A real sticky fault: the context is unusable until it is reset.
extern "C" __global__ void cistern_trap() { __trap(); }

// out[i] = x[i]: the recovery probe's kernel (deliberately a kernel, not a
// driver copy, so the probe proves kernels run).
extern "C" __global__ void cistern_identity(const float* x, float* out, u64 n) {
    CISTERN_GRID_STRIDE(i, n) { out[i] = x[i]; }
}
