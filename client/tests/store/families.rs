//! Every optimizer family besides SGD through the store against the f64
//! reference over 20 steps; the one-family and frozen-hyper-parameter
//! guards; LAMB's refusal of non-finite values; a failed state allocation.

use cistern_client::{BackendError, ComputeClient, DeviceParamStore, Gradients, Tape, Tensor};
use cistern_optim::OptimizerConfig::{self, Adagrad, Adam, AdamW, Lamb, RmsProp};
use cistern_optim::{AdagradConfig, AdamConfig, AdamWConfig, LambConfig, RmsPropConfig, SgdConfig};
use cistern_runtime::DeviceOptions;

use super::common::{
    matches_the_reference_over_20_steps, model, ok, open, open_with, random, store, with_gradients,
};

fn each_matches_the_reference(configs: Vec<OptimizerConfig>) {
    for config in configs {
        matches_the_reference_over_20_steps(config);
    }
}

#[test]
fn adam_through_the_store_matches_the_reference_with_every_option() {
    each_matches_the_reference(vec![
        Adam(AdamConfig::default()),
        Adam(AdamConfig {
            weight_decay: 0.1,
            amsgrad: true,
            ..Default::default()
        }),
        Adam(AdamConfig {
            maximize: true,
            betas: (0.5, 0.9),
            eps: 1e-3,
            ..Default::default()
        }),
    ]);
}

#[test]
fn adamw_through_the_store_matches_the_reference_with_every_option() {
    each_matches_the_reference(vec![
        AdamW(AdamWConfig::default()),
        AdamW(AdamWConfig {
            amsgrad: true,
            maximize: true,
            weight_decay: 0.3,
            ..Default::default()
        }),
    ]);
}

#[test]
fn rmsprop_through_the_store_matches_the_reference_with_every_option() {
    let rmsprop = |config: RmsPropConfig| RmsProp(RmsPropConfig { lr: 1e-4, ..config });
    each_matches_the_reference(vec![
        rmsprop(RmsPropConfig::default()),
        rmsprop(RmsPropConfig {
            centered: true,
            momentum: 0.9,
            weight_decay: 0.01,
            ..Default::default()
        }),
        rmsprop(RmsPropConfig {
            centered: true,
            maximize: true,
            alpha: 0.9,
            ..Default::default()
        }),
    ]);
}

#[test]
fn adagrad_through_the_store_matches_the_reference_with_every_option() {
    each_matches_the_reference(vec![
        Adagrad(AdagradConfig {
            lr: 1e-3,
            ..Default::default()
        }),
        Adagrad(AdagradConfig {
            lr: 1e-3,
            lr_decay: 0.1,
            weight_decay: 0.05,
            initial_accumulator_value: 0.3,
            maximize: true,
            ..Default::default()
        }),
    ]);
}

#[test]
fn lamb_through_the_store_matches_the_reference_with_every_option() {
    each_matches_the_reference(vec![
        Lamb(LambConfig::default()),
        Lamb(LambConfig {
            bias_correction: false,
            grad_averaging: false,
            ..Default::default()
        }),
        Lamb(LambConfig {
            adam_w_mode: false,
            max_grad_norm: 0.5,
            weight_decay: 0.1,
            ..Default::default()
        }),
        Lamb(LambConfig {
            use_nvlamb: true,
            weight_decay: 0.0,
            max_grad_norm: 100.0,
            ..Default::default()
        }),
    ]);
}

#[test]
fn a_step_of_another_family_is_an_invalid_argument() {
    let client = open();
    let model = model(40);
    let mut store = store(&client, &model);
    with_gradients(&client, &mut store, &model, |store, gradients| {
        ok(store.step_adam(gradients, &AdamConfig::default()), "adam")
    });
    with_gradients(&client, &mut store, &model, |store, gradients| {
        let refused = store.step(gradients, &SgdConfig::default());
        match refused {
            Err(BackendError::InvalidArgument(message)) => assert!(message.contains("Adam")),
            other => panic!("another family is refused, got {other:?}"),
        }
        ok(
            store.step_adam(gradients, &AdamConfig::default()),
            "adam again",
        );
    });
    assert_eq!(store.steps(), 2);
}

