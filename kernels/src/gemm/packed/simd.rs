//! The unsafe core of the packed GEMM: C's block as a raw pointer, the
//! micro-kernels that multiply one packed micro-panel of A by one of B into
//! a tile of it, and the vector copies and transposes that pack them.
//!
//! Every other part of the packed GEMM is safe code over slices. Here the
//! micro-panels arrive as slices whose lengths are checked against the
//! tile (a packing's source and panel against its steps), and every store
//! to C goes through [`Out`], whose bounds are checked per tile: no load or
//! store leaves a buffer, and edge columns are loaded and stored under a
//! mask (AVX-512) or lane by lane (AVX2).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::{
    __m256, __m256i, __m512, __mmask16, _mm256_add_ps, _mm256_broadcast_ss, _mm256_fmadd_ps,
    _mm256_loadu_ps, _mm256_maskstore_ps, _mm256_setr_epi32, _mm256_setzero_ps, _mm256_storeu_ps,
    _mm512_add_ps, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_mask_storeu_ps, _mm512_maskz_loadu_ps,
    _mm512_set1_ps, _mm512_setzero_ps,
};

/// Rows of the AVX-512 kernel's tile (one broadcast of A each).
pub(super) const AVX512_MR: usize = 14;
/// Columns of the AVX-512 kernel's tile (two 16-lane vectors).
pub(super) const AVX512_NR: usize = 32;
/// How many k steps ahead the AVX-512 kernel fetches B into L1.
const B_AHEAD: usize = 16;
/// Rows of the AVX2 + FMA kernel's tile: 6×16 in 12 accumulators, 2 B
/// vectors and a broadcast (15 of the 16 `ymm` registers).
pub(super) const AVX2_MR: usize = 6;
/// Columns of the AVX2 + FMA kernel's tile (two 8-lane vectors).
pub(super) const AVX2_NR: usize = 16;

/// Which micro-kernel a product runs, detected once per product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Micro {
    /// `AVX512_MR`×`AVX512_NR` tiles in 28 AVX-512 accumulators
    /// (`avx512f`).
    Avx512,
    /// `AVX2_MR`×`AVX2_NR` tiles in 12 AVX accumulators (`avx2` and
    /// `fma`).
    Avx2Fma,
    /// Tiles of any size in plain Rust, for every other CPU.
    Portable,
}

impl Micro {
    /// The widest micro-kernel this CPU runs.
    pub(super) fn detect() -> Micro {
        Micro::available()[0]
    }

    /// Every micro-kernel this CPU runs, widest first (the portable one
    /// last): for tests that must cover each, not only the detected one.
    pub(super) fn available() -> Vec<Micro> {
        let mut micros = Vec::with_capacity(3);
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                micros.push(Micro::Avx512);
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                micros.push(Micro::Avx2Fma);
            }
        }
        micros.push(Micro::Portable);
        micros
    }
}

/// One task's block of C: `rows`×`cols` elements at row stride `ldc`,
/// written by this task alone.
pub(super) struct Out {
    ptr: *mut f32,
    rows: usize,
    cols: usize,
    ldc: usize,
}

impl Out {
    /// # Safety
    /// `ptr` must be valid for reads and writes of `rows` rows of `cols`
    /// elements, `ldc` apart (`cols ≤ ldc`), and nothing else may read or
    /// write those elements while the `Out` lives.
    pub(super) unsafe fn new(ptr: *mut f32, rows: usize, cols: usize, ldc: usize) -> Out {
        debug_assert!(cols <= ldc);
        Out {
            ptr,
            rows,
            cols,
            ldc,
        }
    }

    /// `len` elements of row `row` from column `col`.
    pub(super) fn row_mut(&mut self, row: usize, col: usize, len: usize) -> &mut [f32] {
        assert!(row < self.rows && col + len <= self.cols);
        // SAFETY: the range lies in the block (asserted above), which `new`'s
        // caller guarantees is valid and ours alone; `&mut self` keeps this
        // the only live slice into it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(row * self.ldc + col), len) }
    }
}

