// The buffer bindings of a vec4 module: every buffer an array of vec4<f32>,
// each bound where its first element is a multiple of 4 in and its length
// a multiple of 4. `base` and `count()` stay in elements.

@group(0) @binding(1) var<storage, read_write> b1: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> b2: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> b3: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> b4: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> b5: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> b6: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> table: array<u32>;
