//! `put`, `get`, `archive` and `checkpoint`.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use indicatif::ProgressBar;
use sediment::{GrainId, SequenceId, DEFAULT_MAX_BLOB_BYTES};
use serde::Serialize;

use crate::error::{describe_io, not_allocated, one_line, CliError};
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
        if metadata.is_file() {
            // One that cannot be opened (no permission) is refused before
            // a new store is made for it.
            File::open(file).map_err(|e| CliError::io("cannot read", file, &e))?;
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
    // Standard input, and any other input that is not a regular file (a
    // pipe, a device), is read whole before the store is opened: input
    // that fails (too large, a read error, an interrupted pipe) then leaves
    // no new, empty store behind, and a store that is there is not locked
    // while a slow producer writes.
    let mut read_first: Vec<Option<Vec<u8>>> = Vec::with_capacity(files.len());
    for file in files {
        let streamed = is_stdin(file) || fs::metadata(file).is_ok_and(|m| !m.is_file());
        read_first.push(if streamed {
            Some(read_input(file, &ProgressBar::hidden())?)
        } else {
            None
        });
    }
    let db = store::open(db_path, Create::IfNewOrEmpty)?;
    run_commit_then_shutdown(db, |db| {
        let bar = bytes_bar(total, "storing");
        let mut tx = db.begin_transaction()?;
        let mut stored = Vec::with_capacity(files.len());
        for (file, read) in files.iter().zip(&mut read_first) {
            let data = match read.take() {
                Some(data) => data,
                None => read_input(file, &bar)?,
            };
            stored.push((tx.write(&data)?, data.len() as u64));
        }
        bar.finish_and_clear();
        let sequence = busy("committing", || tx.commit())?;
        let report = (|| {
            for (file, (id, length)) in files.iter().zip(&stored) {
                if json {
                    let line = JsonPut {
                        file: file.display().to_string(),
                        id: id.to_string(),
                        length: *length,
                        sequence: sequence.0,
                    };
                    write_json(out, &line)?;
                } else {
                    writeln!(out, "{id}").map_err(CliError::output)?;
                }
            }
            out.flush().map_err(CliError::output)
        })();
        reported(report, sequence, || {
            let ids: Vec<String> = stored.iter().map(|(id, _)| id.to_string()).collect();
            format!(
                "the blobs' grain ids, in the order of the files: {}",
                ids.join(" ")
            )
        })
    })
}

