// Classification kernels, each matching kernels/src/classify.rs (in f32:
// WGSL has no f64). One invocation per row; a row is stabilised by its
// maximum. Follows reduce.wgsl (its Kahan sums and workgroup_total).
// u[8]: rows; u[9]: columns (classes); u[10]: flags (1 weighted, 2
// log-probabilities, 4 log-softmax); u[11]: reduction (0 none, 1 mean,
// 2 sum); u[12]: ignore_index's bits; u[13]: a NaN's bits. f[0]: label
// smoothing.

fn class_rows() -> u32 { return pu(8u); }
fn class_cols() -> u32 { return pu(9u); }
fn class_flag(bit: u32) -> bool { return (pu(10u) & bit) != 0u; }
fn class_nan() -> f32 { return bitcast<f32>(pu(13u)); }

struct Lse { max: f32, log_sum: f32 };

// The maximum and ln Σ exp(x − max) of b1[start..start + n].
fn row_lse(start: u32, n: u32) -> Lse {
    var m = b1[start];
    for (var c = 1u; c < n; c = c + 1u) { m = max(m, b1[start + c]); }
    var s = 0.0;
    for (var c = 0u; c < n; c = c + 1u) { s = s + exp(b1[start + c] - m); }
    return Lse(m, log(s));
}

// b1 x, b2 y.
@compute @workgroup_size(256)
fn softmax_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
                @builtin(num_workgroups) groups: vec3<u32>) {
    let r = linear(wid, lid, groups);
    if (r >= class_rows()) { return; }
    let n = class_cols();
    let lse = row_lse(base(1u) + r * n, n);
    for (var c = 0u; c < n; c = c + 1u) {
        let v = b1[base(1u) + r * n + c] - lse.max - lse.log_sum;
        b2[base(2u) + r * n + c] = select(exp(v), v, class_flag(4u));
    }
}

// b1 y, b2 grad_output, b3 grad_input.
@compute @workgroup_size(256)
fn softmax_rows_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
                         @builtin(num_workgroups) groups: vec3<u32>) {
    let r = linear(wid, lid, groups);
    if (r >= class_rows()) { return; }
    let n = class_cols();
    let y = base(1u) + r * n;
    let g = base(2u) + r * n;
    let out = base(3u) + r * n;
    var acc = 0.0;
    if (class_flag(4u)) {
        for (var c = 0u; c < n; c = c + 1u) { acc = acc + b2[g + c]; }
        for (var c = 0u; c < n; c = c + 1u) { b3[out + c] = b2[g + c] - exp(b1[y + c]) * acc; }
    } else {
        for (var c = 0u; c < n; c = c + 1u) { acc = acc + b1[y + c] * b2[g + c]; }
        for (var c = 0u; c < n; c = c + 1u) { b3[out + c] = b1[y + c] * (b2[g + c] - acc); }
    }
}

// Row r's class: -1 ignored, -2 out of range (never read through).
fn target_class(r: u32) -> i32 {
    let t = bitcast<i32>(b2[base(2u) + r]);
    if (t == bitcast<i32>(pu(12u))) { return -1; }
    if (t < 0 || u32(t) >= class_cols()) { return -2; }
    return t;
}

// b3: the class weights, where weighted.
fn class_weight(c: u32) -> f32 {
    if (!class_flag(1u)) { return 1.0; }
    return b3[base(3u) + c];
}

struct RowLoss { loss: f32, weight: f32 };

