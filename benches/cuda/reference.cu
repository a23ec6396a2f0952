// The CUDA references Cistern's CUDA figures are read against, measured
// on the same GPU in the same gpu-check run (scripts/gpu-check.sh builds
// this with nvcc there): a bare cuLaunchKernel of an empty kernel, a sync
// on an idle stream, a device-to-device copy, and cuBLAS's SGEMM beside
// Cistern's own GEMM kernels compiled from kernels/src/cuda (the kernel
// alone, without the server). One JSON object per line.
//
// Build: nvcc -O3 -arch=sm_90 --fmad=false -I kernels/src/cuda \
//            benches/cuda/reference.cu -lcublas -lcuda -o reference

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include "prelude.cuh"
#include "activation.cu"
#include "gemm.cu"

// Other shapes of gemm.cu's kernel, measured beside the two it ships.
CISTERN_GEMM_TILED(variant_128x128_k16_w64, 128, 128, 16, 8, 8, 64, 2)
CISTERN_GEMM_TILED(variant_128x128_k8_w32, 128, 128, 8, 8, 8, 32, 2)
CISTERN_GEMM_TILED(variant_128x128_k8_w64_r1, 128, 128, 8, 8, 8, 64, 1)

#define CHECK(call)                                                                  \
    do {                                                                             \
        auto status_ = (call);                                                       \
        if ((int)status_ != 0) {                                                     \
            std::printf("{\"bench\":\"reference_error\",\"call\":\"%s\",\"status\":%d,\"line\":%d}\n", \
                        #call, (int)status_, __LINE__);                              \
            std::exit(1);                                                            \
        }                                                                            \
    } while (0)

extern "C" __global__ void reference_empty() {}

extern "C" __global__ void reference_counted(unsigned long long* count) {
    if (threadIdx.x == 0) { atomicAdd(count, 1ull); }
}

static double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Launch rates and the idle-stream sync, as bench roundtrip measures the server's.
static void launches(cudaStream_t stream) {
    CUfunction empty, counted;
    CHECK(cudaGetFuncBySymbol(reinterpret_cast<cudaFunction_t*>(&empty), (const void*)reference_empty));
    CHECK(cudaGetFuncBySymbol(reinterpret_cast<cudaFunction_t*>(&counted), (const void*)reference_counted));
    unsigned long long* count;
    CHECK(cudaMalloc(&count, 8));
    CHECK(cudaMemset(count, 0, 8));
    void* args[] = {&count};
    const int n = 1000000;
    for (int i = 0; i < 10000; ++i) { CHECK(cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, stream, nullptr, nullptr)); }
    CHECK(cudaStreamSynchronize(stream));
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) { CHECK(cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, stream, nullptr, nullptr)); }
    CHECK(cudaStreamSynchronize(stream));
    double empty_s = seconds_since(start);
    start = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) { CHECK(cuLaunchKernel(counted, 1, 1, 1, 256, 1, 1, 0, stream, args, nullptr)); }
    CHECK(cudaStreamSynchronize(stream));
    double counted_s = seconds_since(start);
    unsigned long long ran = 0;
    CHECK(cudaMemcpy(&ran, count, 8, cudaMemcpyDeviceToHost));
    std::vector<double> syncs;
    for (int i = 0; i < 200000; ++i) {
        auto s = std::chrono::steady_clock::now();
        CHECK(cudaStreamSynchronize(stream));
        syncs.push_back(seconds_since(s) * 1e9);
    }
    std::sort(syncs.begin(), syncs.end());
    std::printf("{\"bench\":\"bare_launch\",\"launches\":%d,\"empty_launches_per_s\":%.0f,"
                "\"counted_launches_per_s\":%.0f,\"counted_runs\":%llu,"
                "\"idle_sync_p50_ns\":%.0f,\"idle_sync_p99_ns\":%.0f}\n",
                n, n / empty_s, n / counted_s, ran, syncs[syncs.size() / 2],
                syncs[syncs.size() * 99 / 100]);
    CHECK(cudaFree(count));
}

