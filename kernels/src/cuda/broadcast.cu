// Broadcast binary operations and strided sums; match
// kernels/src/broadcast.rs. The host pads every shape to rank 6 with
// leading dimensions of 1 (stride 0). One thread per output element; a
// sum runs over its summed dimensions in row-major order, in f32 as the CPU.

#define CISTERN_BROADCAST_RANK 6

// The offset of element `i` of `shape` through `strides`.
__device__ __forceinline__ u64 cistern_offset_of(u64 i, const u64* shape, const u64* strides) {
    u64 at = 0;
#pragma unroll
    for (int d = CISTERN_BROADCAST_RANK - 1; d >= 0; --d) {
        if (shape[d] == 1) { continue; }
        u64 next = i / shape[d];
        at += (i - next * shape[d]) * strides[d];
        i = next;
    }
    return at;
}

// op: 0 add, 1 sub, 2 mul, 3 div.
extern "C" __global__ void cistern_broadcast_binary(
    const float* a, const float* b, float* out, int op,
    u64 n0, u64 n1, u64 n2, u64 n3, u64 n4, u64 n5,
    u64 a0, u64 a1, u64 a2, u64 a3, u64 a4, u64 a5,
    u64 b0, u64 b1, u64 b2, u64 b3, u64 b4, u64 b5, u64 n) {
    const u64 shape[CISTERN_BROADCAST_RANK] = {n0, n1, n2, n3, n4, n5};
    const u64 sa[CISTERN_BROADCAST_RANK] = {a0, a1, a2, a3, a4, a5};
    const u64 sb[CISTERN_BROADCAST_RANK] = {b0, b1, b2, b3, b4, b5};
    CISTERN_GRID_STRIDE(i, n) {
        float x = a[cistern_offset_of(i, shape, sa)];
        float y = b[cistern_offset_of(i, shape, sb)];
        float r;
        switch (op) {
            case 0: r = x + y; break;
            case 1: r = x - y; break;
            case 2: r = x * y; break;
            default: r = x / y; break;
        }
        out[i] = r;
    }
}

extern "C" __global__ void cistern_strided_sum(
    const float* x, float* out, float scale,
    u64 n0, u64 n1, u64 n2, u64 n3, u64 n4, u64 n5,
    u64 s0, u64 s1, u64 s2, u64 s3, u64 s4, u64 s5,
    u64 m0, u64 m1, u64 m2, u64 m3, u64 m4, u64 m5,
    u64 t0, u64 t1, u64 t2, u64 t3, u64 t4, u64 t5, u64 summed, u64 n) {
    const u64 shape[CISTERN_BROADCAST_RANK] = {n0, n1, n2, n3, n4, n5};
    const u64 strides[CISTERN_BROADCAST_RANK] = {s0, s1, s2, s3, s4, s5};
    const u64 inner[CISTERN_BROADCAST_RANK] = {m0, m1, m2, m3, m4, m5};
    const u64 inner_strides[CISTERN_BROADCAST_RANK] = {t0, t1, t2, t3, t4, t5};
    CISTERN_GRID_STRIDE(i, n) {
        u64 base = cistern_offset_of(i, shape, strides);
        float total = 0.0f;
        for (u64 r = 0; r < summed; ++r) {
            total += x[base + cistern_offset_of(r, inner, inner_strides)];
        }
        out[i] = scale * total;
    }
}
