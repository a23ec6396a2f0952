//! Device faults and the store: a trap mid-training latches it (it refuses
//! every call and never shows its bytes), concurrent readers see only
//! errors, an invalidate makes it stale, the poison error names the
//! generation to invalidate, a capture by another client never poisons
//! it, and a queued step refused as transient is put back and retried.

use std::sync::Arc;

use cistern_client::{
    BackendError, ComputeClient, DeviceParamStore, ErrorCode, ErrorReport, ReportedError, Tape,
};
use cistern_optim::SgdConfig;
use cistern_runtime::{DeviceOptions, FaultPlan};

use super::common::{Model, loss, model, ok, open, open_with, store, with_gradients};

fn momentum() -> SgdConfig {
    SgdConfig {
        lr: 0.01,
        momentum: 0.9,
        ..SgdConfig::default()
    }
}

/// One training step; its forward/backward launches and the step's result.
fn train(
    client: &ComputeClient,
    store: &mut DeviceParamStore,
    model: &Model,
) -> (usize, Result<(), BackendError>) {
    let tape = Tape::new(client);
    let leaves = ok(store.register_resident_params(&tape), "register");
    let loss = ok(loss(store, &tape, &leaves, model), "forward");
    let gradients = store.backward(&tape, &loss);
    let launches = tape.launches().len();
    let stepped = match gradients {
        Ok(gradients) => store.step(&gradients, &momentum()),
        Err(error) => Err(BackendError::InvalidArgument(error.to_string())),
    };
    (launches, stepped)
}

/// The launches one training step of `model` queues on the tape (forward,
/// backward, staging copies), measured on a healthy device.
fn tape_launches_per_step(model: &Model) -> u64 {
    let client = open();
    let mut store = store(&client, model);
    let (launches, stepped) = train(&client, &mut store, model);
    ok(stepped, "a healthy step");
    launches as u64
}

/// A device whose launch `n` traps.
fn trapping_at(n: u64) -> ComputeClient {
    open_with(
        DeviceOptions::with_memory_limit(64 << 20)
            .with_faults(FaultPlan::none().with_trap_at_launch(n)),
    )
}

/// A store on a device whose first step's kernel traps, with that step
/// queued (the step itself returns before it runs).
fn a_queued_step_that_traps(seed: u64) -> (ComputeClient, DeviceParamStore) {
    let model = model(seed);
    let per_step = tape_launches_per_step(&model);
    // The state fill, then the kernel.
    let client = trapping_at(per_step + 2);
    let mut store = store(&client, &model);
    ok(train(&client, &mut store, &model).1, "the step is queued");
    (client, store)
}

/// Every entry point of `store`, each answering `StorePoisoned` naming
/// `cause`, the failure that latched it.
fn refuses_every_call(client: &ComputeClient, store: &mut DeviceParamStore, cause: &BackendError) {
    let poisoned = Err(BackendError::store_poisoned(cause.clone()));
    assert_eq!(store.sync_to_host().map(|_| ()), poisoned);
    assert_eq!(store.wait_device(), poisoned);
    assert_eq!(store.resident_grads_to_host().map(|_| ()), poisoned);
    assert_eq!(store.abandon_pending_forward().map(|_| ()), poisoned);
    let tape = Tape::new(client);
    assert_eq!(store.register_resident_params(&tape).map(|_| ()), poisoned);
    assert_eq!(store.snapshot_resident_params(&tape).map(|_| ()), poisoned);
    let gradients = ok(
        cistern_client::Gradients::from_host(&tape, []),
        "no gradients",
    );
    assert_eq!(store.step(&gradients, &momentum()), poisoned);
    assert_eq!(store.param_grads_to_host(&gradients).map(|_| ()), poisoned);
    assert!(store.is_poisoned());
}

#[test]
fn a_trap_in_the_middle_of_a_step_leaves_the_store_refusing_every_call() {
    let model = model(0x7A);
    let per_step = tape_launches_per_step(&model);
    // Step 1 queues its state fill and its kernel; later steps the kernel
    // alone: the third step's kernel traps.
    let client = trapping_at(3 * per_step + 2 + 1 + 1);
    let mut store = store(&client, &model);
    for _ in 0..2 {
        ok(train(&client, &mut store, &model).1, "healthy steps");
    }
    ok(store.wait_device(), "healthy steps ran");
    // The trapped step is queued: the step itself returns before it runs.
    assert_eq!(train(&client, &mut store, &model).1, Ok(()));
    let first = match store.sync_to_host() {
        Err(error @ BackendError::DeviceContextPoisoned(_)) => error,
        other => panic!("the trap is returned as itself, got {other:?}"),
    };
    assert!(first.to_string().contains("trap"), "{first}");
    refuses_every_call(&client, &mut store, &first);
}

