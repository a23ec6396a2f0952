//! Checks of what a command names, before anything is queued: kernel calls
//! against their signatures and shapes, regions and strided views against
//! their allocations. Pure functions over the allocation sizes.
//!
//! A malformed binding (count, bounds, alignment, size, aliasing) is
//! `InvalidProgram`; an invalid argument value (an optimizer config field,
//! the step count, a segment table) is `InvalidArgument` naming the field.

use crate::command::StridedCopy;
use crate::error::ServerError;
use crate::ids::{BufferRef, Region};
use crate::kernel::{Access, KernelLaunch};

/// Checks a kernel call against its kernel's contract; `size_of` answers an
/// allocation's size (or why it cannot be used: stale, unknown, another
/// server's).
pub(crate) fn check_launch(
    launch: &KernelLaunch,
    mut size_of: impl FnMut(BufferRef) -> Result<u64, ServerError>,
) -> Result<(), ServerError> {
    let contract = launch.kernel.contract();
    let invalid = |message: String| ServerError::InvalidProgram {
        message: format!("{}: {message}", contract.name),
    };
    contract.shape.check_arguments()?;
    let signature = contract.signature;
    if launch.bindings.len() != signature.len() {
        return Err(invalid(format!(
            "takes {} bindings, got {}",
            signature.len(),
            launch.bindings.len()
        )));
    }
    let element = contract.element_size;
    // Kernels bind at most six buffers: no allocation on the launch path.
    let mut elements = [0u64; 8];
    for (index, binding) in launch.bindings.iter().enumerate() {
        let size = size_of(binding.buffer)?;
        let end = binding.offset.checked_add(binding.size);
        if end.is_none_or(|end| end > size) {
            return Err(invalid(format!(
                "binding {index} ({}+{}) is outside its allocation of {size} bytes",
                binding.offset, binding.size
            )));
        }
        if binding.offset % element != 0 || binding.size % element != 0 {
            return Err(invalid(format!(
                "binding {index} is not aligned to its {element}-byte elements"
            )));
        }
        if let Some(slot) = elements.get_mut(index) {
            *slot = binding.size / element;
        }
    }
    let elements = elements.get(..launch.bindings.len()).unwrap_or(&elements);
    contract.shape.check(contract.name, elements)?;
    for (i, a) in launch.bindings.iter().enumerate() {
        for (j, b) in launch.bindings.iter().enumerate().skip(i + 1) {
            let written = signature[i] == Access::Write || signature[j] == Access::Write;
            if written && a.buffer.id == b.buffer.id && overlaps(a.offset, a.size, b.offset, b.size)
            {
                return Err(invalid(format!(
                    "bindings {i} and {j} overlap and one is written"
                )));
            }
        }
    }
    Ok(())
}

/// Checks a region lies inside its allocation of `size` bytes.
pub(crate) fn check_region(region: &Region, size: u64) -> Result<(), ServerError> {
    match region.offset.checked_add(region.size) {
        Some(end) if end <= size => Ok(()),
        _ => Err(ServerError::InvalidArgument {
            message: format!(
                "range {}+{} is outside an allocation of {size} bytes",
                region.offset, region.size
            ),
        }),
    }
}

/// Whether two regions of one allocation overlap.
pub(crate) fn regions_overlap(a: &Region, b: &Region) -> bool {
    a.buffer.id == b.buffer.id && overlaps(a.offset, a.size, b.offset, b.size)
}

/// The bytes each view of a strided copy spans from its element zero,
/// checked against the allocations' sizes.
pub(crate) fn check_strided(
    copy: &StridedCopy,
    source_size: u64,
    target_size: u64,
) -> Result<(u64, u64), ServerError> {
    let invalid = |message: String| ServerError::InvalidArgument {
        message: format!("strided copy: {message}"),
    };
    let rank = copy.shape.len();
    if copy.source_strides.len() != rank || copy.target_strides.len() != rank {
        return Err(invalid(format!(
            "shape has rank {rank} but strides have {} and {}",
            copy.source_strides.len(),
            copy.target_strides.len()
        )));
    }
    if copy.element_size == 0 {
        return Err(invalid("element size is zero".to_string()));
    }
    let source = extent(&copy.shape, &copy.source_strides, copy.element_size)
        .ok_or_else(|| invalid("source view overflows".to_string()))?;
    let target = extent(&copy.shape, &copy.target_strides, copy.element_size)
        .ok_or_else(|| invalid("target view overflows".to_string()))?;
    let fits =
        |offset: u64, span: u64, size: u64| offset.checked_add(span).is_some_and(|e| e <= size);
    if !fits(copy.source_offset, source, source_size) {
        return Err(invalid(format!(
            "source view ({}+{source}) is outside its allocation of {source_size} bytes",
            copy.source_offset
        )));
    }
    if !fits(copy.target_offset, target, target_size) {
        return Err(invalid(format!(
            "target view ({}+{target}) is outside its allocation of {target_size} bytes",
            copy.target_offset
        )));
    }
    if copy.source.id == copy.target.id
        && overlaps(copy.source_offset, source, copy.target_offset, target)
    {
        return Err(invalid("source and target views overlap".to_string()));
    }
    Ok((source, target))
}

