//! The Raft type configuration and the application's commands.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A node's id in the cluster.
pub type NodeId = u64;

/// A node's address as openraft keeps it in the membership: `host:port`.
pub type Node = openraft::BasicNode;

openraft::declare_raft_types!(
    /// The Raft type configuration of the key-value service. Snapshots are
    /// files, so they are streamed to disk and over the network instead of
    /// being held in memory.
    pub TypeConfig:
        D = Request,
        R = Response,
        NodeId = NodeId,
        Node = Node,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = tokio::fs::File,
        AsyncRuntime = openraft::TokioRuntime,
);

/// A Raft log entry of this service.
pub type Entry = openraft::Entry<TypeConfig>;
/// A log id (leader and index).
pub type LogId = openraft::LogId<NodeId>;
/// A vote as openraft stores it.
pub type Vote = openraft::Vote<NodeId>;
/// A membership with its log id, as the state machine stores it.
pub type StoredMembership = openraft::StoredMembership<NodeId, Node>;
/// The storage error openraft expects from stores.
pub type StorageError = openraft::StorageError<NodeId>;
/// A snapshot's metadata.
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, Node>;
/// The openraft instance of a node.
pub type Raft = openraft::Raft<TypeConfig>;

/// The longest key accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 1024;
/// The largest value accepted, in bytes.
pub const MAX_VALUE_BYTES: usize = 64 << 20;

/// A command replicated through the Raft log and applied to the key-value
/// map.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Stores `value` under `key`, replacing any earlier value.
    Put {
        /// The key (UTF-8, at most [`MAX_KEY_BYTES`]).
        key: String,
        /// The value (at most [`MAX_VALUE_BYTES`]).
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
    },
    /// Removes `key` if present.
    Delete {
        /// The key.
        key: String,
    },
    /// Several puts and deletes that arrived together, applied in order as
    /// if each were an entry of its own (see [`crate::batch`]). Never
    /// nested.
    Batch(Vec<Request>),
}

impl Request {
    /// The changes this command makes, in order, as `(key, Some(value))`
    /// for a put and `(key, None)` for a delete; a batch gives its
    /// commands' changes (a nested batch is flattened).
    #[must_use]
    pub fn changes(&self) -> Vec<(&str, Option<&[u8]>)> {
        match self {
            Request::Put { key, value } => vec![(key.as_str(), Some(&value[..]))],
            Request::Delete { key } => vec![(key.as_str(), None)],
            Request::Batch(requests) => requests.iter().flat_map(Request::changes).collect(),
        }
    }

    /// Bytes of keys and values this command carries (a batch: all of its
    /// commands').
    #[must_use]
    pub fn payload_bytes(&self) -> usize {
        match self {
            Request::Put { key, value } => key.len() + value.len(),
            Request::Delete { key } => key.len(),
            Request::Batch(requests) => requests.iter().map(Request::payload_bytes).sum(),
        }
    }
}

// Values can be megabytes: logging them whole would drown the log.
impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Request::Put { key, value } => write!(f, "Put({key:?}, {} bytes)", value.len()),
            Request::Delete { key } => write!(f, "Delete({key:?})"),
            Request::Batch(requests) => write!(f, "Batch({} commands)", requests.len()),
        }
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// What applying a [`Request`] returned.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    /// Whether the key held a value before the command (for a batch: before
    /// its first command).
    pub existed: bool,
    /// For a [`Request::Batch`]: whether each command's key held a value
    /// just before that command, in order. Empty otherwise.
    #[serde(default)]
    pub each: Vec<bool>,
}

/// Checks a key against the service's rules: non-empty UTF-8 of at most
/// [`MAX_KEY_BYTES`] bytes.
pub fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        Err("the key is empty".into())
    } else if key.len() > MAX_KEY_BYTES {
        Err(format!(
            "the key is {} bytes long; the limit is {MAX_KEY_BYTES}",
            key.len()
        ))
    } else {
        Ok(())
    }
}
