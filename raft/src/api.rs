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
use openraft::{ChangeMembers, RaftMetrics, ServerState};
use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::json;

use crate::batch::{WriteBatcher, WriteError, Written};
use crate::identity::{ClusterId, Identity};
use crate::log_store::LogStore;
use crate::membership::{self, NotProposer};
use crate::metrics::{self, Counters, Gauges};
use crate::network::{holds_data, Network};
use crate::state_machine::StateMachine;
use crate::types::{check_key, Node, NodeId, Raft, Request, MAX_VALUE_BYTES};
use crate::validate::check_addr;

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
    /// the client gets a 503 (see [`crate::node::NodeConfig::write_timeout`]);
    /// also how long a membership change waits for the nodes it involves to
    /// catch up, and then for the change to commit.
    pub write_timeout: std::time::Duration,
    /// This node's Raft log (for `/metrics`).
    pub log_store: LogStore,
    /// What the node counts of the requests it answers (see
    /// [`crate::metrics`]).
    pub counters: Arc<Counters>,
    /// `"https"` when the nodes serve TLS, else `"http"`: the scheme of the
    /// leader's URL in a follower's redirect.
    pub scheme: &'static str,
    /// The cluster and node this node's directory belongs to
    /// ([`crate::identity`]).
    pub identity: Arc<Identity>,
    /// The client this node reaches its peers with (for
    /// `/cluster/join`).
    pub peers: Network,
    /// Held while this node runs an `init`: inits sent to several nodes at
    /// once all run on the member with the lowest id, one at a time.
    pub init_lock: Arc<tokio::sync::Mutex<()>>,
    /// Held while this node proposes a membership change (add-learner,
    /// change-membership, remove-learner): the node checks that it may
    /// propose one ([`membership::may_propose`]) and proposes it with no
    /// other change of its own in between.
    pub membership_lock: Arc<tokio::sync::Mutex<()>>,
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
            "this node is not the leader and no leader is known: an election may be under way, \
             the cluster may not be initialised yet (POST /cluster/init), or this node may not \
             be a member of it (removed, or not yet added)",
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
        Ok(Err(WriteError::Raft(e))) => Err(write_error(*e, app.scheme, uri)),
        Ok(Err(WriteError::Invalid(message))) => Err(error(StatusCode::BAD_REQUEST, message)),
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
                // The redirect keeps what the client asked for.
                let uri = match consistency {
                    Some(consistency) => format!("{uri}?consistency={consistency}"),
                    None => uri,
                };
                return forward(&f, app.scheme, &uri);
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

/// The body of `POST /cluster/join`, which a cluster's node sends to a
/// node it adds (see [`crate::identity`]).
#[derive(Debug, Serialize, Deserialize)]
pub struct JoinRequest {
    /// The cluster's id (32 hex digits).
    pub cluster: String,
    /// The id the node has in that cluster.
    pub id: NodeId,
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

/// The body of `POST /cluster/remove-learner`: `{"id": 4}` (`node_id` is
/// accepted for `id`).
#[derive(Debug, Serialize, Deserialize)]
pub struct RemoveLearnerRequest {
    /// The learner's id.
    #[serde(alias = "node_id")]
    pub id: NodeId,
}

/// The body of `POST /cluster/change-membership`: `{"members": [1, 2, 3]}`,
/// the bare list `[1, 2, 3]` that openraft's examples send, or `{"members":
/// {"1": "127.0.0.1:21001", ...}}` as for `/cluster/init`. Every id must
/// already be a member or a learner; in the map form each address must be
/// a valid `host:port` (400) and the one the cluster knows the node by
/// (409): addresses are not changed here, and a new node joins through
/// `/cluster/add-learner` first.
#[derive(Debug)]
pub struct ChangeMembershipRequest {
    /// The ids of the voters after the change.
    pub members: BTreeSet<NodeId>,
    /// The addresses given with them (the map form), or empty.
    pub addrs: BTreeMap<NodeId, String>,
}

impl Serialize for ChangeMembershipRequest {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Ids<'a> {
            members: &'a BTreeSet<NodeId>,
        }
        #[derive(Serialize)]
        struct Map<'a> {
            members: &'a BTreeMap<NodeId, String>,
        }
        if self.addrs.is_empty() {
            Ids {
                members: &self.members,
            }
            .serialize(serializer)
        } else {
            Map {
                members: &self.addrs,
            }
            .serialize(serializer)
        }
    }
}

