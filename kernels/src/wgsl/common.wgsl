// Shared by every Cistern WGSL module (prepended to each source, before
// its buffer bindings: bindings.wgsl, or bindings_vec4.wgsl).
//
// Binding 0 is the launch's parameters; bindings 1-6 are the kernel's
// buffers in signature order, each bound at an aligned offset with `base`
// elements before the kernel's first one; binding 7 is a table of u32s.
// Every buffer is read_write: a page may hold a read and a written binding
// of one launch, and one buffer may not be both read-only and writable in
// a dispatch.

struct Params {
    u: array<vec4<u32>, 4>,
    f: array<vec4<f32>, 4>,
};

@group(0) @binding(0) var<uniform> params: Params;

const WORKGROUP: u32 = 256u;

// u[0]: elements in this dispatch; u[1..6]: each binding's base; u[7]: an op code.
fn pu(i: u32) -> u32 { return params.u[i / 4u][i % 4u]; }
fn pf(i: u32) -> f32 { return params.f[i / 4u][i % 4u]; }
fn count() -> u32 { return pu(0u); }
fn base(binding: u32) -> u32 { return pu(binding); }
fn op() -> u32 { return pu(7u); }

// Elements (or vec4s) each invocation of a streaming entry point handles;
// the backend sizes its grids by the same figure (`PER_INVOCATION` in
// runtime/src/backend/wgpu/dispatch.rs). Fewer, fuller invocations cut the
// per-invocation cost that dominates a CPU Vulkan driver.
const PER_INVOCATION: u32 = 8u;

// Item k of this invocation in a streaming dispatch: each workgroup covers
// WORKGROUP · PER_INVOCATION consecutive items, its invocations adjacent in
// every pass (so a SIMD driver loads lanes contiguously).
fn streaming(wid: vec3<u32>, lid: vec3<u32>, groups: vec3<u32>, k: u32) -> u32 {
    return (wid.y * groups.x + wid.x) * (WORKGROUP * PER_INVOCATION) + k * WORKGROUP + lid.x;
}

// The element of a 1D dispatch folded into two grid dimensions.
fn linear(wid: vec3<u32>, lid: vec3<u32>, groups: vec3<u32>) -> u32 {
    return (wid.y * groups.x + wid.x) * WORKGROUP + lid.x;
}

fn is_finite(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7f800000u) != 0x7f800000u;
}