/// Bytes from element zero to the end of the last element; zero for an empty shape dimension.
fn extent(shape: &[u64], strides: &[u64], element_size: u64) -> Option<u64> {
    if shape.contains(&0) {
        return Some(0);
    }
    let mut last = 0u64;
    for (dimension, stride) in shape.iter().zip(strides) {
        last = last.checked_add((dimension - 1).checked_mul(*stride)?)?;
    }
    last.checked_add(1)?.checked_mul(element_size)
}

fn overlaps(a_offset: u64, a_size: u64, b_offset: u64, b_size: u64) -> bool {
    a_size > 0
        && b_size > 0
        && a_offset < b_offset.saturating_add(b_size)
        && b_offset < a_offset.saturating_add(a_size)
}

#[cfg(test)]
mod tests {
    use cistern_memory::AllocationId;

    use cistern_kernels::{GemmSpec, Segment};
    use cistern_optim::{AdamConfig, OptimizerConfig};

    use super::*;
    use crate::ids::ServerId;
    use crate::kernel::Binding;
    use crate::kernel::OptimizerStep;

    fn buffer(id: u64) -> BufferRef {
        BufferRef {
            server: ServerId(1),
            id: AllocationId(id),
            generation: 0,
        }
    }

    fn binding(id: u64, offset: u64, size: u64) -> Binding {
        Binding {
            buffer: buffer(id),
            offset,
            size,
        }
    }

    fn sizes(_: BufferRef) -> Result<u64, ServerError> {
        Ok(64)
    }

    #[test]
    fn a_well_formed_launch_passes() {
        let launch = KernelLaunch::copy(binding(1, 0, 32), binding(1, 32, 32));
        assert_eq!(check_launch(&launch, sizes), Ok(()));
    }

    #[test]
    fn a_binding_past_the_end_is_an_invalid_program() {
        let launch = KernelLaunch::fill(binding(1, 32, 64), 1.0);
        assert!(matches!(
            check_launch(&launch, sizes),
            Err(ServerError::InvalidProgram { .. })
        ));
    }

    #[test]
    fn an_overlapping_written_binding_is_an_invalid_program() {
        let launch = KernelLaunch::copy(binding(1, 0, 32), binding(1, 16, 32));
        assert!(matches!(
            check_launch(&launch, sizes),
            Err(ServerError::InvalidProgram { .. })
        ));
    }

    #[test]
    fn a_misaligned_f32_binding_is_an_invalid_program() {
        let launch = KernelLaunch::fill(binding(1, 2, 8), 1.0);
        assert!(matches!(
            check_launch(&launch, sizes),
            Err(ServerError::InvalidProgram { .. })
        ));
    }

    #[test]
    fn a_wrong_binding_count_is_an_invalid_program() {
        let mut launch = KernelLaunch::fill(binding(1, 0, 8), 1.0);
        launch.bindings.push(binding(2, 0, 8));
        assert!(check_launch(&launch, sizes).is_err());
        let mut launch = KernelLaunch::empty();
        launch.bindings.push(binding(2, 0, 8));
        assert!(check_launch(&launch, sizes).is_err());
    }

    fn adam_step(config: AdamConfig, state: usize, segments: Vec<Segment>) -> KernelLaunch {
        let b = |id| binding(id, 0, 64);
        let state = (0..state as u64).map(|i| b(3 + i)).collect();
        OptimizerStep::new(
            OptimizerConfig::Adam(config),
            1,
            segments,
            b(1),
            b(2),
            state,
        )
        .into_launch()
    }

