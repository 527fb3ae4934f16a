//! The client API: `/kv/{key}` and `/cluster/...` over HTTP.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, JsonRejection, PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use openraft::error::{
    CheckIsLeaderError, ClientWriteError, ForwardToLeader, InitializeError, RaftError,
};
use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::json;

use crate::batch::{WriteBatcher, Written};
use crate::state_machine::StateMachine;
use crate::types::{check_key, Node, NodeId, Raft, Request, MAX_VALUE_BYTES};

/// What the handlers share.
#[derive(Clone)]
pub struct App {
    /// This node's id.
    pub id: NodeId,
    /// This node's Raft.
    pub raft: Arc<Raft>,
    /// This node's state machine (for reads).
    pub state_machine: StateMachine,
    /// Proposes `PUT`s and `DELETE`s, several to a Raft entry when they
    /// arrive together.
    pub writes: WriteBatcher,
    /// The largest value a `PUT` may carry on this node (see
    /// [`crate::node::NodeConfig::max_value_bytes`]).
    pub max_value_bytes: usize,
    /// How long a `PUT` or `DELETE` waits for a quorum to commit it before
    /// the client gets a 503 (see [`crate::node::NodeConfig::write_timeout`]).
    pub write_timeout: std::time::Duration,
    /// `"https"` when the nodes serve TLS, else `"http"`: the scheme of the
    /// leader's URL in a follower's redirect.
    pub scheme: &'static str,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": message.into() }))).into_response()
}

/// The key of a `/kv/{key}` path, or why it is not acceptable (400).
fn key_from(path: Result<Path<String>, PathRejection>) -> Result<String, String> {
    let Path(key) =
        path.map_err(|e| format!("the key must be UTF-8 (after percent-decoding): {e}"))?;
    check_key(&key)?;
    Ok(key)
}

/// A follower's answer: a redirect to the leader's same URL, with a body
/// that names it; 503 while no leader is known.
fn forward(forward: &ForwardToLeader<NodeId, Node>, scheme: &str, path: &str) -> Response {
    match (&forward.leader_id, &forward.leader_node) {
        (Some(id), Some(node)) => {
            let location = format!("{scheme}://{}{path}", node.addr);
            (
                StatusCode::TEMPORARY_REDIRECT,
                [(header::LOCATION, location)],
                Json(json!({
                    "error": "this node is not the leader",
                    "leader_id": id,
                    "leader_addr": node.addr,
                })),
            )
                .into_response()
        }
        _ => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "this node is not the leader and no leader is known (election in progress?)",
        ),
    }
}

fn write_error(
    e: RaftError<NodeId, ClientWriteError<NodeId, Node>>,
    scheme: &str,
    path: &str,
) -> Response {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => forward(&f, scheme, path),
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            error(StatusCode::CONFLICT, e.to_string())
        }
        RaftError::Fatal(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

async fn put_value(
    State(app): State<App>,
    path: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let key = match key_from(path) {
        Ok(key) => key,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    let value = match body {
        Ok(value) => value,
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return too_large(app.max_value_bytes)
        }
        Err(e) => return error(e.status(), e.body_text()),
    };
    if value.len() > app.max_value_bytes {
        return too_large(app.max_value_bytes);
    }
    let uri = format!("/kv/{}", urlencode(&key));
    let request = Request::Put {
        key,
        value: value.to_vec(),
    };
    match propose(&app, request, &uri).await {
        Ok(written) => Json(json!({
            "log_index": written.log_index,
            "replaced": written.existed,
        }))
        .into_response(),
        Err(response) => response,
    }
}

/// Proposes a write and waits for it to be committed and applied, at most
/// the node's write timeout: without a quorum (a majority of the nodes
/// down or cut off) the leader would otherwise keep the client waiting
/// for as long as the outage lasts. A write that timed out may still be
/// committed once a quorum is back, as with any request whose answer was
/// lost.
async fn propose(app: &App, request: Request, uri: &str) -> Result<Written, Response> {
    match tokio::time::timeout(app.write_timeout, app.writes.write(request)).await {
        Ok(Ok(written)) => Ok(written),
        Ok(Err(e)) => Err(write_error(*e, app.scheme, uri)),
        Err(_) => Err(error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the write was not committed within {} ms: no quorum of the cluster answered \
                 (are most of the nodes down or unreachable?); it may still be committed once \
                 they are back",
                app.write_timeout.as_millis()
            ),
        )),
    }
}

