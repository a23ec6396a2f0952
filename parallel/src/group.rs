//! `ReplicaGroup`: one model trained on several devices, processes or
//! hosts, its replicas bit-identical after every step.

use std::ops::Range;
use std::sync::Arc;

use cistern_client::{
    BackendError, ComputeClient, DeviceParamStore, StoreCheckpoint, Tape, Tensor,
};
use cistern_optim::{GradScaler, OptimizerConfig};

use crate::buckets;
use crate::collective::Collective;
use crate::digest;
use crate::error::GroupError;

/// One replica: a parameter store on one device of this process.
#[derive(Debug)]
pub struct Replica {
    pub(crate) client: ComputeClient,
    pub(crate) store: DeviceParamStore,
    pub(crate) index: usize,
    count: usize,
}

impl Replica {
    /// Its device's client.
    pub fn client(&self) -> &ComputeClient {
        &self.client
    }

    /// Its store.
    pub fn store(&self) -> &DeviceParamStore {
        &self.store
    }

    /// Its store, for a forward and backward.
    pub fn store_mut(&mut self) -> &mut DeviceParamStore {
        &mut self.store
    }

    /// Its index in the group, `0..count()`: which shard of the global
    /// batch it takes.
    pub fn index(&self) -> usize {
        self.index
    }

    /// How many replicas the group has, over every process.
    pub fn count(&self) -> usize {
        self.count
    }
}

/// What a replica's forward and backward report to the group: its shard's
/// mean loss and how many examples the shard held (the weights of the
/// group's mean).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shard {
    /// The mean loss over the shard.
    pub loss: f32,
    /// Examples in the shard (0 contributes nothing).
    pub examples: usize,
}

/// What one group step did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepReport {
    /// The loss over the global batch: the shards' losses weighted by
    /// their examples.
    pub loss: f64,
    /// Examples in the global batch.
    pub examples: usize,
    /// An AMP step skipped for a non-finite gradient (by every replica).
    pub skipped: bool,
    /// Replicas that failed during the step and were recovered in place
    /// (their devices invalidated and probed, their stores rebuilt from a
    /// healthy replica's state) before the step completed.
    pub recovered: usize,
}

/// Replicas of one model, one per device of every process of the group,
/// trained together: each step every replica runs its shard's forward and
/// backward, the staged gradients are averaged across all of them in
/// buckets, and every replica applies the same fused step.
#[derive(Debug)]
pub struct ReplicaGroup {
    pub(crate) engine: Box<dyn Collective>,
    pub(crate) replicas: Vec<Replica>,
    buckets: Vec<Range<usize>>,
    pub(crate) numel: usize,
    ended: Option<String>,
    steps: u64,
    recoveries: u64,
}

/// How often one step may recover failed replicas before the group gives
/// up and ends: a device that faults again at once is not coming back.
pub const MAX_RECOVERIES_PER_STEP: usize = 2;

impl ReplicaGroup {
    /// A group over `clients` (this process's devices) and the devices of
    /// the other processes of `engine`, every replica holding rank 0's
    /// `params`. Every process calls it with the same shapes and as many
    /// devices: a layout or device count that differs on a rank is
    /// `InvalidArgument` naming the rank, on every rank. A store that
    /// cannot be built on one rank fails the group on every rank.
    pub fn new(
        mut engine: Box<dyn Collective>,
        clients: Vec<ComputeClient>,
        params: &[Tensor<f32>],
    ) -> Result<Self, GroupError> {
        let shapes: Vec<Vec<usize>> = params.iter().map(|p| p.shape().to_vec()).collect();
        let words = [digest::layout(&shapes), clients.len() as u64, 0];
        let gathered = engine.all_gather(&words)?;
        check_ranks(&gathered)?;
        let mut flat: Vec<f32> = params.iter().flat_map(|p| p.data().to_vec()).collect();
        engine.broadcast(0, &mut flat)?;
        Self::build(engine, clients, 0, |client| {
            store_of(client, &shapes, &flat)
        })
    }

