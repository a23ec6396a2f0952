// Adam (and AdamW) four elements per load, where every streamed binding
// starts a multiple of 4 elements in and the run is a multiple of 4 long;
// the same arithmetic, in the same order, as `adam` in optimizer.wgsl
// (which takes any other run, and the tail). Needs step.wgsl.

// f and op as `adam` in optimizer.wgsl.
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
