// AMP on device words, with no host synchronisation: unscaling by the scale
// the device holds, PyTorch's `_amp_update_scale_`, and the step count of a
// counted optimizer step. Counts (tracker, skipped, step count) are u32s
// stored in f32 words, read and written with bitcasts.

// 1 / s correctly rounded to f32 (what the CPU's `(1 / f64(s)) as f32` is:
// a reciprocal rounded to f64 then to f32 is rounded once, as 53 ≥ 2·24 + 2),
// by long division on the significand, so no shader division's 2.5 ulp.
fn reciprocal(s: f32) -> f32 {
    let bits = bitcast<u32>(s);
    let sign_bit = bits & 0x80000000u;
    let biased = (bits >> 23u) & 0xffu;
    var m = bits & 0x7fffffu;
    if (biased == 0xffu) {
        if (m != 0u) { return s; }
        return bitcast<f32>(sign_bit);
    }
    if (biased == 0u && m == 0u) { return bitcast<f32>(sign_bit | 0x7f800000u); }
    // s = m·2^(e − 23), m with 24 significant bits.
    var e = i32(biased) - 127;
    if (biased == 0u) {
        let shift = countLeadingZeros(m) - 8u;
        m = m << shift;
        e = -126 - i32(shift);
    } else {
        m = m | 0x800000u;
    }
    if (m == 0x800000u) {
        // 1/s = 2^−e exactly.
        let exponent = 127 - e;
        if (exponent >= 255) { return bitcast<f32>(sign_bit | 0x7f800000u); }
        if (exponent >= 1) { return bitcast<f32>(sign_bit | (u32(exponent) << 23u)); }
        return bitcast<f32>(sign_bit | (1u << u32(149 - e)));
    }
    // q = ⌊2^49 / m⌋ in [2^25, 2^26); 1/s = (2^49 / m)·2^(−e − 26).
    var q = 0u;
    var remainder = 1u << 24u;
    for (var i = 0u; i < 26u; i = i + 1u) {
        q = q << 1u;
        if (remainder >= m) {
            remainder = remainder - m;
            q = q | 1u;
        }
        remainder = remainder << 1u;
    }
    let sticky = remainder != 0u;
    // The result's biased exponent is 126 − e; at or below 0 it is subnormal
    // and loses one more bit per step below 1.
    let exponent = 126 - e;
    if (exponent >= 255) { return bitcast<f32>(sign_bit | 0x7f800000u); }
    var shift = 2u;
    if (exponent <= 0) { shift = u32(3 - exponent); }
    if (shift > 27u) { return bitcast<f32>(sign_bit); }
    let kept = q >> shift;
    let midpoint = 1u << (shift - 1u);
    let dropped = q & ((midpoint << 1u) - 1u);
    var rounded = kept;
    if (dropped > midpoint || (dropped == midpoint && (sticky || (kept & 1u) != 0u))) {
        rounded = kept + 1u;
    }
    if (exponent <= 0) { return bitcast<f32>(sign_bit | rounded); }
    // `rounded` carries the implicit bit, so a carry moves into the exponent.
    let word = (u32(exponent - 1) << 23u) + rounded;
    if (word >= 0x7f800000u) { return bitcast<f32>(sign_bit | 0x7f800000u); }
    return bitcast<f32>(sign_bit | word);
}

// grads (1) ← grads · (1 / scale) with the scale in binding 3; the flag
// (binding 2) becomes 1 on a non-finite gradient.
@compute @workgroup_size(256)
fn amp_unscale_by_device_scale(@builtin(workgroup_id) wid: vec3<u32>,
                               @builtin(local_invocation_id) lid: vec3<u32>,
                               @builtin(num_workgroups) groups: vec3<u32>) {
    let i = linear(wid, lid, groups);
    if (i >= count()) { return; }
    let inv_scale = reciprocal(b3[base(3u)]);
    let at = base(1u) + i;
    let g = b1[at];
    if (!is_finite(g)) { b2[base(2u)] = 1.0; }
    b1[at] = g * inv_scale;
}

// `_amp_update_scale_`: 1 the flag, 2 the scale, 3 the growth tracker, 4
// the skip count. f: growth, backoff (as f32), the largest |scale| whose
// growth is finite, the smallest whose backoff is normal (both decided on
// the host as the CPU decides them, so no device overflow or flush to zero
// changes a decision). u[8]: growth_interval.
@compute @workgroup_size(1)
fn amp_update_scale() {
    let scale = b2[base(2u)];
    let magnitude = abs(scale);
    if (b1[base(1u)] != 0.0) {
        if (magnitude >= pf(3u) && is_finite(scale)) { b2[base(2u)] = scale * pf(1u); }
        b3[base(3u)] = bitcast<f32>(0u);
        let skipped = bitcast<u32>(b4[base(4u)]);
        b4[base(4u)] = bitcast<f32>(skipped + select(1u, 0u, skipped == 0xffffffffu));
        return;
    }
    let tracker = bitcast<u32>(b3[base(3u)]);
    let successful = tracker + select(1u, 0u, tracker == 0xffffffffu);
    if (successful < pu(8u)) {
        b3[base(3u)] = bitcast<f32>(successful);
        return;
    }
    b3[base(3u)] = bitcast<f32>(0u);
    if (magnitude <= pf(2u)) { b2[base(2u)] = scale * pf(0u); }
}

// 1 − e^x for x ≤ 0, within a few ulp: by the series of −expm1 near 0
// (where 1 − exp(x) would cancel), from exp beyond.
fn one_minus_exp(x: f32) -> f32 {
    if (x < -0.5) { return 1.0 - exp(x); }
    var p = 1.0 / 3628800.0;
    p = 1.0 / 362880.0 + x * p;
    p = 1.0 / 40320.0 + x * p;
    p = 1.0 / 5040.0 + x * p;
    p = 1.0 / 720.0 + x * p;
    p = 1.0 / 120.0 + x * p;
    p = 1.0 / 24.0 + x * p;
    p = 1.0 / 6.0 + x * p;
    p = 0.5 + x * p;
    p = 1.0 + x * p;
    return -x * p;
}

// The first dispatch of a counted step (one invocation): 1 the flag, 2 the
// count, 3 the step's constants, which the step's dispatches read in
// place of the flag. A set flag (or a count at u32::MAX) writes 1 at
// constants[0] and leaves the count; otherwise constants[0] is 0, the count
// advances to t and constants[1..] are t's, per op(): 0 none, 1 SGD's
// first-step flag, 2 Adam's lr / (1 − β1^t) and 1/√(1 − β2^t) from f: lr,
// ln β1, ln β2; 3 Adagrad's lr / (1 + (t − 1)·lr_decay) from f: lr, lr_decay.
@compute @workgroup_size(1)
fn step_count() {
    let counted = bitcast<u32>(b2[base(2u)]);
    let constants = base(3u);
    if (b1[base(1u)] != 0.0 || counted == 0xffffffffu) {
        b3[constants] = 1.0;
        return;
    }
    let t = counted + 1u;
    b2[base(2u)] = bitcast<f32>(t);
    b3[constants] = 0.0;
    switch op() {
        case 1u: { b3[constants + 1u] = select(0.0, 1.0, t == 1u); }
        case 2u: {
            let steps = f32(t);
            b3[constants + 1u] = pf(0u) / one_minus_exp(steps * pf(1u));
            b3[constants + 2u] = inverseSqrt(one_minus_exp(steps * pf(2u)));
        }
        case 3u: { b3[constants + 1u] = pf(0u) / (1.0 + f32(t - 1u) * pf(1u)); }
        default: {}
    }
}
