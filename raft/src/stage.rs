//! Pre-staging: a leader sends the entries it appends to its followers
//! while it writes and syncs them itself, so that a follower's write and
//! sync overlap the leader's instead of following them.
//!
//! openraft 0.9 sends an entry to the followers only once the leader's own
//! append is durable (`RaftCore::append_to_log` waits for `LogFlushed`),
//! and each follower then writes and syncs it: a write waits for two syncs
//! one after the other. With pre-staging, the leader's log store hands the
//! entries of each append it makes while leading to a [`Stager`] before it
//! writes them ([`crate::log_store::StageOffer`]); the stager sends them
//! with the leader's vote and the log id before them as `POST /raft/stage`
//! to each follower that is caught up. A follower writes them into its log
//! if they extend it in order under the leader it follows
//! ([`LogStore::stage_entries`]) and syncs them, and answers without
//! waiting for the sync. When openraft's AppendEntries brings the same
//! entries, the follower's store finds them written and only waits for
//! that sync, usually done by then.
//!
//! On a node whose event loop runs on one thread (`--worker-threads 1`,
//! the default), the leader's store leaves the sync of an append it
//! offered to its sync thread instead of making it in place, since the
//! requests are sent by tasks of that one thread.
//!
//! The request is advisory. It is never retried, its answer changes
//! nothing on the leader (openraft counts only AppendEntries answers
//! towards a commit), and a follower that does not stage an entry writes
//! it from AppendEntries as before. `FORMAT.md`, "Pre-staged entries",
//! gives the safety argument.
//!
//! **Costs.** The entries cross the network twice, so the store offers
//! an append only when the entry before it is committed: with earlier
//! entries in flight the followers' syncs are shared anyway, and a busy
//! cluster is short of CPU rather than of syncs. Appends carrying more
//! than [`MAX_STAGE_PAYLOAD_BYTES`] of keys and values are not staged: a
//! large value's time goes to its transfer, which staging would double.
//! Each follower has one queue of at most [`QUEUE_LENGTH`] requests and
//! [`QUEUE_BYTES`] of bodies, sent
//! one after the other on the peers' pooled HTTP client (so they arrive in
//! order, on a kept-alive connection); a request that finds the queue full
//! is dropped. A follower whose replication is more than [`MAX_LAG`]
//! entries behind is not sent any (it would ignore them).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use openraft::{RaftMetrics, ServerState};
use parking_lot::Mutex;
use reqwest::header::{HeaderValue, AUTHORIZATION};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};

use crate::log_store::{payload_bytes, StageOffer, StageOutcome, INLINE_APPEND_BYTES};
use crate::metrics::StageCounters;
use crate::network::Network;
use crate::types::{Entry, LogId, Node, NodeId, Vote};
use crate::validate;
use crate::LogStore;

/// Path of the stage request.
pub const STAGE_PATH: &str = "/raft/stage";

/// An append carrying more keys and values than this is not staged.
pub const MAX_STAGE_PAYLOAD_BYTES: usize = 2 << 20;

/// Stage requests waiting for one follower at most; more are dropped.
pub const QUEUE_LENGTH: usize = 64;

/// Bytes of stage request bodies waiting for one follower at most; a
/// request that would pass it is dropped (one always fits).
pub const QUEUE_BYTES: usize = 8 << 20;

/// A follower whose last replicated entry is more than this many entries
/// before the ones being appended is not sent them.
pub const MAX_LAG: u64 = 64;

/// How long a stage request may take before it counts as failed.
pub const STAGE_TIMEOUT: Duration = Duration::from_secs(2);

/// The body of `POST /raft/stage` (bincode).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageRequest {
    /// The leader's vote (committed).
    pub vote: Vote,
    /// The log id of the entry right before `entries` in the leader's log
    /// (`None` when they start the log).
    pub prev: Option<LogId>,
    /// The entries, in order.
    pub entries: Vec<Entry>,
}

/// The same fields by reference: its bincode is a [`StageRequest`]'s.
#[derive(Serialize)]
struct StageRequestRef<'a> {
    vote: &'a Vote,
    prev: &'a Option<LogId>,
    entries: &'a [Entry],
}

/// The answer to `POST /raft/stage` (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageResponse {
    /// How many entries were written (0 if none).
    pub staged: usize,
    /// Why nothing was written, if it was not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignored: Option<String>,
}

/// One follower's queue of requests and where it is.
struct Peer {
    addr: String,
    queue: mpsc::Sender<Bytes>,
    /// Bytes of the bodies in `queue` and being sent.
    queued: Arc<AtomicUsize>,
}

