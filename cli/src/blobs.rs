//! `put`, `get`, `archive` and `checkpoint`.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use indicatif::ProgressBar;
use sediment::{GrainId, SequenceId, DEFAULT_MAX_BLOB_BYTES};
use serde::Serialize;

use crate::error::{describe_io, not_allocated, CliError};
use crate::inspect::write_json;
use crate::progress::{busy, bytes_bar};
use crate::store::{
    self, parse_grain, parse_sequence, run_commit_then_shutdown, run_then_shutdown, Create,
};

/// Bytes copied at a time.
const PIECE: usize = 1 << 20;

fn is_stdin(path: &Path) -> bool {
    path.as_os_str() == "-"
}

/// Checks every input before the store is touched; returns the total size
/// of the regular files.
fn check_inputs(files: &[PathBuf]) -> Result<u64, CliError> {
    if files.iter().filter(|f| is_stdin(f)).count() > 1 {
        return Err(CliError::input(
            "`-` (standard input) can be given only once",
        ));
    }
    let mut total = 0;
    for file in files.iter().filter(|f| !is_stdin(f)) {
        let metadata = fs::metadata(file).map_err(|e| CliError::io("cannot read", file, &e))?;
        if metadata.is_dir() {
            return Err(CliError::input(format!(
                "{}: is a directory, not a file",
                file.display()
            )));
        }
        if metadata.is_file() && metadata.len() > DEFAULT_MAX_BLOB_BYTES {
            return Err(CliError::input(format!(
                "{}: {} bytes is more than the largest blob ({DEFAULT_MAX_BLOB_BYTES} bytes)",
                file.display(),
                metadata.len()
            )));
        }
        total += metadata.len();
    }
    Ok(total)
}

/// Reads one input (a file or stdin) whole, advancing `bar`.
fn read_input(path: &Path, bar: &ProgressBar) -> Result<Vec<u8>, CliError> {
    let name = if is_stdin(path) {
        Path::new("standard input")
    } else {
        path
    };
    let mut reader: Box<dyn Read> = if is_stdin(path) {
        Box::new(io::stdin().lock())
    } else {
        Box::new(File::open(path).map_err(|e| CliError::io("cannot read", path, &e))?)
    };
    let mut data = Vec::new();
    read_in_pieces(
        &mut *reader,
        |e| CliError::io("cannot read", name, &e),
        |piece| {
            data.extend_from_slice(piece);
            bar.inc(piece.len() as u64);
            if data.len() as u64 > DEFAULT_MAX_BLOB_BYTES {
                return Err(CliError::input(format!(
                    "{}: more than the largest blob ({DEFAULT_MAX_BLOB_BYTES} bytes)",
                    name.display()
                )));
            }
            Ok(())
        },
    )?;
    Ok(data)
}

/// Reads `reader` to its end, `PIECE` bytes at a time, handing each piece
/// to `piece`; a read error (an interrupted read is retried) becomes
/// `failed(error)`.
fn read_in_pieces(
    reader: &mut dyn Read,
    failed: impl Fn(io::Error) -> CliError,
    mut piece: impl FnMut(&[u8]) -> Result<(), CliError>,
) -> Result<(), CliError> {
    let mut buffer = vec![0; PIECE];
    loop {
        let n = match reader.read(&mut buffer) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(failed(e)),
        };
        piece(&buffer[..n])?;
    }
}

/// One line of `put --json`: a stored file.
#[derive(Serialize)]
struct JsonPut {
    /// The input as given (`-` for standard input).
    file: String,
    id: String,
    length: u64,
    sequence: u64,
}

/// `sediment put DB FILE... [--json]`
pub fn put(
    db_path: &Path,
    files: &[PathBuf],
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let total = check_inputs(files)?;
    let db = store::open(db_path, Create::IfNewOrEmpty)?;
    run_commit_then_shutdown(db, |db| {
        let bar = bytes_bar(total, "storing");
        let mut tx = db.begin_transaction()?;
        let mut stored = Vec::with_capacity(files.len());
        for file in files {
            let data = read_input(file, &bar)?;
            stored.push((tx.write(&data)?, data.len() as u64));
        }
        bar.finish_and_clear();
        let sequence = busy("committing", || tx.commit())?;
        for (file, (id, length)) in files.iter().zip(stored) {
            if json {
                let line = JsonPut {
                    file: file.display().to_string(),
                    id: id.to_string(),
                    length,
                    sequence: sequence.0,
                };
                write_json(out, &line)?;
            } else {
                writeln!(out, "{id}").map_err(CliError::output)?;
            }
        }
        out.flush().map_err(CliError::output)
    })
}

