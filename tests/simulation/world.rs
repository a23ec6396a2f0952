//! One seeded run: clients, the scheduler that interleaves them with the
//! device, and the check of every answer against the model.

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
#[path = "ops.rs"]
mod ops;

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
}

impl Faults {
    /// Whether a kernel may have trapped in `generation`.
    pub fn trap_possible(&self, generation: u64) -> bool {
        self.plan.trap_launch.is_some() || self.trapped_generations.contains(&generation)
    }

    /// Whether a recovery may legitimately fail.
    pub fn unrecoverable_possible(&self) -> bool {
        self.plan.trap_launch.is_some()
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
    if rng.chance_percent(30) {
        let fault = if rng.chance_percent(80) {
            ProbeFault::OperationLocal
        } else {
            ProbeFault::Sticky
        };
        plan = plan.with_probe_faults([fault]);
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
            clients.push(Client {
                stream,
                live: Vec::new(),
                stale: Vec::new(),
                saw_poison: None,
                pending: Vec::new(),
            });
        }
        let watch = Watch::new(core.context());
        Ok(World {
            core,
            device,
            clients,
            faults: Faults {
                plan,
                injected_reservations: 0,
                injected_transfers: 0,
                trapped_generations: Vec::new(),
            },
            rng,
            step: 0,
            watch,
            trap_percent,
            speeds,
            seen: Coverage::default(),
            trace: std::env::var_os("CISTERN_SIM_TRACE").is_some(),
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
        self.watch.check(&self.core, &self.device, &self.faults)?;
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
        self.settle()?;
        if self.state().is_active() {
            // Every byte the model knows, read back once more: catches what
            // a move or a reuse broke after the last read of a buffer.
            for index in 0..self.clients.len() {
                for slot in 0..self.clients[index].live.len() {
                    self.read_span(index, slot, 0, self.clients[index].live[slot].size)?;
                }
            }
            self.settle()?;
        }
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

    /// Runs the device and the recovery until both are idle.
    fn settle(&mut self) -> Result<(), Failure> {
        for _ in 0..64 {
            for stream in self.device.busy_streams() {
                while self.device.busy_streams().contains(&stream) {
                    self.device.run_next(stream, &Run::Normal);
                }
            }
            self.device.deliver(usize::MAX);
            self.core.tick(Instant::now());
            self.after_step()?;
            if self.device.is_quiet() && !self.core.is_recovering() {
                break;
            }
        }
        if self.core.is_recovering() {
            return Err("the recovery did not finish after the device drained".into());
        }
        Ok(())
    }

    fn state(&self) -> ContextState {
        self.core.context().clone()
    }

    /// Handles `command` and returns the state before and after it.
    fn handle(&mut self, command: Command) -> (ContextState, ContextState) {
        let before = self.state();
        self.core.handle(command);
        (before, self.state())
    }

    /// Sends a command answered at once; returns its answer and the states.
    fn call<T: std::fmt::Debug>(
        &mut self,
        make: impl FnOnce(Reply<T>) -> Command,
    ) -> Result<(Result<T, ServerError>, ContextState, ContextState), Failure> {
        let (reply, answer) = reply_channel();
        let (before, after) = self.handle(make(reply));
        match answer.try_recv() {
            Ok(result) => Ok((result, before, after)),
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
