//! One seeded run: clients, the scheduler that interleaves them with the
//! device, and the check of every answer against the model.

use std::collections::{BTreeSet, VecDeque};
use std::time::Instant;

use cistern::memory::{MemoryConfig, SplitMix64};
use cistern::runtime::sync::{Reply, reply_channel};
use cistern::runtime::testing::{Run, TestBackend, TestDevice, TestOptions, TestServer};
use cistern::runtime::{
    Command, ContextState, DEFAULT_STREAM, ErrorCode, FaultPlan, ProbeFault, ServerCore,
    ServerError,
};

#[path = "answers.rs"]
mod answers;
#[path = "batches.rs"]
mod batches;
#[path = "capture.rs"]
mod capture;
#[path = "ops.rs"]
mod ops;
#[path = "streams.rs"]
mod streams;

use super::invariants::Watch;
use super::model::{Buffer, Client, gate_code};

/// Clients per run.
const CLIENTS: usize = 4;

/// A failed invariant: where, and what.
pub type Failure = String;

/// The faults a run may see, so answers can be told apart from bugs.
pub struct Faults {
    pub plan: FaultPlan,
    /// Reservations and transfers refused by the plan so far.
    pub injected_reservations: u32,
    pub injected_transfers: u32,
    /// Generations in which a client launched a trap.
    pub trapped_generations: Vec<u64>,
    /// The probe faults not used yet, as the server's injector holds them.
    pub probe_faults: VecDeque<ProbeFault>,
}

impl Faults {
    /// Whether a kernel may have trapped in `generation`.
    pub fn trap_possible(&self, generation: u64) -> bool {
        self.plan.trap_launch.is_some()
            || self.plan.launch_trap_rate.is_some()
            || self.trapped_generations.contains(&generation)
    }

    /// How the next recovery must end, from the probe faults left (`true`:
    /// unrecoverable), consuming the attempts it makes; `None` when an
    /// injected trap may hit the probe's own kernel, so only the probe
    /// faults cannot tell.
    pub fn next_recovery_fails(&mut self) -> Option<bool> {
        let exact = self.plan.trap_launch.is_none() && self.plan.launch_trap_rate.is_none();
        for _attempt in 0..3 {
            match self.probe_faults.pop_front() {
                None => return exact.then_some(false),
                Some(ProbeFault::OperationLocal) => continue,
                Some(ProbeFault::Sticky | ProbeFault::Mismatch) => return exact.then_some(true),
            }
        }
        // Three operation-local failures in a row are final.
        exact.then_some(true)
    }

    /// Whether a recovery may legitimately fail.
    pub fn unrecoverable_possible(&self) -> bool {
        self.plan.trap_launch.is_some()
            || self.plan.launch_trap_rate.is_some()
            || self
                .plan
                .probe_faults
                .iter()
                .any(|fault| *fault != ProbeFault::OperationLocal)
            || self.plan.probe_faults.len() >= 3
    }
}

/// Counts of what a run exercised.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Coverage {
    /// Reads answered with bytes and compared with the model.
    pub reads_verified: u64,
    /// Refusals by a poisoned, retiring or lost context.
    pub gate_refusals: u64,
    /// Stale handles refused as stale.
    pub stale_refusals: u64,
    /// Work failed on the device by a trap.
    pub device_failures: u64,
    /// Injected reservation and transfer failures answered.
    pub injected: u64,
    /// Slices moved by compaction.
    pub compacted: u64,
    /// Commands sent, of every kind.
    pub commands: u64,
    /// Launch batches and optimizer steps queued.
    pub batches: u64,
    /// Batches refused whole for one bad launch.
    pub batches_refused: u64,
    /// Events recorded and waits on them queued.
    pub events: u64,
    /// Streams created and destroyed by clients.
    pub streams: u64,
    /// Graphs captured, and replays queued.
    pub graphs: u64,
    pub replays: u64,
    /// Stale graphs refused as stale.
    pub stale_graph_refusals: u64,
    /// Refusals of a context that was already unrecoverable.
    pub lost_refusals: u64,
    /// Recoveries whose outcome the probe faults predicted, and matched.
    pub predicted_recoveries: u64,
    /// Runs that ended with every handle dropped and reserved at baseline.
    pub baseline_checks: u64,
}

