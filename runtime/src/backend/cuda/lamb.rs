//! LAMB on CUDA, all-or-nothing as on the CPU and as on wgpu: the squared
//! gradient norms per segment, then each segment's parameter and update
//! norms, are summed on the device in double (`lamb.cu`), read back and
//! combined on the host in f64 (where a refusal is decided and nothing has
//! changed), then one write pass applies each segment's trust ratio. Two
//! measure launches and a write launch with host reads between them: no
//! cooperative launch, so no residency limit.
//!
//! The sums, the ratios and the work items live in the stream's
//! [`Scratch`](super::scratch::Scratch).

use cistern_kernels::{KernelError, Segment};
use cistern_optim::LambConfig;

use super::ffi;
use super::launch::{Arg, CudaSlice, Launcher};
use super::status::{fault, launch_error};
use crate::backend::stream::{KernelFault, LaunchError};
use crate::error::ServerError;
use crate::optimizer::OptimizerArgs;

/// Elements of one work item: a block's share of a segment at a time.
pub(super) const ITEM_ELEMENTS: usize = 8192;

/// The buffers a LAMB step updates: params, grads, exp_avg, exp_avg_sq.
#[derive(Clone, Copy, Debug)]
pub(super) struct LambBuffers {
    pub(super) params: CudaSlice,
    pub(super) grads: CudaSlice,
    pub(super) exp_avg: CudaSlice,
    pub(super) exp_avg_sq: CudaSlice,
}

impl LambBuffers {
    fn addresses(&self) -> [Arg; 4] {
        [self.params, self.grads, self.exp_avg, self.exp_avg_sq].map(|s| Arg::Pointer(s.address))
    }
}

/// The work items of `segments`, flattened: (first element, elements,
/// segment index) each, at most [`ITEM_ELEMENTS`] elements, none empty.
pub(super) fn work_items(segments: &[Segment]) -> Vec<u64> {
    let mut items = Vec::new();
    for (index, segment) in segments.iter().enumerate() {
        let mut start = 0;
        while start < segment.len {
            let len = ITEM_ELEMENTS.min(segment.len - start);
            items.extend([(segment.offset + start) as u64, len as u64, index as u64]);
            start += len;
        }
    }
    items
}

/// Where each part of one step's scratch lies, in bytes from its start:
/// three doubles per segment (Σg², then Σp², then Σu², each a run of one
/// per segment), an f32 ratio per segment, then the work items.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ScratchLayout {
    pub(super) segments: u64,
    pub(super) ratios: u64,
    pub(super) items: u64,
    pub(super) bytes: u64,
}

impl ScratchLayout {
    /// The layout for `segments` segments and `items` work items; `None`
    /// when its size overflows.
    pub(super) fn new(segments: usize, items: usize) -> Option<ScratchLayout> {
        let segments = u64::try_from(segments).ok()?;
        let ratios = segments.checked_mul(24)?;
        let items_at = ratios
            .checked_add(segments.checked_mul(4)?)?
            .checked_next_multiple_of(8)?;
        let bytes = items_at.checked_add(u64::try_from(items).ok()?.checked_mul(24)?)?;
        Some(ScratchLayout {
            segments,
            ratios,
            items: items_at,
            bytes,
        })
    }

    /// Where the Σp² run starts (the Σu² run follows it).
    fn norms(&self) -> u64 {
        8 * self.segments
    }
}

/// The bytes written to a step's scratch before its first pass: zeroed
/// sums and ratios, then the work items.
pub(super) fn initial_bytes(layout: &ScratchLayout, items: &[u64]) -> Vec<u8> {
    let mut bytes = vec![0u8; layout.items as usize];
    bytes.extend(items.iter().flat_map(|item| item.to_le_bytes()));
    bytes
}

/// The per-step constants after `adam_w_mode`, as apex's
/// `multi_tensor_lamb` (and the CPU's `LambScalars`) computes them.
pub(super) fn constants(c: &LambConfig, step: u64, grad_norm: f64) -> [f32; 9] {
    c.step_constants(step, grad_norm).to_array()
}

/// The global gradient norm from each segment's Σg², summed in order.
pub(super) fn grad_norm(squares: &[f64]) -> f64 {
    squares.iter().sum::<f64>().sqrt()
}

