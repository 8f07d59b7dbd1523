//! Why a call to the shards failed.

/// A failure talking to the shards. Any rank failing fails the whole call: a
/// tensor-parallel group cannot continue without one of its ranks.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ShardError {
    #[error("could not connect to shard {rank} at {path}: {message}")]
    Connect {
        rank: usize,
        path: String,
        message: String,
    },
    #[error("shard {rank} answered {code:?}: {message}")]
    Rpc {
        rank: usize,
        code: tonic::Code,
        message: String,
    },
    #[error("shards disagree: {0}")]
    Inconsistent(String),
    #[error("no shard socket was given")]
    NoShards,
    #[error("this shard group does not support {0}")]
    Unsupported(&'static str),
    #[error("cannot use the cluster secret file {path}: {message}")]
    ClusterSecret { path: String, message: String },
}
