// Layer normalisation and embeddings; match kernels/src/norm.rs and
// kernels/src/embedding.rs (f32, two passes per row as the CPU).
//
// layer_norm(_backward): one invocation per row; u[8] rows, u[9] cols,
// u[10] 1 when affine; f[0] eps. Stats are means then rstds (2·rows).
// embedding: one invocation per output element; embedding_backward: one
// per column, summing in index order. u[8] rows, u[9] dim, u[10] vocab,
// u[13] a NaN's bits.

fn norm_rows() -> u32 { return pu(8u); }
fn norm_cols() -> u32 { return pu(9u); }

// b2: the weight, where affine.
fn norm_weight(c: u32) -> f32 {
    if (pu(10u) == 0u) { return 1.0; }
    return b2[base(2u) + c];
}

// b1 x, b2 weight, b3 bias, b4 y, b5 stats.
@compute @workgroup_size(256)
fn layer_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
              @builtin(num_workgroups) groups: vec3<u32>) {
    let r = linear(wid, lid, groups);
    if (r >= norm_rows()) { return; }
    let n = norm_cols();
    let x = base(1u) + r * n;
    var sum = 0.0;
    for (var c = 0u; c < n; c = c + 1u) { sum = sum + b1[x + c]; }
    let mean = sum / f32(n);
    var sq = 0.0;
    for (var c = 0u; c < n; c = c + 1u) { let d = b1[x + c] - mean; sq = sq + d * d; }
    let rstd = 1.0 / sqrt(sq / f32(n) + pf(0u));
    b5[base(5u) + r] = mean;
    b5[base(5u) + norm_rows() + r] = rstd;
    let y = base(4u) + r * n;
    for (var c = 0u; c < n; c = c + 1u) {
        let xhat = (b1[x + c] - mean) * rstd;
        if (pu(10u) == 0u) {
            b4[y + c] = xhat;
        } else {
            b4[y + c] = xhat * b2[base(2u) + c] + b3[base(3u) + c];
        }
    }
}

// b1 x, b2 weight, b3 stats, b4 grad_y, b5 grad_x, b6 grad_y ⊙ x̂.
@compute @workgroup_size(256)
fn layer_norm_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
                       @builtin(num_workgroups) groups: vec3<u32>) {
    let r = linear(wid, lid, groups);
    if (r >= norm_rows()) { return; }
    let n = norm_cols();
    let x = base(1u) + r * n;
    let g = base(4u) + r * n;
    let mean = b3[base(3u) + r];
    let rstd = b3[base(3u) + norm_rows() + r];
    var sum_h = 0.0;
    var sum_hx = 0.0;
    for (var c = 0u; c < n; c = c + 1u) {
        let xhat = (b1[x + c] - mean) * rstd;
        let h = b4[g + c] * norm_weight(c);
        sum_h = sum_h + h;
        sum_hx = sum_hx + h * xhat;
        b6[base(6u) + r * n + c] = b4[g + c] * xhat;
    }
    let mean_h = sum_h / f32(n);
    let mean_hx = sum_hx / f32(n);
    for (var c = 0u; c < n; c = c + 1u) {
        let xhat = (b1[x + c] - mean) * rstd;
        let h = b4[g + c] * norm_weight(c);
        b5[base(5u) + r * n + c] = rstd * (h - mean_h - xhat * mean_hx);
    }
}

// Index i's table row, or -1 when out of range.
fn embedding_row(i: u32, indices: u32) -> i32 {
    let t = bitcast<i32>(b2[base(indices) + i]);
    if (t < 0 || u32(t) >= pu(10u)) { return -1; }
    return t;
}

// b1 weight, b2 indices, b3 out.
@compute @workgroup_size(256)
fn embedding(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
             @builtin(num_workgroups) groups: vec3<u32>) {
    let i = linear(wid, lid, groups);
    if (i >= count()) { return; }
    let dim = pu(9u);
    let row = embedding_row(i / dim, 2u);
    if (row < 0) {
        b3[base(3u) + i] = bitcast<f32>(pu(13u));
    } else {
        b3[base(3u) + i] = b1[base(1u) + u32(row) * dim + i % dim];
    }
}

