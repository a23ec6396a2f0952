use super::*;

#[test]
fn each_definition_computes_its_expression_on_the_cpu() {
    let (a, b) = ([1.0, -2.0, 3.5], [4.0, 0.5, -1.0]);
    let mut out = [0.0; 3];
    map(MapOp::Add, &mut out, &[&a, &b], &[]).unwrap();
    assert_eq!(out, [5.0, -1.5, 2.5]);
    map(MapOp::Mul, &mut out, &[&a, &b], &[]).unwrap();
    assert_eq!(out, [4.0, -1.0, -3.5]);
    map(MapOp::Sub, &mut out, &[&a, &b], &[]).unwrap();
    assert_eq!(out, [-3.0, -2.5, 4.5]);
    map(MapOp::Div, &mut out, &[&a, &b], &[]).unwrap();
    assert_eq!(out, [0.25, -4.0, -3.5]);
    map(MapOp::MseLossBackward, &mut out, &[&a, &b], &[2.0]).unwrap();
    assert_eq!(out, [-6.0, -5.0, 9.0]);
    map(MapOp::Fill, &mut out, &[], &[7.0]).unwrap();
    assert_eq!(out, [7.0; 3]);
    let mut x = a;
    map(MapOp::Scale, &mut x, &[], &[-2.0]).unwrap();
    assert_eq!(x, [-2.0, 4.0, -7.0]);
    map(MapOp::Axpy, &mut x, &[&b], &[0.5]).unwrap();
    assert_eq!(x, [0.0, 4.25, -7.5]);
}

#[test]
fn a_long_run_is_split_into_pieces_that_each_see_their_own_elements() {
    let n = 100_003;
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| (n - i) as f32).collect();
    let mut out = vec![0.0; n];
    map(MapOp::Add, &mut out, &[&a, &b], &[]).unwrap();
    assert!(out.iter().all(|&v| v == n as f32));
}

#[test]
fn wrong_counts_and_lengths_are_refused_before_anything_is_written() {
    let mut out = [9.0; 2];
    assert!(map(MapOp::Add, &mut out, &[&[1.0, 2.0]], &[]).is_err());
    assert!(map(MapOp::Add, &mut out, &[&[1.0, 2.0], &[1.0]], &[]).is_err());
    assert!(map(MapOp::Scale, &mut out, &[], &[]).is_err());
    assert!(map(MapOp::Fill, &mut out, &[], &[1.0, 2.0]).is_err());
    assert_eq!(out, [9.0; 2]);
}

#[test]
fn every_definition_fits_the_backends_and_is_named_once() {
    let mut names: Vec<_> = MapOp::ALL.iter().map(|op| op.name()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), MapOp::ALL.len());
    assert_eq!(DEFINITIONS.len(), MapOp::ALL.len());
    for &op in MapOp::ALL {
        let definition = op.definition();
        assert_eq!(definition.name, op.name());
        assert_eq!(MapOp::from_name(op.name()), Some(op));
        assert!(definition.bindings() >= 1, "{}", op.name());
        assert!(definition.bindings() <= MAX_BINDINGS, "{}", op.name());
        assert!(definition.scalars.len() <= MAX_SCALARS, "{}", op.name());
        assert!(!definition.in_place || !definition.inputs.is_empty());
    }
}

/// Words WGSL reserves or CUDA C++ keeps, and the functions of the
/// vocabulary: no input or scalar may be named so.
const RESERVED: &[&str] = &[
    "target", "as", "auto", "break", "case", "cast", "const", "continue", "default", "do", "else",
    "enum", "extern", "false", "fn", "for", "if", "in", "let", "loop", "match", "module", "new",
    "out", "return", "self", "static", "struct", "switch", "true", "type", "unsigned", "var",
    "void", "while", "float", "int", "double", "char", "long", "short", "this", "exp", "log",
    "tanh", "sqrt", "abs", "max", "min",
];

#[test]
fn no_input_or_scalar_takes_a_name_wgsl_or_cuda_would_refuse_or_shadow() {
    for definition in DEFINITIONS {
        for name in definition.inputs.iter().chain(definition.scalars) {
            // `b1`..`b7` are the WGSL module's buffers.
            let buffer = name.len() == 2 && name.starts_with('b');
            assert!(!buffer, "{}: `{name}` names a WGSL buffer", definition.name);
            assert!(
                !RESERVED.contains(name),
                "{}: `{name}` is reserved",
                definition.name
            );
        }
    }
}

#[test]
fn every_definition_has_an_entry_point_in_the_wgsl_and_the_cuda_program() {
    let (scalar, vec4, cuda) = (wgsl_source(false), wgsl_source(true), cuda_source());
    for definition in DEFINITIONS {
        let wgsl = format!("fn {}(", definition.wgsl_entry);
        assert!(
            scalar.contains(&wgsl) && vec4.contains(&wgsl),
            "{}",
            definition.name
        );
        let kernel = format!("extern \"C\" __global__ void {}(", definition.cuda_entry);
        assert!(cuda.contains(&kernel), "{}", definition.name);
        assert!(
            crate::cuda::program().contains(&kernel),
            "{}",
            definition.name
        );
    }
}

#[test]
fn binary_cross_entropy_with_logits_is_finite_at_extreme_logits_and_zero_at_certainty() {
    let x = [1e30, -1e30, 0.0];
    let y = [1.0, 0.0, 1.0];
    let ones = [1.0; 3];
    let mut out = [9.0; 3];
    map(
        MapOp::BceWithLogits,
        &mut out,
        &[&x, &y, &ones, &ones],
        &[1.0, 0.5],
    )
    .unwrap();
    assert_eq!(out[..2], [0.0, 0.0]);
    assert!((out[2] - std::f32::consts::LN_2).abs() < 1e-6, "{out:?}");
    map(
        MapOp::BceWithLogitsBackward,
        &mut out,
        &[&x, &y, &ones, &ones],
        &[1.0, 1.0],
    )
    .unwrap();
    assert_eq!(out, [0.0, 0.0, -0.5]);
}
