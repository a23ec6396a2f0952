// Shared by every Cistern CUDA source: NVRTC compiles them as one program.
// Sizes are element counts (unsigned long long); loops are grid-stride, so
// any grid covers any length.
typedef unsigned long long u64;

#define CISTERN_GRID_STRIDE(i, n) \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (u64)blockDim.x * gridDim.x)

// 16-byte vector loads need every pointer 16-byte aligned.
__device__ __forceinline__ bool cistern_aligned16(const void* p) {
    return (((u64)p) & 15ull) == 0ull;
}
