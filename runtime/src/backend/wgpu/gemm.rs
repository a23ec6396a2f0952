//! GEMM as wgpu dispatches: `gemm.wgsl` computes 64×64 tiles of C, and C
//! is cut into bands of whole tiles, each a dispatch in a submission of its
//! own, so that no band's grid passes the per-dimension limit and no
//! submission does more multiply-adds than the device's budget (a long one
//! would run past the submission timeout on a CPU driver and poison the
//! device).

use cistern_kernels::GemmSpec;

use super::context::GpuContext;
use super::dispatch::Params;
use super::kernels::{Plan, activation_code, u32_of};
use super::pipelines::{Entry, Module};
use super::slice::GpuSlice;
use crate::error::ServerError;

const GEMM: Entry = Entry {
    module: Module::Gemm,
    name: "gemm",
    buffers: 4,
    table: false,
    per_invocation: 1,
};

/// Rows and columns of C per workgroup: `TILE` in gemm.wgsl, which must match.
const TILE: u64 = 64;

/// Multiply-adds a GEMM submission may do on a CPU adapter: 3–6 s on
/// lavapipe on 2 shared cores (0.7–1.5 GFLOP/s), far inside the submission
/// timeout even on a loaded host.
pub(super) const CPU_BUDGET: u64 = 1 << 31;

/// Multiply-adds a GEMM submission may do on any other adapter: a 2048³
/// GEMM in one, 4096³ in four; tens of milliseconds each on a discrete GPU.
pub(super) const GPU_BUDGET: u64 = 1 << 34;

/// One band of C: whole tiles from (`row`, `col`), `groups` of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Band {
    pub(super) row: u64,
    pub(super) col: u64,
    pub(super) groups: [u32; 3],
}

/// The bands covering an `m`×`n` C over `k` steps, row by row: each as wide
/// as the budget allows (at most `max_groups` tiles), then as tall, and at
/// least one tile (a tile longer than the budget cannot be cut).
pub(super) fn bands(m: u64, n: u64, k: u64, budget: u64, max_groups: u32) -> Vec<Band> {
    let (rows, cols) = (m.div_ceil(TILE), n.div_ceil(TILE));
    let limit = u64::from(max_groups.max(1));
    let tiles = (budget / (TILE * TILE * k.max(1))).max(1);
    let wide = cols.min(limit).min(tiles).max(1);
    let tall = rows.min(limit).min((tiles / wide).max(1)).max(1);
    let mut bands = Vec::new();
    for first_row in (0..rows).step_by(tall as usize) {
        for first_col in (0..cols).step_by(wide as usize) {
            let x = wide.min(cols - first_col);
            let y = tall.min(rows - first_row);
            bands.push(Band {
                row: first_row * TILE,
                col: first_col * TILE,
                // Both at most `max_groups`, a u32.
                groups: [x as u32, y as u32, 1],
            });
        }
    }
    bands
}

impl GpuContext {
    /// `spec` over bound `a`, `b`, `bias` and `c`: one dispatch per band.
    pub(super) fn gemm(
        &self,
        spec: &GemmSpec,
        a: &GpuSlice,
        b: &GpuSlice,
        bias: Option<&GpuSlice>,
        c: &GpuSlice,
    ) -> Result<Plan<'static>, ServerError> {
        if spec.m == 0 || spec.n == 0 {
            return Ok(Plan::Nothing);
        }
        let bias_window = match bias {
            Some(bias) => self.window(bias)?,
            None => self.zero_window(),
        };
        let windows = vec![
            self.window(a)?,
            self.window(b)?,
            bias_window,
            self.window(c)?,
        ];
        let (code, slope) = activation_code(spec.activation);
        let mut params = Params::new(code, &[slope]);
        params.u[8] = u32_of(spec.m as u64)?;
        params.u[9] = u32_of(spec.n as u64)?;
        params.u[10] = u32_of(spec.k as u64)?;
        params.u[11] = u32::from(spec.transpose_a);
        params.u[12] = u32::from(spec.transpose_b);
        params.u[13] = u32::from(bias.is_some());
        let (m, n, k) = (spec.m as u64, spec.n as u64, spec.k as u64);
        let mut dispatches = Vec::new();
        for band in bands(m, n, k, self.gemm_budget, self.max_groups) {
            params.u[14] = u32_of(band.row)?;
            params.u[15] = u32_of(band.col)?;
            let mut dispatch = self.dispatch(GEMM, windows.clone(), None, params, 0)?;
            dispatch.groups = band.groups;
            dispatches.push(dispatch);
        }
        Ok(Plan::Submissions(dispatches))
    }
}

#[cfg(test)]
mod tests {
    use cistern_kernels::Activation;

