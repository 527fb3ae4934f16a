//! Raft RPCs between nodes over HTTP: the client side ([`Network`]) and
//! the server handlers ([`routes`]).
//!
//! Requests are bincode (they carry log entries and snapshot chunks, whose
//! values are raw bytes); responses are JSON `Result`s.
//!
//! An RPC that gets no answer at all (the connection refused, reset or
//! closed before a whole response came: a node that is down, something
//! else on its port, a node at its connection cap) is reported to openraft
//! as [`Unreachable`], which it backs off from (500 ms) before it tries
//! that peer again; an error status from a real peer and a timeout are
//! retried at once, as openraft does with its own timeouts. Failed RPCs
//! are logged at most once per peer every [`FAILURE_LOG_INTERVAL`], with
//! the number of failures not logged since ([`FailureLog`]), and
//! [`RpcFailureFilter`] drops the lines openraft logs for each of them.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::RaftMetrics;
use reqwest::header::{HeaderValue, AUTHORIZATION};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::identity::{Identity, CLUSTER_HEADER, TARGET_HEADER};
use crate::security::Token;
use crate::types::{Node, NodeId, Raft, TypeConfig};
use crate::validate;

/// Path of the AppendEntries RPC.
pub const APPEND_PATH: &str = "/raft/append";
/// Path of the RequestVote RPC.
pub const VOTE_PATH: &str = "/raft/vote";
/// Path of the InstallSnapshot RPC (one chunk per call).
pub const SNAPSHOT_PATH: &str = "/raft/snapshot";

/// Makes a [`Connection`] per peer; all share one HTTP client (and its
/// connection pool).
#[derive(Debug, Clone)]
pub struct Network {
    client: reqwest::Client,
    scheme: &'static str,
    token: Option<HeaderValue>,
    /// The node's identity, named in every RPC (see [`crate::identity`]).
    identity: Option<Arc<Identity>>,
    /// How far each follower's log matches this node's while it leads
    /// (see [`Matched`]).
    matched: Matched,
    /// The failed RPCs to each peer, for the log.
    failures: FailureLog,
}

impl Network {
    /// A network with a fresh HTTP client, over plain HTTP and without a
    /// token.
    #[must_use]
    pub fn new() -> Self {
        Self {
            client: reqwest::Client::builder()
                .tcp_nodelay(true)
                .build()
                .expect("an HTTP client without TLS builds"),
            scheme: "http",
            token: None,
            identity: None,
            matched: Matched::default(),
            failures: FailureLog::default(),
        }
    }

    /// A network that reaches peers over HTTPS with `tls` (the node's
    /// roots and client identity) when given, and sends `token` as
    /// `Authorization: Bearer` on every RPC when given.
    pub fn secured(tls: Option<rustls::ClientConfig>, token: Option<&Token>) -> Result<Self> {
        let mut builder = reqwest::Client::builder().tcp_nodelay(true);
        let scheme = match tls {
            Some(tls) => {
                builder = builder.use_preconfigured_tls(tls).https_only(true);
                "https"
            }
            None => "http",
        };
        let client = builder
            .build()
            .map_err(|e| Error::Config(format!("the peers' HTTP client: {e}")))?;
        Ok(Self {
            client,
            scheme,
            token: token.map(Token::header_value).transpose()?,
            identity: None,
            matched: Matched::default(),
            failures: FailureLog::default(),
        })
    }

    /// Names `identity`'s cluster and each RPC's target node in every RPC,
    /// so that a node that is not that target, or not of that cluster,
    /// refuses it (see [`crate::identity`]).
    #[must_use]
    pub fn with_identity(mut self, identity: Arc<Identity>) -> Self {
        self.identity = Some(identity);
        self
    }

    /// Gives this network (and its clones) the node's Raft metrics, once
    /// Raft runs: a follower that answers that it lacks entries the leader
    /// counts as replicated to it (a directory put back from an older
    /// copy) then gets an RPC error instead of being handed to openraft
    /// 0.9, which would stop the leader, and nothing more from it.
    pub fn watch_metrics(&self, metrics: watch::Receiver<RaftMetrics<NodeId, Node>>) {
        let _ = self.matched.0.set(metrics);
    }
}

