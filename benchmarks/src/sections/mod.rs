//! The sections of `compare`: each runs its systems interleaved per
//! configuration, prints markdown tables to stdout, progress to stderr,
//! and writes CSV files and SVG charts into [`Options::out_dir`].

pub mod blob;
pub mod scale;
pub mod wal;

use std::path::PathBuf;

use crate::peers;

/// What the command line asked for.
#[derive(Debug, Clone)]
pub struct Options {
    /// Short runs and scaled-down counts (the whole run in under 3 minutes).
    pub quick: bool,
    /// Only these systems (by name), if given.
    pub systems: Option<Vec<String>>,
    /// WAL payload sizes, if not the default 256 B, 4 KiB, 1 MiB.
    pub payloads: Option<Vec<usize>>,
    /// WAL thread counts, if not the default 1, 4, 16; in the raft
    /// section, the client counts, if not the default 1, 16, 64.
    pub threads: Option<Vec<usize>>,
    /// The raft section's cluster sizes, if not the default 3 and 1.
    pub nodes: Option<Vec<usize>>,
    /// Measured seconds per timed cell and round, if not the default.
    pub seconds: Option<f64>,
    /// Rounds of every timed cell (merged), if not the default: 1 with
    /// `--quick`, else 2.
    pub rounds: Option<usize>,
    /// Transactions of the blob section's (a), over all rounds, if not the
    /// default.
    pub transactions: Option<u64>,
    /// Blobs of the blob section's (c) and (d), if not the default.
    pub blobs: Option<u64>,
    /// Bytes loaded by the scale section, if not the default 4 GiB.
    pub scale_bytes: Option<u64>,
    /// Where CSV files and charts go.
    pub out_dir: PathBuf,
}

impl Options {
    /// The defaults: the full run, every system, output in
    /// `target/benchmarks/`.
    #[must_use]
    pub fn new() -> Self {
        Self {
            quick: false,
            systems: None,
            payloads: None,
            threads: None,
            nodes: None,
            seconds: None,
            rounds: None,
            transactions: None,
            blobs: None,
            scale_bytes: None,
            out_dir: crate::output_dir(),
        }
    }

    /// Rounds of every timed cell.
    #[must_use]
    pub fn rounds(&self) -> usize {
        self.rounds.unwrap_or(if self.quick { 1 } else { 2 }).max(1)
    }

    pub(crate) fn wanted(&self, system: &str) -> bool {
        self.systems
            .as_ref()
            .map_or(true, |list| list.iter().any(|s| s == system))
    }
}

impl Default for Options {
    fn default() -> Self {
        Self::new()
    }
}

/// The systems of `all` to run, and notes for those that cannot run (not
/// compiled in, or PostgreSQL without a server). Systems left out by
/// `--systems` are left out silently.
#[must_use]
pub fn select(all: &[&'static str], options: &Options) -> (Vec<&'static str>, Vec<String>) {
    let mut run = Vec::new();
    let mut notes = Vec::new();
    for &system in all {
        if !options.wanted(system) {
            continue;
        }
        if !peers::compiled_in(system) {
            notes.push(format!(
                "{system} skipped: {}",
                peers::not_available(system)
            ));
            continue;
        }
        if system == "postgresql" {
            match postgres_server_info() {
                Ok(version) => notes.push(format!("postgresql: {version}")),
                Err(why) => {
                    eprintln!("PostgreSQL skipped: {why}");
                    notes.push(format!("PostgreSQL skipped: {why}"));
                    continue;
                }
            }
        }
        run.push(system);
    }
    (run, notes)
}

#[cfg(feature = "postgres")]
fn postgres_server_info() -> Result<String, String> {
    peers::postgres::server_info()
}

#[cfg(not(feature = "postgres"))]
fn postgres_server_info() -> Result<String, String> {
    Err(peers::not_available("postgresql"))
}

/// The raft section's systems, by name.
pub const RAFT_SYSTEMS: [&str; 2] = ["sediment-raft", "etcd"];

/// Every system name `--systems` accepts.
#[must_use]
pub fn known_systems() -> Vec<&'static str> {
    let mut all: Vec<&'static str> = crate::wal::ALL.to_vec();
    for system in crate::blob::ALL.iter().chain(crate::blob::COMMIT_VARIANTS) {
        if !all.contains(system) {
            all.push(system);
        }
    }
    all.extend(RAFT_SYSTEMS);
    all
}

/// A file name for a chart or CSV file in the output directory.
pub(crate) fn output(options: &Options, name: &str) -> PathBuf {
    let _ = std::fs::create_dir_all(&options.out_dir);
    options.out_dir.join(name)
}

/// Writes a file and notes where (or why not) on stderr.
pub(crate) fn saved(what: std::io::Result<()>, path: &std::path::Path, files: &mut Vec<PathBuf>) {
    match what {
        Ok(()) => files.push(path.to_path_buf()),
        Err(err) => eprintln!("could not write {}: {err}", path.display()),
    }
}
