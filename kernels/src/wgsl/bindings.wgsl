// The buffer bindings of a scalar module: every buffer an array of f32.

@group(0) @binding(1) var<storage, read_write> b1: array<f32>;
@group(0) @binding(2) var<storage, read_write> b2: array<f32>;
@group(0) @binding(3) var<storage, read_write> b3: array<f32>;
@group(0) @binding(4) var<storage, read_write> b4: array<f32>;
@group(0) @binding(5) var<storage, read_write> b5: array<f32>;
@group(0) @binding(6) var<storage, read_write> b6: array<f32>;
@group(0) @binding(7) var<storage, read_write> table: array<u32>;