#[test]
fn a_trap_while_backward_stages_gradients_poisons_the_store_on_its_next_call() {
    let model = model(0x7B);
    let per_step = tape_launches_per_step(&model);
    // The last launch of the first backward writes a gradient into staging
    // (the first layer's bias sums).
    let client = trapping_at(per_step);
    let mut store = store(&client, &model);
    let (_, stepped) = train(&client, &mut store, &model);
    let answer = stepped.and_then(|()| store.wait_device());
    let first = match answer {
        Err(error @ BackendError::DeviceContextPoisoned(_)) => error,
        other => panic!("the trap is the answer, got {other:?}"),
    };
    refuses_every_call(&client, &mut store, &first);
}

#[test]
fn a_failed_wait_poisons_the_store() {
    let (_client, store) = a_queued_step_that_traps(0x7C);
    let first = match store.wait_device() {
        Err(error @ BackendError::DeviceContextPoisoned(_)) => error,
        other => panic!("the trap is the answer, got {other:?}"),
    };
    assert_eq!(
        store.wait_device(),
        Err(BackendError::store_poisoned(first))
    );
}

#[test]
fn a_latched_store_names_the_failure_that_latched_it_in_its_message_and_report() {
    let (_client, store) = a_queued_step_that_traps(0x83);
    let first = match store.wait_device() {
        Err(error) => error,
        Ok(()) => panic!("the trapped step is the answer"),
    };
    let later = match store.sync_to_host() {
        Err(error) => error,
        Ok(_) => panic!("a latched store's bytes are never read"),
    };
    assert_eq!(later.code(), ErrorCode::StorePoisoned);
    assert_eq!(later.poison_cause(), Some(&first));
    let message = later.to_string();
    assert!(message.contains(&first.to_string()), "{message}");
    assert!(message.contains("trap"), "{message}");
    assert!(
        message.contains("rebuild it from the last host copy"),
        "{message}"
    );
    let report = ErrorReport::new(later.clone(), None, None);
    assert_eq!(report.code, ErrorCode::StorePoisoned);
    assert!(
        report.message.contains(&first.to_string()),
        "{}",
        report.message
    );
    assert_eq!(report.generation, first.poisoned_generation());
    let line = ok(report.to_json_line(), "the report as JSON");
    assert!(line.contains("trap"), "{line}");
    let decoded = ok(ErrorReport::from_json_line(&line), "the JSON line decodes");
    assert_eq!(decoded, report);
    assert_eq!(decoded.error, ReportedError::Backend(later.clone()));
    let bytes = ok(report.to_bincode(), "the report in bincode");
    assert_eq!(
        ok(ErrorReport::from_bincode(&bytes), "bincode decodes"),
        report
    );
}

#[test]
fn concurrent_readers_while_a_step_fails_see_only_errors() {
    let (_client, store) = a_queued_step_that_traps(0x7D);
    let store = Arc::new(store);
    let readers: Vec<_> = (0..8)
        .map(|reader| {
            let store = store.clone();
            std::thread::spawn(move || match reader % 3 {
                0 => store.sync_to_host().map(|_| ()),
                1 => store.wait_device(),
                _ => store.resident_grads_to_host().map(|_| ()),
            })
        })
        .collect();
    let answers: Vec<_> = readers
        .into_iter()
        .map(|reader| reader.join().unwrap_or(Ok(())))
        .collect();
    let trap = answers
        .iter()
        .filter(|answer| matches!(answer, Err(BackendError::DeviceContextPoisoned(_))))
        .count();
    assert!(
        answers.iter().all(Result::is_err),
        "no reader got a value: {answers:?}"
    );
    assert!(
        trap <= 1,
        "the trap is returned once, then StorePoisoned: {answers:?}"
    );
    assert!(store.is_poisoned());
    let later = store.sync_to_host().map(|_| ());
    assert!(
        matches!(
            &later,
            Err(BackendError::StorePoisoned { cause })
                if matches!(**cause, BackendError::DeviceContextPoisoned(_))
        ),
        "{later:?}"
    );
}

#[test]
fn the_poison_error_names_the_generation_to_invalidate() {
    let (client, store) = a_queued_step_that_traps(0x7E);
    let error = match store.sync_to_host() {
        Err(error) => error,
        Ok(_) => panic!("the trapped step is returned"),
    };
    let generation = error.poisoned_generation();
    assert_eq!(generation, Some(0));
    assert_eq!(
        ErrorReport::new(error.clone(), None, None).generation,
        generation
    );
    let recovered = ok(
        client.invalidate(generation.unwrap_or_default()),
        "invalidate",
    );
    assert!(recovered.is_active());
}