impl<'de> Deserialize<'de> for ChangeMembershipRequest {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Members {
            Ids(BTreeSet<NodeId>),
            // Buffered map keys stay strings: parsed below.
            Map(BTreeMap<String, String>),
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
        match Shape::deserialize(value).map_err(|_| expected())? {
            Shape::Object {
                members: Members::Ids(members),
            }
            | Shape::Bare(members) => Ok(Self {
                members,
                addrs: BTreeMap::new(),
            }),
            Shape::Object {
                members: Members::Map(map),
            } => {
                let addrs: BTreeMap<NodeId, String> = map
                    .into_iter()
                    .map(|(key, addr)| Ok((key.parse::<NodeId>().map_err(|_| expected())?, addr)))
                    .collect::<Result<_, _>>()?;
                Ok(Self {
                    members: addrs.keys().copied().collect(),
                    addrs,
                })
            }
        }
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

async fn init(
    State(app): State<App>,
    headers: axum::http::HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let request = match json_body::<InitRequest>(body) {
        Ok(request) => request,
        Err(response) => return response,
    };
    for addr in request.members.values() {
        if let Err(message) = check_addr(addr) {
            return error(StatusCode::BAD_REQUEST, message);
        }
    }
    // Every init of a membership runs on its member with the lowest id,
    // one at a time: inits sent to several members at once (an operator
    // who runs it on every node) would each draw a cluster id and join the
    // others to it, leaving members in different clusters for good. The
    // first one initialises the cluster; the others find it initialised.
    let Some((&coordinator, coordinator_addr)) = request.members.iter().next() else {
        return error(StatusCode::BAD_REQUEST, "members is empty");
    };
    if coordinator != app.id && !headers.contains_key(INIT_FORWARDED_HEADER) {
        return forward_init(&app, coordinator, coordinator_addr, &request).await;
    }
    let _one_at_a_time = app.init_lock.lock().await;
    // A node that holds data is initialised already (openraft refuses
    // below); otherwise the cluster gets its id, and every other member is
    // joined to it before anything is proposed.
    if !holds_data(&app.raft) {
        let cluster = match app.identity.for_init(false) {
            Ok(cluster) => cluster,
            Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        };
        for (&id, addr) in &request.members {
            if id != app.id {
                if let Err(not_joined) = join(&app, cluster, id, addr, INIT_NOT_DONE).await {
                    return not_joined.response();
                }
            }
        }
    }
    let members: BTreeMap<NodeId, Node> = request
        .members
        .into_iter()
        .map(|(id, addr)| (id, Node::new(addr)))
        .collect();
    match app.raft.initialize(members).await {
        Ok(()) => Json(json!({ "initialized": true })).into_response(),
        Err(RaftError::APIError(InitializeError::NotAllowed(_))) => error(
            StatusCode::CONFLICT,
            "this node is initialised already (its Raft log is not empty): init starts a new \
             cluster; a cluster takes more nodes with /cluster/add-learner and \
             /cluster/change-membership",
        ),
        Err(RaftError::APIError(e)) => error(StatusCode::BAD_REQUEST, e.to_string()),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// How a failed `init` leaves the members: none is initialised, and those
/// joined before the failure keep the cluster's id (they hold no data, so
/// the next `init` joins them again).
const INIT_NOT_DONE: &str = "no cluster was initialised: send the same init again once every \
                             member runs";

/// The header that marks an `init` a member forwarded to the member with
/// the lowest id, which runs it.
const INIT_FORWARDED_HEADER: &str = "sediment-raft-init-forwarded";

/// Sends `request` to `coordinator` (the member with the lowest id), which
/// runs it, and passes its answer on.
async fn forward_init(
    app: &App,
    coordinator: NodeId,
    addr: &str,
    request: &InitRequest,
) -> Response {
    let (client, scheme, token) = app.peers.parts();
    let mut forwarded = client
        .post(format!("{scheme}://{addr}/cluster/init"))
        .timeout(app.write_timeout * 2)
        .header(INIT_FORWARDED_HEADER, app.id.to_string())
        .json(request);
    if let Some(token) = token {
        forwarded = forwarded.header(header::AUTHORIZATION, token);
    }
    let unanswered = |e: &dyn std::fmt::Display| {
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "node {coordinator} at {addr}, the member with the lowest id, which runs the \
                 init, did not answer (start every member before init): {e}; {INIT_NOT_DONE}"
            ),
        )
    };
    let answer = match forwarded.send().await {
        Ok(answer) => answer,
        Err(e) => return unanswered(&e),
    };
    let status =
        StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    match answer.bytes().await {
        Ok(body) => (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            body.to_vec(),
        )
            .into_response(),
        Err(e) => unanswered(&e),
    }
}

/// Why a node was not joined.
enum NotJoined {
    /// It did not answer: the 503 to give if the caller needs it.
    Unreachable(Response),
    /// It refused (409), or answered with another error (503).
    Refused(Response),
}

impl NotJoined {
    fn response(self) -> Response {
        match self {
            NotJoined::Unreachable(response) | NotJoined::Refused(response) => response,
        }
    }
}

/// Asks the node at `addr` to join `cluster` as node `id` (`POST
/// /cluster/join`): the node refuses if it is another node or holds
/// another cluster's data. `outcome` ends the error's message: what the
/// failure left as it was.
async fn join(
    app: &App,
    cluster: ClusterId,
    id: NodeId,
    addr: &str,
    outcome: &str,
) -> Result<(), NotJoined> {
    let (client, scheme, token) = app.peers.parts();
    let mut request = client
        .post(format!("{scheme}://{addr}/cluster/join"))
        .timeout(app.write_timeout)
        .json(&JoinRequest {
            cluster: cluster.to_string(),
            id,
        });
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, token);
    }
    let response = request.send().await.map_err(|e| {
        NotJoined::Unreachable(error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "node {id} at {addr} did not answer (start every member before init): {e}; \
                 {outcome}"
            ),
        ))
    })?;
    if response.status().is_success() {
        return Ok(());
    }
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    let detail = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_string))
        .unwrap_or(text);
    let status = if status == StatusCode::CONFLICT {
        StatusCode::CONFLICT
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    Err(NotJoined::Refused(error(
        status,
        format!("node {id} at {addr} refused to join: {detail}; {outcome}"),
    )))
}

