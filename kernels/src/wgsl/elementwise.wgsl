// Elementwise kernels over `count()` elements: amp_unscale (f[0] its
// scalar), each invocation PER_INVOCATION elements (see `streaming`); the
// activations' forward and backward (op the activation's code, f[0] its
// slope; needs activation.wgsl), an element each. The plain element-wise
// kernels are made from their definitions (kernels/src/map/ops.rs).

// grads ← grads·f[0]; the flag (binding 2) becomes 1 on a non-finite gradient.
@compute @workgroup_size(256)
fn amp_unscale(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
               @builtin(num_workgroups) groups: vec3<u32>) {
    let n = count();
    let factor = pf(0u);
    let first = base(1u);
    for (var k = 0u; k < PER_INVOCATION; k = k + 1u) {
        let i = streaming(wid, lid, groups, k);
        if (i >= n) { return; }
        let at = first + i;
        let g = b1[at];
        if (!is_finite(g)) { b2[base(2u)] = 1.0; }
        b1[at] = g * factor;
    }
}

@compute @workgroup_size(256)
fn forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
           @builtin(num_workgroups) groups: vec3<u32>) {
    let i = linear(wid, lid, groups);
    if (i >= count()) { return; }
    b2[base(2u) + i] = activate(op(), pf(0u), b1[base(1u) + i]);
}

@compute @workgroup_size(256)
fn backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
            @builtin(num_workgroups) groups: vec3<u32>) {
    let i = linear(wid, lid, groups);
    if (i >= count()) { return; }
    b3[base(3u) + i] = gradient(op(), pf(0u), b1[base(1u) + i], b2[base(2u) + i]);
}
