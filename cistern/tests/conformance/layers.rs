//! The layers of a transformer on every device: layer norm (affine, weight
//! only, none), embedding lookups (a repeated index included) and softmax
//! over the last dimension of a 3-d tensor, forward against an f64
//! reference and backward against its finite differences; and sizes that
//! span many workgroups, forward and backward against the reference.

use cistern::client::{AutodiffError, DeviceParamStore, Tape, Tensor, Var};
use cistern::memory::SplitMix64;
use cistern::optim::SgdConfig;
use cistern::runtime::Device;

use super::broadcast::{check_tape, close, values, widen};
use super::common::{ok, open};

/// Layer norm of `x` over rows of `cols`, in f64, with an optional
/// weight and bias.
fn layer_norm_reference(
    x: &[f64],
    cols: usize,
    weight: Option<&[f64]>,
    bias: Option<&[f64]>,
    eps: f64,
) -> Vec<f64> {
    x.chunks(cols)
        .flat_map(|row| {
            let mean = row.iter().sum::<f64>() / cols as f64;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / cols as f64;
            let rstd = 1.0 / (var + eps).sqrt();
            (0..cols).map(move |c| {
                let xhat = (row[c] - mean) * rstd;
                xhat * weight.map_or(1.0, |w| w[c]) + bias.map_or(0.0, |b| b[c])
            })
        })
        .collect()
}

/// Softmax (or log-softmax) over rows of `cols`, in f64.
fn softmax_reference(x: &[f64], cols: usize, log: bool) -> Vec<f64> {
    x.chunks(cols)
        .flat_map(|row| {
            let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
            row.iter()
                .map(move |v| if log { v - lse } else { (v - lse).exp() })
        })
        .collect()
}

pub fn layer_norm_on_the_tape_matches_finite_differences(device: Device) {
    let eps = 1e-5;
    check_tape(
        device,
        "layer_norm affine",
        &[&[2, 3, 5], &[5], &[5]],
        &[],
        |tape, v| tape.layer_norm(&v[0], &[5], Some(&v[1]), Some(&v[2]), eps as f32),
        |x| layer_norm_reference(&x[0], 5, Some(&x[1]), Some(&x[2]), eps),
    );
    check_tape(
        device,
        "layer_norm over two dimensions",
        &[&[2, 3, 4]],
        &[],
        |tape, v| tape.layer_norm(&v[0], &[3, 4], None, None, eps as f32),
        |x| layer_norm_reference(&x[0], 12, None, None, eps),
    );
    check_tape(
        device,
        "layer_norm weight only",
        &[&[4, 6], &[6]],
        &[],
        |tape, v| tape.layer_norm(&v[0], &[6], Some(&v[1]), None, 1e-3),
        |x| layer_norm_reference(&x[0], 6, Some(&x[1]), None, 1e-3_f32 as f64),
    );
}

pub fn embedding_on_the_tape_matches_finite_differences(device: Device) {
    let indices = [1usize, 4, 1, 0, 1, 2];
    check_tape(
        device,
        "embedding",
        &[&[5, 3]],
        &[],
        |tape, v| tape.embedding(&v[0], &indices, &[2, 3]),
        |x| {
            indices
                .iter()
                .flat_map(|&i| x[0][i * 3..(i + 1) * 3].to_vec())
                .collect()
        },
    );
}

pub fn softmax_over_the_last_dimension_of_a_3d_tensor_matches_finite_differences(device: Device) {
    for log in [false, true] {
        check_tape(
            device,
            if log {
                "log_softmax 3-d"
            } else {
                "softmax 3-d"
            },
            &[&[2, 3, 4]],
            &[],
            |tape, v| match log {
                true => tape.log_softmax(&v[0]),
                false => tape.softmax(&v[0]),
            },
            |x| softmax_reference(&x[0], 4, log),
        );
    }
}

