// Elementwise kernels over `count()` elements: fill, scale, axpy, add, mul,
// mse_loss_backward, amp_unscale (f[0] is the kernel's scalar).

@compute @workgroup_size(256)
fn fill(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) groups: vec3<u32>) {
    let i = linear(wid, lid, groups);
    if (i >= count()) { return; }
    b1[base(1u) + i] = pf(0u);
}

@compute @workgroup_size(256)
fn scale(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
         @builtin(num_workgroups) groups: vec3<u32>) {
    let i = linear(wid, lid, groups);
    if (i >= count()) { return; }
    let at = base(1u) + i;
    b1[at] = b1[at] * pf(0u);
}

@compute @workgroup_size(256)
fn axpy(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) groups: vec3<u32>) {
    let i = linear(wid, lid, groups);
    if (i >= count()) { return; }
    let at = base(1u) + i;
    b1[at] = b1[at] + pf(0u) * b2[base(2u) + i];
}

// op 0: add, 1: mul, 2: f[0]·(a − b) (MSE backward).
@compute @workgroup_size(256)
fn binary(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
          @builtin(num_workgroups) groups: vec3<u32>) {
    let i = linear(wid, lid, groups);
    if (i >= count()) { return; }
    let a = b1[base(1u) + i];
    let b = b2[base(2u) + i];
    var out: f32;
    switch op() {
        case 0u: { out = a + b; }
        case 1u: { out = a * b; }
        default: { out = pf(0u) * (a - b); }
    }
    b3[base(3u) + i] = out;
}

// grads ← grads·f[0]; the flag (binding 2) becomes 1 on a non-finite gradient.
@compute @workgroup_size(256)
fn amp_unscale(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
               @builtin(num_workgroups) groups: vec3<u32>) {
    let i = linear(wid, lid, groups);
    if (i >= count()) { return; }
    let at = base(1u) + i;
    let g = b1[at];
    if (!is_finite(g)) { b2[base(2u)] = 1.0; }
    b1[at] = g * pf(0u);
}