async fn delete_value(
    State(app): State<App>,
    path: Result<Path<String>, PathRejection>,
) -> Response {
    let key = match key_from(path) {
        Ok(key) => key,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    let uri = format!("/kv/{}", urlencode(&key));
    match propose(&app, Request::Delete { key }, &uri).await {
        Ok(written) => Json(json!({
            "log_index": written.log_index,
            "existed": written.existed,
        }))
        .into_response(),
        Err(response) => response,
    }
}

/// The query of `GET /kv/{key}`.
#[derive(Debug, Default, Deserialize)]
pub struct ReadOptions {
    /// `local` reads this node's state machine as it is, without asking
    /// the leader: possibly stale, but answered by any node.
    pub consistency: Option<String>,
}

async fn get_value(
    State(app): State<App>,
    path: Result<Path<String>, PathRejection>,
    options: Result<Query<ReadOptions>, QueryRejection>,
) -> Response {
    let key = match key_from(path) {
        Ok(key) => key,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    let uri = format!("/kv/{}", urlencode(&key));
    let consistency = match options {
        Ok(Query(options)) => options.consistency,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let local = match consistency.as_deref() {
        None | Some("linearizable") => false,
        Some("local") => true,
        Some(other) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("consistency must be `local` or `linearizable`, not {other:?}"),
            )
        }
    };
    if !local {
        match app.raft.ensure_linearizable().await {
            Ok(_) => {}
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => {
                return forward(&f, app.scheme, &uri)
            }
            Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        }
    }
    let sm = app.state_machine.clone();
    match tokio::task::spawn_blocking(move || sm.get(&key)).await {
        Ok(Ok(Some(value))) => {
            ([(header::CONTENT_TYPE, "application/octet-stream")], value).into_response()
        }
        Ok(Ok(None)) => error(StatusCode::NOT_FOUND, "no such key"),
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn empty_key() -> Response {
    error(StatusCode::BAD_REQUEST, "the key is empty")
}

/// Any path the API does not have (404, with a JSON body like every other
/// error).
async fn no_such_path(uri: axum::http::Uri) -> Response {
    error(
        StatusCode::NOT_FOUND,
        format!(
            "no such endpoint: {} (the API has /kv/{{key}} and /cluster/...)",
            uri.path()
        ),
    )
}

/// A method a path does not take (405, with a JSON body).
async fn wrong_method(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    error(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} does not take {method}", uri.path()),
    )
}

/// Percent-encodes a key for a redirect URL.
fn urlencode(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for byte in key.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The body of `POST /cluster/init`.
#[derive(Debug, Serialize, Deserialize)]
pub struct InitRequest {
    /// Node id → `host:port`.
    pub members: BTreeMap<NodeId, String>,
}

/// The body of `POST /cluster/add-learner`: `{"id": 4, "addr":
/// "127.0.0.1:21004"}` (`node_id` is accepted for `id`), or the pair
/// `[4, "127.0.0.1:21004"]` that openraft's examples send.
#[derive(Debug, Serialize)]
pub struct AddLearnerRequest {
    /// The new node's id.
    pub id: NodeId,
    /// Its `host:port`.
    pub addr: String,
}

impl<'de> Deserialize<'de> for AddLearnerRequest {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Object {
            #[serde(alias = "node_id")]
            id: NodeId,
            addr: String,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Shape {
            Object(Object),
            Pair(NodeId, String),
        }
        // Malformed JSON fails here, with the parser's own error (400).
        let value = serde_json::Value::deserialize(deserializer)?;
        match Shape::deserialize(value) {
            Ok(Shape::Object(Object { id, addr }) | Shape::Pair(id, addr)) => Ok(Self { id, addr }),
            Err(_) => Err(D::Error::custom(
                r#"expected {"id": 4, "addr": "127.0.0.1:21004"} or [4, "127.0.0.1:21004"]"#,
            )),
        }
    }
}

/// The body of `POST /cluster/change-membership`: `{"members": [1, 2, 3]}`,
/// the bare list `[1, 2, 3]` that openraft's examples send, or `{"members":
/// {"1": "127.0.0.1:21001", ...}}` as for `/cluster/init` (the ids count;
/// every one must already be a member or a learner).
#[derive(Debug, Serialize)]
pub struct ChangeMembershipRequest {
    /// The ids of the voters after the change.
    pub members: BTreeSet<NodeId>,
}

impl<'de> Deserialize<'de> for ChangeMembershipRequest {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Members {
            Ids(BTreeSet<NodeId>),
            // Buffered map keys stay strings: parsed below.
            Map(BTreeMap<String, serde_json::Value>),
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Shape {
            Object { members: Members },
            Bare(BTreeSet<NodeId>),
        }
        let expected = || {
            D::Error::custom(
                r#"expected {"members": [1, 2, 3]}, [1, 2, 3] or {"members": {"1": "host:port", ...}}"#,
            )
        };
        // Malformed JSON fails here, with the parser's own error (400).
        let value = serde_json::Value::deserialize(deserializer)?;
        let members = match Shape::deserialize(value).map_err(|_| expected())? {
            Shape::Object {
                members: Members::Ids(ids),
            }
            | Shape::Bare(ids) => ids,
            Shape::Object {
                members: Members::Map(map),
            } => map
                .keys()
                .map(|key| key.parse::<NodeId>().map_err(|_| expected()))
                .collect::<Result<_, _>>()?,
        };
        Ok(Self { members })
    }
}

fn json_error(e: JsonRejection) -> Response {
    error(e.status(), e.body_text())
}

/// Parses a JSON request body whatever its `Content-Type` says: `curl -d`
/// labels it `application/x-www-form-urlencoded`, and other clients send
/// none. Malformed JSON gets 400, JSON of the wrong shape 422.
#[allow(clippy::result_large_err)] // built on the error path only
fn json_body<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> Result<T, Response> {
    let bytes = body.map_err(|e| error(e.status(), e.body_text()))?;
    Json::<T>::from_bytes(&bytes)
        .map(|Json(value)| value)
        .map_err(json_error)
}

/// The 413 answer, naming the limit and, below the format's own, why.
pub(crate) fn too_large(limit: usize) -> Response {
    let why = if limit < MAX_VALUE_BYTES {
        " on this node: a value must reach the followers within one heartbeat \
         interval; start the nodes with a longer --heartbeat-ms for larger values"
    } else {
        ""
    };
    error(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("values are limited to {limit} bytes{why}"),
    )
}

/// Checks a peer address: `host:port`, the way nodes are reached.
fn check_addr(addr: &str) -> Result<(), String> {
    let valid = if let Ok(socket) = addr.parse::<std::net::SocketAddr>() {
        socket.port() > 0
    } else {
        addr.rsplit_once(':').is_some_and(|(host, port)| {
            port.parse::<u16>().is_ok_and(|p| p > 0)
                && !host.is_empty()
                && host.len() <= 253
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
        })
    };
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{addr:?} is not a node address (host:port, e.g. 127.0.0.1:21001)"
        ))
    }
}

