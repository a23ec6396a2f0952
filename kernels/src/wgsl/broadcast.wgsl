// Broadcast binary operations and strided sums; match
// kernels/src/broadcast.rs. One invocation per output element.
//
// broadcast_binary: u[7] op (0 add, 1 sub, 2 mul, 3 div), u[8] rank;
// table: shape, a's strides, b's strides. b1 a, b2 b, b3 out.
// strided_sum: u[8] rank, u[9] summed rank, u[10] summed elements; f[0]
// scale; table: shape, strides, summed dimensions, their strides. b1 x,
// b2 out.

// The offset of element i of the dimensions at table[dims..dims + rank]
// through the strides at table[strides..strides + rank].
fn offset_of(element: u32, rank: u32, dims: u32, strides: u32) -> u32 {
    var rest = element;
    var at = 0u;
    for (var d = rank; d > 0u; d = d - 1u) {
        let n = table[dims + d - 1u];
        at = at + (rest % n) * table[strides + d - 1u];
        rest = rest / n;
    }
    return at;
}

@compute @workgroup_size(256)
fn broadcast_binary(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
                    @builtin(num_workgroups) groups: vec3<u32>) {
    let i = linear(wid, lid, groups);
    if (i >= count()) { return; }
    let rank = pu(8u);
    let x = b1[base(1u) + offset_of(i, rank, 0u, rank)];
    let y = b2[base(2u) + offset_of(i, rank, 0u, 2u * rank)];
    var r: f32;
    switch (op()) {
        case 0u: { r = x + y; }
        case 1u: { r = x - y; }
        case 2u: { r = x * y; }
        default: { r = x / y; }
    }
    b3[base(3u) + i] = r;
}

@compute @workgroup_size(256)
fn strided_sum(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
               @builtin(num_workgroups) groups: vec3<u32>) {
    let i = linear(wid, lid, groups);
    if (i >= count()) { return; }
    let rank = pu(8u);
    let summed_rank = pu(9u);
    let summed = pu(10u);
    let at = base(1u) + offset_of(i, rank, 0u, rank);
    let inner = 2u * rank;
    var total = 0.0;
    for (var r = 0u; r < summed; r = r + 1u) {
        total = total + b1[at + offset_of(r, summed_rank, inner, inner + summed_rank)];
    }
    b2[base(2u) + i] = pf(0u) * total;
}
