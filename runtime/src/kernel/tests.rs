//! The contract of every kernel, checked over one launch of each.

use cistern_kernels::Segment;
use cistern_memory::AllocationId;
use cistern_optim::{AdamConfig, OptimizerConfig, SgdConfig};

use super::contract::Access::{Read as R, Write as W};
use super::optimizer_step::OptimizerStep;
use super::*;
use crate::error::ServerError;
use crate::ids::ServerId;

fn binding() -> Binding {
    Binding {
        buffer: BufferRef {
            server: ServerId(0),
            id: AllocationId(0),
            generation: 0,
        },
        offset: 0,
        size: 4,
    }
}

fn one_launch_per_kernel() -> Vec<KernelLaunch> {
    let b = binding();
    let mut launches = vec![
        KernelLaunch::fill(b, 1.0),
        KernelLaunch::copy(b, b),
        KernelLaunch::identity(b, b),
        KernelLaunch::empty(),
        KernelLaunch::trap(),
        KernelLaunch::scale(b, 2.0),
        KernelLaunch::axpy(b, 2.0, b),
        KernelLaunch::add(b, b, b),
        KernelLaunch::mul(b, b, b),
        KernelLaunch::gemm(GemmSpec::default(), b, b, Some(b), b),
        KernelLaunch::column_sum(b, 1, 1, b),
        KernelLaunch::mse_loss(b, b, b),
        KernelLaunch::mse_loss_backward(b, b, 1.0, b),
        KernelLaunch::segment_sum(b, vec![Segment::new(0, 1)], b),
        KernelLaunch::segment_sum_squares(b, vec![Segment::new(0, 1)], b),
        KernelLaunch::amp_unscale(b, 0.5, b),
        KernelLaunch::amp_unscale_by_device_scale(b, b, b),
        KernelLaunch::amp_update_scale(
            cistern_kernels::ScaleRule {
                growth_factor: 2.0,
                backoff_factor: 0.5,
                growth_interval: 2000,
            },
            b,
            b,
            b,
            b,
        ),
    ];
    launches.push(KernelLaunch::broadcast_binary(
        cistern_kernels::BroadcastSpec {
            op: cistern_kernels::BinaryOp::Add,
            shape: vec![1],
            a_strides: vec![0],
            b_strides: vec![0],
        },
        b,
        b,
        b,
    ));
    launches.push(KernelLaunch::strided_sum(
        cistern_kernels::SumSpec {
            shape: vec![1],
            strides: vec![0],
            summed: vec![],
            summed_strides: vec![],
            scale: 1.0,
        },
        b,
        b,
    ));
    let norm = cistern_kernels::LayerNormSpec {
        rows: 1,
        cols: 1,
        eps: 1e-5,
        affine: false,
    };
    launches.push(KernelLaunch::layer_norm(norm, b, None, b, b));
    launches.push(KernelLaunch::layer_norm_backward(norm, b, None, b, b, b, b));
    let lookup = cistern_kernels::EmbeddingSpec {
        rows: 1,
        dim: 1,
        vocab: 1,
    };
    launches.push(KernelLaunch::embedding(lookup, b, b, b));
    let mask = cistern_kernels::DropoutSpec {
        seed: 1,
        threshold: 0,
        scale: 1.0,
    };
    launches.push(KernelLaunch::dropout(mask, b, b));
    launches.push(KernelLaunch::dropout_counted(mask, b, b, b));
    let gather = cistern_kernels::GatherSpec {
        rows: 1,
        width: 1,
        target_width: 1,
        batch: 1,
        seed: 0,
    };
    launches.push(KernelLaunch::batch_gather(gather, b, b, b, b, b));
    let batched = cistern_kernels::BatchedGemmSpec {
        gemm: GemmSpec::default(),
        a_offsets: vec![0],
        b_offsets: vec![0],
    };
    launches.push(KernelLaunch::batched_gemm(batched, b, b, b));
    launches.push(KernelLaunch::embedding_backward(lookup, b, b, b));
    let max = cistern_kernels::MaxDimSpec {
        outer: 1,
        dim: 1,
        inner: 1,
    };
    launches.push(KernelLaunch::max_dim(max, b, b, b));
    launches.push(KernelLaunch::max_dim_backward(max, b, b, b));
    let heads = cistern_kernels::AttentionSpec {
        batch: 1,
        heads: 1,
        queries: 1,
        keys: 1,
        head_dim: 1,
        scale: 1.0,
        causal: false,
    };
    launches.push(KernelLaunch::attention(heads, [b, b, b], b, b));
    launches.push(KernelLaunch::attention_backward_queries(
        heads,
        [b, b, b, b],
        b,
        b,
    ));
    launches.push(KernelLaunch::attention_backward_keys(
        heads,
        [b, b, b, b],
        b,
        b,
    ));
    for log in [false, true] {
        launches.push(KernelLaunch::softmax(b, 1, 1, log, b));
        launches.push(KernelLaunch::softmax_backward(b, b, 1, 1, log, b));
    }
    for spec in [
        cistern_kernels::ClassLossSpec::cross_entropy(1, 1),
        cistern_kernels::ClassLossSpec::nll(1, 1),
    ] {
        launches.push(KernelLaunch::class_loss(spec, b, b, Some(b), b));
        launches.push(KernelLaunch::class_loss_backward(spec, b, b, None, b, b));
    }
    for &op in MapOp::ALL {
        let definition = op.definition();
        let scalars = vec![1.0; definition.scalars.len()];
        launches.push(KernelLaunch::map(
            op,
            &scalars,
            vec![b; definition.bindings()],
        ));
    }
    for activation in [
        Activation::Relu,
        Activation::LeakyRelu {
            negative_slope: 0.1,
        },
        Activation::Gelu,
        Activation::GeluTanh,
        Activation::Tanh,
        Activation::Sigmoid,
    ] {
        launches.push(KernelLaunch::activation_forward(activation, b, b));
        launches.push(KernelLaunch::activation_backward(activation, b, b, b));
    }
    for config in [
        OptimizerConfig::Sgd(SgdConfig::default()),
        OptimizerConfig::Adam(AdamConfig::default()),
        OptimizerConfig::AdamW(Default::default()),
        OptimizerConfig::RmsProp(Default::default()),
        OptimizerConfig::Adagrad(Default::default()),
        OptimizerConfig::Lamb(Default::default()),
    ] {
        let state = vec![b; config.state_layout().len()];
        let step = OptimizerStep::new(config, 1, vec![], b, b, state);
        launches.extend(step.clone().with_found_inf(b).into_counted_launch(b));
        launches.push(step.into_launch());
    }
    launches
}

