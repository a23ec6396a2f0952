// Strided copy; matches runtime/src/backend/cpu/strided.rs. Unit i is unit
// i % per_element of element i / per_element, whose index over the shape
// (the last dimension fastest) gives its element offset on each side. The
// host pads a lower rank with leading dimensions of 1 (stride 0). A unit is
// a 32-bit word (unit_bytes 4) or, where either view is not word-aligned, a
// byte (unit_bytes 1): no access is ever misaligned.

#define CISTERN_STRIDED_RANK 6

template <typename Unit>
__device__ __forceinline__ void cistern_strided_units(
    const Unit* source, Unit* target, const u64* shape, const u64* from,
    const u64* to, u64 per_element, u64 units) {
    CISTERN_GRID_STRIDE(i, units) {
        u64 rest = i / per_element;
        u64 unit = i - rest * per_element;
        u64 from_at = 0, to_at = 0;
#pragma unroll
        for (int d = CISTERN_STRIDED_RANK - 1; d >= 0; --d) {
            // The same for every thread: skipping a padded one never diverges.
            if (shape[d] == 1) { continue; }
            u64 next = rest / shape[d];
            u64 index = rest - next * shape[d];
            rest = next;
            from_at += index * from[d];
            to_at += index * to[d];
        }
        target[to_at * per_element + unit] = source[from_at * per_element + unit];
    }
}

extern "C" __global__ void cistern_strided_copy(
    const void* source, void* target, int unit_bytes,
    u64 n0, u64 n1, u64 n2, u64 n3, u64 n4, u64 n5,
    u64 s0, u64 s1, u64 s2, u64 s3, u64 s4, u64 s5,
    u64 t0, u64 t1, u64 t2, u64 t3, u64 t4, u64 t5,
    u64 per_element, u64 units) {
    const u64 shape[CISTERN_STRIDED_RANK] = {n0, n1, n2, n3, n4, n5};
    const u64 from[CISTERN_STRIDED_RANK] = {s0, s1, s2, s3, s4, s5};
    const u64 to[CISTERN_STRIDED_RANK] = {t0, t1, t2, t3, t4, t5};
    if (unit_bytes == 4) {
        cistern_strided_units(static_cast<const unsigned int*>(source),
                              static_cast<unsigned int*>(target),
                              shape, from, to, per_element, units);
    } else {
        cistern_strided_units(static_cast<const unsigned char*>(source),
                              static_cast<unsigned char*>(target),
                              shape, from, to, per_element, units);
    }
}
