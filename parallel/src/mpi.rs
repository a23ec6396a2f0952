//! `Mpi`: the engine of a group with one process per rank, started by
//! `mpirun`, reducing host-staged buffers with `MPI_Allreduce`. A watchdog
//! bounds every collective: a peer that dies or hangs ends this process
//! with [`PEER_LOST_EXIT_STATUS`] and a `PeerLost` line, never a hang.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use mpi::Threading;
use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives, Root};

use crate::collective::{Collective, CollectiveError, sum_into_first};
use crate::sum;

/// How long a collective may wait for its peers by default before this
/// process gives up on them.
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(60);

/// The exit status of a process whose peer died or hung (`EX_TEMPFAIL`).
pub const PEER_LOST_EXIT_STATUS: i32 = 75;

/// The variables `mpirun` (OpenMPI's, or a PMI launcher's) sets in each rank.
const LAUNCHER_VARIABLES: [&str; 3] = ["OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"];

/// One rank of an MPI group: MPI initialized for this process (finalized
/// when dropped), its world communicator and the watchdog.
pub struct Mpi {
    // Field order matters: the communicator before the universe that finalizes.
    world: SimpleCommunicator,
    _universe: Universe,
    watchdog: Watchdog,
    scratch: Vec<f32>,
    /// The local sum of a weighted reduction, kept between steps.
    local: Vec<f32>,
}

// SAFETY: MPI is initialized with `Threading::Serialized`, so any one thread
// may call it at a time; `&mut self` on every call keeps the calls serial.
unsafe impl Send for Mpi {}

impl std::fmt::Debug for Mpi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mpi")
            .field("rank", &self.world.rank())
            .field("size", &self.world.size())
            .field("timeout", &self.watchdog.timeout)
            .finish()
    }
}

impl Mpi {
    /// Initializes MPI for this process with the default peer timeout.
    /// Outside `mpirun` this is `NotLaunched` naming the fix; a second
    /// initialization in one process is `Engine`.
    pub fn init() -> Result<Mpi, CollectiveError> {
        Mpi::with_timeout(DEFAULT_PEER_TIMEOUT)
    }

    /// [`init`](Self::init) with `timeout` for every collective's wait.
    pub fn with_timeout(timeout: Duration) -> Result<Mpi, CollectiveError> {
        if !launched_by_mpirun() {
            return Err(CollectiveError::NotLaunched(
                "the MPI engine runs under mpirun: start it as `mpirun -np N <program> ...` \
                 (as root add --allow-run-as-root; more ranks than cores need --oversubscribe)"
                    .into(),
            ));
        }
        let (universe, _) =
            mpi::initialize_with_threading(Threading::Serialized).ok_or_else(|| {
                CollectiveError::Engine {
                    engine: "mpi",
                    reason: "MPI was already initialized in this process".into(),
                }
            })?;
        let world = universe.world();
        let watchdog = Watchdog::start(world.rank() as usize, timeout);
        Ok(Mpi {
            world,
            _universe: universe,
            watchdog,
            scratch: Vec::new(),
            local: Vec::new(),
        })
    }

    /// Waits until every rank reaches it (bounded by the timeout).
    pub fn barrier(&mut self) {
        let _armed = self.watchdog.arm("a barrier");
        self.world.barrier();
    }

    /// `MPI_Allreduce` (sum) of `send` into `receive`, as the engine calls
    /// it, with no group around it: the benchmarks' reference.
    pub fn raw_all_reduce_sum(&mut self, send: &[f32], receive: &mut [f32]) {
        let _armed = self.watchdog.arm("an all-reduce");
        self.world
            .all_reduce_into(send, receive, SystemOperation::sum());
    }
}

