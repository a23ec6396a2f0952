//! Every kernel of the catalogue launched through the client, against the
//! CPU kernels of `cistern-kernels` run on the host over the same data.

use cistern::client::{Buffer, ComputeClient};
use cistern::kernels::{self, Activation, GemmSpec, MapOp, Segment};
use cistern::runtime::{Device, KernelLaunch};

use super::common::{ok, open};
use cistern::memory::SplitMix64;

use super::optim_reference::{assert_close, assert_within, cancelling_tolerance, download};

/// Runs `launch` on the default stream and waits for it.
fn run(client: &ComputeClient, launch: KernelLaunch) {
    let what = launch.kernel.name();
    let token = ok(client.launch_tracked(client.default_stream(), launch), what);
    ok(token.wait(), what);
}

fn upload(client: &ComputeClient, values: &[f32]) -> Buffer {
    ok(client.upload_f32(values), "upload_f32")
}

fn zeros(client: &ComputeClient, n: usize) -> Buffer {
    upload(client, &vec![0.0; n])
}

fn host<T>(result: Result<T, kernels::KernelError>) -> T {
    match result {
        Ok(value) => value,
        Err(error) => panic!("the host kernel refused: {error}"),
    }
}

pub fn elementwise_kernels_match_the_cpu_kernels(device: Device) {
    let client = open(device);
    // Long enough for the kernels' parallel path, 4k + 3 to leave a tail
    // after a vec4 bulk; from element 0 (whole vec4s where a device has
    // them) and from element 1 (off a 16-byte boundary).
    for first in [0, 1] {
        elementwise_kernels_from(&client, first, 140_003);
    }
}

/// The element-wise kernels over elements `first..first + n` of buffers of
/// `first + n`, checked there; the elements before stay as they were.
fn elementwise_kernels_from(client: &ComputeClient, first: usize, n: usize) {
    let mut rng = SplitMix64::new(1 + first as u64);
    let (a, b) = (rng.symmetric_f32s(first + n), rng.symmetric_f32s(first + n));
    let (da, db, out) = (
        upload(client, &a),
        upload(client, &b),
        zeros(client, first + n),
    );
    let part = |buffer: &Buffer| buffer.range(4 * first as u64, 4 * n as u64);
    let (a_part, b_part) = (&a[first..], &b[first..]);
    let check = |buffer: &Buffer, before: &[f32], want: &[f32], what: &str| {
        let got = download(client, buffer);
        assert_eq!(&got[..first], &before[..first], "{what}: before the range");
        assert_close(&got[first..], want, &format!("{what} from {first}"));
    };

    run(client, KernelLaunch::fill(part(&out), 3.5));
    check(&out, &vec![0.0; first], &vec![3.5; n], "fill");
    run(client, KernelLaunch::identity(da.whole(), out.whole()));
    assert_eq!(download(client, &out), a);
    run(client, KernelLaunch::copy(db.whole(), out.whole()));
    assert_eq!(download(client, &out), b);

    let mut want = a_part.to_vec();
    kernels::scale(&mut want, -0.75);
    let x = upload(client, &a);
    run(client, KernelLaunch::scale(part(&x), -0.75));
    check(&x, &a, &want, "scale");

    let mut want = a_part.to_vec();
    host(kernels::axpy(&mut want, 0.3, b_part));
    let x = upload(client, &a);
    run(client, KernelLaunch::axpy(part(&x), 0.3, part(&db)));
    check(&x, &a, &want, "axpy");

    let mut want = vec![0.0; n];
    host(kernels::add(a_part, b_part, &mut want));
    run(client, KernelLaunch::add(part(&da), part(&db), part(&out)));
    check(&out, &b, &want, "add");
    host(kernels::mul(a_part, b_part, &mut want));
    run(client, KernelLaunch::mul(part(&da), part(&db), part(&out)));
    check(&out, &b, &want, "mul");
}

/// Every element-wise kernel's definition (`cistern_kernels::map`), new
/// ones included, on and off a 16-byte boundary, long enough for the
/// parallel path: a backend whose body of it differs fails here, named
/// with the kernel.
pub fn every_element_wise_definition_matches_its_cpu_body(device: Device) {
    let client = open(device);
    for &op in MapOp::ALL {
        for first in [0, 1] {
            element_wise_from(&client, device, op, first, 140_003);
        }
    }
}

