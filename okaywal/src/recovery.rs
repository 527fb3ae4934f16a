//! Walking a segment's records, and the types that present its entries.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read};
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::RecoveryMode;
use crate::format::{
    RecordError, RecordHeader, RecordKind, SegmentHeader, CHUNK_TRAILER_SIZE, HEADER_SIZE,
    RECORD_HEADER_SIZE,
};
use crate::fs::{FileHandle, FileSystem, OpenMode};
use crate::manager::RecoveredSegment;
use crate::position::{EntryId, LogPosition};
use crate::reader::ChunkReader;
use crate::segment::FileName;
use crate::segment::Segment;
use crate::tuning::{MIN_AHEAD, PREFETCH_CHUNK_BYTES, WINDOW_BYTES};

/// Where one chunk record starts and how much data it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChunkLocation {
    pub offset: u64,
    pub length: u32,
}

/// What walking a segment found.
#[derive(Debug, Default)]
pub(crate) struct SegmentScan {
    /// Committed entries whose chunks all verified, in id order, with the
    /// offset of their commit record.
    pub committed: BTreeMap<u64, (Vec<ChunkLocation>, u64)>,
    /// The offset just past the last record that was walked.
    pub end: u64,
    /// The highest entry id named by any record with a valid header.
    pub max_entry_id: Option<u64>,
    /// Where the walk stopped before `limit`, and why.
    pub stopped: Option<(u64, String)>,
    /// Entries that were rolled back or never finished.
    pub discarded: usize,
    /// Bytes that were durable once and no longer verify (damage, not a
    /// torn tail): the offset and what is wrong, the first one found.
    pub damage: Option<(u64, String)>,
    /// The first entry (in file order) whose commit record verifies but
    /// whose chunks do not: a crash's torn write or damage, which only
    /// what else is durable can tell apart (see [`find_segments`]).
    pub failed_commit: Option<FailedCommit>,
    /// Every entry whose commit record verifies but whose chunks do not,
    /// in file order: its id, the offset of its commit record, its chunks
    /// and those of them that failed their CRC.
    pub incomplete: Vec<IncompleteEntry>,
}

/// A committed entry that is not complete (see [`SegmentScan::incomplete`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IncompleteEntry {
    pub id: u64,
    pub commit: u64,
    pub chunks: Vec<ChunkLocation>,
    pub bad: Vec<ChunkLocation>,
}

/// A commit record whose entry is not complete: a chunk failed its CRC, or
/// fewer chunks precede it than it counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FailedCommit {
    /// The offset of the commit record.
    pub commit: u64,
    /// The offset of the first bad chunk (the commit record's own when a
    /// chunk is missing).
    pub at: u64,
    /// What is wrong.
    pub reason: String,
}

impl SegmentScan {
    /// Keeps only what precedes `offset` (point-in-time recovery, or the
    /// end an earlier recovery decided on).
    pub fn truncate(&mut self, offset: u64) {
        self.committed.retain(|_, (_, commit)| *commit < offset);
        self.incomplete.retain(|entry| entry.commit < offset);
        self.end = self.end.min(offset);
        if self
            .failed_commit
            .as_ref()
            .is_some_and(|failed| failed.commit >= offset)
        {
            self.failed_commit = None;
        }
    }
}

/// Reads a file front to back through a buffer.
struct Sequential<'a> {
    file: &'a dyn FileHandle,
    buffer: Vec<u8>,
    buffer_start: u64,
    buffer_len: usize,
    /// Where the caller's walk ends: filling the buffer stops there (a
    /// walk of a live segment's synced part must not read the whole
    /// buffer's worth past it on every advance).
    limit: u64,
}

impl<'a> Sequential<'a> {
    fn new(file: &'a dyn FileHandle, buffer_bytes: usize) -> Self {
        Self::with_buffer(file, Vec::new(), buffer_bytes)
    }

    /// Reuses `buffer` (its contents are ignored) if it has the size
    /// `buffer_bytes` asks for.
    fn with_buffer(file: &'a dyn FileHandle, mut buffer: Vec<u8>, buffer_bytes: usize) -> Self {
        let size = buffer_bytes.max(RECORD_HEADER_SIZE * 2);
        if buffer.len() != size {
            buffer = vec![0; size];
        }
        Self {
            file,
            buffer,
            buffer_start: 0,
            buffer_len: 0,
            limit: u64::MAX,
        }
    }

    fn into_buffer(self) -> Vec<u8> {
        self.buffer
    }

    /// Drops what the buffer holds, so that the next read goes to the file.
    fn forget(&mut self) {
        self.buffer_len = 0;
    }

    /// Returns up to `len` bytes at `offset`, fewer only at the end of the
    /// file. `len` must not exceed the buffer size.
    fn bytes_at(&mut self, offset: u64, len: usize) -> io::Result<&[u8]> {
        let end = offset + len as u64;
        let buffered_end = self.buffer_start + self.buffer_len as u64;
        if offset < self.buffer_start || end > buffered_end {
            self.buffer_start = offset;
            self.buffer_len = 0;
            // At least what was asked for, even past the limit.
            let fill = usize::try_from(self.limit.saturating_sub(offset))
                .unwrap_or(usize::MAX)
                .clamp(len.min(self.buffer.len()), self.buffer.len());
            while self.buffer_len < fill {
                let n = self.file.read_at(
                    &mut self.buffer[self.buffer_len..fill],
                    offset + self.buffer_len as u64,
                )?;
                if n == 0 {
                    break;
                }
                self.buffer_len += n;
            }
        }
        let start = (offset - self.buffer_start) as usize;
        let available = self.buffer_len.saturating_sub(start).min(len);
        Ok(&self.buffer[start..start + available])
    }

    /// Finds the next offset at or after `from` (and below `limit`) where a
    /// record header of this segment verifies.
    fn next_record(
        &mut self,
        from: u64,
        limit: u64,
        salt: u64,
    ) -> io::Result<Option<(u64, RecordHeader)>> {
        let mut at = from;
        while at + RECORD_HEADER_SIZE as u64 <= limit {
            let window = (self.buffer.len() - RECORD_HEADER_SIZE).min((limit - at) as usize);
            let bytes = self.bytes_at(at, window + RECORD_HEADER_SIZE)?.to_vec();
            if bytes.len() < RECORD_HEADER_SIZE {
                return Ok(None);
            }
            for i in 0..=(bytes.len() - RECORD_HEADER_SIZE) {
                // A record starts with its kind (1–4): skip everything else,
                // which makes zeroed space cheap to cross.
                if !(1..=4).contains(&bytes[i]) {
                    continue;
                }
                if let Ok(header) = RecordHeader::decode(&bytes[i..], salt) {
                    let offset = at + i as u64;
                    if header.entry_id >= salt && offset + header.record_len() <= limit {
                        return Ok(Some((offset, header)));
                    }
                }
            }
            at += (bytes.len() - RECORD_HEADER_SIZE + 1) as u64;
        }
        Ok(None)
    }
}