/// A tile of C: `rows` (1..=`MR`) × `cols` (1..=`NR`) from (`row`, `col`)
/// of the block, the product of `kc` steps of packed A (`MR` per step) and
/// packed B (`NR` per step), `MR`×`NR` being the micro-kernel's tile. Adds
/// to C when `accumulate`, else overwrites it without reading it.
pub(super) struct Tile {
    pub row: usize,
    pub col: usize,
    pub rows: usize,
    pub cols: usize,
    pub kc: usize,
    pub accumulate: bool,
}

/// Computes `tile` of `out` from the packed micro-panels `a` and `b`, on
/// `micro` at its own tile size (`MR`×`NR`, which the portable kernel
/// takes as given).
pub(super) fn tile<const MR: usize, const NR: usize>(
    micro: Micro,
    out: &mut Out,
    tile: &Tile,
    a: &[f32],
    b: &[f32],
) {
    assert!((1..=MR).contains(&tile.rows) && (1..=NR).contains(&tile.cols));
    assert!(a.len() >= tile.kc * MR && b.len() >= tile.kc * NR);
    assert!(tile.row + tile.rows <= out.rows && tile.col + tile.cols <= out.cols);
    match micro {
        #[cfg(target_arch = "x86_64")]
        Micro::Avx512 => {
            assert!(MR == AVX512_MR && NR == AVX512_NR);
            avx512_rows(out, tile, a, b);
        }
        #[cfg(target_arch = "x86_64")]
        Micro::Avx2Fma => {
            assert!(MR == AVX2_MR && NR == AVX2_NR);
            avx2_rows(out, tile, a, b);
        }
        _ => portable::<MR, NR>(out, tile, a, b),
    }
}

fn portable<const MR: usize, const NR: usize>(out: &mut Out, tile: &Tile, a: &[f32], b: &[f32]) {
    let mut acc = [[0.0f32; NR]; MR];
    for (a_step, b_step) in a.chunks_exact(MR).zip(b.chunks_exact(NR)).take(tile.kc) {
        for (acc_row, &x) in acc.iter_mut().zip(a_step) {
            for (sum, &y) in acc_row.iter_mut().zip(b_step) {
                *sum += x * y;
            }
        }
    }
    for (r, acc_row) in acc.iter().enumerate().take(tile.rows) {
        let dst = out.row_mut(tile.row + r, tile.col, tile.cols);
        for (d, &sum) in dst.iter_mut().zip(acc_row) {
            *d = if tile.accumulate { *d + sum } else { sum };
        }
    }
}

/// Dispatches to the AVX-512 kernel compiled for the tile's row count and
/// for its width: a tile of 16 columns or fewer (C's right edge) runs one
/// vector per row, not two of which one is masked off whole.
#[cfg(target_arch = "x86_64")]
fn avx512_rows(out: &mut Out, tile: &Tile, a: &[f32], b: &[f32]) {
    if tile.cols <= 16 {
        avx512_rows_of::<1>(out, tile, a, b);
    } else {
        avx512_rows_of::<2>(out, tile, a, b);
    }
}

/// [`avx512_rows`] for tiles of `HALVES` 16-lane vectors per row.
#[cfg(target_arch = "x86_64")]
fn avx512_rows_of<const HALVES: usize>(out: &mut Out, tile: &Tile, a: &[f32], b: &[f32]) {
    debug_assert!(tile.rows <= AVX512_MR && AVX512_MR == 14);
    match tile.rows {
        14 => avx512_call::<14, HALVES>(out, tile, a, b),
        13 => avx512_call::<13, HALVES>(out, tile, a, b),
        12 => avx512_call::<12, HALVES>(out, tile, a, b),
        11 => avx512_call::<11, HALVES>(out, tile, a, b),
        10 => avx512_call::<10, HALVES>(out, tile, a, b),
        9 => avx512_call::<9, HALVES>(out, tile, a, b),
        8 => avx512_call::<8, HALVES>(out, tile, a, b),
        7 => avx512_call::<7, HALVES>(out, tile, a, b),
        6 => avx512_call::<6, HALVES>(out, tile, a, b),
        5 => avx512_call::<5, HALVES>(out, tile, a, b),
        4 => avx512_call::<4, HALVES>(out, tile, a, b),
        3 => avx512_call::<3, HALVES>(out, tile, a, b),
        2 => avx512_call::<2, HALVES>(out, tile, a, b),
        _ => avx512_call::<1, HALVES>(out, tile, a, b),
    }
}

