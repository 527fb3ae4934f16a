//! One node: its stores, its Raft and its HTTP server.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use okaywal::encryption::KeyProvider;
use okaywal::fs::{FileSystem, StdFileSystem};
use openraft::{ServerState, SnapshotPolicy};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::api::{self, App};
use crate::batch::WriteBatcher;
use crate::encryption::{check_node_directory, SharedKeys};
use crate::error::{Error, Result};
use crate::identity::Identity;
use crate::log_store::{LogStore, LogStoreConfig};
use crate::metrics::Counters;
use crate::network::{self, Network};
use crate::security::{TlsFiles, Token};
use crate::server::{self, Policy, ServerOptions};
use crate::stage::{self, Stager};
use crate::state_machine::{StateMachine, StateMachineConfig};
use crate::types::{NodeId, Raft};

/// The default cap on a node's open connections. The binary raises its
/// open-file limit to the hard limit and lowers this cap when that limit
/// leaves too little room for it (see `sediment-raft node --help`).
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// The default of [`NodeConfig::max_body_memory`]: 256 MiB, room for four
/// of the largest values at once.
pub const DEFAULT_MAX_BODY_MEMORY: usize = 256 << 20;

/// How to run a node.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The node's id in the cluster.
    pub id: NodeId,
    /// The address to serve peers and clients on.
    pub listen: SocketAddr,
    /// The node's directory: `log/` (the Raft log) and `state/` (the map
    /// and snapshots).
    pub directory: PathBuf,
    /// Build a snapshot (and purge the log before it) after this many
    /// applied entries.
    pub snapshot_logs: u64,
    /// Entries kept in the log behind a snapshot, for slow followers.
    pub keep_logs: u64,
    /// Leader heartbeat interval in milliseconds. openraft 0.9 gives every
    /// AppendEntries RPC one interval to complete (transfer, the follower's
    /// fsync, the answer), so it must exceed the time to replicate the
    /// largest value ([`NodeConfig::max_value_bytes`] follows it);
    /// elections start after 4–8 intervals of silence.
    pub heartbeat_ms: u64,
    /// Size of the Raft log's WAL segments: entries move to archive files
    /// (and purged ones are deleted) one segment at a time.
    pub log_segment_bytes: u64,
    /// The file system the log and the state machine's store run on (the
    /// real disk by default; a simulated one in crash tests).
    pub file_system: Arc<dyn FileSystem>,
    /// Where snapshot files go, if not `directory/state/snapshots`. They
    /// are always on the real disk (openraft streams them from files),
    /// so a node on a simulated file system needs a real directory here.
    pub snapshot_directory: Option<PathBuf>,
    /// Serve HTTPS with this certificate and key, and reach peers over
    /// HTTPS; with a CA, verify peers with it and require client
    /// certificates it signed (see [`crate::security`]). `None`: plain
    /// HTTP.
    pub tls: Option<TlsFiles>,
    /// Require `Authorization: Bearer <token>` on every request, and send
    /// it on the RPCs to peers. `None`: no token (with mutual TLS, client
    /// certificates authenticate).
    pub token: Option<Token>,
    /// Start on a non-loopback `listen` address without TLS and
    /// authentication (refused otherwise; see
    /// [`NodeConfig::check_network_security`]).
    pub allow_insecure_network: bool,
    /// Connections the server keeps open at once; beyond it, the
    /// connection idle the longest is closed (see [`crate::server`]).
    pub max_connections: usize,
    /// Time a connection has to send a request's headers (and complete
    /// the TLS handshake).
    pub header_timeout: Duration,
    /// Time a request's whole body has to arrive (408 after it).
    pub body_timeout: Duration,
    /// Bytes of request bodies held in memory at once, across all
    /// connections (see [`crate::server`]): beyond it, bodies wait for
    /// room, and get a 503 if none comes within the body timeout.
    pub max_body_memory: usize,
    /// Time a connection may stay open with no request in progress.
    pub idle_timeout: Duration,
    /// Encrypt the node's files at rest with these keys: the Raft log's
    /// metadata and archives, snapshot files (see [`crate::encryption`]).
    /// A node directory is encrypted or not from its first start: a
    /// directory written without a key does not start with one, nor the
    /// other way round, and a wrong key is refused before anything is
    /// written. `None`: plain files.
    pub key_provider: Option<SharedKeys>,
}

