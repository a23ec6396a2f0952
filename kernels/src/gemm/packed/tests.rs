//! Every micro-kernel this CPU runs, each forced in turn (not only the one
//! `Micro::detect` picks), against an f64 reference: awkward sizes, sizes
//! off every tile and block boundary of every kernel, every transpose, the
//! fused epilogue, and NaN and infinity propagation.

use cistern_memory::SplitMix64;

#[path = "../../../tests/common/gemm_reference.rs"]
mod gemm_reference;
use gemm_reference::reference;

use super::pack::{Operand, pack, packed_len};
use super::shared::LazyA;
use super::simd::{AVX2_MR, AVX2_NR, AVX512_MR, AVX512_NR, Micro};
use super::{AVX2_BLOCKING, AVX512_BLOCKING, product_on, shares_a_packed_operand};
use crate::gemm::GemmSpec;
use crate::gemm::kernel::Strides;
use crate::{Activation, erfc};

const TRANSPOSES: [(bool, bool); 4] = [(false, false), (true, false), (false, true), (true, true)];

fn spec(m: usize, n: usize, k: usize, (transpose_a, transpose_b): (bool, bool)) -> GemmSpec {
    GemmSpec {
        m,
        n,
        k,
        transpose_a,
        transpose_b,
        activation: Activation::Identity,
    }
}

/// Runs `micro` with C starting as NaN (so a kernel that reads C before
/// writing it fails) and compares every element with the reference; NaN
/// and infinite references must come out NaN and the same infinity.
fn check(micro: Micro, spec: &GemmSpec, a: &[f32], b: &[f32], bias: Option<&[f32]>) {
    let mut c = vec![f32::NAN; spec.m * spec.n];
    product_on(micro, spec, &Strides::of(spec), a, b, bias, &mut c);
    for (index, (&got, &(want, magnitude))) in
        c.iter().zip(&reference(spec, a, b, bias)).enumerate()
    {
        let at = (index / spec.n, index % spec.n);
        let ok = if want.is_nan() {
            got.is_nan()
        } else if want.is_infinite() {
            f64::from(got) == want
        } else {
            (f64::from(got) - want).abs() <= 1e-5 * (magnitude + 1.0)
        };
        assert!(
            ok,
            "{micro:?} {spec:?} bias={} at {at:?}: {got} vs {want}",
            bias.is_some()
        );
    }
}

fn check_random(micro: Micro, spec: &GemmSpec, with_bias: bool, rng: &mut SplitMix64) {
    let a = rng.symmetric_f32s(spec.m * spec.k);
    let b = rng.symmetric_f32s(spec.k * spec.n);
    let bias = rng.symmetric_f32s(spec.n);
    check(micro, spec, &a, &b, with_bias.then_some(&bias[..]));
}

/// One under, on and over `size`, and twice it plus one.
fn around(size: usize) -> [usize; 4] {
    [size - 1, size, size + 1, 2 * size + 1]
}

#[test]
fn every_micro_kernel_on_this_cpu_matches_the_reference_at_awkward_sizes_and_primes() {
    let mut rng = SplitMix64::new(41);
    let shapes = [
        (1, 1, 1),
        (1, 1, 2),
        (2, 3, 1),
        (3, 5, 7),
        (7, 11, 13),
        (17, 1, 19),
        (1, 23, 29),
        (37, 41, 43),
    ];
    for micro in Micro::available() {
        for (m, n, k) in shapes {
            for transposes in TRANSPOSES {
                check_random(micro, &spec(m, n, k, transposes), false, &mut rng);
            }
        }
    }
}