/// Layer norm over 300 rows of 257 and an embedding of 1,000 lookups into
/// a 50×17 table, forward and backward against the f64 reference (the
/// backward through `Σ y ⊙ w`, whose gradient is known in closed form for
/// the embedding and checked by the layer norm's identities otherwise).
pub fn layer_norm_and_embedding_over_many_workgroups_match_the_reference(device: Device) {
    let client = open(device);
    let mut rng = SplitMix64::new(4401);
    let (rows, cols) = (300, 257);
    let x = values(&mut rng, rows * cols);
    let (weight, bias) = (values(&mut rng, cols), values(&mut rng, cols));
    let tape = Tape::new(&client);
    let leaf = |data: &[f32], shape: &[usize]| {
        let tensor = ok(Tensor::new(shape.to_vec(), data.to_vec()), "tensor");
        ok(tape.var(&tensor), "var")
    };
    let (vx, vw, vb) = (
        leaf(&x, &[rows, cols]),
        leaf(&weight, &[cols]),
        leaf(&bias, &[cols]),
    );
    let y = ok(
        tape.layer_norm(&vx, &[cols], Some(&vw), Some(&vb), 1e-5),
        "layer_norm",
    );
    let want = layer_norm_reference(
        &widen(&x),
        cols,
        Some(&widen(&weight)),
        Some(&widen(&bias)),
        1e-5,
    );
    let got = ok(y.to_host(), "y");
    for (i, (g, w)) in got.data().iter().zip(&want).enumerate() {
        assert!(
            close(f64::from(*g), *w, 1e-4),
            "{device}: y[{i}] is {g}, want {w}"
        );
    }
    // Σ y: the bias's gradient is `rows` per column; the input's is 0 per
    // row (a layer norm's output is invariant to shifting its input).
    let loss = ok(tape.sum(&y), "sum");
    let gradients = ok(tape.backward(&loss), "backward");
    let bias_grad = ok(gradients.to_host(&vb), "bias grad").expect("reached");
    assert!(
        bias_grad
            .data()
            .iter()
            .all(|&g| (g - rows as f32).abs() < 1e-3),
        "{device}"
    );
    let x_grad = ok(gradients.to_host(&vx), "x grad").expect("reached");
    for row in x_grad.data().chunks(cols) {
        let total: f32 = row.iter().sum();
        assert!(
            total.abs() < 1e-3,
            "{device}: a row's input gradient sums to {total}"
        );
    }
    let weight_grad = ok(gradients.to_host(&vw), "weight grad").expect("reached");
    let xhat = layer_norm_reference(&widen(&x), cols, None, None, 1e-5);
    for c in 0..cols {
        let want: f64 = (0..rows).map(|r| xhat[r * cols + c]).sum();
        let got = f64::from(weight_grad.data()[c]);
        assert!(
            close(got, want, 1e-3),
            "{device}: weight grad {c} is {got}, want {want}"
        );
    }

    let (vocab, dim, lookups) = (50, 17, 1000);
    let table = values(&mut rng, vocab * dim);
    let indices: Vec<usize> = (0..lookups).map(|i| (i * 7 + i / 3) % vocab).collect();
    let tape = Tape::new(&client);
    let vt = ok(
        tape.var(&ok(Tensor::new([vocab, dim], table.clone()), "t")),
        "table",
    );
    let looked = ok(tape.embedding(&vt, &indices, &[lookups]), "embedding");
    let got = ok(looked.to_host(), "rows");
    for (i, &index) in indices.iter().enumerate() {
        assert_eq!(
            got.data()[i * dim..(i + 1) * dim],
            table[index * dim..(index + 1) * dim]
        );
    }
    let w = values(&mut rng, lookups * dim);
    let vw = ok(
        tape.var_no_grad(&ok(Tensor::new([lookups, dim], w.clone()), "w")),
        "w",
    );
    let loss = ok(tape.sum(&ok(tape.mul(&looked, &vw), "mul")), "loss");
    let gradients = ok(tape.backward(&loss), "backward");
    let grad = ok(gradients.to_host(&vt), "table grad").expect("reached");
    let mut want = vec![0.0f64; vocab * dim];
    for (i, &index) in indices.iter().enumerate() {
        for c in 0..dim {
            want[index * dim + c] += f64::from(w[i * dim + c]);
        }
    }
    for (i, (g, w)) in grad.data().iter().zip(&want).enumerate() {
        assert!(
            close(f64::from(*g), *w, 1e-5),
            "{device}: table grad {i} is {g}, want {w}"
        );
    }
}

