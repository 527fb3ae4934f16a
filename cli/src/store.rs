//! Finding, opening and closing stores; parsing grain ids and sequences.

use std::fs;
use std::io::{self, Write};
use std::path::Path;

use sediment::{Database, GrainId, SequenceId};

use crate::error::{one_line, say, CliError};
use crate::keys;
use crate::progress::busy;

/// What is at a store path before anything is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirState {
    /// Nothing exists there.
    Missing,
    /// An empty directory.
    Empty,
    /// A directory with an `index` file.
    Store,
    /// A directory with other files and no `index`.
    NotStore,
    /// A directory whose `index` file is no sediment index and no index
    /// whose creation a crash cut short (empty, zeros, or the start of
    /// one), beside no other store file: a file of the user's that
    /// happens to have that name.
    ForeignIndex,
    /// A directory whose only store file is an `index` that a crash cut
    /// short while creating it (empty, zeros, or less than its magic):
    /// nothing was ever stored. Opening it for writing starts afresh.
    Unfinished,
}

/// Whether a command may create a new store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Create {
    /// Only existing stores are opened.
    Never,
    /// A missing directory (whose parent exists) or an empty one becomes a
    /// new store.
    IfNewOrEmpty,
}

/// Looks at `path` without changing anything.
pub fn dir_state(path: &Path) -> Result<DirState, CliError> {
    let metadata = match fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(DirState::Missing),
        Err(err) => return Err(CliError::io("cannot access", path, &err)),
    };
    if !metadata.is_dir() {
        return Err(CliError::input(format!(
            "{}: not a directory",
            path.display()
        )));
    }
    match fs::metadata(path.join("index")) {
        Ok(index) if index.is_file() => {
            let start = index_start(&path.join("index"));
            return Ok(match start {
                _ if holds_store_files(path) => DirState::Store,
                IndexStart::Foreign => DirState::ForeignIndex,
                IndexStart::Unfinished => DirState::Unfinished,
                IndexStart::Index => DirState::Store,
            });
        }
        Ok(_) => return Ok(DirState::NotStore),
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(err) => return Err(CliError::io("cannot access", &path.join("index"), &err)),
    }
    let mut entries = fs::read_dir(path).map_err(|e| CliError::io("cannot list", path, &e))?;
    Ok(if entries.next().is_none() {
        DirState::Empty
    } else {
        DirState::NotStore
    })
}

/// What an `index` file begins with.
enum IndexStart {
    /// The index magic, or a file that cannot be read (left to opening
    /// the store to report).
    Index,
    /// What a cut-short creation leaves: nothing, zeros, or the start of
    /// the magic.
    Unfinished,
    /// Anything else: not a sediment index.
    Foreign,
}

fn index_start(path: &Path) -> IndexStart {
    use sediment::format::INDEX_MAGIC_BYTES;
    use std::io::Read;
    let mut start = Vec::with_capacity(INDEX_MAGIC_BYTES.len());
    let Ok(file) = fs::File::open(path) else {
        return IndexStart::Index;
    };
    if file
        .take(INDEX_MAGIC_BYTES.len() as u64)
        .read_to_end(&mut start)
        .is_err()
    {
        return IndexStart::Index;
    }
    if start == INDEX_MAGIC_BYTES {
        IndexStart::Index
    } else if start.iter().all(|b| *b == 0) || INDEX_MAGIC_BYTES.starts_with(&start) {
        IndexStart::Unfinished
    } else {
        IndexStart::Foreign
    }
}

/// Whether the directory holds a stratum, commit log or WAL file: then
/// an unreadable index is damage to a store, for opening it to report.
fn holds_store_files(path: &Path) -> bool {
    let Ok(entries) = fs::read_dir(path) else {
        return true;
    };
    entries.flatten().any(|entry| {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        name.starts_with("stratum-")
            || name.starts_with("commits-")
            || okaywal::LogFileName::parse(&name).is_some()
    })
}

/// Checks that `path` is a directory, without creating it.
pub fn require_dir(path: &Path) -> Result<(), CliError> {
    match fs::metadata(path) {
        Ok(metadata) if metadata.is_dir() => Ok(()),
        Ok(_) => Err(CliError::input(format!(
            "{}: not a directory",
            path.display()
        ))),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Err(CliError::input(format!(
            "{}: no such directory",
            path.display()
        ))),
        Err(err) => Err(CliError::io("cannot access", path, &err)),
    }
}

/// Checks what is at `path` and opens the store with
/// [`Database::recover`]; never creates a directory unless `create`
/// allows it.
pub fn open(path: &Path, create: Create) -> Result<Database, CliError> {
    prepare(path, create)?;
    recover(path)
}

/// Checks what is at `path` and opens the store read-only
/// ([`Database::open_read_only`]): not a byte of it is written.
pub fn open_read_only(path: &Path) -> Result<Database, CliError> {
    prepare(path, Create::Never)?;
    let config = keys::store_config(path).read_only(true);
    busy("opening the store", || config.open()).map_err(CliError::from)
}

