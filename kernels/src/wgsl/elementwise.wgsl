// Elementwise kernels over `count()` elements: fill, scale, axpy, add, mul,
// mse_loss_backward, amp_unscale (f[0] is the kernel's scalar), each
// invocation PER_INVOCATION elements (see `streaming`); the activations'
// forward and backward (op the activation's code, f[0] its slope; needs
// activation.wgsl), an element each.

@compute @workgroup_size(256)
fn fill(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) groups: vec3<u32>) {
    let n = count();
    let value = pf(0u);
    let first = base(1u);
    for (var k = 0u; k < PER_INVOCATION; k = k + 1u) {
        let i = streaming(wid, lid, groups, k);
        if (i >= n) { return; }
        b1[first + i] = value;
    }
}

@compute @workgroup_size(256)
fn scale(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
         @builtin(num_workgroups) groups: vec3<u32>) {
    let n = count();
    let factor = pf(0u);
    let first = base(1u);
    for (var k = 0u; k < PER_INVOCATION; k = k + 1u) {
        let i = streaming(wid, lid, groups, k);
        if (i >= n) { return; }
        let at = first + i;
        b1[at] = b1[at] * factor;
    }
}

@compute @workgroup_size(256)
fn axpy(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) groups: vec3<u32>) {
    let n = count();
    let alpha = pf(0u);
    let first = base(1u);
    let x = base(2u);
    for (var k = 0u; k < PER_INVOCATION; k = k + 1u) {
        let i = streaming(wid, lid, groups, k);
        if (i >= n) { return; }
        let at = first + i;
        b1[at] = b1[at] + alpha * b2[x + i];
    }
}

// op 0: add, 1: mul, 2: f[0]·(a − b) (MSE backward).
@compute @workgroup_size(256)
fn binary(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
          @builtin(num_workgroups) groups: vec3<u32>) {
    let n = count();
    let code = op();
    let factor = pf(0u);
    let left = base(1u);
    let right = base(2u);
    let out_at = base(3u);
    for (var k = 0u; k < PER_INVOCATION; k = k + 1u) {
        let i = streaming(wid, lid, groups, k);
        if (i >= n) { return; }
        let a = b1[left + i];
        let b = b2[right + i];
        var out: f32;
        switch code {
            case 0u: { out = a + b; }
            case 1u: { out = a * b; }
            default: { out = factor * (a - b); }
        }
        b3[out_at + i] = out;
    }
}

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