fn describe(err: RecordError) -> String {
    match err {
        RecordError::Unwritten => "unwritten space".to_string(),
        RecordError::BadChecksum => "record header checksum mismatch".to_string(),
        RecordError::BadKind(kind) => format!("unknown record kind {kind}"),
        RecordError::Truncated => "truncated record header".to_string(),
    }
}

/// Walks the records of a segment from its header up to `limit` bytes,
/// checking every header and chunk CRC.
///
/// The walk stops at the first record whose header does not verify. If a
/// valid record follows it whose durable mark lies beyond that point, the
/// bad bytes had been synced once: that is damage, reported in
/// `SegmentScan::damage`, and with `skip_damage` the walk resumes at the
/// following record. Otherwise it is the torn or unwritten tail. A chunk
/// whose data fails its CRC does not stop the walk (its header says how
/// long it is) but its entry is discarded; if that entry committed and any
/// record (its commit record or a later one) was written after the chunk
/// was durable, that is damage too.
pub(crate) fn scan_segment(
    file: &dyn FileHandle,
    salt: u64,
    limit: u64,
    buffer_bytes: usize,
    skip_damage: bool,
) -> io::Result<SegmentScan> {
    let mut scanner = SegmentScanner::new(salt, buffer_bytes);
    scanner.advance(file, limit, skip_damage, &mut Vec::new())?;
    Ok(scanner.finish())
}

/// An entry whose chunks a walk has seen but whose commit or rollback it
/// has not: its chunks, and those of them that failed their CRC.
type OpenEntry = (Vec<ChunkLocation>, Vec<ChunkLocation>);

/// A walk over one segment (see [`scan_segment`]) that can be continued
/// when more of the segment becomes durable: the live-log reader advances
/// it to each new readable end instead of walking the segment again from its
/// header, which made following a busy log cost time in proportion to the
/// segment's size on every refill.
#[derive(Debug)]
pub(crate) struct SegmentScanner {
    salt: u64,
    buffer_bytes: usize,
    /// Where the walk goes on: just past the last record walked, or the
    /// record where it stopped.
    offset: u64,
    open: HashMap<u64, OpenEntry>,
    /// The lowest chunk of a committed entry that failed its CRC (read
    /// again at the commit record) while no durable mark seen so far
    /// passed it: the first later record whose mark does makes it damage.
    suspect: Option<(u64, String)>,
    scan: SegmentScan,
}

impl SegmentScanner {
    pub fn new(salt: u64, buffer_bytes: usize) -> Self {
        Self {
            salt,
            buffer_bytes,
            offset: HEADER_SIZE,
            open: HashMap::new(),
            suspect: None,
            scan: SegmentScan {
                end: HEADER_SIZE,
                ..SegmentScan::default()
            },
        }
    }

    /// What the walk has found so far. Committed entries may be taken out
    /// of `committed`; the walk never adds an entry it has added before.
    pub fn scan_mut(&mut self) -> &mut SegmentScan {
        &mut self.scan
    }

    /// Ends the walk: entries still open count as discarded.
    pub fn finish(mut self) -> SegmentScan {
        self.scan.discarded += self.open.len();
        self.scan
    }

    /// Walks on from where the last advance ended up to `limit`. A walk
    /// that stopped at a record that did not verify tries that record
    /// again, and so does one that failed with an error. Every byte below
    /// `limit` must be final: the caller passes the file's length at open,
    /// or an offset of the live segment below which every record is in the
    /// file (large chunks' data excepted, see the commit branch of `walk`).
    ///
    /// `buffer` is the read buffer, passed in so that a caller advancing
    /// many walks (one per live segment) allocates one; its contents are
    /// never reused, since bytes past the previous limit may have changed.
    pub fn advance(
        &mut self,
        file: &dyn FileHandle,
        limit: u64,
        skip_damage: bool,
        buffer: &mut Vec<u8>,
    ) -> io::Result<()> {
        let mut reader = Sequential::with_buffer(file, std::mem::take(buffer), self.buffer_bytes);
        reader.limit = limit;
        let result = self.walk(&mut reader, limit, skip_damage);
        *buffer = reader.into_buffer();
        result
    }

