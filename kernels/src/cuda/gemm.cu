// C = act(op(A)·op(B) + bias), row-major, as kernels/src/gemm.rs defines
// it: op(A) is m×k (A stored k×m when transpose_a), op(B) is k×n (B stored
// n×k when transpose_b), the bias has n elements (one per column), and the
// activation is any of activation.cu's (codes in `Activation`'s order).
//
// Register-blocked SGEMM: a block of 256 threads owns a BM×BN tile of C,
// each warp a WM-row part of it and each thread a TM×TN micro-tile in
// groups of 4 rows (and 4 columns), so its shared-memory reads are float4s
// and a warp's touch few distinct addresses. k is walked BK at a time through two
// shared buffers: the next slice is fetched into registers while the
// current one is used. Loads past an edge read 0, so any m, n, k (k = 0
// included: C = act(bias)) is covered; each element is one fmaf chain in
// the order p = 0, 1, ..., k-1, exactly k long. Tiles are grid-stride
// (tile = blockIdx.x + r·gridDim.x), so any grid covers C.
//
// Two sizes (the launch picks by how many tiles C has, backend/cuda/launch.rs):
// cistern_gemm_large (128×128, 8×8 a thread) where C has tiles enough to
// fill the device, cistern_gemm (64×64, 4×4) otherwise.

#define CISTERN_TG_THREADS 256
#define CISTERN_TG_PAD 4

