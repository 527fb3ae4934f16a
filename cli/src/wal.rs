//! Reading okaywal segment files directly, read-only, without opening the
//! log (which would recover it and write). Follows `okaywal/FORMAT.md`,
//! using the header decoders of `okaywal::format`.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use indicatif::ProgressBar;
use okaywal::format::{
    RecordError, RecordHeader, RecordKind, SegmentHeader, CHUNK_TRAILER_SIZE, HEADER_SIZE,
    RECORD_HEADER_SIZE,
};
use serde::Serialize;

/// Bytes read from a segment at a time.
const WINDOW: usize = 1 << 20;

/// What a `wal-*` file name says it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum WalName {
    /// `wal-{id}`: a segment whose first entry id is `id`.
    Segment(u64),
    /// `wal-recycled-{id}`: a checkpointed segment waiting to be reused.
    Recycled(u64),
    /// `wal-spare-{n}`: a fresh file waiting to be used.
    Spare(u64),
}

impl WalName {
    /// Parses a file name; `None` for files that are not the WAL's.
    pub fn parse(name: &str) -> Option<Self> {
        let rest = name.strip_prefix("wal-")?;
        let number = |digits: &str| {
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                None
            } else {
                digits.parse::<u64>().ok()
            }
        };
        if let Some(id) = rest.strip_prefix("recycled-") {
            number(id).map(WalName::Recycled)
        } else if let Some(n) = rest.strip_prefix("spare-") {
            number(n).map(WalName::Spare)
        } else {
            number(rest).map(WalName::Segment)
        }
    }
}

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
}

impl SegmentDump {
    /// Entries with this status.
    pub fn count(&self, status: EntryStatus) -> usize {
        self.entries.iter().filter(|e| e.status == status).count()
    }
}

/// Buffered positioned reads of a read-only file.
struct Window {
    file: File,
    len: u64,
    start: u64,
    buf: Vec<u8>,
}

