//! The training tape through the public API: every operation's gradient
//! against finite differences, an MLP against a host reference, the error
//! cases, host synchronisations, memory, and device faults.

mod tape {
    mod classify;
    mod common;
    mod errors;
    mod faults;
    mod gradcheck;
    mod host;
    mod memory;
    mod mlp;
    mod pytorch;
    mod pytorch_ops;
    mod syncs;
}
