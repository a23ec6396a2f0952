// What every optimizer step reads from binding 3: the found-inf flag (a
// zero placeholder without AMP), or a counted step's constants that
// `step_count` wrote (in amp.wgsl), [0] the skip and [1..] the per-step
// constants, read in place of the host's when op() has COUNTED.

const COUNTED: u32 = 256u;

fn skipped() -> bool {
    return b3[base(3u)] != 0.0;
}

// The per-step constant `k` of a counted step, else the host's `uniform`.
fn per_step(k: u32, uniform: f32) -> f32 {
    if ((op() & COUNTED) != 0u) { return b3[base(3u) + k]; }
    return uniform;
}
