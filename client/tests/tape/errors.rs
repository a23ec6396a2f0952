//! What a tape refuses, and the gradients it does not have: `Ok(None)`,
//! `GradientTrackingDisabled`, accumulation, tape mismatch, every shape
//! error, and non-scalar losses; the AMP loss scale.

use cistern_client::{AutodiffError, ShapeError, Tape, Tensor};
use cistern_runtime::Activation;

use super::common::{ok, open};

fn t(shape: &[usize], data: &[f32]) -> Tensor<f32> {
    ok(Tensor::new(shape, data.to_vec()), "tensor")
}

fn ones(shape: &[usize]) -> Tensor<f32> {
    ok(Tensor::full(shape, 1.0), "tensor")
}

#[test]
fn a_tracked_var_the_loss_does_not_reach_has_no_gradient() {
    let client = open();
    let tape = Tape::new(&client);
    let used = ok(tape.var(&ones(&[3])), "var");
    let unused = ok(tape.var(&ones(&[3])), "var");
    let side = ok(tape.scale(&unused, 2.0), "scale");
    let loss = ok(tape.sum(&used), "sum");
    let gradients = ok(tape.backward(&loss), "backward");
    assert!(ok(gradients.get(&unused), "get").is_none());
    assert!(ok(gradients.get(&side), "get").is_none());
    let later = ok(tape.var(&ones(&[3])), "var");
    assert!(ok(gradients.get(&later), "get").is_none());
    assert_eq!(
        ok(gradients.to_host(&used), "to_host").map(Tensor::into_data),
        Some(vec![1.0; 3])
    );
}

#[test]
fn untracked_values_refuse_their_gradients() {
    let client = open();
    let tape = Tape::new(&client);
    let w = ok(tape.var(&ones(&[3])), "var");
    let constant = ok(tape.var_no_grad(&ones(&[3])), "var_no_grad");
    let input = ok(tape.upload(&ones(&[3])), "upload");
    let detached = w.detach();
    let derived = ok(tape.mul(&constant, &input), "mul");
    assert!(w.is_tracked() && !detached.is_tracked() && !derived.is_tracked());
    let all = ok(
        tape.add(&ok(tape.mul(&w, &derived), "mul"), &detached),
        "add",
    );
    let loss = ok(tape.sum(&all), "sum");
    let gradients = ok(tape.backward(&loss), "backward");
    for var in [constant, input, detached, derived] {
        assert_eq!(
            gradients.get(&var).err(),
            Some(AutodiffError::GradientTrackingDisabled)
        );
    }
    assert!(ok(gradients.get(&w), "get").is_some());
    let untracked_loss = ok(tape.sum(&derived), "sum");
    assert_eq!(
        tape.backward(&untracked_loss).err(),
        Some(AutodiffError::GradientTrackingDisabled)
    );
}

#[test]
fn the_gradients_of_a_value_used_twice_accumulate() {
    let client = open();
    let tape = Tape::new(&client);
    let a = ok(tape.var(&t(&[3], &[1.0, -2.0, 3.0])), "var");
    // loss = Σ (a ⊙ a) + Σ (a + a) + mean(a): ∂a = 2a + 2 + 1/3.
    let squares = ok(tape.sum(&ok(tape.mul(&a, &a), "mul")), "sum");
    let doubled = ok(tape.sum(&ok(tape.add(&a, &a), "add")), "sum");
    let mean = ok(tape.mean(&a), "mean");
    let loss = ok(
        tape.add(&ok(tape.add(&squares, &doubled), "add"), &mean),
        "add",
    );
    let gradients = ok(tape.backward(&loss), "backward");
    let Some(gradient) = ok(gradients.to_host(&a), "to_host") else {
        panic!("a has a gradient");
    };
    let expected = [1.0f32, -2.0, 3.0].map(|a| 2.0 * a + 2.0 + 1.0 / 3.0);
    for (got, expected) in gradient.data().iter().zip(expected) {
        assert!((got - expected).abs() < 1e-6, "{got} vs {expected}");
    }
    let value = ok(loss.item(), "loss");
    assert!(
        (value - (14.0 + 4.0 + 2.0 / 3.0)).abs() < 1e-5,
        "loss {value}"
    );
}

