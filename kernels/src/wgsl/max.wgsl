// The maximum over one dimension and its backward; match kernels/src/max.rs.
// The input is outer×dim×inner; u[8] outer, u[9] dim, u[10] inner. Indices
// are i32 words. max_dim: one invocation per output element, scanning its
// dim elements in order (the first maximum, or the first NaN, wins);
// max_dim_backward: one per input element.

// NaN by its bits: a compiler may fold `v != v` away.
fn max_is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

fn max_replaces(v: f32, best: f32) -> bool {
    if (max_is_nan(best)) { return false; }
    if (max_is_nan(v)) { return true; }
    return v > best;
}

// b1 x, b2 values, b3 indices.
@compute @workgroup_size(256)
fn max_dim(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
           @builtin(num_workgroups) groups: vec3<u32>) {
    let j = linear(wid, lid, groups);
    if (j >= count()) { return; }
    let dim = pu(9u);
    let inner = pu(10u);
    let first = base(1u) + (j / inner) * dim * inner + j % inner;
    var best = b1[first];
    var index = 0u;
    for (var k = 1u; k < dim; k = k + 1u) {
        let v = b1[first + k * inner];
        if (max_replaces(v, best)) {
            best = v;
            index = k;
        }
    }
    b2[base(2u) + j] = best;
    b3[base(3u) + j] = bitcast<f32>(index);
}

// b1 indices, b2 grad_out, b3 grad_x.
@compute @workgroup_size(256)
fn max_dim_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
                    @builtin(num_workgroups) groups: vec3<u32>) {
    let n = linear(wid, lid, groups);
    if (n >= count()) { return; }
    let dim = pu(9u);
    let inner = pu(10u);
    let o = n / (dim * inner);
    let k = (n / inner) % dim;
    let j = o * inner + n % inner;
    let index = bitcast<u32>(b1[base(1u) + j]);
    b3[base(3u) + n] = select(0.0, b2[base(2u) + j], index == k);
}