fn row_class_loss(r: u32) -> RowLoss {
    let cls = target_class(r);
    if (cls == -1) { return RowLoss(0.0, 0.0); }
    if (cls < 0) { return RowLoss(class_nan(), class_nan()); }
    let n = class_cols();
    let start = base(1u) + r * n;
    let t = u32(cls);
    let w = class_weight(t);
    if (class_flag(2u)) { return RowLoss(-w * b1[start + t], w); }
    let lse = row_lse(start, n);
    // −log p = log_sum − (x − max): shifted first, as PyTorch.
    let nll = w * (lse.log_sum - (b1[start + t] - lse.max));
    let eps = pf(0u);
    if (eps == 0.0) { return RowLoss(nll, w); }
    var smoothed = Kahan(0.0, 0.0);
    for (var c = 0u; c < n; c = c + 1u) {
        smoothed = kahan_add(smoothed, class_weight(c) * (lse.log_sum - (b1[start + c] - lse.max)));
    }
    return RowLoss((1.0 - eps) * nll + eps / f32(n) * smoothed.sum, w);
}

// No reduction: b1 input, b2 targets, b3 weight, b4 out (one per row).
@compute @workgroup_size(256)
fn class_loss_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
                   @builtin(num_workgroups) groups: vec3<u32>) {
    let r = linear(wid, lid, groups);
    if (r >= class_rows()) { return; }
    b4[base(4u) + r] = row_class_loss(r).loss;
}

// Mean or sum, one workgroup: b4[0] the loss.
@compute @workgroup_size(256)
fn class_loss_total(@builtin(local_invocation_id) lid: vec3<u32>) {
    var loss = Kahan(0.0, 0.0);
    var weight = Kahan(0.0, 0.0);
    for (var r = lid.x; r < class_rows(); r = r + WORKGROUP) {
        let row = row_class_loss(r);
        loss = kahan_add(loss, row.loss);
        weight = kahan_add(weight, row.weight);
    }
    let total = workgroup_total(lid.x, loss.sum);
    // Every invocation has read the first total before the second reuses `partial`.
    workgroupBarrier();
    let weights = workgroup_total(lid.x, weight.sum);
    if (lid.x == 0u) { b4[base(4u)] = select(total, total / weights, pu(11u) == 1u); }
}

// b1 input, b2 targets, b3 weight, b4 grad_output, b5 grad_input.
@compute @workgroup_size(256)
fn class_loss_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
                       @builtin(num_workgroups) groups: vec3<u32>) {
    let r = linear(wid, lid, groups);
    let rows = class_rows();
    if (r >= rows) { return; }
    let n = class_cols();
    let out = base(5u) + r * n;
    let cls = target_class(r);
    if (cls < 0) {
        let fill = select(class_nan(), 0.0, cls == -1);
        for (var c = 0u; c < n; c = c + 1u) { b5[out + c] = fill; }
        return;
    }
    var denominator = 1.0;
    if (pu(11u) == 1u) {
        var d = Kahan(0.0, 0.0);
        for (var i = 0u; i < rows; i = i + 1u) {
            let other = target_class(i);
            if (other >= 0) { d = kahan_add(d, class_weight(u32(other))); }
            if (other == -2) { d = kahan_add(d, class_nan()); }
        }
        denominator = d.sum;
    }
    let g = select(b4[base(4u)], b4[base(4u) + r], pu(11u) == 0u) / denominator;
    let t = u32(cls);
    let w = class_weight(t);
    if (class_flag(2u)) {
        for (var c = 0u; c < n; c = c + 1u) { b5[out + c] = 0.0; }
        b5[out + t] = -g * w;
        return;
    }
    var total_weight = f32(n);
    if (class_flag(1u)) {
        var tw = Kahan(0.0, 0.0);
        for (var c = 0u; c < n; c = c + 1u) { tw = kahan_add(tw, class_weight(c)); }
        total_weight = tw.sum;
    }
    let start = base(1u) + r * n;
    let lse = row_lse(start, n);
    let eps = pf(0u);
    let hard = (1.0 - eps) * w;
    let soft = eps / f32(n);
    for (var c = 0u; c < n; c = c + 1u) {
        let p = exp(b1[start + c] - lse.max - lse.log_sum);
        var v = hard * (p - select(0.0, 1.0, c == t));
        if (soft != 0.0) { v = v + soft * (total_weight * p - class_weight(c)); }
        b5[out + c] = g * v;
    }
}
