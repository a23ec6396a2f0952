// Reductions; each matches kernels/src/reduce.rs, accumulating in double as
// the CPU does. One block of CISTERN_REDUCE_THREADS threads per output, so
// the order of additions is fixed: results repeat run to run.

#define CISTERN_REDUCE_THREADS 256

// The block's threads' `value`s summed; thread 0 gets the total.
__device__ double cistern_block_sum(double value) {
    __shared__ double partial[CISTERN_REDUCE_THREADS];
    partial[threadIdx.x] = value;
    __syncthreads();
    for (unsigned s = CISTERN_REDUCE_THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) { partial[threadIdx.x] += partial[threadIdx.x + s]; }
        __syncthreads();
    }
    return partial[0];
}

// out[0] = sum (pred - target)^2 / n; launched as one block.
extern "C" __global__ void cistern_mse_loss(
    const float* pred, const float* target, float* out, u64 n) {
    double acc = 0.0;
    for (u64 i = threadIdx.x; i < n; i += CISTERN_REDUCE_THREADS) {
        double d = (double)pred[i] - (double)target[i];
        acc += d * d;
    }
    double total = cistern_block_sum(acc);
    if (threadIdx.x == 0) { out[0] = (float)(total / (double)n); }
}

// out[j] = sum_i x[i][j] over a row-major rows x cols matrix.
extern "C" __global__ void cistern_column_sum(const float* x, u64 rows, u64 cols, float* out) {
    CISTERN_GRID_STRIDE(j, cols) {
        double acc = 0.0;
        for (u64 r = 0; r < rows; ++r) { acc += (double)x[r * cols + j]; }
        out[j] = (float)acc;
    }
}

// One segment, launched as one block: out[0] = sum x (squares == 0) or
// sum x^2 (squares != 0) over x[0..len].
extern "C" __global__ void cistern_segment_sum(const float* x, u64 len, int squares, float* out) {
    double acc = 0.0;
    for (u64 i = threadIdx.x; i < len; i += CISTERN_REDUCE_THREADS) {
        double v = (double)x[i];
        acc += squares ? v * v : v;
    }
    double total = cistern_block_sum(acc);
    if (threadIdx.x == 0) { out[0] = (float)total; }
}