/// Where `get` writes.
enum Sink<'a> {
    Stdout(&'a mut dyn Write),
    File(File, &'a Path),
    /// Reads the blob only to check its checksum.
    Discard,
}

impl Sink<'_> {
    fn write_all(&mut self, bytes: &[u8]) -> Result<(), CliError> {
        match self {
            Sink::Stdout(out) => out.write_all(bytes).map_err(CliError::output),
            Sink::File(file, path) => file.write_all(bytes).map_err(|e| {
                CliError::failure(format!("writing {}: {}", path.display(), describe_io(&e)))
            }),
            Sink::Discard => Ok(()),
        }
    }

    fn finish(&mut self) -> Result<(), CliError> {
        match self {
            Sink::Stdout(out) => out.flush().map_err(CliError::output),
            Sink::File(file, path) => file.sync_all().map_err(|e| {
                CliError::failure(format!("writing {}: {}", path.display(), describe_io(&e)))
            }),
            Sink::Discard => Ok(()),
        }
    }
}

/// `sediment get DB GRAIN [-o FILE]`
pub fn get(
    db_path: &Path,
    grain: &str,
    output: Option<&Path>,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let id = parse_grain(grain)?;
    let output = output.filter(|path| !is_stdin(path));
    if let Some(path) = output {
        refuse_output_in_store(db_path, path)?;
    }
    let db = store::open_read_only(db_path)?;
    run_then_shutdown(db, |db| {
        let Some(mut reader) = db.read(id)? else {
            return Err(CliError::input(not_allocated(id)));
        };
        if output.is_none() {
            // The checksum covers the whole blob and is checked at its
            // end, and what went to standard output cannot be taken back
            // (a file can): read it through once first, so that a damaged
            // blob sends nothing down a pipe that may ignore the exit
            // status. The second read comes from the page cache.
            copy_blob(db, id, &mut reader, &mut Sink::Discard)?;
            reader = db
                .read(id)?
                .ok_or_else(|| CliError::input(not_allocated(id)))?;
        }
        let mut sink = match output {
            Some(path) => Sink::File(
                File::create(path).map_err(|e| CliError::io("cannot create", path, &e))?,
                path,
            ),
            None => Sink::Stdout(out),
        };
        let result = copy_blob(db, id, &mut reader, &mut sink);
        if result.is_err() {
            if let Sink::File(file, path) = sink {
                discard_partial(file, path);
            }
        }
        result
    })
}

/// Refuses a `get -o PATH` that would write into the store directory:
/// creating or overwriting a file there (`-o STORE/index`) can leave a
/// store that never opens again. Both paths are resolved first (symbolic
/// links, `..`), a `PATH` that does not exist yet by where it would be
/// created. When either cannot be resolved the check is left to what
/// follows: opening the store or creating the file fails with its own
/// error.
fn refuse_output_in_store(db_path: &Path, output: &Path) -> Result<(), CliError> {
    let (Ok(store), Ok(target)) = (fs::canonicalize(db_path), resolve_output(output)) else {
        return Ok(());
    };
    if target.starts_with(&store) {
        return Err(CliError::input(format!(
            "{}: the output file would be inside the store directory {} (as {}), where it \
             could damage the store; write it somewhere else",
            output.display(),
            db_path.display(),
            target.display()
        )));
    }
    Ok(())
}

/// Where creating or writing `path` lands: its canonical path if it exists,
/// else the canonical parent joined with its name, following a symbolic
/// link that points to a file not created yet.
fn resolve_output(path: &Path) -> io::Result<PathBuf> {
    let mut path = path.to_path_buf();
    // As many links as Linux follows in one lookup.
    for _ in 0..40 {
        match fs::canonicalize(&path) {
            Ok(resolved) => return Ok(resolved),
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            Err(err) => return Err(err),
        }
        if fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
            // A dangling link: creating the file creates its target.
            let target = fs::read_link(&path)?;
            path = match path.parent() {
                Some(parent) => parent.join(target),
                None => target,
            };
            continue;
        }
        let name = path
            .file_name()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        let parent = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        return Ok(fs::canonicalize(parent)?.join(name));
    }
    Err(io::Error::other("too many levels of symbolic links"))
}

/// After a failed `get -o PATH`: removes the partly written file, so no
/// partial blob is left behind. Only a regular file is removed; through a
/// symbolic link the target is emptied and the link kept, and a device or
/// pipe (`-o /dev/stdout`, `-o /dev/null`) is left alone.
fn discard_partial(file: File, path: &Path) {
    let is_regular = |m: io::Result<fs::Metadata>| m.is_ok_and(|m| m.file_type().is_file());
    if is_regular(fs::symlink_metadata(path)) {
        drop(file);
        let _ = fs::remove_file(path);
    } else if is_regular(file.metadata()) {
        let _ = file.set_len(0);
    }
}

