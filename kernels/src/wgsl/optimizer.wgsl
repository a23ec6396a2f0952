// Fused optimizer steps over one run of elements, as `cistern-kernels`'
// CPU versions (the per-step constants come from the host, in f[..]);
// each invocation of a streaming step handles PER_INVOCATION elements.
// Bindings: 1 params, 2 grads, 3 the found-inf flag (a zero placeholder
// without AMP), 4-6 the state. A set flag makes the step change nothing.
// op(): bit flags per family, and COUNTED for a counted step: binding 3 is
// then the constants `step_count` wrote (in amp.wgsl), [0] the skip and
// [1..] the per-step constants, read in place of the host's
// (`skipped` and `per_step`, in step.wgsl).

// f: sign, weight_decay, lr, momentum, 1 − dampening.
// op: 1 decayed, 2 momentum buffer, 4 first step, 8 nesterov (counted: constant 1
// is the first step).
fn sgd_at(i: u32) {
    let flags = op();
    let at = base(1u) + i;
    let p = b1[at];
    var d = b2[base(2u) + i] * pf(0u);
    if ((flags & 1u) != 0u) { d = d + pf(1u) * p; }
    if ((flags & 2u) == 0u) {
        b1[at] = p - pf(2u) * d;
        return;
    }
    let bat = base(4u) + i;
    var b = d;
    let first = per_step(1u, select(0.0, 1.0, (flags & 4u) != 0u)) != 0.0;
    if (!first) { b = pf(3u) * b4[bat] + pf(4u) * d; }
    b4[bat] = b;
    var step = b;
    if ((flags & 8u) != 0u) { step = d + pf(3u) * b; }
    b1[at] = p - pf(2u) * step;
}

@compute @workgroup_size(256)
fn sgd(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
       @builtin(num_workgroups) groups: vec3<u32>) {
    if (skipped()) { return; }
    let n = count();
    for (var k = 0u; k < PER_INVOCATION; k = k + 1u) {
        let i = streaming(wid, lid, groups, k);
        if (i >= n) { return; }
        sgd_at(i);
    }
}

// f: sign, coupled_decay, decay_factor, 1 − β1, β2, 1 − β2, step_size,
// 1/√bias_correction2, eps (counted: constants 1, 2 are the step size and
// 1/√bias_correction2). op: 1 coupled decay, 2 amsgrad.
fn adam_at(i: u32) {
    let flags = op();
    let at = base(1u) + i;
    let p = b1[at];
    var grad = b2[base(2u) + i] * pf(0u);
    if ((flags & 1u) != 0u) { grad = grad + pf(1u) * p; }
    let param = p * pf(2u);
    let mat = base(4u) + i;
    let vat = base(5u) + i;
    let m = b4[mat] + pf(3u) * (grad - b4[mat]);
    let v = b5[vat] * pf(4u) + pf(5u) * grad * grad;
    b4[mat] = m;
    b5[vat] = v;
    var second = v;
    if ((flags & 2u) != 0u) {
        let xat = base(6u) + i;
        let old = b6[xat];
        // NaN in v wins, as with torch.maximum.
        second = select(v, old, old >= v);
        b6[xat] = second;
    }
    let denom = sqrt(second) * per_step(2u, pf(7u)) + pf(8u);
    b1[at] = param - per_step(1u, pf(6u)) * (m / denom);
}

@compute @workgroup_size(256)
fn adam(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) groups: vec3<u32>) {
    if (skipped()) { return; }
    let n = count();
    for (var k = 0u; k < PER_INVOCATION; k = k + 1u) {
        let i = streaming(wid, lid, groups, k);
        if (i >= n) { return; }
        adam_at(i);
    }
}

// f: sign, weight_decay, lr, α, 1 − α, eps, momentum.
// op: 1 decayed, 2 momentum (buffer in 5), 4 centered (grad_avg in 6).
fn rmsprop_at(i: u32) {
    let flags = op();
    let at = base(1u) + i;
    var grad = b2[base(2u) + i] * pf(0u);
    // PyTorch's CPU order and FMAs (kernels/src/optimizer/rmsprop.rs).
    if ((flags & 1u) != 0u) { grad = fma(b1[at], pf(1u), grad); }
    let sat = base(4u) + i;
    let sq = fma(pf(4u) * grad, grad, b4[sat] * pf(3u));
    b4[sat] = sq;
    var avg: f32;
    if ((flags & 4u) != 0u) {
        let gat = base(6u) + i;
        let ga = fma(pf(4u), grad - b6[gat], b6[gat]);
        b6[gat] = ga;
        avg = sqrt(fma(-ga, ga, sq)) + pf(5u);
    } else {
        avg = sqrt(sq) + pf(5u);
    }
    if ((flags & 2u) != 0u) {
        let mat = base(5u) + i;
        let buf = b5[mat] * pf(6u) + grad / avg;
        b5[mat] = buf;
        b1[at] = fma(buf, -pf(2u), b1[at]);
    } else {
        b1[at] = b1[at] + (-pf(2u) * grad) / avg;
    }
}