/// `op` over elements `first..first + n` of buffers of `first + n`, against
/// its CPU body over the same data; the elements before stay as they were.
fn element_wise_from(client: &ComputeClient, device: Device, op: MapOp, first: usize, n: usize) {
    let definition = op.definition();
    let mut rng = SplitMix64::new(3 + first as u64);
    let inputs: Vec<Vec<f32>> = (0..definition.inputs.len())
        .map(|_| rng.symmetric_f32s(first + n))
        .collect();
    let scalars: Vec<f32> = (0..definition.scalars.len())
        .map(|s| 0.75 - 0.5 * s as f32)
        .collect();
    let before = rng.symmetric_f32s(first + n);
    let buffers: Vec<Buffer> = (0..definition.bindings())
        .map(|binding| match inputs.get(binding) {
            Some(values) => upload(client, values),
            None => upload(client, &before),
        })
        .collect();
    let part = |buffer: &Buffer| buffer.range(4 * first as u64, 4 * n as u64);
    run(
        client,
        KernelLaunch::map(op, &scalars, buffers.iter().map(part).collect()),
    );

    let written = definition.written();
    let mut want = inputs.get(written).unwrap_or(&before)[first..].to_vec();
    let read: Vec<&[f32]> = (0..definition.bindings())
        .filter(|&binding| binding != written)
        .map(|binding| &inputs[binding][first..])
        .collect();
    host(kernels::map(op, &mut want, &read, &scalars));
    let got = download(client, &buffers[written]);
    let what = format!("{} on {device} from element {first}", op.name());
    let untouched = inputs.get(written).unwrap_or(&before);
    assert_eq!(
        &got[..first],
        &untouched[..first],
        "{what}: before the range"
    );
    assert_within(&got[first..], &want, cancelling_tolerance(device), &what);
}

pub fn a_kernel_over_a_sub_range_changes_only_that_range(device: Device) {
    let client = open(device);
    let buffer = upload(&client, &[1.0; 16]);
    run(&client, KernelLaunch::scale(buffer.range(16, 16), 4.0));
    let mut want = vec![1.0; 16];
    want[4..8].fill(4.0);
    assert_eq!(download(&client, &buffer), want);
}

pub fn every_activation_forward_and_backward_matches_the_cpu_kernels(device: Device) {
    let client = open(device);
    // 4k + 3 elements, from element 0 (whole vec4s and a tail where a
    // device has them) and from element 1 (off a 16-byte boundary).
    for first in [0, 1] {
        activations_from(&client, device, first, 1003);
    }
}

/// Every activation over elements `first..first + n` of buffers of `first + n`.
fn activations_from(client: &ComputeClient, device: Device, first: usize, n: usize) {
    let mut rng = SplitMix64::new(2);
    let x: Vec<f32> = rng.symmetric_f32s(n).iter().map(|v| 4.0 * v).collect();
    let g = rng.symmetric_f32s(n);
    let padded = |values: &[f32]| [vec![0.0; first], values.to_vec()].concat();
    let (dx, dg) = (upload(client, &padded(&x)), upload(client, &padded(&g)));
    let out = zeros(client, first + n);
    let part = |buffer: &Buffer| buffer.range(4 * first as u64, 4 * n as u64);
    let result = || download(client, &out)[first..].to_vec();
    for activation in [
        Activation::Identity,
        Activation::Relu,
        Activation::LeakyRelu {
            negative_slope: 0.2,
        },
        Activation::Gelu,
        Activation::GeluTanh,
        Activation::Tanh,
        Activation::Sigmoid,
    ] {
        let mut want = vec![0.0; n];
        host(kernels::activation_forward(activation, &x, &mut want));
        run(
            client,
            KernelLaunch::activation_forward(activation, part(&dx), part(&out)),
        );
        assert_close(&result(), &want, &format!("{activation:?} from {first}"));
        host(kernels::activation_backward(activation, &x, &g, &mut want));
        let launch =
            KernelLaunch::activation_backward(activation, part(&dx), part(&dg), part(&out));
        run(client, launch);
        let tolerance = cancelling_tolerance(device);
        let what = format!("{activation:?}' from {first}");
        assert_within(&result(), &want, tolerance, &what);
    }
}

