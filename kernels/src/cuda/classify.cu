// Classification kernels; each matches kernels/src/classify.rs. One thread
// per row (rows are independent; a row's classes are read in order), a row
// stabilised by its maximum. The reduced losses run as one block and sum
// with cistern_block_sum (reduce.cu).

#define CISTERN_NAN_F32 __int_as_float(0x7fc00000)
#define CISTERN_NAN_F64 __longlong_as_double(0x7ff8000000000000LL)

// The maximum of x[0..n] and ln sum exp(x - max).
__device__ void cistern_row_lse(const float* x, u64 n, float* max_out, float* log_sum_out) {
    float m = __int_as_float(0xff800000);
    for (u64 c = 0; c < n; ++c) { m = fmaxf(m, x[c]); }
    float s = 0.0f;
    for (u64 c = 0; c < n; ++c) { s += expf(x[c] - m); }
    *max_out = m;
    *log_sum_out = logf(s);
}

// y = softmax(x) (or log-softmax) per row of a rows x cols matrix.
extern "C" __global__ void cistern_softmax(
    const float* x, float* y, u64 rows, u64 cols, int log_softmax) {
    CISTERN_GRID_STRIDE(r, rows) {
        const float* row = x + r * cols;
        float* out = y + r * cols;
        float m, log_sum;
        cistern_row_lse(row, cols, &m, &log_sum);
        for (u64 c = 0; c < cols; ++c) {
            float v = row[c] - m - log_sum;
            out[c] = log_softmax ? v : expf(v);
        }
    }
}

// The input's gradient of softmax (or log-softmax) from its output y.
extern "C" __global__ void cistern_softmax_backward(
    const float* y, const float* g, float* grad, u64 rows, u64 cols, int log_softmax) {
    CISTERN_GRID_STRIDE(r, rows) {
        const float* yr = y + r * cols;
        const float* gr = g + r * cols;
        float* out = grad + r * cols;
        float acc = 0.0f;
        if (log_softmax) {
            for (u64 c = 0; c < cols; ++c) { acc += gr[c]; }
            for (u64 c = 0; c < cols; ++c) { out[c] = gr[c] - expf(yr[c]) * acc; }
        } else {
            for (u64 c = 0; c < cols; ++c) { acc += yr[c] * gr[c]; }
            for (u64 c = 0; c < cols; ++c) { out[c] = yr[c] * (gr[c] - acc); }
        }
    }
}

// Row r's class: -1 ignored, -2 out of range (never read through).
__device__ long long cistern_target_class(const int* targets, u64 r, u64 classes, int ignore_index) {
    int t = targets[r];
    if (t == ignore_index) { return -1; }
    if (t < 0 || (u64)t >= classes) { return -2; }
    return (long long)t;
}

__device__ double cistern_class_weight(const float* weight, u64 c) {
    return weight ? (double)weight[c] : 1.0;
}

// Row r's loss; *weight_out its weight in a mean's denominator.
__device__ double cistern_row_class_loss(
    const float* input, const int* targets, const float* weight, u64 r, u64 classes,
    int log_probs, int ignore_index, float smoothing, double* weight_out) {
    long long cls = cistern_target_class(targets, r, classes, ignore_index);
    if (cls == -1) { *weight_out = 0.0; return 0.0; }
    if (cls < 0) { *weight_out = CISTERN_NAN_F64; return CISTERN_NAN_F64; }
    const float* x = input + r * classes;
    double w = cistern_class_weight(weight, (u64)cls);
    *weight_out = w;
    if (log_probs) { return -w * (double)x[cls]; }
    float m, log_sum;
    cistern_row_lse(x, classes, &m, &log_sum);
    // -log p = log_sum - (x - max): shifted first, as PyTorch.
    double nll = w * ((double)log_sum - (double)(x[cls] - m));
    double eps = (double)smoothing;
    if (eps == 0.0) { return nll; }
    double smooth = 0.0;
    for (u64 c = 0; c < classes; ++c) {
        smooth += cistern_class_weight(weight, c) * ((double)log_sum - (double)(x[c] - m));
    }
    return (1.0 - eps) * nll + eps / (double)classes * smooth;
}

// reduction 0: out[r] per row (any grid); 1 mean, 2 sum: out[0], one block.
// weight is null when unweighted.
extern "C" __global__ void cistern_class_loss(
    const float* input, const int* targets, const float* weight, float* out, u64 rows,
    u64 classes, int log_probs, int reduction, int ignore_index, float smoothing) {
    double w;
    if (reduction == 0) {
        CISTERN_GRID_STRIDE(r, rows) {
            out[r] = (float)cistern_row_class_loss(
                input, targets, weight, r, classes, log_probs, ignore_index, smoothing, &w);
        }
        return;
    }
    double loss = 0.0, weights = 0.0;
    for (u64 r = threadIdx.x; r < rows; r += CISTERN_REDUCE_THREADS) {
        loss += cistern_row_class_loss(
            input, targets, weight, r, classes, log_probs, ignore_index, smoothing, &w);
        weights += w;
    }
    double total = cistern_block_sum(loss);
    // Every thread has read the first total before the second reuses the shared array.
    __syncthreads();
    double denominator = cistern_block_sum(weights);
    if (threadIdx.x == 0) { out[0] = (float)(reduction == 1 ? total / denominator : total); }
}

// The input's gradient, one pass per row: grad_output has one element
// (mean, sum) or one per row (none).
extern "C" __global__ void cistern_class_loss_backward(
    const float* input, const int* targets, const float* weight, const float* grad_output,
    float* grad, u64 rows, u64 classes, int log_probs, int reduction, int ignore_index,
    float smoothing) {
    double total_weight = weight ? 0.0 : (double)classes;
    if (weight) {
        for (u64 c = 0; c < classes; ++c) { total_weight += (double)weight[c]; }
    }
    double denominator = 1.0;
    if (reduction == 1) {
        denominator = 0.0;
        for (u64 i = 0; i < rows; ++i) {
            long long other = cistern_target_class(targets, i, classes, ignore_index);
            if (other >= 0) { denominator += cistern_class_weight(weight, (u64)other); }
            if (other == -2) { denominator = CISTERN_NAN_F64; }
        }
    }
    CISTERN_GRID_STRIDE(r, rows) {
        const float* x = input + r * classes;
        float* out = grad + r * classes;
        long long cls = cistern_target_class(targets, r, classes, ignore_index);
        if (cls < 0) {
            float fill = cls == -1 ? 0.0f : CISTERN_NAN_F32;
            for (u64 c = 0; c < classes; ++c) { out[c] = fill; }
            continue;
        }
        double g = (double)(reduction == 0 ? grad_output[r] : grad_output[0]) / denominator;
        double w = cistern_class_weight(weight, (u64)cls);
        if (log_probs) {
            for (u64 c = 0; c < classes; ++c) { out[c] = 0.0f; }
            out[cls] = (float)(-g * w);
            continue;
        }
        float m, log_sum;
        cistern_row_lse(x, classes, &m, &log_sum);
        double eps = (double)smoothing;
        double hard = (1.0 - eps) * w;
        double soft = eps / (double)classes;
        for (u64 c = 0; c < classes; ++c) {
            double p = (double)expf(x[c] - m - log_sum);
            double v = hard * (p - ((long long)c == cls ? 1.0 : 0.0));
            if (soft != 0.0) { v += soft * (total_weight * p - cistern_class_weight(weight, c)); }
            out[c] = (float)(g * v);
        }
    }
}
