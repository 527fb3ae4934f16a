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
    /// being held in memory; [`SnapshotData`](crate::snapshot_data::SnapshotData)
    /// reads and writes a plain or sealed snapshot file as the plain
    /// snapshot stream.
    pub TypeConfig:
        D = Request,
        R = Response,
        NodeId = NodeId,
        Node = Node,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = crate::snapshot_data::SnapshotData,
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
/// A [`Request::Batch`] holds at most this many changes.
pub const MAX_BATCH_LEN: usize = 1024;
/// A [`Request::Batch`] carries at most this many bytes of keys and values
/// (a larger write goes alone): every AppendEntries RPC must finish within
/// a heartbeat interval.
pub const MAX_BATCH_BYTES: usize = 1 << 20;

/// One change a [`Request::Batch`] carries: a put or a delete. It cannot
/// hold a batch, so a batch is flat and decoding one never recurses.
///
/// Its variants and their bincode tags (`Put` 0, `Delete` 1) are those of
/// [`Request`]'s, so a batch written when its elements were `Request`s
/// (only puts and deletes ever were) decodes the same.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Change {
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
}

impl Change {
    /// The key this change is about.
    #[must_use]
    pub fn key(&self) -> &str {
        match self {
            Change::Put { key, .. } | Change::Delete { key } => key,
        }
    }

    /// The value a put stores; `None` for a delete.
    #[must_use]
    pub fn value(&self) -> Option<&[u8]> {
        match self {
            Change::Put { value, .. } => Some(value),
            Change::Delete { .. } => None,
        }
    }

    /// Bytes of key and value this change carries.
    #[must_use]
    pub fn payload_bytes(&self) -> usize {
        self.key().len() + self.value().map_or(0, <[u8]>::len)
    }

    /// Checks the key ([`check_key`]) and that a value is at most
    /// `max_value_bytes` long.
    pub fn check(&self, max_value_bytes: usize) -> Result<(), String> {
        check_change(self.key(), self.value(), max_value_bytes)
    }
}

impl From<Change> for Request {
    fn from(change: Change) -> Self {
        match change {
            Change::Put { key, value } => Request::Put { key, value },
            Change::Delete { key } => Request::Delete { key },
        }
    }
}

impl fmt::Debug for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::Put { key, value } => write!(f, "Put({key:?}, {} bytes)", value.len()),
            Change::Delete { key } => write!(f, "Delete({key:?})"),
        }
    }
}

/// A command replicated through the Raft log and applied to the key-value
/// map.
///
/// Its bincode form is part of the log's format (`FORMAT.md`): a `u32`
/// variant tag, 0 `Put`, 1 `Delete`, 2 `Batch`, then the fields.
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
    /// if each were an entry of its own (see [`crate::batch`]). At most
    /// [`MAX_BATCH_LEN`] changes carrying at most [`MAX_BATCH_BYTES`] of
    /// keys and values; never empty.
    Batch(Vec<Change>),
}

impl Request {
    /// The changes this command makes, in order, as `(key, Some(value))`
    /// for a put and `(key, None)` for a delete; a batch gives its
    /// changes.
    #[must_use]
    pub fn changes(&self) -> Vec<(&str, Option<&[u8]>)> {
        match self {
            Request::Put { key, value } => vec![(key.as_str(), Some(&value[..]))],
            Request::Delete { key } => vec![(key.as_str(), None)],
            Request::Batch(changes) => changes.iter().map(|c| (c.key(), c.value())).collect(),
        }
    }

    /// How many changes this command makes (one, or a batch's count).
    #[must_use]
    pub fn change_count(&self) -> usize {
        match self {
            Request::Batch(changes) => changes.len(),
            _ => 1,
        }
    }

    /// The command as a list of changes (a batch gives its own).
    #[must_use]
    pub fn into_changes(self) -> Vec<Change> {
        match self {
            Request::Put { key, value } => vec![Change::Put { key, value }],
            Request::Delete { key } => vec![Change::Delete { key }],
            Request::Batch(changes) => changes,
        }
    }

