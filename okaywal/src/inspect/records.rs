//! Every record of one segment file, as recovery's scanner walks it: the
//! listing behind a dump of the log (`sediment wal-dump`), so that no tool
//! needs a reader of its own for the format.

use std::io;
use std::path::PathBuf;

use crate::config::Configuration;
use crate::format::{
    peek_sealed_record, AnyHeader, RecordError, RecordHeader, RecordKind, HEADER_SIZE,
    SEALED_RECORD_HEADER_SIZE,
};
use crate::fs::{FileHandle, OpenMode};
use crate::recovery::{SegmentScanner, Stop};
use crate::segment::FileName;

/// What a file name in a log directory says the file is. Files whose
/// names say nothing of the sort are not the log's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogFileName {
    /// `wal-{id}`: a segment whose first entry id is `id`.
    Segment(u64),
    /// `wal-recycled-{id}`: a checkpointed segment waiting to be reused;
    /// it held entry ids up to `id`.
    Recycled(u64),
    /// `wal-spare-{n}`: a fresh preallocated file waiting to be used.
    Spare(u64),
}

impl LogFileName {
    /// Parses a file name (without its directory); `None` for files that
    /// are not the log's.
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        FileName::parse(name).map(|name| match name {
            FileName::Segment(id) => Self::Segment(id),
            FileName::Recycled(id) => Self::Recycled(id),
            FileName::Spare(n) => Self::Spare(n),
        })
    }
}

/// One segment file's header and records (see
/// [`Configuration::inspect_segment`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SegmentRecords {
    /// The segment's id, from its file name.
    pub id: u64,
    /// The file.
    pub path: PathBuf,
    /// The file's length when it was read.
    pub len: u64,
    /// Its header.
    pub header: HeaderStatus,
    /// Every record that verifies, in file order, up to the first that
    /// does not (empty when the header is invalid).
    pub records: Vec<InspectedRecord>,
    /// Where the records end (`None` when the header is invalid).
    pub end: Option<RecordsEnd>,
    /// Bytes that were durable once and no longer verify (damage rather
    /// than a torn tail): the offset and what is wrong, the first found.
    pub damage: Option<(u64, String)>,
}

/// A segment's header.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderStatus {
    /// The header verifies and names this segment.
    Valid {
        /// The segment's first entry id (the id in its name).
        first_entry_id: u64,
        /// The format version byte.
        format_version: u8,
        /// The segment before it and where that one ended, if recorded.
        previous: Option<(u64, u64)>,
        /// The version information written with the log.
        version_info: Vec<u8>,
    },
    /// The header does not verify, or names another segment.
    Invalid {
        /// Why.
        reason: String,
        /// A valid record follows the header: it was damaged after being
        /// written (an open refuses such a log). Otherwise the header never
        /// became durable and the file holds no entries.
        records_follow: bool,
    },
    /// A segment written by okaywal 0.2 or 0.3 (its header starts with
    /// `okw\0`): an open for writing replays its committed entries and
    /// converts the log (FORMAT.md, "Logs written by okaywal 0.2 and
    /// 0.3"); [`Configuration::inspect`] counts it in
    /// [`LogInspection::older_format`](crate::LogInspection::older_format).
    /// Its records are not listed.
    OlderFormat {
        /// The version information in its header.
        version_info: Vec<u8>,
    },
    /// Not a segment this crate reads: the first bytes are neither this
    /// format's header, nor okaywal 0.2/0.3's, nor zeros, or they are an
    /// intact header (magic and checksum verify) of a format version this
    /// crate does not know, written by another version of okaywal. An
    /// open refuses the log while the file is there, and never reuses it.
    Foreign {
        /// What the file begins with.
        reason: String,
    },
}

/// The kinds of record (FORMAT.md, "Records").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RecordType {
    /// A piece of an entry's data.
    Chunk,
    /// Ends an entry: it is committed once this is durable.
    Commit,
    /// Ends an entry that was abandoned.
    Rollback,
    /// Filler (before a large chunk, or a closed segment's end mark).
    Padding,
}

impl RecordType {
    /// `chunk`, `commit`, `rollback` or `padding`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            RecordType::Chunk => "chunk",
            RecordType::Commit => "commit",
            RecordType::Rollback => "rollback",
            RecordType::Padding => "padding",
        }
    }
}

