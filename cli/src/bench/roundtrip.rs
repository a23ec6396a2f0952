//! `cistern bench roundtrip`: the cost of talking to a device server,
//! against a bare channel measured in the same run.
//!
//! Prints JSON lines: the reference channel (ping-pong latency and one-way
//! rate), a bare three-thread ring (a diagnostic: the round trip's topology
//! without the server), the blocking round trip of a sync on an idle stream
//! (answered by the server: two hops), a command the server answers
//! itself (a diagnostic), and the rate of asynchronous empty-kernel
//! launches followed by one sync, and a captured graph of 64 empty-kernel
//! launches replayed against the same launches sent one by one (issue 6).
//! The run fails unless the server served exactly the commands sent and
//! the device ran exactly the empty kernels launched.
//!
//! The reference and the server are measured in alternating blocks, so a
//! change in the machine's speed during the run (these machines have slow
//! spells lasting minutes) reaches both sides of each ratio alike.
//!
//! The server runs on `--device` (`cpu:0` by default; `cuda:0` launches
//! real empty kernels); the channels are the host's either way. Every line
//! names the device.

use std::thread;
use std::time::{Duration, Instant};

use cistern_client::ComputeClient;
use cistern_runtime::sync::{PATIENCE, Receiver, Sender, recv_patiently, unbounded};
use cistern_runtime::{Device, DeviceOptions, KernelLaunch, StreamId};

const WARMUP: usize = 10_000;
const ROUND_TRIPS: usize = 200_000;
const ONE_WAY_MESSAGES: usize = 2_000_000;
const SUBMITS: usize = 1_000_000;
/// Launches of the diagnostic that binds memory.
const BOUND_SUBMITS: usize = 500_000;
/// Alternating blocks each side of a ratio is measured in.
const BLOCKS: usize = 20;
/// Round trips at the start of each block that are not sampled (the
/// other side's threads may have gone to sleep meanwhile).
const BLOCK_WARMUP: usize = 500;
/// Launches in the replayed graph.
const GRAPH_LAUNCHES: usize = 64;
/// Replays (and as many rounds of direct launches) per trial.
const REPLAY_ROUNDS: usize = 4_000;
/// Trials of each, alternated; the fastest of each is reported.
const REPLAY_TRIALS: usize = 3;

