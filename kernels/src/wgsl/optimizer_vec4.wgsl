// The streaming optimizer steps four elements per load, where every
// streamed binding starts a multiple of 4 elements in and the run is a
// multiple of 4 long; the same arithmetic, in the same order, as the entry
// of the same name in optimizer.wgsl (which takes any other run, and the
// tail). f and op as there. Needs step.wgsl.

@compute @workgroup_size(256)
fn sgd(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
       @builtin(num_workgroups) groups: vec3<u32>) {
    if (skipped()) { return; }
    let n = count() / 4u;
    let flags = op();
    let sign = pf(0u);
    let decay = pf(1u);
    let lr = pf(2u);
    let momentum = pf(3u);
    let one_minus_dampening = pf(4u);
    let first = per_step(1u, select(0.0, 1.0, (flags & 4u) != 0u)) != 0.0;
    let p0 = base(1u) / 4u;
    let g0 = base(2u) / 4u;
    let b0 = base(4u) / 4u;
    for (var k = 0u; k < PER_INVOCATION; k = k + 1u) {
        let i = streaming(wid, lid, groups, k);
        if (i >= n) { return; }
        let p = b1[p0 + i];
        var d = b2[g0 + i] * sign;
        if ((flags & 1u) != 0u) { d = d + decay * p; }
        if ((flags & 2u) == 0u) {
            b1[p0 + i] = p - lr * d;
            continue;
        }
        var b = d;
        if (!first) { b = momentum * b4[b0 + i] + one_minus_dampening * d; }
        b4[b0 + i] = b;
        var step = b;
        if ((flags & 8u) != 0u) { step = d + momentum * b; }
        b1[p0 + i] = p - lr * step;
    }
}

@compute @workgroup_size(256)
fn adam(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) groups: vec3<u32>) {
    if (skipped()) { return; }
    let n = count() / 4u;
    let flags = op();
    let sign = pf(0u);
    let coupled = pf(1u);
    let decay = pf(2u);
    let one_minus_beta1 = pf(3u);
    let beta2 = pf(4u);
    let one_minus_beta2 = pf(5u);
    let step_size = per_step(1u, pf(6u));
    let inv_bias2 = per_step(2u, pf(7u));
    let eps = pf(8u);
    let p0 = base(1u) / 4u;
    let g0 = base(2u) / 4u;
    let m0 = base(4u) / 4u;
    let v0 = base(5u) / 4u;
    let x0 = base(6u) / 4u;
    for (var k = 0u; k < PER_INVOCATION; k = k + 1u) {
        let i = streaming(wid, lid, groups, k);
        if (i >= n) { return; }
        let p = b1[p0 + i];
        var grad = b2[g0 + i] * sign;
        if ((flags & 1u) != 0u) { grad = grad + coupled * p; }
        let param = p * decay;
        let m_old = b4[m0 + i];
        let m = m_old + one_minus_beta1 * (grad - m_old);
        let v = b5[v0 + i] * beta2 + one_minus_beta2 * grad * grad;
        b4[m0 + i] = m;
        b5[v0 + i] = v;
        var second = v;
        if ((flags & 2u) != 0u) {
            let old = b6[x0 + i];
            // NaN in v wins, as with torch.maximum.
            second = select(v, old, old >= v);
            b6[x0 + i] = second;
        }
        let denom = sqrt(second) * inv_bias2 + eps;
        b1[p0 + i] = param - step_size * (m / denom);
    }
}

@compute @workgroup_size(256)
fn rmsprop(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
           @builtin(num_workgroups) groups: vec3<u32>) {
    if (skipped()) { return; }
    let n = count() / 4u;
    let flags = op();
    let sign = pf(0u);
    let decay = pf(1u);
    let lr = pf(2u);
    let alpha = pf(3u);
    let one_minus_alpha = pf(4u);
    let eps = pf(5u);
    let momentum = pf(6u);
    let p0 = base(1u) / 4u;
    let g0 = base(2u) / 4u;
    let s0 = base(4u) / 4u;
    let m0 = base(5u) / 4u;
    let a0 = base(6u) / 4u;
    for (var k = 0u; k < PER_INVOCATION; k = k + 1u) {
        let i = streaming(wid, lid, groups, k);
        if (i >= n) { return; }
        // PyTorch's CPU order and FMAs (kernels/src/optimizer/rmsprop.rs).
        var grad = b2[g0 + i] * sign;
        if ((flags & 1u) != 0u) { grad = fma(b1[p0 + i], vec4<f32>(decay), grad); }
        let sq = fma(one_minus_alpha * grad, grad, b4[s0 + i] * alpha);
        b4[s0 + i] = sq;
        var avg: vec4<f32>;
        if ((flags & 4u) != 0u) {
            let old = b6[a0 + i];
            let ga = fma(vec4<f32>(one_minus_alpha), grad - old, old);
            b6[a0 + i] = ga;
            avg = sqrt(fma(-ga, ga, sq)) + eps;
        } else {
            avg = sqrt(sq) + eps;
        }
        if ((flags & 2u) != 0u) {
            let buf = b5[m0 + i] * momentum + grad / avg;
            b5[m0 + i] = buf;
            b1[p0 + i] = fma(buf, vec4<f32>(-lr), b1[p0 + i]);
        } else {
            b1[p0 + i] = b1[p0 + i] + (-lr * grad) / avg;
        }
    }
}

@compute @workgroup_size(256)
fn adagrad(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
           @builtin(num_workgroups) groups: vec3<u32>) {
    if (skipped()) { return; }
    let n = count() / 4u;
    let decayed = (op() & 1u) != 0u;
    let sign = pf(0u);
    let decay = pf(1u);
    let clr = per_step(1u, pf(2u));
    let eps = pf(3u);
    let p0 = base(1u) / 4u;
    let g0 = base(2u) / 4u;
    let s0 = base(4u) / 4u;
    for (var k = 0u; k < PER_INVOCATION; k = k + 1u) {
        let i = streaming(wid, lid, groups, k);
        if (i >= n) { return; }
        var grad = b2[g0 + i] * sign;
        if (decayed) { grad = grad + decay * b1[p0 + i]; }
        let total = b4[s0 + i] + grad * grad;
        b4[s0 + i] = total;
        b1[p0 + i] = b1[p0 + i] - clr * (grad / (sqrt(total) + eps));
    }
}