#[test]
fn a_var_of_another_tape_is_a_tape_mismatch_everywhere() {
    let client = open();
    let (tape, other) = (Tape::new(&client), Tape::new(&client));
    assert_ne!(tape.id(), other.id());
    let a = ok(tape.var(&ones(&[2, 2])), "var");
    let foreign = ok(other.var(&ones(&[2, 2])), "var");
    let mismatch = Some(AutodiffError::TapeMismatch);
    assert_eq!(tape.add(&a, &foreign).err(), mismatch);
    assert_eq!(tape.matmul(&foreign, &a).err(), mismatch);
    assert_eq!(tape.sum(&foreign).err(), mismatch);
    assert_eq!(
        tape.backward(&ok(other.sum(&foreign), "sum")).err(),
        mismatch
    );
    let gradients = ok(tape.backward(&ok(tape.sum(&a), "sum")), "backward");
    assert_eq!(gradients.get(&foreign).err(), mismatch);
    let from_host = cistern_client::Gradients::from_host(&tape, [(foreign, ones(&[2, 2]))]);
    assert_eq!(from_host.err(), mismatch);
    assert_eq!(
        AutodiffError::TapeMismatch.code(),
        cistern_client::ErrorCode::InvalidArgument
    );
}

#[test]
fn every_shape_that_does_not_fit_is_a_shape_error() {
    let client = open();
    let tape = Tape::new(&client);
    let var = |shape: &[usize]| ok(tape.var(&ones(shape)), "var");
    let (m23, m34, m24, v3, v4) = (
        var(&[2, 3]),
        var(&[3, 4]),
        var(&[2, 4]),
        var(&[3]),
        var(&[4]),
    );
    let shape = |error| Some(AutodiffError::ShapeMismatch(error));
    let rank = |actual| {
        shape(ShapeError::RankMismatch {
            expected: 2,
            actual,
        })
    };
    let dimension = |axis, expected, actual| {
        shape(ShapeError::DimensionMismatch {
            axis,
            expected,
            actual,
        })
    };
    assert_eq!(tape.matmul(&v3, &m34).err(), rank(1));
    assert_eq!(tape.matmul(&m23, &v3).err(), rank(1));
    assert_eq!(tape.matmul(&m23, &m24).err(), dimension(0, 3, 2));
    let identity = Activation::Identity;
    assert_eq!(tape.linear(&v3, &m23, None, identity).err(), rank(1));
    assert_eq!(tape.linear(&m23, &v3, None, identity).err(), rank(1));
    // weight is out×in: a 2×3 input needs a k×3 weight.
    assert_eq!(
        tape.linear(&m23, &m34, None, identity).err(),
        dimension(1, 3, 4)
    );
    assert_eq!(
        tape.linear(&m23, &m23, Some(&v3), identity).err(),
        dimension(0, 2, 3)
    );
    assert_eq!(
        tape.linear(&m23, &m23, Some(&m23), identity).err(),
        shape(ShapeError::RankMismatch {
            expected: 1,
            actual: 2
        })
    );
    // Element-wise operations broadcast (a row over a matrix's rows); shapes
    // that do not are an invalid argument naming both.
    for refused in [tape.add(&m23, &m24).err(), tape.mul(&v3, &v4).err()] {
        let Some(AutodiffError::InvalidArgument(message)) = refused else {
            panic!("not broadcastable: {refused:?}");
        };
        assert!(message.contains("do not broadcast"), "{message}");
    }
    assert_eq!(
        ok(tape.add(&m23, &v3), "a row over a matrix").shape(),
        [2, 3]
    );
    assert_eq!(tape.mse_loss(&m23, &m24).err(), dimension(1, 3, 4));
    assert_eq!(
        Tensor::new([2, 2], vec![0.0f32; 3]).err(),
        Some(ShapeError::ElementCountMismatch {
            expected: 4,
            actual: 3
        })
    );
    let gradient = cistern_client::Gradients::from_host(&tape, [(m23, ones(&[3, 2]))]);
    assert_eq!(gradient.err(), dimension(0, 2, 3));
    let buffer = ok(client.upload_f32(&[0.0; 5]), "upload");
    assert_eq!(
        tape.var_resident(&buffer, &[2, 3]).err(),
        shape(ShapeError::ElementCountMismatch {
            expected: 6,
            actual: 5
        })
    );
}