    use super::super::transfer::tests::slice_of;
    use super::*;

    /// Every tile of C, once, from the bands.
    fn covered(bands: &[Band], m: u64, n: u64) -> Vec<(u64, u64)> {
        let mut tiles: Vec<(u64, u64)> = bands
            .iter()
            .flat_map(|band| {
                let [x, y, _] = band.groups;
                (0..u64::from(y)).flat_map(move |r| {
                    (0..u64::from(x)).map(move |c| (band.row / TILE + r, band.col / TILE + c))
                })
            })
            .collect();
        tiles.sort_unstable();
        let want: Vec<(u64, u64)> = (0..m.div_ceil(TILE))
            .flat_map(|r| (0..n.div_ceil(TILE)).map(move |c| (r, c)))
            .collect();
        assert_eq!(tiles, want, "{m}×{n}");
        tiles
    }

    #[test]
    fn a_gemm_within_the_budget_is_one_band_of_every_tile() {
        let bands = bands(1024, 1000, 1024, CPU_BUDGET, 65_535);
        assert_eq!(
            bands,
            vec![Band {
                row: 0,
                col: 0,
                groups: [16, 16, 1]
            }]
        );
        assert_eq!(super::bands(1, 1, 1, CPU_BUDGET, 65_535).len(), 1);
    }

    #[test]
    fn a_long_gemm_is_cut_into_bands_within_the_budget() {
        let (m, n, k) = (2048, 2048, 2048);
        let bands = bands(m, n, k, CPU_BUDGET, 65_535);
        assert_eq!(bands.len(), 4);
        covered(&bands, m, n);
        for band in &bands {
            let [x, y, _] = band.groups;
            assert!(
                u64::from(x) * u64::from(y) * TILE * TILE * k <= CPU_BUDGET,
                "{band:?}"
            );
        }
        assert_eq!(super::bands(m, n, k, GPU_BUDGET, 65_535).len(), 1);
    }

    #[test]
    fn a_row_of_tiles_past_the_budget_is_cut_into_columns_too() {
        let (m, n, k) = (100, 70_000, 2048);
        let bands = bands(m, n, k, CPU_BUDGET, 65_535);
        covered(&bands, m, n);
        assert!(bands.iter().all(|band| band.groups[0] <= 256));
        // A single tile past the budget is still one band.
        let long = super::bands(64, 64, 1 << 30, CPU_BUDGET, 65_535);
        assert_eq!(long.len(), 1);
    }

    #[test]
    fn a_grid_past_the_per_dimension_limit_is_cut_into_bands() {
        let (m, n) = (7 * TILE + 1, 5 * TILE - 3);
        let bands = bands(m, n, 1, GPU_BUDGET, 3);
        covered(&bands, m, n);
        assert!(
            bands
                .iter()
                .all(|band| band.groups[0] <= 3 && band.groups[1] <= 3)
        );
        assert_eq!(bands.len(), 3 * 2);
    }

    fn floats(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 + seed) % 23) as f32 / 23.0 - 0.5)
            .collect()
    }

    fn bytes(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn bands_of_one_tile_each_compute_all_of_c() {
        let Some(mut context) = GpuContext::for_tests() else {
            return;
        };
        // One tile a band: every band's first row and column is its own.
        context.gemm_budget = 1;
        let spec = GemmSpec {
            m: 130,
            n: 70,
            k: 33,
            transpose_a: true,
            transpose_b: false,
            activation: Activation::Relu,
        };
        let (a, b, bias) = (floats(130 * 33, 1), floats(33 * 70, 2), floats(70, 3));
        let slices = [&a, &b, &bias, &vec![0.0; 130 * 70]].map(|v| slice_of(&context, &bytes(v)));
        let [da, db, dbias, dc] = &slices;
        let dispatches = match context.gemm(&spec, da, db, Some(dbias), dc) {
            Ok(Plan::Submissions(dispatches)) => dispatches,
            other => panic!("a gemm plans submissions: {:?}", other.err()),
        };
        assert_eq!(dispatches.len(), 3 * 2);
        for dispatch in &dispatches {
            assert!(context.run_now(std::slice::from_ref(dispatch)).is_ok());
        }
        let got: Vec<f32> = match context.read(dc) {
            Ok(read) => read
                .chunks_exact(4)
                .map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]]))
                .collect(),
            Err(error) => panic!("reading C: {error:?}"),
        };
        let mut want = vec![0.0; 130 * 70];
        assert!(cistern_kernels::gemm(&spec, &a, &b, Some(&bias), &mut want).is_ok());
        for (index, (got, want)) in got.iter().zip(&want).enumerate() {
            assert!((got - want).abs() <= 1e-5, "C[{index}]: {got}, not {want}");
        }
    }
}