impl From<RecordKind> for RecordType {
    fn from(kind: RecordKind) -> Self {
        match kind {
            // A pre-sealed chunk is a chunk: only who sealed its data
            // differs.
            RecordKind::Chunk | RecordKind::PresealedChunk => RecordType::Chunk,
            RecordKind::Commit => RecordType::Commit,
            RecordKind::Rollback => RecordType::Rollback,
            RecordKind::Padding => RecordType::Padding,
        }
    }
}

/// One record whose header verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct InspectedRecord {
    /// The offset of its header in the file.
    pub offset: u64,
    /// Its kind.
    pub kind: RecordType,
    /// The entry it belongs to.
    pub entry_id: u64,
    /// Data length (chunk), chunk count (commit), 0 (rollback) or filler
    /// bytes (padding).
    pub length: u32,
    /// The writer's durable mark when the record was written.
    pub durable_mark: u64,
    /// For chunks: whether the data matches its CRC.
    pub crc_ok: Option<bool>,
}

/// Where a segment's records end.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordsEnd {
    /// The offset of the first byte not part of a verified record.
    pub offset: u64,
    /// Why the records end before the end of the file; `None` when they
    /// end exactly there.
    pub torn: Option<TornRecord>,
    /// Entries whose commit record verifies past `offset` (see
    /// [`InspectedSegment::committed_past_end`](crate::InspectedSegment::committed_past_end)):
    /// recovery drops them, and only a power cut while they were written
    /// makes that no loss.
    pub commits_past_end: Vec<u64>,
}

/// Why the record at the end of a segment's records does not verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TornRecord {
    /// Zeroed space: nothing was written there.
    Unwritten,
    /// The header's checksum does not match: torn, stale or damaged bytes.
    BadChecksum,
    /// The header names no known kind of record.
    UnknownKind(u8),
    /// Fewer bytes than a record header remain before the end of the file.
    Truncated,
    /// The header names an entry below the segment's first entry id.
    EntryBelowSegment {
        /// The entry id it names.
        entry_id: u64,
    },
    /// The record would extend past the end of the file.
    PastEnd {
        /// The record's length.
        record_len: u64,
    },
    /// In an encrypted log: the header's checksum matches but the record
    /// does not authenticate (tampered with, or left from an earlier use
    /// of the file).
    FailedAuthentication,
}

impl From<Stop> for TornRecord {
    fn from(stop: Stop) -> Self {
        match stop {
            Stop::Record(RecordError::Unwritten) => TornRecord::Unwritten,
            Stop::Record(RecordError::BadChecksum) => TornRecord::BadChecksum,
            Stop::Record(RecordError::BadKind(kind)) => TornRecord::UnknownKind(kind),
            Stop::Record(RecordError::Truncated) => TornRecord::Truncated,
            Stop::Record(RecordError::Unauthentic) => TornRecord::FailedAuthentication,
            Stop::BelowSegment { entry_id } => TornRecord::EntryBelowSegment { entry_id },
            Stop::PastLimit { record_len } => TornRecord::PastEnd { record_len },
        }
    }
}

/// Up to `len` bytes at `offset` (fewer at the end of the file).
fn read_up_to(
    file: &dyn FileHandle,
    file_len: u64,
    offset: u64,
    len: usize,
) -> io::Result<Vec<u8>> {
    let available = file_len.saturating_sub(offset).min(len as u64) as usize;
    let mut bytes = vec![0; available];
    file.read_exact_at(&mut bytes, offset)?;
    Ok(bytes)
}