/// Runs the benchmark on `device` and prints its JSON lines.
pub fn run(device: Device) -> Result<(), String> {
    let client = ComputeClient::open(device, DeviceOptions::with_memory_limit(64 << 20))
        .map_err(|e| format!("cannot open {device}: {e}"))?;
    let stream = client.default_stream();
    for _ in 0..WARMUP {
        client.sync(stream).map_err(error("sync"))?;
    }

    // Latency: channel ping-pong and server round trips, block by block.
    let echo = Echo::spawn();
    let (mut channel_samples, mut server_samples) = (Vec::new(), Vec::new());
    for _ in 0..BLOCKS {
        echo.ping_pong(ROUND_TRIPS / BLOCKS, &mut channel_samples)?;
        timed_block(ROUND_TRIPS / BLOCKS, &mut server_samples, || {
            client.sync(stream).map_err(error("sync"))
        })?;
    }
    echo.stop()?;

    // Throughput: channel one-way and launches, block by block.
    let (mut channel_time, mut submit_time) = (0.0, 0.0);
    for _ in 0..BLOCKS {
        channel_time += channel_one_way(ONE_WAY_MESSAGES / BLOCKS)?;
        let start = Instant::now();
        for _ in 0..SUBMITS / BLOCKS {
            client
                .launch(stream, KernelLaunch::empty())
                .map_err(error("launch"))?;
        }
        client.sync(stream).map_err(error("sync"))?;
        submit_time += start.elapsed().as_secs_f64();
    }
    let one_way = (ONE_WAY_MESSAGES / BLOCKS * BLOCKS) as f64 / channel_time;
    let submits_per_s = (SUBMITS / BLOCKS * BLOCKS) as f64 / submit_time;

    let channel = Percentiles::of(channel_samples);
    print_line(
        device,
        serde_json::json!({
            "bench": "channel",
            "p50_ns": channel.p50,
            "p99_ns": channel.p99,
            "msgs_per_s": one_way.round(),
        }),
    );

    // Diagnostic: the bare cost of a three-thread ring (client, server,
    // executor), waiting the way the server's threads do.
    let ring = channel_ring(3)?;
    print_line(
        device,
        serde_json::json!({
            "bench": "channel_ring3",
            "p50_ns": ring.p50,
            "p99_ns": ring.p99,
        }),
    );

    let roundtrip = Percentiles::of(server_samples);
    print_line(
        device,
        serde_json::json!({
            "bench": "roundtrip",
            "p50_ns": roundtrip.p50,
            "p99_ns": roundtrip.p99,
            "p50_vs_channel": ratio(roundtrip.p50, channel.p50),
            "p99_vs_channel": ratio(roundtrip.p99, channel.p99),
            "p50_vs_ring3": ratio(roundtrip.p50, ring.p50),
        }),
    );

    // Diagnostic: a command the server answers itself, with no stream.
    let mut samples = Vec::with_capacity(ROUND_TRIPS);
    timed_block(ROUND_TRIPS, &mut samples, || {
        client
            .server_stats()
            .map(drop)
            .map_err(error("server_stats"))
    })?;
    let answered = Percentiles::of(samples);
    print_line(
        device,
        serde_json::json!({
            "bench": "server_answer",
            "p50_ns": answered.p50,
            "p99_ns": answered.p99,
            "p50_vs_channel": ratio(answered.p50, channel.p50),
        }),
    );

    let stats = client.server_stats().map_err(error("server_stats"))?;
    let blocks = BLOCKS as u64;
    let launches = SUBMITS as u64 / blocks * blocks;
    let timed_syncs = (BLOCK_WARMUP + ROUND_TRIPS / BLOCKS) as u64 * blocks;
    let syncs = WARMUP as u64 + timed_syncs + blocks;
    let stats_calls = (BLOCK_WARMUP + ROUND_TRIPS) as u64 + 1;
    let sent = syncs + stats_calls + launches;
    if stats.commands != sent || stats.syncs != syncs || stats.launches != launches {
        return Err(format!(
            "the server served {} commands ({} syncs, {} launches); {sent} were sent \
             ({syncs} syncs, {launches} launches)",
            stats.commands, stats.syncs, stats.launches
        ));
    }
    if stats.empty_kernel_runs != launches {
        return Err(format!(
            "the device ran the empty kernel {} times; {launches} were launched",
            stats.empty_kernel_runs
        ));
    }
    print_line(
        device,
        serde_json::json!({
            "bench": "submit",
            "commands_per_s": submits_per_s.round(),
            "vs_channel_one_way": submits_per_s / one_way,
            "commands_served": stats.commands,
            "empty_kernel_runs": stats.empty_kernel_runs,
        }),
    );

    replay(&client, stream)?;
    bound_submits(&client, stream)
}

/// Diagnostic: launches that bind memory (`Fill` of a 16-float buffer),
/// the shape of a training program's launches, checked against the
/// device's count of kernels run.
fn bound_submits(client: &ComputeClient, stream: StreamId) -> Result<(), String> {
    let buffer = client.upload_f32(&[0.0; 16]).map_err(error("upload"))?;
    client.sync(stream).map_err(error("sync"))?;
    let kernels_run = || {
        client
            .server_stats()
            .map(|stats| stats.kernels_run)
            .map_err(error("server_stats"))
    };
    let before = kernels_run()?;
    let start = Instant::now();
    for launch in 0..BOUND_SUBMITS {
        let fill = KernelLaunch::fill(buffer.whole(), launch as f32);
        client.launch(stream, fill).map_err(error("launch"))?;
    }
    client.sync(stream).map_err(error("sync"))?;
    let elapsed = start.elapsed().as_secs_f64();
    let ran = kernels_run()? - before;
    if ran != BOUND_SUBMITS as u64 {
        return Err(format!(
            "the device ran {ran} kernels; {BOUND_SUBMITS} fills were launched"
        ));
    }
    let last = client.download_f32(&buffer).map_err(error("download"))?;
    let expected = (BOUND_SUBMITS - 1) as f32;
    if last.iter().any(|value| *value != expected) {
        return Err(format!(
            "the buffer holds {last:?} after the last fill of {expected}"
        ));
    }
    print_line(
        client.device(),
        serde_json::json!({
            "bench": "submit_bound",
            "bindings": 1,
            "commands_per_s": (BOUND_SUBMITS as f64 / elapsed).round(),
            "kernels_run": ran,
        }),
    );
    Ok(())
}

