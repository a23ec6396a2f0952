// Multi-head attention over heads in place; matches kernels/src/attention.rs
// (every sum in order: each dot product over the head's elements, each
// output element over the keys or queries).
//
// u[8] batch, u[9] heads, u[10] queries, u[11] keys, u[12] head_dim,
// u[13] 1 when causal; f[0] the scale. q and the output are
// [batch, queries, heads, head_dim], k and v [batch, keys, heads,
// head_dim], the weights [batch, heads, queries, keys].

fn att_heads() -> u32 { return pu(9u); }
fn att_queries() -> u32 { return pu(10u); }
fn att_keys() -> u32 { return pu(11u); }
fn att_dim() -> u32 { return pu(12u); }

// Where position p of sequence b, head h starts in a [positions, heads,
// head_dim] block.
fn att_row(b: u32, positions: u32, p: u32, h: u32) -> u32 {
    return ((b * positions + p) * att_heads() + h) * att_dim();
}

// Row r = (b·heads + h)·positions + p as (b, h, p).
fn att_unpack(r: u32, positions: u32) -> vec3<u32> {
    return vec3<u32>(r / (positions * att_heads()), (r / positions) % att_heads(), r % positions);
}

// The keys query i sees.
fn att_visible(i: u32) -> u32 {
    if (pu(13u) == 1u) { return min(i + 1u, att_keys()); }
    return att_keys();
}

// b1 q, b2 k, b3 v, b4 out, b5 weights; one invocation per query row
// r = (b·heads + h)·queries + i.
@compute @workgroup_size(256)
fn attention(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
             @builtin(num_workgroups) groups: vec3<u32>) {
    let r = linear(wid, lid, groups);
    let l = att_queries();
    let s = att_keys();
    let n = att_dim();
    if (r >= pu(8u) * att_heads() * l) { return; }
    let at = att_unpack(r, l);
    let b = at.x;
    let h = at.y;
    let i = at.z;
    let q = base(1u) + att_row(b, l, i, h);
    let w = base(5u) + r * s;
    let visible = att_visible(i);
    var top = bitcast<f32>(0xff800000u);
    for (var j = 0u; j < visible; j = j + 1u) {
        let k = base(2u) + att_row(b, s, j, h);
        var dot = 0.0;
        for (var e = 0u; e < n; e = e + 1u) { dot = dot + b1[q + e] * b2[k + e]; }
        let score = dot * pf(0u);
        b5[w + j] = score;
        top = max(top, score);
    }
    var total = 0.0;
    for (var j = 0u; j < visible; j = j + 1u) {
        let x = exp(b5[w + j] - top);
        b5[w + j] = x;
        total = total + x;
    }
    for (var j = 0u; j < visible; j = j + 1u) { b5[w + j] = b5[w + j] / total; }
    for (var j = visible; j < s; j = j + 1u) { b5[w + j] = 0.0; }
    let o = base(4u) + att_row(b, l, i, h);
    for (var e = 0u; e < n; e = e + 1u) {
        var acc = 0.0;
        for (var j = 0u; j < visible; j = j + 1u) {
            acc = acc + b5[w + j] * b3[base(3u) + att_row(b, s, j, h) + e];
        }
        b4[o + e] = acc;
    }
}

// b1 k, b2 v, b3 weights, b4 grad_out, b5 grad_scores, b6 grad_q; one
// invocation per query row, as the forward.
@compute @workgroup_size(256)
fn attention_backward_queries(@builtin(workgroup_id) wid: vec3<u32>,
                              @builtin(local_invocation_id) lid: vec3<u32>,
                              @builtin(num_workgroups) groups: vec3<u32>) {
    let r = linear(wid, lid, groups);
    let l = att_queries();
    let s = att_keys();
    let n = att_dim();
    if (r >= pu(8u) * att_heads() * l) { return; }
    let at = att_unpack(r, l);
    let b = at.x;
    let h = at.y;
    let i = at.z;
    let g = base(4u) + att_row(b, l, i, h);
    let w = base(3u) + r * s;
    let ds = base(5u) + r * s;
    let visible = att_visible(i);
    var weighted = 0.0;
    for (var j = 0u; j < visible; j = j + 1u) {
        let v = base(2u) + att_row(b, s, j, h);
        var dot = 0.0;
        for (var e = 0u; e < n; e = e + 1u) { dot = dot + b4[g + e] * b2[v + e]; }
        b5[ds + j] = dot;
        weighted = weighted + b3[w + j] * dot;
    }
    for (var j = 0u; j < visible; j = j + 1u) {
        b5[ds + j] = b3[w + j] * (b5[ds + j] - weighted);
    }
    for (var j = visible; j < s; j = j + 1u) { b5[ds + j] = 0.0; }
    let gq = base(6u) + att_row(b, l, i, h);
    for (var e = 0u; e < n; e = e + 1u) {
        var acc = 0.0;
        for (var j = 0u; j < visible; j = j + 1u) {
            acc = acc + b5[ds + j] * b1[base(1u) + att_row(b, s, j, h) + e];
        }
        b6[gq + e] = acc * pf(0u);
    }
}

// b1 q, b2 weights, b3 grad_out, b4 grad_scores, b5 grad_k, b6 grad_v; one
// invocation per key row r = (b·heads + h)·keys + j.
@compute @workgroup_size(256)
fn attention_backward_keys(@builtin(workgroup_id) wid: vec3<u32>,
                           @builtin(local_invocation_id) lid: vec3<u32>,
                           @builtin(num_workgroups) groups: vec3<u32>) {
    let r = linear(wid, lid, groups);
    let l = att_queries();
    let s = att_keys();
    let n = att_dim();
    if (r >= pu(8u) * att_heads() * s) { return; }
    let unpacked = att_unpack(r, s);
    let b = unpacked.x;
    let h = unpacked.y;
    let j = unpacked.z;
    let at = att_row(b, s, j, h);
    let first = (b * att_heads() + h) * l;
    for (var e = 0u; e < n; e = e + 1u) {
        var dk = 0.0;
        var dv = 0.0;
        for (var i = 0u; i < l; i = i + 1u) {
            let w = (first + i) * s + j;
            let row = att_row(b, l, i, h) + e;
            dk = dk + b4[base(4u) + w] * b1[base(1u) + row];
            dv = dv + b2[base(2u) + w] * b3[base(3u) + row];
        }
        b5[base(5u) + at + e] = dk * pf(0u);
        b6[base(6u) + at + e] = dv;
    }
}
