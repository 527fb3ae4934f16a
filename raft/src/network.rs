//! Raft RPCs between nodes over HTTP: the client side ([`Network`]) and
//! the server handlers ([`routes`]).
//!
//! Requests are bincode (they carry log entries and snapshot chunks, whose
//! values are raw bytes); responses are JSON `Result`s.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

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
            base: format!("{}://{}", self.scheme, node.addr),
            token: self.token.clone(),
            identity: self.identity.clone(),
            matched: self.matched.clone(),
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

/// The RPC client for one peer.
#[derive(Debug)]
pub struct Connection {
    client: reqwest::Client,
    target: NodeId,
    base: String,
    /// The `Authorization` header (sensitive: not shown by `Debug`).
    token: Option<HeaderValue>,
    identity: Option<Arc<Identity>>,
    matched: Matched,
}

impl Connection {
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
        let response = request.body(body).send().await.map_err(|e| {
            // A peer that is down is backed off from; other failures
            // are retried at once.
            if e.is_connect() {
                RPCError::Unreachable(Unreachable::new(&e))
            } else {
                RPCError::Network(NetworkError::new(&e))
            }
        })?;
        if !response.status().is_success() {
            let status = response.status();
            let text = refusal_text(&response.text().await.unwrap_or_default());
            return Err(RPCError::Network(NetworkError::new(
                &std::io::Error::other(format!("{path} answered {status}: {text}")),
            )));
        }
        let result: Result<Resp, RaftError<NodeId, E>> = response
            .json()
            .await
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
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
