//! Reading okaywal segment files directly, read-only, without opening the
//! log (which would recover it and write): okaywal's own inspection
//! (`Configuration::inspect_segment`, the scanner recovery uses) lists the
//! records; this module groups them into entries for `wal-dump`.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use indicatif::ProgressBar;
use okaywal::{HeaderStatus, TornRecord};
use serde::Serialize;

/// What a `wal-*` file name says it is (okaywal's parser).
pub use okaywal::LogFileName as WalName;

/// A `wal-*` file found in a directory.
#[derive(Debug, Clone)]
pub struct WalFile {
    /// Its name.
    pub name: String,
    /// What the name says.
    pub kind: WalName,
    /// Its full path.
    pub path: PathBuf,
    /// Its length when listed.
    pub bytes: u64,
}

/// Lists the WAL files of `dir`, segments first in id order, then the
/// reusable ones.
pub fn list(dir: &Path) -> io::Result<Vec<WalFile>> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let Some(kind) = WalName::parse(&name) else {
            continue;
        };
        let metadata = match entry.metadata() {
            Ok(metadata) => metadata,
            // Renamed or recycled by a running log meanwhile.
            Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
            Err(err) => return Err(err),
        };
        if !metadata.is_file() {
            continue;
        }
        files.push(WalFile {
            name,
            kind,
            path: entry.path(),
            bytes: metadata.len(),
        });
    }
    files.sort_by_key(|f| f.kind);
    Ok(files)
}

/// A segment's header.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum HeaderInfo {
    /// The header verifies and names this segment.
    Valid {
        /// The segment's first entry id (= the id in its name).
        first_entry_id: u64,
        /// The format version byte.
        format_version: u8,
        /// The user's version info, as hex.
        version_info_hex: String,
        /// The same bytes as text, if they are UTF-8.
        version_info_utf8: Option<String>,
        /// The segment before this one and where it ended, as this header
        /// records them (when that segment was closed as this one started).
        #[serde(skip_serializing_if = "Option::is_none")]
        previous: Option<PreviousSegment>,
    },
    /// A segment written by okaywal 0.2 or 0.3: an open for writing
    /// replays its committed entries and converts the log. Its records are
    /// not listed.
    OlderFormat {
        /// The user's version info, as hex.
        version_info_hex: String,
        /// The same bytes as text, if they are UTF-8.
        version_info_utf8: Option<String>,
    },
    /// Not a segment okaywal reads (another program's file, or another
    /// version's format): an open refuses the log while it is there.
    Foreign {
        /// What the file begins with.
        reason: String,
    },
    /// The header does not verify or names another segment.
    Invalid {
        /// Why.
        reason: String,
        /// A valid record follows the header: the header was damaged after
        /// being written (okaywal refuses to open such a log). Otherwise
        /// the header never became durable and the file holds no entries.
        records_follow: bool,
    },
}

/// The segment a header names as the one before it.
#[derive(Debug, Clone, Serialize)]
pub struct PreviousSegment {
    /// Its id.
    pub id: u64,
    /// The offset where its records ended.
    pub end: u64,
}

/// One record of a segment.
#[derive(Debug, Clone, Serialize)]
pub struct RecordInfo {
    /// Offset of its header in the file.
    pub offset: u64,
    /// `chunk`, `commit`, `rollback` or `padding`.
    pub kind: &'static str,
    /// The entry it belongs to.
    pub entry_id: u64,
    /// Data length (chunk), chunk count (commit), 0 (rollback) or filler
    /// bytes (padding).
    pub length: u32,
    /// The writer's durable mark when the record was written.
    pub durable_mark: u64,
    /// For chunks: whether the data CRC matches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_crc_ok: Option<bool>,
}

/// One chunk of an entry.
#[derive(Debug, Clone, Serialize)]
pub struct ChunkInfo {
    /// Offset of its record header.
    pub offset: u64,
    /// Data length.
    pub length: u32,
    /// Whether the data CRC matches.
    pub crc_ok: bool,
}

/// What became of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryStatus {
    /// A verified commit record counts exactly its chunks, all of which
    /// verify: recovery replays it.
    Committed,
    /// A rollback record abandons it.
    RolledBack,
    /// No usable commit record: recovery discards it.
    Incomplete,
}

impl EntryStatus {
    /// Text for humans.
    pub fn label(self) -> &'static str {
        match self {
            EntryStatus::Committed => "committed",
            EntryStatus::RolledBack => "rolled back",
            EntryStatus::Incomplete => "incomplete",
        }
    }
}