/// The leader's side: sends what its log store offers to the followers
/// that are caught up. Never blocks and never calls back into the store.
pub struct Stager {
    id: NodeId,
    client: reqwest::Client,
    scheme: &'static str,
    /// The `Authorization` header (sensitive: not shown by `Debug`).
    token: Option<HeaderValue>,
    metrics: watch::Receiver<RaftMetrics<NodeId, Node>>,
    runtime: tokio::runtime::Handle,
    peers: Mutex<BTreeMap<NodeId, Peer>>,
    counters: Arc<StageCounters>,
}

impl std::fmt::Debug for Stager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stager")
            .field("id", &self.id)
            .field("scheme", &self.scheme)
            .field("peers", &self.peers.lock().len())
            .finish_non_exhaustive()
    }
}

impl Stager {
    /// A stager for node `id` that sends through `network`'s HTTP client
    /// (its TLS settings and token), learns the followers and how far
    /// each has replicated from `metrics` (the node's Raft metrics), runs
    /// its sends on the current tokio runtime and counts them in
    /// `counters`. Must be called within a tokio runtime.
    #[must_use]
    pub fn new(
        id: NodeId,
        network: &Network,
        metrics: watch::Receiver<RaftMetrics<NodeId, Node>>,
        counters: Arc<StageCounters>,
    ) -> Self {
        let (client, scheme, token) = network.parts();
        Self {
            id,
            client,
            scheme,
            token,
            metrics,
            runtime: tokio::runtime::Handle::current(),
            peers: Mutex::new(BTreeMap::new()),
            counters,
        }
    }

    /// The followers to send entries after `next - 1` to, with their
    /// addresses: while this node leads, every other node whose replication
    /// has reached at least `next - 1 - MAX_LAG`. Also forgets the queues
    /// of nodes no longer replicated to.
    fn targets(&self, next: u64) -> Vec<(NodeId, String)> {
        let metrics = self.metrics.borrow();
        if metrics.state != ServerState::Leader {
            return Vec::new();
        }
        let Some(replication) = &metrics.replication else {
            return Vec::new();
        };
        self.peers
            .lock()
            .retain(|id, _| replication.contains_key(id));
        let membership = metrics.membership_config.membership();
        replication
            .iter()
            .filter(|(id, matched)| {
                **id != self.id
                    && matched.is_some_and(|m| m.index.saturating_add(MAX_LAG + 1) >= next)
            })
            .filter_map(|(id, _)| membership.get_node(id).map(|n| (*id, n.addr.clone())))
            .collect()
    }

    fn spawn_peer(&self, addr: &str) -> Peer {
        let (queue, requests) = mpsc::channel(QUEUE_LENGTH);
        let queued = Arc::new(AtomicUsize::new(0));
        let url = format!("{}://{addr}{STAGE_PATH}", self.scheme);
        self.runtime.spawn(send_loop(
            SendTo {
                client: self.client.clone(),
                url,
                token: self.token.clone(),
                queued: queued.clone(),
                counters: self.counters.clone(),
            },
            requests,
        ));
        Peer {
            addr: addr.to_string(),
            queue,
            queued,
        }
    }
}

impl StageOffer for Stager {
    fn node_id(&self) -> NodeId {
        self.id
    }

    fn offer(&self, vote: &Vote, prev: Option<LogId>, entries: &[Entry]) -> bool {
        if entries.is_empty() || payload_bytes(entries) > MAX_STAGE_PAYLOAD_BYTES {
            return false;
        }
        let targets = self.targets(prev.map_or(0, |p| p.index + 1));
        if targets.is_empty() {
            return false;
        }
        let request = StageRequestRef {
            vote,
            prev: &prev,
            entries,
        };
        let body = match bincode::serialize(&request) {
            Ok(body) if body.len() <= crate::limits::MAX_STAGE_BODY_BYTES => Bytes::from(body),
            _ => return false,
        };
        let mut sent = false;
        let mut peers = self.peers.lock();
        for (id, addr) in targets {
            let peer = peers.entry(id).or_insert_with(|| self.spawn_peer(&addr));
            if peer.addr != addr {
                *peer = self.spawn_peer(&addr);
            }
            let queued = peer.queued.load(Ordering::Relaxed);
            if queued > 0 && queued + body.len() > QUEUE_BYTES {
                StageCounters::add(&self.counters.dropped, 1);
                continue;
            }
            peer.queued.fetch_add(body.len(), Ordering::Relaxed);
            if peer.queue.try_send(body.clone()).is_err() {
                peer.queued.fetch_sub(body.len(), Ordering::Relaxed);
                StageCounters::add(&self.counters.dropped, 1);
            } else {
                sent = true;
            }
        }
        sent
    }
}

