// Reductions: column sums, per-segment sums (and of squares), the MSE loss.
// Each sum is Kahan-compensated per invocation, then a tree in workgroup memory.

var<workgroup> partial: array<f32, 256>;

struct Kahan { sum: f32, carry: f32 };

fn kahan_add(acc: Kahan, v: f32) -> Kahan {
    let y = v - acc.carry;
    let t = acc.sum + y;
    return Kahan(t, (t - acc.sum) - y);
}

// The workgroup's total of each invocation's `value` (in every invocation).
fn workgroup_total(lid: u32, value: f32) -> f32 {
    partial[lid] = value;
    workgroupBarrier();
    for (var half = WORKGROUP / 2u; half > 0u; half = half / 2u) {
        if (lid < half) { partial[lid] = partial[lid] + partial[lid + half]; }
        workgroupBarrier();
    }
    return partial[0];
}

// u[0]: cols; u[8]: rows. out[j] = Σ_i x[i·cols + j]; b1 x, b2 out.
@compute @workgroup_size(256)
fn column_sum(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
              @builtin(num_workgroups) groups: vec3<u32>) {
    let j = linear(wid, lid, groups);
    let cols = count();
    if (j >= cols) { return; }
    var acc = Kahan(0.0, 0.0);
    for (var i = 0u; i < pu(8u); i = i + 1u) {
        acc = kahan_add(acc, b1[base(1u) + i * cols + j]);
    }
    b2[base(2u) + j] = acc.sum;
}

// One workgroup per segment (table: offset, len pairs); u[0]: segments;
// op 0: Σx, 1: Σx². b1 x, b2 out.
@compute @workgroup_size(256)
fn segment_sum(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
               @builtin(num_workgroups) groups: vec3<u32>) {
    let s = wid.y * groups.x + wid.x;
    if (s >= count()) { return; }
    let offset = table[2u * s];
    let len = table[2u * s + 1u];
    var acc = Kahan(0.0, 0.0);
    for (var i = lid.x; i < len; i = i + WORKGROUP) {
        let v = b1[base(1u) + offset + i];
        acc = kahan_add(acc, select(v, v * v, op() == 1u));
    }
    let total = workgroup_total(lid.x, acc.sum);
    if (lid.x == 0u) { b2[base(2u) + s] = total; }
}

// One workgroup: out[0] = Σ(pred − target)² / n; b1 pred, b2 target, b3 out.
@compute @workgroup_size(256)
fn mse_loss(@builtin(local_invocation_id) lid: vec3<u32>) {
    let n = count();
    var acc = Kahan(0.0, 0.0);
    for (var i = lid.x; i < n; i = i + WORKGROUP) {
        let d = b1[base(1u) + i] - b2[base(2u) + i];
        acc = kahan_add(acc, d * d);
    }
    let total = workgroup_total(lid.x, acc.sum);
    if (lid.x == 0u) { b3[base(3u)] = total / f32(n); }
}