    fn walk(
        &mut self,
        reader: &mut Sequential<'_>,
        limit: u64,
        skip_damage: bool,
    ) -> io::Result<()> {
        let salt = self.salt;
        let scan = &mut self.scan;
        let open = &mut self.open;
        let suspect = &mut self.suspect;
        scan.stopped = None;
        let mut offset = self.offset;
        while offset < limit {
            let bytes = reader.bytes_at(offset, RECORD_HEADER_SIZE)?;
            let decoded = RecordHeader::decode(bytes, salt)
                .map_err(describe)
                .and_then(|header| {
                    if header.entry_id < salt {
                        Err(format!(
                            "entry id {} is below the segment's first id {salt}",
                            header.entry_id
                        ))
                    } else if offset + header.record_len() > limit {
                        Err("record extends past the end of the file".into())
                    } else {
                        Ok(header)
                    }
                });
            let header = match decoded {
                Ok(header) => header,
                Err(reason) => {
                    // Damage rather than a torn tail if any later record
                    // was written after a sync that covered these bytes.
                    let mut resume = None;
                    let mut from = offset + 1;
                    let mut damaged = false;
                    while let Some((next_offset, next_header)) =
                        reader.next_record(from, limit, salt)?
                    {
                        resume.get_or_insert(next_offset);
                        if next_header.durable_mark > offset {
                            damaged = true;
                            break;
                        }
                        from = next_offset + next_header.record_len();
                    }
                    if damaged {
                        if scan.damage.is_none() {
                            scan.damage = Some((offset, reason.clone()));
                        }
                        if let (true, Some(resume)) = (skip_damage, resume) {
                            offset = resume;
                            continue;
                        }
                    }
                    scan.stopped = Some((offset, reason));
                    break;
                }
            };
            let record_end = offset + header.record_len();
            scan.max_entry_id = scan.max_entry_id.max(Some(header.entry_id));
            // Any record's mark, not only the entry's own commit record's,
            // proves what lies below it was written before a sync that
            // completed: a committed entry's bad chunk below it was damaged
            // after it was durable. (Commits made one after another each
            // carry a mark from before their own chunks; only the records
            // after them show the chunks were synced.)
            if suspect
                .as_ref()
                .is_some_and(|(at, _)| header.durable_mark > *at)
            {
                let found = suspect.take();
                if scan.damage.is_none() {
                    scan.damage = found;
                }
            }
            match header.kind {
                RecordKind::Chunk => {
                    let valid =
                        chunk_crc_matches(reader, offset, header.length, self.buffer_bytes)?;
                    let entry = open.entry(header.entry_id).or_default();
                    let location = ChunkLocation {
                        offset,
                        length: header.length,
                    };
                    entry.0.push(location);
                    if !valid {
                        entry.1.push(location);
                    }
                }
                RecordKind::Commit => {
                    // The entry leaves `open` only once nothing can fail:
                    // a walk that ends in an error is retried from the
                    // last record it finished.
                    let mut bad = open
                        .get(&header.entry_id)
                        .map(|entry| entry.1.clone())
                        .unwrap_or_default();
                    if !bad.is_empty() {
                        // Read a failed chunk again: in a live segment, a
                        // large chunk's header can be in the file before
                        // its writer has copied the data in, so an earlier
                        // advance may have found it unwritten. The writer's
                        // `pwrite` of the data returns before it appends the
                        // commit record, and the log's lock orders that
                        // append before the read of the limit this walk
                        // got, so now the data is final. (At open it is
                        // final anyway; then this reads bad chunks twice.)
                        reader.forget();
                        let mut still_bad = Vec::with_capacity(bad.len());
                        for chunk in bad {
                            if !chunk_crc_matches(
                                reader,
                                chunk.offset,
                                chunk.length,
                                self.buffer_bytes,
                            )? {
                                still_bad.push(chunk);
                            }
                        }
                        bad = still_bad;
                    }
                    let (chunks, _) = open.remove(&header.entry_id).unwrap_or_default();
                    let valid = bad.is_empty();
                    if let Some(first_bad) = bad.first() {
                        let found = (
                            first_bad.offset,
                            format!("chunk of entry {} failed its CRC", header.entry_id),
                        );
                        if header.durable_mark > first_bad.offset {
                            if scan.damage.is_none() {
                                scan.damage = Some(found);
                            }
                        } else if !suspect.as_ref().is_some_and(|(at, _)| *at < found.0) {
                            *suspect = Some(found);
                        }
                    }
                    let duplicate = scan.committed.contains_key(&header.entry_id);
                    if valid && chunks.len() == header.length as usize && !duplicate {
                        scan.committed.insert(header.entry_id, (chunks, offset));
                    } else {
                        scan.discarded += 1;
                        if !duplicate {
                            scan.incomplete.push(IncompleteEntry {
                                id: header.entry_id,
                                commit: offset,
                                chunks: chunks.clone(),
                                bad: bad.clone(),
                            });
                        }
                        if !duplicate && scan.failed_commit.is_none() {
                            scan.failed_commit = Some(match bad.first() {
                                Some(first_bad) => FailedCommit {
                                    commit: offset,
                                    at: first_bad.offset,
                                    reason: format!(
                                        "chunk of committed entry {} failed its CRC",
                                        header.entry_id
                                    ),
                                },
                                None => FailedCommit {
                                    commit: offset,
                                    at: offset,
                                    reason: format!(
                                        "committed entry {} has {} of its {} chunks",
                                        header.entry_id,
                                        chunks.len(),
                                        header.length
                                    ),
                                },
                            });
                        }
                    }
                }
                RecordKind::Rollback => {
                    open.remove(&header.entry_id);
                    scan.discarded += 1;
                }
                RecordKind::Padding => {}
            }
            offset = record_end;
            // Kept after every record: an error later in this walk must
            // not make the retry walk these records again (a chunk pushed
            // twice would make its entry's chunk count wrong).
            self.offset = offset;
        }
        self.offset = offset;
        scan.end = offset;
        Ok(())
    }
}

fn chunk_crc_matches(
    reader: &mut Sequential<'_>,
    record_offset: u64,
    length: u32,
    buffer_bytes: usize,
) -> io::Result<bool> {
    let mut hasher = crc32fast::Hasher::new();
    let mut at = record_offset + RECORD_HEADER_SIZE as u64;
    let end = at + u64::from(length);
    while at < end {
        let piece = ((end - at) as usize).min(buffer_bytes);
        let bytes = reader.bytes_at(at, piece)?;
        if bytes.is_empty() {
            return Ok(false);
        }
        hasher.update(bytes);
        at += bytes.len() as u64;
    }
    let trailer = reader.bytes_at(end, 4)?;
    Ok(trailer.len() == 4
        && u32::from_le_bytes(trailer.try_into().expect("4 bytes")) == hasher.finalize())
}

/// A segment found at open, with its header and what its walk found.
#[derive(Debug)]
pub(crate) struct FoundSegment {
    pub id: u64,
    pub path: PathBuf,
    pub file: Arc<dyn FileHandle>,
    pub header: SegmentHeader,
    pub scan: SegmentScan,
}

/// What opening a directory found.
#[derive(Debug, Default)]
pub(crate) struct Found {
    /// The segments to replay, in order.
    pub segments: Vec<FoundSegment>,
    /// Files that hold nothing to replay and may be reused.
    pub reusable: Vec<PathBuf>,
    /// Segments written by okaywal 0.2 or 0.3 (see `crate::legacy`).
    pub legacy: Vec<crate::legacy::LegacySegment>,
    /// Segments recovery decided not to replay (a suffix cut off after
    /// lost or damaged records), with the highest entry id each held: they
    /// must be renamed away before the log goes on, or the next open would
    /// make the same cut and drop what is written after it.
    pub dropped: Vec<(PathBuf, u64)>,
    /// The highest entry id seen anywhere (replayed or not).
    pub max_id: u64,
    /// With [`Look::Inspect`], everything that recovery would report or
    /// act on: the file, the offset where one applies, and what is wrong.
    pub problems: Vec<(PathBuf, Option<u64>, String)>,
}

/// How [`find_segments`] looks at a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Look {
    /// Recovery of a log opened for writing: damage is handled as the
    /// mode says, and a point-in-time cut is made permanent.
    Recover(RecoveryMode),
    /// Recovery of a log opened read-only: the same decisions, made in
    /// memory only; files are opened for reading.
    ReadOnly(RecoveryMode),
    /// Inspection: nothing fails on damage and nothing is written; every
    /// problem recovery would report is collected in `Found::problems`,
    /// and the walk goes on past damage.
    Inspect,
}

