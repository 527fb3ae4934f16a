//! `sediment`: store, read, archive and inspect blobs in a
//! [`sediment`] store, and dump the okaywal segments under it.
//!
//! ```text
//! sediment put DB FILE...            store files (or `-` for stdin) as blobs
//! sediment get DB GRAIN [-o FILE]    write a blob to stdout or a file
//! sediment ls DB                     list the live blobs: id, length, sequence
//! sediment archive DB GRAIN...       archive blobs
//! sediment checkpoint DB SEQUENCE    free grains archived up to SEQUENCE
//! sediment log DB [--since SEQ]      the commit log (`--json` for scripts)
//! sediment stats DB                  space per basin, WAL files
//! sediment verify DB [--progress]    check every header and checksum
//! sediment repair DB                 open for writing once: repair headers
//! sediment wal-dump DIR              read-only dump of an okaywal directory
//! ```
//!
//! Every subcommand takes `--key-file PATH` for an encrypted store or WAL
//! (see [`keys`]).
//!
//! Exit codes: 0 success, 1 `verify` found problems, 2 bad input (usage,
//! missing directory, not a store, malformed or free grain id, sequence in
//! the future, `get -o` into the store directory), 3 other failures
//! (damaged files, I/O errors). Errors are one line on stderr,
//! `sediment: <message>`. `put`, `archive` and `checkpoint` exit 0 once
//! their transaction committed, even if closing the store afterwards fails
//! (a warning on stderr says so).
#![forbid(unsafe_code)]

mod blobs;
mod error;
mod headers;
mod inspect;
mod keys;
mod ls;
mod progress;
mod recovery;
mod store;
mod wal;
mod wal_dump;

use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

use crate::error::{one_line, say, CliError};

const EXIT_CODES: &str = "\
Exit codes: 0 success; 1 verify found problems; 2 bad input (usage, missing
directory, not a store, malformed or free grain id, sequence in the future,
`get -o` into the store directory); 3 other failures (damaged files, I/O
errors). Once put, archive or checkpoint committed, they exit 0 even if
closing the store or printing their output fails afterwards (with a
warning on stderr that says what they did).

Grain ids are written basin-stratum-index-count (e.g. 3-0-17-20); a raw u64
in decimal or 0x hex is accepted too.";

