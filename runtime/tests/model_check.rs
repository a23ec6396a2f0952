//! Model checks of where threads meet, with loom: each test runs the real
//! code (the one-shot reply, the inbox, the failure token, the server
//! thread over the test device) under every interleaving loom explores
//! within its preemption bound. A hang is a deadlock loom reports.
//!
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p
//! cistern-runtime --no-default-features --features testing --test
//! model_check -- --nocapture` (as CI runs it; a build of its own, since
//! the flag reaches every crate); without `--cfg loom` it holds no test;
//! `LOOM_MAX_PREEMPTIONS` overrides the bounds (see `docs/reliability.md`,
//! "Concurrency model checking").
#![cfg(loom)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use cistern_runtime::backend::Completion;
use cistern_runtime::sync::atomic::{AtomicBool, Ordering as SyncOrdering};
use cistern_runtime::sync::{
    Arc, InboxSender, RecvError, TryRecvError, Waited, inbox, oneshot, recv_patiently, thread,
};
use cistern_runtime::testing::{Run, TestDevice, TestServer, trap_poison};
use cistern_runtime::{
    Binding, BufferRef, Command, ContextState, DEFAULT_STREAM, FailureToken, FaultPlan, GraphRef,
    Health, KernelLaunch, PendingToken, ServerError, ServerHandle, spawn,
};

/// The preemption bound of the primitives' models when
/// `LOOM_MAX_PREEMPTIONS` is not set.
const PREEMPTIONS: usize = 3;

/// The bound of the models with a server thread: each step of a real
/// server is many more points to preempt at (see `docs/reliability.md`).
const SERVER_PREEMPTIONS: usize = 1;

const NO_PATIENCE: std::time::Duration = std::time::Duration::ZERO;

