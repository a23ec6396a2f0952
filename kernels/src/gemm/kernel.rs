//! Which kernel runs the product: a GEMM crate chosen once per process
//! from the CPU's widest vector unit, or Cistern's packed kernel for the
//! shapes where it measured faster (`super::packed`).
//!
//! Both crates pick their own micro-kernels from the CPU's features (the
//! `gemm` crate: AVX-512 with its `x86-v4` feature, AVX2 + FMA, scalar;
//! `matrixmultiply`: AVX-512, AVX2 + FMA, AVX, NEON, portable). Which crate
//! is faster at a given width was measured (`docs/benchmarks.md`, "GEMM"),
//! and [`GemmKernel::for_vector_bits`] records the outcome.

use std::sync::OnceLock;

use super::GemmSpec;

/// Products smaller than this (m·n·k multiply-adds) run as one call: below
/// it, waking the pool costs more than it saves (in the ViT step a
/// 576×64×64 product took 33 µs alone and 58–70 µs split in two).
const PARALLEL_WORK: usize = 1 << 23;

/// The fewest rows or columns of C one task gets.
const MIN_BLOCK: usize = 64;

/// C this narrow (n ≤ it) goes to the `gemm` crate: at 256 bits with
/// n = 10 and 32 the crate measured 1.3–2× the packed kernel, at 64 level;
/// at 512 bits with n = 10, 1.3×.
const NARROW_N: usize = 32;

/// At 512 bits, C with this few columns (n ≤ it) and many rows goes to
/// the `gemm` crate where one operand is transposed (`at_512_bits`): the
/// packed kernel's packing of op(A) is used only n / 32 times per panel.
const FEW_COLUMNS: usize = 128;

/// At 512 bits with A transposed and few columns, more rows than this go
/// to the `gemm` crate (64×64×4096 measured 1.2–1.55× faster packed on
/// Zen 5, 1.2× slower on Emerald Rapids).
const FEW_ROWS: usize = 64;

/// At 512 bits with B transposed and few columns, C this many times
/// taller than wide goes to the `gemm` crate (on Zen 5 512×64 measured
/// level and 256×64 1.8× faster packed, since the crate repacks a
/// transposed B; on Emerald Rapids the crate led at both).
const TALL: usize = 8;

/// At 256 bits, a k this short (k ≤ it) goes to the `gemm` crate: with
/// k = 10 the crate measured 1.4× the packed kernel, at 32 level.
const SHORT_K: usize = 16;
/// A task's share of C's side is a multiple of this, so that only the last
/// block ends in a partial micro-tile (the crates' tiles are 4 to 48 wide,
/// 16 on the AVX-512 paths).
const BLOCK_ALIGN: usize = 16;

/// The implementation of the matrix product behind [`crate::gemm`]. Each
/// runs single-threaded on blocks of C, one block per rayon thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GemmKernel {
    /// The `gemm` crate (`gemm-f32` 0.19, `x86-v4`): packed AVX-512 or
    /// AVX2 + FMA micro-kernels.
    Gemm,
    /// `matrixmultiply`'s sgemm: micro-kernels for most instruction sets
    /// (AVX-512 and AVX2 + FMA among them) and a portable one.
    MatrixMultiply,
    /// Cistern's own packed SGEMM: an AVX-512 micro-kernel where `avx512f`
    /// is detected, an AVX2 + FMA one where `avx2` and `fma` are (a
    /// portable one elsewhere), with the bias and activation applied per
    /// tile.
    Packed,
}

impl GemmKernel {
    /// Every kernel, for tests and benchmarks that compare them.
    pub const ALL: [GemmKernel; 3] = [
        GemmKernel::Gemm,
        GemmKernel::MatrixMultiply,
        GemmKernel::Packed,
    ];

    /// The crate this CPU runs where [`Self::chosen_for`] does not pick
    /// [`GemmKernel::Packed`]: [`Self::for_vector_bits`] of
    /// [`Self::cpu_vector_bits`], decided on first use and then fixed.
    pub fn chosen() -> GemmKernel {
        static CHOSEN: OnceLock<GemmKernel> = OnceLock::new();
        *CHOSEN.get_or_init(|| Self::for_vector_bits(Self::cpu_vector_bits()))
    }

