//! Gradients through the store: backward stages them under a serial (a
//! parameter used once written there by its kernel, a sum copied), a step
//! takes the latest without an upload, host-made gradients are accepted, a
//! missing one is named, and the readers' windows and answers.

use cistern_client::{
    AutodiffError, BackendError, ComputeClient, DeviceParamStore, Gradients, Tape, Tensor,
    WeightLayout,
};
use cistern_optim::{AdamConfig, SgdConfig};
use cistern_runtime::{Activation, Kernel};

use super::common::{Model, flat32, loss, model, ok, open, random, store, with_gradients};

#[test]
fn plain_tape_backward_on_a_graph_with_resident_linears_is_invalid_argument() {
    let client = open();
    let model = model(10);
    let mut store = store(&client, &model);
    let tape = Tape::new(&client);
    let leaves = ok(store.register_resident_params(&tape), "register");
    let loss = ok(loss(&store, &tape, &leaves, &model), "forward");
    assert!(matches!(
        tape.backward(&loss),
        Err(AutodiffError::InvalidArgument(_))
    ));
    ok(store.backward(&tape, &loss), "the store's backward");
}

#[test]
fn the_staged_gradients_are_the_tapes_gradients() {
    let client = open();
    let model = model(11);
    let mut store = store(&client, &model);
    let tape = Tape::new(&client);
    let leaves = ok(store.register_resident_params(&tape), "register");
    let loss = ok(loss(&store, &tape, &leaves, &model), "forward");
    let gradients = ok(store.backward(&tape, &loss), "backward");
    let staged = ok(store.resident_grads_to_host(), "staged");
    for (leaf, staged) in leaves.iter().zip(&staged) {
        let from_tape = ok(gradients.to_host(&leaf.var()), "the tape's gradient");
        assert_eq!(staged.as_ref(), from_tape.as_ref(), "slot {}", leaf.slot());
        assert!(staged.is_some());
    }
    let all = ok(store.param_grads_to_host(&gradients), "every gradient");
    let staged: Vec<Tensor<f32>> = staged.into_iter().flatten().collect();
    assert_eq!(all, staged);
}

#[test]
fn a_step_refuses_gradients_from_any_backward_but_the_latest() {
    let client = open();
    let model = model(12);
    let mut store = store(&client, &model);
    let tape = Tape::new(&client);
    let leaves = ok(store.register_resident_params(&tape), "register");
    let loss = ok(loss(&store, &tape, &leaves, &model), "forward");
    let older = ok(store.backward(&tape, &loss), "first backward");
    let latest = ok(store.backward(&tape, &loss), "second backward");
    let refused = store.step(&older, &SgdConfig::default());
    assert!(matches!(refused, Err(BackendError::InvalidArgument(_))));
    assert_eq!(store.steps(), 0);
    ok(store.step(&latest, &SgdConfig::default()), "the latest");
}

#[test]
fn a_step_takes_the_staged_gradients_without_an_upload() {
    let client = open();
    let model = model(13);
    let mut store = store(&client, &model);
    with_gradients(&client, &mut store, &model, |store, gradients| {
        let before = ok(client.server_stats(), "stats");
        ok(store.step(gradients, &SgdConfig::default()), "step");
        let after = ok(client.server_stats(), "stats");
        assert_eq!(after.writes, before.writes, "no upload");
        assert_eq!(after.reads, before.reads, "no download");
    });
}

#[test]
fn sync_to_host_returns_the_parameters_in_registration_order_in_one_download() {
    let client = open();
    let model = model(14);
    let store = store(&client, &model);
    let before = ok(client.server_stats(), "stats");
    let params = ok(store.sync_to_host(), "sync_to_host");
    let after = ok(client.server_stats(), "stats");
    assert_eq!(params, model.params);
    assert_eq!(after.reads, before.reads + 1);
}

#[test]
fn a_parameter_the_loss_does_not_reach_is_a_missing_gradient() {
    let client = open();
    let model = model(15);
    let mut store = store(&client, &model);
    let tape = Tape::new(&client);
    let leaves = ok(store.register_resident_params(&tape), "register");
    let x = ok(tape.upload(&model.x), "x");
    let h = ok(
        store.linear_forward(&tape, &x, &leaves[0], Some(&leaves[1])),
        "layer 1",
    );
    let loss = ok(tape.sum(&h), "loss");
    let gradients = ok(store.backward(&tape, &loss), "backward");
    let staged = ok(store.resident_grads_to_host(), "staged");
    let filled: Vec<bool> = staged.iter().map(Option::is_some).collect();
    assert_eq!(filled, [true, true, false, false]);
    let before = ok(store.sync_to_host(), "before");
    assert!(matches!(
        store.step(&gradients, &SgdConfig::default()),
        Err(BackendError::MissingGradient(_))
    ));
    assert!(matches!(
        store.param_grads_to_host(&gradients),
        Err(BackendError::MissingGradient(_))
    ));
    assert_eq!(ok(store.sync_to_host(), "unchanged"), before);
}