/// Runs `model` under loom with at most `bound` preemptions (unless
/// `LOOM_MAX_PREEMPTIONS` says otherwise) and prints how many
/// interleavings it explored.
fn check(name: &str, bound: usize, model: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    let bound = *builder.preemption_bound.get_or_insert(bound);
    let runs = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let started = Instant::now();
    let model = std::sync::Arc::new(model);
    builder.check(move || {
        counted.fetch_add(1, Ordering::Relaxed);
        // loom's first thread has a 32 KiB stack: the model runs on one with std's.
        let model = model.clone();
        assert!(thread::spawn(move || model()).join().is_ok());
    });
    println!(
        "model {name}: {} interleavings, preemption bound {bound}, {:.2} s",
        runs.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn a_reply_sent_while_the_caller_waits_is_received_exactly_once() {
    check("oneshot-send", PREEMPTIONS, || {
        let (reply, answer) = oneshot();
        let server = thread::spawn(move || {
            assert!(reply.send(7).is_ok());
            assert!(reply.send(8).is_err(), "a second send is refused");
        });
        assert_eq!(recv_patiently(&answer, NO_PATIENCE), Ok(7));
        assert_eq!(answer.try_recv(), Err(TryRecvError::Disconnected));
        assert!(server.join().is_ok());
    });
}

#[test]
fn a_reply_dropped_unsent_is_a_disconnect_never_a_hang() {
    check("oneshot-drop", PREEMPTIONS, || {
        let (reply, answer) = oneshot::<u32>();
        let server = thread::spawn(move || drop(reply));
        assert_eq!(recv_patiently(&answer, NO_PATIENCE), Err(RecvError));
        assert!(server.join().is_ok());
    });
}

#[test]
fn a_reply_racing_its_callers_drop_is_freed_once() {
    check("oneshot-abandoned", PREEMPTIONS, || {
        let (reply, answer) = oneshot::<Arc<()>>();
        let value = Arc::new(());
        let sent = value.clone();
        let server = thread::spawn(move || reply.send(sent).is_ok());
        drop(answer);
        assert!(
            server.join().unwrap_or(false),
            "a send never sees its caller go"
        );
        assert_eq!(Arc::strong_count(&value), 1, "the unread reply was dropped");
    });
}

/// Sends `items` tagged with `sender` through a shared inbox side.
fn send_all(inbox: &Arc<InboxSender<(u8, u8)>>, sender: u8, items: u8) -> thread::JoinHandle<()> {
    let inbox = inbox.clone();
    thread::spawn(move || {
        for item in 0..items {
            assert!(inbox.send((sender, item)).is_ok());
        }
    })
}

#[test]
fn every_command_from_two_senders_is_taken_once_in_each_senders_order() {
    check("inbox-order", PREEMPTIONS, || {
        let (sender, receiver) = inbox();
        let sender = Arc::new(sender);
        let senders = [send_all(&sender, 0, 2), send_all(&sender, 1, 1)];
        let mut next = [0u8; 2];
        let mut batch = Vec::new();
        while next.iter().sum::<u8>() < 3 {
            if receiver.take(&mut batch) == 0 {
                assert_eq!(receiver.wait(NO_PATIENCE, None), Waited::Ready);
                continue;
            }
            for (from, item) in batch.drain(..) {
                assert_eq!(item, next[usize::from(from)], "sender {from} out of order");
                next[usize::from(from)] += 1;
            }
        }
        for sender in senders {
            assert!(sender.join().is_ok());
        }
    });
}

#[test]
fn a_sleeping_server_wakes_for_a_command_and_for_its_last_sender_going() {
    check("inbox-wakeup", PREEMPTIONS, || {
        let (sender, receiver) = inbox();
        let client = thread::spawn(move || {
            assert!(sender.send(1u8).is_ok());
        });
        assert_eq!(receiver.wait(NO_PATIENCE, None), Waited::Ready);
        let mut batch = Vec::new();
        assert_eq!(receiver.take(&mut batch), 1);
        assert_eq!(receiver.wait(NO_PATIENCE, None), Waited::Abandoned);
        assert!(client.join().is_ok());
    });
}

#[test]
fn a_command_sent_as_the_server_goes_is_given_back_or_dropped_never_leaked() {
    check("inbox-closed", PREEMPTIONS, || {
        let (sender, receiver) = inbox();
        let command = Arc::new(());
        let sent = command.clone();
        let server = thread::spawn(move || drop(receiver));
        let refused = sender.send(sent).err();
        assert!(server.join().is_ok());
        drop(refused);
        assert_eq!(Arc::strong_count(&command), 1);
    });
}

#[test]
fn every_owner_waiting_on_a_token_wakes_with_its_outcome_or_server_gone() {
    check("token", PREEMPTIONS, || {
        let token = FailureToken::new();
        let pending = PendingToken::new(token.clone(), 0);
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let token = token.clone();
                thread::spawn(move || token.wait())
            })
            .collect();
        // The executor's work was discarded unrun.
        drop(pending);
        for waiter in waiters {
            let outcome = waiter.join().ok();
            assert_eq!(outcome, Some(Err(ServerError::ServerGone { ordinal: 0 })));
        }
    });
}

/// A server thread over the test device, started with `faults`.
fn serve(faults: FaultPlan) -> (Arc<ServerHandle>, TestDevice) {
    let TestServer { core, device } = TestServer::with_faults(faults);
    match spawn(core) {
        Ok(handle) => (Arc::new(handle), device),
        Err(error) => panic!("the server thread starts: {error}"),
    }
}

/// Asks `server` for its context state on another thread.
fn ask_state(server: &Arc<ServerHandle>) -> thread::JoinHandle<Result<ContextState, ServerError>> {
    let server = server.clone();
    thread::spawn(move || server.call(|reply| Command::ContextState { reply }))
}