    /// Bytes of keys and values this command carries (a batch: all of its
    /// changes').
    #[must_use]
    pub fn payload_bytes(&self) -> usize {
        match self {
            Request::Put { key, value } => key.len() + value.len(),
            Request::Delete { key } => key.len(),
            Request::Batch(changes) => changes.iter().map(Change::payload_bytes).sum(),
        }
    }

    /// Checks the command against the rules the client API enforces:
    /// every key passes [`check_key`], every value is at most
    /// `max_value_bytes` long, and a batch holds 1 to [`MAX_BATCH_LEN`]
    /// changes carrying at most [`MAX_BATCH_BYTES`] of keys and values (the
    /// limits [`crate::batch`] builds batches within). A follower checks
    /// every entry it receives this way, with the format's
    /// [`MAX_VALUE_BYTES`]: a leader run with a longer heartbeat may accept
    /// larger values than the follower's own API would.
    pub fn check(&self, max_value_bytes: usize) -> Result<(), String> {
        match self {
            Request::Put { key, value } => check_change(key, Some(value), max_value_bytes),
            Request::Delete { key } => check_change(key, None, max_value_bytes),
            Request::Batch(changes) => {
                if changes.is_empty() {
                    return Err("the batch is empty".into());
                }
                if changes.len() > MAX_BATCH_LEN {
                    return Err(format!(
                        "the batch holds {} changes; the limit is {MAX_BATCH_LEN}",
                        changes.len()
                    ));
                }
                let bytes = self.payload_bytes();
                if bytes > MAX_BATCH_BYTES {
                    return Err(format!(
                        "the batch carries {bytes} bytes of keys and values; the limit is \
                         {MAX_BATCH_BYTES}"
                    ));
                }
                changes.iter().try_for_each(|c| c.check(max_value_bytes))
            }
        }
    }
}

/// Checks one put (`value` given) or delete.
fn check_change(key: &str, value: Option<&[u8]>, max_value_bytes: usize) -> Result<(), String> {
    check_key(key)?;
    match value {
        Some(value) if value.len() > max_value_bytes => Err(format!(
            "the value of {:?} is {} bytes long; the limit is {max_value_bytes}",
            truncated(key),
            value.len()
        )),
        _ => Ok(()),
    }
}

/// At most the first 64 bytes of `key`, for messages.
fn truncated(key: &str) -> &str {
    let mut end = key.len().min(64);
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    &key[..end]
}

// Values can be megabytes: logging them whole would drown the log.
impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Request::Put { key, value } => write!(f, "Put({key:?}, {} bytes)", value.len()),
            Request::Delete { key } => write!(f, "Delete({key:?})"),
            Request::Batch(changes) => write!(f, "Batch({} changes)", changes.len()),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, len: usize) -> Change {
        Change::Put {
            key: key.into(),
            value: vec![0; len],
        }
    }

    #[test]
    fn commands_are_checked_as_the_api_checks_them() {
        let ok = |r: Request| r.check(MAX_VALUE_BYTES).is_ok();
        assert!(ok(put("k", MAX_VALUE_BYTES).into()));
        assert!(!ok(put("k", MAX_VALUE_BYTES + 1).into()));
        assert!(Request::from(put("k", 11)).check(10).is_err());
        assert!(!ok(put("", 1).into()));
        assert!(!ok(Request::Delete { key: String::new() }));
        assert!(!ok(put(&"k".repeat(MAX_KEY_BYTES + 1), 1).into()));
        assert!(ok(put(&"k".repeat(MAX_KEY_BYTES), 1).into()));

        assert!(!ok(Request::Batch(Vec::new())));
        assert!(ok(Request::Batch(vec![put("a", 1); MAX_BATCH_LEN])));
        assert!(!ok(Request::Batch(vec![put("a", 1); MAX_BATCH_LEN + 1])));
        assert!(ok(Request::Batch(vec![put("a", MAX_BATCH_BYTES - 1)])));
        assert!(!ok(Request::Batch(vec![put("a", MAX_BATCH_BYTES)])));
        assert!(!ok(Request::Batch(vec![put("a", 1), put("", 1)])));
    }
}