    /// The faster kernel on a CPU whose widest FMA vector is `bits` wide:
    /// the `gemm` crate at 512 and 256 bits, `matrixmultiply` (portable
    /// kernels included) below.
    pub fn for_vector_bits(bits: u32) -> GemmKernel {
        if bits >= 256 {
            GemmKernel::Gemm
        } else {
            GemmKernel::MatrixMultiply
        }
    }

    /// The kernel [`crate::gemm`] runs for `spec` on this CPU:
    /// [`Self::for_shape`] at [`Self::cpu_vector_bits`].
    pub fn chosen_for(spec: &GemmSpec) -> GemmKernel {
        Self::for_shape(Self::cpu_vector_bits(), spec)
    }

    /// The faster kernel for `spec` on a CPU whose widest FMA vector is
    /// `bits` wide: at 512 bits [`Self::at_512_bits`]; at 256 bits
    /// (AVX2 + FMA, measured on Zen 3) [`GemmKernel::Packed`], which
    /// measured ahead of the `gemm` crate or level with it, except for a
    /// narrow C or a short k (n ≤ 32 or k ≤ 16: an MLP's last layer),
    /// where packing and edge tiles cost more than the product and the
    /// crate measured up to twice as fast; else [`Self::for_vector_bits`].
    pub fn for_shape(bits: u32, spec: &GemmSpec) -> GemmKernel {
        match bits {
            512.. => Self::at_512_bits(spec),
            256..512 if spec.n <= NARROW_N || spec.k <= SHORT_K => GemmKernel::Gemm,
            256..512 => GemmKernel::Packed,
            _ => Self::for_vector_bits(bits),
        }
    }

    /// The faster kernel at 512 bits (measured on Emerald Rapids and Zen 5,
    /// checked on Zen 4):
    /// [`GemmKernel::Packed`] where A or B is transposed, where it measured
    /// level with the `gemm` crate (A) or ahead of it (B: the crate repacks
    /// a transposed B, 1.08–2.4×), except where C has few columns
    /// (n ≤ 128) for its rows: packing op(A) then costs more than its
    /// few uses save, and the crate, which reads A in place, measured
    /// 1.04–1.5× ahead with A transposed (m > 64) and 1.1–1.7× with B
    /// transposed where m ≥ 8n (with fewer rows Zen 5 ran packed 1.5–2.5×
    /// faster, Emerald Rapids 1.07–1.27× slower). With neither transposed the crate, which
    /// reads a row-major A unpacked, measured up to 8 % (Emerald Rapids)
    /// and 20 % (Zen 5) ahead, and with n ≤ 32 1.3×.
    fn at_512_bits(spec: &GemmSpec) -> GemmKernel {
        let few_columns = spec.n <= FEW_COLUMNS;
        match (spec.transpose_a, spec.transpose_b) {
            _ if spec.n <= NARROW_N => GemmKernel::Gemm,
            (false, false) => GemmKernel::Gemm,
            (true, false) if few_columns && spec.m > FEW_ROWS => GemmKernel::Gemm,
            (false, true) if few_columns && spec.m >= TALL * spec.n => GemmKernel::Gemm,
            _ => GemmKernel::Packed,
        }
    }