// A device-to-device copy of `floats` floats: 8 bytes a float (read + write).
static void copy(cudaStream_t stream, size_t floats) {
    float *from, *to;
    CHECK(cudaMalloc(&from, floats * 4));
    CHECK(cudaMalloc(&to, floats * 4));
    CHECK(cudaMemset(from, 0, floats * 4));
    cudaEvent_t begin, end;
    CHECK(cudaEventCreate(&begin));
    CHECK(cudaEventCreate(&end));
    std::vector<double> samples;
    for (int i = 0; i < 12; ++i) {
        CHECK(cudaEventRecord(begin, stream));
        CHECK(cudaMemcpyAsync(to, from, floats * 4, cudaMemcpyDeviceToDevice, stream));
        CHECK(cudaEventRecord(end, stream));
        CHECK(cudaEventSynchronize(end));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, begin, end));
        if (i >= 2) { samples.push_back(ms); }
    }
    double ms = median(samples);
    std::printf("{\"bench\":\"bare_copy\",\"floats\":%zu,\"ms\":%.4f,\"gb_per_s\":%.1f}\n", floats, ms,
                8.0 * floats / (ms * 1e-3) / 1e9);
    CHECK(cudaFree(from));
    CHECK(cudaFree(to));
}

struct Shape {
    int m, n, k;
    bool ta, tb;
};

typedef void (*GemmKernel)(const float*, const float*, const float*, float*, u64, u64, u64, int, int, int,
                           float);

struct Candidate {
    const char* name;
    GemmKernel kernel;
    int bm, bn;
};

// Median milliseconds of `samples` event-timed runs of `run` after two warm-ups.
template <typename Run>
static double timed(cudaStream_t stream, int samples, Run run) {
    cudaEvent_t begin, end;
    CHECK(cudaEventCreate(&begin));
    CHECK(cudaEventCreate(&end));
    std::vector<double> ms;
    for (int i = 0; i < samples + 2; ++i) {
        CHECK(cudaEventRecord(begin, stream));
        run();
        CHECK(cudaEventRecord(end, stream));
        CHECK(cudaEventSynchronize(end));
        float elapsed = 0;
        CHECK(cudaEventElapsedTime(&elapsed, begin, end));
        if (i >= 2) { ms.push_back(elapsed); }
    }
    CHECK(cudaEventDestroy(begin));
    CHECK(cudaEventDestroy(end));
    return median(ms);
}

