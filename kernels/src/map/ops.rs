// The element-wise kernels, one definition each: its name, its inputs, its
// scalars, where it writes, and its value as one expression. The CPU body,
// the WGSL entry points (scalar and vec4) and the CUDA kernel are made from
// the definition (`map/mod.rs`, `map/table.rs`); nothing else names them.
//
// The expression is read as Rust, WGSL and CUDA C alike, so it may use only
// `+ - * /`, parentheses, its inputs and scalars, and the functions of
// `map/vocabulary.rs`; no literals (a constant is a scalar). `new` writes a
// binding of its own after the inputs; `in_place` writes the first input.
// New definitions go last: launches name them by position when serialized.

map_ops! {
    /// `x ← value` over the one binding.
    Fill => "fill" () [value] new: value;
    /// `x ← factor·x`, in place.
    Scale => "scale" (x) [factor] in_place: factor * x;
    /// In-place axpy, `a ← a + alpha·c`.
    Axpy => "axpy" (a, c) [alpha] in_place: a + alpha * c;
    /// `out ← a + b`.
    Add => "add" (a, b) [] new: a + b;
    /// `out ← a ⊙ b`.
    Mul => "mul" (a, b) [] new: a * b;
    /// `grad ← factor·(pred − expected)`: MSE's backward, `factor` being
    /// `2·grad_output / n` (rounded once from f64 by the launch).
    MseLossBackward => "mse_loss_backward" (pred, expected) [factor] new: factor * (pred - expected);
    /// PyTorch's `binary_cross_entropy_with_logits` per element, before
    /// reduction: `w·[(1 − y)·softplus(x) + pw·y·softplus(−x)]` (PyTorch's
    /// `(1 − y)·x + (1 + (pw − 1)·y)·softplus(−x)` rearranged so that no
    /// terms cancel for targets in [0, 1]), with `softplus(±x) = max(±x, 0)
    /// + log(1 + exp(−|x|))`, the max written `|x|/2 ± x/2` (finite for any
    /// finite `x`); `one` and `half` are 1 and ½.
    BceWithLogits => "bce_with_logits" (x, y, pos_weight, weight) [one, half] new: weight * ((one - y) * (abs(x) * half + x * half + log(one + exp(-abs(x)))) + pos_weight * y * (abs(x) * half - x * half + log(one + exp(-abs(x)))));
    /// Its gradient with respect to `x`: `factor·w·[(1 − y)·σ(x) −
    /// pw·y·σ(−x)]` (PyTorch's `(1 − y) − (1 + (pw − 1)·y)·σ(−x)`
    /// rearranged), `factor` the upstream gradient (over `n` for a mean).
    BceWithLogitsBackward => "bce_with_logits_backward" (x, y, pos_weight, weight) [factor, one] new: factor * weight * ((one - y) / (one + exp(-x)) - pos_weight * y / (one + exp(x)));
    /// `out ← a − b`.
    Sub => "sub" (a, b) [] new: a - b;
    /// `out ← a / b`.
    Div => "div" (a, b) [] new: a / b;
}