// b1 indices, b2 grad_out, b3 grad_weight.
@compute @workgroup_size(256)
fn embedding_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
                      @builtin(num_workgroups) groups: vec3<u32>) {
    let c = linear(wid, lid, groups);
    let dim = pu(9u);
    if (c >= dim) { return; }
    let vocab = pu(10u);
    for (var v = 0u; v < vocab; v = v + 1u) { b3[base(3u) + v * dim + c] = 0.0; }
    for (var i = 0u; i < pu(8u); i = i + 1u) {
        let t = bitcast<i32>(b1[base(1u) + i]);
        if (t >= 0 && u32(t) < vocab) {
            let at = base(3u) + u32(t) * dim + c;
            b3[at] = b3[at] + b2[base(2u) + i * dim + c];
        }
    }
}

// Dropout (kernels/src/dropout.rs): u[8], u[9] the seed's low and high
// words, u[10] the threshold; f[0] the scale. One invocation per element.
fn lowbias32(v: u32) -> u32 {
    var x = v;
    x = x ^ (x >> 16u);
    x = x * 0x7feb352du;
    x = x ^ (x >> 15u);
    x = x * 0x846ca68bu;
    x = x ^ (x >> 16u);
    return x;
}

// b1 x, b2 out.
@compute @workgroup_size(256)
fn dropout(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
           @builtin(num_workgroups) groups: vec3<u32>) {
    let i = linear(wid, lid, groups);
    if (i >= count()) { return; }
    let key = lowbias32(pu(8u) ^ lowbias32(pu(9u)));
    let keep = (lowbias32(i ^ key) >> 8u) >= pu(10u);
    b2[base(2u) + i] = select(0.0, b1[base(1u) + i] * pf(0u), keep);
}

// The counted form (dropout_counted): b1 x, b2 the step counter (a u32 in
// an f32's bits), added to the seed's high word; b3 out.
@compute @workgroup_size(256)
fn dropout_counted(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
                   @builtin(num_workgroups) groups: vec3<u32>) {
    let i = linear(wid, lid, groups);
    if (i >= count()) { return; }
    let high = pu(9u) + bitcast<u32>(b2[base(2u)]);
    let key = lowbias32(pu(8u) ^ lowbias32(high));
    let keep = (lowbias32(i ^ key) >> 8u) >= pu(10u);
    b3[base(3u) + i] = select(0.0, b1[base(1u) + i] * pf(0u), keep);
}

// A resident dataset's batch (kernels/src/dataset.rs): u[8] rows, u[9]
// width, u[10] target width, u[11] batch, u[12], u[13] the seed's words.
// b1 features, b2 targets, b3 counter (a u32 in an f32's bits), b4 x, b5 y;
// one invocation per word of x and y. batch_gather_advance (b1 the
// counter) runs after it.
fn shuffled(position: u32, rows: u32, key: u32) -> u32 {
    var bits = 0u;
    if (rows > 1u) { bits = 32u - countLeadingZeros(rows - 1u); }
    bits = max(bits, 2u);
    let half = (bits + 1u) / 2u;
    let mask = (1u << half) - 1u;
    var x = position;
    loop {
        var left = x >> half;
        var right = x & mask;
        for (var round = 0u; round < 4u; round = round + 1u) {
            let f = lowbias32(right ^ (key + round * 0x9e3779b9u)) & mask;
            let t = left ^ f;
            left = right;
            right = t;
        }
        x = (left << half) | right;
        if (x < rows) { break; }
    }
    return x;
}

@compute @workgroup_size(256)
fn batch_gather(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
                @builtin(num_workgroups) groups: vec3<u32>) {
    let i = linear(wid, lid, groups);
    if (i >= count()) { return; }
    let rows = pu(8u);
    let width = pu(9u);
    let target_width = pu(10u);
    let batch = pu(11u);
    let step = bitcast<u32>(b3[base(3u)]);
    let per_epoch = max(rows / batch, 1u);
    let key = lowbias32((step / per_epoch) ^ lowbias32(pu(12u) ^ lowbias32(pu(13u))));
    let words = width + target_width;
    let r = i / words;
    let c = i % words;
    let row = shuffled((step % per_epoch) * batch + r, rows, key);
    if (c < width) {
        b4[base(4u) + r * width + c] = b1[base(1u) + row * width + c];
    } else {
        let t = c - width;
        b5[base(5u) + r * target_width + t] = bitcast<f32>(bitcast<u32>(b2[base(2u) + row * target_width + t]));
    }
}

@compute @workgroup_size(1)
fn batch_gather_advance() {
    b1[base(1u)] = bitcast<f32>(bitcast<u32>(b1[base(1u)]) + 1u);
}