#[test]
fn a_caller_waiting_as_the_server_shuts_down_gets_its_answer_or_server_gone() {
    check("server-shutdown", SERVER_PREEMPTIONS, || {
        let (server, _device) = serve(FaultPlan::none());
        let caller = ask_state(&server);
        assert_eq!(server.shutdown(), Ok(()));
        match caller.join() {
            Ok(Ok(state)) => assert_eq!(state, ContextState::Active { generation: 0 }),
            Ok(Err(error)) => assert_eq!(error, ServerError::ServerGone { ordinal: 0 }),
            Err(_) => panic!("the caller thread panicked"),
        }
        // The answer to the shutdown may come before the thread ends:
        // a call after it waits for the end and is told why.
        let later = server.call(|reply| Command::ContextState { reply });
        assert_eq!(later, Err(ServerError::ServerGone { ordinal: 0 }));
    });
}

/// Keeps the panic hook quiet about the server panics the models inject.
fn hush_injected_panics() {
    static HUSHED: std::sync::Once = std::sync::Once::new();
    HUSHED.call_once(|| {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = info.payload().downcast_ref::<String>();
            if !message.is_some_and(|message| message.starts_with("injected server panic")) {
                report(info);
            }
        }));
    });
}

#[test]
fn every_caller_waiting_when_the_server_thread_panics_is_told_it_panicked() {
    hush_injected_panics();
    check("server-panic", SERVER_PREEMPTIONS, || {
        // The first command handled panics the server thread.
        let (server, _device) = serve(FaultPlan::none().with_server_panic_at_command(1));
        let callers = [ask_state(&server), ask_state(&server)];
        for caller in callers {
            match caller.join() {
                Ok(Err(ServerError::ServerPanicked { ordinal: 0, .. })) => {}
                other => panic!("a caller of a panicked server got {other:?}"),
            }
        }
        let ended = server.ended();
        assert!(matches!(ended, Some(ServerError::ServerPanicked { .. })));
    });
}

#[test]
fn the_published_state_never_lags_an_answer_nor_goes_back() {
    check("published", SERVER_PREEMPTIONS, || {
        let (server, device) = serve(FaultPlan::none());
        let watcher = {
            let server = server.clone();
            thread::spawn(move || [server.device_state(), server.device_state()])
        };
        let executor = thread::spawn(move || {
            device.report(Completion {
                stream: DEFAULT_STREAM,
                sequence: 0,
                fault: Some(trap_poison(0)),
            });
        });
        assert!(executor.join().is_ok());
        // The server reads completions before each command: this one sees the fault.
        let state = server.call(|reply| Command::ContextState { reply });
        assert!(matches!(state, Ok(ContextState::Poisoned { .. })));
        assert_eq!(server.device_state().health, Health::Poisoned);
        let seen = watcher
            .join()
            .unwrap_or_else(|_| panic!("the watcher panicked"));
        assert!(seen.iter().all(|state| state.generation == 0));
        let went_back = seen[0].health == Health::Poisoned && seen[1].health == Health::Active;
        assert!(!went_back, "the watch went back: {seen:?}");
        assert_eq!(server.shutdown(), Ok(()));
    });
}

#[test]
fn of_two_captures_begun_at_once_exactly_one_records_and_the_other_is_refused() {
    check("capture", SERVER_PREEMPTIONS, || {
        let (server, _device) = serve(FaultPlan::none());
        let begin = || {
            let server = server.clone();
            thread::spawn(move || {
                server.call(|reply| Command::BeginCapture {
                    stream: DEFAULT_STREAM,
                    reply,
                })
            })
        };
        let captures = [begin(), begin()];
        let outcomes: Vec<_> = captures
            .into_iter()
            .map(|capture| capture.join().ok())
            .collect();
        let began = outcomes
            .iter()
            .filter(|outcome| matches!(outcome, Some(Ok(_))))
            .count();
        let refused = ServerError::CaptureInProgress { ordinal: 0 };
        let lost = outcomes
            .iter()
            .filter(|outcome| **outcome == Some(Err(refused.clone())));
        assert_eq!((began, lost.count()), (1, 1), "{outcomes:?}");
        assert_eq!(server.device_state().health, Health::Capturing);
        assert_eq!(server.shutdown(), Ok(()));
    });
}

