// C = act(op(A)·op(B) + bias), row-major, register-blocked and tiled in
// workgroup memory: a workgroup computes a 64×64 tile of C, each of its 8×8
// invocations an 8×8 block of it, k walked 16 steps at a time.
// u[8]: m, u[9]: n, u[10]: k, u[11]: transpose_a, u[12]: transpose_b,
// u[13]: has bias, u[14], u[15]: the first row and column of this
// dispatch's band of C (the backend cuts long GEMMs into bands); op(): the
// activation (the activation module's codes).
// Bindings: 1 a, 2 b, 3 bias (a placeholder without one), 4 c.
//
// Invocation (x, y) holds rows 4y..4y+3 and 32+4y..32+4y+3 of the tile and
// columns 4x..4x+3 and 32+4x..32+4x+3, as four 4×4 blocks (mat4x4: column r
// is row r of a block). Every step reads 2 vec4s of A and 2 of B from
// workgroup memory for 64 multiply-adds: per-lane loads are what a CPU
// driver (lavapipe) pays for, the arithmetic is nearly free there. Loads
// of A and B are branch-free (a bounds select, strides for the
// transposes): a SIMD driver runs both sides of every branch.

const TILE: u32 = 64u;
const STEPS: u32 = 16u;

// [q][g]: rows (of A) or columns (of B) 4g..4g+3 of the tile at step q of
// the current k tile; the 17th vec4 is padding, so a store along k lands
// in distinct banks of a GPU's workgroup memory.
var<workgroup> tile_a: array<array<vec4<f32>, 17>, 16>;
var<workgroup> tile_b: array<array<vec4<f32>, 17>, 16>;

// The strides of op(A) and op(B): (i, p) of op(A) at i·ai + p·ap, (p, j) of
// op(B) at p·bp + j·bj.
struct Strides {
    ai: u32,
    ap: u32,
    bp: u32,
    bj: u32,
};

// op(A)[i][p], 0 outside m × k.
fn a_at(s: Strides, i: u32, p: u32, m: u32, k: u32) -> f32 {
    let inside = i < m && p < k;
    return select(0.0, b1[base(1u) + select(0u, i * s.ai + p * s.ap, inside)], inside);
}

// op(B)[p][j], 0 outside k × n.
fn b_at(s: Strides, p: u32, j: u32, n: u32, k: u32) -> f32 {
    let inside = p < k && j < n;
    return select(0.0, b2[base(2u) + select(0u, p * s.bp + j * s.bj, inside)], inside);
}

// The 4×4 block a ⊗ b: column r is row r, a[r] · b.
fn outer(a: vec4<f32>, b: vec4<f32>) -> mat4x4<f32> {
    return mat4x4<f32>(b * a.x, b * a.y, b * a.z, b * a.w);
}

// The bias of columns col..col+3 (0 past n, or without a bias).
fn bias4(col: u32, n: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j = j + 1u) {
        let inside = pu(13u) != 0u && col + j < n;
        v[j] = select(0.0, b3[base(3u) + select(0u, col + j, inside)], inside);
    }
    return v;
}

// Row `row` of C at columns col..col+3: act(v + bias), those inside m × n.
fn store_row(row: u32, col: u32, m: u32, n: u32, v: vec4<f32>) {
    if (row >= m) { return; }
    for (var j = 0u; j < 4u; j = j + 1u) {
        if (col + j < n) {
            b4[base(4u) + row * n + col + j] = activate(op(), pf(0u), v[j]);
        }
    }
}

// Rows row..row+3 of C at columns col..col+3, from a block.
fn store_block(row: u32, col: u32, m: u32, n: u32, c: mat4x4<f32>, bias: vec4<f32>) {
    store_row(row, col, m, n, c[0] + bias);
    store_row(row + 1u, col, m, n, c[1] + bias);
    store_row(row + 2u, col, m, n, c[2] + bias);
    store_row(row + 3u, col, m, n, c[3] + bias);
}

@compute @workgroup_size(8, 8)
fn gemm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let m = pu(8u);
    let n = pu(9u);
    let k = pu(10u);
    let ta = pu(11u) != 0u;
    let tb = pu(12u) != 0u;
    let s = Strides(select(k, 1u, ta), select(1u, m, ta), select(n, 1u, tb), select(1u, k, tb));
    // The tile's first row and column of C.
    let row0 = pu(14u) + wid.y * TILE;
    let col0 = pu(15u) + wid.x * TILE;
    // This invocation's index in the workgroup, 0..63.
    let l = lid.y * 8u + lid.x;
    // Blocks: c01 is rows 4y.., columns 32+4x..; c10 rows 32+4y.., columns 4x...
    var c00 = mat4x4<f32>();
    var c01 = mat4x4<f32>();
    var c10 = mat4x4<f32>();
    var c11 = mat4x4<f32>();
    for (var p0 = 0u; p0 < k; p0 = p0 + STEPS) {
        // Each tile holds 16 × 16 vec4s, 4 per invocation: vec4 e is at
        // (q, g), consecutive e along the operand's contiguous dimension
        // (k for A, n for B, unless transposed), so a GPU's loads coalesce.
        for (var t = 0u; t < 4u; t = t + 1u) {
            let e = l + 64u * t;
            let qa = select(e % 16u, e / 16u, ta);
            let ga = select(e / 16u, e % 16u, ta);
            let i = row0 + 4u * ga;
            let pa = p0 + qa;
            tile_a[qa][ga] = vec4<f32>(a_at(s, i, pa, m, k), a_at(s, i + 1u, pa, m, k),
                a_at(s, i + 2u, pa, m, k), a_at(s, i + 3u, pa, m, k));
            let qb = select(e / 16u, e % 16u, tb);
            let gb = select(e % 16u, e / 16u, tb);
            let j = col0 + 4u * gb;
            let pb = p0 + qb;
            tile_b[qb][gb] = vec4<f32>(b_at(s, pb, j, n, k), b_at(s, pb, j + 1u, n, k),
                b_at(s, pb, j + 2u, n, k), b_at(s, pb, j + 3u, n, k));
        }
        workgroupBarrier();
        for (var q = 0u; q < STEPS; q = q + 1u) {
            let a0 = tile_a[q][lid.y];
            let a1 = tile_a[q][lid.y + 8u];
            let b0 = tile_b[q][lid.x];
            let b1 = tile_b[q][lid.x + 8u];
            c00 = c00 + outer(a0, b0);
            c01 = c01 + outer(a0, b1);
            c10 = c10 + outer(a1, b0);
            c11 = c11 + outer(a1, b1);
        }
        workgroupBarrier();
    }
    let row = row0 + 4u * lid.y;
    let col = col0 + 4u * lid.x;
    let bias0 = bias4(col, n);
    let bias1 = bias4(col + 32u, n);
    store_block(row, col, m, n, c00, bias0);
    store_block(row, col + 32u, m, n, c01, bias1);
    store_block(row + 32u, col, m, n, c10, bias0);
    store_block(row + 32u, col + 32u, m, n, c11, bias1);
}