impl Configuration {
    /// Lists every record of the segment `wal-{id}` in this
    /// configuration's directory, read-only (no lock, nothing written), with
    /// the scanner recovery uses: each record whose header verifies, with
    /// its kind, offset, length and (for chunks) whether its data matches
    /// its CRC, up to the first record that does not verify, and why that
    /// one does not. The walk never skips damage; what recovery would make
    /// of the log is [`Configuration::inspect`]'s answer. An encrypted
    /// segment is listed with the configuration's key (its records' entry
    /// ids and marks are encrypted); without the right key the listing
    /// fails with a key error, as an open would.
    ///
    /// ```
    /// use okaywal::{Configuration, LogVoid, RecordType};
    /// # let dir = tempfile::tempdir()?;
    /// let log = Configuration::default_for(dir.path()).open(LogVoid)?;
    /// let mut entry = log.begin_entry()?;
    /// entry.write_chunk(b"hello")?;
    /// let id = entry.commit()?;
    /// log.shutdown()?;
    ///
    /// let records = Configuration::default_for(dir.path()).inspect_segment(id.0)?;
    /// let kinds: Vec<_> = records.records.iter().map(|r| r.kind).collect();
    /// // The entry's chunk and commit, and the end mark the shutdown left.
    /// assert_eq!(kinds, [RecordType::Chunk, RecordType::Commit, RecordType::Padding]);
    /// assert_eq!(records.records[0].crc_ok, Some(true));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn inspect_segment(&self, id: u64) -> io::Result<SegmentRecords> {
        self.validate()?;
        let path = FileName::Segment(id).path_in(&self.directory);
        let file = self.file_system.open(&path, OpenMode::Read)?;
        let len = file.len()?;
        let header_bytes = read_up_to(&*file, len, 0, HEADER_SIZE as usize)?;
        let mut records = SegmentRecords {
            id,
            path,
            len,
            header: HeaderStatus::Invalid {
                reason: String::new(),
                records_follow: false,
            },
            records: Vec::new(),
            end: None,
            damage: None,
        };
        let opened = crate::recovery::open_header(
            &header_bytes,
            id,
            &records.path,
            self.encryption.as_ref(),
        );
        let layout = match opened {
            Ok(Some((header, layout))) => {
                records.header = HeaderStatus::Valid {
                    first_entry_id: header.first_entry_id,
                    format_version: header_bytes.get(7).copied().unwrap_or(0),
                    previous: header.previous,
                    version_info: header.version_info,
                };
                layout
            }
            // A key error: the records cannot be read without the key.
            Err(error) if error.kind() == io::ErrorKind::PermissionDenied => return Err(error),
            other => {
                match crate::legacy::classify(&header_bytes) {
                    crate::legacy::HeaderKind::Legacy(header) => {
                        records.header = HeaderStatus::OlderFormat {
                            version_info: header.version_info,
                        };
                        return Ok(records);
                    }
                    crate::legacy::HeaderKind::Foreign(reason) => {
                        records.header = HeaderStatus::Foreign { reason };
                        return Ok(records);
                    }
                    crate::legacy::HeaderKind::Ours | crate::legacy::HeaderKind::Unwritten => {}
                }
                if let Some(version) = crate::format::SegmentHeader::other_version(&header_bytes) {
                    records.header = HeaderStatus::Foreign {
                        reason: format!(
                            "an intact header of segment format version {version}, which this \
                             version of okaywal does not read (written by another version)"
                        ),
                    };
                    return Ok(records);
                }
                let reason = match (other, AnyHeader::decode(&header_bytes)) {
                    (Err(error), _) => error.to_string(),
                    (_, Ok(header)) => format!(
                        "the header names segment {}, not {id}",
                        header.first_entry_id()
                    ),
                    (_, Err(err)) => err.to_string(),
                };
                let first = read_up_to(&*file, len, HEADER_SIZE, SEALED_RECORD_HEADER_SIZE)?;
                records.header = HeaderStatus::Invalid {
                    reason,
                    records_follow: RecordHeader::decode(&first, id).is_ok()
                        || peek_sealed_record(&first, id).is_ok(),
                };
                return Ok(records);
            }
        };
        let mut scanner =
            SegmentScanner::with_layout(layout, id, self.buffer_bytes).listing_records();
        scanner.advance(&*file, len, false, &mut Vec::new())?;
        records.records = scanner
            .take_listed()
            .into_iter()
            .map(|listed| InspectedRecord {
                offset: listed.offset,
                kind: listed.header.kind.into(),
                entry_id: listed.header.entry_id,
                length: listed.header.length,
                durable_mark: listed.header.durable_mark,
                crc_ok: listed.crc_ok,
            })
            .collect();
        let scan = scanner.finish();
        records.damage = scan.damage;
        records.end = Some(RecordsEnd {
            offset: scan.end,
            torn: scan.stop.map(TornRecord::from),
            commits_past_end: scan.commits_past_stop,
        });
        Ok(records)
    }
}