#[cfg(target_arch = "x86_64")]
fn avx512_call<const ROWS: usize, const HALVES: usize>(
    out: &mut Out,
    tile: &Tile,
    a: &[f32],
    b: &[f32],
) {
    debug_assert!(ROWS == tile.rows && tile.cols <= HALVES * 16);
    let offset = tile.row * out.ldc + tile.col;
    // SAFETY: `Micro::Avx512` is only detected where `avx512f` is present.
    // `tile` checked that the panels hold `kc` steps (the kernel reads
    // `ROWS ≤ MR` of each A step and `HALVES · 16 ≤ NR` of each B step)
    // and that the tile's rows and `cols` columns lie in the block, which
    // is valid and ours alone (`Out::new`); columns past `cols` are masked
    // off.
    unsafe {
        avx512::<ROWS, HALVES>(
            tile.kc,
            a.as_ptr(),
            b.as_ptr(),
            out.ptr.add(offset),
            out.ldc,
            tile.cols,
            tile.accumulate,
        );
    }
}

/// Dispatches to the AVX2 + FMA kernel compiled for the tile's row count.
#[cfg(target_arch = "x86_64")]
fn avx2_rows(out: &mut Out, tile: &Tile, a: &[f32], b: &[f32]) {
    debug_assert!(tile.rows <= AVX2_MR && AVX2_MR == 6);
    match tile.rows {
        6 => avx2_call::<6>(out, tile, a, b),
        5 => avx2_call::<5>(out, tile, a, b),
        4 => avx2_call::<4>(out, tile, a, b),
        3 => avx2_call::<3>(out, tile, a, b),
        2 => avx2_call::<2>(out, tile, a, b),
        _ => avx2_call::<1>(out, tile, a, b),
    }
}

#[cfg(target_arch = "x86_64")]
fn avx2_call<const ROWS: usize>(out: &mut Out, tile: &Tile, a: &[f32], b: &[f32]) {
    debug_assert!(ROWS == tile.rows);
    let offset = tile.row * out.ldc + tile.col;
    // SAFETY: `Micro::Avx2Fma` is only detected where `avx2` and `fma` are
    // present. `tile` checked that the panels hold `kc` steps (the kernel
    // reads `ROWS ≤ AVX2_MR` of each A step and `AVX2_NR` of each B step)
    // and that the tile's rows and `cols` columns lie in the block, which
    // is valid and ours alone (`Out::new`); columns past `cols` are masked
    // off.
    unsafe {
        avx2::<ROWS>(
            tile.kc,
            a.as_ptr(),
            b.as_ptr(),
            out.ptr.add(offset),
            out.ldc,
            tile.cols,
            tile.accumulate,
        );
    }
}

/// The mask of the first `n` lanes of an 8-lane vector (all of them for
/// `n ≥ 8`, none for 0): lanes whose index is below `n` have the sign bit
/// set, as `_mm256_maskload_ps` and `_mm256_maskstore_ps` read it.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn first_lanes_256(n: usize) -> __m256i {
    use std::arch::x86_64::{_mm256_cmpgt_epi32, _mm256_set1_epi32};
    let n = n.min(8) as i32;
    _mm256_cmpgt_epi32(
        _mm256_set1_epi32(n),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    )
}

