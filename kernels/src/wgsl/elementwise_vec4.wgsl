// The activations' `forward` and `backward` four elements per load, where
// every binding starts a multiple of 4 elements in and the run is a
// multiple of 4 long; the same arithmetic as elementwise.wgsl (which takes
// any other run, and the tail). Parameters as there; needs activation.wgsl.

@compute @workgroup_size(256)
fn forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
           @builtin(num_workgroups) groups: vec3<u32>) {
    let i = linear(wid, lid, groups);
    if (i >= count() / 4u) { return; }
    let code = op();
    let slope = pf(0u);
    let x = b1[base(1u) / 4u + i];
    b2[base(2u) / 4u + i] = vec4<f32>(activate(code, slope, x.x), activate(code, slope, x.y),
                                      activate(code, slope, x.z), activate(code, slope, x.w));
}

@compute @workgroup_size(256)
fn backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
            @builtin(num_workgroups) groups: vec3<u32>) {
    let i = linear(wid, lid, groups);
    if (i >= count() / 4u) { return; }
    let code = op();
    let slope = pf(0u);
    let x = b1[base(1u) / 4u + i];
    let g = b2[base(2u) / 4u + i];
    b3[base(3u) / 4u + i] = vec4<f32>(gradient(code, slope, x.x, g.x),
                                      gradient(code, slope, x.y, g.y),
                                      gradient(code, slope, x.z, g.z),
                                      gradient(code, slope, x.w, g.w));
}