    /// A group as [`new`](Self::new) builds it, every replica restored
    /// from `checkpoint` (parameters, optimizer state, step count): a
    /// resumed run. Every process passes the same checkpoint (a rank whose
    /// checkpoint differs from rank 0's is `InvalidArgument` naming it, on
    /// every rank); a checkpoint that does not fit is `InvalidArgument`.
    pub fn restore(
        mut engine: Box<dyn Collective>,
        clients: Vec<ComputeClient>,
        checkpoint: &StoreCheckpoint,
    ) -> Result<Self, GroupError> {
        let steps = checkpoint.optimizer.as_ref().map_or(0, |o| o.steps);
        let mut state = digest::values(&checkpoint.params);
        for buffer in checkpoint.optimizer.iter().flat_map(|o| &o.state) {
            state = state.rotate_left(7) ^ digest::values(buffer);
        }
        let words = [
            digest::layout(&checkpoint.shapes),
            clients.len() as u64,
            state ^ steps,
        ];
        let gathered = engine.all_gather(&words)?;
        check_ranks(&gathered)?;
        Self::build(engine, clients, steps, |client| {
            DeviceParamStore::restore(&Tape::new(client), checkpoint)
        })
    }

    /// The group of `clients`, each replica's store made by `store`.
    fn build(
        mut engine: Box<dyn Collective>,
        clients: Vec<ComputeClient>,
        steps: u64,
        store: impl Fn(&ComputeClient) -> Result<DeviceParamStore, BackendError>,
    ) -> Result<Self, GroupError> {
        if clients.is_empty() {
            return Err(GroupError::InvalidArgument(
                "a replica group needs at least one device in each process".into(),
            ));
        }
        let count = clients.len() * engine.size();
        let first = engine.rank() * clients.len();
        let built = clients
            .into_iter()
            .enumerate()
            .map(|(local, client)| {
                let store = store(&client)?;
                Ok(Replica {
                    client,
                    store,
                    index: first + local,
                    count,
                })
            })
            .collect::<Result<Vec<_>, BackendError>>();
        let mut vote = vec![f32::from(built.is_err())];
        engine.all_reduce_sum(std::slice::from_mut(&mut vote))?;
        let replicas = match built {
            Err(error) => {
                return Err(GroupError::Replica {
                    replica: first,
                    error,
                });
            }
            Ok(_) if vote[0] > 0.0 => {
                return Err(GroupError::Ended(
                    "another rank could not build its stores".into(),
                ));
            }
            Ok(replicas) => replicas,
        };
        let buckets = buckets::plan(&replicas[0].store.slot_ranges());
        Ok(ReplicaGroup {
            numel: replicas[0].store.numel(),
            engine,
            replicas,
            buckets,
            ended: None,
            steps,
            recoveries: 0,
        })
    }

    /// Ends the group and gives its engine back, for the next group of
    /// this process (an MPI process initializes MPI once).
    pub fn into_engine(self) -> Box<dyn Collective> {
        self.engine
    }

    /// This process's replicas.
    pub fn replicas(&self) -> &[Replica] {
        &self.replicas
    }

    /// How many replicas the group has, over every process.
    pub fn count(&self) -> usize {
        self.replicas.len() * self.engine.size()
    }

    /// This process's rank in the group.
    pub fn rank(&self) -> usize {
        self.engine.rank()
    }