/// `a·b` over broadcast batches, in f64 (`a` `[.., m, k]`, `b` `[.., k, n]`).
fn matmul_reference(a: &[f64], a_shape: &[usize], b: &[f64], b_shape: &[usize]) -> Vec<f64> {
    let (ra, rb) = (a_shape.len(), b_shape.len());
    let (m, k, n) = (a_shape[ra - 2], a_shape[ra - 1], b_shape[rb - 1]);
    let (ab, bb) = (&a_shape[..ra - 2], &b_shape[..rb - 2]);
    let rank = ab.len().max(bb.len());
    let dim = |s: &[usize], d: usize| (d + s.len()).checked_sub(rank).map_or(1, |i| s[i]);
    let batch: Vec<usize> = (0..rank).map(|d| dim(ab, d).max(dim(bb, d))).collect();
    let index_in = |s: &[usize], mut i: usize| {
        let (mut at, mut stride) = (0, 1);
        for d in (0..rank).rev() {
            let index = i % batch[d];
            i /= batch[d];
            let n = dim(s, d);
            if n != 1 {
                at += index * stride;
            }
            stride *= n;
        }
        at
    };
    let mut out = Vec::new();
    for i in 0..batch.iter().product() {
        let (x, y) = (index_in(ab, i) * m * k, index_in(bb, i) * k * n);
        for r in 0..m {
            for c in 0..n {
                out.push((0..k).map(|j| a[x + r * k + j] * b[y + j * n + c]).sum());
            }
        }
    }
    out
}

pub fn batched_matmul_on_the_tape_matches_finite_differences(device: Device) {
    let pairs: &[(&[usize], &[usize])] = &[
        (&[3, 4], &[4, 5]),
        (&[2, 3, 4], &[4, 5]),
        (&[2, 3, 4], &[2, 4, 5]),
        (&[3, 4], &[2, 4, 5]),
        (&[2, 1, 3, 4], &[3, 4, 2]),
        (&[2, 2, 20, 17], &[2, 1, 17, 19]),
    ];
    for &(a_shape, b_shape) in pairs {
        check_tape(
            device,
            &format!("matmul {a_shape:?} {b_shape:?}"),
            &[a_shape, b_shape],
            &[],
            |tape, v| tape.matmul(&v[0], &v[1]),
            |x| matmul_reference(&x[0], a_shape, &x[1], b_shape),
        );
    }
}

/// A small block over a store's parameters of every shape: an embedding
/// table, a position table added by broadcasting, a layer norm's weight
/// and bias, a weight in a batched matmul, and a one-element scale used
/// twice. The same graph on plain leaves gives the reference gradients.
fn block<'t>(
    tape: &'t Tape,
    params: &[Var<'t>],
    indices: &[usize],
) -> Result<Var<'t>, AutodiffError> {
    let [table, position, gamma, beta, weight, scale] = params else {
        unreachable!("six parameters");
    };
    let tokens = tape.embedding(table, indices, &[2, 3])?;
    let x = tape.add(&tokens, position)?;
    let x = tape.layer_norm(&x, &[4], Some(gamma), Some(beta), 1e-5)?;
    let y = tape.matmul(&x, weight)?;
    let y = tape.mul(&tape.mul(&y, scale)?, scale)?;
    let t = tape.transpose(&y, 0, 1)?;
    tape.mean(&tape.mul(&t, &t)?)
}