/// `POST /cluster/join`: see [`crate::identity`]. 200 once the node
/// belongs to the cluster, 409 if it is another node or holds another
/// cluster's data.
async fn join_cluster(State(app): State<App>, body: Result<Bytes, BytesRejection>) -> Response {
    let request = match json_body::<JoinRequest>(body) {
        Ok(request) => request,
        Err(response) => return response,
    };
    let Some(cluster) = ClusterId::parse(&request.cluster) else {
        return error(
            StatusCode::BAD_REQUEST,
            "cluster must be 32 hex digits".to_string(),
        );
    };
    match app
        .identity
        .join(cluster, request.id, holds_data(&app.raft))
    {
        Ok(Ok(())) => {
            Json(json!({ "joined": true, "cluster": cluster.to_string() })).into_response()
        }
        Ok(Err(refusal)) => error(StatusCode::CONFLICT, refusal.0),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// The node `id` as the membership knows it, if any.
fn known_node(app: &App, id: NodeId) -> Option<Node> {
    app.raft
        .metrics()
        .borrow()
        .membership_config
        .membership()
        .get_node(&id)
        .cloned()
}

/// A request that got no answer from Raft within the write timeout.
fn not_committed(app: &App, what: &str) -> Response {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "{what} was not committed within {} ms: no quorum answered; it may still be \
             committed once one does",
            app.write_timeout.as_millis()
        ),
    )
}

/// Takes this node's turn to propose a membership change: the membership
/// lock (waiting up to the write timeout for another change sent to this
/// node), then, once a change still in progress has committed (up to the
/// write timeout), whether this node may propose one
/// ([`membership::may_propose`]). The guard to hold while proposing, or
/// the answer: a redirect to the leader (503 when none is known), 503 on a
/// leader that is no voter any more (a change removed it) and 409 while a
/// change is in progress.
async fn membership_turn<'a>(
    app: &'a App,
    path: &str,
) -> Result<tokio::sync::MutexGuard<'a, ()>, Response> {
    let Ok(turn) = tokio::time::timeout(app.write_timeout, app.membership_lock.lock()).await else {
        return Err(error(
            StatusCode::CONFLICT,
            format!(
                "another membership change sent to this node has not finished within {} ms; \
                 send this one again once it has",
                app.write_timeout.as_millis()
            ),
        ));
    };
    let (metrics, _) = membership::wait_until(&app.raft, app.write_timeout, |m| {
        !matches!(membership::may_propose(m), Err(NotProposer::InProgress(_)))
    })
    .await;
    may_propose(app, &metrics, path)?;
    Ok(turn)
}

