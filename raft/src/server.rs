//! The node's HTTP(S) server: its own accept loop on hyper, so that it can
//! speak TLS, cap and time out connections, and check every request's
//! credentials and body size before a handler sees it.
//!
//! **Connections.** At most [`ServerOptions::max_connections`] are open at
//! once. When a new one arrives at the cap, the connection that has been
//! idle the longest (no request in progress: waiting for its first or next
//! request, or still sending a request's headers) is closed to make room;
//! when every connection is busy with a request, the new one is closed at
//! once. A flood of idle connections therefore cannot take the node's file
//! descriptors or lock out its peers and clients: their connections,
//! recently active, are the last to go, and a closed one is simply opened
//! again. Accept errors (such as running out of descriptors) are waited
//! out, not fatal.
//!
//! **Timeouts.** A connection must complete its TLS handshake and its
//! first request's headers within [`ServerOptions::header_timeout`] of
//! being accepted, and a later request's headers within the same time of
//! their first byte; a connection with no request in progress and no
//! bytes arriving is closed after [`ServerOptions::idle_timeout`]. A
//! request's body must arrive whole within [`Policy::body_timeout`] (408
//! and the connection is closed).
//!
//! **Requests.** [`police`] runs before every route: with a token it
//! answers 401 to a request without `Authorization: Bearer <token>`;
//! then it refuses a body over its limit ([`crate::limits`]) with 413 —
//! from `Content-Length` before reading any of it, or as soon as a
//! streamed body passes it. A refused request's connection is closed once
//! the rest of its body has arrived or after 2 s, whichever is first, so
//! that a client still sending it reads the answer instead of a reset.
//!
//! **Memory for bodies.** Bodies are read whole before their route runs,
//! so the node bounds the bytes of request bodies it holds at once across
//! every connection ([`BodyBudget`], `--max-body-memory-mb`): a body takes
//! its share of the budget before it is read (all of its `Content-Length`
//! at once; a streamed body as it arrives) and gives it back once its
//! response is made. A body that cannot get its share waits, until its
//! body timeout: then 503, and the connection is closed. A body larger
//! than the whole budget waits for all of it. Many clients sending large
//! bodies at once therefore slow each other down instead of running the
//! node out of memory.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch, Notify, Semaphore, SemaphorePermit};
use tokio::task::JoinSet;
use tower::ServiceExt;

use crate::limits::request_body_limit;
use crate::security::Token;

/// How the server treats connections.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Serves HTTPS with this configuration; plain HTTP when `None`.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Connections open at once (see the module docs).
    pub max_connections: usize,
    /// Time to send a request's headers (and, on a new connection, to
    /// complete the TLS handshake first).
    pub header_timeout: Duration,
    /// Time a connection may sit with no request in progress.
    pub idle_timeout: Duration,
}

/// What [`police`] checks on every request.
#[derive(Debug)]
pub struct Policy {
    /// The bearer token every request must carry, if any.
    pub token: Option<Token>,
    /// The node's value limit, the body limit of `PUT /kv/{key}`.
    pub max_value_bytes: usize,
    /// Time for a request's whole body to arrive.
    pub body_timeout: Duration,
    /// The bytes of request bodies held at once, across connections.
    pub body_budget: BodyBudget,
}

/// The bytes of request bodies a node holds in memory at once, across all
/// its connections (see the module docs). Counted in KiB.
#[derive(Debug)]
pub struct BodyBudget {
    permits: Semaphore,
    total_kib: u32,
}

impl BodyBudget {
    /// A budget of `bytes` (at least 1 MiB is sensible: every body of a
    /// size above the budget waits for all of it).
    #[must_use]
    pub fn new(bytes: usize) -> Self {
        let total_kib = u32::try_from(bytes.div_ceil(1024).max(1)).unwrap_or(u32::MAX >> 3);
        Self {
            permits: Semaphore::new(total_kib as usize),
            total_kib,
        }
    }

    /// The budget in bytes.
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.total_kib as usize * 1024
    }

    /// Waits until `deadline` for the share of `bytes` (all of the budget
    /// at most); `None` if it did not come.
    async fn take(
        &self,
        bytes: usize,
        deadline: tokio::time::Instant,
    ) -> Option<SemaphorePermit<'_>> {
        let kib = u32::try_from(bytes.div_ceil(1024))
            .unwrap_or(u32::MAX)
            .min(self.total_kib);
        match tokio::time::timeout_at(deadline, self.permits.acquire_many(kib)).await {
            Ok(Ok(permit)) => Some(permit),
            _ => None,
        }
    }
}