impl Look {
    fn mode(self) -> Option<RecoveryMode> {
        match self {
            Look::Recover(mode) | Look::ReadOnly(mode) => Some(mode),
            Look::Inspect => None,
        }
    }
}

/// The error for a file of this crate's layout but another format
/// version, which is neither read nor reused.
pub(crate) fn other_version_error(path: &Path, version: u8) -> io::Error {
    invalid(format!(
        "{}: written in okaywal segment format version {version}, which this version of the \
         crate (format version {}) cannot read; open the log with the okaywal that wrote it, \
         or move the file away. It was left as it was",
        path.display(),
        crate::format::FORMAT_VERSION
    ))
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// Opens and walks segments `ids` (ascending), then decides what survives:
/// damage is handled as the mode says, and a segment whose predecessor
/// ends short of where it was closed is dropped with everything after it,
/// unless it proves it was synced (then the predecessor is damaged).
pub(crate) fn find_segments(
    fs: &dyn FileSystem,
    directory: &Path,
    ids: &[u64],
    buffer_bytes: usize,
    look: Look,
) -> io::Result<Found> {
    let mut found = Found::default();
    let open_mode = match look {
        Look::Recover(_) => OpenMode::ReadWrite,
        Look::ReadOnly(_) | Look::Inspect => OpenMode::Read,
    };
    let skip_damage = look
        .mode()
        .is_none_or(|mode| mode == RecoveryMode::SkipCorrupted);
    for &id in ids {
        let path = FileName::Segment(id).path_in(directory);
        let file = fs.open(&path, open_mode)?;
        let len = file.len()?;
        let mut header_bytes = vec![0; HEADER_SIZE.min(len) as usize];
        file.read_exact_at(&mut header_bytes, 0)?;
        let header = match SegmentHeader::decode(&header_bytes) {
            Ok(header) if header.first_entry_id == id => header,
            result => {
                // Another version of this format, written whole: never
                // taken for a header that was never written.
                if let Some(version) = SegmentHeader::other_version(&header_bytes) {
                    let error = other_version_error(&path, version);
                    if look == Look::Inspect {
                        found.problems.push((path, Some(0), error.to_string()));
                        continue;
                    }
                    return Err(error);
                }
                // A segment written by okaywal 0.2/0.3 (`crate::legacy`).
                if let Some(legacy) = crate::legacy::recognise(id, &path, &file, &header_bytes) {
                    found.legacy.push(legacy);
                    continue;
                }
                // A header that never became durable means nothing in the
                // file was ever acknowledged (the file is named only after
                // its header is synced), unless records of this segment
                // follow it: then the header was written and later
                // damaged. They are searched for anywhere, not just right
                // after the header, since the damage may have taken the
                // first records too: reusing such a file would drop its
                // entries silently, and its old records would pass for
                // the new segment's if it got the same id.
                let records_follow = len >= HEADER_SIZE + RECORD_HEADER_SIZE as u64
                    && Sequential::new(&*file, buffer_bytes)
                        .next_record(HEADER_SIZE, len, id)?
                        .is_some();
                if records_follow {
                    let why = match result {
                        Ok(_) => "names another segment".to_string(),
                        Err(err) => err.to_string(),
                    };
                    let error = format!(
                        "segment {}: header is damaged ({why}) but valid records follow it",
                        path.display()
                    );
                    if look == Look::Inspect {
                        found.problems.push((path, Some(0), error));
                        continue;
                    }
                    return Err(invalid(error));
                }
                // A file whose header is of neither format is refused.
                if let Err(err) = crate::legacy::refuse_foreign(&path, &header_bytes) {
                    if look == Look::Inspect {
                        found.problems.push((path, Some(0), err.to_string()));
                        continue;
                    }
                    return Err(err);
                }
                found.reusable.push(path);
                continue;
            }
        };
        let scan = scan_segment(&*file, id, len, buffer_bytes, skip_damage)?;
        found.max_id = found.max_id.max(scan.max_entry_id.unwrap_or(0));
        found.segments.push(FoundSegment {
            id,
            path,
            file,
            header,
            scan,
        });
    }

    judge_failed_commits(&mut found.segments);
    let Some(mode) = look.mode() else {
        collect_problems(&mut found);
        return Ok(found);
    };
    let mut keep = found.segments.len();
    for (i, segment) in found.segments.iter_mut().enumerate() {
        if let Some((offset, reason)) = segment.scan.damage.clone() {
            match mode {
                RecoveryMode::ErrorOnCorruption => {
                    return Err(invalid(format!(
                        "segment {}: damaged record at offset {offset} ({reason}), with records \
                         that were synced after it; open with RecoveryMode::PointInTime to keep \
                         only what precedes it, or RecoveryMode::SkipCorrupted to skip it",
                        segment.path.display()
                    )));
                }
                RecoveryMode::PointInTime => {
                    // Make the cut permanent: the damaged segment ends
                    // where the damage begins.
                    segment.scan.truncate(offset);
                    if look == Look::Recover(mode) {
                        segment.file.set_len(offset)?;
                        segment.file.sync_data()?;
                    }
                    keep = i + 1;
                    break;
                }
                RecoveryMode::SkipCorrupted => {}
            }
        }
    }
    for i in 1..keep {
        let (before, after) = found.segments.split_at(i);
        let (previous, segment) = (&before[i - 1], &after[0]);
        let Some((previous_id, previous_end)) = segment.header.previous else {
            continue;
        };
        if previous_id != previous.id || previous.scan.end >= previous_end {
            continue;
        }
        // This segment has its `wal-` name, which it only gets in a sync
        // pass that synced the earlier segment whole first (FORMAT.md,
        // "Durability order"): the earlier segment lost records that were
        // durable, which is damage, not a crash's torn tail. Its own
        // records may all carry mark 0 (its first commit's sync is its
        // first sync) and still be acknowledged.
        if mode == RecoveryMode::PointInTime {
            // Keeping it would keep entries logged after lost ones.
            keep = i;
            break;
        }
        if mode == RecoveryMode::ErrorOnCorruption {
            return Err(invalid(format!(
                "segment {}: ends at offset {} but held records up to {previous_end} when \
                 segment {} was started and synced",
                previous.path.display(),
                previous.scan.end,
                segment.id
            )));
        }
    }
    for dropped in found.segments.drain(keep..) {
        let highest = dropped
            .scan
            .max_entry_id
            .unwrap_or(dropped.id)
            .max(dropped.id);
        found.dropped.push((dropped.path, highest));
    }
    Ok(found)
}

/// Everything recovery would report about `found`'s segments, as
/// problems: damage inside a segment, and a segment that ends short of
/// where its successor says it ended.
fn collect_problems(found: &mut Found) {
    for segment in &found.segments {
        if let Some((offset, reason)) = &segment.scan.damage {
            found.problems.push((
                segment.path.clone(),
                Some(*offset),
                format!("damaged record ({reason}), with records that were synced after it"),
            ));
        }
    }
    for pair in found.segments.windows(2) {
        let (previous, segment) = (&pair[0], &pair[1]);
        if let Some((previous_id, previous_end)) = segment.header.previous {
            if previous_id == previous.id && previous.scan.end < previous_end {
                found.problems.push((
                    previous.path.clone(),
                    Some(previous.scan.end),
                    format!(
                        "ends at offset {} but held records up to {previous_end} when segment \
                         {} was started and synced",
                        previous.scan.end, segment.id
                    ),
                ));
            }
        }
    }
}

/// Decides what a commit record whose entry is incomplete means, from what
/// the segment after it proves (FORMAT.md, "Reading a segment" and "Across
/// segments"). Such an entry is damage when anything durable shows it was
/// complete once; otherwise it is a crash's torn write, and then no entry
/// committed after it in the segment may be kept either: every
/// acknowledged commit had a sync cover all that precedes its commit
/// record.
///
/// The next segment records where this one ended (`previous_end`): that
/// is where an earlier open (or the writer, at a segment switch) found it
/// to end, and everything below it was synced before the next segment got
/// its name. An incomplete entry committed below it is damage; what lies
/// past it was cut off then and stays cut off. Otherwise (no next segment,
/// or one that started while entries were still open here) the segment
/// ends at the incomplete entry's commit record, unless a durable mark
/// past its bad chunk (an end mark, say) already made it damage.
fn judge_failed_commits(segments: &mut [FoundSegment]) {
    for i in 0..segments.len() {
        let (before, after) = segments.split_at_mut(i + 1);
        let segment = &mut before[i];
        let recorded_end = after
            .first()
            .and_then(|next| next.header.previous)
            .filter(|(previous_id, _)| *previous_id == segment.id)
            .map(|(_, previous_end)| previous_end);
        if let Some(previous_end) = recorded_end {
            segment.scan.truncate(previous_end);
            // Bytes at or past the recorded end were not part of the
            // segment for the open that recorded it: whatever they hold is
            // not damage.
            if segment
                .scan
                .damage
                .as_ref()
                .is_some_and(|(offset, _)| *offset >= previous_end)
            {
                segment.scan.damage = None;
            }
            if let Some(failed) = segment.scan.failed_commit.take() {
                segment.scan.damage.get_or_insert((
                    failed.at,
                    format!(
                        "{}, although segment {} records that this one held durable records \
                         up to offset {previous_end}",
                        failed.reason, after[0].id
                    ),
                ));
            }
        } else if segment.scan.damage.is_none() {
            if let Some(failed) = segment.scan.failed_commit.take() {
                segment.scan.truncate(failed.commit);
            }
        }
    }
}

/// The part of a segment read last, shared by the entries of one
/// [`SegmentReader`]. Reading small chunks one `pread` each cost a system
/// call, a zero-filled allocation and a shift per chunk; a checkpoint of
/// small entries spent a third of its instructions there. Entries are
/// read in id order, which is nearly file order (concurrent entries
/// interleave within a few of them), so one read serves many chunks.
///
/// The read-ahead adapts: a window that served less than an eighth of
/// what it read makes the next one a quarter as long (down to 4 KiB), and
/// one that served half or more doubles it again. An entry whose small
/// chunks lie far apart (a long transaction among many others) then costs
/// a page or so per chunk instead of 256 KiB.
#[derive(Debug)]
struct ReadWindow {
    start: u64,
    bytes: Vec<u8>,
    /// Where the reader's records end: a window never reads past it, so a
    /// reader of one entry reads no more than that entry spans.
    limit: u64,
    /// How far the next refill reads past the record asked for.
    ahead: usize,
    /// Bytes handed out since the last refill.
    served: usize,
}

impl ReadWindow {
    fn new(limit: u64) -> Self {
        Self {
            start: 0,
            bytes: Vec::new(),
            limit,
            ahead: WINDOW_BYTES,
            served: 0,
        }
    }

    /// The `len` bytes at `offset`, read from `file` if the window does
    /// not hold them yet.
    fn get(&mut self, file: &dyn FileHandle, offset: u64, len: usize) -> io::Result<&[u8]> {
        let end = offset + len as u64;
        let held = offset >= self.start && end <= self.start + self.bytes.len() as u64;
        if !held {
            if !self.bytes.is_empty() {
                if self.served * 8 < self.bytes.len() {
                    self.ahead = (self.ahead / 4).max(MIN_AHEAD);
                } else if self.served * 2 >= self.bytes.len() {
                    self.ahead = (self.ahead * 2).min(WINDOW_BYTES);
                }
            }
            let read_end = (offset + self.ahead as u64).min(self.limit).max(end);
            // Resized, not cleared: the read overwrites every byte, so only
            // growth needs filling.
            self.bytes.resize((read_end - offset) as usize, 0);
            if let Err(err) = file.read_exact_at(&mut self.bytes, offset) {
                self.bytes.clear();
                return Err(err);
            }
            self.start = offset;
            self.served = 0;
        }
        self.served += len;
        let at = (offset - self.start) as usize;
        Ok(&self.bytes[at..at + len])
    }
}

/// Where the last chunk record of `entries` ends.
fn records_end<'a>(entries: impl Iterator<Item = &'a Vec<ChunkLocation>>) -> u64 {
    entries
        .filter_map(|chunks| chunks.last())
        .map(|last| {
            last.offset + (RECORD_HEADER_SIZE + CHUNK_TRAILER_SIZE) as u64 + u64::from(last.length)
        })
        .max()
        .unwrap_or(0)
}