/// [`membership::may_propose`] on `metrics`, with the answer when this node
/// may not propose a membership change.
#[allow(clippy::result_large_err)] // built on the error path only
fn may_propose(app: &App, metrics: &RaftMetrics<NodeId, Node>, path: &str) -> Result<(), Response> {
    let not_a_voter = || {
        let voters: Vec<NodeId> = metrics.membership_config.membership().voter_ids().collect();
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "node {} is not a voter of the latest membership it knows (voters {voters:?}): \
                 it was removed from the cluster (or is a learner) and knows no other leader, \
                 so it does not change the membership; send the change to the cluster's leader",
                app.id
            ),
        )
    };
    match membership::may_propose(metrics) {
        Ok(()) => Ok(()),
        Err(NotProposer::InProgress(index)) => Err(error(
            StatusCode::CONFLICT,
            format!(
                "a membership change is still in progress: the membership at log index {index} \
                 was not committed within {} ms, and openraft takes one change at a time; send \
                 this change again once it is (see /cluster/metrics)",
                app.write_timeout.as_millis()
            ),
        )),
        Err(NotProposer::NotVoter) => Err(not_a_voter()),
        Err(NotProposer::NotLeader) => {
            // A removed leader keeps naming itself as the leader.
            let leader_id = metrics.current_leader.filter(|&id| id != app.id);
            let leader_node = leader_id.and_then(|id| {
                metrics
                    .membership_config
                    .membership()
                    .get_node(&id)
                    .cloned()
            });
            let initialised = metrics.membership_config.log_id().is_some();
            if leader_node.is_none() && initialised && !membership::is_voter(metrics, app.id) {
                return Err(not_a_voter());
            }
            Err(forward(
                &ForwardToLeader {
                    leader_id,
                    leader_node,
                },
                app.scheme,
                path,
            ))
        }
    }
}

/// `POST /cluster/add-learner`: adds the node as a learner (committed by
/// the current voters, so it does not need the node), then waits up to the
/// write timeout for the node to catch up: 200 with `"caught_up": true`
/// once it has, 202 with `"caught_up": false` if it has not (unreachable,
/// or still copying a large log); `change-membership` refuses to make it a
/// voter until it has. An id the cluster knows at another address gets 409.
/// Only a leader that may change the membership adds it
/// ([`membership_turn`]).
async fn add_learner(State(app): State<App>, body: Result<Bytes, BytesRejection>) -> Response {
    let request = match json_body::<AddLearnerRequest>(body) {
        Ok(request) => request,
        Err(response) => return response,
    };
    if let Err(message) = check_addr(&request.addr) {
        return error(StatusCode::BAD_REQUEST, message);
    }
    if let Some(known) = known_node(&app, request.id) {
        if known.addr != request.addr {
            return error(
                StatusCode::CONFLICT,
                format!(
                    "node {} is already in the cluster at {}, not {}: a node's address cannot \
                     be changed",
                    request.id, known.addr, request.addr
                ),
            );
        }
    }
    // Only a leader that may change the membership goes on.
    let turn = match membership_turn(&app, "/cluster/add-learner").await {
        Ok(turn) => turn,
        Err(response) => return response,
    };
    // The new node joins the cluster first: it refuses if it is another
    // node, or holds another cluster's data, before anything is proposed.
    // A node that does not answer yet is added all the same (202 below):
    // until a later add-learner joins it, it refuses the cluster's RPCs.
    let mut joined = true;
    if let Some(cluster) = app.identity.cluster() {
        match join(
            &app,
            cluster,
            request.id,
            &request.addr,
            "nothing was changed",
        )
        .await
        {
            Ok(()) => {}
            Err(NotJoined::Unreachable(_)) => joined = false,
            Err(NotJoined::Refused(response)) => return response,
        }
    }
    let added = tokio::time::timeout(
        app.write_timeout,
        app.raft
            .add_learner(request.id, Node::new(request.addr.clone()), false),
    )
    .await;
    drop(turn);
    let log_index = match added {
        Ok(Ok(response)) => response.log_id.index,
        Ok(Err(e)) => return write_error(e, app.scheme, "/cluster/add-learner"),
        Err(_) => return not_committed(&app, "adding the learner"),
    };
    let id = request.id;
    let (_, caught_up) = membership::wait_until(&app.raft, app.write_timeout, |m| {
        membership::matched(m, id).is_some_and(|at| at >= log_index)
    })
    .await;
    if caught_up {
        Json(json!({ "log_index": log_index, "caught_up": true })).into_response()
    } else {
        (
            StatusCode::ACCEPTED,
            Json(json!({
                "log_index": log_index,
                "caught_up": false,
                "warning": if joined {
                    format!(
                        "node {id} was added as a learner but has not caught up within {} ms \
                         (is {} reachable?); change-membership will not make it a voter until \
                         it has",
                        app.write_timeout.as_millis(),
                        request.addr
                    )
                } else {
                    format!(
                        "node {id} was added as a learner but did not answer at {}: once it \
                         runs, call add-learner again to join it to the cluster; \
                         change-membership will not make it a voter until it has caught up",
                        request.addr
                    )
                },
            })),
        )
            .into_response()
    }
}