pub fn every_registered_parameter_in_any_operation_gets_its_gradient_staged(device: Device) {
    let client = open(device);
    let mut rng = SplitMix64::new(4402);
    let shapes: [&[usize]; 6] = [&[6, 4], &[3, 4], &[4], &[4], &[4, 4], &[1]];
    let params: Vec<Tensor<f32>> = shapes
        .iter()
        .map(|shape| {
            let data = values(&mut rng, shape.iter().product());
            ok(Tensor::new(shape.to_vec(), data), "param")
        })
        .collect();
    let indices = [5, 0, 2, 2, 1, 5];

    let reference = Tape::new(&client);
    let leaves: Vec<Var<'_>> = params.iter().map(|p| ok(reference.var(p), "var")).collect();
    let loss = ok(block(&reference, &leaves, &indices), "reference block");
    let gradients = ok(reference.backward(&loss), "reference backward");
    let want: Vec<Tensor<f32>> = leaves
        .iter()
        .map(|leaf| ok(gradients.to_host(leaf), "grad").expect("reached"))
        .collect();

    let refs: Vec<&Tensor<f32>> = params.iter().collect();
    let mut store = ok(DeviceParamStore::new(&Tape::new(&client), &refs), "store");
    let tape = Tape::new(&client);
    let resident = ok(store.register_resident_params(&tape), "register");
    let vars: Vec<Var<'_>> = resident.iter().map(|leaf| leaf.var()).collect();
    let loss = ok(block(&tape, &vars, &indices), "block over the store");
    let staged = ok(store.backward(&tape, &loss), "the store's backward");
    let got = ok(store.resident_grads_to_host(), "staged");
    for (slot, (got, want)) in got.iter().zip(&want).enumerate() {
        let got = got
            .as_ref()
            .unwrap_or_else(|| panic!("{device}: slot {slot} staged"));
        assert_eq!(got.shape(), want.shape(), "{device}: slot {slot}");
        for (i, (g, w)) in got.data().iter().zip(want.data()).enumerate() {
            let (g, w) = (f64::from(*g), f64::from(*w));
            assert!(
                close(g, w, 1e-6),
                "{device}: slot {slot}[{i}] is {g}, want {w}"
            );
        }
    }
    ok(
        store.step(&staged, &SgdConfig::default()),
        "a step from them",
    );
    let after = ok(store.sync_to_host(), "after");
    for (slot, (after, before)) in after.iter().zip(&params).enumerate() {
        for (i, (a, b)) in after.data().iter().zip(before.data()).enumerate() {
            let stepped = f64::from(*b) - 1e-3 * f64::from(want[slot].data()[i]);
            assert!(
                close(f64::from(*a), stepped, 1e-6),
                "{device}: slot {slot}[{i}]"
            );
        }
    }
}

/// The same seed gives the same mask as the CPU kernel, bit for bit, on
/// every device; backward applies the same mask to the gradient; about
/// `p` of a large tensor is dropped.
pub fn dropout_masks_match_the_cpu_bit_for_bit_and_backward_reuses_them(device: Device) {
    let client = open(device);
    let mut rng = SplitMix64::new(4403);
    let (n, p, seed) = (70_001, 0.1f32, 0x1234_5678_9abc_def0u64);
    let x = values(&mut rng, n);
    let w = values(&mut rng, n);
    let spec = cistern::kernels::DropoutSpec::new(p, seed).expect("a probability");
    let mut want = vec![0.0; n];
    cistern::kernels::dropout::dropout(&spec, &x, &mut want).expect("cpu dropout");
    let tape = Tape::new(&client);
    let vx = ok(tape.var(&ok(Tensor::new([n], x.clone()), "x")), "x");
    let vw = ok(tape.var_no_grad(&ok(Tensor::new([n], w.clone()), "w")), "w");
    let y = ok(tape.dropout(&vx, p, seed), "dropout");
    let got = ok(y.to_host(), "y");
    assert_eq!(got.data(), want.as_slice(), "{device}: the mask and scale");
    let dropped = want.iter().filter(|&&v| v == 0.0).count() as f64 / n as f64;
    assert!((dropped - 0.1).abs() < 0.01, "{device}: dropped {dropped}");
    let loss = ok(tape.sum(&ok(tape.mul(&y, &vw), "y⊙w")), "loss");
    let gradients = ok(tape.backward(&loss), "backward");
    let grad = ok(gradients.to_host(&vx), "grad").expect("reached");
    for (i, (&got, &w)) in grad.data().iter().zip(&w).enumerate() {
        let expected = if spec.keeps(i as u32) {
            w * spec.scale
        } else {
            0.0
        };
        assert_eq!(got, expected, "{device}: gradient {i}");
    }
}