static void gemms(cudaStream_t stream, const std::vector<Shape>& shapes,
                  const std::vector<Candidate>& candidates) {
    cublasHandle_t handle;
    CHECK(cublasCreate(&handle));
    CHECK(cublasSetStream(handle, stream));
    CHECK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));
    for (const Shape& s : shapes) {
        const size_t m = s.m, n = s.n, k = s.k;
        std::vector<float> ha(m * k), hb(k * n);
        unsigned long long state = 0x9E3779B97F4A7C15ull ^ (m * 131 + n * 17 + k);
        auto next = [&]() {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            return (float)((state >> 40) & 0xffff) / 65536.0f - 0.5f;
        };
        for (auto& v : ha) { v = next(); }
        for (auto& v : hb) { v = next(); }
        float *a, *b, *c, *want;
        CHECK(cudaMalloc(&a, m * k * 4));
        CHECK(cudaMalloc(&b, k * n * 4));
        CHECK(cudaMalloc(&c, m * n * 4));
        CHECK(cudaMalloc(&want, m * n * 4));
        CHECK(cudaMemcpy(a, ha.data(), m * k * 4, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(b, hb.data(), k * n * 4, cudaMemcpyHostToDevice));
        const double flops = 2.0 * m * n * k;
        const int samples = std::max(5, std::min(50, (int)(2e12 / flops)));
        const float one = 1.0f, zero = 0.0f;
        // Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ.
        auto cublas = [&]() {
            CHECK(cublasSgemm(handle, s.tb ? CUBLAS_OP_T : CUBLAS_OP_N, s.ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k,
                              &one, b, s.tb ? k : n, a, s.ta ? m : k, &zero, want, n));
        };
        double cublas_ms = timed(stream, samples, cublas);
        std::vector<float> hwant(m * n), hgot(m * n);
        CHECK(cudaMemcpy(hwant.data(), want, m * n * 4, cudaMemcpyDeviceToHost));
        for (const Candidate& cand : candidates) {
            const u64 tiles = ((m + cand.bm - 1) / cand.bm) * ((n + cand.bn - 1) / cand.bn);
            const unsigned grid = (unsigned)std::min<u64>(std::max<u64>(tiles, 1), 8192);
            CHECK(cudaMemset(c, 0, m * n * 4));
            auto ours = [&]() {
                cand.kernel<<<grid, 256, 0, stream>>>(a, b, nullptr, c, m, n, k, s.ta, s.tb, 0, 0.0f);
                CHECK(cudaGetLastError());
            };
            double ms = timed(stream, samples, ours);
            CHECK(cudaMemcpy(hgot.data(), c, m * n * 4, cudaMemcpyDeviceToHost));
            double worst = 0;
            for (size_t i = 0; i < m * n; ++i) {
                double e = std::fabs((double)hgot[i] - hwant[i]) / std::max(1.0, std::fabs((double)hwant[i]));
                worst = std::max(worst, e);
            }
            std::printf("{\"bench\":\"bare_gemm\",\"kernel\":\"%s\",\"m\":%zu,\"n\":%zu,\"k\":%zu,"
                        "\"transpose_a\":%s,\"transpose_b\":%s,\"gflops\":%.1f,\"cublas_gflops\":%.1f,"
                        "\"vs_cublas\":%.3f,\"max_error\":%.2e}\n",
                        cand.name, m, n, k, s.ta ? "true" : "false", s.tb ? "true" : "false",
                        flops / (ms * 1e6), flops / (cublas_ms * 1e6), cublas_ms / ms, worst);
            std::fflush(stdout);
        }
        CHECK(cudaFree(a));
        CHECK(cudaFree(b));
        CHECK(cudaFree(c));
        CHECK(cudaFree(want));
    }
    CHECK(cublasDestroy(handle));
}

int main(int argc, char** argv) {
    CHECK(cudaSetDevice(0));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    int driver = 0, runtime = 0;
    CHECK(cudaDriverGetVersion(&driver));
    CHECK(cudaRuntimeGetVersion(&runtime));
    std::printf("{\"bench\":\"reference_device\",\"name\":\"%s\",\"sms\":%d,\"cc\":\"%d.%d\","
                "\"driver_cuda\":%d,\"runtime_cuda\":%d}\n",
                prop.name, prop.multiProcessorCount, prop.major, prop.minor, driver, runtime);
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    bool quick = argc > 1 && std::strcmp(argv[1], "--gemm-only") == 0;
    if (!quick) {
        launches(stream);
        copy(stream, (size_t)1 << 28);
    }
    std::vector<Shape> shapes = {
        {4096, 4096, 4096, false, false}, {4096, 4096, 4096, true, false}, {4096, 4096, 4096, false, true},
        {2048, 2048, 2048, false, false}, {1024, 1024, 1024, false, false}, {512, 512, 512, false, false},
        {256, 1024, 784, false, false},   {256, 1024, 1024, false, false},  {784, 1024, 256, true, false},
        {1024, 1024, 256, true, false},   {256, 784, 1024, false, true},    {256, 1024, 1024, false, true},
    };
    std::vector<Candidate> candidates = {
        {"cistern_gemm", cistern_gemm, 64, 64},
        {"cistern_gemm_large", cistern_gemm_large, 128, 128},
        {"128x128_k16_w64", variant_128x128_k16_w64, 128, 128},
        {"128x128_k8_w32", variant_128x128_k8_w32, 128, 128},
        {"128x128_k8_w64_r1", variant_128x128_k8_w64_r1, 128, 128},
    };
    gemms(stream, shapes, candidates);
    return 0;
}
