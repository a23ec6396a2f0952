// C = act(op(A)·op(B) + bias), row-major, tiled 16×16 in workgroup memory.
// u[8]: m, u[9]: n, u[10]: k, u[11]: transpose_a, u[12]: transpose_b,
// u[13]: has bias; op(): the activation (the activation module's codes).
// Bindings: 1 a, 2 b, 3 bias (a placeholder without one), 4 c.

const TILE: u32 = 16u;

var<workgroup> tile_a: array<array<f32, 16>, 16>;
var<workgroup> tile_b: array<array<f32, 16>, 16>;

fn load_a(i: u32, p: u32, m: u32, k: u32) -> f32 {
    if (i >= m || p >= k) { return 0.0; }
    if (pu(11u) != 0u) { return b1[base(1u) + p * m + i]; }
    return b1[base(1u) + i * k + p];
}

fn load_b(p: u32, j: u32, n: u32, k: u32) -> f32 {
    if (p >= k || j >= n) { return 0.0; }
    if (pu(12u) != 0u) { return b2[base(2u) + j * k + p]; }
    return b2[base(2u) + p * n + j];
}

@compute @workgroup_size(16, 16)
fn gemm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let m = pu(8u);
    let n = pu(9u);
    let k = pu(10u);
    let row = wid.y * TILE + lid.y;
    let col = wid.x * TILE + lid.x;
    var acc = 0.0;
    let tiles = (k + TILE - 1u) / TILE;
    for (var t = 0u; t < tiles; t = t + 1u) {
        tile_a[lid.y][lid.x] = load_a(row, t * TILE + lid.x, m, k);
        tile_b[lid.y][lid.x] = load_b(t * TILE + lid.y, col, n, k);
        workgroupBarrier();
        for (var q = 0u; q < TILE; q = q + 1u) {
            acc = acc + tile_a[lid.y][q] * tile_b[q][lid.x];
        }
        workgroupBarrier();
    }
    if (row >= m || col >= n) { return; }
    var value = acc;
    if (pu(13u) != 0u) { value = value + b3[base(3u) + col]; }
    b4[base(4u) + row * n + col] = activate(op(), pf(0u), value);
}
