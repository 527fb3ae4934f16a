//! The `sediment-raft` command: runs one node of the replicated store.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use okaywal::encryption::StaticKey;
use sediment_raft::encryption::SharedKeys;
use sediment_raft::node::{self, NodeConfig, DEFAULT_MAX_BODY_MEMORY, DEFAULT_MAX_CONNECTIONS};
use sediment_raft::security::{TlsFiles, Token};

/// Descriptors kept for the node's own files (WAL segments, archives,
/// snapshots), its connections to peers and the runtime, beyond its
/// server's connections.
const RESERVED_DESCRIPTORS: u64 = 256;

/// A replicated key-value store on okaywal and sediment.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// What to log to stderr: a level (`error`, `warn`, `info`, `debug`,
    /// `trace`) or `RUST_LOG`-style directives (`info,openraft=debug`).
    /// Without it, `RUST_LOG` is used, else `info`.
    #[arg(long, global = true)]
    log_level: Option<String>,
    #[command(subcommand)]
    command: Command,
}

/// The levels `--log-level` takes on their own.
const LEVELS: [&str; 6] = ["error", "warn", "info", "debug", "trace", "off"];

/// Checks `--log-level`'s directives before `tracing` reads them: a bare
/// word that is no level names a target, whose events alone are then
/// logged, so one that cannot be a target (`bogus!!`) is refused, and one
/// that can (`infoo`) is taken with a warning, which is returned.
fn check_log_level(directives: &str) -> Result<Option<String>, String> {
    let mut warning = None;
    for part in directives.split(',').map(str::trim) {
        if part.is_empty() || part.contains(['=', '[']) {
            continue;
        }
        if LEVELS.iter().any(|level| part.eq_ignore_ascii_case(level)) {
            continue;
        }
        let target = part
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ':' | '-'));
        if !target {
            return Err(format!(
                "--log-level {directives:?}: {part:?} is neither a level ({}) nor a \
                 target (a module path such as sediment_raft or openraft)",
                LEVELS.join(", ")
            ));
        }
        warning = Some(format!(
            "--log-level {directives:?}: {part:?} is no level ({}); it is taken as a \
             target, and only its events are logged",
            LEVELS.join(", ")
        ));
    }
    Ok(warning)
}