impl NodeConfig {
    /// Defaults: a snapshot every 10,000 entries keeping 1,000, 500 ms
    /// heartbeats (room for 64 MiB values) and elections after 2–4 s of
    /// silence; plain HTTP without a token (so only a loopback `listen`
    /// starts); [`DEFAULT_MAX_CONNECTIONS`] connections, 10 s for headers,
    /// 60 s for a body and 60 s of idleness, and
    /// [`DEFAULT_MAX_BODY_MEMORY`] of request bodies at once.
    pub fn new(id: NodeId, listen: SocketAddr, directory: impl Into<PathBuf>) -> Self {
        Self {
            id,
            listen,
            directory: directory.into(),
            snapshot_logs: 10_000,
            keep_logs: 1_000,
            heartbeat_ms: 500,
            log_segment_bytes: 8 << 20,
            file_system: Arc::new(StdFileSystem),
            snapshot_directory: None,
            tls: None,
            token: None,
            allow_insecure_network: false,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(60),
            max_body_memory: DEFAULT_MAX_BODY_MEMORY,
            idle_timeout: Duration::from_secs(60),
            key_provider: None,
        }
    }

    /// The same with its files encrypted with the keys of `provider` (a
    /// [`StaticKey`](okaywal::encryption::StaticKey), a
    /// [`Keyring`](okaywal::encryption::Keyring) or a KMS of the
    /// application's).
    #[must_use]
    pub fn with_key_provider(mut self, provider: impl KeyProvider) -> Self {
        self.key_provider = Some(SharedKeys::new(provider));
        self
    }

    /// The same with TLS.
    #[must_use]
    pub fn with_tls(mut self, tls: TlsFiles) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The same with a bearer token.
    #[must_use]
    pub fn with_token(mut self, token: Token) -> Self {
        self.token = Some(token);
        self
    }

    /// Whether this node may start on its `listen` address: a loopback
    /// address always may; any other needs TLS and a token or mutual TLS,
    /// or `allow_insecure_network`, in which case this returns the warning
    /// to show. The error names the flags to add.
    pub fn check_network_security(&self) -> Result<Option<String>> {
        crate::security::check_listen(
            self.listen,
            self.tls.as_ref(),
            self.token.as_ref(),
            self.allow_insecure_network,
        )
    }

    /// The largest value a `PUT` accepts on this node: the format's
    /// [`MAX_VALUE_BYTES`](crate::types::MAX_VALUE_BYTES), or less with a
    /// short heartbeat. openraft 0.9 cancels an AppendEntries that takes
    /// longer than one heartbeat interval and sends the same entries again,
    /// so an entry that cannot cross in one interval stops replication for
    /// good. Measured on loopback (2 cores, ext4 on virtio): at 100 ms,
    /// four concurrent 15 MiB values replicated in 0.7 s and four of
    /// 32 MiB never did; at 500 ms, four of 64 MiB took 6 s. This allows
    /// 160 KiB per millisecond of heartbeat: 15.6 MiB at 100 ms, the full
    /// 64 MiB from 410 ms.
    #[must_use]
    pub fn max_value_bytes(&self) -> usize {
        let by_heartbeat = usize::try_from(self.heartbeat_ms)
            .unwrap_or(usize::MAX)
            .saturating_mul(160 << 10);
        by_heartbeat.min(crate::types::MAX_VALUE_BYTES)
    }

