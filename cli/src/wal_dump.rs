//! `wal-dump`: every segment of an okaywal directory, read-only.

use std::io::{self, Write};
use std::path::Path;

use serde::Serialize;

use crate::error::{describe_io, CliError};
use crate::progress::bytes_bar;
use crate::store::require_dir;
use crate::wal::{self, EntryStatus, HeaderInfo, SegmentDump, WalName};

/// Entries with more chunks than this are summed up on their line.
const LISTED_CHUNKS: usize = 16;

/// A reusable file in the dump.
#[derive(Serialize)]
struct Reusable {
    file: String,
    bytes: u64,
    kind: &'static str,
}

/// Something recovery would report about the directory.
#[derive(Serialize)]
struct Problem {
    file: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    offset: Option<u64>,
    description: String,
}

/// The whole dump (`--json`).
#[derive(Serialize)]
struct Dump {
    directory: String,
    segments: Vec<SegmentDump>,
    reusable: Vec<Reusable>,
    /// What recovery (`Configuration::inspect`, the walk an open makes over
    /// the whole log, across segments) would report: an open in the
    /// default recovery mode fails over any of them. Empty for a healthy
    /// log; a torn tail is no problem.
    problems: Vec<Problem>,
}

/// Takes a shared lock on each lock file in `dir` (`sediment.lock` of a
/// store, `okaywal.lock` of its log), as every read-only open does, so
/// that no writer runs while the files are read; waits up to 2 s for one
/// that does. A missing lock file is not created: nothing is written.
fn lock_shared(dir: &Path) -> Result<Vec<std::fs::File>, CliError> {
    let mut locks = Vec::new();
    for name in ["sediment.lock", "okaywal.lock"] {
        let path = dir.join(name);
        let file = match std::fs::File::open(&path) {
            Ok(file) => file,
            Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
            Err(err) => return Err(CliError::io("cannot open", &path, &err)),
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            match file.try_lock_shared() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(CliError::failure(format!(
                        "{} is open for writing by another process ({} is locked): wal-dump \
                         reads a log only while no writer runs",
                        dir.display(),
                        path.display()
                    )))
                }
                Err(std::fs::TryLockError::Error(err)) => {
                    return Err(CliError::io("cannot lock", &path, &err))
                }
            }
        }
        locks.push(file);
    }
    Ok(locks)
}

/// `sediment wal-dump DIR [--records] [--json]`
pub fn wal_dump(
    dir: &Path,
    records: bool,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    require_dir(dir)?;
    // Held until the dump is done: a writer running meanwhile would show
    // half-written records as damage.
    let _locks = lock_shared(dir)?;
    let files = wal::list(dir).map_err(|e| CliError::io("cannot list", dir, &e))?;
    if files.is_empty() {
        return Err(CliError::input(format!(
            "{}: not an okaywal directory (no wal-* files)",
            dir.display()
        )));
    }
    let total: u64 = files
        .iter()
        .filter(|f| matches!(f.kind, WalName::Segment(_)))
        .map(|f| f.bytes)
        .sum();
    let bar = bytes_bar(total, "reading segments");
    let mut dump = Dump {
        directory: dir.display().to_string(),
        segments: Vec::new(),
        reusable: Vec::new(),
        problems: Vec::new(),
    };
    for file in &files {
        match file.kind {
            WalName::Segment(id) => {
                let segment = wal::scan_segment(file, id, records, &bar).map_err(|e| {
                    match crate::keys::key_problem(&e) {
                        Some(message) => CliError::input(message),
                        None => CliError::failure(format!(
                            "reading {}: {}",
                            file.path.display(),
                            describe_io(&e)
                        )),
                    }
                })?;
                dump.segments.push(segment);
            }
            WalName::Recycled(_) | WalName::Spare(_) => dump.reusable.push(Reusable {
                file: file.name.clone(),
                bytes: file.bytes,
                kind: if matches!(file.kind, WalName::Spare(_)) {
                    "spare"
                } else {
                    "recycled"
                },
            }),
        }
    }
    bar.finish_and_clear();
    // Each segment above is walked on its own; recovery also checks the
    // segments against one another (a segment's header records where the
    // one before it ended) and decides where each one ends.
    let inspection = crate::keys::wal_config(dir).inspect().map_err(|e| {
        CliError::failure(format!(
            "checking {} as recovery would: {}",
            dir.display(),
            describe_io(&e)
        ))
    })?;
    for inspected in &inspection.segments {
        if let Some(segment) = dump.segments.iter_mut().find(|s| s.id == inspected.id) {
            let walked = segment.end.as_ref().map(|end| end.offset);
            if walked.is_some_and(|walked| inspected.end < walked) {
                segment.recovery_end = Some(inspected.end);
            }
        }
    }
    dump.problems = inspection
        .problems
        .iter()
        .map(|problem| Problem {
            file: problem.path.file_name().map_or_else(
                || problem.path.display().to_string(),
                |name| name.to_string_lossy().into_owned(),
            ),
            offset: problem.offset,
            // The file is named beside it already.
            description: problem
                .description
                .strip_prefix(&format!("{}: ", problem.path.display()))
                .unwrap_or(&problem.description)
                .to_string(),
        })
        .collect();
    if json {
        serde_json::to_writer(&mut *out, &dump)
            .map_err(|e| CliError::failure(format!("writing JSON: {e}")))?;
        writeln!(out).map_err(CliError::output)?;
        return out.flush().map_err(CliError::output);
    }
    print(&dump, out).map_err(CliError::output)
}

