//! Client writes gathered into shared Raft entries.
//!
//! openraft 0.9 appends one client write at a time and waits for that
//! append's flush before it takes the next one (`RaftCore::append_to_log`
//! awaits the `LogFlushed` callback), so a leader that proposes every
//! `PUT` as its own entry makes one log `fdatasync` per write, one after
//! the other, whatever the number of clients. The [`WriteBatcher`] puts
//! the writes that arrive while earlier ones are in flight into one
//! [`Request::Batch`] entry: one append, one replication round and one
//! state-machine transaction for all of them. At most
//! [`MAX_IN_FLIGHT`] entries are proposed at once, so that writes queue
//! here (and share an entry) rather than inside openraft.
//!
//! A write that arrives alone is proposed alone, as a plain
//! [`Request::Put`] or [`Request::Delete`]: a single client pays nothing
//! for the batching. Commands in a batch are applied in order, each one
//! seeing the ones before it, exactly as if they had been proposed one
//! after the other; each is acknowledged only when the whole entry is
//! committed and applied.

use std::sync::Arc;

use openraft::error::{ClientWriteError, RaftError};
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::types::{Node, NodeId, Raft, Request};

/// Entries proposed at once; writes arriving while this many are in flight
/// wait and share the next entry.
pub const MAX_IN_FLIGHT: usize = 2;
pub use crate::types::{MAX_BATCH_BYTES, MAX_BATCH_LEN};

/// Why a write through the batcher failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum WriteError {
    /// The request breaks the rules every node checks entries against
    /// ([`Request::check`]): it was not proposed.
    #[error("invalid write: {0}")]
    Invalid(String),
    /// Raft did not commit it (boxed: openraft's error is over 200 bytes,
    /// and every waiter of a failed batch gets one).
    #[error(transparent)]
    Raft(Box<RaftError<NodeId, ClientWriteError<NodeId, Node>>>),
}

/// What a write's caller gets back: the log index of the entry that
/// carried it, and whether its key held a value before it.
pub type WriteResult = Result<Written, WriteError>;

/// A committed and applied write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// Index of the Raft entry that carried the write.
    pub log_index: u64,
    /// Whether the key held a value just before this write.
    pub existed: bool,
}

/// One write waiting to be proposed.
#[derive(Debug)]
pub struct Pending {
    /// The command.
    pub request: Request,
    /// Where its result goes.
    pub done: oneshot::Sender<WriteResult>,
}

impl Pending {
    fn bytes(&self) -> usize {
        self.request.payload_bytes()
    }

    fn changes(&self) -> usize {
        self.request.change_count()
    }
}

/// Proposes client writes to Raft, several to an entry when they arrive
/// together (see the module docs). Cloning shares the queue.
#[derive(Debug, Clone)]
pub struct WriteBatcher {
    queue: mpsc::UnboundedSender<Pending>,
}

impl WriteBatcher {
    /// Starts the batching task for `raft` on the current tokio runtime.
    /// It ends when every clone of the batcher is dropped.
    #[must_use]
    pub fn start(raft: Arc<Raft>) -> Self {
        let (queue, receiver) = mpsc::unbounded_channel();
        tokio::spawn(run(raft, receiver));
        Self { queue }
    }

    /// Proposes `request` and waits until it is committed and applied, or
    /// failed. A request that fails [`Request::check`] with the format's
    /// value limit is refused without being proposed: every follower would
    /// refuse the entry that carried it.
    pub async fn write(&self, request: Request) -> WriteResult {
        request
            .check(crate::types::MAX_VALUE_BYTES)
            .map_err(WriteError::Invalid)?;
        let (done, result) = oneshot::channel();
        if self.queue.send(Pending { request, done }).is_err() {
            return Err(stopped());
        }
        result.await.unwrap_or_else(|_| Err(stopped()))
    }
}

fn stopped() -> WriteError {
    WriteError::Raft(Box::new(RaftError::Fatal(openraft::error::Fatal::Stopped)))
}

/// Takes `first` and then whatever is already queued, up to the limits.
/// A write that would take the batch past [`MAX_BATCH_BYTES`] or
/// [`MAX_BATCH_LEN`] changes is left in `carry` for the next batch, so a
/// batch of several writes always passes [`Request::check`].
pub fn collect(
    first: Pending,
    queue: &mut mpsc::UnboundedReceiver<Pending>,
    carry: &mut Option<Pending>,
) -> Vec<Pending> {
    let mut bytes = first.bytes();
    let mut changes = first.changes();
    let mut batch = vec![first];
    while changes < MAX_BATCH_LEN && bytes < MAX_BATCH_BYTES {
        let Ok(next) = queue.try_recv() else { break };
        if bytes + next.bytes() > MAX_BATCH_BYTES || changes + next.changes() > MAX_BATCH_LEN {
            *carry = Some(next);
            break;
        }
        bytes += next.bytes();
        changes += next.changes();
        batch.push(next);
    }
    batch
}