/// Exact GELU over [−12, 12] against the CPU's (which is within 6e-7 of
/// an f64 reference): relatively, so that the negative tail, where the
/// values fall to 1e-32, is checked as closely as the rest.
pub fn exact_gelu_keeps_its_tail_relatively_accurate(device: Device) {
    let client = open(device);
    let x: Vec<f32> = (-768..=768).map(|i| i as f32 / 64.0).collect();
    let ones = vec![1.0; x.len()];
    let (dx, dg, out) = (
        upload(&client, &x),
        upload(&client, &ones),
        zeros(&client, x.len()),
    );
    let mut want = vec![0.0; x.len()];
    host(kernels::activation_forward(Activation::Gelu, &x, &mut want));
    run(
        &client,
        KernelLaunch::activation_forward(Activation::Gelu, dx.whole(), out.whole()),
    );
    let got = download(&client, &out);
    let worst = |got: &[f32], want: &[f32]| {
        (got.iter().zip(want))
            .filter(|(_, w)| **w != 0.0)
            .map(|(g, w)| f64::from((g - w).abs() / w.abs()))
            .fold(0.0, f64::max)
    };
    let forward = worst(&got, &want);
    host(kernels::activation_backward(
        Activation::Gelu,
        &x,
        &ones,
        &mut want,
    ));
    let launch =
        KernelLaunch::activation_backward(Activation::Gelu, dx.whole(), dg.whole(), out.whole());
    run(&client, launch);
    // Away from the derivative's root near −0.75, where its terms cancel.
    let keep: Vec<usize> = (0..x.len())
        .filter(|&i| (x[i] + 0.75).abs() > 0.25)
        .collect();
    let got = download(&client, &out);
    let pick = |v: &[f32]| keep.iter().map(|&i| v[i]).collect::<Vec<_>>();
    let backward = worst(&pick(&got), &pick(&want));
    // Measured on lavapipe: 6.9e-6 both ways, its `exp` the limit (the
    // formula with −a²/2 rounded as one f32 gave 1.4e-5); the CPU: 0.
    assert!(
        forward < 1e-5,
        "{device}: gelu's worst relative error {forward:e}"
    );
    assert!(
        backward < 1e-5,
        "{device}: gelu''s worst relative error {backward:e}"
    );
}

pub fn gemm_with_transposes_bias_and_activation_matches_the_cpu_kernel(device: Device) {
    let client = open(device);
    let mut rng = SplitMix64::new(3);
    let (m, n, k) = (37, 19, 23);
    let a = rng.symmetric_f32s(m * k);
    let b = rng.symmetric_f32s(k * n);
    let bias = rng.symmetric_f32s(n);
    let (da, db, dbias) = (
        upload(&client, &a),
        upload(&client, &b),
        upload(&client, &bias),
    );
    let c = zeros(&client, m * n);
    for transpose_a in [false, true] {
        for transpose_b in [false, true] {
            for (with_bias, activation) in [(false, Activation::Identity), (true, Activation::Relu)]
            {
                let spec = GemmSpec {
                    m,
                    n,
                    k,
                    transpose_a,
                    transpose_b,
                    activation,
                };
                let host_bias = with_bias.then_some(bias.as_slice());
                let mut want = vec![0.0; m * n];
                host(kernels::gemm(&spec, &a, &b, host_bias, &mut want));
                let bound_bias = with_bias.then(|| dbias.whole());
                run(
                    &client,
                    KernelLaunch::gemm(spec, da.whole(), db.whole(), bound_bias, c.whole()),
                );
                let (got, what) = (download(&client, &c), format!("{spec:?}"));
                assert_within(&got, &want, cancelling_tolerance(device), &what);
            }
        }
    }
}