/// One entry: its records grouped.
#[derive(Debug, Clone, Serialize)]
pub struct EntryInfo {
    /// The entry id.
    pub id: u64,
    /// Its chunks, in file order.
    pub chunks: Vec<ChunkInfo>,
    /// What became of it.
    pub status: EntryStatus,
    /// Why it is incomplete, or anything odd about it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// Where the walk over the records stopped.
#[derive(Debug, Clone, Serialize)]
pub struct EndInfo {
    /// Offset of the first byte not part of a verified record.
    pub offset: u64,
    /// False when the records end exactly at the end of the file.
    pub torn: bool,
    /// Why the walk stopped there.
    pub reason: String,
    /// Entries whose commit record verifies past `offset`: recovery drops
    /// them (a power cut while they were written, or damage after they
    /// committed, which the log cannot tell apart).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub commits_past_end: Vec<u64>,
    /// Bytes that were durable once (a record synced after them follows)
    /// and no longer verify: damage, not a torn tail. At `offset` when the
    /// walk stopped there; earlier when a committed chunk's data fails its
    /// CRC. Recovery in its default mode refuses such a log.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub damage: Option<DamageInfo>,
}

/// Where a segment is damaged, and how.
#[derive(Debug, Clone, Serialize)]
pub struct DamageInfo {
    /// Offset of the damaged bytes.
    pub offset: u64,
    /// What does not verify there.
    pub reason: String,
}

/// Everything `wal-dump` shows about one segment file.
#[derive(Debug, Clone, Serialize)]
pub struct SegmentDump {
    /// File name.
    pub file: String,
    /// The id in the file name.
    pub id: u64,
    /// File length.
    pub bytes: u64,
    /// The header.
    pub header: HeaderInfo,
    /// Every record, when asked for.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub records: Vec<RecordInfo>,
    /// The entries, by id.
    pub entries: Vec<EntryInfo>,
    /// Where the records end (absent when the header is invalid).
    pub end: Option<EndInfo>,
    /// Where recovery ends the segment, when that is before `end`: the
    /// entries whose records lie past it are not replayed (see
    /// `Configuration::inspect`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovery_end: Option<u64>,
}

impl SegmentDump {
    /// Entries with this status.
    pub fn count(&self, status: EntryStatus) -> usize {
        self.entries.iter().filter(|e| e.status == status).count()
    }
}

#[derive(Debug, Default)]
struct EntryBuilder {
    chunks: Vec<ChunkInfo>,
    /// The chunk count of its first commit record, if any.
    commit: Option<u32>,
    rolled_back: bool,
    /// Records seen after the commit or rollback record.
    after_end: usize,
}

impl EntryBuilder {
    fn ended(&self) -> bool {
        self.commit.is_some() || self.rolled_back
    }