    /// The widest single-precision FMA vector this CPU has, in bits: 512
    /// with AVX-512F, 256 with AVX2 + FMA, else 128 (SSE2, NEON) on x86-64
    /// and aarch64 and 32 (scalar) elsewhere.
    pub fn cpu_vector_bits() -> u32 {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return 512;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return 256;
            }
            128
        }
        #[cfg(target_arch = "aarch64")]
        {
            128
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            32
        }
    }

    /// The crate's name, as benchmarks print it.
    pub fn name(self) -> &'static str {
        match self {
            GemmKernel::Gemm => "gemm",
            GemmKernel::MatrixMultiply => "matrixmultiply",
            GemmKernel::Packed => "packed",
        }
    }

    /// `c ← act(op(a)·op(b) + bias)`. The caller has checked every length
    /// against `spec`, and that m, n and k are non-zero.
    pub(super) fn product(
        self,
        spec: &GemmSpec,
        a: &[f32],
        b: &[f32],
        bias: Option<&[f32]>,
        c: &mut [f32],
    ) {
        let strides = Strides::of(spec);
        debug_assert!(spec.m * spec.k == a.len() && spec.k * spec.n == b.len());
        debug_assert!(spec.m * spec.n == c.len() && spec.k > 0);
        match self {
            GemmKernel::Gemm => gemm_crate(spec, &strides, a, b, c),
            GemmKernel::MatrixMultiply => matrixmultiply(spec, &strides, a, b, c),
            // Fuses the epilogue into its tiles.
            GemmKernel::Packed => return super::packed::product(spec, &strides, a, b, bias, c),
        }
        super::epilogue(spec.activation, bias, spec.n, c);
    }
}

/// Element strides of the logical op(A) (m×k) and op(B) (k×n) over their
/// row-major storage. Each is at most a checked buffer length, so fits in
/// `isize`.
pub(super) struct Strides {
    pub(super) a_row: isize,
    pub(super) a_col: isize,
    pub(super) b_row: isize,
    pub(super) b_col: isize,
}

impl Strides {
    pub(super) fn of(spec: &GemmSpec) -> Strides {
        let (m, n, k) = (spec.m as isize, spec.n as isize, spec.k as isize);
        let (a_row, a_col) = if spec.transpose_a { (1, m) } else { (k, 1) };
        let (b_row, b_col) = if spec.transpose_b { (1, k) } else { (n, 1) };
        Strides {
            a_row,
            a_col,
            b_row,
            b_col,
        }
    }
}

/// A part of C that one task computes: `len` rows or columns from `start`.
#[derive(Clone, Copy)]
pub(super) struct Block {
    pub(super) columns: bool,
    pub(super) start: usize,
    pub(super) len: usize,
}

/// How [`split`] cuts C: along its columns or its rows, into `tasks`
/// blocks (1: one call).
#[derive(Clone, Copy)]
pub(super) struct Split {
    pub(super) columns: bool,
    pub(super) tasks: usize,
}

impl Split {
    /// Along the longer of C's two sides, one block per rayon thread;
    /// one task for small products and C too narrow to split.
    pub(super) fn of(spec: &GemmSpec) -> Split {
        let GemmSpec { m, n, k, .. } = *spec;
        let columns = n >= m;
        let extent = if columns { n } else { m };
        let work = m.saturating_mul(n).saturating_mul(k);
        let tasks = super::gemm_threads().min(extent / MIN_BLOCK);
        let tasks = if work < PARALLEL_WORK {
            1
        } else {
            tasks.max(1)
        };
        Split { columns, tasks }
    }
}

/// Splits C as [`Split::of`] and runs `block` on each block: independent
/// tasks with no barrier between them, so a core taken by another thread
/// (a stream executor, another process) delays only its own share; a
/// caller outside the pool computes one of them itself
/// ([`crate::parallel::fork_each`]). Small
/// products, and C too narrow to split, run as one call with `threads`
/// set (true when the product is large enough to thread by itself).
pub(super) fn split(spec: &GemmSpec, block: impl Fn(Block, bool) + Sync) {
    split_as(spec, Split::of(spec), block);
}

