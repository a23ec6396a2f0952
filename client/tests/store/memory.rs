//! The store's buffers come from the pools and go back when it drops.

use cistern_optim::SgdConfig;

use super::common::{model, ok, open, store, with_gradients};

#[test]
fn the_stores_memory_returns_to_the_pools_when_it_drops() {
    let client = open();
    let model = model(20);
    let before = ok(client.memory_stats(), "memory_stats");
    {
        let mut store = store(&client, &model);
        let momentum = SgdConfig {
            momentum: 0.9,
            ..SgdConfig::default()
        };
        for _ in 0..3 {
            with_gradients(&client, &mut store, &model, |store, gradients| {
                ok(store.step(gradients, &momentum), "step")
            });
        }
        ok(store.wait_device(), "the steps ran");
        let during = ok(client.memory_stats(), "memory_stats");
        // Parameters, staging and the momentum buffer.
        assert_eq!(during.live_allocations, before.live_allocations + 3);
    }
    let after = ok(client.memory_stats(), "memory_stats");
    assert_eq!(after.live_allocations, before.live_allocations);
    assert_eq!(after.in_use_bytes, before.in_use_bytes);
}