/// Where one follower's stage requests go, and what they are counted in.
struct SendTo {
    client: reqwest::Client,
    url: String,
    /// The `Authorization` header.
    token: Option<HeaderValue>,
    queued: Arc<AtomicUsize>,
    counters: Arc<StageCounters>,
}

/// Sends one follower's stage requests one after the other, until its
/// queue is dropped.
async fn send_loop(to: SendTo, mut requests: mpsc::Receiver<Bytes>) {
    let counters = &to.counters;
    while let Some(body) = requests.recv().await {
        let len = body.len();
        let mut request = to.client.post(&to.url).timeout(STAGE_TIMEOUT).body(body);
        if let Some(token) = &to.token {
            request = request.header(AUTHORIZATION, token.clone());
        }
        let counter = match request.send().await {
            Ok(response) if response.status().is_success() => {
                match response.json::<StageResponse>().await {
                    Ok(answer) if answer.staged > 0 => &counters.sent_staged,
                    Ok(_) => &counters.sent_ignored,
                    Err(_) => &counters.sent_failed,
                }
            }
            _ => &counters.sent_failed,
        };
        to.queued.fetch_sub(len, Ordering::Relaxed);
        StageCounters::add(counter, 1);
    }
}

/// What the follower's side of `POST /raft/stage` needs: the node's id
/// and its log store.
#[derive(Debug, Clone)]
struct Receiver {
    id: NodeId,
    log_store: LogStore,
}

/// `POST /raft/stage`: a body that does not decode or that no honest
/// leader sends ([`validate::check_stage`]) gets 400; otherwise 200 with a
/// [`StageResponse`] saying whether the entries were written (a request
/// that does not extend this node's log under its leader is ignored, and
/// nothing is logged for it: it is a normal outcome, not a refusal).
async fn stage(State(receiver): State<Arc<Receiver>>, body: Bytes) -> Response {
    let request: StageRequest = match crate::network::decode(&body, validate::check_stage) {
        Ok(request) => request,
        Err(response) => return response,
    };
    let StageRequest {
        vote,
        prev,
        entries,
    } = request;
    let inline = if payload_bytes(&entries) <= INLINE_APPEND_BYTES {
        receiver
            .log_store
            .try_stage_entries(receiver.id, &vote, prev, &entries)
    } else {
        None
    };
    let outcome = match inline {
        Some(outcome) => outcome,
        None => {
            let receiver = receiver.clone();
            tokio::task::spawn_blocking(move || {
                receiver
                    .log_store
                    .stage_entries(receiver.id, &vote, prev, &entries)
            })
            .await
            .unwrap_or_else(|e| {
                Err(crate::Error::io(
                    "a blocking log task",
                    std::io::Error::other(e.to_string()),
                ))
            })
        }
    };
    match outcome {
        Ok(StageOutcome::Staged(staged)) => Json(StageResponse {
            staged,
            ignored: None,
        })
        .into_response(),
        Ok(StageOutcome::Ignored(reason)) => Json(StageResponse {
            staged: 0,
            ignored: Some(reason.to_string()),
        })
        .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(serde_json::json!({ "error": e.to_string() })),
        )
            .into_response(),
    }
}

/// The server side of the stage request, for node `id` with `log_store`.
pub fn routes(log_store: LogStore, id: NodeId) -> Router {
    Router::new()
        .route(STAGE_PATH, post(stage))
        // The node's server enforces this limit before the handler.
        .layer(axum::extract::DefaultBodyLimit::max(
            crate::limits::MAX_STAGE_BODY_BYTES,
        ))
        .with_state(Arc::new(Receiver { id, log_store }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Request;
    use openraft::{CommittedLeaderId, EntryPayload};

    #[test]
    fn a_request_by_reference_encodes_as_the_owned_one() {
        let entries = vec![Entry {
            log_id: LogId::new(CommittedLeaderId::new(3, 2), 8),
            payload: EntryPayload::Normal(Request::Put {
                key: "k".into(),
                value: vec![1, 2, 3],
            }),
        }];
        let owned = StageRequest {
            vote: Vote::new_committed(3, 2),
            prev: Some(LogId::new(CommittedLeaderId::new(2, 1), 7)),
            entries: entries.clone(),
        };
        let by_ref = StageRequestRef {
            vote: &owned.vote,
            prev: &owned.prev,
            entries: &entries,
        };
        let bytes = bincode::serialize(&by_ref).unwrap();
        assert_eq!(bytes, bincode::serialize(&owned).unwrap());
        assert_eq!(validate::decode_all::<StageRequest>(&bytes).unwrap(), owned);
    }
}
