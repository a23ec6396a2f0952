//! Device chains for inference: `predict_device_chain`, the resident input
//! and their refusals.

use cistern_client::{BackendError, ChainLayer, DeviceParamStore, ResidentLeaf, Tape, Tensor};
use cistern_runtime::Activation;

use super::common::{loss, model, ok, open, store};

/// The two-layer model as a chain of `leaves`.
pub fn chain<'t>(leaves: &[ResidentLeaf<'t>]) -> Vec<ChainLayer<'t>> {
    vec![
        (leaves[0].clone(), Some(leaves[1].clone()), Activation::Tanh),
        (
            leaves[2].clone(),
            Some(leaves[3].clone()),
            Activation::Identity,
        ),
    ]
}

#[test]
fn predicting_through_the_device_chain_equals_the_tape_forward() {
    let client = open();
    let model = model(0xC1);
    let store = store(&client, &model);
    let tape = Tape::new(&client);
    let leaves = ok(store.snapshot_resident_params(&tape), "snapshot");
    let got = ok(
        store.predict_device_chain(&chain(&leaves), &model.x),
        "predict",
    );
    let x = ok(tape.upload(&model.x), "x");
    let (w1, b1, w2, b2) = (&leaves[0], &leaves[1], &leaves[2], &leaves[3]);
    let h = ok(
        store.linear_forward_with_activation(&tape, &x, w1, Some(b1), Activation::Tanh),
        "h",
    );
    let want = ok(store.linear_forward(&tape, &h, w2, Some(b2)), "pred");
    assert_eq!(got, ok(want.to_host(), "the tape's prediction"));
}

#[test]
fn a_square_weight_is_read_in_out_by_the_store_and_out_in_by_the_tapes_linear() {
    let client = open();
    // W = [[1, 2], [3, 4]]: `[in, out]` maps x = [1, 0] to W's first row,
    // `[out, in]` (PyTorch's) to its first column.
    let weight = ok(Tensor::new([2, 2], vec![1.0, 2.0, 3.0, 4.0]), "W");
    let tape = Tape::new(&client);
    let store = ok(DeviceParamStore::new(&tape, &[&weight]), "the store");
    let leaves = ok(store.snapshot_resident_params(&tape), "snapshot");
    let x = ok(Tensor::new([1, 2], vec![1.0, 0.0]), "x");
    let chain: Vec<ChainLayer<'_>> = vec![(leaves[0].clone(), None, Activation::Identity)];
    let predicted = ok(store.predict_device_chain(&chain, &x), "predict");
    assert_eq!(predicted.data(), &[1.0, 2.0], "the chain reads [in, out]");
    let input = ok(tape.upload(&x), "x");
    let forward = ok(
        store.linear_forward(&tape, &input, &leaves[0], None),
        "forward",
    );
    assert_eq!(ok(forward.to_host(), "forward").data(), &[1.0, 2.0]);
    let plain = ok(tape.var(&weight), "W as a plain leaf");
    let torch = ok(
        tape.linear(&input, &plain, None, Activation::Identity),
        "linear",
    );
    assert_eq!(
        ok(torch.to_host(), "linear").data(),
        &[1.0, 3.0],
        "PyTorch's"
    );
}

#[test]
fn a_resident_input_round_trips_and_predicts_without_an_upload() {
    let client = open();
    let model = model(0xC2);
    let store = store(&client, &model);
    let tape = Tape::new(&client);
    let leaves = ok(store.snapshot_resident_params(&tape), "snapshot");
    let input = ok(store.upload_resident_input(&model.x), "upload");
    assert_eq!(
        ok(store.download_resident_input(&input), "download"),
        model.x
    );
    let before = ok(client.server_stats(), "stats");
    let got = ok(
        store.predict_device_chain_resident(&chain(&leaves), &input),
        "predict",
    );
    let after = ok(client.server_stats(), "stats");
    assert_eq!(after.writes, before.writes, "no upload");
    assert_eq!(after.reads - before.reads, 1, "one download");
    assert_eq!(
        got,
        ok(
            store.predict_device_chain(&chain(&leaves), &model.x),
            "predict"
        )
    );
}

