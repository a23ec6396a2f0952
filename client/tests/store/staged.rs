//! The staged gradients as a replica group uses them: read by range,
//! overwritten, and stepped from with no `Gradients` in hand.

use cistern_client::{BackendError, Tape};
use cistern_optim::{AdamConfig, GradScaler, GradScalerConfig, OptimizerConfig, SgdConfig};

use super::common::{flat32, loss, model, ok, open, store, with_gradients};

#[test]
fn slot_ranges_tile_the_store_in_registration_order() {
    let client = open();
    let model = model(1);
    let store = store(&client, &model);
    assert_eq!(store.slot_ranges(), vec![0..24, 24..30, 30..48, 48..51]);
    assert_eq!(store.numel(), 51);
}

#[test]
fn a_staged_range_reads_what_the_backward_staged() {
    let client = open();
    let model = model(2);
    let mut store = store(&client, &model);
    with_gradients(&client, &mut store, &model, |store, _| {
        let whole: Vec<f32> = ok(store.resident_grads_to_host(), "grads")
            .into_iter()
            .flatten()
            .flat_map(|tensor| tensor.into_data())
            .collect();
        assert_eq!(ok(store.read_staged(0..51), "all"), whole);
        assert_eq!(
            ok(store.read_staged(20..33), "part"),
            whole[20..33].to_vec()
        );
    });
}

#[test]
fn a_step_from_gradients_written_in_parts_equals_one_from_them_written_whole() {
    let client = open();
    let model = model(3);
    let config = OptimizerConfig::Adam(AdamConfig::default());
    let (mut plain, mut written) = (store(&client, &model), store(&client, &model));
    // Doubled gradients, written whole to one store and in two parts to the other.
    with_gradients(&client, &mut plain, &model, |store, _| {
        let doubled: Vec<f32> = ok(store.read_staged(0..51), "read")
            .iter()
            .map(|g| 2.0 * g)
            .collect();
        ok(store.write_staged(0, &doubled), "write whole");
        ok(store.step_staged(&config), "plain step");
    });
    let doubled: Vec<f32> = {
        let mut probe = store(&client, &model);
        with_gradients(&client, &mut probe, &model, |store, _| {
            ok(store.read_staged(0..51), "read")
                .iter()
                .map(|g| 2.0 * g)
                .collect()
        })
    };
    with_gradients(&client, &mut written, &model, |store, _| {
        ok(store.write_staged(0, &doubled[..30]), "first part");
        ok(store.write_staged(30, &doubled[30..]), "second part");
        ok(store.step_staged(&config), "written step");
    });
    let (a, b) = (
        ok(plain.sync_to_host(), "a"),
        ok(written.sync_to_host(), "b"),
    );
    assert_eq!(flat32(&a), flat32(&b));
    assert_ne!(
        flat32(&a),
        flat32(&model.params),
        "the step moved the parameters"
    );
    assert_eq!(written.steps(), 1);
}

#[test]
fn staged_bytes_read_as_the_floats_and_written_back_whole_or_ragged() {
    let client = open();
    let model = model(7);
    let mut store = store(&client, &model);
    with_gradients(&client, &mut store, &model, |store, _| {
        let floats = ok(store.read_staged(20..33), "floats");
        let bytes = ok(store.read_staged_bytes(20..33), "bytes");
        let native: Vec<u8> = floats.iter().flat_map(|f| f.to_ne_bytes()).collect();
        assert_eq!(bytes, native);
        let halved: Vec<u8> = floats
            .iter()
            .flat_map(|f| (0.5 * f).to_ne_bytes())
            .collect();
        ok(store.write_staged_bytes(20, &halved.into()), "halved");
        let read = ok(store.read_staged(20..33), "after");
        assert_eq!(read, floats.iter().map(|f| 0.5 * f).collect::<Vec<_>>());
        match store.write_staged_bytes(0, &vec![0u8; 6].into()) {
            Err(BackendError::InvalidArgument(why)) => assert!(why.contains("6 bytes"), "{why}"),
            other => panic!("a ragged write was taken: {other:?}"),
        }
        assert!(!store.is_poisoned());
    });
}

#[test]
fn staged_reads_writes_and_steps_are_refused_outside_a_backward_changing_nothing() {
    let client = open();
    let model = model(4);
    let mut store = store(&client, &model);
    let sgd = OptimizerConfig::Sgd(SgdConfig::default());
    let refused = |result: Result<(), BackendError>| {
        assert!(
            matches!(&result, Err(BackendError::InvalidArgument(why)) if why.contains("backward")),
            "{result:?}"
        );
    };
    refused(store.read_staged(0..1).map(|_| ()));
    refused(store.write_staged(0, &[1.0]));
    refused(store.step_staged(&sgd));
    let tape = Tape::new(&client);
    let leaves = ok(store.register_resident_params(&tape), "register");
    let _ = ok(loss(&store, &tape, &leaves, &model), "forward");
    refused(store.step_staged(&sgd));
    assert!(!store.is_poisoned());
    assert_eq!(store.steps(), 0);
}

#[test]
fn a_staged_range_past_the_end_is_refused_naming_the_size() {
    let client = open();
    let model = model(5);
    let mut store = store(&client, &model);
    with_gradients(&client, &mut store, &model, |store, _| {
        let before = ok(store.read_staged(0..51), "before");
        match store.write_staged(50, &[1.0, 2.0]) {
            Err(BackendError::InvalidArgument(why)) => assert!(why.contains("51 floats"), "{why}"),
            other => panic!("written past the end: {other:?}"),
        }
        assert!(store.read_staged(10..52).is_err());
        assert_eq!(ok(store.read_staged(0..51), "after"), before);
    });
}

#[test]
fn an_amp_step_from_staged_gradients_skips_a_non_finite_one_and_refuses_other_families() {
    let client = open();
    let model = model(6);
    let mut store = store(&client, &model);
    let mut scaler = ok(GradScaler::new(GradScalerConfig::default()), "scaler");
    let scale = scaler.scale();
    with_gradients(&client, &mut store, &model, |store, _| {
        let lamb = OptimizerConfig::Lamb(Default::default());
        assert!(store.step_staged_amp(&lamb, &mut scaler).is_err());
        ok(store.write_staged(7, &[f32::INFINITY]), "an overflow");
        let skipped = ok(
            store.step_staged_amp(&OptimizerConfig::Sgd(SgdConfig::default()), &mut scaler),
            "amp step",
        );
        assert!(skipped);
    });
    assert_eq!(
        flat32(&ok(store.sync_to_host(), "params")),
        flat32(&model.params)
    );
    assert_eq!(scaler.scale(), scale * 0.5, "the scaler backed off");
    assert_eq!(store.steps(), 0);
}