/// Each segment's ratio from its Σp² and Σu², as the CPU combines them;
/// `Err(index)` names the first segment whose norm or ratio is not finite
/// (a non-finite new moment makes its Σu² NaN).
pub(super) fn trust_ratios(
    config: &LambConfig,
    param_squares: &[f64],
    update_squares: &[f64],
) -> Result<Vec<f32>, usize> {
    let trust_ratio = config.use_nvlamb || config.weight_decay != 0.0;
    let mut ratios = Vec::with_capacity(param_squares.len());
    for (index, (&params, &updates)) in param_squares.iter().zip(update_squares).enumerate() {
        let param_norm = params.sqrt();
        let update_norm = updates.sqrt();
        let ratio = if trust_ratio && param_norm != 0.0 && update_norm != 0.0 {
            config.lr * (param_norm / update_norm)
        } else {
            config.lr
        };
        if !(param_norm.is_finite() && update_norm.is_finite() && ratio.is_finite()) {
            return Err(index);
        }
        ratios.push(ratio as f32);
    }
    Ok(ratios)
}

/// `cistern_lamb_measure`'s arguments for `pass` (0: gradients, 1:
/// parameters and updates) with the scratch at `scratch`.
pub(super) fn measure_args(
    buffers: &LambBuffers,
    scratch: u64,
    layout: &ScratchLayout,
    item_count: u64,
    pass: i32,
    adam_w: bool,
    floats: &[f32; 9],
) -> Vec<Arg> {
    let mut args = buffers.addresses().to_vec();
    args.extend([
        Arg::Pointer(scratch + layout.items),
        Arg::U64(item_count),
        Arg::Pointer(scratch),
        Arg::U64(layout.segments),
        Arg::I32(pass),
        Arg::I32(i32::from(adam_w)),
    ]);
    args.extend(floats.iter().map(|&f| Arg::F32(f)));
    args
}

/// `cistern_lamb_write`'s arguments with the scratch at `scratch`.
pub(super) fn write_args(
    buffers: &LambBuffers,
    scratch: u64,
    layout: &ScratchLayout,
    item_count: u64,
    adam_w: bool,
    floats: &[f32; 9],
) -> Vec<Arg> {
    let mut args = buffers.addresses().to_vec();
    args.extend([
        Arg::Pointer(scratch + layout.items),
        Arg::U64(item_count),
        Arg::Pointer(scratch + layout.ratios),
        Arg::I32(i32::from(adam_w)),
    ]);
    args.extend(floats.iter().map(|&f| Arg::F32(f)));
    args
}

/// Whether a flag word read back is set (anything but ±0, as the CPU's
/// `flag != 0.0`: NaN is set).
pub(super) fn is_set(word: [u8; 4]) -> bool {
    f32::from_le_bytes(word) != 0.0
}

/// A refusal worded as the CPU kernel's.
fn refused(kernel: &str, field: impl Into<String>, reason: &str) -> LaunchError {
    LaunchError::Refused(ServerError::InvalidArgument {
        message: format!("{kernel}: {}", KernelError::invalid(field, reason)),
    })
}

fn doubles(bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(8)
        .map(|chunk| {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            f64::from_le_bytes(word)
        })
        .collect()
}