impl Coverage {
    /// Adds another run's counts to these.
    pub fn add(&mut self, other: &Coverage) {
        self.reads_verified += other.reads_verified;
        self.gate_refusals += other.gate_refusals;
        self.stale_refusals += other.stale_refusals;
        self.device_failures += other.device_failures;
        self.injected += other.injected;
        self.compacted += other.compacted;
        self.commands += other.commands;
        self.batches += other.batches;
        self.batches_refused += other.batches_refused;
        self.events += other.events;
        self.streams += other.streams;
        self.graphs += other.graphs;
        self.replays += other.replays;
        self.stale_graph_refusals += other.stale_graph_refusals;
        self.lost_refusals += other.lost_refusals;
        self.predicted_recoveries += other.predicted_recoveries;
        self.baseline_checks += other.baseline_checks;
    }
}

/// The whole simulated world of one seed.
pub struct World {
    pub core: ServerCore<TestBackend>,
    pub device: TestDevice,
    pub clients: Vec<Client>,
    pub faults: Faults,
    pub rng: SplitMix64,
    pub step: usize,
    watch: Watch,
    trap_percent: u64,
    /// Each stream's relative speed on the device.
    speeds: Vec<u64>,
    /// What the run exercised, so a green run is not a vacuous one.
    pub seen: Coverage,
    /// Print each client's action (`CISTERN_SIM_TRACE`), for replaying a seed.
    pub trace: bool,
    /// A hash of every command sent and every answer seen, in order.
    pub trace_hash: u64,
    /// The last client actions, printed with a failure.
    pub recent: VecDeque<String>,
    /// Reserved bytes once the clients' streams exist.
    baseline_reserved: u64,
    /// Generations that successful invalidates answered, each once.
    pub recovered_to: BTreeSet<u64>,
    /// The capture a client began, while the context still captures.
    capture_in_progress: Option<cistern::runtime::CaptureId>,
}

/// Client actions kept for a failure's report.
const RECENT: usize = 16;

fn probe_faults_for(rng: &mut SplitMix64) -> Vec<ProbeFault> {
    if rng.chance_percent(25) {
        // Three failed probes in a row: the first recovery must fail.
        return vec![ProbeFault::OperationLocal; 3];
    }
    (0..1 + rng.below(4))
        .map(|_| match rng.below(10) {
            0..6 => ProbeFault::OperationLocal,
            6..8 => ProbeFault::Sticky,
            _ => ProbeFault::Mismatch,
        })
        .collect()
}

fn plan_for(rng: &mut SplitMix64) -> FaultPlan {
    let mut plan = FaultPlan::none();
    if rng.chance_percent(40) {
        plan = plan.with_trap_at_launch(1 + rng.below(80));
    }
    if rng.chance_percent(40) {
        plan = plan.with_failed_reservation(1 + rng.below(40));
    }
    if rng.chance_percent(40) {
        plan = plan.with_failed_transfer(1 + rng.below(60));
    }
    if rng.chance_percent(35) {
        plan = plan.with_probe_faults(probe_faults_for(rng));
    }
    if rng.chance_percent(10) {
        let seed = rng.next_u64();
        plan = plan.with_trap_rate(seed, 0.002);
    }
    plan
}

/// A core over a fresh test device with a 64 MiB limit and small pages.
fn options(faults: FaultPlan) -> TestOptions {
    TestOptions {
        // Small pages, so several exist and compaction finds sparse ones.
        memory: MemoryConfig {
            min_page_size: 32 << 10,
            max_page_size: 1 << 20,
            exclusive_threshold: 256 << 10,
            ..MemoryConfig::with_limit(64 << 20)
        },
        faults,
        // The simulation has no clock: a recovery is never cut short by time.
        drain_timeout: std::time::Duration::from_secs(3600),
        max_strided_dims: None,
        reports_idle_streams: true,
        ..TestOptions::default()
    }
}