fn json_error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": message.into() }))).into_response()
}

/// The same, closing the connection after it: sent when the rest of the
/// request's body will not be read.
fn closing_error(status: StatusCode, message: impl Into<String>) -> Response {
    let mut response = json_error(status, message);
    response.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    response
}

fn too_large(path: &str, limit: usize) -> Response {
    let mut response = if path.starts_with("/kv") {
        crate::api::too_large(limit)
    } else {
        json_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("{path} takes bodies of at most {limit} bytes"),
        )
    };
    response.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    response
}

fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    let (scheme, token) = value.split_at_checked(7)?;
    scheme.eq_ignore_ascii_case(b"bearer ").then_some(token)
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// How long, and for how many bytes, a refused request's body is still
/// read and thrown away after the answer is sent. A client that is still
/// sending when the server closes would otherwise get a connection reset
/// (and lose the answer) instead of the 401 or 413.
const LINGER: Duration = Duration::from_secs(2);
/// See [`LINGER`].
const LINGER_BYTES: usize = 128 << 20;

/// Answers `response` at once, and closes the connection once the rest of
/// `body` has arrived or [`LINGER`] has passed.
fn refuse(mut response: Response, body: Body) -> Response {
    response.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    if !body.is_end_stream() {
        tokio::spawn(async move {
            let mut body = body;
            let deadline = tokio::time::Instant::now() + LINGER;
            let mut drained = 0;
            while drained < LINGER_BYTES {
                match tokio::time::timeout_at(deadline, body.frame()).await {
                    Ok(Some(Ok(frame))) => drained += frame.data_ref().map_or(0, Bytes::len),
                    _ => break,
                }
            }
        });
    }
    response
}

/// Reads a body of at most `limit` bytes within `timeout`, taking its
/// share of `budget` first (all of `length` when it is known) or as it
/// arrives; the share is returned with the body.
async fn read_body<'b>(
    mut body: Body,
    length: Option<u64>,
    limit: usize,
    timeout: Duration,
    budget: &'b BodyBudget,
) -> Result<(Bytes, Option<SemaphorePermit<'b>>), BodyError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut share = match length {
        Some(length) => match budget
            .take(usize::try_from(length).unwrap_or(usize::MAX), deadline)
            .await
        {
            Some(permit) => Some(permit),
            None => return Err(BodyError::NoMemory(body)),
        },
        None => None,
    };
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut total = 0;
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Err(BodyError::Timeout),
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(BodyError::Failed(e.to_string())),
            Ok(Some(Ok(frame))) => frame,
        };
        if let Ok(data) = frame.into_data() {
            let before = total;
            total += data.len();
            if total > limit {
                return Err(BodyError::TooLarge(body));
            }
            if length.is_none() {
                // A streamed body: its share grows with it, in whole KiB,
                // up to the whole budget (a body larger than the budget
                // goes on alone once it holds all of it).
                let held = share.as_ref().map_or(0, SemaphorePermit::num_permits);
                let room = (budget.total_kib as usize).saturating_sub(held);
                let more = (total.div_ceil(1024) - before.div_ceil(1024)).min(room);
                if more > 0 {
                    let Some(permit) = budget.take(more * 1024, deadline).await else {
                        return Err(BodyError::NoMemory(body));
                    };
                    match &mut share {
                        Some(share) => share.merge(permit),
                        None => share = Some(permit),
                    }
                }
            }
            chunks.push(data);
        }
    }
    let bytes = match chunks.len() {
        0 => Bytes::new(),
        1 => chunks.pop().unwrap_or_default(),
        _ => {
            let mut whole = Vec::with_capacity(total);
            for chunk in &chunks {
                whole.extend_from_slice(chunk);
            }
            Bytes::from(whole)
        }
    };
    Ok((bytes, share))
}

/// Why a body was not read whole.
enum BodyError {
    /// It passed its limit; the rest of it.
    TooLarge(Body),
    /// It did not arrive within the body timeout.
    Timeout,
    /// The connection failed or the body was malformed.
    Failed(String),
    /// Its share of the body budget did not come within the body
    /// timeout; the rest of it.
    NoMemory(Body),
}

