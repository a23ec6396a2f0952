// Which way out of a sticky fault (a trapped kernel) works on this driver:
// the experiment behind "Sticky faults end CUDA in the process"
// (docs/benchmarks.md, "On CUDA"). Each strategy traps a kernel, recovers,
// then loads a module, allocates, runs a kernel and reads it back.
//
// Build (on the GPU machine): nvcc sticky_fault.cu -L /usr/local/cuda/lib64/stubs -lcuda
// Run: ./a.out primary_reset | primary_release | created   (one a process)
#include <cstdio>
#include <cstring>
#include <cuda.h>

// The driver still exports the pre-CUDA-13 cuCtxCreate signature.
extern "C" CUresult cuCtxCreate_v2(CUcontext*, unsigned int, CUdevice);

static const char* PTX = R"(
.version 7.0
.target sm_70
.address_size 64
.visible .entry trap_kernel() { trap; ret; }
.visible .entry fill_kernel(.param .u64 p) {
  .reg .b64 %rd<3>; .reg .f32 %f<2>;
  ld.param.u64 %rd1, [p]; cvta.to.global.u64 %rd2, %rd1;
  mov.f32 %f1, 0f3F800000; st.global.f32 [%rd2], %f1; ret; }
)";

#define STEP(what, call) do { CUresult r_ = (call); const char* n_ = 0; cuGetErrorName(r_, &n_); \
    std::printf("  %-32s %s (%d)\n", what, n_ ? n_ : "?", (int)r_); \
    if (r_ != CUDA_SUCCESS && fatal) return 1; } while (0)

// Uses `ctx`: a module, an allocation, a kernel, a read back; then a trap if asked.
static int use(CUcontext ctx, bool fatal, bool trap) {
    CUmodule module; CUfunction fill, trapk; CUdeviceptr p = 0; float v = 0;
    STEP("cuCtxSetCurrent", cuCtxSetCurrent(ctx));
    STEP("cuModuleLoadData", cuModuleLoadData(&module, PTX));
    STEP("cuModuleGetFunction fill", cuModuleGetFunction(&fill, module, "fill_kernel"));
    STEP("cuModuleGetFunction trap", cuModuleGetFunction(&trapk, module, "trap_kernel"));
    STEP("cuMemAlloc", cuMemAlloc(&p, 4));
    void* args[] = {&p};
    STEP("launch fill", cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, 0, args, 0));
    STEP("cuCtxSynchronize", cuCtxSynchronize());
    STEP("cuMemcpyDtoH", cuMemcpyDtoH(&v, p, 4));
    std::printf("  value %f (1 when the context works)\n", v);
    if (trap) {
        fatal = false;
        STEP("launch trap", cuLaunchKernel(trapk, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0));
        STEP("cuCtxSynchronize (the trap)", cuCtxSynchronize());
    }
    return 0;
}

int main(int argc, char** argv) {
    setvbuf(stdout, nullptr, _IONBF, 0);
    const char* how = argc > 1 ? argv[1] : "primary_reset";
    bool fatal = false;
    CUdevice dev;
    CUcontext ctx;
    std::printf("strategy %s\n", how);
    STEP("cuInit", cuInit(0));
    STEP("cuDeviceGet", cuDeviceGet(&dev, 0));
    if (std::strcmp(how, "created") == 0) {
        STEP("cuCtxCreate", cuCtxCreate_v2(&ctx, 0, dev));
        use(ctx, true, true);
        STEP("cuCtxDestroy", cuCtxDestroy(ctx));
        STEP("cuCtxCreate again", cuCtxCreate_v2(&ctx, 0, dev));
    } else {
        STEP("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain(&ctx, dev));
        use(ctx, true, true);
        if (std::strcmp(how, "primary_reset") == 0) {
            STEP("cuDevicePrimaryCtxReset", cuDevicePrimaryCtxReset(dev));
        } else {
            STEP("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease(dev));
        }
        STEP("cuDevicePrimaryCtxRetain again", cuDevicePrimaryCtxRetain(&ctx, dev));
    }
    std::printf(" after recovery:\n");
    return use(ctx, false, false);
}
