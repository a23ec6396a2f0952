// C = act(op(A)·op(B) + bias), row-major, as kernels/src/gemm.rs defines
// it: op(A) is m×k (A stored k×m when transpose_a), op(B) is k×n (B stored
// n×k when transpose_b), the bias has n elements (one per column), and the
// activation is any of activation.cu's (codes in `Activation`'s order).
//
// Shared-memory tiled SGEMM: a block of CISTERN_GEMM_THREADS threads owns a
// 64×64 tile of C, each thread a 4×4 micro-tile of it strided by 16 (so a
// warp reads 16 consecutive columns of the B tile: no bank conflicts). The
// k dimension is walked 16 at a time; every load past an edge reads 0, so
// any m, n, k (k = 0 included: C = act(bias)) is covered. Tiles are
// grid-stride (tile = blockIdx.x + r·gridDim.x), so any grid covers C.
// Each element is one fmaf chain in the order p = 0, 1, ..., k-1.

#define CISTERN_GEMM_TILE 64
#define CISTERN_GEMM_DEPTH 16
#define CISTERN_GEMM_THREADS 256
#define CISTERN_GEMM_MICRO 4

extern "C" __global__ void __launch_bounds__(CISTERN_GEMM_THREADS) cistern_gemm(
    const float* a, const float* b, const float* bias, float* c,
    u64 m, u64 n, u64 k, int transpose_a, int transpose_b,
    int kind, float slope) {
    // +1 column: the A tile is written transposed (As[p][i]) from rows of A.
    __shared__ float tile_a[CISTERN_GEMM_DEPTH][CISTERN_GEMM_TILE + 1];
    __shared__ float tile_b[CISTERN_GEMM_DEPTH][CISTERN_GEMM_TILE];
    const unsigned t = threadIdx.x;
    const unsigned tx = t % 16, ty = t / 16;
    const u64 tiles_n = (n + CISTERN_GEMM_TILE - 1) / CISTERN_GEMM_TILE;
    const u64 tiles = ((m + CISTERN_GEMM_TILE - 1) / CISTERN_GEMM_TILE) * tiles_n;
    for (u64 tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const u64 row0 = (tile / tiles_n) * CISTERN_GEMM_TILE;
        const u64 col0 = (tile % tiles_n) * CISTERN_GEMM_TILE;
        float acc[CISTERN_GEMM_MICRO][CISTERN_GEMM_MICRO];
        for (int r = 0; r < CISTERN_GEMM_MICRO; ++r) {
            for (int q = 0; q < CISTERN_GEMM_MICRO; ++q) { acc[r][q] = 0.0f; }
        }
        for (u64 p0 = 0; p0 < k; p0 += CISTERN_GEMM_DEPTH) {
            // 64×16 elements of each operand, 4 per thread; consecutive
            // threads read consecutive addresses of the stored matrix.
            for (int r = 0; r < 4; ++r) {
                const unsigned e = t + r * CISTERN_GEMM_THREADS;
                unsigned i, p;
                if (transpose_a) { i = e % CISTERN_GEMM_TILE; p = e / CISTERN_GEMM_TILE; }
                else { p = e % CISTERN_GEMM_DEPTH; i = e / CISTERN_GEMM_DEPTH; }
                const u64 gi = row0 + i, gp = p0 + p;
                float v = 0.0f;
                if (gi < m && gp < k) { v = transpose_a ? a[gp * m + gi] : a[gi * k + gp]; }
                tile_a[p][i] = v;
            }
            for (int r = 0; r < 4; ++r) {
                const unsigned e = t + r * CISTERN_GEMM_THREADS;
                unsigned j, p;
                if (transpose_b) { p = e % CISTERN_GEMM_DEPTH; j = e / CISTERN_GEMM_DEPTH; }
                else { j = e % CISTERN_GEMM_TILE; p = e / CISTERN_GEMM_TILE; }
                const u64 gj = col0 + j, gp = p0 + p;
                float v = 0.0f;
                if (gj < n && gp < k) { v = transpose_b ? b[gj * k + gp] : b[gp * n + gj]; }
                tile_b[p][j] = v;
            }
            __syncthreads();
            // Past k the tiles hold zeros; stopping at k keeps each chain
            // exactly k long (an fmaf with 0·0 could turn -0 into +0).
            const u64 depth = (k - p0) < CISTERN_GEMM_DEPTH ? (k - p0) : CISTERN_GEMM_DEPTH;
            for (unsigned p = 0; p < depth; ++p) {
                float av[CISTERN_GEMM_MICRO], bv[CISTERN_GEMM_MICRO];
                for (int r = 0; r < CISTERN_GEMM_MICRO; ++r) { av[r] = tile_a[p][ty + 16 * r]; }
                for (int q = 0; q < CISTERN_GEMM_MICRO; ++q) { bv[q] = tile_b[p][tx + 16 * q]; }
                for (int r = 0; r < CISTERN_GEMM_MICRO; ++r) {
                    for (int q = 0; q < CISTERN_GEMM_MICRO; ++q) {
                        acc[r][q] = fmaf(av[r], bv[q], acc[r][q]);
                    }
                }
            }
            __syncthreads();
        }
        for (int r = 0; r < CISTERN_GEMM_MICRO; ++r) {
            const u64 row = row0 + ty + 16 * r;
            if (row >= m) { continue; }
            for (int q = 0; q < CISTERN_GEMM_MICRO; ++q) {
                const u64 col = col0 + tx + 16 * q;
                if (col >= n) { continue; }
                float v = acc[r][q];
                if (bias != 0) { v = v + bias[col]; }
                c[row * n + col] = cistern_act(kind, slope, v);
            }
        }
    }
}