/// Sizes on and off the wgpu kernel's boundaries (64×64 tiles of C, 16
/// steps of k, 4×4 blocks, the second half of a tile from row and column
/// 32), each with both transposes and the epilogue with and without a bias,
/// every operand a range a few floats into its buffer.
pub fn gemm_off_every_tile_and_block_boundary_matches_the_cpu_kernel(device: Device) {
    let client = open(device);
    let mut rng = SplitMix64::new(5);
    // Floats before each operand in its buffer.
    const LEAD: usize = 3;
    let leaky = Activation::LeakyRelu {
        negative_slope: 0.1,
    };
    let epilogues = [
        (false, Activation::Identity),
        (true, leaky),
        (true, Activation::Sigmoid),
    ];
    let shapes = [
        (1, 1, 1),
        (65, 70, 17),
        (130, 67, 33),
        (7, 129, 64),
        (97, 33, 5),
        (64, 64, 16),
    ];
    for (m, n, k) in shapes {
        let (a, b, bias) = (
            rng.symmetric_f32s(LEAD + m * k),
            rng.symmetric_f32s(LEAD + k * n),
            rng.symmetric_f32s(LEAD + n),
        );
        let (da, db, dbias) = (
            upload(&client, &a),
            upload(&client, &b),
            upload(&client, &bias),
        );
        let c = zeros(&client, LEAD + m * n);
        let operand = |buffer: &Buffer, len: usize| buffer.range(4 * LEAD as u64, 4 * len as u64);
        for (transpose_a, transpose_b) in
            [(false, false), (false, true), (true, false), (true, true)]
        {
            for (with_bias, activation) in epilogues {
                let spec = GemmSpec {
                    m,
                    n,
                    k,
                    transpose_a,
                    transpose_b,
                    activation,
                };
                let host_bias = with_bias.then_some(&bias[LEAD..]);
                let mut want = vec![0.0; m * n];
                host(kernels::gemm(
                    &spec,
                    &a[LEAD..],
                    &b[LEAD..],
                    host_bias,
                    &mut want,
                ));
                let bound_bias = with_bias.then(|| operand(&dbias, n));
                let out = operand(&c, m * n);
                // An element the kernel misses stays NaN and fails the check.
                run(&client, KernelLaunch::fill(out, f32::NAN));
                let (da, db) = (operand(&da, m * k), operand(&db, k * n));
                run(&client, KernelLaunch::gemm(spec, da, db, bound_bias, out));
                let what = format!("{spec:?}");
                let all = download(&client, &c);
                assert_eq!(all[..LEAD], [0.0; LEAD], "{what}: wrote before C");
                let got = &all[LEAD..];
                let missed = got.iter().position(|v| v.is_nan());
                assert!(missed.is_none(), "{what}: C[{missed:?}] not written");
                assert_within(got, &want, cancelling_tolerance(device), &what);
            }
        }
    }
}

pub fn reductions_match_the_cpu_kernels(device: Device) {
    let client = open(device);
    let mut rng = SplitMix64::new(4);
    let (rows, cols) = (300, 7);
    let x = rng.symmetric_f32s(rows * cols);
    let dx = upload(&client, &x);
    let sums = zeros(&client, cols);
    let mut want = vec![0.0; cols];
    host(kernels::column_sum(&x, rows, cols, &mut want));
    run(
        &client,
        KernelLaunch::column_sum(dx.whole(), rows as u64, cols as u64, sums.whole()),
    );
    assert_close(&download(&client, &sums), &want, "column_sum");

    let target = rng.symmetric_f32s(rows * cols);
    let dt = upload(&client, &target);
    let loss = zeros(&client, 1);
    let want = host(kernels::mse_loss(&x, &target));
    run(
        &client,
        KernelLaunch::mse_loss(dx.whole(), dt.whole(), loss.whole()),
    );
    assert_close(&download(&client, &loss), &[want], "mse_loss");
    let grad = zeros(&client, rows * cols);
    let mut want = vec![0.0; rows * cols];
    host(kernels::mse_loss_backward(&x, &target, 0.5, &mut want));
    run(
        &client,
        KernelLaunch::mse_loss_backward(dx.whole(), dt.whole(), 0.5, grad.whole()),
    );
    assert_close(&download(&client, &grad), &want, "mse_loss_backward");

    let segments = vec![
        Segment::new(0, 5),
        Segment::new(5, 0),
        Segment::new(9, 1000),
        Segment::new(1500, 600),
    ];
    let out = zeros(&client, segments.len());
    let mut want = vec![0.0; segments.len()];
    host(kernels::segment_sum(&x, &segments, &mut want));
    run(
        &client,
        KernelLaunch::segment_sum(dx.whole(), segments.clone(), out.whole()),
    );
    assert_close(&download(&client, &out), &want, "segment_sum");
    host(kernels::segment_sum_squares(&x, &segments, &mut want));
    run(
        &client,
        KernelLaunch::segment_sum_squares(dx.whole(), segments, out.whole()),
    );
    assert_close(&download(&client, &out), &want, "segment_sum_squares");
}
