//! The entry reader: presents the committed entries a scan found, in id
//! order, to the manager (at recovery and at a checkpoint) through one
//! adaptive read window per segment.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::marker::PhantomData;
use std::sync::Arc;

use super::invalid;
use super::scan::{scan_segment, ChunkLocation};
use crate::format::{RecordKind, SEALED_RECORD_HEADER_SIZE};
use crate::fs::FileHandle;
use crate::manager::RecoveredSegment;
use crate::position::{EntryId, LogPosition};
use crate::reader::ChunkReader;
use crate::sealed::{ChunkId, Layout};
use crate::segment::Segment;
use crate::tuning::{MIN_AHEAD, PREFETCH_CHUNK_BYTES, WINDOW_BYTES};

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
fn records_end<'a>(layout: &Layout, entries: impl Iterator<Item = &'a Vec<ChunkLocation>>) -> u64 {
    entries
        .filter_map(|chunks| chunks.last())
        .map(|last| last.offset + last.record_len(layout))
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
    /// Plain, or encrypted with the segment's key and generation.
    layout: Layout,
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
        layout: Layout,
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
            window: ReadWindow::new(records_end(&layout, entries.values())),
            layout,
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
            ..Self::new(
                segment_id,
                version_info,
                file,
                Layout::Plain,
                BTreeMap::new(),
                None,
            )
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
                segment.version_info(),
                file,
                segment.layout().clone(),
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
                &self.layout,
                self.segment_id,
                limit,
                buffer_bytes,
                skip_damage,
            )?;
            if let (false, Some((offset, reason))) = (skip_damage, &scan.damage) {
                let path = self._segment.as_ref().map_or_else(
                    || format!("segment {}", self.segment_id),
                    |s| format!("segment {}", s.path().display()),
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
            self.window = ReadWindow::new(records_end(&self.layout, entries.values()));
            self.entries = entries.into_iter();
        }
        Ok(self.entries.next().map(|(id, chunks)| Entry {
            id: EntryId(id),
            segment_id: self.segment_id,
            segment: &self.info,
            file: &self.file,
            layout: &self.layout,
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
    layout: &'a Layout,
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
        let header_size = self.layout.header_size();
        let mut large_header = [0_u8; SEALED_RECORD_HEADER_SIZE];
        let bytes: &[u8] = if small {
            let len = location.record_len(self.layout) as usize;
            self.window.get(&**self.file, location.offset, len)?
        } else {
            let header = &mut large_header[..header_size];
            self.file.read_exact_at(header, location.offset)?;
            header
        };
        match self
            .layout
            .decode(&bytes[..header_size], self.segment_id, location.offset)
        {
            Ok((h, index))
                if h.kind.is_chunk()
                    && (h.kind == RecordKind::PresealedChunk) == location.presealed
                    && h.entry_id == self.id.0
                    && h.length == location.length
                    && index == location.index => {}
            _ => return Ok(ReadChunkResult::AbortedEntry),
        }
        let position = LogPosition {
            file_id: self.segment_id,
            offset: location.offset,
        };
        let data_offset = location.offset + header_size as u64;
        let prefetched = small.then(|| bytes[header_size..].to_vec());
        let reader = match (self.layout, prefetched) {
            (Layout::Sealed(_), Some(data)) if location.presealed => {
                ChunkReader::prefetched(self.file.clone(), position, data_offset, data)
                    .with_presealed(true)
            }
            (Layout::Sealed(_), None) if location.presealed => {
                ChunkReader::new(self.file.clone(), position, data_offset, location.length)
                    .with_presealed(true)
            }
            (Layout::Sealed(seal), raw) => {
                let chunk = ChunkId {
                    entry_id: self.id.0,
                    index: location.index,
                    length: location.length,
                };
                ChunkReader::sealed(
                    self.file.clone(),
                    position,
                    data_offset,
                    seal.clone(),
                    chunk,
                    raw,
                )
            }
            (Layout::Plain, Some(data)) => {
                ChunkReader::prefetched(self.file.clone(), position, data_offset, data)
            }
            (Layout::Plain, None) => {
                ChunkReader::new(self.file.clone(), position, data_offset, location.length)
            }
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
        Ok(self.read_all_chunks_flagged()?.map(|(chunks, _)| chunks))
    }

    /// As [`Entry::read_all_chunks`], with whether each chunk is
    /// pre-sealed ([`EntryChunk::is_presealed`]).
    pub(crate) fn read_all_chunks_flagged(&mut self) -> io::Result<Option<FlaggedChunks>> {
        let left = self.chunks.len() - self.next;
        let (mut chunks, mut presealed) = (Vec::with_capacity(left), Vec::with_capacity(left));
        loop {
            match self.read_chunk()? {
                ReadChunkResult::Chunk(mut chunk) => {
                    presealed.push(chunk.is_presealed());
                    chunks.push(chunk.read_all()?);
                }
                ReadChunkResult::EndOfEntry => return Ok(Some((chunks, presealed))),
                ReadChunkResult::AbortedEntry => return Ok(None),
            }
        }
    }
}

/// An entry's chunks, and whether each one is pre-sealed.
pub(crate) type FlaggedChunks = (Vec<Vec<u8>>, Vec<bool>);

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

    /// Whether the chunk was written with
    /// [`EntryWriter::write_presealed_chunk`](crate::EntryWriter::write_presealed_chunk)
    /// into an encrypted log: its bytes are as its writer sealed them,
    /// checked against their CRC32 but not authenticated by the log (see
    /// [`ChunkReader::is_presealed`](crate::ChunkReader::is_presealed)).
    #[must_use]
    pub fn is_presealed(&self) -> bool {
        self.reader.is_presealed()
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
    use std::path::Path;

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
}
