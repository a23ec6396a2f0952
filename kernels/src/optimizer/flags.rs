//! The two small conversions every family's constants use: a leaf, so the
//! families and `scalars` (which packs their structs) import it, not each
//! other.

/// The gradient's sign: -1 where the step maximizes.
pub(super) fn sign(maximize: bool) -> f32 {
    if maximize { -1.0 } else { 1.0 }
}

/// `value` where `on`, else 0: one option bit.
pub(super) fn bit(on: bool, value: u32) -> u32 {
    if on { value } else { 0 }
}