@compute @workgroup_size(256)
fn rmsprop(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
           @builtin(num_workgroups) groups: vec3<u32>) {
    if (skipped()) { return; }
    let n = count();
    for (var k = 0u; k < PER_INVOCATION; k = k + 1u) {
        let i = streaming(wid, lid, groups, k);
        if (i >= n) { return; }
        rmsprop_at(i);
    }
}

// f: sign, weight_decay, clr, eps (counted: constant 1 is clr). op: 1 decayed.
fn adagrad_at(i: u32) {
    let at = base(1u) + i;
    var grad = b2[base(2u) + i] * pf(0u);
    if ((op() & 1u) != 0u) { grad = grad + pf(1u) * b1[at]; }
    let sat = base(4u) + i;
    let total = b4[sat] + grad * grad;
    b4[sat] = total;
    b1[at] = b1[at] - per_step(1u, pf(2u)) * (grad / (sqrt(total) + pf(3u)));
}

@compute @workgroup_size(256)
fn adagrad(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
           @builtin(num_workgroups) groups: vec3<u32>) {
    if (skipped()) { return; }
    let n = count();
    for (var k = 0u; k < PER_INVOCATION; k = k + 1u) {
        let i = streaming(wid, lid, groups, k);
        if (i >= n) { return; }
        adagrad_at(i);
    }
}

// LAMB (apex FusedLAMB), one workgroup per segment of the table (offset,
// len). f: 1/clip, decay, β1, β2, β3, 1 − β2, 1/bias_correction1,
// 1/bias_correction2, eps. op: 1 adam_w_mode.
fn lamb_update(p: f32, g_in: f32, m_in: f32, v_in: f32) -> vec3<f32> {
    var g = g_in * pf(0u);
    let adam_w = (op() & 1u) != 0u;
    if (!adam_w) { g = g + pf(1u) * p; }
    let m = m_in * pf(2u) + pf(4u) * g;
    let v = v_in * pf(3u) + pf(5u) * g * g;
    let denom = sqrt(v * pf(7u)) + pf(8u);
    var u = (m * pf(6u)) / denom;
    if (adam_w) { u = u + pf(1u) * p; }
    return vec3<f32>(m, v, u);
}

var<workgroup> lamb_partial: array<vec2<f32>, 256>;

// b6[2s], b6[2s + 1] ← Σp², Σu² of segment s (NaN when a new moment is not finite).
@compute @workgroup_size(256)
fn lamb_measure(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
                @builtin(num_workgroups) groups: vec3<u32>) {
    let s = wid.y * groups.x + wid.x;
    if (s >= count()) { return; }
    let offset = table[2u * s];
    let len = table[2u * s + 1u];
    var sums = vec2<f32>(0.0, 0.0);
    for (var i = lid.x; i < len; i = i + WORKGROUP) {
        let e = offset + i;
        let p = b1[base(1u) + e];
        let r = lamb_update(p, b2[base(2u) + e], b4[base(4u) + e], b5[base(5u) + e]);
        let u = r.z + (r.x * 0.0 + r.y * 0.0);
        sums = sums + vec2<f32>(p * p, u * u);
    }
    lamb_partial[lid.x] = sums;
    workgroupBarrier();
    for (var half = WORKGROUP / 2u; half > 0u; half = half / 2u) {
        if (lid.x < half) { lamb_partial[lid.x] = lamb_partial[lid.x] + lamb_partial[lid.x + half]; }
        workgroupBarrier();
    }
    if (lid.x == 0u) {
        b6[base(6u) + 2u * s] = lamb_partial[0].x;
        b6[base(6u) + 2u * s + 1u] = lamb_partial[0].y;
    }
}

// The write pass: b6[s] is segment s's ratio.
@compute @workgroup_size(256)
fn lamb_write(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
              @builtin(num_workgroups) groups: vec3<u32>) {
    let s = wid.y * groups.x + wid.x;
    if (s >= count()) { return; }
    let offset = table[2u * s];
    let len = table[2u * s + 1u];
    let ratio = b6[base(6u) + s];
    for (var i = lid.x; i < len; i = i + WORKGROUP) {
        let e = offset + i;
        let p = b1[base(1u) + e];
        let r = lamb_update(p, b2[base(2u) + e], b4[base(4u) + e], b5[base(5u) + e]);
        b4[base(4u) + e] = r.x;
        b5[base(5u) + e] = r.y;
        b1[base(1u) + e] = p - ratio * r.z;
    }
}
