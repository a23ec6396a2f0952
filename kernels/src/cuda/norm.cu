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

// The counted form: the step counter (a u32 in a float's bits) is added to
// the seed's high word.
extern "C" __global__ void cistern_dropout_counted(
    const float* x, const float* counter, float* out, unsigned int seed_lo,
    unsigned int seed_hi, unsigned int threshold, float scale, u64 n) {
    unsigned int high = seed_hi + __float_as_uint(counter[0]);
    unsigned int key = cistern_lowbias32(seed_lo ^ cistern_lowbias32(high));
    CISTERN_GRID_STRIDE(i, n) {
        bool keep = (cistern_lowbias32((unsigned int)i ^ key) >> 8) >= threshold;
        out[i] = keep ? x[i] * scale : 0.0f;
    }
}

// A resident dataset's batch (kernels/src/dataset.rs): the batch of step
// counter[0] through a keyed Feistel permutation of the rows, one thread per
// word of x and y; then cistern_batch_gather_advance, queued after it,
// advances the counter.
__device__ unsigned int cistern_shuffled(unsigned int position, unsigned int rows,
                                         unsigned int key) {
    unsigned int bits = rows > 1u ? 32u - __clz(rows - 1u) : 0u;
    if (bits < 2u) bits = 2u;
    unsigned int half = (bits + 1u) / 2u;
    unsigned int mask = (1u << half) - 1u;
    unsigned int x = position;
    for (;;) {
        unsigned int left = x >> half, right = x & mask;
        for (unsigned int round = 0u; round < 4u; ++round) {
            unsigned int f = cistern_lowbias32(right ^ (key + round * 0x9e3779b9u)) & mask;
            unsigned int t = left ^ f;
            left = right;
            right = t;
        }
        x = (left << half) | right;
        if (x < rows) return x;
    }
}

extern "C" __global__ void cistern_batch_gather(
    const float* features, const float* targets, const float* counter, float* x, float* y,
    unsigned int rows, unsigned int width, unsigned int target_width, unsigned int batch,
    unsigned int seed_lo, unsigned int seed_hi, u64 n) {
    unsigned int step = __float_as_uint(counter[0]);
    unsigned int per_epoch = rows / batch;
    if (per_epoch == 0u) per_epoch = 1u;
    unsigned int seed_key = cistern_lowbias32(seed_lo ^ cistern_lowbias32(seed_hi));
    unsigned int key = cistern_lowbias32((step / per_epoch) ^ seed_key);
    unsigned int slot = step % per_epoch;
    u64 words = (u64)width + target_width;
    CISTERN_GRID_STRIDE(i, n) {
        unsigned int r = (unsigned int)(i / words);
        unsigned int c = (unsigned int)(i % words);
        unsigned int row = cistern_shuffled(slot * batch + r, rows, key);
        if (c < width) {
            x[(u64)r * width + c] = features[(u64)row * width + c];
        } else {
            unsigned int t = c - width;
            y[(u64)r * target_width + t] = targets[(u64)row * target_width + t];
        }
    }
}

extern "C" __global__ void cistern_batch_gather_advance(float* counter) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        counter[0] = __uint_as_float(__float_as_uint(counter[0]) + 1u);
    }
}