    fn finish(self, id: u64) -> EntryInfo {
        let bad_crcs = self.chunks.iter().filter(|c| !c.crc_ok).count();
        let mut notes = Vec::new();
        let status = if self.rolled_back {
            EntryStatus::RolledBack
        } else if let Some(count) = self.commit {
            if count as usize != self.chunks.len() {
                notes.push(format!(
                    "its commit record counts {count} chunks but {} precede it",
                    self.chunks.len()
                ));
                EntryStatus::Incomplete
            } else if bad_crcs > 0 {
                notes.push(format!("{bad_crcs} chunk(s) fail their data CRC"));
                EntryStatus::Incomplete
            } else {
                EntryStatus::Committed
            }
        } else {
            notes.push("no commit record".to_string());
            if bad_crcs > 0 {
                notes.push(format!("{bad_crcs} chunk(s) fail their data CRC"));
            }
            EntryStatus::Incomplete
        };
        if self.after_end > 0 {
            notes.push(format!(
                "{} record(s) after its commit or rollback record were ignored",
                self.after_end
            ));
        }
        EntryInfo {
            id,
            chunks: self.chunks,
            status,
            detail: (!notes.is_empty()).then(|| notes.join("; ")),
        }
    }
}

/// Reads one segment file with okaywal's scanner: its header, then every
/// record from offset 512 until one does not verify. Opens the file
/// read-only and writes nothing. `progress` advances by the file's length.
pub fn scan_segment(
    file: &WalFile,
    id: u64,
    keep_records: bool,
    progress: &ProgressBar,
) -> io::Result<SegmentDump> {
    let base = progress.position();
    let directory = file.path.parent().unwrap_or(Path::new("."));
    let listing = crate::keys::wal_config(directory).inspect_segment(id)?;
    let len = listing.len;
    let mut dump = SegmentDump {
        file: file.name.clone(),
        id,
        bytes: len,
        header: HeaderInfo::Invalid {
            reason: String::new(),
            records_follow: false,
        },
        records: Vec::new(),
        entries: Vec::new(),
        end: None,
        recovery_end: None,
    };
    match listing.header {
        HeaderStatus::Valid {
            first_entry_id,
            format_version,
            version_info,
            previous,
        } => {
            dump.header = HeaderInfo::Valid {
                first_entry_id,
                format_version,
                version_info_hex: hex(&version_info),
                version_info_utf8: String::from_utf8(version_info).ok(),
                previous: previous.map(|(id, end)| PreviousSegment { id, end }),
            };
        }
        HeaderStatus::Invalid {
            reason,
            records_follow,
        } => {
            dump.header = HeaderInfo::Invalid {
                reason,
                records_follow,
            };
            progress.set_position(base + len);
            return Ok(dump);
        }
        HeaderStatus::OlderFormat { version_info } => {
            dump.header = HeaderInfo::OlderFormat {
                version_info_hex: hex(&version_info),
                version_info_utf8: String::from_utf8(version_info).ok(),
            };
            progress.set_position(base + len);
            return Ok(dump);
        }
        HeaderStatus::Foreign { reason } => {
            dump.header = HeaderInfo::Foreign { reason };
            progress.set_position(base + len);
            return Ok(dump);
        }
        other => {
            dump.header = HeaderInfo::Foreign {
                reason: format!("{other:?}"),
            };
            progress.set_position(base + len);
            return Ok(dump);
        }
    }

    let mut entries: BTreeMap<u64, EntryBuilder> = BTreeMap::new();
    for record in &listing.records {
        match record.kind {
            // Filler before a large chunk: no part of any entry.
            okaywal::RecordType::Padding => {}
            okaywal::RecordType::Chunk => {
                let entry = entries.entry(record.entry_id).or_default();
                if entry.ended() {
                    entry.after_end += 1;
                } else {
                    entry.chunks.push(ChunkInfo {
                        offset: record.offset,
                        length: record.length,
                        crc_ok: record.crc_ok.unwrap_or(false),
                    });
                }
            }
            okaywal::RecordType::Commit => {
                let entry = entries.entry(record.entry_id).or_default();
                if entry.ended() {
                    entry.after_end += 1;
                } else {
                    entry.commit = Some(record.length);
                }
            }
            okaywal::RecordType::Rollback => {
                let entry = entries.entry(record.entry_id).or_default();
                if entry.ended() {
                    entry.after_end += 1;
                } else {
                    entry.rolled_back = true;
                }
            }
            _ => {}
        }
        if keep_records {
            dump.records.push(RecordInfo {
                offset: record.offset,
                kind: record.kind.name(),
                entry_id: record.entry_id,
                length: record.length,
                durable_mark: record.durable_mark,
                data_crc_ok: record.crc_ok,
            });
        }
    }
    progress.set_position(base + len);
    dump.entries = entries
        .into_iter()
        .map(|(id, builder)| builder.finish(id))
        .collect();
    let damage = listing.damage;
    dump.end = listing.end.map(|end| match end.torn {
        None => EndInfo {
            offset: end.offset,
            torn: false,
            reason: "end of file".into(),
            commits_past_end: Vec::new(),
            damage: None,
        },
        Some(torn) => EndInfo {
            offset: end.offset,
            torn: true,
            reason: torn_reason(torn, id, len - end.offset),
            commits_past_end: end.commits_past_end,
            damage: None,
        },
    });
    if let (Some(end), Some((offset, reason))) = (dump.end.as_mut(), damage) {
        end.damage = Some(DamageInfo { offset, reason });
    }
    Ok(dump)
}

/// Why the records end where they do, for a reader of the dump.
fn torn_reason(torn: TornRecord, id: u64, bytes_left: u64) -> String {
    match torn {
        TornRecord::Unwritten => "unwritten space".into(),
        TornRecord::BadChecksum => {
            "record header checksum mismatch: torn, stale or damaged bytes".into()
        }
        TornRecord::UnknownKind(kind) => format!("unknown record kind {kind}"),
        TornRecord::Truncated => {
            format!("truncated record header: only {bytes_left} bytes before the end of the file")
        }
        TornRecord::EntryBelowSegment { entry_id } => {
            format!("entry id {entry_id} is below the segment's first entry id {id}")
        }
        TornRecord::PastEnd { record_len } => {
            format!("a record of {record_len} bytes would extend past the end of the file")
        }
        other => format!("record header does not decode: {other:?}"),
    }
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
