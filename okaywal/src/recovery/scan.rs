//! The segment scan: a walk over one segment's records, checking every
//! header and chunk CRC, that tells a torn tail from damage (FORMAT.md,
//! "Reading a segment"). Recovery, checkpoints, the live reader and
//! inspection all walk segments with it.

use std::collections::{BTreeMap, HashMap};
use std::io;

use crate::format::{
    frame_count, frame_span, RecordError, RecordHeader, RecordKind, FRAME_OVERHEAD, HEADER_SIZE,
};
use crate::fs::FileHandle;
use crate::sealed::{ChunkId, Layout, SegmentSeal};

mod sequential;

use sequential::{Probe, Sequential};

/// Where one chunk record starts and how much data it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChunkLocation {
    pub offset: u64,
    pub length: u32,
    /// The chunk's index in its entry, as an encrypted segment's record
    /// header has it (its frames are bound to it); 0 in a plain segment.
    pub index: u32,
    /// A pre-sealed chunk of an encrypted segment: its data is stored as
    /// in a plain segment, followed by its CRC32.
    pub presealed: bool,
}

impl ChunkLocation {
    /// The bytes the chunk's record takes in a segment of `layout`.
    pub fn record_len(&self, layout: &Layout) -> u64 {
        let kind = match self.presealed {
            true => RecordKind::PresealedChunk,
            false => RecordKind::Chunk,
        };
        layout.chunk_record_len_of(kind, self.length)
    }
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
    /// Entries whose commit record verifies past the record the walk
    /// stopped at (a torn tail, as far as durable marks tell), in file
    /// order, and complete entries recovery cut off with an incomplete one
    /// before them (see `unproven`). A power cut while they were written
    /// can leave this; so can damage to records that were durable, which
    /// nothing written later proves. Either way recovery drops them.
    pub commits_past_stop: Vec<u64>,
    /// Incomplete entries that recovery cut the segment at, with nothing
    /// to prove they were synced (the first one's commit record is where
    /// the segment ends): no longer in `incomplete` once the segment is
    /// truncated there, kept for inspection.
    pub unproven: Vec<IncompleteEntry>,
    /// Why the walk stopped before `limit` (the reason of `stopped`).
    pub stop: Option<Stop>,
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

/// True if a record of segment `salt`, of either layout, verifies
/// somewhere between `from` and `limit` (encrypted records by their
/// checksum alone: the segment's key and generation are unknown).
pub(super) fn verified_record_between(
    file: &dyn FileHandle,
    from: u64,
    limit: u64,
    salt: u64,
    buffer_bytes: usize,
) -> io::Result<bool> {
    Ok(Sequential::new(file, buffer_bytes)
        .next_record(from, limit, salt, Probe::AnyLayout)?
        .is_some())
}

/// Why a walk stopped at a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// Its header does not decode.
    Record(RecordError),
    /// Its header names an entry below the segment's first id.
    BelowSegment {
        /// The entry id it names.
        entry_id: u64,
    },
    /// It would extend past the walk's limit.
    PastLimit {
        /// The record's length.
        record_len: u64,
    },
}

impl Stop {
    /// What recovery reports.
    fn describe(self, salt: u64) -> String {
        match self {
            Stop::Record(err) => describe(err),
            Stop::BelowSegment { entry_id } => {
                format!("entry id {entry_id} is below the segment's first id {salt}")
            }
            Stop::PastLimit { .. } => "record extends past the end of the file".into(),
        }
    }
}

/// A record a walk verified, for a listing.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ListedRecord {
    /// Where its header starts.
    pub offset: u64,
    /// Its header.
    pub header: RecordHeader,
    /// For a chunk: whether its data matched its CRC when walked.
    pub crc_ok: Option<bool>,
}