impl Window {
    /// Up to `n` (≤ `WINDOW`) bytes at `offset`; fewer only at the end of
    /// the file.
    fn bytes_at(&mut self, offset: u64, n: usize) -> io::Result<&[u8]> {
        let end = (offset + n as u64).min(self.len);
        if offset < self.start || end > self.start + self.buf.len() as u64 {
            let want = (self.len.saturating_sub(offset)).min(WINDOW as u64) as usize;
            self.buf.resize(want, 0);
            let mut filled = 0;
            while filled < want {
                match self
                    .file
                    .read_at(&mut self.buf[filled..], offset + filled as u64)
                {
                    Ok(0) => break,
                    Ok(read) => filled += read,
                    Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                    Err(err) => return Err(err),
                }
            }
            // The file may have shrunk since its length was taken.
            self.buf.truncate(filled);
            self.start = offset;
        }
        let from = (offset - self.start) as usize;
        let to = ((end.max(offset) - self.start) as usize).min(self.buf.len());
        Ok(&self.buf[from.min(to)..to])
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

/// Reads one segment file: its header, then every record from offset 512
/// until one does not verify. Opens the file read-only and writes nothing.
/// `progress` advances by the bytes walked.
pub fn scan_segment(
    file: &WalFile,
    id: u64,
    keep_records: bool,
    progress: &ProgressBar,
) -> io::Result<SegmentDump> {
    let handle = File::open(&file.path)?;
    let len = handle.metadata()?.len();
    let base = progress.position();
    let mut window = Window {
        file: handle,
        len,
        start: 0,
        buf: Vec::new(),
    };
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
    };

    let header_bytes = window.bytes_at(0, HEADER_SIZE as usize)?;
    let format_version = header_bytes.get(7).copied().unwrap_or(0);
    let invalid = match SegmentHeader::decode(header_bytes) {
        Ok(header) if header.first_entry_id == id => {
            dump.header = HeaderInfo::Valid {
                first_entry_id: header.first_entry_id,
                format_version,
                version_info_hex: hex(&header.version_info),
                version_info_utf8: String::from_utf8(header.version_info).ok(),
            };
            None
        }
        Ok(header) => Some(format!(
            "the header names segment {}, not {id}",
            header.first_entry_id
        )),
        Err(err) => Some(err.to_string()),
    };
    if let Some(reason) = invalid {
        let first = window.bytes_at(HEADER_SIZE, RECORD_HEADER_SIZE)?;
        let records_follow = RecordHeader::decode(first, id).is_ok();
        dump.header = HeaderInfo::Invalid {
            reason,
            records_follow,
        };
        progress.set_position(base + len);
        return Ok(dump);
    }

    let mut entries: BTreeMap<u64, EntryBuilder> = BTreeMap::new();
    let mut offset = HEADER_SIZE;
    let end = loop {
        progress.set_position(base + offset.min(len));
        if offset >= len {
            break EndInfo {
                offset,
                torn: false,
                reason: "end of file".into(),
            };
        }
        let torn = |reason: String| EndInfo {
            offset,
            torn: true,
            reason,
        };
        let bytes = window.bytes_at(offset, RECORD_HEADER_SIZE)?;
        let header = match RecordHeader::decode(bytes, id) {
            Ok(header) => header,
            Err(err) => {
                break torn(match err {
                    RecordError::Unwritten => "unwritten space".into(),
                    RecordError::BadChecksum => {
                        "record header checksum mismatch: torn, stale or damaged bytes".into()
                    }
                    RecordError::BadKind(kind) => format!("unknown record kind {kind}"),
                    RecordError::Truncated => format!(
                        "truncated record header: only {} bytes before the end of the file",
                        len - offset
                    ),
                    other => format!("record header does not decode: {other:?}"),
                });
            }
        };
        if header.entry_id < id {
            break torn(format!(
                "entry id {} is below the segment's first entry id {id}",
                header.entry_id
            ));
        }
        let record_end = offset + header.record_len();
        if record_end > len {
            break torn(format!(
                "a record of {} bytes would extend past the end of the file",
                header.record_len()
            ));
        }
        let (kind, data_crc_ok) = match header.kind {
            // Filler before a large chunk: no part of any entry.
            RecordKind::Padding => ("padding", None),
            RecordKind::Chunk => {
                let crc_ok = chunk_crc_ok(&mut window, offset, header.length)?;
                let entry = entries.entry(header.entry_id).or_default();
                if entry.ended() {
                    entry.after_end += 1;
                } else {
                    entry.chunks.push(ChunkInfo {
                        offset,
                        length: header.length,
                        crc_ok,
                    });
                }
                ("chunk", Some(crc_ok))
            }
            RecordKind::Commit => {
                let entry = entries.entry(header.entry_id).or_default();
                if entry.ended() {
                    entry.after_end += 1;
                } else {
                    entry.commit = Some(header.length);
                }
                ("commit", None)
            }
            RecordKind::Rollback => {
                let entry = entries.entry(header.entry_id).or_default();
                if entry.ended() {
                    entry.after_end += 1;
                } else {
                    entry.rolled_back = true;
                }
                ("rollback", None)
            }
        };
        if keep_records {
            dump.records.push(RecordInfo {
                offset,
                kind,
                entry_id: header.entry_id,
                length: header.length,
                durable_mark: header.durable_mark,
                data_crc_ok,
            });
        }
        offset = record_end;
    };
    progress.set_position(base + len);
    dump.entries = entries
        .into_iter()
        .map(|(id, builder)| builder.finish(id))
        .collect();
    dump.end = Some(end);
    Ok(dump)
}

/// Whether the data of the chunk whose header is at `offset` matches the
/// CRC after it.
fn chunk_crc_ok(window: &mut Window, offset: u64, length: u32) -> io::Result<bool> {
    let mut hasher = crc32fast::Hasher::new();
    let mut at = offset + RECORD_HEADER_SIZE as u64;
    let end = at + u64::from(length);
    while at < end {
        let piece = window.bytes_at(at, ((end - at) as usize).min(WINDOW))?;
        if piece.is_empty() {
            return Ok(false);
        }
        hasher.update(piece);
        at += piece.len() as u64;
    }
    let trailer = window.bytes_at(end, CHUNK_TRAILER_SIZE)?;
    Ok(trailer.len() == CHUNK_TRAILER_SIZE
        && u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]])
            == hasher.finalize())
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