/// The committed entries of one segment, handed to
/// [`LogManager::checkpoint_to`](crate::LogManager::checkpoint_to).
#[derive(Debug)]
pub struct SegmentReader {
    segment_id: u64,
    info: RecoveredSegment,
    file: Arc<dyn FileHandle>,
    entries: std::collections::btree_map::IntoIter<u64, Vec<ChunkLocation>>,
    /// (limit, buffer size, skip damage) of a scan not done yet: a
    /// checkpoint's reader scans the segment only if the manager reads an
    /// entry, so managers that keep their own copy of the data do not
    /// re-read every segment.
    unscanned: Option<(u64, usize, bool)>,
    window: ReadWindow,
    _segment: Option<Arc<Segment>>,
    /// The segment is in the okaywal 0.2/0.3 format (`crate::legacy`).
    legacy: bool,
}

impl SegmentReader {
    pub(crate) fn new(
        segment_id: u64,
        version_info: &[u8],
        file: Arc<dyn FileHandle>,
        entries: BTreeMap<u64, (Vec<ChunkLocation>, u64)>,
        segment: Option<Arc<Segment>>,
    ) -> Self {
        let entries: BTreeMap<u64, Vec<ChunkLocation>> = entries
            .into_iter()
            .map(|(id, (chunks, _))| (id, chunks))
            .collect();
        Self {
            segment_id,
            info: RecoveredSegment {
                id: segment_id,
                version_info: version_info.to_vec(),
            },
            file,
            window: ReadWindow::new(records_end(entries.values())),
            entries: entries.into_iter(),
            unscanned: None,
            _segment: segment,
            legacy: false,
        }
    }

