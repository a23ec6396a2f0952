//! A recovery in progress seen through the store: while the device retires
//! its context the store answers `DeviceContextRetiring` and is not latched.
//! The store runs on the test device (`cistern_runtime::testing`), which
//! holds the recovery's drain markers until the test lets them go, so the
//! device stays retiring for as long as the test needs, with no sleeps.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use cistern_client::{BackendError, ComputeClient, DeviceParamStore, Tape, Tensor};
use cistern_runtime::testing::{Run, TestDevice, TestOptions, TestServer};
use cistern_runtime::{ContextState, FaultPlan, Health, KernelLaunch, next_server_id, spawn};

use super::common::{model, ok, store};

/// The test device behind a server thread, run by a thread of its own
/// as a healthy device would, except that syncs are held while `hold` is
/// set. Stops its thread when dropped.
struct DrivenDevice {
    client: ComputeClient,
    device: TestDevice,
    hold: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    runner: Option<thread::JoinHandle<()>>,
}

impl DrivenDevice {
    /// A device whose `faults` the server injects.
    fn start(faults: FaultPlan) -> DrivenDevice {
        let options = TestOptions {
            server: next_server_id(),
            faults,
            ..TestOptions::default()
        };
        let TestServer { core, device } = ok(TestServer::start(options), "the test server");
        let client = ComputeClient::of_server(ok(spawn(core), "the server thread"));
        let hold = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let runner = {
            let (device, hold, stop) = (device.clone(), hold.clone(), stop.clone());
            thread::spawn(move || run_device(&device, &hold, &stop))
        };
        DrivenDevice {
            client,
            device,
            hold,
            stop,
            runner: Some(runner),
        }
    }

    /// Holds every sync unanswered from now on (a stream that never drains).
    fn hold_syncs(&self) {
        self.hold.store(true, Ordering::Release);
    }

    /// Answers the held syncs and runs every later one normally.
    fn release_syncs(&self) {
        self.hold.store(false, Ordering::Release);
        for held in self.device.take_held_syncs() {
            let _ = held.send(Ok(()));
        }
    }

    /// Waits until the device publishes `health` (10 s at most).
    fn wait_for(&self, health: Health) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.client.device_state().health != health {
            assert!(
                Instant::now() < deadline,
                "the device never became {health:?}"
            );
            thread::yield_now();
        }
    }
}

impl Drop for DrivenDevice {
    fn drop(&mut self) {
        self.release_syncs();
        self.stop.store(true, Ordering::Release);
        if let Some(runner) = self.runner.take() {
            let _ = runner.join();
        }
    }
}

/// Runs what is queued on `device` and delivers its completions until `stop`.
fn run_device(device: &TestDevice, hold: &AtomicBool, stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        let run = if hold.load(Ordering::Acquire) {
            Run::HoldSyncs
        } else {
            Run::Normal
        };
        let ran = device.run_queued(&run);
        device.deliver(usize::MAX);
        if ran == 0 {
            thread::sleep(Duration::from_micros(200));
        }
    }
}

#[test]
fn a_retiring_device_is_seen_through_the_store_and_never_latches_it() {
    // The first launch traps.
    let driven = DrivenDevice::start(FaultPlan::none().with_trap_at_launch(1));
    let client = driven.client.clone();
    let model = model(0xE9);
    let store = store(&client, &model);
    let saved = ok(store.sync_to_host(), "the last host copy");
    // Another user of the device traps it; the store is not called while
    // the device is poisoned (that would latch it).
    let scratch = ok(client.reserve(64), "scratch");
    let fill = KernelLaunch::fill(scratch.whole(), 1.0);
    ok(client.launch(client.default_stream(), fill), "launch");
    assert!(client.sync(client.default_stream()).is_err(), "the trap");
    // The recovery's drain markers are held: the device stays retiring.
    driven.hold_syncs();
    let recovery = {
        let client = client.clone();
        thread::spawn(move || client.invalidate(0))
    };
    driven.wait_for(Health::Retiring);
    let retiring = Err(BackendError::DeviceContextRetiring { ordinal: 0 });
    assert_eq!(store.sync_to_host().map(|_| ()), retiring);
    assert_eq!(store.wait_device(), retiring);
    assert!(
        !store.is_poisoned(),
        "a transient state never latches the store"
    );
    driven.release_syncs();
    let recovered = recovery.join().ok();
    assert_eq!(recovered, Some(Ok(ContextState::Active { generation: 1 })));
    // Active again: the store is stale (its memory was the old
    // generation's), not poisoned, and a store rebuilt from the host copy works.
    assert_eq!(
        store.sync_to_host().map(|_| ()),
        Err(BackendError::StaleDeviceGeneration {
            ordinal: 0,
            resource_generation: 0,
            current_generation: 1,
        })
    );
    assert!(!store.is_poisoned());
    let tape = Tape::new(&client);
    let params: Vec<&Tensor<f32>> = saved.iter().collect();
    let rebuilt = ok(DeviceParamStore::new(&tape, &params), "rebuilt");
    assert_eq!(ok(rebuilt.sync_to_host(), "the rebuilt parameters"), saved);
    ok(
        rebuilt.wait_device(),
        "the rebuilt store waits on the device",
    );
}