fn version_info(hex: &str, utf8: Option<&str>) -> String {
    if hex.is_empty() {
        return "none".to_string();
    }
    let bytes = hex.len() / 2;
    match utf8 {
        Some(text) if !text.chars().any(char::is_control) => {
            format!("{bytes} byte(s), hex {hex}, utf-8 {text:?}")
        }
        _ => format!("{bytes} byte(s), hex {hex}"),
    }
}

fn print(dump: &Dump, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out, "directory {}", dump.directory)?;
    for segment in &dump.segments {
        writeln!(out, "segment {} ({} bytes)", segment.file, segment.bytes)?;
        match &segment.header {
            HeaderInfo::Valid {
                first_entry_id,
                format_version,
                version_info_hex,
                version_info_utf8,
                previous,
            } => {
                writeln!(
                    out,
                    "  header: first entry {first_entry_id}, format version {format_version}, version info {}",
                    version_info(version_info_hex, version_info_utf8.as_deref())
                )?;
                if let Some(previous) = previous {
                    writeln!(
                        out,
                        "  the segment before it, {}, ended at offset {} when this one started",
                        previous.id, previous.end
                    )?;
                }
            }
            HeaderInfo::OlderFormat {
                version_info_hex,
                version_info_utf8,
            } => {
                writeln!(
                    out,
                    "  header: okaywal 0.2/0.3 format, version info {}",
                    version_info(version_info_hex, version_info_utf8.as_deref())
                )?;
                writeln!(
                    out,
                    "  a segment of the older format: an open for writing replays its committed \
                     entries and converts the log (its records are not listed here)"
                )?;
                continue;
            }
            HeaderInfo::Foreign { reason } => {
                writeln!(out, "  header: NOT A SEGMENT okaywal reads ({reason})")?;
                writeln!(
                    out,
                    "  okaywal refuses to open this log while the file is here, and never \
                     reuses it: move it away if it belongs to something else"
                )?;
                continue;
            }
            HeaderInfo::Invalid {
                reason,
                records_follow,
            } => {
                writeln!(out, "  header: INVALID ({reason})")?;
                if *records_follow {
                    writeln!(
                        out,
                        "  valid records follow the header: it was damaged after being written (okaywal will refuse to open this log)"
                    )?;
                } else {
                    writeln!(
                        out,
                        "  no valid record follows: the header never became durable, the file holds no entries and is reusable"
                    )?;
                }
                continue;
            }
        }
        for record in &segment.records {
            let crc = match record.data_crc_ok {
                Some(true) => ", data crc ok",
                Some(false) => ", DATA CRC MISMATCH",
                None => "",
            };
            writeln!(
                out,
                "  record at {}: {} entry {} length {} durable mark {}{crc}",
                record.offset, record.kind, record.entry_id, record.length, record.durable_mark
            )?;
        }
        for entry in &segment.entries {
            let chunks = if entry.chunks.is_empty() {
                "no chunks".to_string()
            } else if entry.chunks.len() > LISTED_CHUNKS {
                // One line per entry stays readable: a summary, with the
                // chunks that fail their CRC (`--json` lists every chunk).
                let bytes: u64 = entry.chunks.iter().map(|c| u64::from(c.length)).sum();
                let bad: Vec<String> = entry
                    .chunks
                    .iter()
                    .filter(|c| !c.crc_ok)
                    .map(|c| format!("offset {}", c.offset))
                    .collect();
                let state = if bad.is_empty() {
                    "all ok".to_string()
                } else {
                    format!("CRC MISMATCH at {}", bad.join(", "))
                };
                format!("{} chunk(s) of {bytes} bytes, {state}", entry.chunks.len())
            } else {
                let list = entry
                    .chunks
                    .iter()
                    .map(|c| {
                        format!(
                            "{} bytes {}",
                            c.length,
                            if c.crc_ok { "ok" } else { "CRC MISMATCH" }
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                format!("{} chunk(s) [{list}]", entry.chunks.len())
            };
            let detail = entry
                .detail
                .as_deref()
                .map(|d| format!(" ({d})"))
                .unwrap_or_default();
            writeln!(
                out,
                "  entry {}: {}{detail}, {chunks}",
                entry.id,
                entry.status.label()
            )?;
        }
        if let Some(end) = &segment.end {
            let damage_at_end = end.damage.as_ref().filter(|d| d.offset == end.offset);
            if let Some(damage) = &end.damage {
                writeln!(
                    out,
                    "  DAMAGE at offset {} ({}): records synced after it follow, so this is \
                     no torn tail, and recovery refuses the log (sediment verify names the \
                     transactions it holds)",
                    damage.offset, damage.reason
                )?;
            }
            // A problem recovery finds where the walk ended: the records
            // there were written whole once (a later segment says so).
            let problem_at_end = dump.problems.iter().any(|p| {
                p.file == segment.file && p.offset.is_some_and(|offset| offset >= end.offset)
            });
            if damage_at_end.is_some() {
                // Said above: the walk ends at the damage.
            } else if end.torn && problem_at_end {
                writeln!(
                    out,
                    "  records end at offset {} ({}), where recovery finds a problem (below): \
                     no torn tail",
                    end.offset, end.reason
                )?;
            } else if end.torn {
                writeln!(out, "  torn tail at offset {} ({})", end.offset, end.reason)?;
                if !end.commits_past_end.is_empty() {
                    let ids: Vec<String> =
                        end.commits_past_end.iter().map(u64::to_string).collect();
                    writeln!(
                        out,
                        "  BUT the commit records of entr{} {} verify past it: recovery drops \
                         {} (a power cut while {} written leaves this; otherwise {} damaged \
                         after committing)",
                        if ids.len() == 1 { "y" } else { "ies" },
                        ids.join(", "),
                        if ids.len() == 1 { "it" } else { "them" },
                        if ids.len() == 1 {
                            "it was being"
                        } else {
                            "they were being"
                        },
                        if ids.len() == 1 {
                            "it was"
                        } else {
                            "they were"
                        },
                    )?;
                }
            } else {
                writeln!(
                    out,
                    "  records end at the end of the file (offset {})",
                    end.offset
                )?;
            }
        }
        if let Some(recovery_end) = segment.recovery_end {
            writeln!(
                out,
                "  recovery ends this segment at offset {recovery_end}: the records past it \
                 are not replayed"
            )?;
        }
        writeln!(
            out,
            "  {} committed, {} rolled back, {} incomplete",
            segment.count(EntryStatus::Committed),
            segment.count(EntryStatus::RolledBack),
            segment.count(EntryStatus::Incomplete)
        )?;
    }
    if dump.segments.is_empty() {
        writeln!(out, "no segments")?;
    }
    if dump.reusable.is_empty() {
        writeln!(out, "reusable: none")?;
    } else {
        let list = dump
            .reusable
            .iter()
            .map(|r| format!("{} ({} bytes, {})", r.file, r.bytes, r.kind))
            .collect::<Vec<_>>()
            .join(", ");
        writeln!(out, "reusable: {list}")?;
    }
    if dump.problems.is_empty() {
        writeln!(out, "recovery: no problems")?;
    } else {
        writeln!(
            out,
            "recovery: {} PROBLEM(S); an open fails over them unless told how to recover \
             (sediment --recovery, okaywal's RecoveryMode):",
            dump.problems.len()
        )?;
        for problem in &dump.problems {
            match problem.offset {
                Some(offset) => writeln!(
                    out,
                    "  {} offset {offset}: {}",
                    problem.file, problem.description
                )?,
                None => writeln!(out, "  {}: {}", problem.file, problem.description)?,
            }
        }
    }
    out.flush()
}