#[test]
fn an_invalidate_makes_the_store_stale_and_a_rebuilt_store_continues() {
    let model = model(0x7F);
    let client = trapping_at(1);
    let mut store = store(&client, &model);
    let saved = ok(store.sync_to_host(), "the last host copy");
    // Another user of the device traps it and recovers it.
    let other = client.clone();
    let scratch = ok(other.reserve(64), "scratch");
    ok(
        other.launch(
            other.default_stream(),
            cistern_runtime::KernelLaunch::fill(scratch.whole(), 1.0),
        ),
        "launch",
    );
    let generation = match other.sync(other.default_stream()) {
        Err(error) => BackendError::from(error).poisoned_generation(),
        Ok(()) => None,
    };
    assert_eq!(generation, Some(0));
    ok(other.invalidate(0), "invalidate");
    let stale = store.sync_to_host().map(|_| ());
    assert_eq!(
        stale,
        Err(BackendError::StaleDeviceGeneration {
            ordinal: 0,
            resource_generation: 0,
            current_generation: 1,
        })
    );
    let tape = Tape::new(&client);
    assert!(matches!(
        store.register_resident_params(&tape),
        Err(BackendError::StaleDeviceGeneration { .. })
    ));
    let saved: Vec<_> = saved.iter().collect();
    let mut rebuilt = ok(
        DeviceParamStore::new(&tape, &saved),
        "rebuilt from the host copy",
    );
    ok(
        train(&client, &mut rebuilt, &model).1,
        "a step after recovery",
    );
    ok(rebuilt.wait_device(), "it ran");
}

#[test]
fn a_capture_by_another_client_never_poisons_and_the_step_can_be_retried() {
    let client = open();
    let model = model(0x80);
    let mut store = store(&client, &model);
    with_gradients(&client, &mut store, &model, |store, gradients| {
        let other = client.clone();
        let stream = ok(other.create_stream(), "a stream");
        let (_token, guard) = ok(other.begin_capture(stream), "capture");
        assert!(matches!(
            store.step(gradients, &momentum()),
            Err(BackendError::DeviceContextCaptureInProgress { .. })
        ));
        assert!(matches!(
            store.sync_to_host(),
            Err(BackendError::DeviceContextCaptureInProgress { .. })
        ));
        ok(other.end_capture(guard), "the capture ends");
        ok(store.step(gradients, &momentum()), "the retried step");
    });
    assert!(!store.is_poisoned());
    assert_eq!(store.steps(), 1);
    ok(store.sync_to_host(), "the stepped parameters");
}

#[test]
fn a_trap_in_an_adam_step_latches_the_store_as_in_sgd() {
    let model = model(0x81);
    let per_step = tape_launches_per_step(&model);
    // Adam's two moment fills, then its kernel.
    let client = trapping_at(per_step + 3);
    let mut store = store(&client, &model);
    with_gradients(&client, &mut store, &model, |store, gradients| {
        ok(
            store.step_adam(gradients, &cistern_optim::AdamConfig::default()),
            "queued",
        )
    });
    let first = match store.sync_to_host() {
        Err(error @ BackendError::DeviceContextPoisoned(_)) => error,
        other => panic!("the trap is the answer, got {other:?}"),
    };
    refuses_every_call(&client, &mut store, &first);
}

#[test]
fn a_trap_in_an_amp_step_is_its_answer_and_latches_the_store() {
    let model = model(0x82);
    let per_step = tape_launches_per_step(&model);
    // The momentum fill, the flag's fill, the unscale, then the kernel.
    let client = trapping_at(per_step + 4);
    let mut store = store(&client, &model);
    let mut scaler = ok(
        cistern_optim::GradScaler::new(cistern_optim::GradScalerConfig::default()),
        "scaler",
    );
    let answer = with_gradients(&client, &mut store, &model, |store, gradients| {
        store.step_amp(gradients, &momentum(), &mut scaler)
    });
    let first = match answer {
        Err(cistern_client::AutodiffError::Backend(
            error @ BackendError::DeviceContextPoisoned(_),
        )) => error,
        other => panic!("the trap is the answer, got {other:?}"),
    };
    assert_eq!(scaler.growth_tracker(), 0, "the scaler is not updated");
    refuses_every_call(&client, &mut store, &first);
}