/// A counted dropout reads its step from a device word when it runs: on
/// every device its mask is the CPU's at that step, in forward and
/// backward, and a new count gives a new mask.
pub fn a_counted_dropout_draws_the_mask_of_the_step_its_counter_holds(device: Device) {
    let client = open(device);
    let mut rng = SplitMix64::new(4404);
    let (n, p, seed) = (5_003, 0.25f32, 0x0bad_cafe_u64);
    let x = values(&mut rng, n);
    let counter = ok(client.upload(&7u32.to_ne_bytes()), "the counter");
    let spec = cistern::kernels::DropoutSpec::new(p, seed).expect("a probability");
    let at = |step: u32| {
        let mut want = vec![0.0; n];
        cistern::kernels::dropout::dropout(&spec.at_step(step), &x, &mut want).expect("cpu");
        want
    };
    let tape = Tape::new(&client);
    let vx = ok(tape.var(&ok(Tensor::new([n], x.clone()), "x")), "x");
    let y = ok(
        tape.dropout_counted(&vx, p, seed, &counter),
        "dropout_counted",
    );
    assert_eq!(
        ok(y.to_host(), "y").data(),
        at(7).as_slice(),
        "{device}: step 7"
    );
    let gradients = ok(tape.backward(&ok(tape.sum(&y), "sum")), "backward");
    let grad = ok(gradients.to_host(&vx), "grad").expect("reached");
    for (i, &g) in grad.data().iter().enumerate() {
        let kept = spec.at_step(7).keeps(i as u32);
        assert_eq!(
            g,
            if kept { spec.scale } else { 0.0 },
            "{device}: gradient {i}"
        );
    }
    ok(client.write(&counter, 0, &8u32.to_ne_bytes()), "step 8");
    let again = ok(
        tape.dropout_counted(&vx, p, seed, &counter),
        "step 8's dropout",
    );
    let got = ok(again.to_host(), "again");
    assert_eq!(got.data(), at(8).as_slice(), "{device}: step 8");
    assert_ne!(at(7), at(8), "two steps draw two masks");
    let wide = ok(client.upload(&[0u8; 8]), "two words");
    assert!(
        tape.dropout_counted(&vx, p, seed, &wide).is_err(),
        "{device}: a counter of two words is refused"
    );
}

/// `softmax(q·kᵀ/√d + mask)·v` in f64 over batches of `l×d`, `s×d`, `s×dv`,
/// with an additive mask of `l×s` shared by every batch.
fn attention_reference(
    (q, k, v): (&[f64], &[f64], &[f64]),
    (batches, l, s, d, dv): (usize, usize, usize, usize, usize),
    mask: Option<&[f64]>,
    causal: bool,
) -> Vec<f64> {
    let mut out = Vec::new();
    for b in 0..batches {
        let (q, k, v) = (&q[b * l * d..], &k[b * s * d..], &v[b * s * dv..]);
        for i in 0..l {
            let scores: Vec<f64> = (0..s)
                .map(|j| {
                    let dot: f64 = (0..d).map(|c| q[i * d + c] * k[j * d + c]).sum();
                    let hidden = if causal && j > i {
                        f64::NEG_INFINITY
                    } else {
                        0.0
                    };
                    dot / (d as f64).sqrt() + mask.map_or(0.0, |m| m[i * s + j]) + hidden
                })
                .collect();
            let weights = softmax_reference(&scores, s, false);
            for c in 0..dv {
                out.push((0..s).map(|j| weights[j] * v[j * dv + c]).sum());
            }
        }
    }
    out
}

pub fn attention_on_the_tape_matches_finite_differences(device: Device) {
    check_tape(
        device,
        "attention with a mask",
        &[&[2, 3, 4], &[2, 5, 4], &[2, 5, 3], &[3, 5]],
        &[],
        |tape, v| tape.scaled_dot_product_attention(&v[0], &v[1], &v[2], Some(&v[3]), false),
        |x| attention_reference((&x[0], &x[1], &x[2]), (2, 3, 5, 4, 3), Some(&x[3]), false),
    );
    check_tape(
        device,
        "causal attention over heads",
        &[&[1, 2, 4, 4], &[1, 2, 4, 4], &[1, 2, 4, 4]],
        &[],
        |tape, v| tape.scaled_dot_product_attention(&v[0], &v[1], &v[2], None, true),
        |x| attention_reference((&x[0], &x[1], &x[2]), (2, 4, 4, 4, 4), None, true),
    );
}