impl World {
    /// The world of `seed`: its fault plan, core, device and clients.
    pub fn new(seed: u64) -> Result<World, Failure> {
        let mut rng = SplitMix64::new(seed ^ 0x5EED_0FC1_57E2);
        let plan = plan_for(&mut rng);
        let plan_probe_faults = plan.probe_faults.iter().copied().collect();
        let trap_percent = [0, 1, 2][rng.below(3) as usize];
        let speeds = (0..8)
            .map(|_| [1, 2, 8, 32][rng.below(4) as usize])
            .collect();
        let TestServer { mut core, device } = TestServer::start(options(plan.clone()))
            .map_err(|error| format!("the core starts: {error}"))?;
        let mut clients = Vec::with_capacity(CLIENTS);
        for index in 0..CLIENTS {
            // Client 0 shares the default stream with the server's own work.
            let stream = if index == 0 {
                DEFAULT_STREAM
            } else {
                let (reply, answer) = reply_channel();
                core.handle(Command::CreateStream { reply });
                match answer.try_recv() {
                    Ok(Ok(stream)) => stream,
                    other => return Err(format!("create_stream answered {other:?}")),
                }
            };
            clients.push(Client::new(stream));
        }
        let watch = Watch::new(core.context());
        let baseline_reserved = core.memory().stats().reserved_bytes;
        Ok(World {
            core,
            device,
            clients,
            faults: Faults {
                plan,
                injected_reservations: 0,
                injected_transfers: 0,
                trapped_generations: Vec::new(),
                probe_faults: plan_probe_faults,
            },
            rng,
            step: 0,
            watch,
            trap_percent,
            speeds,
            seen: Coverage::default(),
            trace: std::env::var_os("CISTERN_SIM_TRACE").is_some(),
            trace_hash: 0xcbf2_9ce4_8422_2325,
            recent: VecDeque::with_capacity(RECENT),
            baseline_reserved,
            recovered_to: BTreeSet::new(),
            capture_in_progress: None,
        })
    }

    /// One scheduler step: a client acts, or the device runs or reports.
    pub fn step(&mut self) -> Result<(), Failure> {
        match self.rng.below(100) {
            0..55 => {
                let client = self.rng.below(CLIENTS as u64) as usize;
                self.client_acts(client)?;
            }
            55..88 => {
                let streams = self.device.busy_streams();
                if !streams.is_empty() {
                    // Streams advance at seeded, unequal speeds, so one
                    // client's work lags far behind another's.
                    let weight = |stream: &cistern::runtime::StreamId| {
                        self.speeds[stream.0 as usize % self.speeds.len()]
                    };
                    let total: u64 = streams.iter().map(weight).sum();
                    let mut roll = self.rng.below(total);
                    let mut stream = streams[0];
                    for candidate in &streams {
                        if roll < weight(candidate) {
                            stream = *candidate;
                            break;
                        }
                        roll -= weight(candidate);
                    }
                    for _ in 0..1 + self.rng.below(4) {
                        self.device.run_next(stream, &Run::Normal);
                    }
                }
            }
            88..97 => self.device.deliver(1 + self.rng.below(6) as usize),
            _ => self.core.tick(Instant::now()),
        }
        self.after_step()
    }

    /// Checks every invariant and every answer that arrived.
    fn after_step(&mut self) -> Result<(), Failure> {
        let before = self.watch.generation();
        let recovered = self
            .watch
            .check(&self.core, &self.device, &mut self.faults)?;
        if recovered {
            self.seen.predicted_recoveries += 1;
        }
        if self.watch.generation() != before {
            // Recovery released the old generation: every handle is stale.
            let generation = self.watch.generation();
            for client in &mut self.clients {
                let (live, old): (Vec<Buffer>, Vec<Buffer>) = std::mem::take(&mut client.live)
                    .into_iter()
                    .partition(|buffer| buffer.handle.generation == generation);
                client.live = live;
                client
                    .stale
                    .extend(old.into_iter().map(|buffer| buffer.handle));
                client.stale.sort_by_key(|handle| handle.id);
                client.stale.dedup();
                let (graphs, old): (Vec<_>, Vec<_>) = std::mem::take(&mut client.graphs)
                    .into_iter()
                    .partition(|graph| graph.graph.generation == generation);
                client.graphs = graphs;
                client
                    .stale_graphs
                    .extend(old.into_iter().map(|graph| graph.graph));
            }
        }
        let generation = self.watch.generation();
        self.watch
            .check_memory(&self.core, &self.clients, generation)?;
        for index in 0..self.clients.len() {
            self.collect_answers(index)?;
        }
        Ok(())
    }