    /// The engine's name.
    pub fn engine(&self) -> &'static str {
        self.engine.name()
    }

    /// Steps every replica applied.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Replicas recovered in place over the group's life.
    pub fn recoveries(&self) -> u64 {
        self.recoveries
    }

    /// The buckets the gradients are reduced in, as ranges of `f32`s in
    /// the order they are reduced.
    pub fn buckets(&self) -> &[Range<usize>] {
        &self.buckets
    }

    /// Whether an error ended the group (every call then refuses).
    pub fn is_ended(&self) -> bool {
        self.ended.is_some()
    }

    /// One step of `config` on every replica: `work` runs each replica's
    /// forward and backward through its store (on a thread per replica of
    /// this process) and reports its [`Shard`]; the staged gradients are
    /// averaged over the global batch in buckets; then every replica
    /// applies the same step. Every process calls it with the same config.
    ///
    /// A replica whose `work`, reduction or device fails makes every
    /// replica drop the step; the failed replica's device is recovered in
    /// place (invalidate and probe), its store rebuilt from a healthy
    /// replica's parameters and optimizer state, and the step retried: no
    /// step is lost ([`StepReport::recovered`]). A replica that fails in its
    /// step kernel is rebuilt from a healthy one that applied it. Where
    /// recovery is impossible (a device that stays down, no healthy
    /// replica, more than [`MAX_RECOVERIES_PER_STEP`] in one step) the group
    /// ends: the failed replica's process gets `Replica`, the others
    /// `PeerFailed`, and every later call `Ended`.
    pub fn step<F>(&mut self, config: &OptimizerConfig, work: F) -> Result<StepReport, GroupError>
    where
        F: Fn(&mut Replica) -> Result<Shard, BackendError> + Sync,
    {
        self.run(config, None, work)
    }

    /// [`step`](Self::step) for gradients scaled by `scaler` (SGD, Adam
    /// and AdamW): a non-finite gradient on any replica makes every replica
    /// skip the step ([`StepReport::skipped`]), and `scaler` is updated
    /// once, as every replica's was.
    pub fn step_amp<F>(
        &mut self,
        config: &OptimizerConfig,
        scaler: &mut GradScaler,
        work: F,
    ) -> Result<StepReport, GroupError>
    where
        F: Fn(&mut Replica) -> Result<Shard, BackendError> + Sync,
    {
        self.run(config, Some(scaler), work)
    }

    /// Every replica's parameter digest, over every process, in replica
    /// order: all equal while the group is healthy.
    pub fn replica_digests(&mut self) -> Result<Vec<u64>, GroupError> {
        self.refuse_if_ended()?;
        let mut local = Vec::with_capacity(self.replicas.len());
        let mut failed = None;
        for replica in &self.replicas {
            match retry_transfer(|| replica.store.sync_to_host()) {
                Ok(tensors) => {
                    let values: Vec<f32> =
                        tensors.into_iter().flat_map(Tensor::into_data).collect();
                    local.push(digest::values(&values));
                }
                // Still gathered, so no peer waits for this process.
                Err(error) => {
                    local.push(0);
                    failed.get_or_insert((replica.index, error));
                }
            }
        }
        let gathered = self.engine.all_gather(&local)?;
        match failed {
            Some((replica, error)) => Err(self.end_with(replica, error)),
            None => Ok(gathered),
        }
    }

    /// The parameters, as this process's first replica holds them.
    pub fn parameters(&self) -> Result<Vec<Tensor<f32>>, GroupError> {
        self.refuse_if_ended()?;
        let replica = &self.replicas[0];
        retry_transfer(|| replica.store.sync_to_host()).map_err(|error| GroupError::Replica {
            replica: replica.index,
            error,
        })
    }

    fn run<F>(
        &mut self,
        config: &OptimizerConfig,
        scaler: Option<&mut GradScaler>,
        work: F,
    ) -> Result<StepReport, GroupError>
    where
        F: Fn(&mut Replica) -> Result<Shard, BackendError> + Sync,
    {
        self.refuse_if_ended()?;
        config
            .validate()
            .map_err(|error| GroupError::InvalidArgument(format!("the step's config: {error}")))?;
        let mut scaler = scaler;
        let mut recovered = 0;
        loop {
            let attempt = match self.attempt(config, scaler.as_deref_mut(), &work) {
                Ok(attempt) => attempt,
                Err(error) => return Err(self.end(error)),
            };
            let (failed, local, applied) = match attempt {
                Attempt::Done(report) => return Ok(self.count_step(report, recovered)),
                Attempt::Failed {
                    failed,
                    local,
                    applied,
                } => (failed, local, applied),
            };
            let error = match local {
                Some((replica, error)) => GroupError::Replica { replica, error },
                None => GroupError::PeerFailed {
                    replicas: failed.clone(),
                },
            };
            if recovered >= MAX_RECOVERIES_PER_STEP {
                return Err(self.end(error));
            }
            if let Err(why) = self.recover(&failed, config) {
                return Err(self.end(match why {
                    GroupError::Ended(why) => GroupError::Ended(format!("{error}; {why}")),
                    other => other,
                }));
            }
            recovered += failed.len();
            self.recoveries += failed.len() as u64;
            if let Some(report) = applied {
                return Ok(self.count_step(report, recovered));
            }
        }
    }

    /// One try at a step: done, or the replicas that failed and whether
    /// the healthy ones applied it.
    fn attempt<F>(
        &mut self,
        config: &OptimizerConfig,
        scaler: Option<&mut GradScaler>,
        work: &F,
    ) -> Result<Attempt, GroupError>
    where
        F: Fn(&mut Replica) -> Result<Shard, BackendError> + Sync,
    {
        let mut outcomes = self.backward(work);
        let (examples, failed) = self.vote(&outcomes)?;
        if !failed.is_empty() {
            return Ok(self.dropped(failed, &outcomes));
        }
        let reduced = self.reduce(&mut outcomes, examples.total)?;
        self.write(&mut outcomes, &reduced);
        // A replica that failed to give a bucket or take the mean fails the
        // step everywhere, before any replica steps.
        let (_, failed) = self.vote(&outcomes)?;
        if !failed.is_empty() {
            return Ok(self.dropped(failed, &outcomes));
        }
        let (stepped, skipped) = self.apply(config, scaler)?;
        let report = StepReport {
            loss: examples.loss / examples.total.max(1) as f64,
            examples: examples.total,
            skipped,
            recovered: 0,
        };
        // Every process learns which replicas failed in their step kernels.
        let (_, failed) = self.vote(&stepped)?;
        if failed.is_empty() {
            return Ok(Attempt::Done(report));
        }
        Ok(Attempt::Failed {
            local: self.first_local_error(&stepped),
            failed,
            applied: Some(report),
        })
    }

    /// The step dropped by every healthy replica (their parameters stay as
    /// they were) after `failed` failed before it.
    fn dropped(&mut self, failed: Vec<usize>, outcomes: &[Result<Shard, BackendError>]) -> Attempt {
        for replica in &mut self.replicas {
            let _ = replica.store.abandon_pending_forward();
        }
        Attempt::Failed {
            local: self.first_local_error(outcomes),
            failed,
            applied: None,
        }
    }

    fn first_local_error(
        &self,
        outcomes: &[Result<Shard, BackendError>],
    ) -> Option<(usize, BackendError)> {
        self.replicas
            .iter()
            .zip(outcomes)
            .find_map(|(replica, outcome)| {
                outcome.as_ref().err().map(|e| (replica.index, e.clone()))
            })
    }

    /// A completed step counted.
    fn count_step(&mut self, mut report: StepReport, recovered: usize) -> StepReport {
        self.steps += u64::from(!report.skipped);
        report.recovered = recovered;
        report
    }

    /// Ends the group with `error`.
    fn end(&mut self, error: GroupError) -> GroupError {
        if self.ended.is_none() {
            self.ended = Some(error.to_string());
        }
        error
    }

    /// Every local replica's forward and backward, concurrently when there
    /// are several.
    fn backward<F>(&mut self, work: &F) -> Vec<Result<Shard, BackendError>>
    where
        F: Fn(&mut Replica) -> Result<Shard, BackendError> + Sync,
    {
        on_each(self.replicas.iter_mut().collect(), work)
            .into_iter()
            .map(|outcome| outcome.unwrap_or_else(|| Err(panicked("its step's work"))))
            .collect()
    }

    /// The mean gradient over the global batch of `total` examples: each
    /// replica's weighted by its share of them (exactly ½ for two equal
    /// shards), summed over every replica of every process, bucket by
    /// bucket: each bucket's mean, one buffer that every replica's write
    /// shares. A replica that fails to give its bucket
    /// contributes zeros and its error: every process still takes part in
    /// every collective, so none waits for a peer that gave up.
    fn reduce(
        &mut self,
        outcomes: &mut [Result<Shard, BackendError>],
        total: usize,
    ) -> Result<Vec<BucketMean>, GroupError> {
        let mut reduced = Vec::with_capacity(self.buckets.len());
        for bucket in self.buckets.clone() {
            let shards: Vec<Option<Shard>> =
                outcomes.iter().map(|o| o.as_ref().ok().copied()).collect();
            let weights: Vec<f32> = shards
                .iter()
                .map(|shard| shard.map_or(1.0, |s| s.examples as f32 / total.max(1) as f32))
                .collect();
            let pairs: Vec<_> = self.replicas.iter_mut().zip(shards).collect();
            let read = on_each(pairs, |(replica, shard)| {
                staged_bucket(replica, shard, &bucket)
            });
            let mut buffers = Vec::with_capacity(read.len());
            for (outcome, read) in outcomes.iter_mut().zip(read) {
                let failed = match read {
                    Some(Ok(bytes)) => {
                        buffers.push(bytes);
                        continue;
                    }
                    Some(Err(error)) => error,
                    None => panicked("its bucket's read"),
                };
                if outcome.is_ok() {
                    *outcome = Err(failed);
                }
                buffers.push(vec![0; bucket.len() * 4]);
            }
            self.engine.all_reduce_weighted(&mut buffers, &weights)?;
            let mean = buffers.into_iter().next().unwrap_or_default();
            reduced.push(BucketMean {
                start: bucket.start,
                bytes: Arc::new(mean),
            });
        }
        Ok(reduced)
    }

    /// The group's vote: the weighted loss, the examples and one failure
    /// flag per replica, summed over every process; the replicas that
    /// failed, on every process alike.
    pub(crate) fn vote(
        &mut self,
        outcomes: &[Result<Shard, BackendError>],
    ) -> Result<(Examples, Vec<usize>), GroupError> {
        let count = self.count();
        let mut words = vec![0.0f32; 2 + count];
        for (replica, outcome) in self.replicas.iter().zip(outcomes) {
            match outcome {
                Ok(shard) => {
                    words[0] += shard.loss * shard.examples as f32;
                    words[1] += shard.examples as f32;
                }
                Err(_) => words[2 + replica.index] = 1.0,
            }
        }
        self.engine
            .all_reduce_sum(std::slice::from_mut(&mut words))?;
        let failed: Vec<usize> = (0..count).filter(|&r| words[2 + r] > 0.0).collect();
        let examples = Examples {
            loss: f64::from(words[0]),
            total: words[1] as usize,
        };
        Ok((examples, failed))
    }

    /// Writes the mean gradient into every healthy replica's staged
    /// gradients and waits until its device ran all of the step's work so
    /// far (its store's stream and its default stream, the tape's): a
    /// fault anywhere in it fails the replica's outcome before the vote.
    fn write(&mut self, outcomes: &mut [Result<Shard, BackendError>], mean: &[BucketMean]) {
        // Every write is queued before any wait: the devices copy at once.
        let pairs: Vec<_> = self.replicas.iter_mut().zip(outcomes.iter()).collect();
        let queued = in_turn(pairs, |(replica, outcome)| match outcome {
            Ok(_) => mean.iter().try_for_each(|bucket| {
                retry_transfer(|| {
                    replica
                        .store
                        .write_staged_bytes(bucket.start, &bucket.bytes)
                })
            }),
            Err(_) => Ok(()),
        });
        let items: Vec<_> = (self.replicas.iter_mut().zip(queued))
            .zip(outcomes.iter().map(Result::is_ok))
            .collect();
        let written = in_turn(items, |((replica, queued), healthy)| {
            match (healthy, queued) {
                (false, _) => Ok(()),
                (true, Some(Ok(()))) => {
                    replica.store.wait_device()?;
                    let stream = replica.client.default_stream();
                    replica.client.sync(stream).map_err(BackendError::from)
                }
                (true, Some(Err(error))) => Err(error),
                (true, None) => Err(panicked("its write of the mean")),
            }
        });
        for (outcome, written) in outcomes.iter_mut().zip(written) {
            let failed = match written {
                Some(Ok(())) => continue,
                Some(Err(error)) => error,
                None => panicked("its write of the mean"),
            };
            if outcome.is_ok() {
                *outcome = Err(failed);
            }
        }
    }

    /// Steps every replica from the mean gradient it holds: each
    /// replica's outcome (`Ok` with no examples, or its failure) and
    /// whether the step was skipped. With a scaler, every replica decides
    /// the same skip (they step from the same bits); the scaler takes the
    /// first healthy replica's update. Replicas that disagree on a skip
    /// end the group.
    fn apply(
        &mut self,
        config: &OptimizerConfig,
        scaler: Option<&mut GradScaler>,
    ) -> Result<(Vec<Result<Shard, BackendError>>, bool), GroupError> {
        let template = scaler.as_deref().cloned();
        let step = |replica: &mut Replica| {
            let mut own = template.clone();
            let skipped = match &mut own {
                None => replica.store.step_staged(config).map(|()| false),
                Some(own) => replica
                    .store
                    .step_staged_amp(config, own)
                    .map_err(BackendError::from),
            };
            (skipped, own)
        };
        // A plain step only queues its kernels; an AMP step waits for its
        // device's verdict on the gradients, so those run side by side.
        let replicas = self.replicas.iter_mut().collect();
        let stepped = match template {
            None => in_turn(replicas, step),
            Some(_) => on_each(replicas, step),
        };
        let mut decisions = Vec::with_capacity(stepped.len());
        let mut updated = None;
        let mut outcomes = Vec::with_capacity(stepped.len());
        for outcome in stepped {
            let (skipped, own) = outcome.unwrap_or_else(|| (Err(panicked("its step")), None));
            match skipped {
                Ok(skipped) => {
                    decisions.push(skipped);
                    updated = updated.or(own);
                    outcomes.push(Ok(Shard {
                        loss: 0.0,
                        examples: 0,
                    }));
                }
                Err(error) => outcomes.push(Err(error)),
            }
        }
        if let (Some(scaler), Some(own)) = (scaler, updated) {
            *scaler = own;
        }
        let skipped = decisions.first().copied().unwrap_or(false);
        if decisions.iter().any(|&d| d != skipped) {
            return Err(GroupError::Ended(
                "the replicas disagreed on an AMP skip: their gradients differed".into(),
            ));
        }
        Ok((outcomes, skipped))
    }

    fn refuse_if_ended(&self) -> Result<(), GroupError> {
        match &self.ended {
            Some(reason) => Err(GroupError::Ended(reason.clone())),
            None => Ok(()),
        }
    }

    /// Ends the group with a replica's failure.
    fn end_with(&mut self, replica: usize, error: BackendError) -> GroupError {
        let error = GroupError::Replica { replica, error };
        self.ended = Some(error.to_string());
        error
    }
}

