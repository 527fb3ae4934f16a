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
//!
//! Before any of that, a node proposes a membership change only while it
//! leads, is a voter of the latest membership it knows and that membership
//! is committed ([`may_propose`]). A leader that a change has just removed
//! goes on leading for a moment (until it steps down on its next tick),
//! and openraft 0.9 stops its core with a panic if such a leader is asked
//! for one more membership change.

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

/// Why a node does not propose a membership change now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotProposer {
    /// The node does not lead: the change goes to the leader.
    NotLeader,
    /// The node leads but is no voter of the latest membership it knows:
    /// a change has just removed it, and it steps down shortly.
    NotVoter,
    /// The latest membership, at this log index, is not committed (and
    /// applied) yet: a change is still in progress.
    InProgress(u64),
}

/// Whether this node may propose a membership change now, by its own
/// metrics: it leads, is a voter of the latest membership it knows, and
/// that membership has been applied (so committed).
pub fn may_propose(metrics: &RaftMetrics<NodeId, Node>) -> Result<(), NotProposer> {
    if !is_leader(metrics) {
        return Err(NotProposer::NotLeader);
    }
    if !is_voter(metrics, metrics.id) {
        return Err(NotProposer::NotVoter);
    }
    let at = metrics.membership_config.log_id().map(|id| id.index);
    match at {
        Some(index) if at > metrics.last_applied.map(|id| id.index) => {
            Err(NotProposer::InProgress(index))
        }
        _ => Ok(()),
    }
}

/// Whether `id` is a voter of the latest membership the node knows.
#[must_use]
pub fn is_voter(metrics: &RaftMetrics<NodeId, Node>, id: NodeId) -> bool {
    metrics
        .membership_config
        .membership()
        .voter_ids()
        .any(|voter| voter == id)
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use openraft::{CommittedLeaderId, LogId, Membership, StoredMembership};

    use super::*;

    fn log_id(index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(1, 1), index)
    }

    /// Node 1's metrics as a leader with `voters` at log index
    /// `membership_at`, having applied up to `applied`.
    fn leader(voters: &[NodeId], membership_at: u64, applied: u64) -> RaftMetrics<NodeId, Node> {
        let mut metrics = RaftMetrics::new_initial(1);
        metrics.state = ServerState::Leader;
        metrics.current_leader = Some(1);
        metrics.replication = Some(BTreeMap::new());
        let nodes: BTreeMap<NodeId, Node> = [1, 2, 3]
            .into_iter()
            .map(|id| (id, Node::new(format!("127.0.0.1:2000{id}"))))
            .collect();
        let voters: BTreeSet<NodeId> = voters.iter().copied().collect();
        metrics.membership_config = Arc::new(StoredMembership::new(
            Some(log_id(membership_at)),
            Membership::new(vec![voters], nodes),
        ));
        metrics.last_applied = Some(log_id(applied));
        metrics.last_log_index = Some(applied.max(membership_at));
        metrics
    }

    #[test]
    fn only_a_leader_that_is_a_voter_of_a_committed_membership_proposes() {
        assert_eq!(may_propose(&leader(&[1, 2, 3], 5, 5)), Ok(()));
        assert_eq!(may_propose(&leader(&[1, 2, 3], 5, 9)), Ok(()));
        // A change removed it.
        assert_eq!(
            may_propose(&leader(&[2, 3], 5, 5)),
            Err(NotProposer::NotVoter)
        );
        // The latest change is not applied yet.
        assert_eq!(
            may_propose(&leader(&[1, 2], 7, 6)),
            Err(NotProposer::InProgress(7))
        );
        let mut follower = leader(&[1, 2, 3], 5, 5);
        follower.state = ServerState::Follower;
        follower.replication = None;
        assert_eq!(may_propose(&follower), Err(NotProposer::NotLeader));
    }
}