/// Opens the store at `path` (checked with [`prepare`]), with the key of
/// `--key-file` if one was given.
pub fn recover(path: &Path) -> Result<Database, CliError> {
    refuse_to_drop_unproven_commits(path)?;
    let config = keys::store_config(path);
    busy("opening the store", || config.open()).map_err(CliError::from)
}

/// Before an open for writing: refuses when the WAL holds transactions
/// whose commit records verify but whose other records do not, with
/// nothing written after them that proves they were synced (a chunk that
/// fails its CRC at the tail, or the walk ending at a record that does not
/// verify while later commit records do). Recovery takes that for a write
/// a power cut interrupted (the transactions were then never
/// acknowledged) and drops them; damage after they committed leaves the
/// same, and the open would erase the evidence. `sediment verify` reports
/// them; the command asks for `--recovery point-in-time` before it drops
/// them.
fn refuse_to_drop_unproven_commits(path: &Path) -> Result<(), CliError> {
    if crate::recovery::mode() != okaywal::RecoveryMode::ErrorOnCorruption {
        // The user chose what recovery keeps.
        return Ok(());
    }
    // Read while a read-only open holds the store's lock shared, so that
    // no writer is changing the files: a live writer's tail is no damage.
    // If that open fails (a writer holds the store, it is damaged), the
    // open for writing says why.
    let Ok(reader) = keys::store_config(path).read_only(true).open() else {
        return Ok(());
    };
    let checkpointed = reader
        .stats()
        .map_or(0, |stats| stats.wal_checkpointed_entry);
    let inspection = keys::wal_config(path).inspect();
    drop(reader);
    let Ok(inspection) = inspection else {
        return Ok(());
    };
    let mut dropped = Vec::new();
    for segment in &inspection.segments {
        if inspection.problems.iter().any(|p| p.path == segment.path) {
            // Damage proven: the open refuses the store by itself.
            continue;
        }
        for entry in &segment.incomplete {
            if entry.id.0 > checkpointed {
                dropped.push((entry.id.0, &segment.path, entry.commit_offset));
            }
        }
        for id in &segment.committed_past_end {
            if id.0 > checkpointed {
                dropped.push((id.0, &segment.path, segment.end));
            }
        }
    }
    let Some((_, file, offset)) = dropped.first() else {
        return Ok(());
    };
    let ids: Vec<String> = dropped.iter().map(|(id, ..)| id.to_string()).collect();
    let (entries, it, they) = if ids.len() == 1 {
        ("entry", "it", "it was")
    } else {
        ("entries", "them", "they were")
    };
    Err(CliError::failure(format!(
        "the write-ahead log holds commit records of WAL {entries} {} that verify, but not \
         every record before them does ({} offset {offset}), and nothing written later proves \
         {they} synced: a power cut in the middle of writing {it} leaves this, and so does \
         damage after {they} committed. Opening the store for writing would drop {it}; \
         `sediment verify` names the blobs, and --recovery point-in-time drops {it} and goes on",
        ids.join(", "),
        file.display(),
    )))
}

/// Checks what is at `path` before it is opened as a store, creating the
/// directory if `create` allows it and nothing is there.
pub fn prepare(path: &Path, create: Create) -> Result<(), CliError> {
    match (dir_state(path)?, create) {
        (DirState::Store, _)
        | (DirState::Empty | DirState::Unfinished, Create::IfNewOrEmpty) => {}
        (DirState::Unfinished, Create::Never) => {
            return Err(CliError::input(format!(
                "{}: not a sediment store (its index file is empty or cut short: a store whose \
                 creation was interrupted, with nothing stored; `put` starts a store there)",
                path.display()
            )))
        }
        (DirState::Missing, Create::IfNewOrEmpty) => {
            fs::create_dir(path).map_err(|err| {
                if err.kind() == io::ErrorKind::NotFound {
                    CliError::input(format!(
                        "cannot create {}: its parent directory does not exist",
                        path.display()
                    ))
                } else {
                    CliError::io("cannot create", path, &err)
                }
            })?;
        }
        (DirState::Missing, Create::Never) => {
            return Err(CliError::input(format!(
                "{}: no such directory",
                path.display()
            )))
        }
        (DirState::Empty, Create::Never) => {
            return Err(CliError::input(format!(
                "{}: not a sediment store (the directory is empty)",
                path.display()
            )))
        }
        (DirState::NotStore, Create::Never) => {
            return Err(CliError::input(format!(
                "{}: not a sediment store (no index file)",
                path.display()
            )))
        }
        (DirState::ForeignIndex, _) => {
            return Err(CliError::input(format!(
                "{}: not a sediment store (its index file is not a sediment index; it is left \
                 as it is)",
                path.display()
            )))
        }
        (DirState::NotStore, Create::IfNewOrEmpty) => {
            return Err(CliError::input(format!(
                "{}: not a sediment store (no index file), and not empty: new stores are created only in a new or empty directory",
                path.display()
            )))
        }
    }
    Ok(())
}