#[test]
fn a_resident_input_of_another_store_or_device_or_shape_is_refused() {
    let client = open();
    let model = model(0xC3);
    let store = store(&client, &model);
    let other = super::common::store(&client, &model);
    let elsewhere_client = open();
    let elsewhere = super::common::store(&elsewhere_client, &model);
    let tape = Tape::new(&client);
    let leaves = ok(store.snapshot_resident_params(&tape), "snapshot");
    let chain = chain(&leaves);
    let foreign = ok(other.upload_resident_input(&model.x), "upload");
    assert!(matches!(
        store.predict_device_chain_resident(&chain, &foreign),
        Err(BackendError::InvalidArgument(_))
    ));
    let remote = ok(elsewhere.upload_resident_input(&model.x), "upload");
    assert_eq!(
        store
            .predict_device_chain_resident(&chain, &remote)
            .map(|_| ()),
        Err(BackendError::DeviceMismatch)
    );
    let flat = ok(Tensor::new(vec![32], model.x.data().to_vec()), "flat");
    assert!(matches!(
        store.upload_resident_input(&flat),
        Err(BackendError::InvalidArgument(_))
    ));
    let narrow = ok(Tensor::new(vec![16, 2], model.x.data().to_vec()), "narrow");
    let narrow = ok(store.upload_resident_input(&narrow), "upload");
    assert!(matches!(
        store.predict_device_chain_resident(&chain, &narrow),
        Err(BackendError::ShapeMismatch(_))
    ));
}

#[test]
fn a_chain_is_refused_while_a_forward_is_pending() {
    let client = open();
    let model = model(0xC4);
    let mut store = store(&client, &model);
    let tape = Tape::new(&client);
    let leaves = ok(store.register_resident_params(&tape), "register");
    assert_eq!(
        store
            .predict_device_chain(&chain(&leaves), &model.x)
            .map(|_| ()),
        Err(BackendError::PendingForwardUnconsumed)
    );
    let _ = loss(&store, &tape, &leaves, &model);
}

#[test]
fn a_chain_of_another_stores_leaves_is_refused() {
    let client = open();
    let model = model(0xC5);
    let store = store(&client, &model);
    let other = super::common::store(&client, &model);
    let tape = Tape::new(&client);
    let leaves = ok(other.snapshot_resident_params(&tape), "snapshot");
    assert!(matches!(
        store.predict_device_chain(&chain(&leaves), &model.x),
        Err(BackendError::InvalidArgument(_))
    ));
}

#[test]
fn a_prediction_waits_out_another_clients_capture_and_answers_as_without_it() {
    let client = open();
    let model = model(0xC7);
    let store = store(&client, &model);
    let tape = Tape::new(&client);
    let leaves = ok(store.snapshot_resident_params(&tape), "snapshot");
    let want = ok(
        store.predict_device_chain(&chain(&leaves), &model.x),
        "predict",
    );
    let resident = ok(store.upload_resident_input(&model.x), "upload");
    for resident_input in [false, true] {
        let other = client.clone();
        let stream = ok(other.create_stream(), "a stream");
        let (_token, guard) = ok(other.begin_capture(stream), "capture");
        let ender = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(30));
            ok(other.end_capture(guard), "the capture ends");
        });
        let got = if resident_input {
            store.predict_device_chain_resident(&chain(&leaves), &resident)
        } else {
            store.predict_device_chain(&chain(&leaves), &model.x)
        };
        ok(ender.join().map_err(|_| "the ender panicked"), "join");
        assert_eq!(
            ok(got, "the waited prediction"),
            want,
            "resident {resident_input}"
        );
    }
    assert!(!store.is_poisoned());
}