/// `ROWS`×16 tile: two 8-lane accumulators per row, A broadcast from its
/// packed step, B loaded as two vectors per step.
///
/// # Safety
/// The CPU has `avx2` and `fma`; `a` holds `kc·AVX2_MR` and `b`
/// `kc·AVX2_NR` readable floats; `c` is valid for reads and writes of
/// `ROWS` rows of `cols` (1..=16) elements, `ldc` apart.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2<const ROWS: usize>(
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    cols: usize,
    accumulate: bool,
) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    // C's rows are 4 KiB apart at n = 1024, each a likely miss: ask for
    // them now so that they arrive during the k loop.
    for r in 0..ROWS {
        _mm_prefetch::<_MM_HINT_T0>(c.wrapping_add(r * ldc).cast());
        _mm_prefetch::<_MM_HINT_T0>(c.wrapping_add(r * ldc + cols - 1).cast());
    }
    let mut acc: [[__m256; 2]; ROWS] = [[_mm256_setzero_ps(); 2]; ROWS];
    let step = |acc: &mut [[__m256; 2]; ROWS], step: usize| {
        // SAFETY: `step < kc` (the callers below), so the step's AVX2_NR
        // floats of B and its AVX2_MR floats of A (ROWS ≤ AVX2_MR read)
        // lie in the panels.
        let (a_step, b0, b1) = unsafe {
            let b_step = b.add(step * AVX2_NR);
            (
                a.add(step * AVX2_MR),
                _mm256_loadu_ps(b_step),
                _mm256_loadu_ps(b_step.add(8)),
            )
        };
        for (r, acc_row) in acc.iter_mut().enumerate() {
            // SAFETY: r < ROWS ≤ AVX2_MR, inside the step (above).
            let x = _mm256_broadcast_ss(unsafe { &*a_step.add(r) });
            acc_row[0] = _mm256_fmadd_ps(x, b0, acc_row[0]);
            acc_row[1] = _mm256_fmadd_ps(x, b1, acc_row[1]);
        }
    };
    // Four steps per iteration, so the loop's own instructions are a
    // smaller share of the front end's.
    let whole = kc / 4 * 4;
    for first in (0..whole).step_by(4) {
        step(&mut acc, first);
        step(&mut acc, first + 1);
        step(&mut acc, first + 2);
        step(&mut acc, first + 3);
    }
    for last in whole..kc {
        step(&mut acc, last);
    }
    // Whole halves as one store each; a partial half (an edge tile) lane
    // by lane through a buffer: a `vmaskmovps` with a partial mask costs
    // several plain stores on AMD, and every tile of a narrow C is an edge
    // tile.
    for (r, acc_row) in acc.iter().enumerate() {
        for (half, &sum) in acc_row.iter().enumerate() {
            let first = half * 8;
            if first >= cols {
                continue;
            }
            let live = (cols - first).min(8);
            // SAFETY: row r < ROWS of C, and its lanes `first..first + live`
            // lie before `cols`; only those are read and written.
            unsafe {
                let dst = c.add(r * ldc + first);
                if live == 8 {
                    let sum = if accumulate {
                        _mm256_add_ps(sum, _mm256_loadu_ps(dst))
                    } else {
                        sum
                    };
                    _mm256_storeu_ps(dst, sum);
                    continue;
                }
                let mut lanes = [0.0f32; 8];
                _mm256_storeu_ps(lanes.as_mut_ptr(), sum);
                for (lane, &value) in lanes.iter().enumerate().take(live) {
                    let at = dst.add(lane);
                    *at = if accumulate { *at + value } else { value };
                }
            }
        }
    }
}

/// The mask of the first `n` (0..=16) lanes.
#[cfg(target_arch = "x86_64")]
fn first_lanes(n: usize) -> __mmask16 {
    ((1u32 << n.min(16)) - 1) as __mmask16
}

