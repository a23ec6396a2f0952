//! The operations of issue 44 through the tape against PyTorch's own values
//! and autograd gradients: broadcasting arithmetic, reductions over
//! dimensions (`max_dim` included), views, batched matmul, layer norm,
//! embedding, softmax over any dimension, GELU and scaled dot-product
//! attention, composed and fused over heads (`benches/tape_fixture.py`
//! writes the fixture, inputs
//! included; it is committed, so this runs without PyTorch).
//!
//! Every device present runs it, with the tolerances of `pytorch.rs`: both
//! sides compute in f32, in different orders.

use cistern_client::{AutodiffError, Tape, Tensor, Var};
use serde_json::Value;

use super::common::ok;
use super::pytorch::{assert_matches, clients};

const FIXTURE: &str = include_str!("../fixtures/tape_ops.json");

/// A list of numbers (`"-inf"` for −∞, which JSON cannot write).
fn floats(value: &Value) -> Vec<f32> {
    let Some(list) = value.as_array() else {
        panic!("the fixture has no list at {value}");
    };
    list.iter()
        .map(|v| match v.as_str() {
            Some("-inf") => f32::NEG_INFINITY,
            _ => v.as_f64().unwrap_or(f64::NAN) as f32,
        })
        .collect()
}

fn ints(value: &Value) -> Vec<i64> {
    value
        .as_array()
        .map(|list| list.iter().filter_map(Value::as_i64).collect())
        .unwrap_or_default()
}

fn int(args: &Value, key: &str) -> i64 {
    match args[key].as_i64() {
        Some(value) => value,
        None => panic!("the fixture's arguments lack `{key}`: {args}"),
    }
}

/// The case's operation over `v`, its inputs on the tape.
fn apply<'t>(tape: &'t Tape, case: &Value, v: &[Var<'t>]) -> Result<Var<'t>, AutodiffError> {
    let args = &case["args"];
    let dims = |key| -> Vec<isize> { ints(&args[key]).iter().map(|&d| d as isize).collect() };
    let sizes = |key| -> Vec<usize> { ints(&args[key]).iter().map(|&d| d as usize).collect() };
    let keepdim = args["keepdim"].as_bool().unwrap_or(false);
    match case["op"].as_str().unwrap_or("") {
        "add" => tape.add(&v[0], &v[1]),
        "sub" => tape.sub(&v[0], &v[1]),
        "mul" => tape.mul(&v[0], &v[1]),
        "div" => tape.div(&v[0], &v[1]),
        "sum_dim" => tape.sum_dim(&v[0], &dims("dims"), keepdim),
        "mean_dim" => tape.mean_dim(&v[0], &dims("dims"), keepdim),
        "max_dim" => tape.max_dim(&v[0], int(args, "dim") as isize, keepdim),
        "reshape" => tape.reshape(&v[0], &dims("shape")),
        "permute" => tape.permute(&v[0], &dims("dims")),
        "transpose" => tape.transpose(
            &v[0],
            int(args, "dim0") as isize,
            int(args, "dim1") as isize,
        ),
        "narrow" => tape.narrow(
            &v[0],
            int(args, "dim") as isize,
            int(args, "start") as usize,
            int(args, "length") as usize,
        ),
        "cat" => tape.cat(&v.iter().collect::<Vec<_>>(), int(args, "dim") as isize),
        "matmul" => tape.matmul(&v[0], &v[1]),
        "layer_norm" => {
            let eps = args["eps"].as_f64().unwrap_or(f64::NAN) as f32;
            tape.layer_norm(&v[0], &sizes("normalized_shape"), v.get(1), v.get(2), eps)
        }
        "embedding" => tape.embedding(&v[0], &sizes("indices"), &sizes("shape")),
        "softmax_dim" => tape.softmax_dim(&v[0], int(args, "dim") as isize),
        "log_softmax_dim" => tape.log_softmax_dim(&v[0], int(args, "dim") as isize),
        "gelu" => tape.gelu(&v[0]),
        "gelu_tanh" => tape.gelu_tanh(&v[0]),
        "sdpa" => {
            let causal = args["causal"].as_bool().unwrap_or(false);
            tape.scaled_dot_product_attention(&v[0], &v[1], &v[2], v.get(3), causal)
        }
        "mha" => {
            let causal = args["causal"].as_bool().unwrap_or(false);
            let heads = args["heads"].as_u64().unwrap_or(0) as usize;
            tape.multi_head_attention(&v[0], &v[1], &v[2], heads, causal)
        }
        other => panic!("an operation the fixture should not have: {other}"),
    }
}

#[test]
fn every_operation_of_issue_44_matches_pytorch_values_and_gradients() {
    let fixture: Value = ok(serde_json::from_str(FIXTURE), "the fixture parses");
    let Some(cases) = fixture["cases"].as_array() else {
        panic!("the fixture has no cases");
    };
    assert!(cases.len() >= 39, "{} cases", cases.len());
    for (client, relative) in clients() {
        for (number, case) in cases.iter().enumerate() {
            let what = format!("case {number} {} {}", case["op"], case["args"]);
            let tape = Tape::new(&client);
            let Some(inputs) = case["inputs"].as_array() else {
                panic!("{what}: no inputs");
            };
            let tracked: Vec<bool> = (0..inputs.len())
                .map(|i| !case["grads"][i].is_null())
                .collect();
            let vars: Vec<Var<'_>> = (inputs.iter().zip(&tracked))
                .map(|(input, &tracked)| {
                    let shape: Vec<usize> =
                        ints(&input["shape"]).iter().map(|&d| d as usize).collect();
                    let tensor = ok(Tensor::new(shape, floats(&input["data"])), &what);
                    match tracked {
                        true => ok(tape.var(&tensor), &what),
                        false => ok(tape.var_no_grad(&tensor), &what),
                    }
                })
                .collect();
            let out = ok(apply(&tape, case, &vars), &what);
            let shape: Vec<usize> = ints(&case["shape"]).iter().map(|&d| d as usize).collect();
            assert_eq!(out.shape(), shape, "{what}: shape");
            let upstream = ok(Tensor::new(shape, floats(&case["upstream"])), &what);
            let upstream = ok(tape.var_no_grad(&upstream), &what);
            let loss = ok(tape.sum(&ok(tape.mul(&out, &upstream), &what)), &what);
            let gradients = ok(tape.backward(&loss), &what);
            let value = ok(out.to_host(), &what);
            assert_matches(value.data(), &floats(&case["output"]), relative, &what);
            for (i, var) in vars.iter().enumerate().filter(|&(i, _)| tracked[i]) {
                let Some(grad) = ok(gradients.to_host(var), &what) else {
                    panic!("{what}: the loss reaches input {i}");
                };
                let label = format!("{what} ∂input{i}");
                assert_matches(grad.data(), &floats(&case["grads"][i]), relative, &label);
            }
        }
    }
}
