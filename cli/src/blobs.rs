//! `put`, `get`, `archive` and `checkpoint`.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use indicatif::ProgressBar;
use sediment::{GrainId, SequenceId, DEFAULT_MAX_BLOB_BYTES};

use crate::error::{describe_io, not_allocated, CliError};
use crate::progress::{busy, bytes_bar};
use crate::store::{self, parse_grain, parse_sequence, run_then_shutdown, Create};

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
    let mut piece = vec![0; PIECE];
    loop {
        let n = match reader.read(&mut piece) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(CliError::io("cannot read", name, &e)),
        };
        data.extend_from_slice(&piece[..n]);
        bar.inc(n as u64);
        if data.len() as u64 > DEFAULT_MAX_BLOB_BYTES {
            return Err(CliError::input(format!(
                "{}: more than the largest blob ({DEFAULT_MAX_BLOB_BYTES} bytes)",
                name.display()
            )));
        }
    }
    Ok(data)
}

/// `sediment put DB FILE...`
pub fn put(db_path: &Path, files: &[PathBuf], out: &mut dyn Write) -> Result<(), CliError> {
    let total = check_inputs(files)?;
    let db = store::open(db_path, Create::IfNewOrEmpty)?;
    run_then_shutdown(db, |db| {
        let bar = bytes_bar(total, "storing");
        let mut tx = db.begin_transaction()?;
        let mut ids = Vec::with_capacity(files.len());
        for file in files {
            let data = read_input(file, &bar)?;
            ids.push(tx.write(&data)?);
        }
        bar.finish_and_clear();
        busy("committing", || tx.commit())?;
        for id in ids {
            writeln!(out, "{id}").map_err(CliError::output)?;
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
    let mut piece = vec![0; PIECE];
    loop {
        let n = match reader.read(&mut piece) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                // The reader's error does not say where the grain is;
                // reading it whole again gives the library's full error.
                return Err(match db.get(id) {
                    Err(err) => CliError::from(err),
                    Ok(_) => CliError::failure(format!(
                        "the store is damaged: grain {id} failed its checksum"
                    )),
                });
            }
            Err(e) => {
                return Err(CliError::failure(format!(
                    "reading grain {id}: {}",
                    describe_io(&e)
                )))
            }
        };
        sink.write_all(&piece[..n])?;
        bar.inc(n as u64);
    }
    bar.finish_and_clear();
    sink.finish()
}

/// `sediment archive DB GRAIN...`
pub fn archive(db_path: &Path, grains: &[String], out: &mut dyn Write) -> Result<(), CliError> {
    let ids = grains
        .iter()
        .map(|g| parse_grain(g))
        .collect::<Result<Vec<_>, _>>()?;
    let db = store::open(db_path, Create::Never)?;
    run_then_shutdown(db, |db| {
        let mut tx = db.begin_transaction()?;
        for id in &ids {
            tx.archive(*id)?;
        }
        let sequence = busy("committing", || tx.commit())?;
        writeln!(
            out,
            "archived {} grain(s) in sequence {sequence}; `sediment checkpoint {} {sequence}` frees them",
            ids.len(),
            db_path.display()
        )
        .map_err(CliError::output)
    })
}

/// `sediment checkpoint DB SEQUENCE`
pub fn checkpoint(db_path: &Path, sequence: &str, out: &mut dyn Write) -> Result<(), CliError> {
    let to = parse_sequence(sequence)?;
    let db = store::open(db_path, Create::Never)?;
    run_then_shutdown(db, |db| {
        let current = db.checkpointed_to();
        if to <= current.0 {
            // A checkpoint never moves back: committing one would only add
            // a no-op transaction and a message naming the wrong sequence.
            return writeln!(
                out,
                "already checkpointed to sequence {current}: nothing to do"
            )
            .map_err(CliError::output);
        }
        let mut tx = db.begin_transaction()?;
        tx.checkpoint_to(SequenceId(to))?;
        let at = busy("committing", || tx.commit())?;
        let freed = db
            .commit_log(at)?
            .find(|record| record.sequence == at)
            .map_or(0, |record| record.freed.len());
        writeln!(
            out,
            "checkpointed to sequence {to} in sequence {at}: freed {freed} grain(s)"
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