/// `ROWS`×`16·HALVES` tile: `HALVES` (1 or 2) 16-lane accumulators per
/// row, A broadcast from its packed step, B loaded as that many vectors
/// per step.
///
/// # Safety
/// The CPU has `avx512f`; `a` holds `kc·AVX512_MR` and `b` `kc·AVX512_NR` readable
/// floats; `c` is valid for reads and writes of `ROWS` rows of `cols`
/// (1..=`16·HALVES`) elements, `ldc` apart.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn avx512<const ROWS: usize, const HALVES: usize>(
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    cols: usize,
    accumulate: bool,
) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    debug_assert!((1..=2).contains(&HALVES) && cols <= 16 * HALVES);
    // The tile of C is read or written after the k loop: ask for its lines
    // now, so that they arrive during it.
    for r in 0..ROWS {
        _mm_prefetch::<_MM_HINT_T0>(c.wrapping_add(r * ldc).cast());
        _mm_prefetch::<_MM_HINT_T0>(c.wrapping_add(r * ldc + cols - 1).cast());
    }
    let mut acc: [[__m512; HALVES]; ROWS] = [[_mm512_setzero_ps(); HALVES]; ROWS];
    for step in 0..kc {
        // B streams from L2 (the A panel is the one kept in L1): fetch the
        // lines this tile reads `B_AHEAD` steps ahead, past the panel's end
        // into the next panel, which the next tile reads. A prefetch never
        // faults.
        let ahead = b.wrapping_add((step + B_AHEAD) * AVX512_NR);
        for half in 0..HALVES {
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(16 * half).cast());
        }
        // SAFETY: `step < kc`, so the step's AVX512_NR floats of B (of
        // which `HALVES · 16` are read) and its AVX512_MR floats of A
        // (ROWS ≤ AVX512_MR read) lie in the panels.
        let (a_step, b_step) = unsafe {
            let b_at = b.add(step * AVX512_NR);
            let mut b_step = [_mm512_setzero_ps(); HALVES];
            for (half, vector) in b_step.iter_mut().enumerate() {
                *vector = _mm512_loadu_ps(b_at.add(16 * half));
            }
            (a.add(step * AVX512_MR), b_step)
        };
        for (r, acc_row) in acc.iter_mut().enumerate() {
            // SAFETY: r < ROWS ≤ AVX512_MR, inside the step (above).
            let x = _mm512_set1_ps(unsafe { *a_step.add(r) });
            for (sum, &y) in acc_row.iter_mut().zip(&b_step) {
                *sum = _mm512_fmadd_ps(x, y, *sum);
            }
        }
    }
    let masks = [first_lanes(cols), first_lanes(cols.saturating_sub(16))];
    for (r, acc_row) in acc.iter().enumerate() {
        for (half, (&sum, &mask)) in acc_row.iter().zip(&masks).enumerate() {
            if mask == 0 {
                continue;
            }
            // SAFETY: row r < ROWS of C, and its lanes from `half·16` start
            // before `cols` (the mask is not empty); the mask keeps the lanes
            // at or past `cols` from being loaded or stored, and masked-off
            // lanes of AVX-512 loads and stores never touch memory.
            unsafe {
                let dst = c.add(r * ldc + half * 16);
                let sum = if accumulate {
                    _mm512_add_ps(sum, _mm512_maskz_loadu_ps(mask, dst))
                } else {
                    sum
                };
                _mm512_mask_storeu_ps(dst, mask, sum);
            }
        }
    }
}

/// Copies `steps` steps of `lanes` lanes adjacent in the source into
/// packed panels of `W` lanes, `lanes.div_ceil(W)` of them one after
/// another: for `s < steps` and `l < lanes`, panel `l / W` holds
/// `src[s·step_stride + l]` at `s·W + l mod W`, and zero at the lanes
/// of the last panel past `lanes`. Step by step across every panel, so
/// that each step's source is read once, front to back. On AVX-512 each
/// panel's step is one or two masked vector copies: the source lanes
/// past `lanes` are never read. Elsewhere a copy of a constant length
/// per panel and step (`W` floats through a `memmove` call cost more
/// than the copy).
pub(super) fn copy_steps<const W: usize>(
    micro: Micro,
    (src, step_stride, lanes): (&[f32], usize, usize),
    steps: usize,
    dst: &mut [f32],
) {
    assert!(lanes >= 1 && W <= 32);
    if steps == 0 {
        return;
    }
    let panels = lanes.div_ceil(W);
    assert!(src.len() >= (steps - 1) * step_stride + lanes);
    assert!(dst.len() >= panels * steps * W);
    match micro {
        // SAFETY: `avx512f` was detected; every step's `lanes` floats lie
        // in `src` and every panel's `steps · W` in `dst` (asserted above).
        #[cfg(target_arch = "x86_64")]
        Micro::Avx512 => unsafe {
            copy_avx512::<W>((src.as_ptr(), step_stride, lanes), steps, dst.as_mut_ptr());
        },
        _ => {
            for step in 0..steps {
                let from = &src[step * step_stride..];
                for panel in 0..panels {
                    let from = &from[panel * W..];
                    let to = &mut dst[(panel * steps + step) * W..][..W];
                    let count = W.min(lanes - panel * W);
                    if count == W {
                        to.copy_from_slice(&from[..W]);
                    } else {
                        to[..count].copy_from_slice(&from[..count]);
                        to[count..].fill(0.0);
                    }
                }
            }
        }
    }
}