#[test]
fn a_loss_that_is_not_a_scalar_is_an_invalid_argument() {
    let client = open();
    let tape = Tape::new(&client);
    let a = ok(tape.var(&ones(&[2, 2])), "var");
    assert!(matches!(
        tape.backward(&a),
        Err(AutodiffError::InvalidArgument(_))
    ));
    assert!(matches!(a.item(), Err(AutodiffError::InvalidArgument(_))));
    let one = ok(tape.var(&ones(&[1, 1])), "var");
    assert!(
        tape.backward(&one).is_ok(),
        "one element in any shape is a scalar"
    );
    let empty = ok(Tensor::new([0, 3], Vec::new()), "empty tensor");
    assert!(matches!(
        tape.var(&empty),
        Err(AutodiffError::InvalidArgument(_))
    ));
}

#[test]
fn gradients_from_the_host_are_answered_like_a_backwards() {
    let client = open();
    let tape = Tape::new(&client);
    let w = ok(tape.var(&ones(&[2])), "var");
    let other = ok(tape.var(&ones(&[2])), "var");
    let constant = ok(tape.upload(&ones(&[2])), "upload");
    let gradients = ok(
        cistern_client::Gradients::from_host(&tape, [(w, t(&[2], &[0.5, -1.0]))]),
        "from_host",
    );
    assert_eq!(
        ok(gradients.to_host(&w), "to_host").map(Tensor::into_data),
        Some(vec![0.5, -1.0])
    );
    assert!(ok(gradients.get(&other), "get").is_none());
    assert_eq!(
        gradients.get(&constant).err(),
        Some(AutodiffError::GradientTrackingDisabled)
    );
    let refused = cistern_client::Gradients::from_host(&tape, [(constant, ones(&[2]))]);
    assert_eq!(refused.err(), Some(AutodiffError::GradientTrackingDisabled));
}

#[test]
fn a_resident_leaf_uses_the_buffer_it_is_given() {
    let client = open();
    let buffer = ok(client.upload_f32(&[1.0, 2.0, 3.0, 4.0]), "upload");
    let tape = Tape::new(&client);
    let w = ok(tape.var_resident(&buffer, &[2, 2]), "var_resident");
    let loss = ok(tape.sum(&ok(tape.mul(&w, &w), "mul")), "sum");
    assert_eq!(ok(loss.item(), "loss"), 30.0);
    let gradients = ok(tape.backward(&loss), "backward");
    assert_eq!(
        ok(gradients.to_host(&w), "to_host").map(Tensor::into_data),
        Some(vec![2.0, 4.0, 6.0, 8.0])
    );
}

#[test]
fn a_loss_scaled_for_amp_carries_the_scalers_scale_into_every_gradient() {
    let client = open();
    let tape = Tape::new(&client);
    let x = ok(tape.var(&t(&[3], &[1.0, -2.0, 0.5])), "var");
    let loss = ok(tape.sum(&ok(tape.mul(&x, &x), "mul")), "sum");
    let scaler = ok(
        cistern_optim::GradScaler::new(cistern_optim::GradScalerConfig::default()),
        "scaler",
    );
    let scaled = ok(tape.scale_loss(&loss, &scaler), "scale_loss");
    let value = ok(scaled.to_host(), "value").into_data();
    assert_eq!(value, vec![5.25 * scaler.scale()]);
    let gradients = ok(tape.backward(&scaled), "backward");
    let grad = ok(gradients.to_host(&x), "to_host").map(Tensor::into_data);
    let want: Vec<f32> = [2.0, -4.0, 1.0]
        .iter()
        .map(|g| g * scaler.scale())
        .collect();
    assert_eq!(grad, Some(want));
}