#[test]
fn hyper_parameters_other_than_lr_are_fixed_by_the_first_step() {
    let client = open();
    let model = model(41);
    let mut store = store(&client, &model);
    with_gradients(&client, &mut store, &model, |store, gradients| {
        ok(store.step_adam(gradients, &AdamConfig::default()), "adam")
    });
    with_gradients(&client, &mut store, &model, |store, gradients| {
        let changed = AdamConfig {
            eps: 1e-6,
            ..AdamConfig::default()
        };
        match store.step_adam(gradients, &changed) {
            Err(BackendError::InvalidArgument(message)) => assert!(message.contains("`eps`")),
            other => panic!("a changed eps is refused, got {other:?}"),
        }
        let faster = AdamConfig {
            lr: 1e-2,
            ..AdamConfig::default()
        };
        ok(store.step_adam(gradients, &faster), "a new lr is allowed");
    });
}

/// Gradients of the pending forward on `tape`, from the host, with
/// `value` at the first element of the first slot.
fn host_gradients<'t>(
    tape: &'t Tape,
    store: &mut DeviceParamStore,
    model: &super::common::Model,
    value: f32,
) -> Gradients<'t> {
    let leaves = ok(store.register_resident_params(tape), "register");
    let mut rng = cistern_memory::SplitMix64::new(7);
    let pairs = leaves.iter().zip(&model.params).map(|(leaf, param)| {
        let mut gradient = random(&mut rng, param.shape()).into_data();
        if leaf.slot() == 0 {
            gradient[0] = value;
        }
        let gradient = ok(Tensor::new(param.shape(), gradient), "gradient");
        (leaf.var(), gradient)
    });
    ok(Gradients::from_host(tape, pairs), "from_host")
}

#[test]
fn lamb_refuses_non_finite_values_without_poisoning_and_keeps_the_pending_forward() {
    let client = open();
    let model = model(42);
    let mut store = store(&client, &model);
    let before = ok(store.sync_to_host(), "before");
    let tape = Tape::new(&client);
    let gradients = host_gradients(&tape, &mut store, &model, f32::NAN);
    let refused = store.step_lamb(&gradients, &LambConfig::default());
    assert!(
        matches!(refused, Err(BackendError::InvalidArgument(_))),
        "got {refused:?}"
    );
    assert!(!store.is_poisoned());
    assert_eq!(store.steps(), 0);
    ok(store.wait_device(), "the refusal is not a fault");
    assert_eq!(ok(store.sync_to_host(), "unchanged"), before);
    // The pending forward is back: a new registration is refused.
    assert_eq!(
        store.register_resident_params(&tape).map(|_| ()),
        Err(BackendError::PendingForwardUnconsumed)
    );
    assert_eq!(store.abandon_pending_forward(), Ok(true));
    let tape = Tape::new(&client);
    let gradients = host_gradients(&tape, &mut store, &model, 0.5);
    ok(
        store.step_lamb(&gradients, &LambConfig::default()),
        "a finite step",
    );
    assert_eq!(store.steps(), 1);
}

/// A device that holds the store and its tapes but not Adam's state, while
/// `ballast` is held.
fn tight_device() -> (ComputeClient, cistern_client::Buffer) {
    let client = open_with(DeviceOptions::with_memory_limit(32 << 20));
    let ballast = ok(client.reserve(16 << 20), "ballast");
    (client, ballast)
}

#[test]
fn a_failed_state_allocation_changes_nothing_and_the_step_can_be_retried() {
    let (client, ballast) = tight_device();
    let mut rng = cistern_memory::SplitMix64::new(43);
    let weight = random(&mut rng, &[1024, 1024]);
    let tape = Tape::new(&client);
    let mut store = ok(DeviceParamStore::new(&tape, &[&weight]), "a 4 MiB store");
    let before = ok(store.sync_to_host(), "before");
    let tape = Tape::new(&client);
    let leaves = ok(store.register_resident_params(&tape), "register");
    let x = ok(tape.upload(&random(&mut rng, &[2, 1024])), "x");
    let out = ok(store.linear_forward(&tape, &x, &leaves[0], None), "forward");
    let loss = ok(tape.sum(&out), "loss");
    let gradients = ok(store.backward(&tape, &loss), "backward");
    let refused = store.step_adam(&gradients, &AdamConfig::default());
    assert!(
        matches!(refused, Err(ref error) if error.may_succeed_after_reclaim()),
        "got {refused:?}"
    );
    assert!(!store.is_poisoned());
    assert_eq!(store.steps(), 0);
    assert_eq!(ok(store.sync_to_host(), "unchanged"), before);
    drop(ballast);
    ok(client.reclaim(), "reclaim");
    ok(
        store.step_adam(&gradients, &AdamConfig::default()),
        "the retried step",
    );
    assert_eq!(store.steps(), 1);
    assert_ne!(ok(store.sync_to_host(), "stepped"), before);
    let _ = loss;
}