/// `[batch, positions, heads·head_dim]` as `[batch·heads, positions,
/// head_dim]`, and back (`merge`).
fn split_heads(x: &[f64], [batch, positions, heads]: [usize; 3], merge: bool) -> Vec<f64> {
    let dim = x.len() / (batch * positions * heads);
    let mut out = vec![0.0; x.len()];
    for b in 0..batch {
        for p in 0..positions {
            for h in 0..heads {
                for e in 0..dim {
                    let packed = ((b * positions + p) * heads + h) * dim + e;
                    let split = ((b * heads + h) * positions + p) * dim + e;
                    match merge {
                        false => out[split] = x[packed],
                        true => out[packed] = x[split],
                    }
                }
            }
        }
    }
    out
}

pub fn fused_multi_head_attention_matches_finite_differences(device: Device) {
    for causal in [false, true] {
        let (batch, queries, keys, heads, dim) = (2, 3, 5, 2, 4);
        check_tape(
            device,
            if causal {
                "fused causal attention"
            } else {
                "fused attention"
            },
            &[
                &[batch, queries, heads * dim],
                &[batch, keys, heads * dim],
                &[batch, keys, heads * dim],
            ],
            &[],
            |tape, v| tape.multi_head_attention(&v[0], &v[1], &v[2], heads, causal),
            |x| {
                let q = split_heads(&x[0], [batch, queries, heads], false);
                let k = split_heads(&x[1], [batch, keys, heads], false);
                let v = split_heads(&x[2], [batch, keys, heads], false);
                let shape = (batch * heads, queries, keys, dim, dim);
                let out = attention_reference((&q, &k, &v), shape, None, causal);
                split_heads(&out, [batch, queries, heads], true)
            },
        );
    }
}

/// The fused attention against the composed one (heads split by permutes)
/// on the same device, over more query rows than a workgroup holds: the
/// output and the gradients of `q`, `k` and `v`.
pub fn fused_attention_over_many_rows_matches_the_composed_one(device: Device) {
    let client = open(device);
    let (batch, tokens, heads, dim) = (40, 9, 4, 16);
    let mut rng = SplitMix64::new(4471);
    let shape = [batch, tokens, heads * dim];
    let inputs: Vec<Tensor<f32>> = (0..4)
        .map(|_| {
            ok(
                Tensor::new(shape, values(&mut rng, batch * tokens * heads * dim)),
                "tensor",
            )
        })
        .collect();
    let run = |fused: bool| {
        let tape = Tape::new(&client);
        let vars: Vec<Var<'_>> = inputs[..3].iter().map(|x| ok(tape.var(x), "var")).collect();
        let y = if fused {
            ok(
                tape.multi_head_attention(&vars[0], &vars[1], &vars[2], heads, false),
                "fused",
            )
        } else {
            let split = |x: &Var<'_>| {
                let x = ok(
                    tape.reshape(x, &[batch as isize, tokens as isize, heads as isize, -1]),
                    "reshape",
                );
                ok(tape.permute(&x, &[0, 2, 1, 3]), "permute")
            };
            let (q, k, v) = (split(&vars[0]), split(&vars[1]), split(&vars[2]));
            let y = ok(
                tape.scaled_dot_product_attention(&q, &k, &v, None, false),
                "sdpa",
            );
            let y = ok(tape.permute(&y, &[0, 2, 1, 3]), "merge");
            ok(
                tape.reshape(&y, &[batch as isize, tokens as isize, -1]),
                "reshape",
            )
        };
        let w = ok(tape.var_no_grad(&inputs[3]), "w");
        let loss = ok(tape.sum(&ok(tape.mul(&y, &w), "y⊙w")), "loss");
        let gradients = ok(tape.backward(&loss), "backward");
        let mut out = vec![ok(y.to_host(), "y").data().to_vec()];
        for var in &vars {
            let Some(gradient) = ok(gradients.to_host(var), "gradient") else {
                panic!("{device}: the loss reaches every input");
            };
            out.push(gradient.data().to_vec());
        }
        out
    };
    let (fused, composed) = (run(true), run(false));
    for (which, (got, want)) in ["out", "grad q", "grad k", "grad v"]
        .iter()
        .zip(fused.iter().zip(&composed))
    {
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            assert!(
                close(f64::from(g), f64::from(w), 1e-5),
                "{device} {which}: element {i} is {g}, the composed attention's {w}"
            );
        }
    }
}