    /// A reader over the committed entries of a segment in the okaywal
    /// 0.2/0.3 format, whose walk ended at `end`.
    pub(crate) fn legacy(
        segment_id: u64,
        version_info: &[u8],
        file: Arc<dyn FileHandle>,
        entries: BTreeMap<u64, Vec<ChunkLocation>>,
        end: u64,
    ) -> Self {
        Self {
            window: ReadWindow::new(end),
            entries: entries.into_iter(),
            legacy: true,
            ..Self::new(segment_id, version_info, file, BTreeMap::new(), None)
        }
    }

    /// A reader that scans the first `limit` bytes of the segment when the
    /// first entry is asked for. Damage is skipped only with
    /// `skip_damage` (as recovery in `SkipCorrupted` mode skips it);
    /// otherwise it is an error, so that an entry the log acknowledged is
    /// never left out of a checkpoint and lost with the recycled segment.
    pub(crate) fn unscanned(
        segment_id: u64,
        file: Arc<dyn FileHandle>,
        limit: u64,
        buffer_bytes: usize,
        skip_damage: bool,
        segment: Arc<Segment>,
    ) -> Self {
        Self {
            unscanned: Some((limit, buffer_bytes, skip_damage)),
            ..Self::new(
                segment_id,
                &segment.version_info,
                file,
                BTreeMap::new(),
                Some(segment.clone()),
            )
        }
    }

    /// The id of the segment being read (its first entry id).
    #[must_use]
    pub fn segment_id(&self) -> u64 {
        self.segment_id
    }

    /// Returns the next committed entry, in id order, or `None` at the end.
    pub fn read_entry(&mut self) -> io::Result<Option<Entry<'_>>> {
        if let Some((limit, buffer_bytes, skip_damage)) = self.unscanned {
            let scan = scan_segment(
                &*self.file,
                self.segment_id,
                limit,
                buffer_bytes,
                skip_damage,
            )?;
            if let (false, Some((offset, reason))) = (skip_damage, &scan.damage) {
                let path = self._segment.as_ref().map_or_else(
                    || format!("segment {}", self.segment_id),
                    |s| format!("segment {}", s.path.display()),
                );
                return Err(invalid(format!(
                    "{path}: damaged record at offset {offset} ({reason}), found while \
                     checkpointing; the segment is kept. Reopen the log with \
                     RecoveryMode::PointInTime to keep only what precedes it, or \
                     RecoveryMode::SkipCorrupted to skip it"
                )));
            }
            self.unscanned = None;
            let entries: BTreeMap<u64, Vec<ChunkLocation>> = scan
                .committed
                .into_iter()
                .map(|(id, (chunks, _))| (id, chunks))
                .collect();
            self.window = ReadWindow::new(records_end(entries.values()));
            self.entries = entries.into_iter();
        }
        Ok(self.entries.next().map(|(id, chunks)| Entry {
            id: EntryId(id),
            segment_id: self.segment_id,
            segment: &self.info,
            file: &self.file,
            window: &mut self.window,
            chunks,
            next: 0,
            legacy: self.legacy,
        }))
    }
}

/// One committed entry being read back (during recovery or a checkpoint).
#[derive(Debug)]
pub struct Entry<'a> {
    id: EntryId,
    segment_id: u64,
    segment: &'a RecoveredSegment,
    file: &'a Arc<dyn FileHandle>,
    window: &'a mut ReadWindow,
    chunks: Vec<ChunkLocation>,
    next: usize,
    legacy: bool,
}

/// The result of [`Entry::read_chunk`].
#[derive(Debug)]
pub enum ReadChunkResult<'entry> {
    /// The next chunk of the entry.
    Chunk(EntryChunk<'entry>),
    /// All chunks have been returned.
    EndOfEntry,
    /// The entry's records no longer verify (the file changed since it was
    /// scanned); its remaining chunks cannot be trusted.
    AbortedEntry,
}

impl<'a> Entry<'a> {
    /// The entry's id.
    #[must_use]
    pub fn id(&self) -> EntryId {
        self.id
    }

    /// The segment the entry is in: its id and the version information
    /// written in its header.
    #[must_use]
    pub fn segment(&self) -> &'a RecoveredSegment {
        self.segment
    }

    /// How many chunks the entry has.
    #[must_use]
    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// Returns the next chunk, or [`ReadChunkResult::EndOfEntry`].
    pub fn read_chunk(&mut self) -> io::Result<ReadChunkResult<'_>> {
        let Some(location) = self.chunks.get(self.next).copied() else {
            return Ok(ReadChunkResult::EndOfEntry);
        };
        self.next += 1;
        if self.legacy {
            let position = LogPosition {
                file_id: self.segment_id,
                offset: location.offset,
            };
            let len = crate::legacy::CHUNK_OVERHEAD + location.length as usize;
            let bytes = self.window.get(&**self.file, location.offset, len)?;
            return Ok(
                match crate::legacy::chunk_reader(self.file.clone(), position, bytes) {
                    Some(reader) => ReadChunkResult::Chunk(EntryChunk {
                        reader,
                        _entry: PhantomData,
                    }),
                    None => ReadChunkResult::AbortedEntry,
                },
            );
        }
        // A small chunk comes whole (header, data, trailer) out of the
        // window; a large one's header is read alone and its data streamed.
        let small = location.length as usize <= PREFETCH_CHUNK_BYTES;
        let mut large_header = [0_u8; RECORD_HEADER_SIZE];
        let bytes: &[u8] = if small {
            let len = RECORD_HEADER_SIZE + location.length as usize + CHUNK_TRAILER_SIZE;
            self.window.get(&**self.file, location.offset, len)?
        } else {
            self.file
                .read_exact_at(&mut large_header, location.offset)?;
            &large_header
        };
        match RecordHeader::decode(&bytes[..RECORD_HEADER_SIZE], self.segment_id) {
            Ok(h)
                if h.kind == RecordKind::Chunk
                    && h.entry_id == self.id.0
                    && h.length == location.length => {}
            _ => return Ok(ReadChunkResult::AbortedEntry),
        }
        let position = LogPosition {
            file_id: self.segment_id,
            offset: location.offset,
        };
        let data_offset = location.offset + RECORD_HEADER_SIZE as u64;
        let reader = if small {
            let data = bytes[RECORD_HEADER_SIZE..].to_vec();
            ChunkReader::prefetched(self.file.clone(), position, data_offset, data)
        } else {
            ChunkReader::new(self.file.clone(), position, data_offset, location.length)
        };
        Ok(ReadChunkResult::Chunk(EntryChunk {
            reader,
            _entry: PhantomData,
        }))
    }

    /// Reads every remaining chunk into memory. Returns `None` if the entry
    /// turned out to be aborted, and an `InvalidData` error if a chunk fails
    /// its CRC.
    pub fn read_all_chunks(&mut self) -> io::Result<Option<Vec<Vec<u8>>>> {
        let mut chunks = Vec::with_capacity(self.chunks.len() - self.next);
        loop {
            match self.read_chunk()? {
                ReadChunkResult::Chunk(mut chunk) => chunks.push(chunk.read_all()?),
                ReadChunkResult::EndOfEntry => return Ok(Some(chunks)),
                ReadChunkResult::AbortedEntry => return Ok(None),
            }
        }
    }
}