/// `f` on each item, on a thread per item when there are several; `None`
/// for an item whose `f` panicked.
fn on_each<A: Send, T: Send>(items: Vec<A>, f: impl Fn(A) -> T + Sync) -> Vec<Option<T>> {
    if items.len() <= 1 {
        return items.into_iter().map(|item| Some(f(item))).collect();
    }
    std::thread::scope(|scope| {
        let f = &f;
        let running: Vec<_> = items
            .into_iter()
            .map(|item| scope.spawn(move || f(item)))
            .collect();
        running
            .into_iter()
            .map(|thread| thread.join().ok())
            .collect()
    })
}

/// `f` on each item in turn, on this thread: for calls that only queue
/// work, cheaper than a thread each; `None` for an item whose `f` panicked.
fn in_turn<A, T>(items: Vec<A>, f: impl Fn(A) -> T) -> Vec<Option<T>> {
    items
        .into_iter()
        .map(|item| std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(item))).ok())
        .collect()
}

/// A replica's `bucket` of staged gradients, as the device answers it;
/// zeros for a replica that already failed.
fn staged_bucket(
    replica: &mut Replica,
    shard: Option<Shard>,
    bucket: &Range<usize>,
) -> Result<Vec<u8>, BackendError> {
    match shard {
        Some(_) => retry_transfer(|| replica.store.read_staged_bytes(bucket.clone())),
        None => Ok(vec![0; bucket.len() * 4]),
    }
}

