//! `log`, `stats` and `verify`.

use std::io::Write;
use std::path::Path;

use sediment::{CommitRecord, GrainId, SequenceId};
use serde::Serialize;

use crate::error::{describe_io, is_corruption, one_line, say, CliError};
use crate::headers;
use crate::keys;
use crate::progress::{busy, count_bar};
use crate::store::{self, parse_sequence, run_then_shutdown, Create};
use crate::wal::{self, HeaderInfo, WalName};

/// Writes `value` as one line of JSON.
pub(crate) fn write_json(out: &mut dyn Write, value: &impl Serialize) -> Result<(), CliError> {
    serde_json::to_writer(&mut *out, value)
        .map_err(|e| CliError::failure(format!("writing JSON: {e}")))?;
    writeln!(out).map_err(CliError::output)
}

fn ids(ids: &[GrainId]) -> String {
    if ids.is_empty() {
        "-".to_string()
    } else {
        ids.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// A new grain in `log --json`.
#[derive(Serialize)]
struct JsonNewGrain {
    grain: String,
    length: u32,
    crc: u32,
}

/// One line of `log --json`.
#[derive(Serialize)]
struct JsonRecord {
    sequence: u64,
    new: Vec<JsonNewGrain>,
    archived: Vec<String>,
    freed: Vec<String>,
    /// Present when the transaction set the embedded header (`null` when it
    /// cleared it).
    #[serde(skip_serializing_if = "Option::is_none")]
    embedded_header: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    checkpointed_to: Option<u64>,
}

impl From<&CommitRecord> for JsonRecord {
    fn from(record: &CommitRecord) -> Self {
        let strings = |ids: &[GrainId]| ids.iter().map(ToString::to_string).collect();
        Self {
            sequence: record.sequence.0,
            new: record
                .new_grains
                .iter()
                .map(|g| JsonNewGrain {
                    grain: g.id.to_string(),
                    length: g.length,
                    crc: g.crc,
                })
                .collect(),
            archived: strings(&record.archived),
            freed: strings(&record.freed),
            embedded_header: record
                .embedded_header
                .map(|header| header.map(|id| id.to_string())),
            checkpointed_to: record.checkpointed_to.map(|s| s.0),
        }
    }
}

fn log_line(record: &CommitRecord) -> String {
    let new = if record.new_grains.is_empty() {
        "-".to_string()
    } else {
        record
            .new_grains
            .iter()
            .map(|g| format!("{}:{}B", g.id, g.length))
            .collect::<Vec<_>>()
            .join(",")
    };
    let mut line = format!(
        "{:<6} new {new}  archived {}  freed {}",
        record.sequence,
        ids(&record.archived),
        ids(&record.freed)
    );
    if let Some(to) = record.checkpointed_to {
        line.push_str(&format!("  checkpoint-to {to}"));
    }
    match record.embedded_header {
        Some(Some(id)) => line.push_str(&format!("  header {id}")),
        Some(None) => line.push_str("  header cleared"),
        None => {}
    }
    line
}

/// `sediment log DB [--since SEQUENCE] [--json]`
pub fn log(
    db_path: &Path,
    since: Option<&str>,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let since = since.map(parse_sequence).transpose()?.unwrap_or(0);
    let db = store::open_read_only(db_path)?;
    run_then_shutdown(db, |db| {
        let last = db.last_committed().0;
        if since > last.saturating_add(1) {
            return Err(CliError::input(format!(
                "sequence {since} is in the future (the last committed sequence is {last})"
            )));
        }
        let checkpointed = db.checkpointed_to().0;
        if !json && checkpointed > 0 && since <= checkpointed {
            say!(
                "sediment: note: records through sequence {checkpointed} were dropped by a checkpoint"
            );
        }
        let records = match db.commit_log(SequenceId(since)) {
            Ok(records) => records,
            // Damage in the range fails the listing with an error naming
            // the file, the offset and the sequences lost.
            Err(sediment::Error::CommitLogDamaged(damage)) => {
                return Err(CliError::failure(format!(
                    "the commit log is damaged: {damage}; `--since {}` lists the records \
                     after them",
                    damage.last.0.saturating_add(1)
                )));
            }
            Err(err) => return Err(err.into()),
        };
        for record in records {
            if json {
                write_json(out, &JsonRecord::from(&record))?;
            } else {
                writeln!(out, "{}", log_line(&record)).map_err(CliError::output)?;
            }
        }
        out.flush().map_err(CliError::output)
    })
}

/// One basin in `stats --json`.
#[derive(Serialize)]
struct JsonBasin {
    basin: u8,
    grain_size: u64,
    strata: u32,
    grains_used: u64,
    grains_archived: u64,
    grains_free: u64,
    bytes_on_disk: u64,
}

/// One WAL file in `stats --json`.
#[derive(Serialize)]
struct JsonWalFile {
    file: String,
    bytes: u64,
    state: String,
}

/// `stats --json`.
#[derive(Serialize)]
struct JsonStats {
    directory: String,
    last_committed: u64,
    checkpointed_to: u64,
    wal_checkpointed_entry: u64,
    blobs_in_wal: u64,
    embedded_header: Option<String>,
    basins: Vec<JsonBasin>,
    wal_files: Vec<JsonWalFile>,
    index_bytes: u64,
    commit_log_bytes: u64,
    total_bytes: u64,
    wal: JsonWalCounters,
}

/// The WAL's own counters while `stats` had the store open.
#[derive(serde::Serialize)]
struct JsonWalCounters {
    live_segments: u64,
    spare_segments: u64,
    checkpoints: u64,
    checkpoint_ms: f64,
    recycled_segments: u64,
    syncs: u64,
    entries_per_sync: f64,
}

/// Describes one WAL file of a store for `stats`.
fn wal_state(dir: &Path, name: &str, bytes: u64) -> String {
    let Some(kind) = WalName::parse(name) else {
        return "not a WAL file name".into();
    };
    let id = match kind {
        WalName::Segment(id) => id,
        WalName::Recycled(_) => return "recycled: checkpointed, reusable".into(),
        WalName::Spare(_) => return "spare: unused, reusable".into(),
    };
    let file = wal::WalFile {
        name: name.to_string(),
        kind,
        path: dir.join(name),
        bytes,
    };
    match wal::scan_segment(&file, id, false, &indicatif::ProgressBar::hidden()) {
        Ok(dump) => match dump.header {
            HeaderInfo::Invalid {
                reason,
                records_follow: false,
            } => format!("unused: header never became durable ({reason}), reusable"),
            HeaderInfo::Invalid {
                reason,
                records_follow: true,
            } => format!("DAMAGED header ({reason}): valid records follow it"),
            HeaderInfo::OlderFormat { .. } => {
                "okaywal 0.2/0.3 segment: an open for writing replays and converts it".into()
            }
            HeaderInfo::Foreign { reason } => {
                format!("NOT A SEGMENT okaywal reads ({reason})")
            }
            HeaderInfo::Valid { .. } => {
                let committed = dump.count(wal::EntryStatus::Committed);
                let ids = dump
                    .entries
                    .iter()
                    .filter(|e| e.status == wal::EntryStatus::Committed)
                    .map(|e| e.id);
                let range = match (ids.clone().min(), ids.max()) {
                    (Some(low), Some(high)) if low == high => format!(" (entry {low})"),
                    (Some(low), Some(high)) => format!(" (entries {low}..={high})"),
                    _ => String::new(),
                };
                let others = dump.entries.len() - committed;
                let others = if others > 0 {
                    format!(", {others} rolled back or incomplete")
                } else {
                    String::new()
                };
                if dump.entries.is_empty() {
                    format!("segment from entry {id}: empty")
                } else {
                    format!(
                        "segment from entry {id}: {committed} committed entr{}{range}{others}",
                        if committed == 1 { "y" } else { "ies" }
                    )
                }
            }
        },
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            "gone: recycled while the store was open".into()
        }
        Err(err) => format!("unreadable: {}", describe_io(&err)),
    }
}

/// `sediment stats DB [--json]`
pub fn stats(db_path: &Path, json: bool, out: &mut dyn Write) -> Result<(), CliError> {
    let db = store::open_read_only(db_path)?;
    let (stats, header, wal_files, wal) = run_then_shutdown(db, |db| {
        store::warn_if_commit_log_damaged(db);
        let stats = db.stats()?;
        let wal = db.wal_stats().unwrap_or_default();
        let wal_files: Vec<JsonWalFile> = stats
            .wal_files
            .iter()
            .map(|(name, bytes)| JsonWalFile {
                file: name.clone(),
                bytes: *bytes,
                state: wal_state(db_path, name, *bytes),
            })
            .collect();
        Ok((stats, db.embedded_header(), wal_files, wal))
    })?;
    let report = JsonStats {
        directory: db_path.display().to_string(),
        last_committed: stats.last_committed,
        checkpointed_to: stats.checkpointed_to,
        wal_checkpointed_entry: stats.wal_checkpointed_entry,
        blobs_in_wal: stats.blobs_in_wal,
        embedded_header: header.map(|id| id.to_string()),
        basins: stats
            .basins
            .iter()
            .map(|b| JsonBasin {
                basin: b.basin,
                grain_size: b.grain_size,
                strata: b.strata,
                grains_used: b.grains_used,
                grains_archived: b.grains_archived,
                grains_free: b.grains_free,
                bytes_on_disk: b.bytes_on_disk,
            })
            .collect(),
        wal_files,
        index_bytes: stats.index_bytes,
        commit_log_bytes: stats.commit_log_bytes,
        total_bytes: stats.total_bytes(),
        wal: JsonWalCounters {
            live_segments: wal.live_segments,
            spare_segments: wal.spare_segments,
            checkpoints: wal.checkpoints,
            checkpoint_ms: wal.checkpoint_time.as_secs_f64() * 1000.0,
            recycled_segments: wal.recycled_segments,
            syncs: wal.syncs,
            entries_per_sync: wal.entries_per_sync(),
        },
    };
    if json {
        return write_json(out, &report);
    }
    print_stats(&report, out).map_err(CliError::output)
}

fn print_stats(report: &JsonStats, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(out, "store directory: {}", report.directory)?;
    writeln!(
        out,
        "last committed sequence {}, checkpointed to {}, WAL checkpointed through entry {}, {} blob(s) only in the WAL",
        report.last_committed, report.checkpointed_to, report.wal_checkpointed_entry, report.blobs_in_wal
    )?;
    writeln!(
        out,
        "embedded header: {}",
        report.embedded_header.as_deref().unwrap_or("none")
    )?;
    if report.basins.is_empty() {
        writeln!(out, "no strata yet")?;
    } else {
        writeln!(
            out,
            "{:>5} {:>10} {:>6} {:>10} {:>10} {:>10} {:>14}",
            "basin", "grain size", "strata", "used", "archived", "free", "bytes on disk"
        )?;
        for b in &report.basins {
            writeln!(
                out,
                "{:>5} {:>10} {:>6} {:>10} {:>10} {:>10} {:>14}",
                b.basin,
                b.grain_size,
                b.strata,
                b.grains_used,
                b.grains_archived,
                b.grains_free,
                b.bytes_on_disk
            )?;
        }
    }
    writeln!(out, "WAL files:")?;
    if report.wal_files.is_empty() {
        writeln!(out, "  none")?;
    }
    for file in &report.wal_files {
        writeln!(
            out,
            "  {:<18} {:>10} bytes  {}",
            file.file, file.bytes, file.state
        )?;
    }
    let wal = &report.wal;
    writeln!(
        out,
        "WAL while open: {} live segment(s), {} spare(s); {} checkpoint(s) in {:.1} ms, {} segment(s) recycled, {} sync(s)",
        wal.live_segments, wal.spare_segments, wal.checkpoints, wal.checkpoint_ms, wal.recycled_segments, wal.syncs
    )?;
    writeln!(
        out,
        "index {} bytes, commit log {} bytes, total {} bytes",
        report.index_bytes, report.commit_log_bytes, report.total_bytes
    )?;
    out.flush()
}

/// One problem in `verify --json`.
#[derive(Serialize)]
struct JsonProblem {
    location: String,
    grain: Option<String>,
    description: String,
}

/// `verify --json`.
#[derive(Serialize)]
struct JsonVerify {
    ok: bool,
    grains_checked: u64,
    strata_checked: u64,
    commit_records_checked: u64,
    problems: Vec<JsonProblem>,
}

fn print_verify(report: &JsonVerify, json: bool, out: &mut dyn Write) -> Result<(), CliError> {
    if json {
        return write_json(out, report);
    }
    let mut print = || -> std::io::Result<()> {
        for problem in &report.problems {
            match &problem.grain {
                Some(grain) => writeln!(
                    out,
                    "problem: {}: grain {grain}: {}",
                    problem.location, problem.description
                )?,
                None => writeln!(
                    out,
                    "problem: {}: {}",
                    problem.location, problem.description
                )?,
            }
        }
        writeln!(
            out,
            "checked {} grain(s) in {} stratum file(s) and {} commit record(s): {}",
            report.grains_checked,
            report.strata_checked,
            report.commit_records_checked,
            match report.problems.len() {
                0 => "no problems".to_string(),
                1 => "1 problem".to_string(),
                n => format!("{n} problems"),
            }
        )?;
        out.flush()
    };
    print().map_err(CliError::output)
}

/// `sediment verify DB [--progress] [--json]`
pub fn verify(
    db_path: &Path,
    progress: bool,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    store::prepare(db_path, Create::Never)?;
    // Opening repairs a bad header copy from its twin: look first.
    let bad_copies: Vec<JsonProblem> = headers::bad_copies(db_path)
        .into_iter()
        .map(|bad| JsonProblem {
            location: bad.location,
            grain: None,
            description: bad.description,
        })
        .collect();
    // Read-only, and past WAL damage: the check reports the damage (and
    // the blobs it took) instead of stopping at it, and writes nothing.
    let config = keys::store_config(db_path)
        .read_only(true)
        .wal(|wal| wal.recovery_mode(okaywal::RecoveryMode::SkipCorrupted));
    let opened = busy("opening the store", || config.open());
    let db = match opened {
        Ok(db) => db,
        Err(err) if is_corruption(&err) => {
            return open_failure_as_problem(&err, bad_copies, json, out)
        }
        Err(err) => return Err(err.into()),
    };
    let bar = if progress {
        count_bar("verifying grains")
    } else {
        indicatif::ProgressBar::hidden()
    };
    let result = db.verify_report(|done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    // Closed even when problems were found, but reported first.
    let shutdown = db.shutdown();
    let report = result?;
    let mut problems = bad_copies;
    let already: Vec<String> = problems.iter().map(|p| p.location.clone()).collect();
    problems.extend(
        report
            .problems
            .iter()
            .filter(|p| !already.contains(&p.location))
            .map(|p| JsonProblem {
                location: p.location.clone(),
                grain: p.grain.map(|g| g.to_string()),
                description: one_line(&p.description),
            }),
    );
    let report = JsonVerify {
        ok: problems.is_empty(),
        grains_checked: report.grains_checked,
        strata_checked: report.strata_checked,
        commit_records_checked: report.commit_records_checked,
        problems,
    };
    unless_problems_found(print_verify(&report, json, out), report.ok)?;
    match shutdown {
        Err(err) if report.ok => Err(err.into()),
        Err(err) => {
            say!(
                "sediment: {}",
                one_line(&CliError::from(err).message.unwrap_or_default())
            );
            Err(CliError::problems())
        }
        Ok(()) if report.ok => Ok(()),
        Ok(()) => Err(CliError::problems()),
    }
}

/// For `verify`: a store that cannot even be opened because a file is
/// damaged is a verification problem (exit 1), reported with its location.
fn open_failure_as_problem(
    err: &sediment::Error,
    mut problems: Vec<JsonProblem>,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let (location, description) = match err {
        sediment::Error::Corrupt { path, what } => (path.display().to_string(), one_line(what)),
        sediment::Error::ChecksumMismatch {
            grain,
            path,
            offset,
        } => (
            format!("{} offset {offset}", path.display()),
            format!("grain {grain}: checksum mismatch"),
        ),
        other => ("store".to_string(), one_line(&other.to_string())),
    };
    problems.push(JsonProblem {
        location,
        grain: None,
        description: format!("the store cannot be opened: {description}"),
    });
    let report = JsonVerify {
        ok: false,
        grains_checked: 0,
        strata_checked: 0,
        commit_records_checked: 0,
        problems,
    };
    unless_problems_found(print_verify(&report, json, out), report.ok)?;
    Err(CliError::problems())
}

/// `verify`'s exit when printing its report failed: a reader that went
/// away (`sediment verify db | head`, which exits 0 for a failed write to
/// a closed pipe) does not turn problems found into success.
fn unless_problems_found(printed: Result<(), CliError>, ok: bool) -> Result<(), CliError> {
    match printed {
        Err(err) if !ok && err.code == 0 => Err(CliError::problems()),
        printed => printed,
    }
}
