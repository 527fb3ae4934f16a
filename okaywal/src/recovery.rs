//! Walking a segment's records, and the types that present its entries.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read};
use std::marker::PhantomData;
use std::sync::Arc;

use crate::format::{RecordError, RecordHeader, RecordKind, HEADER_SIZE, RECORD_HEADER_SIZE};
use crate::fs::FileHandle;
use crate::position::{EntryId, LogPosition};
use crate::reader::ChunkReader;
use crate::segment::Segment;

/// Where one chunk record starts and how much data it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChunkLocation {
    pub offset: u64,
    pub length: u32,
}

/// What walking a segment found.
#[derive(Debug, Default)]
pub(crate) struct SegmentScan {
    /// Committed entries whose chunks all verified, in id order.
    pub committed: BTreeMap<u64, Vec<ChunkLocation>>,
    /// The offset just past the last record that was walked.
    pub end: u64,
    /// The highest entry id named by any record with a valid header.
    pub max_entry_id: Option<u64>,
    /// Where the walk stopped before `limit`, and why.
    pub stopped: Option<(u64, String)>,
    /// Entries that were rolled back or never finished.
    pub discarded: usize,
}

/// Reads a file front to back through a buffer.
struct Sequential<'a> {
    file: &'a dyn FileHandle,
    buffer: Vec<u8>,
    buffer_start: u64,
    buffer_len: usize,
}

impl<'a> Sequential<'a> {
    fn new(file: &'a dyn FileHandle, buffer_bytes: usize) -> Self {
        Self {
            file,
            buffer: vec![0; buffer_bytes.max(RECORD_HEADER_SIZE)],
            buffer_start: 0,
            buffer_len: 0,
        }
    }