/// Times `rounds` calls of `work`, pushing each time after the block's warm-up.
fn timed_block(
    rounds: usize,
    samples: &mut Vec<u64>,
    mut work: impl FnMut() -> Result<(), String>,
) -> Result<(), String> {
    for round in 0..BLOCK_WARMUP + rounds {
        let start = Instant::now();
        work()?;
        if round >= BLOCK_WARMUP {
            samples.push(nanos(start.elapsed()));
        }
    }
    Ok(())
}

/// A graph of `GRAPH_LAUNCHES` empty kernels replayed, against the same
/// launches sent one by one; both synced at the end of each trial, and
/// both checked against the device's count of empty-kernel runs.
fn replay(client: &ComputeClient, stream: StreamId) -> Result<(), String> {
    let (token, guard) = client
        .begin_capture(stream)
        .map_err(error("begin_capture"))?;
    token
        .launch_batch(vec![KernelLaunch::empty(); GRAPH_LAUNCHES])
        .map_err(error("record"))?;
    let graph = client.end_capture(guard).map_err(error("end_capture"))?;
    let launches = (REPLAY_ROUNDS * GRAPH_LAUNCHES) as u64;
    let runs = || {
        client
            .server_stats()
            .map(|stats| stats.empty_kernel_runs)
            .map_err(error("server_stats"))
    };
    let timed = |work: &dyn Fn() -> Result<(), String>| -> Result<f64, String> {
        let before = runs()?;
        let start = Instant::now();
        work()?;
        client.sync(stream).map_err(error("sync"))?;
        let elapsed = nanos(start.elapsed());
        let ran = runs()? - before;
        if ran != launches {
            return Err(format!(
                "the device ran the empty kernel {ran} times; {launches} were launched"
            ));
        }
        Ok(elapsed as f64 / launches as f64)
    };
    let direct = || -> Result<(), String> {
        for _ in 0..REPLAY_ROUNDS * GRAPH_LAUNCHES {
            client
                .launch(stream, KernelLaunch::empty())
                .map_err(error("launch"))?;
        }
        Ok(())
    };
    let replayed = || -> Result<(), String> {
        for _ in 0..REPLAY_ROUNDS {
            client.replay(stream, &graph).map_err(error("replay"))?;
        }
        Ok(())
    };
    let (mut best_direct, mut best_replay) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..REPLAY_TRIALS {
        best_direct = best_direct.min(timed(&direct)?);
        best_replay = best_replay.min(timed(&replayed)?);
    }
    print_line(
        client.device(),
        serde_json::json!({
            "bench": "replay",
            "launches": GRAPH_LAUNCHES,
            "ns_per_launch": round2(best_replay),
            "direct_ns_per_launch": round2(best_direct),
            "vs_direct": round2(best_replay / best_direct),
        }),
    );
    Ok(())
}

fn round2(value: f64) -> f64 {
    (value * 100.0).round() / 100.0
}

/// A thread that sends back every message: the reference round trip.
struct Echo {
    ping: Sender<u64>,
    ponged: Receiver<u64>,
    thread: thread::JoinHandle<()>,
}