/// `POST /cluster/change-membership`: only on a leader that may change the
/// membership ([`membership_turn`]: a follower redirects, a leader that a
/// change removed answers 503, and a change still in progress gets 409);
/// there, first waits up to the write timeout until the change can finish
/// ([`membership::voters_ready`]) and answers 409 naming the nodes that
/// have not caught up if it cannot; then proposes it, answering 503 if it
/// is not committed within the write timeout.
async fn change_membership(
    State(app): State<App>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let request = match json_body::<ChangeMembershipRequest>(body) {
        Ok(request) => request,
        Err(response) => return response,
    };
    for addr in request.addrs.values() {
        if let Err(message) = check_addr(addr) {
            return error(StatusCode::BAD_REQUEST, message);
        }
    }
    for (&id, addr) in &request.addrs {
        match known_node(&app, id) {
            None => {
                return error(
                    StatusCode::CONFLICT,
                    format!(
                        "node {id} is not in the cluster: add it with /cluster/add-learner first"
                    ),
                )
            }
            Some(known) if known.addr != *addr => {
                return error(
                    StatusCode::CONFLICT,
                    format!(
                        "node {id} is in the cluster at {}, not {addr}: a node's address cannot \
                         be changed",
                        known.addr
                    ),
                )
            }
            Some(_) => {}
        }
    }
    const PATH: &str = "/cluster/change-membership";
    let _turn = match membership_turn(&app, PATH).await {
        Ok(turn) => turn,
        Err(response) => return response,
    };
    let metrics = app.raft.metrics().borrow().clone();
    if membership::is_leader(&metrics) && !request.members.is_empty() {
        let target = metrics.last_log_index.unwrap_or(0);
        let voters = &request.members;
        let (metrics, ready) = membership::wait_until(&app.raft, app.write_timeout, |m| {
            !membership::is_leader(m) || membership::voters_ready(m, voters, target).is_ok()
        })
        .await;
        if !ready {
            let why = match membership::voters_ready(&metrics, voters, target) {
                Err(not_ready) => not_ready.to_string(),
                Ok(()) => "the voters were not ready".into(),
            };
            return error(
                StatusCode::CONFLICT,
                format!(
                    "the membership was not changed: {why} within {} ms. The new voters could \
                     not commit the change, and the cluster could not commit anything until \
                     they answer",
                    app.write_timeout.as_millis()
                ),
            );
        }
    }
    // Waiting for the voters took time: this node may have lost its lead.
    if let Err(response) = may_propose(&app, &app.raft.metrics().borrow().clone(), PATH) {
        return response;
    }
    let changed = tokio::time::timeout(
        app.write_timeout,
        app.raft.change_membership(request.members, false),
    )
    .await;
    match changed {
        Ok(Ok(response)) => Json(json!({ "log_index": response.log_id.index })).into_response(),
        Ok(Err(e)) => write_error(e, app.scheme, PATH),
        Err(_) => not_committed(&app, "the membership change"),
    }
}