/// Sends `tracing` events (the node's and openraft's) to stderr.
fn init_logging(level: Option<&str>) -> Result<(), String> {
    use tracing_subscriber::EnvFilter;
    let filter = match level {
        Some(directives) => {
            if let Some(warning) = check_log_level(directives)? {
                eprintln!("sediment-raft: warning: {warning}");
            }
            EnvFilter::try_new(directives)
                .map_err(|e| format!("--log-level {directives:?}: {e}"))?
        }
        None => match std::env::var("RUST_LOG") {
            Ok(directives) if !directives.is_empty() => EnvFilter::try_new(&directives)
                .map_err(|e| format!("RUST_LOG={directives:?}: {e}"))?,
            _ => EnvFilter::new("info"),
        },
    };
    // openraft logs every failed RPC to a peer several times over; the
    // node logs those failures itself, at most once per peer every few
    // seconds (`sediment_raft::network::FailureLog`).
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    tracing_subscriber::registry()
        .with(filter)
        .with(sediment_raft::network::RpcFailureFilter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(false),
        )
        .init();
    Ok(())
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs one node in the foreground until Ctrl-C or SIGTERM.
    Node {
        /// The node's id in the cluster.
        #[arg(long)]
        id: u64,
        /// The address to serve peers and clients on: an IP address and a
        /// port (`127.0.0.1:21001`; names such as `localhost` are not
        /// resolved).
        #[arg(long)]
        listen: SocketAddr,
        /// The node's data directory (created if missing, recovered if not).
        #[arg(long)]
        dir: PathBuf,
        /// Build a snapshot and purge the log after this many entries.
        #[arg(long, default_value_t = 10_000)]
        snapshot_logs: u64,
        /// Entries kept in the log behind a snapshot.
        #[arg(long, default_value_t = 1_000)]
        keep_logs: u64,
        /// Leader heartbeat interval in ms (elections after 4–8 of them of
        /// silence). Each AppendEntries must finish within one, so values
        /// are limited to 160 KiB per ms of it (64 MiB from 410 ms).
        #[arg(long, default_value_t = 500)]
        heartbeat_ms: u64,
        /// Size of the Raft log's WAL segments, in bytes.
        #[arg(long, default_value_t = 8 << 20)]
        log_segment_bytes: u64,
        /// Serve HTTPS with this certificate chain (PEM), and reach peers
        /// over HTTPS presenting it. Needs --tls-key.
        #[arg(long, requires = "tls_key")]
        tls_cert: Option<PathBuf>,
        /// The private key of --tls-cert (PEM).
        #[arg(long, requires = "tls_cert")]
        tls_key: Option<PathBuf>,
        /// The CA (PEM) that signed the cluster's certificates: peers are
        /// verified with it, and every client must present a certificate
        /// it signed (mutual TLS). Without it, peers are verified with the
        /// system's roots and clients need no certificate.
        #[arg(long, requires = "tls_cert")]
        tls_ca: Option<PathBuf>,
        /// A file holding a shared secret (a trailing newline is dropped):
        /// every request must carry `Authorization: Bearer <secret>`, and
        /// the node sends it to its peers.
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// Start on a non-loopback --listen address without TLS and a
        /// token or mutual TLS (refused otherwise).
        #[arg(long)]
        allow_insecure_network: bool,
        /// Connections served at once; beyond it the connection idle the
        /// longest is closed. The node raises its open-file soft limit to
        /// the hard limit at start, and lowers this (with a warning) if
        /// that leaves fewer than 256 descriptors besides.
        #[arg(long, default_value_t = DEFAULT_MAX_CONNECTIONS)]
        max_connections: usize,
        /// Time a connection has to complete its TLS handshake and send a
        /// request's headers, in ms.
        #[arg(long, default_value_t = 10_000)]
        header_timeout_ms: u64,
        /// Time a request's whole body has to arrive, in ms (408 after it).
        #[arg(long, default_value_t = 60_000)]
        body_timeout_ms: u64,
        /// Time a connection may stay open with no request in progress, in
        /// ms.
        #[arg(long, default_value_t = 60_000)]
        idle_timeout_ms: u64,
        /// Request bodies held in memory at once, across all connections,
        /// in MiB: beyond it, bodies wait for room (503 if none comes
        /// within --body-timeout-ms).
        #[arg(long, default_value_t = u64::try_from(DEFAULT_MAX_BODY_MEMORY >> 20).unwrap_or(256), value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
        max_body_memory_mb: u64,
        /// Encrypt the node's files at rest with the key in this file (32
        /// raw bytes, or 64 hexadecimal characters), as key id 1. A node
        /// directory is encrypted from its first start or never: a
        /// directory written without a key does not start with one, nor
        /// the other way round, and a wrong key is refused (naming the key
        /// id) before anything is written.
        #[arg(long, value_name = "PATH")]
        key_file: Option<PathBuf>,
        /// Threads that run the node's event loop (its Raft core, server,
        /// peer connections and small log writes). With 1, the default,
        /// they all run on one thread and hand work to each other without
        /// waking another; more spreads them over that many threads, for
        /// a machine with cores to spare. Syncs, large writes, snapshots
        /// and reads run on threads of their own either way.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
        worker_threads: u16,
    },
}