/// Checks a request's token and reads its body under the endpoint's
/// limit and the body timeout (see the module docs), then runs the route.
pub async fn police(State(policy): State<Arc<Policy>>, request: Request, next: Next) -> Response {
    if let Some(token) = &policy.token {
        if !bearer(request.headers()).is_some_and(|presented| token.matches(presented)) {
            let mut response = json_error(
                StatusCode::UNAUTHORIZED,
                "this node requires Authorization: Bearer <token> (the token is missing or wrong)",
            );
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
            let (_, body) = request.into_parts();
            if body.is_end_stream() {
                return response;
            }
            return refuse(response, body);
        }
    }
    let path = request.uri().path().to_owned();
    let limit = request_body_limit(request.method(), &path, policy.max_value_bytes);
    let (parts, body) = request.into_parts();
    if content_length(&parts.headers).is_some_and(|length| length > limit as u64) {
        return refuse(too_large(&path, limit), body);
    }
    if body.is_end_stream() {
        return next.run(Request::from_parts(parts, body)).await;
    }
    let length = content_length(&parts.headers);
    match read_body(
        body,
        length,
        limit,
        policy.body_timeout,
        &policy.body_budget,
    )
    .await
    {
        Ok((bytes, _share)) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Err(BodyError::TooLarge(rest)) => refuse(too_large(&path, limit), rest),
        Err(BodyError::NoMemory(rest)) => refuse(
            json_error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "the node is busy reading other request bodies (at most {} MiB of them at \
                     once) and this one waited {} ms for room: retry later",
                    policy.body_budget.bytes() >> 20,
                    policy.body_timeout.as_millis()
                ),
            ),
            rest,
        ),
        Err(BodyError::Failed(e)) => closing_error(
            StatusCode::BAD_REQUEST,
            format!("reading the request body: {e}"),
        ),
        Err(BodyError::Timeout) => closing_error(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {} ms",
                policy.body_timeout.as_millis()
            ),
        ),
    }
}

/// Milliseconds since the server started, for the connections' clocks.
#[derive(Debug, Clone, Copy)]
struct Clock(Instant);