async fn run(raft: Arc<Raft>, mut queue: mpsc::UnboundedReceiver<Pending>) {
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut carry: Option<Pending> = None;
    loop {
        let first = match carry.take() {
            Some(first) => first,
            None => match queue.recv().await {
                Some(first) => first,
                None => return,
            },
        };
        // Waiting for a slot before collecting is what lets writes pile
        // up and share an entry.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let batch = collect(first, &mut queue, &mut carry);
        let raft = raft.clone();
        tokio::spawn(async move {
            propose(&raft, batch).await;
            drop(slot);
        });
    }
}

async fn propose(raft: &Raft, mut batch: Vec<Pending>) {
    if batch.len() == 1 {
        let Pending { request, done } = batch.pop().expect("one write");
        let result = raft
            .client_write(request)
            .await
            .map(|r| Written {
                log_index: r.log_id.index,
                existed: r.data.existed,
            })
            .map_err(|e| WriteError::Raft(Box::new(e)));
        let _ = done.send(result);
        return;
    }
    // `Response::each` has one flag per change, so a waiter's flag is at
    // the count of changes before its command (a caller's own batch is
    // flattened into this one and answers for its first change).
    let mut first_change = 0;
    let mut waiters = Vec::with_capacity(batch.len());
    let mut changes = Vec::with_capacity(batch.len());
    for Pending { request, done } in batch {
        waiters.push((first_change, done));
        first_change += request.change_count();
        changes.extend(request.into_changes());
    }
    match raft.client_write(Request::Batch(changes)).await {
        Ok(response) => {
            for (at, done) in waiters {
                let _ = done.send(Ok(Written {
                    log_index: response.log_id.index,
                    existed: response.data.each.get(at).copied().unwrap_or(false),
                }));
            }
        }
        Err(e) => {
            for (_, done) in waiters {
                let _ = done.send(Err(WriteError::Raft(Box::new(e.clone()))));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Change;

    fn put(key: &str, len: usize) -> (Pending, oneshot::Receiver<WriteResult>) {
        let (done, result) = oneshot::channel();
        let request = Request::Put {
            key: key.into(),
            value: vec![1; len],
        };
        (Pending { request, done }, result)
    }

    #[test]
    fn queued_writes_join_the_first_up_to_the_byte_limit() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut receivers = Vec::new();
        let (first, r) = put("a", 10);
        receivers.push(r);
        for (key, len) in [("b", 20), ("c", 30), ("big", MAX_BATCH_BYTES), ("d", 1)] {
            let (p, r) = put(key, len);
            tx.send(p).unwrap();
            receivers.push(r);
        }
        let mut carry = None;
        let batch = collect(first, &mut rx, &mut carry);
        let keys: Vec<_> = batch
            .iter()
            .map(|p| match &p.request {
                Request::Put { key, .. } => key.clone(),
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(keys, ["a", "b", "c"]);
        // The large write goes first in the next batch, alone.
        let big = carry.take().expect("the large write is carried over");
        let next = collect(big, &mut rx, &mut carry);
        assert_eq!(next.len(), 1);
        assert!(carry.is_none(), "a full batch takes nothing more");
        let d = rx.try_recv().expect("\"d\" is still queued");
        assert_eq!(collect(d, &mut rx, &mut carry).len(), 1);
        assert!(carry.is_none());
        drop(tx);
    }

    #[test]
    fn a_queued_batch_counts_its_values_bytes() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (done, _r) = oneshot::channel();
        let halves = Request::Batch(vec![
            Change::Put {
                key: "x".into(),
                value: vec![0; MAX_BATCH_BYTES / 2],
            },
            Change::Put {
                key: "y".into(),
                value: vec![0; MAX_BATCH_BYTES / 2],
            },
        ]);
        tx.send(Pending {
            request: halves,
            done,
        })
        .unwrap();
        let (first, _r) = put("a", 10);
        let mut carry = None;
        assert_eq!(collect(first, &mut rx, &mut carry).len(), 1);
        assert!(
            carry.is_some(),
            "the 1 MiB batch does not fit after 11 bytes"
        );
    }

    #[test]
    fn a_batch_stops_at_its_command_limit() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut receivers = Vec::new();
        for i in 0..MAX_BATCH_LEN + 5 {
            let (p, r) = put(&format!("k{i}"), 0);
            tx.send(p).unwrap();
            receivers.push(r);
        }
        let (first, _r) = put("first", 0);
        let mut carry = None;
        assert_eq!(collect(first, &mut rx, &mut carry).len(), MAX_BATCH_LEN);
        let first = rx.try_recv().unwrap();
        assert_eq!(collect(first, &mut rx, &mut carry).len(), 6);
    }

    #[test]
    fn a_batch_counts_the_changes_of_queued_batches() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut receivers = Vec::new();
        let many = |prefix: &str, n: usize| {
            Request::Batch(
                (0..n)
                    .map(|i| Change::Delete {
                        key: format!("{prefix}{i}"),
                    })
                    .collect(),
            )
        };
        for request in [many("a", 1000), many("b", 30)] {
            let (done, r) = oneshot::channel();
            tx.send(Pending { request, done }).unwrap();
            receivers.push(r);
        }
        let (first, _r) = put("first", 0);
        let mut carry = None;
        let batch = collect(first, &mut rx, &mut carry);
        let changes: usize = batch.iter().map(|p| p.request.change_count()).sum();
        assert_eq!(changes, 1001);
        assert!(carry.is_some(), "30 more changes would pass the limit");
    }
}