template <int BM, int BN, int BK, int TM, int TN, int WM>
__device__ __forceinline__ void cistern_gemm_tiled(
    const float* __restrict__ a, const float* __restrict__ b, const float* __restrict__ bias,
    float* __restrict__ c, u64 m, u64 n, u64 k, int transpose_a, int transpose_b,
    int kind, float slope) {
    constexpr int LOADS_A = BM * BK / CISTERN_TG_THREADS;
    constexpr int LOADS_B = BN * BK / CISTERN_TG_THREADS;
    static_assert((BM / TM) * (BN / TN) == CISTERN_TG_THREADS, "256 threads a block");
    static_assert(TM % 4 == 0 && TN % 4 == 0, "micro-tiles are groups of 4");
    static_assert(CISTERN_TG_THREADS % BM == 0 && CISTERN_TG_THREADS % BN == 0
                  && CISTERN_TG_THREADS % BK == 0, "loads tile the block evenly");
    __shared__ __align__(16) float tile_a[2][BK][BM + CISTERN_TG_PAD];
    __shared__ __align__(16) float tile_b[2][BK][BN + CISTERN_TG_PAD];
    const int t = threadIdx.x;
    // The first of this thread's rows (and columns) of the tile, and the
    // spacing of its groups of 4: warp tiles of WM rows, so a warp's lanes
    // read few distinct addresses of shared memory (8 float4s of A and 4 of
    // B a step).
    constexpr int WARP_ROWS = BM / WM;
    constexpr int WARP_COLS = (CISTERN_TG_THREADS / 32) / WARP_ROWS;
    constexpr int WN = BN / WARP_COLS;
    constexpr int LANE_ROWS = WM / TM, LANE_COLS = WN / TN;
    static_assert(LANE_ROWS * LANE_COLS == 32, "a warp's lanes tile its warp tile");
    const int warp = t / 32, lane = t % 32;
    const int row_base = (warp / WARP_COLS) * WM + (lane / LANE_COLS) * 4;
    const int row_step = 4 * LANE_ROWS;
    const int col_base = (warp % WARP_COLS) * WN + (lane % LANE_COLS) * 4;
    const int col_step = 4 * LANE_COLS;
    const u64 tiles_n = (n + BN - 1) / BN;
    const u64 tiles = ((m + BM - 1) / BM) * tiles_n;
    for (u64 tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const u64 row0 = (tile / tiles_n) * BM;
        const u64 col0 = (tile % tiles_n) * BN;
        float acc[TM][TN];
#pragma unroll
        for (int i = 0; i < TM; ++i) {
#pragma unroll
            for (int j = 0; j < TN; ++j) { acc[i][j] = 0.0f; }
        }
        float staged_a[LOADS_A], staged_b[LOADS_B];
        // Load r of a slice is element (i, p) = (i0 + r·di, p0 + pr + r·dp)
        // of op(A) (and likewise of op(B)): consecutive threads read
        // consecutive addresses of the stored matrix.
        const int ia = transpose_a ? t % BM : t / BK, pa = transpose_a ? t / BM : t % BK;
        const int dia = transpose_a ? 0 : CISTERN_TG_THREADS / BK;
        const int dpa = transpose_a ? CISTERN_TG_THREADS / BM : 0;
        const int jb = transpose_b ? t / BK : t % BN, pb = transpose_b ? t % BK : t / BN;
        const int djb = transpose_b ? CISTERN_TG_THREADS / BK : 0;
        const int dpb = transpose_b ? 0 : CISTERN_TG_THREADS / BN;
        // Address steps: per load r, and per slice.
        const u64 step_a = transpose_a ? (u64)dpa * m : (u64)dia * k;
        const u64 step_b = transpose_b ? (u64)djb * k : (u64)dpb * n;
        const float* base_a = transpose_a ? a + (u64)pa * m + row0 + ia : a + (row0 + ia) * k + pa;
        const float* base_b = transpose_b ? b + (col0 + jb) * k + pb : b + (u64)pb * n + col0 + jb;
        const u64 slice_a = transpose_a ? (u64)BK * m : (u64)BK;
        const u64 slice_b = transpose_b ? (u64)BK : (u64)BK * n;
        // Fetches the BK-deep slice from p0 into the registers.
        auto fetch = [&](u64 p0) {
            const float* from_a = base_a + (p0 / BK) * slice_a;
#pragma unroll
            for (int r = 0; r < LOADS_A; ++r) {
                const bool inside = row0 + ia + r * dia < m && p0 + pa + r * dpa < k;
                staged_a[r] = inside ? from_a[r * step_a] : 0.0f;
            }
            const float* from_b = base_b + (p0 / BK) * slice_b;
#pragma unroll
            for (int r = 0; r < LOADS_B; ++r) {
                const bool inside = col0 + jb + r * djb < n && p0 + pb + r * dpb < k;
                staged_b[r] = inside ? from_b[r * step_b] : 0.0f;
            }
        };
        // Writes the fetched slice into shared buffer s.
        auto store = [&](int s) {
#pragma unroll
            for (int r = 0; r < LOADS_A; ++r) { tile_a[s][pa + r * dpa][ia + r * dia] = staged_a[r]; }
#pragma unroll
            for (int r = 0; r < LOADS_B; ++r) { tile_b[s][pb + r * dpb][jb + r * djb] = staged_b[r]; }
        };
        // One step p of the slice in shared buffer s.
        auto step = [&](int s, int p) {
            float av[TM], bv[TN];
#pragma unroll
            for (int g = 0; g < TM / 4; ++g) {
                const float4 v = *reinterpret_cast<const float4*>(&tile_a[s][p][row_base + g * row_step]);
                av[g * 4] = v.x; av[g * 4 + 1] = v.y; av[g * 4 + 2] = v.z; av[g * 4 + 3] = v.w;
            }
#pragma unroll
            for (int g = 0; g < TN / 4; ++g) {
                const float4 v = *reinterpret_cast<const float4*>(&tile_b[s][p][col_base + g * col_step]);
                bv[g * 4] = v.x; bv[g * 4 + 1] = v.y; bv[g * 4 + 2] = v.z; bv[g * 4 + 3] = v.w;
            }
#pragma unroll
            for (int i = 0; i < TM; ++i) {
#pragma unroll
                for (int j = 0; j < TN; ++j) { acc[i][j] = fmaf(av[i], bv[j], acc[i][j]); }
            }
        };
        if (k > 0) {
            fetch(0);
            store(0);
            __syncthreads();
        }
        int s = 0;
        for (u64 p0 = 0; p0 < k; p0 += BK) {
            const u64 next = p0 + BK;
            if (next < k) { fetch(next); }
            if (k - p0 >= (u64)BK) {
#pragma unroll
                for (int p = 0; p < BK; ++p) { step(s, p); }
            } else {
                const int depth = (int)(k - p0);
                for (int p = 0; p < depth; ++p) { step(s, p); }
            }
            if (next < k) { store(s ^ 1); }
            __syncthreads();
            s ^= 1;
        }
        const bool quads = (n % 4 == 0) && cistern_aligned16(c) && (bias == 0 || cistern_aligned16(bias));
#pragma unroll
        for (int i = 0; i < TM; ++i) {
            const u64 row = row0 + row_base + (i / 4) * row_step + (i % 4);
            if (row >= m) { continue; }
#pragma unroll
            for (int g = 0; g < TN / 4; ++g) {
                const u64 col = col0 + col_base + g * col_step;
                float v[4];
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    float x = acc[i][g * 4 + q];
                    if (bias != 0 && col + q < n) { x = x + bias[col + q]; }
                    v[q] = cistern_act(kind, slope, x);
                }
                if (quads && col + 3 < n) {
                    *reinterpret_cast<float4*>(&c[row * n + col]) = make_float4(v[0], v[1], v[2], v[3]);
                } else {
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        if (col + q < n) { c[row * n + col + q] = v[q]; }
                    }
                }
            }
        }
    }
}

#define CISTERN_GEMM_TILED(NAME, BM, BN, BK, TM, TN, WM, MINB)                                          \
    extern "C" __global__ void __launch_bounds__(CISTERN_TG_THREADS, MINB) NAME(                    \
        const float* a, const float* b, const float* bias, float* c, u64 m, u64 n, u64 k,      \
        int transpose_a, int transpose_b, int kind, float slope) {                             \
        cistern_gemm_tiled<BM, BN, BK, TM, TN, WM>(a, b, bias, c, m, n, k, transpose_a,            \
                                               transpose_b, kind, slope);                      \
    }

CISTERN_GEMM_TILED(cistern_gemm, 64, 64, 16, 4, 4, 32, 2)
CISTERN_GEMM_TILED(cistern_gemm_large, 128, 128, 8, 8, 8, 64, 2)
