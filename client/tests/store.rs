//! The parameter store through the public API: the order of its checks,
//! the pending forward, staged gradients and their readers, SGD against the
//! f64 reference, device faults and the poison latch, and memory.

mod store {
    mod amp;
    mod amp_device;
    mod chain;
    mod chain_classify;
    mod chain_step;
    mod checkpoint;
    mod checkpoint_file;
    mod checks;
    mod common;
    mod contracts;
    mod contracts_chain;
    mod dataset;
    mod families;
    mod faults;
    mod gradients;
    mod memory;
    mod pending;
    mod retiring;
    mod sgd;
    mod staged;
    mod step_graph;
}
