//! Malformed launches are `InvalidProgram` and nothing runs; a kernel's own
//! refusal at run time is operation-local.

use cistern::client::ComputeClient;
use cistern::runtime::{Device, ErrorCode, Kernel, KernelLaunch, ServerError};

use super::common::{ok, open};
use super::optim_reference::download;

/// Launches `launch` and checks it is refused as `InvalidProgram` at its
/// token and the stream's next sync, that the device ran nothing, and that
/// the stream is usable again.
fn assert_refused(client: &ComputeClient, launch: KernelLaunch, what: &str) {
    let stream = client.default_stream();
    let before = ok(client.server_stats(), "server_stats").kernels_run;
    let token = ok(client.launch_tracked(stream, launch), what);
    let refused = token.wait();
    assert!(
        matches!(refused, Err(ServerError::InvalidProgram { .. })),
        "{what}: {refused:?}"
    );
    let latched = client.sync(stream).map_err(|e| e.code());
    assert_eq!(latched, Err(ErrorCode::InvalidProgram), "{what}");
    ok(client.sync(stream), "second sync");
    let after = ok(client.server_stats(), "server_stats").kernels_run;
    assert_eq!(after, before, "{what}: a kernel ran");
}

pub fn bad_bindings_are_invalid_programs_and_nothing_runs(device: Device) {
    let client = open(device);
    let a = ok(client.upload_f32(&[1.0; 16]), "upload");
    let c = ok(client.upload_f32(&[2.0; 16]), "upload");
    let small = ok(client.upload_f32(&[2.0; 8]), "upload");

    let too_small = KernelLaunch::axpy(a.whole(), 1.0, small.whole());
    assert_refused(&client, too_small, "a binding too small");
    let past_the_end = KernelLaunch::scale(a.range(32, 64), 2.0);
    assert_refused(&client, past_the_end, "a binding past the end");
    let misaligned = KernelLaunch::axpy(a.range(2, 32), 1.0, c.range(0, 32));
    assert_refused(&client, misaligned, "a misaligned binding");
    let aliased = KernelLaunch::add(a.range(0, 32), c.range(0, 32), a.range(16, 32));
    assert_refused(&client, aliased, "an aliased written binding");
    let mut wrong_count = KernelLaunch::add(a.whole(), c.whole(), c.whole());
    wrong_count.bindings.pop();
    assert_refused(&client, wrong_count, "a wrong binding count");
    let mut spec = cistern::runtime::GemmSpec {
        m: 4,
        n: 4,
        k: 4,
        ..Default::default()
    };
    // A kernel cannot carry another kernel's arguments (the type forbids
    // it), but its arguments can still disagree with its bindings.
    let bias_without_binding = KernelLaunch::new(
        Kernel::Gemm {
            spec: Box::new(spec),
            bias: true,
        },
        vec![a.whole(), c.whole(), c.whole()],
    );
    assert_refused(
        &client,
        bias_without_binding,
        "a bias flag without its binding",
    );
    spec.k = 5;
    let wrong_shape = KernelLaunch::gemm(spec, a.whole(), c.whole(), None, small.whole());
    assert_refused(&client, wrong_shape, "a GEMM of the wrong shape");

    assert_eq!(download(&client, &a), vec![1.0; 16], "a unchanged");
    assert_eq!(download(&client, &c), vec![2.0; 16], "c unchanged");
    assert_eq!(download(&client, &small), vec![2.0; 8], "small unchanged");
}

pub fn a_bad_launch_in_a_batch_stops_all_of_it_before_it_runs(device: Device) {
    let client = open(device);
    let a = ok(client.upload_f32(&[1.0; 16]), "upload");
    let stream = client.default_stream();
    let token = ok(
        client.launch_batch(
            stream,
            vec![
                KernelLaunch::scale(a.whole(), 3.0),
                KernelLaunch::axpy(a.whole(), 1.0, a.whole()),
            ],
        ),
        "launch_batch",
    );
    assert_eq!(
        token.wait().map_err(|e| e.code()),
        Err(ErrorCode::InvalidProgram)
    );
    let _ = client.sync(stream);
    assert_eq!(download(&client, &a), vec![1.0; 16]);
}

pub fn a_mean_over_no_elements_is_refused_before_it_runs(device: Device) {
    let client = open(device);
    let buffer = ok(client.upload_f32(&[0.0; 4]), "upload");
    let none = buffer.range(0, 0);
    let loss = KernelLaunch::mse_loss(none, none, buffer.range(0, 4));
    assert_refused(&client, loss, "an MSE over no elements");
    assert_eq!(download(&client, &buffer), vec![0.0; 4]);
}