    /// How long a write waits for a quorum before the client is told it
    /// was not committed in time (503): 60 heartbeat intervals, 30 s at
    /// the default 500 ms. That is several elections' worth (a new leader
    /// is chosen after 4–8 intervals without one), so a write caught by a
    /// leader change still completes, while a write that no majority can
    /// commit does not hang its client for as long as the outage lasts.
    #[must_use]
    pub fn write_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.heartbeat_ms.saturating_mul(60))
    }

    fn raft_config(&self) -> Result<openraft::Config> {
        if self.heartbeat_ms == 0 {
            return Err(Error::Config(
                "the heartbeat interval must be at least 1 ms".into(),
            ));
        }
        let config = openraft::Config {
            cluster_name: "sediment-raft".into(),
            heartbeat_interval: self.heartbeat_ms,
            election_timeout_min: self.heartbeat_ms * 4,
            election_timeout_max: self.heartbeat_ms * 8,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(self.snapshot_logs),
            max_in_snapshot_log_to_keep: self.keep_logs,
            purge_batch_size: 64,
            // Each InstallSnapshot body is one chunk (see `crate::limits`).
            snapshot_max_chunk_size: crate::limits::SNAPSHOT_CHUNK_BYTES as u64,
            ..Default::default()
        };
        config
            .validate()
            .map_err(|e| Error::Raft(format!("invalid configuration: {e}")))
    }
}

/// Logs elections, leader changes and membership changes as this node's
/// Raft reports them, until it shuts down.
async fn log_changes(raft: Arc<Raft>) {
    let mut watch = raft.metrics();
    let (mut state, mut term, mut leader, mut membership) = {
        let m = watch.borrow();
        (
            m.state,
            m.current_term,
            m.current_leader,
            m.membership_config.clone(),
        )
    };
    while watch.changed().await.is_ok() {
        let m = watch.borrow().clone();
        if m.current_term != term {
            tracing::info!(term = m.current_term, previous = term, "new term");
        }
        if m.state != state {
            tracing::info!(state = ?m.state, term = m.current_term, "server state changed");
        }
        if m.current_leader != leader {
            match m.current_leader {
                Some(id) => tracing::info!(leader = id, term = m.current_term, "leader elected"),
                None => tracing::info!(term = m.current_term, "no leader known"),
            }
        }
        if m.membership_config != membership {
            let config = m.membership_config.membership();
            let voters: Vec<NodeId> = config.voter_ids().collect();
            let learners: Vec<NodeId> = config.learner_ids().collect();
            tracing::info!(
                ?voters,
                ?learners,
                log_index = m.membership_config.log_id().map(|id| id.index),
                "membership changed"
            );
        }
        (state, term, leader, membership) = (
            m.state,
            m.current_term,
            m.current_leader,
            m.membership_config.clone(),
        );
    }
}

/// A started node.
pub struct RunningNode {
    /// The node's Raft.
    pub raft: Arc<Raft>,
    /// Its log store.
    pub log_store: LogStore,
    /// Its state machine.
    pub state_machine: StateMachine,
    /// The address it serves on.
    pub addr: SocketAddr,
    server: JoinHandle<std::io::Result<()>>,
    stop: oneshot::Sender<()>,
}