/// Runs `work` on the open store, then shuts it down (checkpointing the
/// WAL into the strata, unless it is open read-only) whatever `work`
/// returned. The first error wins.
pub fn run_then_shutdown<T>(
    db: Database,
    work: impl FnOnce(&Database) -> Result<T, CliError>,
) -> Result<T, CliError> {
    let result = work(&db);
    let shutdown = busy("checkpointing the store", || db.shutdown());
    let value = result?;
    shutdown.map_err(CliError::from)?;
    Ok(value)
}

/// Like [`run_then_shutdown`], for commands whose work commits a
/// transaction (`put`, `archive`, `checkpoint`). Once the work succeeded
/// its transaction is durable in the WAL, so a shutdown that fails after
/// it (say, a full disk while moving the WAL into the strata) is a warning
/// on stderr, not a failure: exiting non-zero would make a script retry,
/// and a retried `put` stores its blobs twice. The WAL is replayed when
/// the store is next opened.
pub fn run_commit_then_shutdown<T>(
    db: Database,
    work: impl FnOnce(&Database) -> Result<T, CliError>,
) -> Result<T, CliError> {
    let result = work(&db);
    let shutdown = busy("checkpointing the store", || db.shutdown()).map_err(CliError::from);
    after_commit(result, shutdown, &mut io::stderr().lock())
}

/// What a committing command returns given its work's result and the
/// shutdown's: the work's error if it failed, else its value, with a
/// failed shutdown written to `warnings` as a one-line warning.
pub fn after_commit<T>(
    result: Result<T, CliError>,
    shutdown: Result<(), CliError>,
    warnings: &mut dyn Write,
) -> Result<T, CliError> {
    let value = result?;
    if let Err(err) = shutdown {
        let why = err.message.as_deref().unwrap_or("unknown error");
        // Nothing more can be done if stderr is gone too.
        let _ = writeln!(
            warnings,
            "sediment: warning: the transaction committed, but closing the store failed: {}; \
             the store finishes moving its WAL into the strata when it is next opened",
            one_line(why)
        );
    }
    Ok(value)
}

/// Parses a grain id given on the command line.
pub fn parse_grain(text: &str) -> Result<GrainId, CliError> {
    text.parse::<GrainId>()
        .map_err(|err| CliError::input(err.to_string()))
}

/// Parses a sequence given on the command line.
pub fn parse_sequence(text: &str) -> Result<u64, CliError> {
    text.trim().parse::<u64>().map_err(|_| {
        CliError::input(format!(
            "{text:?} is not a sequence number (expected a non-negative integer)"
        ))
    })
}

/// Warns on stderr when commit log bytes are damaged: the store then does
/// not know which grains the hidden records archived, so `ls` and `stats`
/// show them as live and no checkpoint frees them (their space is kept
/// rather than risk freeing a newer blob). Said once per command, so that
/// a count of archived or freed grains is never taken at face value.
pub fn warn_if_commit_log_damaged(db: &Database) {
    let since = SequenceId(db.checkpointed_to().0.saturating_add(1));
    if let Err(sediment::Error::CommitLogDamaged(damage)) = db.commit_log(since) {
        say!(
            "sediment: warning: {}; grains archived by the transactions it hides show as \
             live and no checkpoint frees them (`sediment verify` lists the damage)",
            one_line(&damage.to_string())
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shutdown that fails after the transaction committed (the disk
    /// filled up while the WAL was moved into the strata) must not fail
    /// the command: its output stands, exit code 0, and a warning.
    #[test]
    fn a_failed_shutdown_after_a_commit_is_a_warning() {
        let full = || {
            CliError::from(sediment::Error::Io {
                context: "checkpointing the WAL at shutdown".into(),
                source: io::Error::new(io::ErrorKind::StorageFull, "No space left on device"),
            })
        };
        let mut warnings = Vec::new();
        let value = after_commit(Ok("0-0-0-1"), Err(full()), &mut warnings).unwrap();
        assert_eq!(value, "0-0-0-1");
        let warnings = String::from_utf8(warnings).unwrap();
        assert_eq!(warnings.lines().count(), 1, "{warnings}");
        assert!(
            warnings.starts_with("sediment: warning: the transaction committed"),
            "{warnings}"
        );
        assert!(warnings.contains("No space left on device"), "{warnings}");

        let mut warnings = Vec::new();
        assert_eq!(after_commit(Ok(7), Ok(()), &mut warnings).unwrap(), 7);
        assert!(warnings.is_empty());

        // The work's own failure (nothing committed) still fails, whatever
        // the shutdown did, and the shutdown is not reported on top.
        for shutdown in [Ok(()), Err(full())] {
            let mut warnings = Vec::new();
            let err = after_commit::<()>(
                Err(CliError::failure(
                    "committing sequence 4 to the WAL: No space left on device",
                )),
                shutdown,
                &mut warnings,
            )
            .unwrap_err();
            assert_eq!(err.code, crate::error::EXIT_FAILURE);
            assert!(err.message.unwrap().contains("committing sequence 4"));
            assert!(warnings.is_empty());
        }
    }
}