/// One chunk of an [`Entry`]: read its data with [`Read`].
#[derive(Debug)]
pub struct EntryChunk<'entry> {
    reader: ChunkReader,
    _entry: PhantomData<&'entry mut ()>,
}

impl EntryChunk<'_> {
    /// Where the chunk is in the log (usable with
    /// [`WriteAheadLog::read_at`](crate::WriteAheadLog::read_at) until the
    /// segment is recycled).
    #[must_use]
    pub fn position(&self) -> LogPosition {
        self.reader.position()
    }

    /// How many bytes of data have not been read yet.
    #[must_use]
    pub fn bytes_remaining(&self) -> u32 {
        self.reader.bytes_remaining()
    }

    /// The length of the chunk's data.
    #[must_use]
    pub fn len(&self) -> u32 {
        self.reader.chunk_length()
    }

    /// Returns true if the chunk holds no data.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads any unread data and compares the chunk's CRC.
    pub fn check_crc(&mut self) -> io::Result<bool> {
        self.reader.crc_is_valid()
    }

    /// The same as [`EntryChunk::position`], under the name okaywal 0.3
    /// users know.
    #[must_use]
    pub fn log_position(&self) -> LogPosition {
        self.position()
    }

    /// Reads the rest of the chunk (all of it if nothing was read yet),
    /// failing with `InvalidData` if the chunk's CRC does not match.
    /// Afterwards [`EntryChunk::check_crc`] returns `Ok(true)` and
    /// [`EntryChunk::bytes_remaining`] 0.
    pub fn read_all(&mut self) -> io::Result<Vec<u8>> {
        self.reader.take_all()
    }

    /// Skips the rest of the chunk.
    pub fn skip_remaining_bytes(self) -> io::Result<()> {
        Ok(())
    }
}