/// [`copy_steps`] as masked AVX-512 loads and stores, at most two 16-lane
/// vectors per panel and step. Copying 1 MiB of a lanes-contiguous
/// operand this way took 25–30 % less time than `copy_from_slice`, which
/// the baseline target compiles to 16-byte moves.
///
/// # Safety
/// On a CPU with `avx512f`: `src` holds `lanes` floats at every
/// `s·step_stride`, and `dst` `lanes.div_ceil(W)` panels of `steps · W`
/// floats, `s < steps`, `W ≤ 32`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn copy_avx512<const W: usize>(
    (src, step_stride, lanes): (*const f32, usize, usize),
    steps: usize,
    dst: *mut f32,
) {
    let panels = lanes.div_ceil(W);
    let last = lanes - (panels - 1) * W;
    let whole = [first_lanes(W), first_lanes(W.saturating_sub(16))];
    let edge = [first_lanes(last), first_lanes(last.saturating_sub(16))];
    for step in 0..steps {
        let from = src.wrapping_add(step * step_stride);
        for panel in 0..panels {
            let load = if panel + 1 == panels { edge } else { whole };
            let (from, to) = (
                from.wrapping_add(panel * W),
                dst.wrapping_add((panel * steps + step) * W),
            );
            for half in 0..W.div_ceil(16) {
                // SAFETY: the load mask keeps the lanes past `lanes` from
                // being read (a masked-off lane touches no memory, so the
                // second half's address may lie past `src`); the store
                // mask writes the panel's step of `W` floats, inside `dst`.
                unsafe {
                    let values = _mm512_maskz_loadu_ps(load[half], from.wrapping_add(16 * half));
                    _mm512_mask_storeu_ps(to.wrapping_add(16 * half), whole[half], values);
                }
            }
        }
    }
}

/// Transposes `steps` (a multiple of 16) steps of `count` (1..=16) lanes
/// into a packed panel: for `s < steps` and `l < width`, `dst[s·stride + l]
/// = src[l·lane_stride + s]`, zero for `l ≥ count`. Lanes past `width` are
/// left untouched, except that where `width == stride < 8` the first
/// lanes of step `steps` (the next step the packing writes) may be
/// overwritten, when `dst` holds them.
pub(super) fn transpose_steps(
    micro: Micro,
    (src, lane_stride, count): (&[f32], usize, usize),
    steps: usize,
    (dst, stride, width): (&mut [f32], usize, usize),
) {
    assert!((1..=width).contains(&count) && width <= 16 && width <= stride);
    assert!(steps.is_multiple_of(16));
    if steps == 0 {
        return;
    }
    assert!(src.len() >= (count - 1) * lane_stride + steps);
    assert!(dst.len() >= (steps - 1) * stride + width);
    match micro {
        // SAFETY: `avx512f` was detected; the lanes hold `steps` floats
        // each and `dst` the `steps` rows of `width` written (asserted
        // above).
        #[cfg(target_arch = "x86_64")]
        Micro::Avx512 => unsafe {
            let panel = (dst.as_mut_ptr(), stride, width);
            transpose_avx512(src.as_ptr(), (lane_stride, count), steps, panel);
        },
        #[cfg(target_arch = "x86_64")]
        Micro::Avx2Fma => {
            let mut lanes: [&[f32]; 16] = [&[]; 16];
            for (l, lane) in lanes.iter_mut().enumerate().take(count) {
                *lane = &src[l * lane_stride..];
            }
            let lanes = &lanes[..count];
            for from in (0..steps).step_by(16) {
                let dst = &mut dst[from * stride..];
                let len = dst.len();
                // SAFETY: `avx2` was detected; every lane holds 16 floats
                // from `from` and `dst` the 16 rows of `width` written
                // (asserted above).
                unsafe { transpose_avx2(lanes, from, width, (dst.as_mut_ptr(), len), stride) };
            }
        }
        _ => {
            for s in 0..steps {
                for l in 0..width {
                    dst[s * stride + l] = if l < count {
                        src[l * lane_stride + s]
                    } else {
                        0.0
                    };
                }
            }
        }
    }
}