#[test]
fn every_micro_kernel_on_this_cpu_matches_the_reference_off_every_tile_boundary() {
    let mut rng = SplitMix64::new(42);
    for micro in Micro::available() {
        for mr in [AVX2_MR, AVX512_MR] {
            for nr in [AVX2_NR, AVX512_NR] {
                for (m, n) in around(mr).into_iter().zip(around(nr)) {
                    // k off the packing's 16-step transposes too.
                    for k in [5, 16, 17] {
                        for transposes in TRANSPOSES {
                            check_random(micro, &spec(m, n, k, transposes), false, &mut rng);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn every_micro_kernel_on_this_cpu_matches_the_reference_off_every_block_boundary() {
    let mut rng = SplitMix64::new(43);
    for micro in Micro::available() {
        for blocking in [AVX2_BLOCKING, AVX512_BLOCKING] {
            // Rows around mc with k around kc, then columns around nc.
            let shapes = [
                (blocking.mc - 1, 9, blocking.kc + 1),
                (blocking.mc + 1, 17, blocking.kc - 1),
                (blocking.mc, 33, 2 * blocking.kc + 3),
                (3, blocking.nc + 1, 19),
                (7, blocking.nc - 1, blocking.kc + 1),
            ];
            for (m, n, k) in shapes {
                for transposes in TRANSPOSES {
                    check_random(micro, &spec(m, n, k, transposes), false, &mut rng);
                }
            }
        }
    }
}

#[test]
fn every_micro_kernel_on_this_cpu_fuses_bias_and_activation_on_the_last_k_block_only() {
    let mut rng = SplitMix64::new(44);
    for micro in Micro::available() {
        for activation in [Activation::Identity, Activation::Relu, Activation::Tanh] {
            // k past one block, so an epilogue run early would be re-added.
            for (m, n, k) in [(13, 35, 300), (29, 70, 17)] {
                for transposes in TRANSPOSES {
                    for with_bias in [false, true] {
                        let spec = GemmSpec {
                            activation,
                            ..spec(m, n, k, transposes)
                        };
                        check_random(micro, &spec, with_bias, &mut rng);
                    }
                }
            }
        }
    }
}

#[test]
fn every_micro_kernel_on_this_cpu_propagates_nan_and_infinity_to_the_elements_they_touch() {
    let mut rng = SplitMix64::new(45);
    // Over more than one tile and k block of every kernel.
    let (m, n, k) = (31, 37, 263);
    for micro in Micro::available() {
        for transposes in TRANSPOSES {
            let spec = spec(m, n, k, transposes);
            let mut a = rng.symmetric_f32s(m * k);
            let mut b = rng.symmetric_f32s(k * n);
            // Storage positions: each lands on some (row, step) or
            // (step, column) whatever the transpose.
            a[5 * k + 3] = f32::NAN;
            a[k * (m - 1) + 260] = f32::INFINITY;
            b[17] = f32::INFINITY;
            b[7 * n + 2] = f32::NEG_INFINITY;
            b[k * n - 1] = f32::NAN;
            let bias = rng.symmetric_f32s(n);
            let want = reference(&spec, &a, &b, Some(&bias));
            assert!(want.iter().any(|w| w.0.is_nan()) && want.iter().any(|w| w.0.is_infinite()));
            check(micro, &spec, &a, &b, Some(&bias));
        }
    }
}

#[test]
fn every_micro_kernel_on_this_cpu_matches_the_reference_when_its_tasks_share_a_packed_operand() {
    let mut rng = SplitMix64::new(46);
    // Split by columns (op(A) shared) and by rows (op(B) shared), with the
    // shared lanes, k and the tasks' shares all off the tile boundaries.
    let shapes = [
        (131, 523, 257),
        (523, 131, 257),
        (97, 389, 223),
        (389, 97, 223),
    ];
    for threads in [2, 3] {
        let pool = match rayon::ThreadPoolBuilder::new().num_threads(threads).build() {
            Ok(pool) => pool,
            Err(error) => panic!("a pool of {threads} threads: {error}"),
        };
        pool.install(|| {
            for micro in Micro::available() {
                for (m, n, k) in shapes {
                    for transposes in TRANSPOSES {
                        let spec = GemmSpec {
                            activation: Activation::Relu,
                            ..spec(m, n, k, transposes)
                        };
                        assert!(shares_a_packed_operand(micro, &spec), "{spec:?}");
                        check_random(micro, &spec, true, &mut rng);
                    }
                }
            }
        });
    }
}

#[test]
fn the_detected_micro_kernel_is_the_widest_this_cpu_runs() {
    let available = Micro::available();
    assert_eq!(Micro::detect(), available[0]);
    assert_eq!(available.last(), Some(&Micro::Portable));
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        assert!(available.contains(&Micro::Avx2Fma));
    }
}

/// `pack`'s result written element by element: panel after panel of `W`
/// lanes by the block's steps, zero past the last lane.
fn packed_by_hand<const W: usize>(
    src: &Operand,
    lanes: std::ops::Range<usize>,
    steps: std::ops::Range<usize>,
) -> Vec<f32> {
    let mut packed = vec![];
    for first in lanes.clone().step_by(W) {
        for step in steps.clone() {
            for lane in first..first + W {
                packed.push(if lane < lanes.end {
                    src.data[src.at + lane * src.lane_stride + step * src.step_stride]
                } else {
                    0.0
                });
            }
        }
    }
    packed
}

/// Packs with every micro-kernel's packing into a buffer full of NaN and
/// compares each element with [`packed_by_hand`].
fn check_packing<const W: usize>(lanes: usize, steps: usize, steps_adjacent: bool) {
    let total = (lanes + 3) * (steps + 5);
    let data: Vec<f32> = (0..total).map(|i| i as f32 + 1.0).collect();
    let (lane_stride, step_stride) = if steps_adjacent {
        (steps + 5, 1)
    } else {
        (1, lanes + 3)
    };
    let src = Operand {
        data: &data,
        at: 2,
        lane_stride,
        step_stride,
    };
    let (lanes, steps) = (1..1 + lanes, 3..3 + steps);
    let want = packed_by_hand::<W>(&src, lanes.clone(), steps.clone());
    for micro in Micro::available() {
        let mut got = vec![f32::NAN; packed_len::<W>(lanes.len(), steps.len())];
        pack::<W>(micro, &src, lanes.clone(), steps.clone(), &mut got);
        assert_eq!(got.len(), want.len());
        for (index, (&got, &want)) in got.iter().zip(&want).enumerate() {
            assert!(
                got == want,
                "{micro:?} W={W} {lanes:?}×{steps:?} adjacent={steps_adjacent} at {index}: {got} vs {want}"
            );
        }
    }
}

#[test]
fn packing_writes_every_lane_of_every_step_once_for_each_tile_width_and_layout() {
    for steps in [1, 15, 16, 17, 31, 32, 33, 48, 100] {
        // A lanes-contiguous block is copied in groups of whole panels of
        // up to 128 lanes: sizes off every group's boundary too.
        let groups = [111, 112, 126, 127, 128, 129, 140, 257, 300];
        for lanes in [1, 5, 6, 7, 12, 13, 14, 15, 16, 17, 31, 32, 33]
            .into_iter()
            .chain(groups)
        {
            for adjacent in [true, false] {
                check_packing::<AVX2_MR>(lanes, steps, adjacent);
                check_packing::<AVX2_NR>(lanes, steps, adjacent);
                check_packing::<AVX512_MR>(lanes, steps, adjacent);
                check_packing::<AVX512_NR>(lanes, steps, adjacent);
            }
        }
    }
}

#[test]
fn a_lazily_shared_operand_reads_the_same_in_whatever_order_its_tasks_reach_its_blocks() {
    const W: usize = AVX2_MR;
    let mut rng = SplitMix64::new(49);
    for micro in Micro::available() {
        // Rows and steps off the blocks; steps adjacent (A) and lanes
        // adjacent (a transposed A).
        for (rows, k, steps_adjacent) in [(131, 257, true), (97, 61, false)] {
            let data = rng.symmetric_f32s(rows * k);
            let (lane_stride, step_stride) = if steps_adjacent { (k, 1) } else { (1, rows) };
            let source = Operand {
                data: &data,
                at: 0,
                lane_stride,
                step_stride,
            };
            let (mc, kc) = (4 * W, 64);
            let mut buffer = vec![f32::NAN; packed_len::<W>(rows, k)];
            let lazy = LazyA::new::<W>(micro, &source, (rows, k), (mc, kc), &mut buffer);
            let blocks: Vec<(usize, usize)> = (0..k)
                .step_by(kc)
                .flat_map(|pc| (0..rows).step_by(mc).map(move |ic| (ic, pc)))
                .collect();
            // Three tasks at once, each from its own start, as a split's do.
            std::thread::scope(|scope| {
                for task in 0..3 {
                    let (lazy, blocks, source) = (&lazy, &blocks, &source);
                    scope.spawn(move || {
                        let count = blocks.len();
                        for turn in 0..count {
                            let (ic, pc) = blocks[(task * count / 3 + turn) % count];
                            let (mc, kc) = (mc.min(rows - ic), kc.min(k - pc));
                            let mut want = vec![0.0; packed_len::<W>(mc, kc)];
                            pack::<W>(micro, source, ic..ic + mc, pc..pc + kc, &mut want);
                            let got = lazy.block::<W>(ic, pc);
                            assert!(
                                got.iter()
                                    .zip(&want)
                                    .all(|(g, w)| g.to_bits() == w.to_bits()),
                                "{micro:?} block ({ic}, {pc}) of {rows}x{k}"
                            );
                        }
                    });
                }
            });
        }
    }
}