fn describe(err: RecordError) -> String {
    match err {
        RecordError::Unwritten => "unwritten space".to_string(),
        RecordError::BadChecksum => "record header checksum mismatch".to_string(),
        RecordError::BadKind(kind) => format!("unknown record kind {kind}"),
        RecordError::Truncated => "truncated record header".to_string(),
        RecordError::Unauthentic => {
            "record header checksum matches but the record does not authenticate".to_string()
        }
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
    layout: &Layout,
    salt: u64,
    limit: u64,
    buffer_bytes: usize,
    skip_damage: bool,
) -> io::Result<SegmentScan> {
    let mut scanner = SegmentScanner::with_layout(layout.clone(), salt, buffer_bytes);
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
    layout: Layout,
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
    /// Every record walked, when asked for (see
    /// [`SegmentScanner::listing_records`]).
    listed: Option<Vec<ListedRecord>>,
}

impl SegmentScanner {
    /// A walk over a plain segment.
    #[cfg(test)]
    pub fn new(salt: u64, buffer_bytes: usize) -> Self {
        Self::with_layout(Layout::Plain, salt, buffer_bytes)
    }

    /// A walk over a segment of `layout` whose id is `salt`.
    pub fn with_layout(layout: Layout, salt: u64, buffer_bytes: usize) -> Self {
        Self {
            layout,
            salt,
            buffer_bytes,
            offset: HEADER_SIZE,
            open: HashMap::new(),
            suspect: None,
            listed: None,
            scan: SegmentScan {
                end: HEADER_SIZE,
                ..SegmentScan::default()
            },
        }
    }

    /// Keeps a list of every record the walk verifies (for inspection).
    #[must_use]
    pub fn listing_records(mut self) -> Self {
        self.listed = Some(Vec::new());
        self
    }

    /// Takes the records listed so far (see
    /// [`SegmentScanner::listing_records`]).
    pub fn take_listed(&mut self) -> Vec<ListedRecord> {
        self.listed.as_mut().map(std::mem::take).unwrap_or_default()
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
        reader.stop_filling_at(limit);
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
        let layout = &self.layout;
        let header_size = layout.header_size();
        let scan = &mut self.scan;
        let open = &mut self.open;
        let suspect = &mut self.suspect;
        let listed = &mut self.listed;
        scan.stopped = None;
        scan.stop = None;
        scan.commits_past_stop.clear();
        let mut offset = self.offset;
        while offset < limit {
            let bytes = reader.bytes_at(offset, header_size)?;
            let decoded = layout
                .decode(bytes, salt, offset)
                .map_err(Stop::Record)
                .and_then(|(header, index)| {
                    let record_len = layout.record_len(&header);
                    if header.entry_id < salt {
                        Err(Stop::BelowSegment {
                            entry_id: header.entry_id,
                        })
                    } else if offset + record_len > limit {
                        Err(Stop::PastLimit { record_len })
                    } else {
                        Ok((header, index))
                    }
                });
            let (header, index) = match decoded {
                Ok(header) => header,
                Err(stop) => {
                    let reason = stop.describe(salt);
                    // Damage rather than a torn tail if any later record
                    // was written after a sync that covered these bytes.
                    let mut resume = None;
                    let mut from = offset + 1;
                    let mut damaged = false;
                    let mut commits = Vec::new();
                    while let Some((next_offset, next_header, next_len)) =
                        reader.next_record(from, limit, salt, Probe::Layout(layout))?
                    {
                        resume.get_or_insert(next_offset);
                        if next_header.durable_mark > offset {
                            damaged = true;
                            break;
                        }
                        if next_header.kind == RecordKind::Commit {
                            commits.push(next_header.entry_id);
                        }
                        from = next_offset + next_len;
                    }
                    scan.commits_past_stop = if damaged { Vec::new() } else { commits };
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
                    scan.stop = Some(stop);
                    break;
                }
            };
            let record_end = offset + layout.record_len(&header);
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
            if !header.kind.is_chunk() {
                if let Some(listed) = listed.as_mut() {
                    listed.push(ListedRecord {
                        offset,
                        header,
                        crc_ok: None,
                    });
                }
            }
            match header.kind {
                RecordKind::Chunk | RecordKind::PresealedChunk => {
                    let location = ChunkLocation {
                        offset,
                        length: header.length,
                        index,
                        presealed: header.kind == RecordKind::PresealedChunk,
                    };
                    let valid = chunk_data_ok(
                        reader,
                        layout,
                        header.entry_id,
                        location,
                        self.buffer_bytes,
                    )?;
                    if let Some(listed) = listed.as_mut() {
                        listed.push(ListedRecord {
                            offset,
                            header,
                            crc_ok: Some(valid),
                        });
                    }
                    let entry = open.entry(header.entry_id).or_default();
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
                            if !chunk_data_ok(
                                reader,
                                layout,
                                header.entry_id,
                                chunk,
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

/// Whether a chunk's data is whole: its CRC matches, or in an encrypted
/// segment every frame opens.
fn chunk_data_ok(
    reader: &mut Sequential<'_>,
    layout: &Layout,
    entry_id: u64,
    chunk: ChunkLocation,
    buffer_bytes: usize,
) -> io::Result<bool> {
    let data_offset = chunk.offset + layout.header_size() as u64;
    match layout {
        _ if chunk.presealed => chunk_crc_matches(reader, data_offset, chunk.length, buffer_bytes),
        Layout::Plain => chunk_crc_matches(reader, data_offset, chunk.length, buffer_bytes),
        Layout::Sealed(seal) => {
            let id = ChunkId {
                entry_id,
                index: chunk.index,
                length: chunk.length,
            };
            frames_open(reader, seal, id, data_offset)
        }
    }
}

/// Whether every frame of the encrypted chunk `chunk`, whose frames start
/// at `data_offset`, opens (each is decrypted into a scratch buffer and
/// dropped).
fn frames_open(
    reader: &mut Sequential<'_>,
    seal: &SegmentSeal,
    chunk: ChunkId,
    data_offset: u64,
) -> io::Result<bool> {
    let mut frame_bytes = Vec::new();
    for frame in 0..frame_count(chunk.length) {
        let (start, len) = frame_span(chunk.length, frame);
        frame_bytes.clear();
        reader.read_into(data_offset + start, len + FRAME_OVERHEAD, &mut frame_bytes)?;
        if !seal.open_frame(chunk, frame, &mut frame_bytes) {
            return Ok(false);
        }
    }
    Ok(true)
}

fn chunk_crc_matches(
    reader: &mut Sequential<'_>,
    data_offset: u64,
    length: u32,
    buffer_bytes: usize,
) -> io::Result<bool> {
    let mut hasher = crc32fast::Hasher::new();
    let mut at = data_offset;
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

#[cfg(test)]
mod tests;