/// [`split`] as `plan` (which is [`Split::of`] `spec`) cuts C.
pub(super) fn split_as(spec: &GemmSpec, plan: Split, block: impl Fn(Block, bool) + Sync) {
    let GemmSpec { m, n, k, .. } = *spec;
    let Split { columns, tasks } = plan;
    let extent = if columns { n } else { m };
    if tasks <= 1 {
        let whole = Block {
            columns,
            start: 0,
            len: extent,
        };
        let work = m.saturating_mul(n).saturating_mul(k);
        return block(whole, work >= PARALLEL_WORK);
    }
    let share = extent.div_ceil(tasks).div_ceil(BLOCK_ALIGN) * BLOCK_ALIGN;
    let blocks: Vec<Block> = (0..tasks)
        .map(|task| task * share)
        .filter(|&start| start < extent)
        .map(|start| Block {
            columns,
            start,
            len: share.min(extent - start),
        })
        .collect();
    let caller_took_one = crate::parallel::fork_each(blocks, |one| block(one, false));
    crate::parallel::keep_warm_after_fork(caller_took_one);
}

/// A pointer that tasks share; each task touches only its own block.
#[derive(Clone, Copy)]
pub(super) struct SendPtr<T>(pub(super) T);
// SAFETY: the tasks of one `split` read A and B and write disjoint blocks
// of C; the borrows behind these pointers outlive the split.
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SendPtr<T> {}

impl<T: Copy> SendPtr<T> {
    pub(super) fn get(&self) -> T {
        self.0
    }
}

/// The sub-problem of a block: its (m, n), and the offsets of its first
/// element of C, op(A) and op(B).
pub(super) fn sub_problem(
    spec: &GemmSpec,
    s: &Strides,
    block: Block,
) -> (usize, usize, usize, isize, isize) {
    let start = block.start as isize;
    if block.columns {
        (spec.m, block.len, block.start, 0, start * s.b_col)
    } else {
        (block.len, spec.n, block.start * spec.n, start * s.a_row, 0)
    }
}

fn gemm_crate(spec: &GemmSpec, s: &Strides, a: &[f32], b: &[f32], c: &mut [f32]) {
    let (a, b, c) = (
        SendPtr(a.as_ptr()),
        SendPtr(b.as_ptr()),
        SendPtr(c.as_mut_ptr()),
    );
    let ldc = spec.n as isize;
    split(spec, |block, threaded| {
        let (m, n, c_at, a_at, b_at) = sub_problem(spec, s, block);
        let parallelism = if threaded {
            gemm_common::Parallelism::Rayon(0)
        } else {
            gemm_common::Parallelism::None
        };
        // The crate's kernels want a column-major destination: C (row-major
        // m×n) is computed as Cᵀ = op(B)ᵀ·op(A)ᵀ, column-major n×m, as the
        // `gemm` facade does for a row-major C.
        // SAFETY: the block's rows or columns of C, op(A) and op(B) lie in
        // the buffers the caller checked against the spec (`sub_problem`
        // offsets stay inside them); blocks of one split are disjoint, so
        // no two tasks write the same element. With `read_dst = false` C's
        // old contents are never read, so NaNs left in it cannot leak.
        unsafe {
            gemm_f32::gemm::f32::get_gemm_fn()(
                n,
                m,
                spec.k,
                c.get().add(c_at),
                ldc,
                1,
                false,
                b.get().offset(b_at),
                s.b_row,
                s.b_col,
                a.get().offset(a_at),
                s.a_row,
                s.a_col,
                0.0,
                1.0,
                false,
                false,
                false,
                parallelism,
            );
        }
    });
}

fn matrixmultiply(spec: &GemmSpec, s: &Strides, a: &[f32], b: &[f32], c: &mut [f32]) {
    let (a, b, c) = (
        SendPtr(a.as_ptr()),
        SendPtr(b.as_ptr()),
        SendPtr(c.as_mut_ptr()),
    );
    split(spec, |block, _| {
        let (m, n, c_at, a_at, b_at) = sub_problem(spec, s, block);
        // SAFETY: as in `gemm_crate`; matrixmultiply takes any strides, and
        // with beta = 0 never reads C.
        unsafe {
            matrixmultiply::sgemm(
                m,
                spec.k,
                n,
                1.0,
                a.get().offset(a_at),
                s.a_row,
                s.a_col,
                b.get().offset(b_at),
                s.b_row,
                s.b_col,
                0.0,
                c.get().add(c_at),
                spec.n as isize,
                1,
            );
        }
    });
}
