//! The maximum over one dimension on every device: the kernels against a
//! host reference (ties to the first maximum, NaNs to the first NaN, sizes
//! over many workgroups, the backward routed to the index), and the tape's
//! `max_dim` over every dimension, with and without `keepdim`, forward and
//! backward against finite differences.

use cistern::client::ComputeClient;
use cistern::kernels::MaxDimSpec;
use cistern::memory::SplitMix64;
use cistern::runtime::{Device, KernelLaunch};

use super::broadcast::{check_tape, values};
use super::common::{ok, open};
use super::optim_reference::download;

/// The maximum of each `outer×inner` position over `dim` and the first
/// index holding it (the first NaN, where there is one), in f64.
fn max_reference(x: &[f32], spec: &MaxDimSpec) -> Vec<(f64, i32)> {
    let (dim, inner) = (spec.dim as usize, spec.inner as usize);
    (0..(spec.outer as usize) * inner)
        .map(|j| {
            let at = |k: usize| f64::from(x[(j / inner) * dim * inner + k * inner + j % inner]);
            if let Some(k) = (0..dim).find(|&k| at(k).is_nan()) {
                return (f64::NAN, k as i32);
            }
            let best = (0..dim).map(at).fold(f64::NEG_INFINITY, f64::max);
            let first = (0..dim).find(|&k| at(k) == best).unwrap_or(0);
            (best, first as i32)
        })
        .collect()
}

/// The spec of a maximum over dimension `d` of `shape`.
fn spec_over(shape: &[usize], d: usize) -> MaxDimSpec {
    MaxDimSpec {
        outer: shape[..d].iter().product::<usize>() as u64,
        dim: shape[d] as u64,
        inner: shape[d + 1..].iter().product::<usize>() as u64,
    }
}

fn run(client: &ComputeClient, launch: KernelLaunch) {
    let what = launch.kernel.name();
    let token = ok(client.launch_tracked(client.default_stream(), launch), what);
    ok(token.wait(), what);
}

/// Values drawn from a few levels, so that most rows tie, with NaNs here
/// and there when `nans`.
fn tied_values(rng: &mut SplitMix64, n: usize, nans: bool) -> Vec<f32> {
    (0..n)
        .map(|_| match (rng.uniform(0.0, 1.0) * 40.0) as u32 {
            0 if nans => f32::NAN,
            level => (level % 5) as f32 - 2.0,
        })
        .collect()
}

pub fn max_dim_kernels_take_the_first_maximum_and_route_the_gradient_there(device: Device) {
    let client = open(device);
    let mut rng = SplitMix64::new(4402);
    let shapes = [(1, 4, 1), (3, 5, 2), (2, 1, 3), (300, 7, 33), (1, 2000, 1)];
    for (outer, dim, inner) in shapes {
        let spec = MaxDimSpec { outer, dim, inner };
        let n = (outer * dim * inner) as usize;
        let m = (outer * inner) as usize;
        for nans in [false, true] {
            let x = tied_values(&mut rng, n, nans);
            let dx = ok(client.upload_f32(&x), "upload");
            let dvalues = ok(client.upload_f32(&vec![7.0; m]), "upload");
            let dindices = ok(client.upload_f32(&vec![7.0; m]), "upload");
            let launch = KernelLaunch::max_dim(spec, dx.whole(), dvalues.whole(), dindices.whole());
            run(&client, launch);
            let (maxima, indices) = (download(&client, &dvalues), download(&client, &dindices));
            let want = max_reference(&x, &spec);
            for (j, &(value, index)) in want.iter().enumerate() {
                let got = (maxima[j], indices[j].to_bits() as i32);
                let same = match value.is_nan() {
                    true => got.0.is_nan(),
                    false => f64::from(got.0) == value,
                };
                assert!(
                    same && got.1 == index,
                    "{device}: max over {spec:?} (NaNs: {nans}), position {j}: \
                     {got:?}, want ({value}, {index})"
                );
            }
            let g = values(&mut rng, m);
            let dg = ok(client.upload_f32(&g), "upload");
            let dgrad = ok(client.upload_f32(&vec![7.0; n]), "upload");
            let launch =
                KernelLaunch::max_dim_backward(spec, dindices.whole(), dg.whole(), dgrad.whole());
            run(&client, launch);
            let grad = download(&client, &dgrad);
            for (i, &got) in grad.iter().enumerate() {
                let (d, inner) = (dim as usize, inner as usize);
                let (j, k) = ((i / (d * inner)) * inner + i % inner, (i / inner) % d);
                let want = if want[j].1 as usize == k { g[j] } else { 0.0 };
                assert_eq!(
                    got, want,
                    "{device}: max backward over {spec:?}, element {i}"
                );
            }
        }
    }
}

pub fn max_dim_on_the_tape_matches_finite_differences(device: Device) {
    let shape: &[usize] = &[2, 3, 4];
    for dim in [0isize, 1, 2, -1] {
        for keepdim in [false, true] {
            let spec = spec_over(shape, dim.rem_euclid(3) as usize);
            check_tape(
                device,
                &format!("max_dim {dim} keepdim {keepdim}"),
                &[shape],
                &[],
                |tape, v| tape.max_dim(&v[0], dim, keepdim),
                |x| {
                    let (dim, inner) = (spec.dim as usize, spec.inner as usize);
                    (0..(spec.outer as usize) * inner)
                        .map(|j| {
                            let first = (j / inner) * dim * inner + j % inner;
                            (0..dim)
                                .map(|k| x[0][first + k * inner])
                                .fold(f64::NEG_INFINITY, f64::max)
                        })
                        .collect()
                },
            );
        }
    }
}

/// `max_dim_with_indices` on the tape: PyTorch's `torch.max(x, dim)`
/// indices (the first of equals, the first NaN) in the values' shape, read
/// back as `i64`, over every dimension with and without `keepdim`.
pub fn max_dim_on_the_tape_returns_pytorchs_indices(device: Device) {
    use cistern::client::{Tape, Tensor};
    let client = open(device);
    let mut rng = SplitMix64::new(4403);
    let shape = [3usize, 4, 5];
    let x = tied_values(&mut rng, shape.iter().product(), true);
    for dim in [0isize, 1, -1] {
        for keepdim in [false, true] {
            let spec = spec_over(&shape, dim.rem_euclid(3) as usize);
            let tape = Tape::new(&client);
            let input = ok(tape.upload(&ok(Tensor::new(shape, x.clone()), "x")), "x");
            let found = tape.max_dim_with_indices(&input, dim, keepdim);
            let (values, indices) = ok(found, "max_dim_with_indices");
            assert_eq!(indices.shape(), values.shape().as_slice(), "{device}");
            let got = ok(indices.to_host(), "the indices");
            let want: Vec<i64> = max_reference(&x, &spec)
                .iter()
                .map(|&(_, index)| i64::from(index))
                .collect();
            assert_eq!(
                got, want,
                "{device}: indices over dim {dim} keepdim {keepdim}"
            );
        }
    }
}
