// Layer normalisation and embeddings; match kernels/src/norm.rs and
// kernels/src/embedding.rs. Layer norm: one thread per row, two passes in
// f32 as the CPU; stats are means then rstds (2·rows). The embedding
// backward: one thread per column, summing in index order (deterministic).

extern "C" __global__ void cistern_layer_norm(
    const float* x, const float* weight, const float* bias, float* y, float* stats,
    u64 rows, u64 cols, float eps) {
    CISTERN_GRID_STRIDE(r, rows) {
        const float* row = x + r * cols;
        float sum = 0.0f;
        for (u64 c = 0; c < cols; ++c) { sum += row[c]; }
        float mean = sum / (float)cols;
        float sq = 0.0f;
        for (u64 c = 0; c < cols; ++c) { float d = row[c] - mean; sq += d * d; }
        float rstd = 1.0f / sqrtf(sq / (float)cols + eps);
        stats[r] = mean;
        stats[rows + r] = rstd;
        for (u64 c = 0; c < cols; ++c) {
            float xhat = (row[c] - mean) * rstd;
            y[r * cols + c] = weight ? xhat * weight[c] + bias[c] : xhat;
        }
    }
}

extern "C" __global__ void cistern_layer_norm_backward(
    const float* x, const float* weight, const float* stats, const float* grad_y,
    float* grad_x, float* weighted, u64 rows, u64 cols) {
    CISTERN_GRID_STRIDE(r, rows) {
        const float* row = x + r * cols;
        const float* g = grad_y + r * cols;
        float mean = stats[r], rstd = stats[rows + r];
        float sum_h = 0.0f, sum_hx = 0.0f;
        for (u64 c = 0; c < cols; ++c) {
            float xhat = (row[c] - mean) * rstd;
            float h = g[c] * (weight ? weight[c] : 1.0f);
            sum_h += h;
            sum_hx += h * xhat;
            weighted[r * cols + c] = g[c] * xhat;
        }
        float mean_h = sum_h / (float)cols, mean_hx = sum_hx / (float)cols;
        for (u64 c = 0; c < cols; ++c) {
            float xhat = (row[c] - mean) * rstd;
            float h = g[c] * (weight ? weight[c] : 1.0f);
            grad_x[r * cols + c] = rstd * (h - mean_h - xhat * mean_hx);
        }
    }
}

extern "C" __global__ void cistern_embedding(
    const float* weight, const int* indices, float* out, u64 rows, u64 dim, u64 vocab) {
    CISTERN_GRID_STRIDE(i, rows * dim) {
        int t = indices[i / dim];
        out[i] = (t >= 0 && (u64)t < vocab) ? weight[(u64)t * dim + i % dim] : __int_as_float(0x7fc00000);
    }
}

extern "C" __global__ void cistern_embedding_backward(
    const int* indices, const float* grad_out, float* grad_weight, u64 rows, u64 dim, u64 vocab) {
    CISTERN_GRID_STRIDE(c, dim) {
        for (u64 v = 0; v < vocab; ++v) { grad_weight[v * dim + c] = 0.0f; }
        for (u64 i = 0; i < rows; ++i) {
            int t = indices[i];
            if (t >= 0 && (u64)t < vocab) { grad_weight[(u64)t * dim + c] += grad_out[i * dim + c]; }
        }
    }
}

// Dropout (kernels/src/dropout.rs): lowbias32 over (seed, i) in 32-bit
// unsigned arithmetic, kept when the hash's top 24 bits clear the threshold.
__device__ __forceinline__ unsigned int cistern_lowbias32(unsigned int x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

extern "C" __global__ void cistern_dropout(
    const float* x, float* out, unsigned int seed_lo, unsigned int seed_hi,
    unsigned int threshold, float scale, u64 n) {
    unsigned int key = cistern_lowbias32(seed_lo ^ cistern_lowbias32(seed_hi));
    CISTERN_GRID_STRIDE(i, n) {
        bool keep = (cistern_lowbias32((unsigned int)i ^ key) >> 8) >= threshold;
        out[i] = keep ? x[i] * scale : 0.0f;
    }
}