#[test]
fn gradients_from_host_are_accepted_and_step_like_staged_ones() {
    let client = open();
    let model = model(16);
    let (mut staged_store, mut host_store) = (store(&client, &model), store(&client, &model));
    let host_grads = with_gradients(&client, &mut staged_store, &model, |store, gradients| {
        let grads = ok(store.param_grads_to_host(gradients), "grads");
        ok(store.step(gradients, &SgdConfig::default()), "staged step");
        grads
    });
    let tape = Tape::new(&client);
    let leaves = ok(host_store.register_resident_params(&tape), "register");
    let pairs = leaves.iter().map(|leaf| leaf.var()).zip(host_grads.clone());
    let gradients = ok(Gradients::from_host(&tape, pairs), "from_host");
    assert_eq!(
        ok(host_store.param_grads_to_host(&gradients), "host grads"),
        host_grads
    );
    ok(
        host_store.step(&gradients, &SgdConfig::default()),
        "host step",
    );
    assert_eq!(
        flat32(&ok(host_store.sync_to_host(), "host")),
        flat32(&ok(staged_store.sync_to_host(), "staged"))
    );
}

#[test]
fn resident_grads_are_readable_only_between_backward_and_the_step() {
    let client = open();
    let model = model(17);
    let mut store = store(&client, &model);
    assert!(matches!(
        store.resident_grads_to_host(),
        Err(BackendError::InvalidArgument(_))
    ));
    let tape = Tape::new(&client);
    let leaves = ok(store.register_resident_params(&tape), "register");
    assert!(matches!(
        store.resident_grads_to_host(),
        Err(BackendError::InvalidArgument(_))
    ));
    let loss = ok(loss(&store, &tape, &leaves, &model), "forward");
    let gradients = ok(store.backward(&tape, &loss), "backward");
    ok(store.resident_grads_to_host(), "between backward and step");
    ok(store.step(&gradients, &SgdConfig::default()), "step");
    assert!(matches!(
        store.resident_grads_to_host(),
        Err(BackendError::InvalidArgument(_))
    ));
}

#[test]
fn param_grads_of_another_tape_are_tape_mismatch() {
    let client = open();
    let model = model(18);
    let mut store = store(&client, &model);
    let tape = Tape::new(&client);
    ok(store.register_resident_params(&tape), "register");
    let other = Tape::new(&client);
    let gradients = ok(Gradients::from_host(&other, []), "other tape's gradients");
    assert_eq!(
        store.param_grads_to_host(&gradients).map(|_| ()),
        Err(BackendError::TapeMismatch)
    );
    assert_eq!(
        store.step(&gradients, &SgdConfig::default()),
        Err(BackendError::TapeMismatch)
    );
    let none = ok(Gradients::from_host(&tape, []), "no gradients");
    assert!(matches!(
        store.param_grads_to_host(&none),
        Err(BackendError::MissingGradient(_))
    ));
}

#[test]
fn a_resident_parameter_is_not_readable_through_the_tape() {
    let client = open();
    let model = model(19);
    let mut store = store(&client, &model);
    let tape = Tape::new(&client);
    let leaves = ok(store.register_resident_params(&tape), "register");
    assert!(matches!(
        leaves[0].var().to_host(),
        Err(AutodiffError::InvalidArgument(_))
    ));
}

/// The gradients of `tanh(x·Wᵀ + b)` then `·Wᵀ + b` (with the parameter
/// indices of `layers`) and an MSE loss on a plain tape, `model`'s
/// parameters uploaded as tracked leaves: the reference for the store's.
fn plain_gradients(
    client: &cistern_client::ComputeClient,
    model: &Model,
    layers: [(usize, usize); 2],
) -> Vec<Tensor<f32>> {
    let tape = Tape::new(client);
    let vars: Vec<_> = model
        .params
        .iter()
        .map(|param| ok(tape.var(param), "a tracked leaf"))
        .collect();
    let mut h = ok(tape.upload(&model.x), "x");
    for ((weight, bias), activation) in layers
        .into_iter()
        .zip([Activation::Tanh, Activation::Identity])
    {
        h = ok(
            tape.linear_with_layout(
                &h,
                &vars[weight],
                Some(&vars[bias]),
                activation,
                WeightLayout::InOut,
            ),
            "a layer",
        );
    }
    let y = ok(tape.upload(&model.y), "y");
    let loss = ok(tape.mse_loss(&h, &y), "loss");
    let gradients = ok(tape.backward(&loss), "backward");
    vars.iter()
        .map(|var| ok(gradients.to_host(var), "gradient").expect("every leaf is reached"))
        .collect()
}