/// Command-line access to sediment blob stores and okaywal logs.
#[derive(Debug, Parser)]
#[command(name = "sediment", version, after_help = EXIT_CODES)]
struct Cli {
    /// The key of an encrypted store or WAL: a file holding the 32-byte
    /// key, as 32 raw bytes or 64 hexadecimal characters (key id 1).
    /// `put` into a new store creates it encrypted. A wrong or missing key
    /// is an error naming the key id the files want (exit code 2).
    #[arg(long, global = true, value_name = "PATH")]
    key_file: Option<PathBuf>,
    /// What opening does with damage in the middle of the write-ahead log:
    /// refuse the store (error, the default), keep the transactions before
    /// the damage (point-in-time), or drop only the damaged ones
    /// (skip-corrupted). Read-only commands apply it in memory; put,
    /// archive, checkpoint and repair make it permanent.
    #[arg(long, global = true, value_enum, default_value = "error")]
    recovery: recovery::Recovery,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Store files as blobs in one transaction; print their grain ids.
    ///
    /// Each FILE becomes one blob; one grain id is printed per line, in the
    /// order of the files.
    ///
    /// Creates a new store if DB does not exist (its parent directory must)
    /// or is an empty directory. A non-empty directory without an `index`
    /// file is refused.
    Put {
        /// The store directory.
        db: PathBuf,
        /// Files to store; `-` reads standard input.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// One JSON object per file instead of text: file, id, length and
        /// the sequence that wrote it.
        #[arg(long)]
        json: bool,
    },
    /// Write the blob GRAIN to standard output, or to FILE with `-o`.
    Get {
        /// The store directory.
        db: PathBuf,
        /// The grain id, as printed by `put` or `ls`.
        grain: String,
        /// Write the blob to this file instead of standard output (never
        /// inside the store directory). It is replaced only once the whole
        /// blob is written and verified: a failed get leaves it as it was.
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// List the live blobs, in grain id order.
    ///
    /// One line per blob: its grain id, its length in bytes, the sequence
    /// of the transaction that wrote it, and `archived` if it is archived.
    /// Freed blobs are not listed. Only grain headers are read: `verify`
    /// checks the data.
    Ls {
        /// The store directory.
        db: PathBuf,
        /// One JSON object per line instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Archive blobs, in one transaction.
    ///
    /// Archived blobs stay readable until a checkpoint at or after the
    /// printed sequence frees them.
    Archive {
        /// The store directory.
        db: PathBuf,
        /// Grain ids to archive.
        #[arg(required = true)]
        grains: Vec<String>,
        /// JSON instead of text: the grains archived and the sequence.
        #[arg(long)]
        json: bool,
    },
    /// Free the grains archived at or before SEQUENCE.
    ///
    /// Also drops the commit records up to SEQUENCE.
    Checkpoint {
        /// The store directory.
        db: PathBuf,
        /// A committed sequence (see `sediment log`).
        sequence: String,
        /// JSON instead of text: where the store is checkpointed to, the
        /// sequence that did it and the grains freed.
        #[arg(long)]
        json: bool,
    },
    /// Print the commit log, one line per transaction.
    ///
    /// Each line has the sequence and the grains the transaction wrote
    /// (id:length), archived and freed, and its checkpoint if any.
    Log {
        /// The store directory.
        db: PathBuf,
        /// Start at this sequence.
        #[arg(long, value_name = "SEQUENCE", allow_hyphen_values = true)]
        since: Option<String>,
        /// One JSON object per line instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Show space per basin and the WAL files.
    ///
    /// Per basin: grain size, strata, grains used, archived and free, and
    /// bytes on disk. Then every WAL file with its state.
    Stats {
        /// The store directory.
        db: PathBuf,
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Check every header, allocation and checksum; exit 1 on problems.
    ///
    /// Checks every stratum header, allocation, grain checksum and commit
    /// record, and prints each problem with its location.
    Verify {
        /// The store directory.
        db: PathBuf,
        /// Show a progress bar (on a terminal).
        #[arg(long)]
        progress: bool,
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Open the store for writing once, to repair what opening repairs.
    ///
    /// Rewrites a damaged header copy from its intact twin, replays the
    /// WAL into the strata and finishes or removes files whose creation a
    /// crash cut short (a stratum left empty stays, for new blobs), then
    /// closes the store. The read-only commands (get, ls, log, stats, verify,
    /// wal-dump) never do this.
    Repair {
        /// The store directory.
        db: PathBuf,
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Dump the WAL segments of an okaywal directory, read-only.
    ///
    /// For every segment: its header and version info, each entry with its
    /// chunk lengths, CRC status and fate (committed, rolled back or
    /// incomplete), and where a torn tail begins. Only reads: never
    /// recovers or writes anything. A sediment store directory works too.
    WalDump {
        /// The okaywal directory (a sediment store directory works too).
        dir: PathBuf,
        /// Also list every record (offset, kind, entry, length, durable mark).
        #[arg(long)]
        records: bool,
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

fn run(cli: Cli) -> Result<(), CliError> {
    if let Some(path) = &cli.key_file {
        keys::load(path)?;
    }
    recovery::set(cli.recovery);
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let result = match &cli.command {
        Command::Put { db, files, json } => blobs::put(db, files, *json, &mut out),
        Command::Get { db, grain, output } => blobs::get(db, grain, output.as_deref(), &mut out),
        Command::Ls { db, json } => ls::ls(db, *json, &mut out),
        Command::Archive { db, grains, json } => blobs::archive(db, grains, *json, &mut out),
        Command::Checkpoint { db, sequence, json } => {
            blobs::checkpoint(db, sequence, *json, &mut out)
        }
        Command::Log { db, since, json } => inspect::log(db, since.as_deref(), *json, &mut out),
        Command::Stats { db, json } => inspect::stats(db, *json, &mut out),
        Command::Verify { db, progress, json } => inspect::verify(db, *progress, *json, &mut out),
        Command::Repair { db, json } => blobs::repair(db, *json, &mut out),
        Command::WalDump { dir, records, json } => {
            wal_dump::wal_dump(dir, *records, *json, &mut out)
        }
    };
    let flushed = out.flush().map_err(CliError::output);
    // A committing command that returns `Ok` has reported (or warned
    // about) its output itself; what its report left in the buffer
    // failed to write once already.
    let committed = matches!(
        cli.command,
        Command::Put { .. } | Command::Archive { .. } | Command::Checkpoint { .. }
    );
    match result {
        Ok(()) if committed => Ok(()),
        result => result.and(flushed),
    }
}

fn main() -> ExitCode {
    // A bug must still end in one line, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_string());
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        say!("sediment: internal error: {}{at}", one_line(&what));
    }));
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            use clap::error::ErrorKind;
            if matches!(
                err.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                // Help and version go to standard output, which may be
                // unwritable (a full disk): that is an error, not success.
                return match err.print() {
                    Ok(()) => ExitCode::from(u8::try_from(err.exit_code()).unwrap_or(0)),
                    Err(write) => {
                        say!("sediment: writing output: {}", error::describe_io(&write));
                        ExitCode::from(error::EXIT_FAILURE)
                    }
                };
            }
            // Which subcommand the usage was for, so `--help` can point there.
            let command = std::env::args()
                .nth(1)
                .filter(|arg| Cli::command().find_subcommand(arg).is_some())
                .map_or("sediment".to_string(), |sub| format!("sediment {sub}"));
            let rendered = err.render().to_string();
            say!("sediment: {}", error::usage_error(&rendered, &command));
            return ExitCode::from(2);
        }
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            if let Some(message) = &err.message {
                say!("sediment: {}", one_line(message));
            }
            ExitCode::from(err.code)
        }
    }
}
