// The maximum over one dimension and its backward (kernels/src/max.rs):
// x is outer×dim×inner; the values and indices (int words) outer×inner.
// A thread per output element scans its dim elements in order (the first
// maximum, or the first NaN, wins); the backward a thread per input element.

__device__ __forceinline__ bool cistern_max_replaces(float v, float best) {
    if (isnan(best)) { return false; }
    return isnan(v) || v > best;
}

extern "C" __global__ void cistern_max_dim(
    const float* x, float* values, int* indices, u64 outer, u64 dim, u64 inner) {
    CISTERN_GRID_STRIDE(j, outer * inner) {
        const float* first = x + (j / inner) * dim * inner + j % inner;
        float best = first[0];
        int index = 0;
        for (u64 k = 1; k < dim; ++k) {
            float v = first[k * inner];
            if (cistern_max_replaces(v, best)) {
                best = v;
                index = (int)k;
            }
        }
        values[j] = best;
        indices[j] = index;
    }
}

extern "C" __global__ void cistern_max_dim_backward(
    const int* indices, const float* grad_out, float* grad_x, u64 outer, u64 dim, u64 inner) {
    CISTERN_GRID_STRIDE(n, outer * dim * inner) {
        u64 j = (n / (dim * inner)) * inner + n % inner;
        u64 k = (n / inner) % dim;
        grad_x[n] = (indices[j] >= 0 && (u64)indices[j] == k) ? grad_out[j] : 0.0f;
    }
}