/// Raises the open-file soft limit to the hard limit (a node holds a
/// descriptor per connection and per log file) and returns the limit in
/// force; `None` where it cannot be read.
fn raise_descriptor_limit() -> Option<u64> {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => Some(limit),
        Err(e) => {
            eprintln!("sediment-raft: could not raise the open-file limit: {e}");
            rlimit::getrlimit(rlimit::Resource::NOFILE)
                .ok()
                .map(|(soft, _)| soft)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = init_logging(cli.log_level.as_deref()) {
        eprintln!("sediment-raft: {e}");
        return ExitCode::FAILURE;
    }
    let Command::Node {
        id,
        listen,
        dir,
        snapshot_logs,
        keep_logs,
        heartbeat_ms,
        log_segment_bytes,
        tls_cert,
        tls_key,
        tls_ca,
        token_file,
        allow_insecure_network,
        mut max_connections,
        header_timeout_ms,
        body_timeout_ms,
        idle_timeout_ms,
        max_body_memory_mb,
        key_file,
        worker_threads,
    } = cli.command;
    let tls = match (tls_cert, tls_key) {
        (Some(cert), Some(key)) => Some(TlsFiles {
            cert,
            key,
            ca: tls_ca,
        }),
        _ => None,
    };
    let token = match token_file.as_deref().map(Token::from_file).transpose() {
        Ok(token) => token,
        Err(e) => {
            eprintln!("sediment-raft: {e}");
            return ExitCode::FAILURE;
        }
    };
    let key_provider = match key_file.as_deref().map(StaticKey::from_file).transpose() {
        Ok(key) => key.map(SharedKeys::new),
        Err(e) => {
            eprintln!("sediment-raft: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(limit) = raise_descriptor_limit() {
        let room =
            usize::try_from(limit.saturating_sub(RESERVED_DESCRIPTORS)).unwrap_or(usize::MAX);
        if max_connections > room {
            eprintln!(
                "sediment-raft: the open-file limit is {limit}: serving at most {} connections \
                 instead of {max_connections}",
                room.max(1)
            );
            max_connections = room.max(1);
        }
    }
    let config = NodeConfig {
        snapshot_logs,
        keep_logs,
        heartbeat_ms,
        log_segment_bytes,
        tls,
        token,
        allow_insecure_network,
        max_connections,
        header_timeout: Duration::from_millis(header_timeout_ms),
        body_timeout: Duration::from_millis(body_timeout_ms),
        idle_timeout: Duration::from_millis(idle_timeout_ms),
        max_body_memory: usize::try_from(max_body_memory_mb << 20).unwrap_or(usize::MAX),
        key_provider,
        ..NodeConfig::new(id, listen, dir)
    };
    match config.check_network_security() {
        Ok(Some(warning)) => eprintln!("sediment-raft: {warning}"),
        Ok(None) => {}
        Err(e) => {
            eprintln!("sediment-raft: {e}");
            return ExitCode::FAILURE;
        }
    }
    let scheme = if config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let mut builder = if worker_threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(usize::from(worker_threads));
        builder
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("sediment-raft: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        let running = node::start(config).await?;
        eprintln!("node {id} serving on {scheme}://{}", running.addr);
        tracing::info!(id, addr = %running.addr, "node started");
        running.wait().await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sediment-raft: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::check_log_level;

    #[test]
    fn levels_and_directives_are_taken_as_they_are() {
        for directives in [
            "info",
            "WARN",
            "off",
            "info,openraft=debug",
            "sediment_raft=trace",
        ] {
            assert_eq!(check_log_level(directives), Ok(None), "{directives}");
        }
    }

    #[test]
    fn a_word_that_cannot_be_a_target_is_refused() {
        let err = check_log_level("bogus!!").unwrap_err();
        assert!(err.contains("neither a level"), "{err}");
        assert!(check_log_level("info,bo gus").is_err());
    }

    #[test]
    fn a_word_that_is_no_level_is_taken_as_a_target_with_a_warning() {
        let warning = check_log_level("infoo").unwrap().expect("a warning");
        assert!(warning.contains("taken as a target"), "{warning}");
        assert!(check_log_level("openraft").unwrap().is_some());
    }
}