impl std::fmt::Debug for RunningNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningNode")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// Checks the configuration's security ([`NodeConfig::check_network_security`]
/// and the TLS and token files) and the node directory's key check
/// ([`check_node_directory`]), opens the node's stores (recovering them),
/// starts Raft and serves HTTP or HTTPS.
pub async fn start(config: NodeConfig) -> Result<RunningNode> {
    config.check_network_security()?;
    if config.max_connections == 0 {
        return Err(Error::Config("max_connections must be at least 1".into()));
    }
    let tls = config.tls.as_ref().map(TlsFiles::load).transpose()?;
    let network = Network::secured(
        tls.as_ref().map(|tls| tls.client.clone()),
        config.token.as_ref(),
    )?;
    let raft_config = Arc::new(config.raft_config()?);
    let mut log_config = LogStoreConfig::new(config.directory.join("log"))
        .node_id(config.id)
        .segment_bytes(config.log_segment_bytes)
        .file_system(config.file_system.clone());
    log_config.encryption = config.key_provider.clone();
    let mut sm_config = StateMachineConfig::new(config.directory.join("state"))
        .file_system(config.file_system.clone());
    sm_config.encryption = config.key_provider.clone();
    if let Some(dir) = &config.snapshot_directory {
        sm_config.snapshot_directory = dir.clone();
    }
    let (fs, directory, keys) = (
        config.file_system.clone(),
        config.directory.clone(),
        config.key_provider.clone(),
    );
    // The address first: a node that cannot listen (its port taken) must
    // not have created or changed anything in its directory.
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| Error::io(format!("listening on {}", config.listen), e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::io("reading the listening address", e))?;
    let id = config.id;
    let (log_store, state_machine, identity) = tokio::task::spawn_blocking(move || {
        // Before anything is opened: a wrong key must not change a byte.
        check_node_directory(&*fs, &directory, keys.as_ref())?;
        check_log_present(&*fs, &directory)?;
        // Nor may a directory of another node.
        let identity = Identity::load(fs, &directory, keys.clone(), id)?;
        let log_store = LogStore::open_with(log_config)?;
        let state_machine = StateMachine::open_with(sm_config)?;
        if keys.is_some() {
            check_snapshot_covers_purged(&log_store, &state_machine)?;
        }
        check_log_not_lost(&log_store, &state_machine)?;
        Ok::<_, Error>((log_store, state_machine, Arc::new(identity)))
    })
    .await
    .map_err(|e| Error::Raft(e.to_string()))??;
    let network = network.with_identity(identity.clone());
    let stage_network = network.clone();
    let peers = network.clone();
    let raft = Raft::new(
        config.id,
        raft_config,
        network,
        log_store.clone(),
        state_machine.clone(),
    )
    .await
    .map_err(|e| Error::Raft(e.to_string()))?;
    warn_if_known_elsewhere(&raft, config.id, addr).await;
    peers.watch_metrics(raft.metrics());
    let raft = Arc::new(raft);
    // From now on the log store offers what it appends while this node
    // leads to the followers (see `crate::stage`).
    log_store.set_stage_offer(Arc::new(Stager::new(
        config.id,
        &stage_network,
        raft.metrics(),
        log_store.stage_counters(),
    )));
    let counters = Arc::new(Counters::default());
    let app = App {
        id: config.id,
        raft: raft.clone(),
        state_machine: state_machine.clone(),
        writes: WriteBatcher::start(raft.clone()),
        max_value_bytes: config.max_value_bytes(),
        write_timeout: config.write_timeout(),
        log_store: log_store.clone(),
        counters: counters.clone(),
        scheme: if tls.is_some() { "https" } else { "http" },
        identity: identity.clone(),
        peers,
        init_lock: Arc::default(),
        membership_lock: Arc::default(),
    };
    let policy = Arc::new(Policy {
        token: config.token.clone(),
        max_value_bytes: config.max_value_bytes(),
        body_timeout: config.body_timeout,
        body_budget: server::BodyBudget::new(config.max_body_memory),
    });
    // Counting is outermost, so requests refused for their credentials or
    // size are counted too.
    let router = api::routes(app)
        .merge(network::routes(raft.clone(), identity))
        .merge(stage::routes(log_store.clone(), config.id))
        .layer(axum::middleware::from_fn_with_state(policy, server::police))
        .layer(axum::middleware::from_fn_with_state(counters, api::record));
    tokio::spawn(log_changes(raft.clone()));
    let options = ServerOptions {
        tls: tls.map(|tls| tls.server),
        max_connections: config.max_connections,
        header_timeout: config.header_timeout,
        idle_timeout: config.idle_timeout,
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(server::serve(listener, router, options, stopped));
    Ok(RunningNode {
        raft,
        log_store,
        state_machine,
        addr,
        server,
        stop,
    })
}

/// Logs a warning if the membership the node stored knows it at an
/// address other than `listening` ([`address_warning`]). The Raft core's
/// first metrics report holds what it loaded from the node's directory;
/// a node that stored no membership yet is not checked.
async fn warn_if_known_elsewhere(raft: &Raft, id: NodeId, listening: SocketAddr) {
    let mut metrics = raft.metrics();
    if tokio::time::timeout(Duration::from_secs(5), metrics.changed())
        .await
        .is_err()
    {
        return;
    }
    let known = metrics
        .borrow()
        .membership_config
        .membership()
        .get_node(&id)
        .map(|node| node.addr.clone());
    if let Some(warning) = known.and_then(|known| address_warning(id, &known, listening)) {
        tracing::warn!("{warning}");
    }
}

/// The warning for node `id`, which the cluster's membership knows at
/// `known` (`host:port`), when that is not where it listens: peers and
/// clients redirected to it would reach `known`, not this process. Only a
/// warning, since a port mapping or NAT can make both right. When the node
/// listens on an unspecified address (`0.0.0.0`, `::`), or the membership
/// names a host rather than an IP address, only the ports are compared.
#[must_use]
pub fn address_warning(id: NodeId, known: &str, listening: SocketAddr) -> Option<String> {
    let (host, port) = known.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let ip = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<std::net::IpAddr>()
        .ok();
    let same_ip = listening.ip().is_unspecified() || ip.map_or(true, |ip| ip == listening.ip());
    if port == listening.port() && same_ip {
        return None;
    }
    Some(format!(
        "the cluster knows node {id} as {known} but it listens on {listening}: peers and \
         redirected clients go to {known}"
    ))
}

/// A node directory with `state/` but no `log/`: the log was deleted
/// (the state machine alone cannot restart a Raft node: openraft would
/// stop at its first vote check, on every start).
fn check_log_present(fs: &dyn FileSystem, directory: &Path) -> Result<()> {
    let exists = |name: &str| {
        fs.exists(&directory.join(name))
            .map_err(|e| Error::io(format!("looking for {}", directory.join(name).display()), e))
    };
    if exists("state")? && !exists("log")? {
        return Err(Error::Corrupt {
            what: directory.join("log").display().to_string(),
            detail: "it is missing beside state/: log/ was deleted or replaced; put it back, \
                     or start the node on an empty directory and add it to its cluster again"
                .into(),
        });
    }
    Ok(())
}

/// A state machine that has applied entries beside a log that holds
/// none, not even a purged one, and no vote: the log directory was
/// deleted or replaced (openraft would stop at its first vote check).
fn check_log_not_lost(log: &LogStore, state_machine: &StateMachine) -> Result<()> {
    let (applied, _) = state_machine.applied();
    let Some(applied) = applied else {
        return Ok(());
    };
    if log.log_state().last_log_id.is_some() || log.vote().is_some() {
        return Ok(());
    }
    Err(Error::Corrupt {
        what: "the node directory's log/".into(),
        detail: format!(
            "it holds no entry and no vote, but state/ has applied the log up to index {}: \
             log/ was deleted or replaced; put it back, or start the node on an empty \
             directory and add it to its cluster again",
            applied.index
        ),
    })
}

/// The log is purged only up to a snapshot's last entry, after the
/// snapshot file is in place: a snapshot older than the purge (an older
/// file put back under the current one's name is refused by the state
/// machine; this finds an older one under its own name, with the current
/// one deleted) or none at all means the snapshot directory is not the
/// node's.
fn check_snapshot_covers_purged(log: &LogStore, state_machine: &StateMachine) -> Result<()> {
    let Some(purged) = log.log_state().last_purged_log_id else {
        return Ok(());
    };
    match state_machine.current_snapshot() {
        Some((meta, _)) if meta.last_log_id >= Some(purged) => Ok(()),
        Some((meta, path)) => Err(Error::Corrupt {
            what: format!("snapshot {}", path.display()),
            detail: format!(
                "ends at {:?}, before the log's entries purged through {purged}: it is older \
                 than the node's current snapshot",
                meta.last_log_id.map(|id| id.index)
            ),
        }),
        None => Err(Error::Corrupt {
            what: "the snapshot directory".into(),
            detail: format!(
                "holds no snapshot, but the log's entries were purged through {purged}"
            ),
        }),
    }
}

/// Waits until the Raft core stops (shut down, or failed), and says why.
async fn core_stopped(raft: &Raft) -> String {
    let mut metrics = raft.metrics();
    loop {
        {
            let m = metrics.borrow_and_update();
            if let Err(fatal) = &m.running_state {
                return fatal.to_string();
            }
            if m.state == ServerState::Shutdown {
                return "it shut down".into();
            }
        }
        if metrics.changed().await.is_err() {
            return "its metrics ended".into();
        }
    }
}

impl RunningNode {
    /// Serves until Ctrl-C or SIGTERM, then shuts down cleanly and returns
    /// `Ok`. If the Raft core stops first (a fatal storage error, say), the
    /// node cannot serve anything any more: this then shuts the rest down
    /// and returns the error, so that a supervisor can restart it.
    pub async fn wait(self) -> Result<()> {
        let terminate = async {
            #[cfg(unix)]
            {
                if let Ok(mut term) =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                {
                    term.recv().await;
                    return;
                }
            }
            std::future::pending::<()>().await;
        };
        let raft = self.raft.clone();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            () = terminate => {}
            reason = core_stopped(&raft) => {
                let _ = self.shutdown().await;
                return Err(Error::Raft(format!("the Raft core stopped: {reason}")));
            }
        }
        self.shutdown().await
    }

    /// Stops Raft and the server and closes the stores.
    pub async fn shutdown(self) -> Result<()> {
        let _ = self.stop.send(());
        self.raft
            .shutdown()
            .await
            .map_err(|e| Error::Raft(e.to_string()))?;
        let _ = self.server.await;
        let (log, sm) = (self.log_store, self.state_machine);
        drop(self.raft);
        tokio::task::spawn_blocking(move || {
            log.shutdown()?;
            sm.shutdown()
        })
        .await
        .map_err(|e| Error::Raft(e.to_string()))?
    }
}