/// The end of a command whose transaction committed as `sequence`: what
/// it printed about it. The transaction is in the store whatever happens
/// to that report, so a failure to write the report is a warning on
/// stderr that says what the report would have said (`lost`), and the
/// command still succeeds: a script that runs a failed command again
/// would commit it twice. (A reader that went away is no warning.)
fn reported(
    report: Result<(), CliError>,
    sequence: SequenceId,
    lost: impl FnOnce() -> String,
) -> Result<(), CliError> {
    match report {
        Err(err) if err.code != 0 => {
            let why = err.message.as_deref().unwrap_or("unknown error");
            // Nothing more can be done if stderr is gone too.
            let _ = writeln!(
                io::stderr().lock(),
                "sediment: warning: sequence {sequence} committed, but {}; {}",
                one_line(why),
                lost()
            );
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Where `get` writes.
enum Sink<'a> {
    Stdout(&'a mut dyn Write),
    /// Written in place: a device or a pipe (`-o /dev/null`), or an
    /// existing regular file (`true`) when no temporary file can be made
    /// beside it (a directory the user may not write to). The blob is
    /// checked whole before anything is written there.
    File(File, &'a Path, bool),
    /// A regular file, new or existing, written under a temporary name in
    /// its directory and renamed over it only once the blob is whole,
    /// checked and synced (see [`Staged`]).
    Staged(Staged, &'a Path),
    /// Reads the blob only to check its checksum.
    Discard,
}

impl Sink<'_> {
    fn write_all(&mut self, bytes: &[u8]) -> Result<(), CliError> {
        let (result, path) = match self {
            Sink::Stdout(out) => return out.write_all(bytes).map_err(CliError::output),
            Sink::File(file, path, _) => (file.write_all(bytes), *path),
            Sink::Staged(staged, path) => (staged.file.write_all(bytes), *path),
            Sink::Discard => return Ok(()),
        };
        result.map_err(|e| writing_failed(path, &e))
    }

    fn finish(self) -> Result<(), CliError> {
        match self {
            Sink::Stdout(out) => out.flush().map_err(CliError::output),
            Sink::File(file, path, true) => file.sync_all().map_err(|e| writing_failed(path, &e)),
            // A device or a pipe: nothing to sync (`fsync` of one fails).
            Sink::File(mut file, path, false) => file.flush().map_err(|e| writing_failed(path, &e)),
            Sink::Staged(staged, path) => staged
                .replace_target()
                .map_err(|e| writing_failed(path, &e)),
            Sink::Discard => Ok(()),
        }
    }

    /// After a failure: no partial blob is left behind, and a file that
    /// was at the output path stays as it was. (What went to a device or
    /// a pipe is gone; standard output got nothing of a damaged blob.)
    /// Readies the sink once the blob checked out: an existing file
    /// written in place is emptied only now.
    fn begin(&mut self) -> Result<(), CliError> {
        match self {
            Sink::File(file, path, true) => file.set_len(0).map_err(|e| writing_failed(path, &e)),
            _ => Ok(()),
        }
    }

    fn abandon(self) {
        if let Sink::Staged(staged, _) = self {
            staged.remove();
        }
    }
}

fn writing_failed(path: &Path, err: &io::Error) -> CliError {
    CliError::failure(format!("writing {}: {}", path.display(), describe_io(err)))
}

/// A `get -o` output written beside its target under a temporary name.
struct Staged {
    file: File,
    temp: PathBuf,
    target: PathBuf,
}

impl Staged {
    /// Creates the temporary file for `target` (a resolved path whose
    /// parent exists) in the same directory, with `target`'s permissions
    /// if it exists.
    fn create(target: PathBuf, existing: Option<&fs::Metadata>) -> io::Result<Self> {
        let dir = target.parent().unwrap_or(Path::new("."));
        let name = target
            .file_name()
            .map_or_else(|| "blob".into(), |name| name.to_string_lossy().into_owned());
        let mut attempt = 0_u32;
        loop {
            let temp = dir.join(format!(
                ".{name}.sediment-get-{}-{attempt}",
                std::process::id()
            ));
            match fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&temp)
            {
                Ok(file) => {
                    let staged = Self { file, temp, target };
                    if let Some(existing) = existing {
                        if let Err(err) = fs::set_permissions(&staged.temp, existing.permissions())
                        {
                            staged.remove();
                            return Err(err);
                        }
                    }
                    return Ok(staged);
                }
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists && attempt < 100 => {
                    attempt += 1;
                }
                Err(err) => return Err(err),
            }
        }
    }

    /// Syncs the file and renames it over the target, then syncs the
    /// directory (best effort: the blob is in place either way).
    fn replace_target(self) -> io::Result<()> {
        let result = self
            .file
            .sync_all()
            .and_then(|()| fs::rename(&self.temp, &self.target));
        if let Err(err) = result {
            self.remove();
            return Err(err);
        }
        if let Some(dir) = self.target.parent() {
            let _ = File::open(dir).and_then(|dir| dir.sync_all());
        }
        Ok(())
    }

    fn remove(self) {
        drop(self.file);
        let _ = fs::remove_file(&self.temp);
    }
}

/// The descriptor of this process that `path` names, if it leads (through
/// symbolic links) to one of `/proc/self/fd` (`/dev/stdout`, `/dev/fd/1`,
/// `/proc/self/fd/1`): a file this process already has open, which the
/// caller opened for it (`>> log`), not a file to replace.
fn open_descriptor(path: &Path) -> Option<u32> {
    let fd_dir = fs::canonicalize("/proc/self/fd").ok()?;
    let mut at = path.to_path_buf();
    for _ in 0..40 {
        let parent = match at.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if fs::canonicalize(&parent).is_ok_and(|parent| parent == fd_dir) {
            return at.file_name()?.to_str()?.parse().ok();
        }
        if !fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink()) {
            return None;
        }
        at = parent.join(fs::read_link(&at).ok()?);
    }
    None
}

/// Opens where `get -o path` writes: a regular file (or a path where none
/// exists yet) is staged beside its target, anything else is written in
/// place. A descriptor the command was given (`-o /dev/stdout` when
/// standard output goes to a file) is written where it stands: standard
/// output as standard output, another one appended to.
fn output_sink<'a>(path: &'a Path, out: &'a mut dyn Write) -> Result<Sink<'a>, CliError> {
    let cannot_create = |e: &io::Error| CliError::io("cannot create", path, e);
    match open_descriptor(path) {
        Some(1) => return Ok(Sink::Stdout(out)),
        Some(_) => {
            return fs::OpenOptions::new()
                .append(true)
                .open(path)
                .map(|file| Sink::File(file, path, false))
                .map_err(|e| cannot_create(&e))
        }
        None => {}
    }
    // A pipe or socket reached through a link in /proc (`/dev/stdout` when
    // standard output is a pipe) has no name to resolve: its link reads
    // `pipe:[N]`. It is no file to replace either: open it as it is.
    if fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir()) {
        return fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map(|file| Sink::File(file, path, false))
            .map_err(|e| cannot_create(&e));
    }
    let target = resolve_output(path).map_err(|e| cannot_create(&e))?;
    match fs::metadata(&target) {
        Ok(metadata) if !metadata.is_file() => {
            if metadata.is_dir() {
                return Err(CliError::input(format!(
                    "{}: is a directory",
                    path.display()
                )));
            }
            let file = fs::OpenOptions::new()
                .write(true)
                .open(&target)
                .map_err(|e| cannot_create(&e))?;
            Ok(Sink::File(file, path, false))
        }
        Ok(metadata) => match Staged::create(target.clone(), Some(&metadata)) {
            Ok(staged) => Ok(Sink::Staged(staged, path)),
            // No file can be made beside it, but it may be writable itself.
            Err(err) if err.kind() == io::ErrorKind::PermissionDenied => fs::OpenOptions::new()
                .write(true)
                .open(&target)
                .map(|file| Sink::File(file, path, true))
                .map_err(|_| cannot_create(&err)),
            Err(err) => Err(cannot_create(&err)),
        },
        Err(err) if err.kind() == io::ErrorKind::NotFound => Staged::create(target, None)
            .map(|staged| Sink::Staged(staged, path))
            .map_err(|e| cannot_create(&e)),
        Err(err) => Err(cannot_create(&err)),
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
        let mut sink = match output {
            Some(path) => output_sink(path, out)?,
            None => Sink::Stdout(out),
        };
        if !matches!(sink, Sink::Staged(..)) {
            // The checksum covers the whole blob and is checked at its
            // end, and what went to standard output (or a device, or a
            // file written in place) cannot be taken back: read it through
            // once first, so that a damaged blob sends nothing down a pipe
            // that may ignore the exit status and leaves a file as it was.
            // The second read comes from the page cache.
            copy_blob(db, id, &mut reader, &mut Sink::Discard)?;
            reader = db
                .read(id)?
                .ok_or_else(|| CliError::input(not_allocated(id)))?;
        }
        sink.begin()?;
        match copy_blob(db, id, &mut reader, &mut sink) {
            Ok(()) => sink.finish(),
            Err(err) => {
                sink.abandon();
                Err(err)
            }
        }
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
    Ok(())
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
    let mut seen = std::collections::BTreeSet::new();
    if let Some(twice) = ids.iter().find(|id| !seen.insert(**id)) {
        return Err(CliError::input(format!(
            "grain {twice} is given more than once"
        )));
    }
    let db = store::open(db_path, Create::Never)?;
    run_commit_then_shutdown(db, |db| {
        let mut tx = db.begin_transaction()?;
        for id in &ids {
            tx.archive(*id)?;
        }
        let sequence = busy("committing", || tx.commit())?;
        let report = if json {
            let report = JsonArchive {
                archived: ids.iter().map(ToString::to_string).collect(),
                sequence: sequence.0,
            };
            write_json(out, &report)
        } else {
            writeln!(
                out,
                "archived {} grain(s) in sequence {sequence}; `sediment checkpoint {} {sequence}` frees them",
                ids.len(),
                db_path.display()
            )
            .map_err(CliError::output)
        }
        .and_then(|()| out.flush().map_err(CliError::output));
        reported(report, sequence, || {
            format!("it archived {} grain(s)", ids.len())
        })
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
        store::warn_if_commit_log_damaged(db);
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
                write_json(out, &report)?;
            } else {
                writeln!(
                    out,
                    "already checkpointed to sequence {current}: nothing to do"
                )
                .map_err(CliError::output)?;
            }
            return out.flush().map_err(CliError::output);
        }
        let mut tx = db.begin_transaction()?;
        tx.checkpoint_to(SequenceId(to))?;
        let at = busy("committing", || tx.commit())?;
        let record = db.commit_log(at)?.find(|record| record.sequence == at);
        let freed: Vec<GrainId> = record
            .as_ref()
            .map_or_else(Vec::new, |record| record.freed.clone());
        let report = if json {
            let report = JsonCheckpoint {
                checkpointed_to: record
                    .as_ref()
                    .and_then(|record| record.checkpointed_to)
                    .map_or(to, |reached| reached.0),
                sequence: Some(at.0),
                freed: freed.iter().map(ToString::to_string).collect(),
            };
            write_json(out, &report)
        } else {
            writeln!(
                out,
                "checkpointed to sequence {to} in sequence {at}: freed {} grain(s)",
                freed.len()
            )
            .map_err(CliError::output)
        }
        .and_then(|()| out.flush().map_err(CliError::output));
        reported(report, at, || format!("it freed {} grain(s)", freed.len()))
    })
}

/// `sediment repair DB`: opens the store for writing (which rewrites a
/// damaged header copy from its twin and replays the WAL) and closes it.
pub fn repair(db_path: &Path, json: bool, out: &mut dyn Write) -> Result<(), CliError> {
    let before = crate::headers::bad_copies(db_path).len();
    let db = store::open(db_path, Create::Never)?;
    run_then_shutdown(db, |_| Ok(()))?;
    let after = crate::headers::bad_copies(db_path).len();
    let repaired = before - after.min(before);
    if json {
        return write_json(
            out,
            &JsonRepair {
                repaired_header_copies: repaired,
            },
        );
    }
    writeln!(
        out,
        "repaired {repaired} header cop{}; the store is closed",
        if repaired == 1 { "y" } else { "ies" }
    )
    .map_err(CliError::output)
}

/// `repair --json`.
#[derive(Serialize)]
struct JsonRepair {
    /// Header copies that did not verify before and do now.
    repaired_header_copies: usize,
}