#[test]
fn a_queued_step_refused_as_transient_is_put_back_and_retries_to_the_same_result() {
    let model = model(0x81);
    // The batch number of the first step's own launch batch, on a clean device.
    let clean = open();
    let mut reference = store(&clean, &model);
    let mut step_batch = 0;
    with_gradients(&clean, &mut reference, &model, |store, gradients| {
        step_batch = ok(clean.server_stats(), "stats").batches + 1;
        ok(store.step(gradients, &momentum()), "the clean step");
    });
    let want = ok(reference.sync_to_host(), "the clean step's parameters");
    let client = open_with(
        DeviceOptions::with_memory_limit(64 << 20)
            .with_faults(FaultPlan::none().with_busy_batch(step_batch)),
    );
    let mut store = store(&client, &model);
    with_gradients(&client, &mut store, &model, |store, gradients| {
        assert_eq!(ok(client.server_stats(), "stats").batches + 1, step_batch);
        // Queued: the refusal comes back through the step's token.
        ok(store.step(gradients, &momentum()), "the step is queued");
        assert!(matches!(
            store.wait_device(),
            Err(BackendError::DeviceContextCaptureInProgress { .. })
        ));
        assert!(!store.is_poisoned(), "a transient refusal never latches");
        // The next mutating call puts the refused step back (its step
        // count, its momentum's first-step state, the pending forward)
        // and answers the refusal once, running nothing; then the same
        // gradients step again.
        assert!(matches!(
            store.step(gradients, &momentum()),
            Err(BackendError::DeviceContextCaptureInProgress { .. })
        ));
        assert_eq!(store.steps(), 0, "the refused step is put back");
        ok(store.step(gradients, &momentum()), "the retried step");
    });
    assert_eq!(store.steps(), 1, "the refused step is not counted");
    assert_eq!(
        ok(store.sync_to_host(), "the retried step's parameters"),
        want
    );
}

/// Regression (a run beside another client's captures ended 9e-6 away
/// from a quiet one): a tape launch refused as transient left its output
/// stale, the launches after it ran, and the step applied the gradients
/// made from them as if nothing had happened.
#[test]
fn a_tape_launch_refused_as_transient_refuses_the_step_and_changes_nothing() {
    let model = model(0x82);
    let launches = tape_launches_per_step(&model);
    let clean = open();
    let mut reference = store(&clean, &model);
    for step in 0..2 {
        ok(
            train(&clean, &mut reference, &model).1,
            &format!("clean {step}"),
        );
    }
    let want = ok(reference.sync_to_host(), "the clean steps' parameters");
    for n in 1..=launches {
        let opened = open();
        let before = ok(opened.server_stats(), "stats").launches;
        drop(opened);
        let client = open_with(
            DeviceOptions::with_memory_limit(64 << 20)
                .with_faults(FaultPlan::none().with_busy_launch(before + n)),
        );
        let mut store = store(&client, &model);
        let base = ok(client.server_stats(), "stats").launches;
        assert_eq!(
            base, before,
            "the store's making launches as on another device"
        );
        let tape = Tape::new(&client);
        let leaves = ok(store.register_resident_params(&tape), "register");
        let loss = ok(loss(&store, &tape, &leaves, &model), "forward");
        let refused = match store.backward(&tape, &loss) {
            Err(error) => BackendError::from(error),
            Ok(gradients) => match store.step(&gradients, &momentum()) {
                Err(error) => error,
                Ok(()) => match store.wait_device() {
                    Err(error) => error,
                    Ok(()) => panic!("launch {n}: the step ran on gradients of a refused launch"),
                },
            },
        };
        assert!(
            matches!(refused, BackendError::DeviceContextCaptureInProgress { .. }),
            "launch {n}: {refused:?}"
        );
        assert!(
            !store.is_poisoned(),
            "launch {n}: a transient refusal never latches"
        );
        drop(tape);
        // Once the queued work settled, the first mutating call puts back
        // what was refused and answers the refusal once.
        let _ = client.sync(store.stream());
        if store.abandon_pending_forward().is_err() {
            ok(store.abandon_pending_forward(), "abandon");
        }
        assert_eq!(
            store.steps(),
            0,
            "launch {n}: the refused step is not counted"
        );
        assert_eq!(
            ok(store.sync_to_host(), "unchanged"),
            model.params,
            "launch {n}: a refused step changes nothing"
        );
        for step in 0..2 {
            ok(
                train(&client, &mut store, &model).1,
                &format!("launch {n}, step {step}"),
            );
        }
        assert_eq!(ok(store.sync_to_host(), "after"), want, "launch {n}");
    }
}