impl Launcher<'_> {
    /// One LAMB step of `kernel` (its name in refusals) as step
    /// `args.step`, skipped on a set `flag`; with `count`, a counted step:
    /// step `count + 1`, advancing the count, as the CPU's counted step.
    pub(super) fn lamb(
        &mut self,
        kernel: &str,
        config: &LambConfig,
        args: &OptimizerArgs,
        buffers: LambBuffers,
        flag: Option<CudaSlice>,
        count: Option<CudaSlice>,
    ) -> Result<(), LaunchError> {
        let segments = &args.segments;
        if let Some(flag) = flag
            && is_set(self.read_word(flag)?)
        {
            return Ok(());
        }
        let Some(count) = count else {
            return self.lamb_passes(kernel, config, args.step, segments, &buffers);
        };
        let done = u32::from_le_bytes(self.read_word(count)?);
        let Some(next) = done.checked_add(1) else {
            return Err(refused(kernel, "count", "the step count overflows u32"));
        };
        self.lamb_passes(kernel, config, u64::from(next), segments, &buffers)?;
        ffi::write(count.address, &next.to_le_bytes(), self.stream)
            .map_err(|e| LaunchError::Fault(fault("lamb count", &e)))
    }

    /// The measure passes, the host's decisions, then the write pass.
    fn lamb_passes(
        &mut self,
        kernel: &str,
        config: &LambConfig,
        step: u64,
        segments: &[Segment],
        buffers: &LambBuffers,
    ) -> Result<(), LaunchError> {
        let items = work_items(segments);
        if items.is_empty() {
            // Every norm is 0 and every ratio `lr`: nothing to change.
            return Ok(());
        }
        let item_count = (items.len() / 3) as u64;
        let layout = ScratchLayout::new(segments.len(), items.len() / 3)
            .ok_or_else(|| refused(kernel, "segments", "too many to measure"))?;
        let bytes = usize::try_from(layout.bytes)
            .map_err(|_| refused(kernel, "segments", "too many to measure"))?;
        let scratch = self
            .scratch
            .ensure(self.epoch, bytes, self.stream)
            .map_err(|e| launch_error(kernel, &e))?;
        let device = |operation: &str| {
            let operation = format!("lamb {operation}");
            move |e: cudarc::driver::DriverError| LaunchError::Fault(fault(&operation, &e))
        };
        ffi::write(scratch, &initial_bytes(&layout, &items), self.stream)
            .map_err(device("scratch"))?;
        let adam_w = config.adam_w_mode;
        let unclipped = constants(config, step, 0.0);
        let args = measure_args(buffers, scratch, &layout, item_count, 0, adam_w, &unclipped);
        self.call("cistern_lamb_measure", item_count, &args)?;
        let squares = ffi::read(scratch, 8 * segments.len(), self.stream)
            .map_err(device("gradient norms"))?;
        let grad_norm = grad_norm(&doubles(&squares));
        if !grad_norm.is_finite() {
            return Err(refused(
                kernel,
                "grads",
                "the global gradient norm is not finite",
            ));
        }
        let floats = constants(config, step, grad_norm);
        let args = measure_args(buffers, scratch, &layout, item_count, 1, adam_w, &floats);
        self.call("cistern_lamb_measure", item_count, &args)?;
        let norms = ffi::read(scratch + layout.norms(), 16 * segments.len(), self.stream)
            .map_err(device("norms"))?;
        let norms = doubles(&norms);
        let (param_squares, update_squares) = norms.split_at(segments.len().min(norms.len()));
        let ratios = trust_ratios(config, param_squares, update_squares).map_err(|index| {
            refused(
                kernel,
                format!("segments[{index}]"),
                "a moment, norm or trust ratio would be non-finite",
            )
        })?;
        if ratios.len() != segments.len() {
            return Err(LaunchError::Fault(KernelFault::Malformed(
                "lamb: fewer norms read back than segments".into(),
            )));
        }
        let ratio_bytes: Vec<u8> = ratios.iter().flat_map(|r| r.to_le_bytes()).collect();
        ffi::write(scratch + layout.ratios, &ratio_bytes, self.stream).map_err(device("ratios"))?;
        let args = write_args(buffers, scratch, &layout, item_count, adam_w, &floats);
        self.call("cistern_lamb_write", item_count, &args)
    }

    /// The 4-byte word at `slice`'s start, read on the stream.
    fn read_word(&self, slice: CudaSlice) -> Result<[u8; 4], LaunchError> {
        let bytes = ffi::read(slice.address, 4, self.stream)
            .map_err(|e| LaunchError::Fault(fault("lamb flag or count", &e)))?;
        <[u8; 4]>::try_from(bytes.as_slice())
            .map_err(|_| LaunchError::Fault(KernelFault::Malformed("lamb: a short word".into())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_items_split_long_segments_and_skip_empty_ones() {
        let segments = [
            Segment::new(0, 3),
            Segment::new(3, 0),
            Segment::new(8, 2 * ITEM_ELEMENTS + 5),
        ];
        let n = ITEM_ELEMENTS as u64;
        assert_eq!(
            work_items(&segments),
            vec![0, 3, 0, 8, n, 2, 8 + n, n, 2, 8 + 2 * n, 5, 2]
        );
        assert!(work_items(&[Segment::new(4, 0)]).is_empty());
        assert!(work_items(&[]).is_empty());
    }

    #[test]
    fn the_scratch_holds_three_sums_and_a_ratio_per_segment_then_the_items() {
        let layout = ScratchLayout::new(3, 5).unwrap();
        assert_eq!(layout.norms(), 24);
        assert_eq!(layout.ratios, 72);
        // 72 + 12 ratio bytes, rounded up to the items' 8-byte alignment.
        assert_eq!(layout.items, 88);
        assert_eq!(layout.bytes, 88 + 5 * 24);
        let items = [7u64, 9, 2];
        let bytes = initial_bytes(&ScratchLayout::new(3, 1).unwrap(), &items);
        assert_eq!(bytes.len() as u64, ScratchLayout::new(3, 1).unwrap().bytes);
        assert!(bytes[..88].iter().all(|b| *b == 0));
        assert_eq!(bytes[88..96], 7u64.to_le_bytes());
        assert_eq!(bytes[104..], 2u64.to_le_bytes());
        assert_eq!(ScratchLayout::new(usize::MAX, 1), None);
        assert_eq!(ScratchLayout::new(1, usize::MAX), None);
    }

    #[test]
    fn the_constants_are_apexs_in_f64_rounded_once() {
        let config = LambConfig {
            lr: 1e-3,
            betas: (0.9, 0.999),
            max_grad_norm: 1.0,
            ..LambConfig::default()
        };
        let floats = constants(&config, 3, 4.0);
        assert_eq!(floats[0], 0.25, "clipped by the norm over the maximum");
        assert_eq!(floats[6], (1.0 / (1.0 - 0.9f64.powf(3.0))) as f32);
        assert_eq!(floats[7], (1.0 / (1.0 - 0.999f64.powf(3.0))) as f32);
        assert_eq!(floats[4], (1.0 - 0.9f64) as f32);
        assert_eq!(floats[5], (1.0 - 0.999f64) as f32);
        assert_eq!(constants(&config, 3, 0.5)[0], 1.0, "under the maximum");
        let plain = LambConfig {
            bias_correction: false,
            grad_averaging: false,
            ..LambConfig::default()
        };
        let floats = constants(&plain, 7, 0.0);
        assert_eq!([floats[4], floats[6], floats[7]], [1.0, 1.0, 1.0]);
    }

    #[test]
    fn the_gradient_norm_is_the_root_of_every_segments_squares() {
        assert_eq!(grad_norm(&[9.0, 16.0]), 5.0);
        assert_eq!(grad_norm(&[]), 0.0);
        assert!(!grad_norm(&[1.0, f64::INFINITY]).is_finite());
        assert!(grad_norm(&[f64::NAN]).is_nan());
    }

    #[test]
    fn a_segments_ratio_is_lr_times_its_norms_ratio_where_both_are_non_zero() {
        let config = LambConfig {
            lr: 0.5,
            weight_decay: 0.01,
            ..LambConfig::default()
        };
        let ratios = trust_ratios(&config, &[16.0, 0.0, 4.0], &[4.0, 9.0, 0.0]).unwrap();
        assert_eq!(ratios, vec![(0.5 * (4.0 / 2.0f64)) as f32, 0.5, 0.5]);
        // No decay and no NVLAMB: every segment gets lr.
        let plain = LambConfig {
            lr: 0.5,
            weight_decay: 0.0,
            use_nvlamb: false,
            ..LambConfig::default()
        };
        assert_eq!(trust_ratios(&plain, &[16.0], &[4.0]).unwrap(), vec![0.5]);
        let nvlamb = LambConfig {
            use_nvlamb: true,
            ..plain
        };
        assert_eq!(trust_ratios(&nvlamb, &[16.0], &[4.0]).unwrap(), vec![1.0]);
    }

    #[test]
    fn the_first_segment_with_a_non_finite_norm_or_ratio_is_named() {
        let config = LambConfig {
            weight_decay: 0.01,
            ..LambConfig::default()
        };
        assert_eq!(
            trust_ratios(&config, &[1.0, 1.0, 1.0], &[1.0, f64::NAN, f64::NAN]),
            Err(1)
        );
        assert_eq!(trust_ratios(&config, &[f64::INFINITY], &[1.0]), Err(0));
        // A ratio that overflows f64: a huge parameter norm over a tiny update.
        assert_eq!(trust_ratios(&config, &[1e308], &[5e-324]), Err(0));
    }

    #[test]
    fn a_flag_is_set_unless_it_is_a_zero_of_either_sign() {
        assert!(!is_set(0.0f32.to_le_bytes()));
        assert!(!is_set((-0.0f32).to_le_bytes()));
        assert!(is_set(1.0f32.to_le_bytes()));
        assert!(is_set(f32::NAN.to_le_bytes()));
        assert!(is_set(f32::from_bits(1).to_le_bytes()));
    }

    fn buffers() -> LambBuffers {
        let slice = |address| CudaSlice { address, len: 64 };
        LambBuffers {
            params: slice(0x1000),
            grads: slice(0x2000),
            exp_avg: slice(0x3000),
            exp_avg_sq: slice(0x4000),
        }
    }

    #[test]
    fn the_passes_point_at_their_parts_of_the_scratch() {
        let layout = ScratchLayout::new(2, 3).unwrap();
        let floats = [0.5; 9];
        let measure = measure_args(&buffers(), 0x9000, &layout, 3, 1, true, &floats);
        assert_eq!(
            measure[..10],
            [
                Arg::Pointer(0x1000),
                Arg::Pointer(0x2000),
                Arg::Pointer(0x3000),
                Arg::Pointer(0x4000),
                Arg::Pointer(0x9000 + layout.items),
                Arg::U64(3),
                Arg::Pointer(0x9000),
                Arg::U64(2),
                Arg::I32(1),
                Arg::I32(1),
            ]
        );
        assert_eq!(measure[10..], [Arg::F32(0.5); 9]);
        let write = write_args(&buffers(), 0x9000, &layout, 3, false, &floats);
        assert_eq!(
            write[4..8],
            [
                Arg::Pointer(0x9000 + layout.items),
                Arg::U64(3),
                Arg::Pointer(0x9000 + layout.ratios),
                Arg::I32(0),
            ]
        );
        assert_eq!(write.len(), 8 + 9);
    }
}