    /// Returns up to `len` bytes at `offset`, fewer only at the end of the
    /// file. `len` must not exceed the buffer size.
    fn bytes_at(&mut self, offset: u64, len: usize) -> io::Result<&[u8]> {
        let end = offset + len as u64;
        let buffered_end = self.buffer_start + self.buffer_len as u64;
        if offset < self.buffer_start || end > buffered_end {
            self.buffer_start = offset;
            self.buffer_len = 0;
            while self.buffer_len < self.buffer.len() {
                let n = self.file.read_at(
                    &mut self.buffer[self.buffer_len..],
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
}

/// Walks the records of a segment from its header up to `limit` bytes,
/// checking every header and chunk CRC.
///
/// The walk stops at the first record whose header does not verify (the
/// torn or unwritten tail). A chunk whose data fails its CRC does not stop
/// the walk (its header says how long it is) but its entry is discarded.
pub(crate) fn scan_segment(
    file: &dyn FileHandle,
    salt: u64,
    limit: u64,
    buffer_bytes: usize,
) -> io::Result<SegmentScan> {
    let mut reader = Sequential::new(file, buffer_bytes);
    let mut scan = SegmentScan::default();
    let mut open: HashMap<u64, (Vec<ChunkLocation>, bool)> = HashMap::new();
    let mut offset = HEADER_SIZE;
    while offset < limit {
        if limit - offset < RECORD_HEADER_SIZE as u64 {
            scan.stopped = Some((offset, "truncated record header".into()));
            break;
        }
        let bytes = reader.bytes_at(offset, RECORD_HEADER_SIZE)?;
        let header = match RecordHeader::decode(bytes, salt) {
            Ok(header) => header,
            Err(err) => {
                let reason = match err {
                    RecordError::Unwritten => "unwritten space".to_string(),
                    RecordError::BadChecksum => "record header checksum mismatch".to_string(),
                    RecordError::BadKind(kind) => format!("unknown record kind {kind}"),
                    RecordError::Truncated => "truncated record header".to_string(),
                };
                scan.stopped = Some((offset, reason));
                break;
            }
        };
        if header.entry_id < salt {
            scan.stopped = Some((
                offset,
                format!(
                    "entry id {} is below the segment's first id {salt}",
                    header.entry_id
                ),
            ));
            break;
        }
        let record_end = offset + header.record_len();
        if record_end > limit {
            scan.stopped = Some((offset, "record extends past the end of the file".into()));
            break;
        }
        scan.max_entry_id = scan.max_entry_id.max(Some(header.entry_id));
        match header.kind {
            RecordKind::Chunk => {
                let valid = chunk_crc_matches(&mut reader, offset, header.length, buffer_bytes)?;
                let entry = open.entry(header.entry_id).or_insert((Vec::new(), true));
                entry.0.push(ChunkLocation {
                    offset,
                    length: header.length,
                });
                entry.1 &= valid;
            }
            RecordKind::Commit => {
                let (chunks, valid) = open.remove(&header.entry_id).unwrap_or((Vec::new(), true));
                if valid
                    && chunks.len() == header.length as usize
                    && !scan.committed.contains_key(&header.entry_id)
                {
                    scan.committed.insert(header.entry_id, chunks);
                } else {
                    scan.discarded += 1;
                }
            }
            RecordKind::Rollback => {
                open.remove(&header.entry_id);
                scan.discarded += 1;
            }
        }
        offset = record_end;
    }
    scan.discarded += open.len();
    scan.end = offset;
    Ok(scan)
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

/// The committed entries of one segment, handed to
/// [`LogManager::checkpoint_to`](crate::LogManager::checkpoint_to).
#[derive(Debug)]
pub struct SegmentReader {
    segment_id: u64,
    file: Arc<dyn FileHandle>,
    entries: std::collections::btree_map::IntoIter<u64, Vec<ChunkLocation>>,
    _segment: Option<Arc<Segment>>,
}

impl SegmentReader {
    pub(crate) fn new(
        segment_id: u64,
        file: Arc<dyn FileHandle>,
        entries: BTreeMap<u64, Vec<ChunkLocation>>,
        segment: Option<Arc<Segment>>,
    ) -> Self {
        Self {
            segment_id,
            file,
            entries: entries.into_iter(),
            _segment: segment,
        }
    }

    /// The id of the segment being read (its first entry id).
    #[must_use]
    pub fn segment_id(&self) -> u64 {
        self.segment_id
    }

    /// Returns the next committed entry, in id order, or `None` at the end.
    pub fn read_entry(&mut self) -> io::Result<Option<Entry<'_>>> {
        Ok(self.entries.next().map(|(id, chunks)| Entry {
            id: EntryId(id),
            segment_id: self.segment_id,
            file: &self.file,
            chunks,
            next: 0,
        }))
    }
}

/// One committed entry being read back (during recovery or a checkpoint).
#[derive(Debug)]
pub struct Entry<'a> {
    id: EntryId,
    segment_id: u64,
    file: &'a Arc<dyn FileHandle>,
    chunks: Vec<ChunkLocation>,
    next: usize,
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
        let mut header = [0_u8; RECORD_HEADER_SIZE];
        self.file.read_exact_at(&mut header, location.offset)?;
        match RecordHeader::decode(&header, self.segment_id) {
            Ok(h)
                if h.kind == RecordKind::Chunk
                    && h.entry_id == self.id.0
                    && h.length == location.length => {}
            _ => return Ok(ReadChunkResult::AbortedEntry),
        }
        Ok(ReadChunkResult::Chunk(EntryChunk {
            reader: ChunkReader::new(
                self.file.clone(),
                LogPosition {
                    file_id: self.segment_id,
                    offset: location.offset,
                },
                location.offset + RECORD_HEADER_SIZE as u64,
                location.length,
            ),
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
                ReadChunkResult::Chunk(chunk) => chunks.push(chunk.read_all()?),
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

    /// Reads the whole chunk, failing with `InvalidData` on a CRC mismatch.
    pub fn read_all(self) -> io::Result<Vec<u8>> {
        self.reader.read_all()
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