/// `POST /cluster/remove-learner`: on a leader that may change the
/// membership ([`membership_turn`]), removes the learner from the
/// membership (openraft's `ChangeMembers::RemoveNodes`): 200 once that is
/// committed, 404 if the id is no member, 409 if it is a voter
/// (`change-membership` without it removes a voter), 503 if it is not
/// committed within the write timeout. The node's process is not told;
/// the leader stops replicating to it.
async fn remove_learner(State(app): State<App>, body: Result<Bytes, BytesRejection>) -> Response {
    const PATH: &str = "/cluster/remove-learner";
    let request = match json_body::<RemoveLearnerRequest>(body) {
        Ok(request) => request,
        Err(response) => return response,
    };
    let _turn = match membership_turn(&app, PATH).await {
        Ok(turn) => turn,
        Err(response) => return response,
    };
    let id = request.id;
    {
        let metrics = app.raft.metrics();
        let metrics = metrics.borrow();
        let membership = metrics.membership_config.membership();
        if membership.get_node(&id).is_none() {
            return error(
                StatusCode::NOT_FOUND,
                format!("node {id} is not in the cluster: neither a voter nor a learner"),
            );
        }
        if membership.voter_ids().any(|voter| voter == id) {
            return error(
                StatusCode::CONFLICT,
                format!(
                    "node {id} is a voter, not a learner: /cluster/change-membership with the \
                     voters without it removes it"
                ),
            );
        }
    }
    let removed = tokio::time::timeout(
        app.write_timeout,
        app.raft
            .change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false),
    )
    .await;
    match removed {
        Ok(Ok(response)) => Json(json!({
            "log_index": response.log_id.index,
            "removed": id,
        }))
        .into_response(),
        Ok(Err(e)) => write_error(e, app.scheme, PATH),
        Err(_) => not_committed(&app, "removing the learner"),
    }
}

async fn snapshot(State(app): State<App>) -> Response {
    match app.raft.trigger().snapshot().await {
        Ok(()) => Json(json!({ "triggered": true })).into_response(),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// The leader this node knows of. A node leads by its own server state,
/// not by the leader its vote names: a leader that a membership change
/// removed keeps its vote for itself (openraft's `current_leader`) after
/// it steps down, and it names no leader then.
fn known_leader(m: &RaftMetrics<NodeId, Node>) -> Option<NodeId> {
    m.current_leader
        .filter(|&leader| leader != m.id || m.state == ServerState::Leader)
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
        "current_leader": known_leader(&m),
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

/// `GET /metrics`: the node's counters and state in the Prometheus text
/// format (see [`crate::metrics`] for the names).
async fn prometheus(State(app): State<App>) -> Response {
    let m = app.raft.metrics().borrow().clone();
    let log = app.log_store.clone();
    let log_bytes = tokio::task::spawn_blocking(move || log.disk_bytes())
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or(0);
    let gauges = Gauges {
        term: m.current_term,
        is_leader: m.state == ServerState::Leader,
        leader_id: known_leader(&m),
        last_log_index: m.last_log_index,
        last_applied_index: m.last_applied.map(|id| id.index),
        purged_index: m.purged.map(|id| id.index),
        snapshot_index: m.snapshot.map(|id| id.index),
        snapshots_built: app.state_machine.snapshots_built(),
        snapshots_installed: app.state_machine.snapshots_installed(),
        log_bytes,
        keys: app.state_machine.len() as u64,
    };
    let body = metrics::render(
        &app.counters,
        &gauges,
        app.log_store.sync_latencies(),
        &app.log_store.stage_counters(),
    );
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

/// Counts every answered request by endpoint and status, and logs the
/// refused ones (by endpoint and status only: paths hold keys, headers
/// credentials).
pub async fn record(
    State(counters): State<Arc<Counters>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let endpoint = metrics::endpoint(request.method(), request.uri().path());
    let response = next.run(request).await;
    let status = response.status();
    counters.request(endpoint, status.as_u16());
    if status.is_server_error() {
        tracing::warn!(endpoint, status = status.as_u16(), "request failed");
    } else if status.is_client_error() {
        tracing::info!(endpoint, status = status.as_u16(), "request refused");
    }
    response
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
        .route("/cluster/join", post(join_cluster))
        .route("/cluster/change-membership", post(change_membership))
        .route("/cluster/remove-learner", post(remove_learner))
        .route("/cluster/snapshot", post(snapshot))
        .route("/cluster/metrics", get(metrics))
        .route("/metrics", get(prometheus))
        .method_not_allowed_fallback(wrong_method)
        .fallback(no_such_path)
        .layer(DefaultBodyLimit::max(MAX_VALUE_BYTES))
        .with_state(app)
}
