//! Checks before a membership change, so that a change can always finish.
//!
//! openraft 0.9 changes voters through joint consensus: it appends a joint
//! config (old and new voter sets), which commits only once a majority of
//! *each* set has it, then the new set alone. Until the joint config
//! commits, it refuses every other change (`InProgress`, which the API
//! answers with 409), and nothing in its API takes the joint config back.
//! A change whose new voter set has no majority of nodes that answer, such
//! as one that makes an unreachable learner a voter where that learner's
//! vote is needed, would therefore leave the cluster unable to commit
//! anything, writes or the way back, for as long as that node is missing.
//!
//! So the leader checks before it proposes: every voter being added must
//! have caught up with the leader's log, and so must a majority of the new
//! voter set (the leader counts as caught up). It waits a bounded time for
//! that and otherwise refuses the change without touching the membership
//! ([`voters_ready`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use openraft::{RaftMetrics, ServerState};

use crate::types::{Node, NodeId, Raft};

/// The leader's view of a node's replication: the highest log index known
/// to be on it (the leader itself has everything). `None` on a
/// non-leader, or for a node nothing has been confirmed on yet.
#[must_use]
pub fn matched(metrics: &RaftMetrics<NodeId, Node>, id: NodeId) -> Option<u64> {
    if id == metrics.id {
        return metrics.last_log_index;
    }
    metrics
        .replication
        .as_ref()?
        .get(&id)
        .copied()
        .flatten()
        .map(|log_id| log_id.index)
}

/// Whether this node leads, by its own metrics.
#[must_use]
pub fn is_leader(metrics: &RaftMetrics<NodeId, Node>) -> bool {
    metrics.state == ServerState::Leader && metrics.replication.is_some()
}

/// Waits until `ready` holds for the node's metrics or `within` passes;
/// returns the last metrics seen and whether `ready` held.
pub async fn wait_until(
    raft: &Raft,
    within: Duration,
    mut ready: impl FnMut(&RaftMetrics<NodeId, Node>) -> bool,
) -> (RaftMetrics<NodeId, Node>, bool) {
    let deadline = tokio::time::Instant::now() + within;
    let mut receiver = raft.metrics();
    loop {
        let metrics = receiver.borrow_and_update().clone();
        if ready(&metrics) {
            return (metrics, true);
        }
        // Replication progress shows up in the metrics when it changes;
        // the periodic wake-up covers a sender that went away.
        let step = tokio::time::Instant::now() + Duration::from_millis(100);
        let changed = tokio::time::timeout_at(step.min(deadline), receiver.changed()).await;
        if tokio::time::Instant::now() >= deadline {
            let metrics = receiver.borrow().clone();
            let held = ready(&metrics);
            return (metrics, held);
        }
        if matches!(changed, Ok(Err(_))) {
            // The Raft core stopped: nothing will change any more.
            let metrics = receiver.borrow().clone();
            let held = ready(&metrics);
            return (metrics, held);
        }
    }
}

/// Why a voter set is not ready to become the membership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotReady {
    /// The nodes of the new voter set that have not caught up, with the
    /// index each has reached (`None`: nothing confirmed).
    pub lagging: BTreeMap<NodeId, Option<u64>>,
    /// The leader's last log index they were measured against.
    pub target: u64,
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nodes: Vec<String> = self
            .lagging
            .iter()
            .map(|(id, at)| match at {
                Some(index) => format!("node {id} (at index {index})"),
                None => format!("node {id} (nothing replicated)"),
            })
            .collect();
        write!(
            f,
            "{} not caught up with the leader's log (index {})",
            nodes.join(", "),
            self.target
        )
    }
}

/// Checks, on the leader, that changing the voters to `voters` can
/// finish: every added voter has caught up to log index `target`, and so
/// has a majority of `voters`.
pub fn voters_ready(
    metrics: &RaftMetrics<NodeId, Node>,
    voters: &BTreeSet<NodeId>,
    target: u64,
) -> Result<(), NotReady> {
    let current: BTreeSet<NodeId> = metrics.membership_config.membership().voter_ids().collect();
    let lagging: BTreeMap<NodeId, Option<u64>> = voters
        .iter()
        .map(|&id| (id, matched(metrics, id)))
        .filter(|(_, at)| at.map_or(true, |index| index < target))
        .collect();
    let added_lagging = lagging.keys().any(|id| !current.contains(id));
    let ready = voters.len() - lagging.len();
    if added_lagging || ready * 2 <= voters.len() {
        Err(NotReady { lagging, target })
    } else {
        Ok(())
    }
}