#[test]
fn every_catalogue_kernel_is_reachable_by_a_launch() {
    let reached: Vec<KernelId> = one_launch_per_kernel().iter().map(|l| l.id()).collect();
    for id in KernelId::all() {
        assert!(reached.contains(&id), "{} has no launch", id.name());
    }
}

#[test]
fn an_element_wise_kernel_writes_its_first_binding_in_place_or_else_its_last() {
    let b = binding();
    assert_eq!(KernelLaunch::axpy(b, 2.0, b).signature(), &[W, R]);
    assert_eq!(KernelLaunch::scale(b, 2.0).signature(), &[W]);
    assert_eq!(KernelLaunch::add(b, b, b).signature(), &[R, R, W]);
    assert_eq!(KernelLaunch::fill(b, 0.0).signature(), &[W]);
    assert_eq!(KernelLaunch::add(b, b, b).kernel.name(), "add");
}

#[test]
fn an_element_wise_launch_with_the_wrong_number_of_scalars_is_an_invalid_argument() {
    let b = binding();
    for scalars in [&[][..], &[1.0, 2.0], &[1.0; 9]] {
        let launch = KernelLaunch::map(MapOp::Axpy, scalars, vec![b, b]);
        let refused = launch.kernel.contract().shape.check_arguments();
        let Err(ServerError::InvalidArgument { message }) = refused else {
            panic!("{scalars:?} scalars for axpy: {refused:?}");
        };
        assert!(
            message.contains("axpy takes 1 scalars (alpha)"),
            "{message}"
        );
    }
    let launch = KernelLaunch::map(MapOp::Axpy, &[1.0], vec![b, b]);
    assert!(launch.kernel.contract().shape.check_arguments().is_ok());
}

#[test]
fn every_constructor_matches_its_kernels_signature() {
    for launch in one_launch_per_kernel() {
        assert_eq!(
            launch.signature().len(),
            launch.bindings.len(),
            "{launch:?}"
        );
    }
}

#[test]
fn the_amp_optimizer_step_reads_its_flag_after_the_gradients() {
    let b = binding();
    let config = OptimizerConfig::Adam(AdamConfig {
        amsgrad: true,
        ..Default::default()
    });
    let launch = OptimizerStep::new(config, 1, vec![], b, b, vec![b; 3])
        .with_found_inf(b)
        .into_launch();
    assert_eq!(launch.signature(), &[W, R, R, W, W, W]);
    assert_eq!(launch.bindings.len(), 6);
}

#[test]
fn the_counted_optimizer_step_reads_its_flag_then_writes_its_count() {
    let b = binding();
    let config = OptimizerConfig::Adam(AdamConfig::default());
    let launch = OptimizerStep::new(config, 1, vec![], b, b, vec![b; 2])
        .with_found_inf(b)
        .into_counted_launch(b);
    let Some(launch) = launch else {
        panic!("a step with a flag has a counted launch");
    };
    assert_eq!(launch.signature(), &[W, R, R, W, W, W]);
    assert!(
        OptimizerStep::new(
            OptimizerConfig::Adam(AdamConfig::default()),
            1,
            vec![],
            b,
            b,
            vec![]
        )
        .into_counted_launch(b)
        .is_none()
    );
}