impl Read for EntryChunk<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.reader.read(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::{CrashFileSystem, FileSystem, OpenMode, Operation};

    #[test]
    fn a_read_window_serves_nearby_records_from_one_read_and_stops_at_its_limit() {
        let fs = CrashFileSystem::new();
        fs.create_dir_all(Path::new("/d")).unwrap();
        let file = fs.open(Path::new("/d/f"), OpenMode::Create).unwrap();
        let len = 600_000_u64;
        let content: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        file.write_all_at(&content, 0).unwrap();
        let expect = |offset: u64, n: usize| &content[offset as usize..offset as usize + n];

        let mut window = ReadWindow::new(len);
        let before = fs.operation_count(Operation::Read);
        // Forward through the file in records of 1,000 bytes, with a step
        // back into what the window holds now and then.
        for i in 0..599_u64 {
            let offset = i * 1000 + 17;
            let n = if offset + 1000 > len {
                (len - offset) as usize
            } else {
                983
            };
            assert_eq!(window.get(&*file, offset, n).unwrap(), expect(offset, n));
            if i % 10 == 9 {
                let back = offset - 5000;
                assert_eq!(window.get(&*file, back, 100).unwrap(), expect(back, 100));
            }
        }
        let reads = fs.operation_count(Operation::Read) - before;
        assert!(reads <= 3, "{reads} reads for 600 kB");

        // A record behind the window, one past it, and one longer than a
        // window: each is read whole, and never past the limit.
        assert_eq!(window.get(&*file, 10, 50).unwrap(), expect(10, 50));
        assert_eq!(
            window.get(&*file, 300_000, 299_000).unwrap(),
            expect(300_000, 299_000)
        );
        let mut short = ReadWindow::new(1_000);
        assert_eq!(short.get(&*file, 900, 100).unwrap(), expect(900, 100));
        assert_eq!(
            short.bytes.len(),
            100,
            "the window reads up to its limit only"
        );
        assert!(
            short.get(&*file, len - 10, 20).is_err(),
            "past the file's end"
        );
        assert_eq!(short.get(&*file, 0, 10).unwrap(), expect(0, 10));
    }

    #[test]
    fn a_read_window_reads_less_ahead_for_records_far_apart_and_more_again_for_close_ones() {
        let fs = CrashFileSystem::new();
        fs.create_dir_all(Path::new("/d")).unwrap();
        let file = fs.open(Path::new("/d/f"), OpenMode::Create).unwrap();
        let len = 8_000_000_u64;
        let content: Vec<u8> = (0..len).map(|i| (i % 241) as u8).collect();
        file.write_all_at(&content, 0).unwrap();
        let expect = |offset: u64, n: usize| &content[offset as usize..offset as usize + n];
        let mut window = ReadWindow::new(len);

        // 100-byte records 300 kB apart: every one is a miss, and after a
        // few the window reads little more than the record.
        let mut offset = 0;
        for _ in 0..8 {
            assert_eq!(
                window.get(&*file, offset, 100).unwrap(),
                expect(offset, 100)
            );
            offset += 300_000;
        }
        assert!(
            window.bytes.len() <= MIN_AHEAD + 100,
            "a sparse reader still reads {} bytes at a time",
            window.bytes.len()
        );

        // Records back to back: the read-ahead grows back to the maximum.
        let reads_before = fs.operation_count(Operation::Read);
        for _ in 0..2_000 {
            assert_eq!(
                window.get(&*file, offset, 1000).unwrap(),
                expect(offset, 1000)
            );
            offset += 1000;
        }
        assert_eq!(window.bytes.len(), WINDOW_BYTES);
        let reads = fs.operation_count(Operation::Read) - reads_before;
        assert!(reads < 30, "{reads} reads for 2 MB of records in a row");
    }

    /// A segment image: a blank header, then records of entries with one
    /// to three chunks (one over the scan buffer), rollbacks, padding and
    /// an entry whose chunk fails its CRC. Returns the bytes and the
    /// offset where each record ends.
    fn segment_image(salt: u64) -> (Vec<u8>, Vec<u64>) {
        use crate::format::encode_chunk;
        let mut out = vec![0_u8; HEADER_SIZE as usize];
        let mut ends = Vec::new();
        let record = |kind, entry_id, length| RecordHeader {
            kind,
            entry_id,
            length,
            durable_mark: 0,
        };
        for i in 0..60_u64 {
            let id = salt + i;
            let chunks = 1 + (i % 3) as u32;
            for c in 0..chunks {
                let len = if i == 17 && c == 0 {
                    70_000
                } else {
                    (i * 37 + u64::from(c) * 5) % 600
                };
                let data: Vec<u8> = (0..len).map(|b| (b as u8) ^ (i as u8)).collect();
                let mut crc = crc32fast::hash(&data);
                if i == 29 {
                    crc ^= 1;
                }
                encode_chunk(
                    &mut out,
                    &record(RecordKind::Chunk, id, len as u32),
                    salt,
                    &data,
                    crc,
                );
                ends.push(out.len() as u64);
            }
            let kind = if i % 11 == 5 {
                RecordKind::Rollback
            } else {
                RecordKind::Commit
            };
            let length = if kind == RecordKind::Commit {
                chunks
            } else {
                0
            };
            out.extend_from_slice(&record(kind, id, length).encode(salt));
            ends.push(out.len() as u64);
            if i % 13 == 0 {
                out.extend_from_slice(&record(RecordKind::Padding, id, 40).encode(salt));
                out.extend_from_slice(&[0; 40]);
                ends.push(out.len() as u64);
            }
        }
        (out, ends)
    }

    #[test]
    fn a_scan_advanced_in_steps_finds_what_one_walk_finds() {
        let salt = 1_000;
        let (image, ends) = segment_image(salt);
        let fs = CrashFileSystem::new();
        fs.create_dir_all(Path::new("/d")).unwrap();
        let file = fs.open(Path::new("/d/f"), OpenMode::Create).unwrap();
        file.write_all_at(&image, 0).unwrap();
        let len = image.len() as u64;
        // A buffer smaller than the large chunk, so that chunk is read in
        // pieces across the buffer's refills.
        let buffer_bytes = 8 * 1024;
        let whole = scan_segment(&*file, salt, len, buffer_bytes, false).unwrap();
        assert!(whole.stopped.is_none() && whole.damage.is_none());
        assert_eq!(whole.end, len);
        // 60 entries: 5 rolled back (i % 11 == 5) and one with a bad chunk.
        assert_eq!(whole.committed.len(), 54);
        assert_eq!(whole.discarded, 6);

        // Advanced to every record boundary, as the live-log reader does,
        // and separately to limits inside records, which the walk must
        // retry: the same entries, the same counts, the same end.
        let inside: Vec<u64> = (HEADER_SIZE..len).step_by(997).chain([len]).collect();
        for limits in [ends.clone(), inside] {
            let mut scanner = SegmentScanner::new(salt, buffer_bytes);
            for &limit in &limits {
                scanner
                    .advance(&*file, limit, false, &mut Vec::new())
                    .unwrap();
                let scan = scanner.scan_mut();
                assert!(scan.end <= limit);
                if ends.contains(&limit) {
                    assert_eq!(scan.end, limit, "a walk to a record boundary reaches it");
                    assert!(scan.stopped.is_none());
                }
            }
            let stepped = scanner.finish();
            assert_eq!(stepped.committed, whole.committed);
            assert_eq!(stepped.discarded, whole.discarded);
            assert_eq!(stepped.end, whole.end);
            assert_eq!(stepped.max_entry_id, whole.max_entry_id);
            assert!(stepped.stopped.is_none() && stepped.damage.is_none());
        }

        // In a live segment a large chunk's header and trailer are synced
        // before its writer has copied the data in: an advance that walks
        // the chunk then sees it fail its CRC. Once the data and the commit
        // are there, the next advance must still find the entry whole.
        let large = ends
            .windows(2)
            .find(|w| w[1] - w[0] > 60_000)
            .map(|w| (w[0], w[1]))
            .expect("the image has a large chunk");
        let live = fs.open(Path::new("/d/live"), OpenMode::Create).unwrap();
        let data_start = large.0 + RECORD_HEADER_SIZE as u64;
        let data_end = large.1 - CHUNK_TRAILER_SIZE as u64;
        live.write_all_at(&image[..data_start as usize], 0).unwrap();
        live.write_all_at(&image[data_end as usize..large.1 as usize], data_end)
            .unwrap();
        let mut scanner = SegmentScanner::new(salt, buffer_bytes);
        scanner
            .advance(&*live, large.1, false, &mut Vec::new())
            .unwrap();
        live.write_all_at(&image[data_start as usize..], data_start)
            .unwrap();
        scanner
            .advance(&*live, len, false, &mut Vec::new())
            .unwrap();
        let resumed = scanner.finish();
        assert_eq!(resumed.committed, whole.committed);
        assert_eq!(resumed.discarded, whole.discarded);
        assert!(resumed.damage.is_none());

        // Entries taken out of the scan are not found again by later
        // advances.
        let mut scanner = SegmentScanner::new(salt, buffer_bytes);
        let half = ends[ends.len() / 2];
        scanner
            .advance(&*file, half, false, &mut Vec::new())
            .unwrap();
        let first: Vec<u64> = std::mem::take(&mut scanner.scan_mut().committed)
            .into_keys()
            .collect();
        scanner
            .advance(&*file, len, false, &mut Vec::new())
            .unwrap();
        let second: Vec<u64> = scanner.scan_mut().committed.keys().copied().collect();
        assert!(!first.is_empty() && !second.is_empty());
        assert!(first.iter().max() < second.iter().min());
        let mut all = first;
        all.extend(second);
        assert_eq!(all, whole.committed.keys().copied().collect::<Vec<_>>());
    }
}