/// `x` (`[a, b, c]`, row-major) narrowed to `start..start + length` of `dim`.
fn narrow_reference(
    x: &[f64],
    shape: [usize; 3],
    dim: usize,
    start: usize,
    length: usize,
) -> Vec<f64> {
    let mut out = Vec::new();
    for i in 0..shape[0] {
        for j in 0..shape[1] {
            for k in 0..shape[2] {
                let index = [i, j, k][dim];
                if index >= start && index < start + length {
                    out.push(x[(i * shape[1] + j) * shape[2] + k]);
                }
            }
        }
    }
    out
}

pub fn narrow_split_and_cat_on_the_tape_match_finite_differences(device: Device) {
    let shape = [3, 4, 5];
    for (dim, start, length) in [(0usize, 1usize, 2usize), (1, 1, 3), (2, 4, 1)] {
        check_tape(
            device,
            &format!("narrow dim {dim} from {start} for {length}"),
            &[&shape],
            &[],
            |tape, v| {
                let part = tape.narrow(&v[0], dim as isize, start, length)?;
                tape.mul(&part, &part)
            },
            |x| {
                let part = narrow_reference(&x[0], shape, dim, start, length);
                part.iter().map(|v| v * v).collect()
            },
        );
    }
    check_tape(
        device,
        "split the last dimension, the pieces reordered by cat",
        &[&shape],
        &[],
        |tape, v| {
            let pieces = tape.split(&v[0], 2, -1)?;
            let refs: Vec<&Var<'_>> = pieces.iter().rev().collect();
            tape.cat(&refs, -1)
        },
        |x| {
            let mut out = Vec::new();
            for row in x[0].chunks(5) {
                out.extend([row[4], row[2], row[3], row[0], row[1]]);
            }
            out
        },
    );
    check_tape(
        device,
        "cat along the first dimension, one input twice",
        &[&[2, 3], &[1, 3]],
        &[],
        |tape, v| tape.cat(&[&v[0], &v[1], &v[0]], 0),
        |x| [x[0].clone(), x[1].clone(), x[0].clone()].concat(),
    );
    check_tape(
        device,
        "cat along the middle dimension",
        &[&[2, 1, 3], &[2, 2, 3]],
        &[],
        |tape, v| tape.cat(&[&v[0], &v[1]], 1),
        |x| {
            let mut out = Vec::new();
            for i in 0..2 {
                out.extend_from_slice(&x[0][i * 3..(i + 1) * 3]);
                out.extend_from_slice(&x[1][i * 6..(i + 1) * 6]);
            }
            out
        },
    );
}

pub fn softmax_over_any_dimension_matches_finite_differences(device: Device) {
    for log in [false, true] {
        check_tape(
            device,
            if log {
                "log_softmax dim 1"
            } else {
                "softmax dim 1"
            },
            &[&[2, 3, 4]],
            &[],
            |tape, v| match log {
                true => tape.log_softmax_dim(&v[0], 1),
                false => tape.softmax_dim(&v[0], -2),
            },
            |x| {
                // Over dimension 1 of [2, 3, 4]: move it last, normalise, move back.
                let moved: Vec<f64> = (0..2)
                    .flat_map(|i| (0..4).flat_map(move |k| (0..3).map(move |j| (i, j, k))))
                    .map(|(i, j, k)| x[0][(i * 3 + j) * 4 + k])
                    .collect();
                let done = softmax_reference(&moved, 3, log);
                let mut out = vec![0.0; 24];
                for i in 0..2 {
                    for k in 0..4 {
                        for j in 0..3 {
                            out[(i * 3 + j) * 4 + k] = done[(i * 4 + k) * 3 + j];
                        }
                    }
                }
                out
            },
        );
    }
}
