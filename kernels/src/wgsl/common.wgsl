// Shared by every Cistern WGSL module (prepended to each source).
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
@group(0) @binding(1) var<storage, read_write> b1: array<f32>;
@group(0) @binding(2) var<storage, read_write> b2: array<f32>;
@group(0) @binding(3) var<storage, read_write> b3: array<f32>;
@group(0) @binding(4) var<storage, read_write> b4: array<f32>;
@group(0) @binding(5) var<storage, read_write> b5: array<f32>;
@group(0) @binding(6) var<storage, read_write> b6: array<f32>;
@group(0) @binding(7) var<storage, read_write> table: array<u32>;

const WORKGROUP: u32 = 256u;

// u[0]: elements in this dispatch; u[1..6]: each binding's base; u[7]: an op code.
fn pu(i: u32) -> u32 { return params.u[i / 4u][i % 4u]; }
fn pf(i: u32) -> f32 { return params.f[i / 4u][i % 4u]; }
fn count() -> u32 { return pu(0u); }
fn base(binding: u32) -> u32 { return pu(binding); }
fn op() -> u32 { return pu(7u); }

// The element of a 1D dispatch folded into two grid dimensions.
fn linear(wid: vec3<u32>, lid: vec3<u32>, groups: vec3<u32>) -> u32 {
    return (wid.y * groups.x + wid.x) * WORKGROUP + lid.x;
}

fn is_finite(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7f800000u) != 0x7f800000u;
}