/// `transfer`, once more after a failed transfer (operation-local:
/// nothing else changed).
fn retry_transfer<T>(
    mut transfer: impl FnMut() -> Result<T, BackendError>,
) -> Result<T, BackendError> {
    match transfer() {
        Err(BackendError::TransferFailed(_)) => transfer(),
        answer => answer,
    }
}

fn panicked(what: &str) -> BackendError {
    BackendError::InvalidArgument(format!("{what} panicked on this replica"))
}

/// A bucket's mean gradient: its first float and its `f32`s' bytes, one
/// buffer that every replica's write shares.
struct BucketMean {
    start: usize,
    bytes: Arc<Vec<u8>>,
}

/// The vote's sums.
pub(crate) struct Examples {
    loss: f64,
    total: usize,
}

/// How one try at a step ended.
enum Attempt {
    /// Every replica applied it (or skipped it, under AMP).
    Done(StepReport),
    /// Replicas `failed` (this process's first, with its error, in
    /// `local`); `applied` holds the step's report when the healthy
    /// replicas applied it, `None` when none did.
    Failed {
        failed: Vec<usize>,
        local: Option<(usize, BackendError)>,
        applied: Option<StepReport>,
    },
}

/// Every rank's `[layout digest, devices]` against rank 0's.
fn check_ranks(gathered: &[u64]) -> Result<(), GroupError> {
    let ranks: Vec<&[u64]> = gathered.chunks(3).collect();
    let Some(first) = ranks.first() else {
        return Ok(());
    };
    for (rank, words) in ranks.iter().enumerate().skip(1) {
        if words[0] != first[0] {
            return Err(GroupError::InvalidArgument(format!(
                "rank {rank}'s parameter layout (digest {:016x}) differs from rank 0's \
                 ({:016x}): every rank must build the same model",
                words[0], first[0]
            )));
        }
        if words[1] != first[1] {
            return Err(GroupError::InvalidArgument(format!(
                "rank {rank} has {} devices and rank 0 {}: every rank needs as many",
                words[1], first[1]
            )));
        }
        if words[2] != first[2] {
            return Err(GroupError::InvalidArgument(format!(
                "rank {rank} restores another checkpoint than rank 0 (digest {:016x}, rank 0's \
                 {:016x}): give every rank the same checkpoint",
                words[2], first[2]
            )));
        }
    }
    Ok(())
}

/// A store on `client` holding `flat`, cut to `shapes`.
fn store_of(
    client: &ComputeClient,
    shapes: &[Vec<usize>],
    flat: &[f32],
) -> Result<DeviceParamStore, BackendError> {
    let mut tensors = Vec::with_capacity(shapes.len());
    let mut start = 0;
    for shape in shapes {
        let len: usize = shape.iter().product();
        let data = flat.get(start..start + len).ok_or_else(|| {
            BackendError::InvalidArgument("the parameters are shorter than their shapes".into())
        })?;
        tensors.push(Tensor::new(shape.clone(), data.to_vec())?);
        start += len;
    }
    let refs: Vec<&Tensor<f32>> = tensors.iter().collect();
    DeviceParamStore::new(&Tape::new(client), &refs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_in_turn_answer_none_for_an_item_that_panicked_and_go_on() {
        let answers = in_turn(vec![1, 2, 3], |item| match item {
            2 => panic!("the second item's call fails"),
            other => other * 10,
        });
        assert_eq!(answers, vec![Some(10), None, Some(30)]);
    }
}