#[cfg(test)]
mod tests {
    use super::address_warning;

    fn warning(known: &str, listening: &str) -> Option<String> {
        address_warning(3, known, listening.parse().unwrap())
    }

    #[test]
    fn a_node_known_at_another_address_is_warned_about() {
        assert_eq!(
            warning("127.0.0.1:19803", "127.0.0.1:19813").as_deref(),
            Some(
                "the cluster knows node 3 as 127.0.0.1:19803 but it listens on \
                 127.0.0.1:19813: peers and redirected clients go to 127.0.0.1:19803"
            )
        );
        assert!(warning("10.0.0.3:21003", "10.0.0.4:21003").is_some());
        assert!(warning("[::1]:21003", "[::1]:21004").is_some());
        // Only the port can be compared.
        assert!(warning("0.0.0.0:21003", "0.0.0.0:21004").is_some());
        assert!(warning("node-3.example:21003", "10.0.0.3:21004").is_some());
    }

    #[test]
    fn a_node_known_where_it_listens_is_not_warned_about() {
        assert_eq!(warning("127.0.0.1:19803", "127.0.0.1:19803"), None);
        assert_eq!(warning("[::1]:21003", "[::1]:21003"), None);
        // An unspecified listen address: the port decides.
        assert_eq!(warning("10.0.0.3:21003", "0.0.0.0:21003"), None);
        assert_eq!(warning("[2001:db8::3]:21003", "[::]:21003"), None);
        // A host name: the port decides.
        assert_eq!(warning("node-3.example:21003", "10.0.0.3:21003"), None);
    }
}