/// [`transpose_steps`] 16 steps at a time, the lanes loaded straight into
/// registers (lanes past `count` masked to zero, their loads touching no
/// memory) and the steps stored under the mask of `width` lanes.
///
/// # Safety
/// As `transpose_steps` asserts, on a CPU with `avx512f`: `src` holds
/// `steps` floats from every `l·lane_stride`, `l < count`, and `dst` holds
/// `width` floats at every `s·stride`, `s < steps`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn transpose_avx512(
    src: *const f32,
    (lane_stride, count): (usize, usize),
    steps: usize,
    (dst, stride, width): (*mut f32, usize, usize),
) {
    use std::arch::x86_64::{
        _mm512_shuffle_f32x4, _mm512_shuffle_ps, _mm512_unpackhi_ps, _mm512_unpacklo_ps,
    };
    // Lanes past `count` read lane 0's address under an empty mask.
    let lane_at: [usize; 16] = std::array::from_fn(|l| if l < count { l * lane_stride } else { 0 });
    let live: [__mmask16; 16] = std::array::from_fn(|l| if l < count { 0xFFFF } else { 0 });
    let mask = first_lanes(width);
    for from in (0..steps).step_by(16) {
        // SAFETY: a live lane holds `steps` floats from its start (the
        // caller), 16 of them read from `from < steps`; a masked-off load
        // reads nothing.
        let rows: [__m512; 16] = std::array::from_fn(|l| unsafe {
            _mm512_maskz_loadu_ps(live[l], src.add(lane_at[l] + from))
        });
        // Per 128-bit lane L, `columns[4g + o]` holds column 4L + o of
        // rows 4g..4g+4.
        let mut columns = [_mm512_setzero_ps(); 16];
        for g in 0..4 {
            let r = &rows[4 * g..4 * g + 4];
            let (lo01, hi01) = (
                _mm512_unpacklo_ps(r[0], r[1]),
                _mm512_unpackhi_ps(r[0], r[1]),
            );
            let (lo23, hi23) = (
                _mm512_unpacklo_ps(r[2], r[3]),
                _mm512_unpackhi_ps(r[2], r[3]),
            );
            columns[4 * g] = _mm512_shuffle_ps::<0x44>(lo01, lo23);
            columns[4 * g + 1] = _mm512_shuffle_ps::<0xEE>(lo01, lo23);
            columns[4 * g + 2] = _mm512_shuffle_ps::<0x44>(hi01, hi23);
            columns[4 * g + 3] = _mm512_shuffle_ps::<0xEE>(hi01, hi23);
        }
        for o in 0..4 {
            let q = [columns[o], columns[4 + o], columns[8 + o], columns[12 + o]];
            let low = _mm512_shuffle_f32x4::<0x44>(q[0], q[1]);
            let high = _mm512_shuffle_f32x4::<0xEE>(q[0], q[1]);
            let low2 = _mm512_shuffle_f32x4::<0x44>(q[2], q[3]);
            let high2 = _mm512_shuffle_f32x4::<0xEE>(q[2], q[3]);
            let out = [
                _mm512_shuffle_f32x4::<0x88>(low, low2),
                _mm512_shuffle_f32x4::<0xDD>(low, low2),
                _mm512_shuffle_f32x4::<0x88>(high, high2),
                _mm512_shuffle_f32x4::<0xDD>(high, high2),
            ];
            for (quarter, &column) in out.iter().enumerate() {
                let step = from + 4 * quarter + o;
                // SAFETY: step < steps, and the caller's `dst` holds
                // `width` floats at every `step · stride`; the mask stores
                // only those.
                unsafe { _mm512_mask_storeu_ps(dst.add(step * stride), mask, column) };
            }
        }
    }
}

