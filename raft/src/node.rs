//! One node: its stores, its Raft and its HTTP server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use okaywal::fs::{FileSystem, StdFileSystem};
use openraft::SnapshotPolicy;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::api::{self, App};
use crate::batch::WriteBatcher;
use crate::error::{Error, Result};
use crate::log_store::{LogStore, LogStoreConfig};
use crate::metrics::Counters;
use crate::network::{self, Network};
use crate::state_machine::{StateMachine, StateMachineConfig};
use crate::types::{NodeId, Raft};

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
    /// are always on the real disk (openraft streams them as tokio files),
    /// so a node on a simulated file system needs a real directory here.
    pub snapshot_directory: Option<PathBuf>,
}

impl NodeConfig {
    /// Defaults: a snapshot every 10,000 entries keeping 1,000, 500 ms
    /// heartbeats (room for 64 MiB values) and elections after 2–4 s of
    /// silence.
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
        }
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
        let config = openraft::Config {
            cluster_name: "sediment-raft".into(),
            heartbeat_interval: self.heartbeat_ms,
            election_timeout_min: self.heartbeat_ms * 4,
            election_timeout_max: self.heartbeat_ms * 8,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(self.snapshot_logs),
            max_in_snapshot_log_to_keep: self.keep_logs,
            purge_batch_size: 64,
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

/// Opens the node's stores (recovering them), starts Raft and serves HTTP.
pub async fn start(config: NodeConfig) -> Result<RunningNode> {
    let raft_config = Arc::new(config.raft_config()?);
    let log_config = LogStoreConfig::new(config.directory.join("log"))
        .segment_bytes(config.log_segment_bytes)
        .file_system(config.file_system.clone());
    let mut sm_config = StateMachineConfig::new(config.directory.join("state"))
        .file_system(config.file_system.clone());
    if let Some(dir) = &config.snapshot_directory {
        sm_config.snapshot_directory = dir.clone();
    }
    let (log_store, state_machine) = tokio::task::spawn_blocking(move || {
        Ok::<_, Error>((
            LogStore::open_with(log_config)?,
            StateMachine::open_with(sm_config)?,
        ))
    })
    .await
    .map_err(|e| Error::Raft(e.to_string()))??;
    let raft = Raft::new(
        config.id,
        raft_config,
        Network::new(),
        log_store.clone(),
        state_machine.clone(),
    )
    .await
    .map_err(|e| Error::Raft(e.to_string()))?;
    let raft = Arc::new(raft);
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
    };
    let router = api::routes(app)
        .merge(network::routes(raft.clone()))
        .layer(axum::middleware::from_fn_with_state(counters, api::record));
    tokio::spawn(log_changes(raft.clone()));
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| Error::io(format!("listening on {}", config.listen), e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::io("reading the listening address", e))?;
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
    });
    Ok(RunningNode {
        raft,
        log_store,
        state_machine,
        addr,
        server,
        stop,
    })
}

impl RunningNode {
    /// Serves until Ctrl-C or SIGTERM, then shuts down cleanly.
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
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            () = terminate => {}
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