#[test]
fn views_and_reductions_refuse_dimensions_that_do_not_fit_naming_them() {
    let client = open();
    let tape = Tape::new(&client);
    let x = ok(tape.var(&ok(Tensor::full([2, 3, 4], 1.0f32), "x")), "x");
    let deep = ok(tape.var(&ok(Tensor::full([1; 7], 1.0f32), "deep")), "deep");
    let refusals = [
        (tape.sum_dim(&x, &[3], false).err(), "out of range"),
        (tape.sum_dim(&x, &[-4], true).err(), "out of range"),
        (tape.mean_dim(&x, &[1, -2], false).err(), "named twice"),
        (tape.sum_dim(&x, &[], false).err(), "at least one"),
        (tape.permute(&x, &[0, 1]).err(), "name each once"),
        (tape.transpose(&x, 0, 5).err(), "out of range"),
        (tape.reshape(&x, &[5, -1]).err(), "[2, 3, 4]"),
        (tape.reshape(&x, &[-1, -1]).err(), "only one"),
        (
            tape.narrow(&x, 1, 2, 2).err(),
            "2 elements from 2 of dimension 1",
        ),
        (tape.narrow(&x, 0, 0, 0).err(), "0 elements"),
        (tape.split(&x, 0, 0).err(), "split_size of 0"),
        (
            tape.cat(&[&x, &deep], 0).err(),
            "differ outside dimension 0",
        ),
        (tape.cat(&[], 0).err(), "no inputs"),
        (tape.sum_dim(&deep, &[0], false).err(), "at most 6"),
        (tape.add(&deep, &x).err(), "at most 6"),
    ];
    for (refused, says) in refusals {
        let Some(AutodiffError::InvalidArgument(message)) = refused else {
            panic!("expected an invalid argument saying {says:?}: {refused:?}");
        };
        assert!(message.contains(says), "{message:?} should say {says:?}");
    }
    assert_eq!(ok(tape.add(&deep, &deep), "equal shapes").shape(), [1; 7]);
}

#[test]
fn layer_norm_and_embedding_refuse_shapes_and_indices_that_do_not_fit_naming_them() {
    let client = open();
    let tape = Tape::new(&client);
    let x = ok(tape.var(&ok(Tensor::full([2, 3, 4], 1.0f32), "x")), "x");
    let w3 = ok(tape.var(&ok(Tensor::full([3], 1.0f32), "w3")), "w3");
    let w4 = ok(tape.var(&ok(Tensor::full([4], 1.0f32), "w4")), "w4");
    let table = ok(
        tape.var(&ok(Tensor::full([5, 2], 1.0f32), "table")),
        "table",
    );
    let refusals = [
        (
            tape.layer_norm(&x, &[3], None, None, 1e-5).err(),
            "not the end",
        ),
        (
            tape.layer_norm(&x, &[4], Some(&w3), Some(&w4), 1e-5).err(),
            "weight has shape [3]",
        ),
        (tape.layer_norm(&x, &[4], None, None, f32::NAN).err(), "eps"),
        (
            tape.embedding(&table, &[0, 5], &[2]).err(),
            "index 5 at position 1",
        ),
        (tape.embedding(&table, &[0, 1], &[3]).err(), "do not fill"),
        (tape.embedding(&x, &[0], &[1]).err(), "vocab×dim"),
        (tape.dropout(&x, 1.5, 7).err(), "not a probability"),
        (tape.dropout(&x, f32::NAN, 7).err(), "not a probability"),
    ];
    for (refused, says) in refusals {
        let Some(AutodiffError::InvalidArgument(message)) = refused else {
            panic!("expected an invalid argument saying {says:?}: {refused:?}");
        };
        assert!(message.contains(says), "{message:?} should say {says:?}");
    }
}