impl Network {
    /// The HTTP client, the scheme and the `Authorization` header the
    /// node's other requests to its peers share (see [`crate::stage`]).
    pub(crate) fn parts(&self) -> (reqwest::Client, &'static str, Option<HeaderValue>) {
        (self.client.clone(), self.scheme, self.token.clone())
    }
}

impl Default for Network {
    fn default() -> Self {
        Self::new()
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Connection;

    async fn new_client(&mut self, target: NodeId, node: &Node) -> Connection {
        Connection {
            client: self.client.clone(),
            target,
            addr: node.addr.clone(),
            base: format!("{}://{}", self.scheme, node.addr),
            token: self.token.clone(),
            identity: self.identity.clone(),
            matched: self.matched.clone(),
            failures: self.failures.clone(),
        }
    }
}

/// The leader's view of how far each follower's log matches its own
/// (openraft's replication metrics), shared by the connections. A follower
/// that answers that it lacks an entry at or below that point has lost
/// entries it acknowledged: its directory was put back from an older
/// copy, damaged, or emptied by a version that recorded no identity.
/// openraft 0.9 stops the leader on that (`follower log reversion is not
/// allowed`); such an answer is turned into an RPC error instead, so the
/// follower gets nothing more from this leader and the cluster goes on
/// without it until it is removed and added again (a new learner starts
/// with no match, so its answers pass as they are).
#[derive(Debug, Clone, Default)]
struct Matched(Arc<OnceLock<watch::Receiver<RaftMetrics<NodeId, Node>>>>);

impl Matched {
    /// Whether the leader counts `target`'s log as matching its own up to
    /// `index` or further.
    fn covers(&self, target: NodeId, index: u64) -> bool {
        let Some(metrics) = self.0.get() else {
            return false;
        };
        let metrics = metrics.borrow();
        metrics
            .replication
            .as_ref()
            .and_then(|replication| replication.get(&target).copied().flatten())
            .is_some_and(|matched| matched.index >= index)
    }
}

/// How often a failing peer is logged at most: once per this interval,
/// with the number of failures since the last line.
pub const FAILURE_LOG_INTERVAL: Duration = Duration::from_secs(5);

/// The failed RPCs to each peer, logged at most once per peer every
/// [`FAILURE_LOG_INTERVAL`]. Shared by a node's connections (openraft
/// makes a new one for a peer whenever it restarts replication to it).
#[derive(Debug, Clone, Default)]
pub struct FailureLog(Arc<parking_lot::Mutex<BTreeMap<NodeId, PeerFailures>>>);

/// What [`FailureLog`] remembers of one peer.
#[derive(Debug, Default)]
struct PeerFailures {
    /// When a failure of this peer was last logged.
    logged: Option<Instant>,
    /// Failures since then that were not logged.
    unlogged: u64,
}

impl FailureLog {
    /// Records a failed RPC to node `target` at `addr`: logged (a
    /// warning) if none of that peer's was logged within the interval,
    /// else counted for the next line.
    pub fn failed(&self, target: NodeId, addr: &str, error: &dyn std::fmt::Display) {
        let mut peers = self.0.lock();
        let peer = peers.entry(target).or_default();
        if peer
            .logged
            .is_some_and(|at| at.elapsed() < FAILURE_LOG_INTERVAL)
        {
            peer.unlogged += 1;
            return;
        }
        let unlogged = std::mem::take(&mut peer.unlogged);
        peer.logged = Some(Instant::now());
        let interval = FAILURE_LOG_INTERVAL.as_secs();
        if unlogged == 0 {
            tracing::warn!(
                peer = target,
                %addr,
                "a Raft RPC to node {target} at {addr} failed: {error} (failures of a peer \
                 are logged at most once every {interval} s)"
            );
        } else {
            tracing::warn!(
                peer = target,
                %addr,
                unlogged,
                "Raft RPCs to node {target} at {addr} keep failing: {unlogged} more failed \
                 since the last line; the latest: {error}"
            );
        }
    }

