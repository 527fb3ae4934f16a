//! The `sediment-raft` command: runs one node of the replicated store.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use sediment_raft::node::{self, NodeConfig};

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

/// Sends `tracing` events (the node's and openraft's) to stderr.
fn init_logging(level: Option<&str>) -> Result<(), String> {
    use tracing_subscriber::EnvFilter;
    let filter = match level {
        Some(directives) => EnvFilter::try_new(directives)
            .map_err(|e| format!("--log-level {directives:?}: {e}"))?,
        None => match std::env::var("RUST_LOG") {
            Ok(directives) if !directives.is_empty() => EnvFilter::try_new(&directives)
                .map_err(|e| format!("RUST_LOG={directives:?}: {e}"))?,
            _ => EnvFilter::new("info"),
        },
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
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
        /// The address to serve peers and clients on (`host:port`).
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
    },
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
    } = cli.command;
    let config = NodeConfig {
        snapshot_logs,
        keep_logs,
        heartbeat_ms,
        log_segment_bytes,
        ..NodeConfig::new(id, listen, dir)
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("sediment-raft: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        let running = node::start(config).await?;
        eprintln!("node {id} serving on http://{}", running.addr);
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