    /// Runs the device and the recovery until nothing is left to do, then
    /// demands an answer for every reply and token sent.
    pub fn drain(&mut self) -> Result<(), Failure> {
        for index in 0..self.clients.len() {
            if let Some(recording) = self.clients[index].recording.take() {
                self.handle(Command::AbortCapture {
                    capture: recording.capture,
                });
            }
        }
        self.settle()?;
        // Recover, so the teardown below runs on a live context: once the
        // device is quiet nothing can trap again, so one recovery ends it.
        if let ContextState::Poisoned { generation, .. } = self.state() {
            self.invalidate(0, generation)?;
            self.settle()?;
        }
        match self.state() {
            ContextState::Active { .. } => {
                // Every byte the model knows, read back once more: catches
                // what a move or a reuse broke after the last read of a buffer.
                for index in 0..self.clients.len() {
                    for slot in 0..self.clients[index].live.len() {
                        self.read_span(index, slot, 0, self.clients[index].live[slot].size)?;
                    }
                }
                self.settle()?;
            }
            // Nothing succeeds after loss: the run is counted as ended lost.
            ContextState::Unrecoverable { .. } => {}
            other => return Err(format!("the final drain ended {other:?}")),
        }
        self.every_reply_answered()?;
        let generation = self.state().generation();
        if self.recovered_to != (1..=generation).collect() {
            return Err(format!(
                "generation {generation}, but successful invalidates answered {:?}",
                self.recovered_to
            ));
        }
        match self.state() {
            ContextState::Active { .. } => self.drop_everything(),
            ContextState::Unrecoverable { .. } => Ok(()),
            other => Err(format!("the read-back of the final drain ended {other:?}")),
        }
    }

    fn every_reply_answered(&self) -> Result<(), Failure> {
        for (index, client) in self.clients.iter().enumerate() {
            if let Some(pending) = client.pending.first() {
                return Err(format!(
                    "client {index}: the reply of step {} was never answered",
                    pending.step()
                ));
            }
        }
        Ok(())
    }

    /// Every client drops every handle (buffers before the graphs that pin
    /// them, events, streams); after the device drains and a reclaim,
    /// reserved memory is back at the baseline and nothing is allocated.
    fn drop_everything(&mut self) -> Result<(), Failure> {
        for index in 0..self.clients.len() {
            let client = &mut self.clients[index];
            let buffers: Vec<_> = client.live.drain(..).map(|b| b.handle).collect();
            let graphs: Vec<_> = client.graphs.drain(..).map(|g| g.graph).collect();
            let events: Vec<_> = client.events.drain(..).collect();
            let streams: Vec<_> = client.extra_streams.drain(..).collect();
            for buffer in buffers {
                self.handle(Command::Free { buffer });
            }
            for graph in graphs {
                self.handle(Command::ReleaseGraph { graph });
            }
            for event in events {
                self.handle(Command::ReleaseEvent { event });
            }
            for stream in streams {
                let (result, ..) = self.call(|reply| Command::DestroyStream { stream, reply })?;
                result.map_err(|error| format!("destroy stream at the end: {error}"))?;
            }
        }
        self.settle()?;
        let (released, ..) = self.call(|reply| Command::Reclaim { reply })?;
        released.map_err(|error| format!("the final reclaim: {error}"))?;
        let stats = self.core.memory().stats();
        if stats.reserved_bytes != self.baseline_reserved
            || stats.in_use_bytes != 0
            || stats.live_allocations != 0
        {
            return Err(format!(
                "every handle dropped and reclaimed, yet {} bytes reserved (baseline {}), {} in use, {} live allocations",
                stats.reserved_bytes,
                self.baseline_reserved,
                stats.in_use_bytes,
                stats.live_allocations
            ));
        }
        self.seen.baseline_checks += 1;
        Ok(())
    }

    /// Runs the device and the recovery until both are idle.
    fn settle(&mut self) -> Result<(), Failure> {
        for _ in 0..64 {
            for stream in self.device.busy_streams() {
                while self.device.busy_streams().contains(&stream) {
                    self.device.run_next(stream, &Run::Normal);
                }
            }
            self.device.deliver(usize::MAX);
            // A server takes the completions at its next command (`tick`
            // takes them only while a recovery runs); a drain sends none,
            // so its end state would miss a fault that arrived last.
            self.core.drain_completions();
            self.core.tick(Instant::now());
            self.after_step()?;
            if self.device.is_quiet() && !self.core.is_recovering() {
                break;
            }
        }
        if self.core.is_recovering() {
            return Err("the recovery did not finish after the device drained".into());
        }
        if !self.device.is_quiet() {
            return Err(format!(
                "the device did not drain: {} items still queued",
                self.device.queued_len()
            ));
        }
        Ok(())
    }