/// The copies among `tape`'s launches from the `from`th on.
fn copies_since(tape: &Tape, from: usize) -> usize {
    tape.launches()[from..]
        .iter()
        .filter(|launch| matches!(launch.kernel, Kernel::Identity | Kernel::Copy))
        .count()
}

/// Every staged gradient, in slot order.
fn staged(store: &DeviceParamStore) -> Vec<Tensor<f32>> {
    ok(store.resident_grads_to_host(), "staged")
        .into_iter()
        .flatten()
        .collect()
}

#[test]
fn a_parameter_used_once_gets_its_gradient_from_its_kernel_with_no_copy() {
    let client = open();
    let model = model(20);
    let mut store = store(&client, &model);
    let tape = Tape::new(&client);
    let leaves = ok(store.register_resident_params(&tape), "register");
    let loss = ok(loss(&store, &tape, &leaves, &model), "forward");
    let forward = tape.launches().len();
    ok(store.backward(&tape, &loss), "backward");
    assert_eq!(
        copies_since(&tape, forward),
        0,
        "the weights' and biases' gradients are not copied"
    );
    assert_eq!(
        staged(&store),
        plain_gradients(&client, &model, [(0, 1), (2, 3)])
    );
}

#[test]
fn a_parameter_used_twice_gets_the_sum_of_its_gradients_copied_into_staging() {
    let client = open();
    let mut rng = cistern_memory::SplitMix64::new(21);
    // pred = tanh(x·W + b)·W + b: W and b each have two uses.
    let model = Model {
        x: random(&mut rng, &[8, 4]),
        y: random(&mut rng, &[8, 4]),
        params: vec![random(&mut rng, &[4, 4]), random(&mut rng, &[4])],
    };
    let mut store = store(&client, &model);
    let tape = Tape::new(&client);
    let leaves = ok(store.register_resident_params(&tape), "register");
    let input = ok(tape.upload(&model.x), "x");
    let target = ok(tape.upload(&model.y), "y");
    let (weight, bias) = (&leaves[0], &leaves[1]);
    let h =
        store.linear_forward_with_activation(&tape, &input, weight, Some(bias), Activation::Tanh);
    let h = ok(h, "layer 1");
    let pred = ok(
        store.linear_forward(&tape, &h, weight, Some(bias)),
        "layer 2",
    );
    let loss = ok(tape.mse_loss(&pred, &target), "loss");
    let forward = tape.launches().len();
    ok(store.backward(&tape, &loss), "backward");
    assert_eq!(copies_since(&tape, forward), 2, "each sum is copied");
    assert_eq!(
        staged(&store),
        plain_gradients(&client, &model, [(0, 1), (0, 1)])
    );
}

#[test]
fn a_view_of_a_stored_parameter_is_read_through_the_store_only() {
    let client = open();
    let model = model(13);
    let mut store = store(&client, &model);
    let tape = Tape::new(&client);
    let leaves = ok(store.register_resident_params(&tape), "register");
    let weight = leaves[0].var();
    let flat = ok(tape.reshape(&weight, &[-1]), "a reshape");
    let rows = ok(tape.narrow(&weight, 0, 0, 1), "a narrow");
    for view in [flat, rows] {
        assert!(matches!(
            view.to_host(),
            Err(AutodiffError::InvalidArgument(_))
        ));
    }
}

/// Three Adam steps of `model`, each recorded on a tape that `tape_for`
/// gives: the parameters afterwards and the server's ordering waits.
fn three_steps(tape_for: impl Fn(&ComputeClient, &DeviceParamStore) -> Tape) -> (Vec<f32>, u64) {
    let client = open();
    let model = model(21);
    let mut store = store(&client, &model);
    let waits = ok(client.server_stats(), "server_stats").ordering_waits;
    for _ in 0..3 {
        let tape = tape_for(&client, &store);
        let leaves = ok(store.register_resident_params(&tape), "register");
        let loss = ok(loss(&store, &tape, &leaves, &model), "forward");
        let gradients = ok(store.backward(&tape, &loss), "backward");
        ok(store.step_adam(&gradients, &AdamConfig::default()), "step");
        ok(loss.item(), "loss");
    }
    let waits = ok(client.server_stats(), "server_stats").ordering_waits - waits;
    (flat32(&ok(store.sync_to_host(), "parameters")), waits)
}

#[test]
fn a_tape_on_the_stores_stream_trains_as_one_on_its_own_with_no_waits_between_streams() {
    // Whether two streams wait depends on what is still in flight, so only
    // the shared stream's count is certain: none.
    let (own, _) = three_steps(|client, _| Tape::new(client));
    let (shared, shared_waits) =
        three_steps(|client, store| Tape::on_stream(client, store.stream()));
    assert_eq!(shared, own, "the same parameters, bit for bit");
    assert_eq!(shared_waits, 0, "one stream runs in order");
}