    fn message(result: Result<(), ServerError>) -> String {
        match result {
            Err(ServerError::InvalidArgument { message }) => message,
            other => panic!("expected an invalid argument, got {other:?}"),
        }
    }

    #[test]
    fn a_gemm_output_of_the_wrong_shape_is_an_invalid_program() {
        let spec = GemmSpec {
            m: 2,
            n: 2,
            k: 4,
            ..Default::default()
        };
        let (a, b) = (binding(1, 0, 32), binding(2, 0, 32));
        let launch = KernelLaunch::gemm(spec, a, b, None, binding(3, 0, 16));
        assert_eq!(check_launch(&launch, sizes), Ok(()));
        let launch = KernelLaunch::gemm(spec, a, b, None, binding(3, 0, 20));
        assert!(matches!(
            check_launch(&launch, sizes),
            Err(ServerError::InvalidProgram { .. })
        ));
        let launch = KernelLaunch::gemm(spec, a, b, Some(binding(4, 0, 4)), binding(3, 0, 16));
        assert!(matches!(
            check_launch(&launch, sizes),
            Err(ServerError::InvalidProgram { .. })
        ));
    }

    #[test]
    fn an_invalid_optimizer_config_is_an_invalid_argument_naming_the_field() {
        let config = AdamConfig {
            betas: (0.9, 1.0),
            ..Default::default()
        };
        let launch = adam_step(config, 2, vec![Segment::new(0, 16)]);
        assert!(message(check_launch(&launch, sizes)).contains("`betas[1]`"));
    }

    #[test]
    fn a_segment_past_the_parameters_is_an_invalid_argument() {
        let launch = adam_step(AdamConfig::default(), 2, vec![Segment::new(8, 9)]);
        assert!(message(check_launch(&launch, sizes)).contains("`segments[0]`"));
    }

    #[test]
    fn step_zero_is_an_invalid_argument() {
        let mut launch = adam_step(AdamConfig::default(), 2, vec![]);
        if let crate::kernel::Kernel::OptimizerStep(step) = &mut launch.kernel {
            step.step = 0;
        }
        assert!(message(check_launch(&launch, sizes)).contains("`step`"));
    }

    #[test]
    fn a_missing_state_buffer_is_an_invalid_program() {
        let launch = adam_step(AdamConfig::default(), 1, vec![Segment::new(0, 16)]);
        assert!(matches!(
            check_launch(&launch, sizes),
            Err(ServerError::InvalidProgram { .. })
        ));
    }

    #[test]
    fn a_found_inf_flag_of_more_than_one_element_is_an_invalid_program() {
        let launch = KernelLaunch::amp_unscale(binding(1, 0, 64), 0.5, binding(2, 0, 8));
        assert!(matches!(
            check_launch(&launch, sizes),
            Err(ServerError::InvalidProgram { .. })
        ));
        let launch = KernelLaunch::amp_unscale(binding(1, 0, 64), 0.5, binding(2, 0, 4));
        assert_eq!(check_launch(&launch, sizes), Ok(()));
    }

    #[test]
    fn the_size_lookup_error_is_returned_as_itself() {
        let stale = ServerError::StaleGeneration {
            ordinal: 0,
            resource_generation: 0,
            current_generation: 1,
        };
        let launch = KernelLaunch::fill(binding(1, 0, 8), 1.0);
        assert_eq!(check_launch(&launch, |_| Err(stale.clone())), Err(stale));
    }

    #[test]
    fn a_strided_view_is_measured_from_element_zero_to_its_last_element() {
        let copy = StridedCopy {
            source: buffer(1),
            source_offset: 0,
            source_strides: vec![3, 1],
            target: buffer(2),
            target_offset: 0,
            target_strides: vec![1, 2],
            shape: vec![2, 3],
            element_size: 4,
        };
        assert_eq!(check_strided(&copy, 24, 24), Ok((24, 24)));
        assert!(check_strided(&copy, 20, 24).is_err());
    }

    #[test]
    fn overlapping_strided_views_of_one_allocation_are_refused() {
        let copy = StridedCopy {
            source: buffer(1),
            source_offset: 0,
            source_strides: vec![1],
            target: buffer(1),
            target_offset: 8,
            target_strides: vec![1],
            shape: vec![4],
            element_size: 4,
        };
        assert!(check_strided(&copy, 64, 64).is_err());
    }
}