/// 16 steps of [`transpose_steps`] as four 8×8 register transposes. The
/// steps are stored in order, each as one 8-lane store where it fits in
/// `dst`: a group of fewer than 8 lanes (a 6-row A panel) then spills
/// into the next step, which its own store overwrites after. AMD's
/// `vmaskmovps` stores with a partial mask cost about four times a plain
/// one, so the mask is kept for a group's last lanes where nothing
/// follows them.
///
/// # Safety
/// Every lane holds 16 floats from `from` and `dst` (its start and
/// length) 16 rows of `width` floats, `stride` apart, on a CPU with `avx2`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn transpose_avx2(
    lanes: &[&[f32]],
    from: usize,
    width: usize,
    (dst, len): (*mut f32, usize),
    stride: usize,
) {
    use std::arch::x86_64::{
        _mm256_permute2f128_ps, _mm256_shuffle_ps, _mm256_unpackhi_ps, _mm256_unpacklo_ps,
    };
    for first_lane in (0..width).step_by(8) {
        let mask = first_lanes_256(width - first_lane);
        // A spill past `width` may only land on lanes not yet written: the
        // next step's, of a panel one group wide.
        let may_spill = first_lane + 8 <= width || (first_lane == 0 && width == stride);
        for first_step in [0, 8] {
            let mut r = [_mm256_setzero_ps(); 8];
            for (row, lane) in r.iter_mut().zip(lanes.iter().skip(first_lane)) {
                // SAFETY: the lane holds 16 floats from `from` (the caller).
                *row = unsafe { _mm256_loadu_ps(lane.as_ptr().add(from + first_step)) };
            }
            let t = [
                _mm256_unpacklo_ps(r[0], r[1]),
                _mm256_unpackhi_ps(r[0], r[1]),
                _mm256_unpacklo_ps(r[2], r[3]),
                _mm256_unpackhi_ps(r[2], r[3]),
                _mm256_unpacklo_ps(r[4], r[5]),
                _mm256_unpackhi_ps(r[4], r[5]),
                _mm256_unpacklo_ps(r[6], r[7]),
                _mm256_unpackhi_ps(r[6], r[7]),
            ];
            // Per 128-bit half H, `u[o]` holds step 4H + o of rows 0..4
            // (`u[o + 4]` of rows 4..8).
            let u = [
                _mm256_shuffle_ps::<0x44>(t[0], t[2]),
                _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
                _mm256_shuffle_ps::<0x44>(t[1], t[3]),
                _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
                _mm256_shuffle_ps::<0x44>(t[4], t[6]),
                _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
                _mm256_shuffle_ps::<0x44>(t[5], t[7]),
                _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
            ];
            let mut columns = [_mm256_setzero_ps(); 8];
            for o in 0..4 {
                columns[o] = _mm256_permute2f128_ps::<0x20>(u[o], u[o + 4]);
                columns[o + 4] = _mm256_permute2f128_ps::<0x31>(u[o], u[o + 4]);
            }
            for (offset, &column) in columns.iter().enumerate() {
                let at = (first_step + offset) * stride + first_lane;
                // SAFETY: step < 16, and the caller's `dst` holds `width`
                // floats at every `step · stride`: the masked store writes
                // only those from `first_lane`; the whole one writes 8
                // floats inside `dst` (checked), past `width` only where
                // `width == stride < 8`, onto the next step's first lanes,
                // which a later store of this call or the packing's next
                // writes over.
                unsafe {
                    if may_spill && at + 8 <= len {
                        _mm256_storeu_ps(dst.add(at), column);
                    } else {
                        _mm256_maskstore_ps(dst.add(at), mask, column);
                    }
                }
            }
        }
    }
}
