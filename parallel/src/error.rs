//! `GroupError`: why a replica group refused or ended.

use cistern_client::{BackendError, ErrorCode};

use crate::collective::CollectiveError;

/// Why a replica group call failed. After any error but `InvalidArgument`
/// the group has ended: every replica kept the parameters of the last
/// step all of them applied, and every later call is `Ended`.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum GroupError {
    /// The call or the ranks' models are wrong (a layout that differs on a
    /// rank, named; no devices; a bad config): fix it. Nothing changed.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A replica of this process failed its step (its device, its
    /// backward, its reduction): no replica of the group applied the step.
    #[error("replica {replica} failed, so no replica applied the step: {error}")]
    Replica {
        /// The failed replica's index in the group.
        replica: usize,
        /// Its failure.
        error: BackendError,
    },
    /// Replicas of other processes failed their step: no replica applied
    /// it. Their processes report why.
    #[error("replicas {replicas:?} of other ranks failed, so no replica applied the step")]
    PeerFailed {
        /// Their indices in the group.
        replicas: Vec<usize>,
    },
    /// A collective failed (an engine error, a peer that died): restart the job.
    #[error("the group's collective failed: {0}")]
    Collective(#[from] CollectiveError),
    /// An earlier error ended the group; it refuses every call: restart
    /// the job from a saved model.
    #[error("the replica group ended: {0}")]
    Ended(String),
}

impl GroupError {
    /// The stable code it is reported under: `InvalidArgument`, a failed
    /// replica's own code, or `PeerLost` for a group ended by a peer.
    pub fn code(&self) -> ErrorCode {
        match self {
            GroupError::InvalidArgument(_) => ErrorCode::InvalidArgument,
            GroupError::Replica { error, .. } => error.code(),
            GroupError::Collective(CollectiveError::NotLaunched(_)) => ErrorCode::InvalidArgument,
            GroupError::PeerFailed { .. } | GroupError::Collective(_) | GroupError::Ended(_) => {
                ErrorCode::PeerLost
            }
        }
    }
}