async fn init(State(app): State<App>, body: Result<Bytes, BytesRejection>) -> Response {
    let request = match json_body::<InitRequest>(body) {
        Ok(request) => request,
        Err(response) => return response,
    };
    for addr in request.members.values() {
        if let Err(message) = check_addr(addr) {
            return error(StatusCode::BAD_REQUEST, message);
        }
    }
    let members: BTreeMap<NodeId, Node> = request
        .members
        .into_iter()
        .map(|(id, addr)| (id, Node::new(addr)))
        .collect();
    match app.raft.initialize(members).await {
        Ok(()) => Json(json!({ "initialized": true })).into_response(),
        Err(RaftError::APIError(InitializeError::NotAllowed(e))) => {
            error(StatusCode::CONFLICT, e.to_string())
        }
        Err(RaftError::APIError(e)) => error(StatusCode::BAD_REQUEST, e.to_string()),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

async fn add_learner(State(app): State<App>, body: Result<Bytes, BytesRejection>) -> Response {
    let request = match json_body::<AddLearnerRequest>(body) {
        Ok(request) => request,
        Err(response) => return response,
    };
    if let Err(message) = check_addr(&request.addr) {
        return error(StatusCode::BAD_REQUEST, message);
    }
    match app
        .raft
        .add_learner(request.id, Node::new(request.addr), true)
        .await
    {
        Ok(response) => Json(json!({ "log_index": response.log_id.index })).into_response(),
        Err(e) => write_error(e, app.scheme, "/cluster/add-learner"),
    }
}

async fn change_membership(
    State(app): State<App>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let request = match json_body::<ChangeMembershipRequest>(body) {
        Ok(request) => request,
        Err(response) => return response,
    };
    match app.raft.change_membership(request.members, false).await {
        Ok(response) => Json(json!({ "log_index": response.log_id.index })).into_response(),
        Err(e) => write_error(e, app.scheme, "/cluster/change-membership"),
    }
}

async fn snapshot(State(app): State<App>) -> Response {
    match app.raft.trigger().snapshot().await {
        Ok(()) => Json(json!({ "triggered": true })).into_response(),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// `GET /cluster/metrics`: this node's view of the cluster.
async fn metrics(State(app): State<App>) -> Response {
    let m = app.raft.metrics().borrow().clone();
    let membership = m.membership_config.membership();
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    let learners: BTreeSet<NodeId> = membership.learner_ids().collect();
    let nodes: BTreeMap<NodeId, String> = membership
        .nodes()
        .map(|(id, node)| (*id, node.addr.clone()))
        .collect();
    Json(json!({
        "id": m.id,
        "state": format!("{:?}", m.state),
        "current_term": m.current_term,
        "current_leader": m.current_leader,
        "last_log_index": m.last_log_index,
        "last_applied": m.last_applied.map(|l| l.index),
        "last_applied_log_id": m.last_applied,
        "snapshot": m.snapshot.map(|l| l.index),
        "purged": m.purged.map(|l| l.index),
        "keys": app.state_machine.len(),
        "membership": {
            "voters": voters,
            "learners": learners,
            "nodes": nodes,
        },
    }))
    .into_response()
}

/// The client routes.
pub fn routes(app: App) -> Router {
    Router::new()
        .route(
            "/kv/{*key}",
            get(get_value).put(put_value).delete(delete_value),
        )
        .route("/kv", get(empty_key).put(empty_key).delete(empty_key))
        .route("/kv/", get(empty_key).put(empty_key).delete(empty_key))
        .route("/cluster/init", post(init))
        .route("/cluster/add-learner", post(add_learner))
        .route("/cluster/change-membership", post(change_membership))
        .route("/cluster/snapshot", post(snapshot))
        .route("/cluster/metrics", get(metrics))
        .method_not_allowed_fallback(wrong_method)
        .fallback(no_such_path)
        .layer(DefaultBodyLimit::max(MAX_VALUE_BYTES))
        .with_state(app)
}