    fn state(&self) -> ContextState {
        self.core.context().clone()
    }

    /// Handles `command` and returns the state before and after it.
    fn handle(&mut self, command: Command) -> (ContextState, ContextState) {
        let before = self.state();
        self.seen.commands += 1;
        self.hash(command.kind().as_bytes());
        self.core.handle(command);
        let after = self.state();
        if !after.is_capturing() {
            self.capture_in_progress = None;
        }
        self.hash(&after.generation().to_le_bytes());
        self.hash(after.name().as_bytes());
        (before, after)
    }

    /// Folds `bytes` into the run's trace hash (FNV-1a: stable across builds).
    pub fn hash(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.trace_hash = (self.trace_hash ^ u64::from(*byte)).wrapping_mul(0x100_0000_01b3);
        }
    }

    /// Folds an answer into the trace hash.
    pub fn hash_answer<T: std::fmt::Debug>(&mut self, answer: &T) {
        let text = format!("{answer:?}");
        self.hash(text.as_bytes());
    }

    /// Notes a client action for the failure report and the trace hash.
    pub fn note(&mut self, action: String) {
        self.hash(action.as_bytes());
        if self.trace {
            eprintln!("{action}");
        }
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(action);
    }

    /// Sends a command answered at once; returns its answer and the states.
    fn call<T: std::fmt::Debug>(
        &mut self,
        make: impl FnOnce(Reply<T>) -> Command,
    ) -> Result<(Result<T, ServerError>, ContextState, ContextState), Failure> {
        let (reply, answer) = reply_channel();
        let (before, after) = self.handle(make(reply));
        match answer.try_recv() {
            Ok(result) => {
                self.hash_answer(&result);
                Ok((result, before, after))
            }
            Err(error) => Err(format!(
                "a command the server answers itself was not answered: {error:?}"
            )),
        }
    }

    /// Checks an answer given at once: refusals must be what the states
    /// before and after allow, or one of `extra`; success needs an
    /// admitting state. Notes a poisoned refusal on the client.
    fn judge<T>(
        &mut self,
        index: usize,
        what: &str,
        result: &Result<T, ServerError>,
        states: (&ContextState, &ContextState),
        extra: &[ErrorCode],
    ) -> Result<(), Failure> {
        let (before, after) = states;
        let gates = [gate_code(before), gate_code(after)];
        match result {
            Ok(_) if gates.contains(&None) => Ok(()),
            // A recovery that ended as the command began: it ran in the
            // new generation's active context.
            Ok(_) if after.generation() > before.generation() => Ok(()),
            Ok(_) => Err(format!(
                "{what} succeeded in state {} (after: {})",
                before.name(),
                after.name()
            )),
            Err(error) => {
                let code = error.code();
                if let ServerError::ContextPoisoned(poison) = error
                    && poison.generation != before.generation()
                {
                    return Err(format!(
                        "{what} refused by a fault of generation {} in generation {}",
                        poison.generation,
                        before.generation()
                    ));
                }
                if before.is_unrecoverable() {
                    self.seen.lost_refusals += 1;
                }
                if code == ErrorCode::DevicePoisoned {
                    self.clients[index].saw_poison = Some(after.generation());
                }
                // A recovery that ends while the command waits makes its
                // handles stale under it.
                let recovered = after.generation() > before.generation();
                if gates.contains(&Some(code)) {
                    self.seen.gate_refusals += 1;
                    Ok(())
                } else if extra.contains(&code) {
                    if matches!(
                        code,
                        ErrorCode::DeviceOutOfMemory | ErrorCode::TransferFailed
                    ) {
                        self.seen.injected += 1;
                    }
                    Ok(())
                } else if recovered && code == ErrorCode::StaleHandle {
                    Ok(())
                } else {
                    Err(format!(
                        "{what} refused with {code:?} ({error}) in state {} (after: {})",
                        before.name(),
                        after.name()
                    ))
                }
            }
        }
    }
}