impl Echo {
    fn spawn() -> Echo {
        let (ping, pinged) = unbounded::<u64>();
        let (pong, ponged) = unbounded::<u64>();
        let thread = thread::spawn(move || {
            while let Ok(value) = pinged.recv() {
                if pong.send(value).is_err() {
                    break;
                }
            }
        });
        Echo {
            ping,
            ponged,
            thread,
        }
    }

    /// Times `rounds` messages there and back.
    fn ping_pong(&self, rounds: usize, samples: &mut Vec<u64>) -> Result<(), String> {
        timed_block(rounds, samples, || {
            self.ping.send(0).map_err(|_| "echo thread ended")?;
            self.ponged.recv().map_err(|_| "echo thread ended")?;
            Ok(())
        })
    }

    fn stop(self) -> Result<(), String> {
        drop(self.ping);
        self.thread
            .join()
            .map_err(|_| "echo thread panicked".to_string())
    }
}

/// Latency of a message around a ring of `threads` threads (the caller
/// included), each waiting with [`recv_patiently`] as the server's threads do.
fn channel_ring(threads: usize) -> Result<Percentiles, String> {
    let links: Vec<_> = (0..threads).map(|_| unbounded::<u64>()).collect();
    let mut relays = Vec::new();
    for position in 1..threads {
        let inbox = links[position].1.clone();
        let next = links[(position + 1) % threads].0.clone();
        relays.push(thread::spawn(move || {
            while let Ok(value) = recv_patiently(&inbox, PATIENCE) {
                if next.send(value).is_err() {
                    break;
                }
            }
        }));
    }
    let (first, home) = (links[1].0.clone(), links[0].1.clone());
    drop(links);
    let mut samples = Vec::with_capacity(ROUND_TRIPS);
    for round in 0..WARMUP + ROUND_TRIPS {
        let start = Instant::now();
        first.send(round as u64).map_err(|_| "relay thread ended")?;
        recv_patiently(&home, PATIENCE).map_err(|_| "relay thread ended")?;
        if round >= WARMUP {
            samples.push(nanos(start.elapsed()));
        }
    }
    drop(first);
    drop(home);
    for relay in relays {
        relay.join().map_err(|_| "relay thread panicked")?;
    }
    Ok(Percentiles::of(samples))
}

/// Seconds to send `messages` from one thread to another (until the
/// receiver has them all).
fn channel_one_way(messages: usize) -> Result<f64, String> {
    let (sender, receiver) = unbounded::<u64>();
    let sink = thread::spawn(move || {
        let mut received = 0usize;
        while receiver.recv().is_ok() {
            received += 1;
        }
        received
    });
    let start = Instant::now();
    for message in 0..messages {
        sender.send(message as u64).map_err(|_| "sink ended")?;
    }
    drop(sender);
    let received = sink.join().map_err(|_| "sink panicked")?;
    let elapsed = start.elapsed().as_secs_f64();
    if received != messages {
        return Err(format!("{received} of {messages} messages arrived"));
    }
    Ok(elapsed)
}

struct Percentiles {
    p50: u64,
    p99: u64,
}

impl Percentiles {
    fn of(mut samples: Vec<u64>) -> Self {
        samples.sort_unstable();
        let at = |fraction: f64| {
            let index = ((samples.len() as f64 * fraction) as usize).min(samples.len() - 1);
            samples[index]
        };
        Percentiles {
            p50: at(0.50),
            p99: at(0.99),
        }
    }
}

/// Turns a server error into the run's failure message.
fn error(what: &'static str) -> impl Fn(cistern_runtime::ServerError) -> String {
    move |e| format!("{what}: {e}")
}

fn nanos(elapsed: Duration) -> u64 {
    u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)
}

fn ratio(value: u64, reference: u64) -> f64 {
    value as f64 / reference.max(1) as f64
}

/// Prints one JSON result line, naming the device the server ran on.
fn print_line(device: Device, mut line: serde_json::Value) {
    line["device"] = device.to_string().into();
    println!("{line}");
}