impl Clock {
    fn now(self) -> u64 {
        u64::try_from(self.0.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// What the server knows of one connection.
#[derive(Debug)]
struct ConnState {
    clock: Clock,
    /// Requests in progress (from their headers to the end of their
    /// response).
    busy: AtomicUsize,
    /// When the connection was accepted or its last response ended.
    idle_since: AtomicU64,
    /// One more than when the first byte of the next request (or of the
    /// TLS handshake) arrived; 0 while none has.
    partial_since: AtomicU64,
    /// Whether a request has been served (the idle timeout then applies
    /// instead of the header timeout).
    served: AtomicBool,
    evicted: AtomicBool,
    evict: Notify,
}

impl ConnState {
    fn new(clock: Clock) -> Self {
        Self {
            clock,
            busy: AtomicUsize::new(0),
            idle_since: AtomicU64::new(clock.now()),
            partial_since: AtomicU64::new(0),
            served: AtomicBool::new(false),
            evicted: AtomicBool::new(false),
            evict: Notify::new(),
        }
    }

    fn bytes_arrived(&self) {
        if self.busy.load(Ordering::Relaxed) == 0 && self.partial_since.load(Ordering::Relaxed) == 0
        {
            self.partial_since
                .store(self.clock.now() + 1, Ordering::Relaxed);
        }
    }

    fn request_started(self: &Arc<Self>) -> BusyGuard {
        self.busy.fetch_add(1, Ordering::Relaxed);
        self.partial_since.store(0, Ordering::Relaxed);
        BusyGuard(self.clone())
    }

    /// When the connection is due to be closed, if no request is in
    /// progress.
    fn deadline(&self, options: &ServerOptions) -> Option<u64> {
        if self.busy.load(Ordering::Relaxed) > 0 {
            return None;
        }
        let header = duration_ms(options.header_timeout);
        let partial = self.partial_since.load(Ordering::Relaxed);
        Some(if partial != 0 {
            (partial - 1).saturating_add(header)
        } else if self.served.load(Ordering::Relaxed) {
            self.idle_since
                .load(Ordering::Relaxed)
                .saturating_add(duration_ms(options.idle_timeout))
        } else {
            self.idle_since
                .load(Ordering::Relaxed)
                .saturating_add(header)
        })
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Marks a request in progress until its response body is dropped.
#[derive(Debug)]
struct BusyGuard(Arc<ConnState>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        let state = &self.0;
        state.idle_since.store(state.clock.now(), Ordering::Relaxed);
        state.served.store(true, Ordering::Relaxed);
        state.partial_since.store(0, Ordering::Relaxed);
        state.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A response body that keeps its connection marked busy until sent.
struct Tracked {
    inner: Body,
    _busy: BusyGuard,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A socket that tells its connection's state when bytes arrive.
struct Watched {
    inner: TcpStream,
    state: Arc<ConnState>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.state.bytes_arrived();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

type Registry = Arc<Mutex<HashMap<u64, Arc<ConnState>>>>;

/// Makes room for one more connection: `true` if there is room or an idle
/// connection was told to close, `false` if every connection is busy.
fn admit(registry: &Registry, max: usize) -> bool {
    let conns = registry.lock();
    let open = conns
        .values()
        .filter(|c| !c.evicted.load(Ordering::Relaxed))
        .count();
    if open < max.max(1) {
        return true;
    }
    let victim = conns
        .values()
        .filter(|c| !c.evicted.load(Ordering::Relaxed) && c.busy.load(Ordering::Relaxed) == 0)
        .min_by_key(|c| {
            let partial = c.partial_since.load(Ordering::Relaxed);
            if partial != 0 {
                partial - 1
            } else {
                c.idle_since.load(Ordering::Relaxed)
            }
        });
    match victim {
        Some(victim) => {
            victim.evicted.store(true, Ordering::Relaxed);
            victim.evict.notify_one();
            true
        }
        None => false,
    }
}

/// Returns when the connection is to be closed: evicted, or past its
/// header or idle deadline.
async fn watchdog(state: &ConnState, options: &ServerOptions) {
    let tick = (options.header_timeout.min(options.idle_timeout) / 4)
        .clamp(Duration::from_millis(10), Duration::from_secs(1));
    loop {
        tokio::select! {
            () = state.evict.notified() => return,
            () = tokio::time::sleep(tick) => {}
        }
        if state.evicted.load(Ordering::Relaxed) {
            return;
        }
        if state
            .deadline(options)
            .is_some_and(|deadline| state.clock.now() >= deadline)
        {
            return;
        }
    }
}

async fn serve_http<IO>(
    io: IO,
    router: Router,
    state: Arc<ConnState>,
    mut shutdown: watch::Receiver<bool>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let busy = state.request_started();
        let router = router.clone();
        async move {
            let response = match router.oneshot(request).await {
                Ok(response) => response,
                Err(never) => match never {},
            };
            Ok::<_, Infallible>(response.map(|inner| Tracked { inner, _busy: busy }))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    // The watchdog times headers out (and tells idle waits from slow
    // headers, which hyper's own header timeout does not).
    builder
        .keep_alive(true)
        .header_read_timeout(None::<Duration>);
    let connection = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    let stopping = async {
        loop {
            if *shutdown.borrow_and_update() {
                return;
            }
            if shutdown.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = connection.as_mut() => return,
        () = stopping => {}
    }
    connection.as_mut().graceful_shutdown();
    let _ = connection.await;
}

async fn connection(
    stream: TcpStream,
    router: Router,
    options: Arc<ServerOptions>,
    state: Arc<ConnState>,
    shutdown: watch::Receiver<bool>,
) {
    let io = Watched {
        inner: stream,
        state: state.clone(),
    };
    let serve = async {
        match &options.tls {
            Some(tls) => {
                let acceptor = tokio_rustls::TlsAcceptor::from(tls.clone());
                if let Ok(tls_stream) = acceptor.accept(io).await {
                    serve_http(tls_stream, router, state.clone(), shutdown).await;
                }
            }
            None => serve_http(io, router, state.clone(), shutdown).await,
        }
    };
    tokio::select! {
        () = serve => {}
        () = watchdog(&state, &options) => {}
    }
}

/// Serves `router` on `listener` until `stop` fires, then lets requests in
/// progress finish (for up to 10 s) and closes every connection.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    options: ServerOptions,
    mut stop: oneshot::Receiver<()>,
) -> io::Result<()> {
    let options = Arc::new(options);
    let clock = Clock(Instant::now());
    let registry: Registry = Arc::default();
    let (shutdown, shutdown_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    let mut next_id: u64 = 0;
    loop {
        while tasks.try_join_next().is_some() {}
        let accepted = tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(_) => {
                // Out of descriptors, or a connection reset before it was
                // accepted: wait a little rather than spin.
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        if !admit(&registry, options.max_connections) {
            drop(stream);
            continue;
        }
        let _ = stream.set_nodelay(true);
        next_id += 1;
        let id = next_id;
        let state = Arc::new(ConnState::new(clock));
        registry.lock().insert(id, state.clone());
        let (router, options, registry, shutdown) = (
            router.clone(),
            options.clone(),
            registry.clone(),
            shutdown_rx.clone(),
        );
        tasks.spawn(async move {
            connection(stream, router, options, state, shutdown).await;
            registry.lock().remove(&id);
        });
    }
    drop(listener);
    let _ = shutdown.send(true);
    let drained = tokio::time::timeout(Duration::from_secs(10), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tasks.shutdown().await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use axum::extract::Path;
    use axum::routing::put;

    use super::*;

    /// A streamed body (no length known in advance) of these pieces.
    struct Pieces(VecDeque<Bytes>);

    impl HttpBody for Pieces {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            Poll::Ready(self.0.pop_front().map(|piece| Ok(Frame::data(piece))))
        }
    }

    fn put_request(key: &str, body: Body, length: Option<usize>) -> Request {
        let mut builder = axum::http::Request::put(format!("/kv/{key}"));
        if let Some(length) = length {
            builder = builder.header(header::CONTENT_LENGTH, length);
        }
        builder.body(body).unwrap()
    }

    async fn answer(router: &Router, request: Request) -> (StatusCode, String) {
        let response = router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn request_bodies_wait_for_room_in_the_memory_budget() {
        let policy = Arc::new(Policy {
            token: None,
            max_value_bytes: 4 << 20,
            body_timeout: Duration::from_millis(300),
            body_budget: BodyBudget::new(1 << 20),
        });
        // The handler of key `held` keeps its request (and the body's
        // share) until told to answer.
        let release = Arc::new(Notify::new());
        let handler_release = release.clone();
        let router = Router::new()
            .route(
                "/kv/{key}",
                put(move |Path(key): Path<String>, body: Bytes| {
                    let release = handler_release.clone();
                    async move {
                        if key == "held" {
                            release.notified().await;
                        }
                        body.len().to_string()
                    }
                }),
            )
            .layer(axum::extract::DefaultBodyLimit::disable())
            .layer(axum::middleware::from_fn_with_state(policy.clone(), police));
        let available = || policy.body_budget.permits.available_permits();
        assert_eq!(available(), 1024);

        let value = vec![7_u8; 700 << 10];
        let held = tokio::spawn({
            let router = router.clone();
            let value = value.clone();
            async move {
                let request = put_request("held", Body::from(value.clone()), Some(value.len()));
                answer(&router, request).await
            }
        });
        while available() != 1024 - 700 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }

        // No room for another 700 KiB, by length or streamed: 503 once the
        // body timeout has passed, naming the budget.
        let by_length = put_request("b", Body::from(value.clone()), Some(value.len()));
        let streamed = put_request(
            "c",
            Body::new(Pieces(
                value
                    .chunks(100 << 10)
                    .map(Bytes::copy_from_slice)
                    .collect(),
            )),
            None,
        );
        for request in [by_length, streamed] {
            let (status, body) = answer(&router, request).await;
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
            assert!(body.contains("at most 1 MiB"), "{body}");
        }
        // What the refused ones took is back; a body that fits goes in.
        assert_eq!(available(), 1024 - 700);
        let small = vec![1_u8; 300 << 10];
        let (status, body) = answer(
            &router,
            put_request("d", Body::from(small.clone()), Some(small.len())),
        )
        .await;
        assert_eq!((status, body), (StatusCode::OK, small.len().to_string()));

        // A body that waits gets in once the held one is answered, and a
        // body larger than the whole budget waits for all of it.
        let waiting = tokio::spawn({
            let router = router.clone();
            let value = value.clone();
            async move {
                let request = put_request("e", Body::from(value.clone()), Some(value.len()));
                answer(&router, request).await
            }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        release.notify_one();
        assert_eq!(
            held.await.unwrap(),
            (StatusCode::OK, value.len().to_string())
        );
        assert_eq!(
            waiting.await.unwrap(),
            (StatusCode::OK, value.len().to_string())
        );
        let large = vec![2_u8; 3 << 20];
        let (status, body) = answer(
            &router,
            put_request("f", Body::from(large.clone()), Some(large.len())),
        )
        .await;
        assert_eq!((status, body), (StatusCode::OK, large.len().to_string()));
        // Streamed, too: it stops taking more once it holds the budget.
        let streamed = put_request(
            "g",
            Body::new(Pieces(
                large
                    .chunks(256 << 10)
                    .map(Bytes::copy_from_slice)
                    .collect(),
            )),
            None,
        );
        let (status, body) = answer(&router, streamed).await;
        assert_eq!((status, body), (StatusCode::OK, large.len().to_string()));
        assert_eq!(available(), 1024);
    }
}