fn copy_blob(
    db: &sediment::Database,
    id: GrainId,
    reader: &mut sediment::GrainReader,
    sink: &mut Sink<'_>,
) -> Result<(), CliError> {
    let bar = bytes_bar(reader.len(), "reading");
    let failed = |e: io::Error| {
        if e.kind() == io::ErrorKind::InvalidData {
            // The reader's error does not say where the grain is;
            // reading it whole again gives the library's full error.
            match db.get(id) {
                Err(err) => CliError::from(err),
                Ok(_) => CliError::failure(format!(
                    "the store is damaged: grain {id} failed its checksum"
                )),
            }
        } else {
            CliError::failure(format!("reading grain {id}: {}", describe_io(&e)))
        }
    };
    read_in_pieces(reader, failed, |piece| {
        sink.write_all(piece)?;
        bar.inc(piece.len() as u64);
        Ok(())
    })?;
    bar.finish_and_clear();
    sink.finish()
}

/// `archive --json`.
#[derive(Serialize)]
struct JsonArchive {
    archived: Vec<String>,
    /// The archiving transaction: `checkpoint` to it frees the grains.
    sequence: u64,
}

/// `sediment archive DB GRAIN... [--json]`
pub fn archive(
    db_path: &Path,
    grains: &[String],
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let ids = grains
        .iter()
        .map(|g| parse_grain(g))
        .collect::<Result<Vec<_>, _>>()?;
    let db = store::open(db_path, Create::Never)?;
    run_commit_then_shutdown(db, |db| {
        let mut tx = db.begin_transaction()?;
        for id in &ids {
            tx.archive(*id)?;
        }
        let sequence = busy("committing", || tx.commit())?;
        if json {
            let report = JsonArchive {
                archived: ids.iter().map(ToString::to_string).collect(),
                sequence: sequence.0,
            };
            return write_json(out, &report);
        }
        writeln!(
            out,
            "archived {} grain(s) in sequence {sequence}; `sediment checkpoint {} {sequence}` frees them",
            ids.len(),
            db_path.display()
        )
        .map_err(CliError::output)
    })
}

/// `checkpoint --json`.
#[derive(Serialize)]
struct JsonCheckpoint {
    /// Where the store is checkpointed to now.
    checkpointed_to: u64,
    /// The transaction that checkpointed; `null` when the store already was
    /// checkpointed that far and nothing was committed.
    sequence: Option<u64>,
    /// The grains it freed.
    freed: Vec<String>,
}

/// `sediment checkpoint DB SEQUENCE [--json]`
pub fn checkpoint(
    db_path: &Path,
    sequence: &str,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let to = parse_sequence(sequence)?;
    let db = store::open(db_path, Create::Never)?;
    run_commit_then_shutdown(db, |db| {
        let current = db.checkpointed_to();
        if to <= current.0 {
            // A checkpoint never moves back: committing one would only add
            // a no-op transaction and a message naming the wrong sequence.
            if json {
                let report = JsonCheckpoint {
                    checkpointed_to: current.0,
                    sequence: None,
                    freed: Vec::new(),
                };
                return write_json(out, &report);
            }
            return writeln!(
                out,
                "already checkpointed to sequence {current}: nothing to do"
            )
            .map_err(CliError::output);
        }
        let mut tx = db.begin_transaction()?;
        tx.checkpoint_to(SequenceId(to))?;
        let at = busy("committing", || tx.commit())?;
        let record = db.commit_log(at)?.find(|record| record.sequence == at);
        let freed: Vec<GrainId> = record
            .as_ref()
            .map_or_else(Vec::new, |record| record.freed.clone());
        if json {
            let report = JsonCheckpoint {
                checkpointed_to: record
                    .as_ref()
                    .and_then(|record| record.checkpointed_to)
                    .map_or(to, |reached| reached.0),
                sequence: Some(at.0),
                freed: freed.iter().map(ToString::to_string).collect(),
            };
            return write_json(out, &report);
        }
        writeln!(
            out,
            "checkpointed to sequence {to} in sequence {at}: freed {} grain(s)",
            freed.len()
        )
        .map_err(CliError::output)
    })
}

/// `sediment repair DB`: opens the store for writing (which rewrites a
/// damaged header copy from its twin and replays the WAL) and closes it.
pub fn repair(db_path: &Path, out: &mut dyn Write) -> Result<(), CliError> {
    let before = crate::headers::bad_copies(db_path).len();
    let db = store::open(db_path, Create::Never)?;
    run_then_shutdown(db, |_| Ok(()))?;
    let after = crate::headers::bad_copies(db_path).len();
    writeln!(
        out,
        "repaired {} header cop{}; the store is closed",
        before - after.min(before),
        if before - after.min(before) == 1 {
            "y"
        } else {
            "ies"
        }
    )
    .map_err(CliError::output)
}