    /// Records an RPC to node `target` at `addr` that got an answer:
    /// after logged failures, says that the peer answers again (with the
    /// failures since the last line) and forgets them.
    pub fn answered(&self, target: NodeId, addr: &str) {
        let mut peers = self.0.lock();
        if let Some(peer) = peers.remove(&target) {
            if peer.logged.is_some() {
                tracing::info!(
                    peer = target,
                    %addr,
                    unlogged = peer.unlogged,
                    "node {target} at {addr} answers Raft RPCs again ({} more failed since the \
                     last line)",
                    peer.unlogged
                );
            }
        }
    }
}

/// Whether a request that failed with `e` got no answer at all: the
/// connection was refused, reset or closed before a whole response came
/// (something that is not a node on the port, or a node at its connection
/// cap). Timeouts are not: a slow peer gets the RPC again at once, as
/// openraft does on its own timeout.
fn unanswered(e: &reqwest::Error) -> bool {
    (e.is_connect() || e.is_request() || e.is_body()) && !e.is_timeout()
}

/// The RPC error for a request that failed with `e`: [`Unreachable`]
/// (backed off from) if it got no answer at all ([`unanswered`]), else a
/// network error (retried at once).
fn send_error<E: std::error::Error>(
    e: &reqwest::Error,
) -> RPCError<NodeId, Node, RaftError<NodeId, E>> {
    if unanswered(e) {
        RPCError::Unreachable(Unreachable::new(e))
    } else {
        RPCError::Network(NetworkError::new(e))
    }
}

/// A [`tracing_subscriber`] layer that drops the lines openraft 0.9 logs
/// for every failed RPC to a peer (three or four per failure: the
/// replication error, the `RPCError`, the progress error, the backoff; a
/// failed vote request; a failed snapshot chunk). [`FailureLog`] logs
/// those failures instead, at most once per peer every
/// [`FAILURE_LOG_INTERVAL`]. Every other event passes.
#[derive(Debug, Clone, Copy, Default)]
pub struct RpcFailureFilter;

/// openraft's lines for a failed RPC: its module, its level and a part of
/// its message.
const OPENRAFT_RPC_FAILURE_LINES: [(&str, tracing::Level, &str); 7] = [
    (
        "openraft::replication",
        tracing::Level::WARN,
        "error replication to target=",
    ),
    ("openraft::replication", tracing::Level::ERROR, "RPCError"),
    (
        "openraft::replication",
        tracing::Level::WARN,
        "backoff mode: drain events",
    ),
    (
        "openraft::engine::handler::replication_handler",
        tracing::Level::WARN,
        "update progress error",
    ),
    (
        "openraft::core::raft_core",
        tracing::Level::ERROR,
        "while requesting vote",
    ),
    (
        "openraft::network::snapshot_transport",
        tracing::Level::WARN,
        "error sending InstallSnapshot RPC",
    ),
    (
        "openraft::network::snapshot_transport",
        tracing::Level::WARN,
        "InstallSnapshot RPC timed out",
    ),
];

impl RpcFailureFilter {
    /// Whether `event` is one of openraft's lines for a failed RPC.
    #[must_use]
    pub fn drops(event: &tracing::Event<'_>) -> bool {
        let meta = event.metadata();
        let target = meta.target();
        if !target.starts_with("openraft::") {
            return false;
        }
        let candidates: Vec<&str> = OPENRAFT_RPC_FAILURE_LINES
            .iter()
            .filter(|(module, level, _)| *module == target && level == meta.level())
            .map(|(_, _, message)| *message)
            .collect();
        if candidates.is_empty() {
            return false;
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        candidates.iter().any(|part| message.0.contains(part))
    }
}

/// The `message` field of an event, as text.
struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.0 = value.to_owned();
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for RpcFailureFilter {
    fn event_enabled(
        &self,
        event: &tracing::Event<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        !Self::drops(event)
    }
}

/// The RPC client for one peer.
#[derive(Debug)]
pub struct Connection {
    client: reqwest::Client,
    target: NodeId,
    /// The peer's address, for the log.
    addr: String,
    base: String,
    /// The `Authorization` header (sensitive: not shown by `Debug`).
    token: Option<HeaderValue>,
    identity: Option<Arc<Identity>>,
    matched: Matched,
    failures: FailureLog,
}

/// One RPC in flight, for the log: dropped unfinished after its time to
/// live (openraft gave up on it), it counts as a failure.
struct InFlight<'a> {
    connection: &'a Connection,
    path: &'a str,
    started: Instant,
    ttl: Duration,
    finished: bool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        // openraft drops an RPC once its time to live is over; an RPC
        // dropped well before (replication stopped) did not fail.
        if !self.finished && self.started.elapsed() >= self.ttl * 3 / 4 {
            let error = format!("{} got no answer within {:?}", self.path, self.ttl);
            let connection = self.connection;
            connection
                .failures
                .failed(connection.target, &connection.addr, &error);
        }
    }
}

