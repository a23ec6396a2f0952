// Strided copy of 32-bit words: u[0] words in all, u[8] rank, u[9] words
// per element; table: shape, source strides, target strides (elements).
// b1 source, b2 target.

@compute @workgroup_size(256)
fn strided_copy(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
                @builtin(num_workgroups) groups: vec3<u32>) {
    let w = linear(wid, lid, groups);
    if (w >= count()) { return; }
    let rank = pu(8u);
    let words = pu(9u);
    var rest = w / words;
    var from_at = 0u;
    var to_at = 0u;
    for (var d = rank; d > 0u; d = d - 1u) {
        let n = table[d - 1u];
        let index = rest % n;
        rest = rest / n;
        from_at = from_at + index * table[rank + d - 1u];
        to_at = to_at + index * table[2u * rank + d - 1u];
    }
    let word = w % words;
    b2[base(2u) + to_at * words + word] = b1[base(1u) + from_at * words + word];
}