impl Collective for Mpi {
    fn name(&self) -> &'static str {
        "mpi"
    }

    fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    fn size(&self) -> usize {
        self.world.size() as usize
    }

    fn all_reduce_sum(&mut self, buffers: &mut [Vec<f32>]) -> Result<(), CollectiveError> {
        sum_into_first(buffers)?;
        let Some(first) = buffers.first_mut() else {
            return Err(CollectiveError::Mismatch(
                "an all-reduce needs a buffer on every rank".into(),
            ));
        };
        if i32::try_from(first.len()).is_err() {
            return Err(CollectiveError::Mismatch(format!(
                "{} floats exceed MPI's count",
                first.len()
            )));
        }
        self.scratch.resize(first.len(), 0.0);
        {
            let _armed = self.watchdog.arm("an all-reduce");
            self.world
                .all_reduce_into(&first[..], &mut self.scratch[..], SystemOperation::sum());
        }
        std::mem::swap(first, &mut self.scratch);
        Ok(())
    }

    /// The local weighted sum in one pass into a kept buffer, then
    /// `MPI_Allreduce` from it straight into the first buffer's bytes (into
    /// the kept scratch, and copied, where those bytes are not aligned as
    /// `f32`s).
    fn all_reduce_weighted(
        &mut self,
        buffers: &mut [Vec<u8>],
        weights: &[f32],
    ) -> Result<(), CollectiveError> {
        let floats = sum::check(buffers, weights)?;
        if i32::try_from(floats).is_err() {
            return Err(CollectiveError::Mismatch(format!(
                "{floats} floats exceed MPI's count"
            )));
        }
        self.local.resize(floats, 0.0);
        let sources: Vec<&[u8]> = buffers.iter().map(Vec::as_slice).collect();
        sum::weighted_sum(&sources, weights, &mut self.local);
        let Some(first) = buffers.first_mut() else {
            return Err(CollectiveError::Mismatch(
                "an all-reduce needs a buffer on every rank".into(),
            ));
        };
        let _armed = self.watchdog.arm("an all-reduce");
        match bytemuck::try_cast_slice_mut::<u8, f32>(first) {
            Ok(total) => {
                self.world
                    .all_reduce_into(&self.local[..], total, SystemOperation::sum());
            }
            Err(_) => {
                self.scratch.resize(floats, 0.0);
                self.world.all_reduce_into(
                    &self.local[..],
                    &mut self.scratch[..],
                    SystemOperation::sum(),
                );
                sum::store(&self.scratch, first);
            }
        }
        Ok(())
    }

    fn broadcast(&mut self, root: usize, data: &mut [f32]) -> Result<(), CollectiveError> {
        if root >= self.size() {
            return Err(CollectiveError::Mismatch(format!(
                "broadcast from rank {root} in a group of {}",
                self.size()
            )));
        }
        let _armed = self.watchdog.arm("a broadcast");
        self.world.process_at_rank(root as i32).broadcast_into(data);
        Ok(())
    }

    fn all_gather(&mut self, words: &[u64]) -> Result<Vec<u64>, CollectiveError> {
        let mut gathered = vec![0u64; words.len() * self.size()];
        let _armed = self.watchdog.arm("an all-gather");
        self.world.all_gather_into(words, &mut gathered[..]);
        Ok(gathered)
    }
}

/// Whether a launcher started this process as a rank.
pub fn launched_by_mpirun() -> bool {
    LAUNCHER_VARIABLES
        .iter()
        .any(|name| std::env::var_os(name).is_some())
}

/// A thread that ends the process when a collective outlives the timeout.
struct Watchdog {
    timeout: Duration,
    shared: Arc<(Mutex<Deadline>, Condvar)>,
}

/// The collective in progress, if any, and when it must be over.
#[derive(Default)]
struct Deadline {
    current: Option<(Instant, &'static str)>,
}

impl Watchdog {
    fn start(rank: usize, timeout: Duration) -> Watchdog {
        let shared = Arc::new((Mutex::new(Deadline::default()), Condvar::new()));
        let watched = Arc::clone(&shared);
        let spawned = std::thread::Builder::new()
            .name("cistern-mpi-watchdog".into())
            .spawn(move || watch(rank, timeout, &watched));
        if let Err(error) = spawned {
            tracing_free_warning(&format!(
                "no watchdog thread ({error}): a hung peer hangs this rank"
            ));
        }
        Watchdog { timeout, shared }
    }

    /// Arms the deadline for `what` until the guard drops.
    fn arm(&self, what: &'static str) -> Armed<'_> {
        let (lock, wake) = &*self.shared;
        let mut deadline = lock.lock().unwrap_or_else(PoisonError::into_inner);
        deadline.current = Some((Instant::now() + self.timeout, what));
        wake.notify_one();
        Armed { watchdog: self }
    }
}

/// The deadline of one collective; disarmed on drop.
struct Armed<'a> {
    watchdog: &'a Watchdog,
}

impl Drop for Armed<'_> {
    fn drop(&mut self) {
        let (lock, _) = &*self.watchdog.shared;
        lock.lock().unwrap_or_else(PoisonError::into_inner).current = None;
    }
}

/// The watchdog's loop: sleeps until the armed deadline, and ends the
/// process if the same collective is still waiting then.
fn watch(rank: usize, timeout: Duration, shared: &(Mutex<Deadline>, Condvar)) {
    let (lock, wake) = shared;
    let mut deadline = lock.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        deadline = match deadline.current {
            None => wake.wait(deadline).unwrap_or_else(PoisonError::into_inner),
            Some((when, what)) => {
                let now = Instant::now();
                if now >= when {
                    eprintln!(
                        "cistern: error PeerLost (1020): rank {rank} waited {:.1} s in {what} \
                         for its peers: a peer died or hung; restart the job (from a saved \
                         model); --peer-timeout sets the wait",
                        timeout.as_secs_f64()
                    );
                    std::process::exit(PEER_LOST_EXIT_STATUS);
                }
                wake.wait_timeout(deadline, when - now)
                    .map(|(guard, _)| guard)
                    .unwrap_or_else(|poisoned| poisoned.into_inner().0)
            }
        };
    }
}

fn tracing_free_warning(message: &str) {
    eprintln!("cistern: warning: {message}");
}