impl Connection {
    /// Sends one RPC and records its outcome in the failure log: an answer
    /// (a Raft error from the peer included) or a failure.
    async fn call<Req, Resp, E>(
        &self,
        path: &str,
        request: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, Node, RaftError<NodeId, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let mut in_flight = InFlight {
            connection: self,
            path,
            started: Instant::now(),
            ttl: option.hard_ttl(),
            finished: false,
        };
        let result = self.exchange(path, request, option).await;
        in_flight.finished = true;
        match &result {
            Ok(_) | Err(RPCError::RemoteError(_)) => {
                self.failures.answered(self.target, &self.addr)
            }
            Err(e) => self.failures.failed(self.target, &self.addr, e),
        }
        result
    }

    async fn exchange<Req, Resp, E>(
        &self,
        path: &str,
        request: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, Node, RaftError<NodeId, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let body =
            bincode::serialize(request).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let mut request = self
            .client
            .post(format!("{}{path}", self.base))
            .timeout(option.hard_ttl());
        if let Some(token) = &self.token {
            request = request.header(AUTHORIZATION, token.clone());
        }
        if let Some(identity) = &self.identity {
            request = request.header(TARGET_HEADER, self.target.to_string());
            if let Some(cluster) = identity.cluster() {
                request = request.header(CLUSTER_HEADER, cluster.to_string());
            }
        }
        let response = request
            .body(body)
            .send()
            .await
            .map_err(|e| send_error(&e))?;
        if !response.status().is_success() {
            let status = response.status();
            let text = refusal_text(&response.text().await.unwrap_or_default());
            return Err(RPCError::Network(NetworkError::new(
                &std::io::Error::other(format!("{path} answered {status}: {text}")),
            )));
        }
        // A body cut short is no answer either; one that does not decode
        // is a peer's error.
        let body = response.bytes().await.map_err(|e| send_error(&e))?;
        let result: Result<Resp, RaftError<NodeId, E>> =
            serde_json::from_slice(&body).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for Connection {
    /// Sends the first entries that fit in
    /// [`APPEND_PACK_BYTES`](crate::limits::APPEND_PACK_BYTES) (at least
    /// one), so that the body stays within what peers accept
    /// ([`crate::limits`]); openraft sends the rest after the
    /// `PartialSuccess` this answers with.
    async fn append_entries(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        let held_back = crate::limits::pack_entries(&mut rpc.entries);
        let last_sent = rpc.entries.last().map(|entry| entry.log_id);
        let prev = rpc.prev_log_id;
        let response = self.call(APPEND_PATH, &rpc, &option).await?;
        if let (AppendEntriesResponse::Conflict, Some(prev)) = (&response, prev) {
            if self.matched.covers(self.target, prev.index) {
                return Err(reverted(self.target, prev.index));
            }
        }
        match response {
            AppendEntriesResponse::Success if held_back > 0 => {
                Ok(AppendEntriesResponse::PartialSuccess(last_sent))
            }
            response => Ok(response),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, Node, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.call(SNAPSHOT_PATH, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        self.call(VOTE_PATH, &rpc, &option).await
    }
}

/// The error for a follower that lost entries it acknowledged (see
/// [`Matched`]), logged at most once per ten seconds.
fn reverted(target: NodeId, index: u64) -> RPCError<NodeId, Node, RaftError<NodeId>> {
    static LAST_LOGGED: AtomicU64 = AtomicU64::new(0);
    let message = format!(
        "node {target} no longer holds log entry {index}, which it acknowledged: its directory \
         was put back from an older copy or damaged; it gets no more entries from this leader. \
         Remove it from the cluster (/cluster/change-membership) and add it again \
         (/cluster/add-learner)"
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if now >= LAST_LOGGED.load(Ordering::Relaxed) + 10 {
        LAST_LOGGED.store(now, Ordering::Relaxed);
        tracing::warn!("{message}");
    }
    RPCError::Network(NetworkError::new(&std::io::Error::other(message)))
}

/// An RPC's refusal: a JSON `error`, like every other endpoint's.
fn rpc_error(status: StatusCode, message: String) -> Response {
    (status, Json(serde_json::json!({ "error": message }))).into_response()
}

/// The message of a refusal a peer answered: its JSON `error`, or the
/// text as it is (a node of an earlier version answers plain text).
fn refusal_text(text: &str) -> String {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|value| value.get("error")?.as_str().map(str::to_owned))
        .unwrap_or_else(|| text.to_owned())
}

/// Decodes an RPC body with a byte limit and checks it
/// ([`crate::validate`]) before openraft sees it: anything undecodable or
/// that no honest leader or candidate sends gets 400.
#[allow(clippy::result_large_err)] // built on the error path only
pub(crate) fn decode<T: DeserializeOwned>(
    body: &Bytes,
    check: impl FnOnce(&T) -> Result<(), String>,
) -> Result<T, Response> {
    let refuse = |message: String| rpc_error(StatusCode::BAD_REQUEST, message);
    let request: T =
        validate::decode_all(body).map_err(|e| refuse(format!("undecodable RPC body: {e}")))?;
    check(&request).map_err(|e| refuse(format!("refused RPC: {e}")))?;
    Ok(request)
}

/// The node's Raft and identity, for the RPC handlers.
#[derive(Clone)]
struct Rpc {
    raft: Arc<Raft>,
    identity: Arc<Identity>,
}

/// Whether the node holds any log entry or snapshot.
pub(crate) fn holds_data(raft: &Raft) -> bool {
    let metrics = raft.metrics();
    let metrics = metrics.borrow();
    metrics.last_log_index.is_some() || metrics.snapshot.is_some() || metrics.purged.is_some()
}

/// Checks an RPC's identity headers ([`crate::identity`]): `None` if it
/// may go on, else the 409 that refuses it. A refusal is logged
/// (at most once per ten seconds): the operator of this node sees why
/// the cluster's traffic is turned away.
fn admit(rpc: &Rpc, headers: &HeaderMap) -> Option<Response> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    match rpc.identity.admit(
        header(CLUSTER_HEADER),
        header(TARGET_HEADER),
        holds_data(&rpc.raft),
    ) {
        Ok(()) => None,
        Err(refusal) => {
            static LAST_LOGGED: AtomicU64 = AtomicU64::new(0);
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            if now >= LAST_LOGGED.load(Ordering::Relaxed) + 10 {
                LAST_LOGGED.store(now, Ordering::Relaxed);
                tracing::warn!("refusing Raft RPCs: {refusal}");
            }
            Some(rpc_error(StatusCode::CONFLICT, refusal.0))
        }
    }
}

async fn append(State(rpc): State<Rpc>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(refused) = admit(&rpc, &headers) {
        return refused;
    }
    match decode::<AppendEntriesRequest<TypeConfig>>(&body, validate::check_append) {
        Ok(request) => Json(rpc.raft.append_entries(request).await).into_response(),
        Err(response) => response,
    }
}

async fn vote(State(rpc): State<Rpc>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(refused) = admit(&rpc, &headers) {
        return refused;
    }
    match decode::<VoteRequest<NodeId>>(&body, validate::check_vote_request) {
        Ok(request) => Json(rpc.raft.vote(request).await).into_response(),
        Err(response) => response,
    }
}

async fn snapshot(State(rpc): State<Rpc>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(refused) = admit(&rpc, &headers) {
        return refused;
    }
    match decode::<InstallSnapshotRequest<TypeConfig>>(&body, validate::check_install_snapshot) {
        Ok(request) => Json(rpc.raft.install_snapshot(request).await).into_response(),
        Err(response) => response,
    }
}

/// The server side of the Raft RPCs, refused where `identity` says they
/// are not for this node ([`crate::identity`]).
pub fn routes(raft: Arc<Raft>, identity: Arc<Identity>) -> Router {
    Router::new()
        .route(APPEND_PATH, post(append))
        .route(VOTE_PATH, post(vote))
        .route(SNAPSHOT_PATH, post(snapshot))
        // The node's server enforces each RPC's own limit before this
        // (see `crate::limits`); this is the largest of them.
        .layer(axum::extract::DefaultBodyLimit::max(
            crate::limits::MAX_APPEND_BODY_BYTES,
        ))
        .with_state(Rpc { raft, identity })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Collects the `target message` of every event that reaches it.
    struct Capture(Arc<parking_lot::Mutex<Vec<String>>>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            let mut message = Message(String::new());
            event.record(&mut message);
            let target = event.metadata().target();
            self.0.lock().push(format!("{target} {}", message.0));
        }
    }

    /// What reaches a subscriber with [`RpcFailureFilter`] while `emit`
    /// runs.
    fn logged(emit: impl FnOnce()) -> Vec<String> {
        use tracing_subscriber::layer::SubscriberExt;
        let lines = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let subscriber = tracing_subscriber::registry()
            .with(RpcFailureFilter)
            .with(Capture(lines.clone()));
        tracing::subscriber::with_default(subscriber, emit);
        let lines = lines.lock().clone();
        lines
    }

    #[test]
    fn openrafts_lines_for_a_failed_rpc_are_dropped_and_others_kept() {
        let lines = logged(|| {
            // What openraft 0.9 logs for one failed AppendEntries, vote
            // and snapshot chunk.
            tracing::warn!(target: "openraft::replication", error = "NetworkError: reset",
                "error replication to target={}", 2);
            tracing::error!(target: "openraft::replication", err = "NetworkError: reset",
                "RPCError");
            tracing::warn!(target: "openraft::replication", interval = "500ms",
                "{} backoff mode: drain events without processing them",
                "openraft::replication::ReplicationCore<..>::backoff_drain_events");
            tracing::warn!(target: "openraft::engine::handler::replication_handler",
                request_id = "AppendEntries(7)", result = "NetworkError: reset",
                "update progress error");
            tracing::error!(target: "openraft::core::raft_core", error = "reset", target = 2,
                "while requesting vote");
            tracing::warn!(target: "openraft::network::snapshot_transport", error = "reset",
                "error sending InstallSnapshot RPC");
            // Kept: a storage error, other warnings, and the same words
            // from elsewhere.
            tracing::error!(target: "openraft::replication", error = "StorageError",
                "error replication to target={}", 2);
            tracing::warn!(target: "openraft::replication", "failed to send snapshot");
            tracing::warn!(target: "sediment_raft::network", "RPCError");
            tracing::info!(target: "openraft::core::raft_core", "while requesting vote");
        });
        assert_eq!(
            lines,
            [
                "openraft::replication error replication to target=2",
                "openraft::replication failed to send snapshot",
                "sediment_raft::network RPCError",
                "openraft::core::raft_core while requesting vote",
            ]
        );
    }

    #[test]
    fn a_failing_peer_is_logged_once_per_interval_with_the_failures_not_logged() {
        let log = FailureLog::default();
        let lines = logged(|| {
            for _ in 0..100 {
                log.failed(2, "127.0.0.1:9", &"connection reset");
                log.failed(3, "127.0.0.1:8", &"connection closed");
            }
            log.answered(2, "127.0.0.1:9");
            // A peer that never failed is not mentioned.
            log.answered(4, "127.0.0.1:7");
            log.failed(2, "127.0.0.1:9", &"connection reset");
        });
        assert_eq!(lines.len(), 4, "{lines:#?}");
        assert!(lines[0].contains("node 2 at 127.0.0.1:9 failed: connection reset"));
        assert!(lines[1].contains("node 3 at 127.0.0.1:8 failed: connection closed"));
        assert!(
            lines[2].contains("node 2 at 127.0.0.1:9 answers Raft RPCs again (99 more failed"),
            "{}",
            lines[2]
        );
        // After an answer, the next failure is news again.
        assert!(lines[3].contains("node 2 at 127.0.0.1:9 failed"));

        // Once the interval has passed, the next failure is logged with
        // the count of those that were not.
        log.0.lock().get_mut(&3).unwrap().logged = Some(Instant::now() - FAILURE_LOG_INTERVAL);
        let lines = logged(|| log.failed(3, "127.0.0.1:8", &"connection closed"));
        assert_eq!(lines.len(), 1, "{lines:#?}");
        assert!(
            lines[0].contains("keep failing: 99 more failed since the last line"),
            "{}",
            lines[0]
        );
    }

    #[test]
    fn a_peers_refusal_is_read_from_json_or_plain_text() {
        let json = r#"{"error":"refused RPC: a term beyond any election"}"#;
        assert_eq!(
            refusal_text(json),
            "refused RPC: a term beyond any election"
        );
        // A node of an earlier version answers plain text.
        assert_eq!(refusal_text("undecodable RPC body"), "undecodable RPC body");
        assert_eq!(refusal_text(r#"{"other":1}"#), r#"{"other":1}"#);
    }
}
