// Activations; each matches kernels/src/activation.rs. `kind` follows
// `Activation`'s declaration order: 0 identity, 1 relu, 2 leaky relu,
// 3 gelu (erf, in double as the CPU), 4 gelu tanh, 5 tanh, 6 sigmoid.

#define CISTERN_SQRT_2_OVER_PI 0.7978846f
#define CISTERN_GELU_KAPPA 0.044715f

__device__ __forceinline__ float cistern_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ float cistern_act(int kind, float slope, float x) {
    switch (kind) {
    case 0: return x;
    case 1: return x < 0.0f ? 0.0f : x;
    case 2: return x > 0.0f ? x : x * slope;
    case 3: {
        double x64 = (double)x;
        return (float)(x64 * 0.5 * erfc(-x64 * 0.70710678118654752440));
    }
    case 4: {
        float inner = CISTERN_SQRT_2_OVER_PI * (x + CISTERN_GELU_KAPPA * x * x * x);
        return 0.5f * x * (1.0f + tanhf(inner));
    }
    case 5: return tanhf(x);
    default: return cistern_sigmoid(x);
    }
}

__device__ float cistern_act_grad(int kind, float slope, float x, float g) {
    switch (kind) {
    case 0: return g;
    case 1: return x > 0.0f ? g : 0.0f;
    case 2: return x > 0.0f ? g : g * slope;
    case 3: {
        double x64 = (double)x;
        double cdf = 0.5 * erfc(-x64 * 0.70710678118654752440);
        double pdf = exp(-0.5 * x64 * x64) * 0.39894228040143267794;
        return (float)((double)g * (cdf + x64 * pdf));
    }
    case 4: {
        float x_sq = x * x;
        float inner = CISTERN_SQRT_2_OVER_PI * (x + CISTERN_GELU_KAPPA * x_sq * x);
        float t = tanhf(inner);
        float left = 0.5f * (1.0f + t);
        float right = 0.5f * x * (1.0f - t * t) * CISTERN_SQRT_2_OVER_PI
            * (1.0f + 3.0f * CISTERN_GELU_KAPPA * x_sq);
        return g * (left + right);
    }
    case 5: {
        float t = tanhf(x);
        return g * (1.0f - t * t);
    }
    default: {
        float s = cistern_sigmoid(x);
        return g * s * (1.0f - s);
    }
    }
}

extern "C" __global__ void cistern_activation_forward(
    int kind, float slope, const float* x, float* y, u64 n) {
    CISTERN_GRID_STRIDE(i, n) { y[i] = cistern_act(kind, slope, x[i]); }
}

extern "C" __global__ void cistern_activation_backward(
    int kind, float slope, const float* x, const float* grad_out, float* grad_in, u64 n) {
    CISTERN_GRID_STRIDE(i, n) { grad_in[i] = cistern_act_grad(kind, slope, x[i], grad_out[i]); }
}