/// Runs the test device's queue until `stop`, as an executor would; after
/// work ran, a state query stands in for the recovery tick (the model has
/// no clock), so the server takes the recovery's next step.
fn run_device(
    server: &Arc<ServerHandle>,
    device: TestDevice,
    stop: &Arc<AtomicBool>,
) -> thread::JoinHandle<()> {
    let (server, stop) = (server.clone(), stop.clone());
    thread::spawn(move || {
        while !stop.load(SyncOrdering::Acquire) {
            let ran = device.run_queued(&Run::Normal);
            device.deliver(usize::MAX);
            if ran > 0 {
                let _ = server.call(|reply| Command::ContextState { reply });
            } else {
                thread::yield_now();
            }
        }
    })
}

#[test]
fn two_invalidates_of_one_poisoning_advance_the_generation_once() {
    check("invalidate", SERVER_PREEMPTIONS, || {
        let mut harness = TestServer::new();
        harness.poison();
        let TestServer { core, device } = harness;
        let resets = device.clone();
        let server = match spawn(core) {
            Ok(handle) => Arc::new(handle),
            Err(error) => panic!("the server thread starts: {error}"),
        };
        let stop = Arc::new(AtomicBool::new(false));
        let executor = run_device(&server, device, &stop);
        let other = {
            let server = server.clone();
            thread::spawn(move || {
                server.call(|reply| Command::Invalidate {
                    seen_generation: 0,
                    reply,
                })
            })
        };
        let mine = server.call(|reply| Command::Invalidate {
            seen_generation: 0,
            reply,
        });
        let other = other.join().ok();
        stop.store(true, SyncOrdering::Release);
        assert!(executor.join().is_ok());
        let recovered = ContextState::Active { generation: 1 };
        assert_eq!(mine, Ok(recovered.clone()));
        assert_eq!(other, Some(Ok(recovered)));
        assert_eq!(
            resets.reset_generations(),
            vec![1],
            "one recovery, one reset"
        );
        assert_eq!(server.shutdown(), Ok(()));
    });
}

/// A server holding one 64-byte allocation and a graph that uses it.
fn serve_a_graph() -> (Arc<ServerHandle>, TestDevice, BufferRef, GraphRef) {
    let mut harness = TestServer::new();
    let buffer = harness.reserve(64);
    let capture = harness.call(|reply| Command::BeginCapture {
        stream: DEFAULT_STREAM,
        reply,
    });
    let capture = capture.unwrap_or_else(|error| panic!("the capture begins: {error}"));
    let binding = Binding {
        buffer,
        offset: 0,
        size: 64,
    };
    let launches = vec![KernelLaunch::fill(binding, 1.0)];
    let recorded = harness.call(|reply| Command::CaptureLaunch {
        capture,
        launches,
        reply,
    });
    assert_eq!(recorded, Ok(()));
    let graph = harness.call(|reply| Command::EndCapture { capture, reply });
    let graph = graph.unwrap_or_else(|error| panic!("the capture ends: {error}"));
    let TestServer { core, device } = harness;
    match spawn(core) {
        Ok(handle) => (Arc::new(handle), device, buffer, graph.graph),
        Err(error) => panic!("the server thread starts: {error}"),
    }
}

#[test]
fn a_free_racing_the_release_of_the_graph_holding_it_frees_it_once() {
    check("deferred-free", SERVER_PREEMPTIONS, || {
        let (server, _device, buffer, graph) = serve_a_graph();
        let send = |command: Command| {
            let server = server.clone();
            thread::spawn(move || server.send(command))
        };
        // The last handle's drop, and the graph's owner letting it go.
        let senders = [
            send(Command::Free { buffer }),
            send(Command::ReleaseGraph { graph }),
        ];
        for sender in senders {
            assert_eq!(sender.join().ok(), Some(Ok(())));
        }
        let stats = server.call(|reply| Command::MemoryStats { reply });
        let live = stats.map(|stats| stats.live_allocations);
        assert_eq!(live, Ok(0), "freed whichever came first");
        assert_eq!(server.shutdown(), Ok(()));
    });
}
