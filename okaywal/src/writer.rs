//! Writing entries: reservations, chunk records, commit and rollback.

use std::io::{self, Write};
use std::sync::Arc;

use crate::encryption::TAG_BYTES;
use crate::failure::ErrorRecord;
use crate::format::{
    frame_count, frame_span, sealed_data_len, RecordHeader, RecordKind, CHUNK_TRAILER_SIZE,
    FRAME_BYTES, FRAME_OVERHEAD,
};
use crate::position::{EntryId, LogPosition};
use crate::sealed::{ChunkId, SegmentSeal};
use crate::segment::Segment;
use crate::tuning::{INLINE_CHUNK_LIMIT, OWN_SYNC_BYTES, SEAL_BATCH_FRAMES, START_WRITEBACK_BYTES};
use crate::WriteAheadLog;

/// How durable a commit is when it returns; see
/// [`EntryWriter::commit_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Synced to the disk: survives power loss (the default).
    #[default]
    Durable,
    /// Handed to the operating system in log order: survives a process
    /// crash; durable with the next sync.
    Buffered,
}

/// Where a chunk was written and what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkRecord {
    /// Pass this to [`WriteAheadLog::read_at`] to read the chunk back.
    pub position: LogPosition,
    /// The CRC32 of the chunk's data.
    pub crc: u32,
    /// The length of the chunk's data.
    pub length: u32,
}

/// An entry being written. Dropping it without [`EntryWriter::commit`]
/// rolls it back.
#[derive(Debug)]
#[must_use = "an entry dropped without `commit` is rolled back"]
pub struct EntryWriter<'log> {
    log: &'log WriteAheadLog,
    id: EntryId,
    segment: Arc<Segment>,
    chunks: u32,
    /// Why the entry can no longer be written or committed, with the
    /// kind of the error that broke it.
    broken: Option<ErrorRecord>,
    finished: bool,
    /// Payload bytes written so far.
    bytes: u64,
    /// The thread that began the entry or used it last: the log counts
    /// the entry as that thread's (see [`EntryWriter::note_thread`]).
    thread: std::thread::ThreadId,
}

impl<'log> EntryWriter<'log> {
    pub(crate) fn new(log: &'log WriteAheadLog, id: EntryId, segment: Arc<Segment>) -> Self {
        Self {
            log,
            id,
            segment,
            chunks: 0,
            broken: None,
            finished: false,
            bytes: 0,
            thread: std::thread::current().id(),
        }
    }

    /// An `EntryWriter` may move to another thread: the log then counts
    /// the entry as held by the thread that uses it now, which is the one
    /// `checkpoint_active` must not make wait for it.
    fn note_thread(&mut self) {
        let now = std::thread::current().id();
        if now != self.thread {
            self.thread = now;
            self.log.inner.entry_moved(self.id.0, now);
        }
    }

    /// The id this entry will have once committed.
    #[must_use]
    pub fn id(&self) -> EntryId {
        self.id
    }

    fn check_usable(&self) -> io::Result<()> {
        match &self.broken {
            Some(why) => Err(why.error(&format!(
                "entry {} can no longer be written or committed",
                self.id
            ))),
            None => Ok(()),
        }
    }

    fn header(&self, kind: RecordKind, length: u32, durable_mark: u64) -> RecordHeader {
        RecordHeader {
            kind,
            entry_id: self.id.0,
            length,
            durable_mark,
        }
    }

    fn fail(&mut self, err: io::Error) -> io::Error {
        self.broken = Some(ErrorRecord::of(&err));
        self.log.inner.poison(err)
    }

    /// The identity an encrypted chunk's frames are bound to: this
    /// entry's next chunk, of `length` bytes.
    fn next_chunk(&self, length: u32) -> ChunkId {
        ChunkId {
            entry_id: self.id.0,
            index: self.chunks,
            length,
        }
    }

    /// Appends `data` as one chunk of this entry.
    ///
    /// In an encrypted log the chunk is encrypted here, in the calling
    /// thread, before the log's lock is taken (small chunks) or after its
    /// room is reserved (large ones): writers encrypt in parallel.
    pub fn write_chunk(&mut self, data: &[u8]) -> io::Result<ChunkRecord> {
        self.write_chunk_of(RecordKind::Chunk, data)
    }

    /// Appends `data`, which the caller has already encrypted and
    /// authenticated itself, as one chunk of this entry.
    ///
    /// In an encrypted log the chunk is stored as given, followed by the
    /// CRC32 of its bytes, instead of being encrypted a second time: only
    /// its record header (its entry, its place in the entry and in the
    /// file) is sealed by the log. Readers see such a chunk through
    /// [`EntryChunk::is_presealed`](crate::EntryChunk::is_presealed) and
    /// [`ChunkReader::is_presealed`](crate::ChunkReader::is_presealed):
    /// its bytes are checked against their CRC, which catches torn and
    /// damaged writes, but only the caller's own seal can tell bytes that
    /// someone changed on purpose, so a caller must open (authenticate)
    /// them itself before it trusts them. Use it only for bytes that
    /// carry their own authentication; anything else goes through
    /// [`EntryWriter::write_chunk`].
    ///
    /// In a log without encryption this is [`EntryWriter::write_chunk`].
    ///
    /// ```rust
    /// use okaywal::encryption::StaticKey;
    /// use okaywal::Configuration;
    /// use std::io::Read;
    ///
    /// # fn main() -> std::io::Result<()> {
    /// let dir = tempfile::tempdir()?;
    /// let config = Configuration::default_for(dir.path()).encryption(StaticKey::new([7; 32]));
    /// let log = config.open(okaywal::LogVoid)?;
    /// let mut entry = log.begin_entry()?;
    /// // Bytes the application sealed with its own key (here: pretend).
    /// let sealed_by_the_application = b"nonce|ciphertext|tag";
    /// let record = entry.write_presealed_chunk(sealed_by_the_application)?;
    /// entry.write_chunk(b"an ordinary chunk, sealed by the log")?;
    /// entry.commit()?;
    ///
    /// let mut chunk = log.read_at(record.position)?;
    /// assert!(chunk.is_presealed());
    /// let mut bytes = Vec::new();
    /// chunk.read_to_end(&mut bytes)?;
    /// assert_eq!(bytes, sealed_by_the_application);
    /// assert!(chunk.crc_is_valid()?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn write_presealed_chunk(&mut self, data: &[u8]) -> io::Result<ChunkRecord> {
        let kind = self.segment.layout().presealed_kind();
        self.write_chunk_of(kind, data)
    }

    /// Appends `data` as one chunk record of `kind` (an ordinary or a
    /// pre-sealed chunk).
    fn write_chunk_of(&mut self, kind: RecordKind, data: &[u8]) -> io::Result<ChunkRecord> {
        self.note_thread();
        self.check_usable()?;
        let length = chunk_length(data.len())?;
        let crc = crc32fast::hash(data);
        let inner = &self.log.inner;
        let header = self.header(kind, length, 0);
        let chunk = self.next_chunk(length);
        let seal = match kind {
            RecordKind::PresealedChunk => None,
            _ => self.segment.layout().seal().cloned(),
        };
        let offset = if data.len() <= INLINE_CHUNK_LIMIT {
            // Small chunks go through the segment's write buffer: no
            // system call here, one `pwrite` per sync for everyone.
            let result = match &seal {
                None => inner.append(&self.segment, header, Some((data, crc)), false, chunk.index),
                Some(seal) => {
                    // The data is sealed now, outside the lock; only the
                    // record header, which binds the offset and durable
                    // mark, is sealed under it. One frame (a small chunk
                    // is no longer than one).
                    let mut sealed = Vec::with_capacity(sealed_data_len(length) as usize);
                    seal.seal_frame(chunk, 0, data, &mut sealed).and_then(|()| {
                        inner.append(
                            &self.segment,
                            header,
                            Some((&sealed, crc)),
                            false,
                            chunk.index,
                        )
                    })
                }
            };
            result.inspect_err(|e| self.broken = Some(ErrorRecord::of(e)))?
        } else {
            // Large chunks are copied by their writers in parallel, with one
            // `pwrite` each; header and trailer wait in the write buffer.
            // Encrypted, the writer seals the frames after the reservation
            // and writes them 16 at a time; its header waits alone (sealed
            // under the lock, like the padding's).
            let offset = inner
                .reserve_chunk(&self.segment, header, crc, chunk.index)
                .inspect_err(|e| self.broken = Some(ErrorRecord::of(e)))?;
            let data_offset = offset + self.segment.layout().header_size() as u64;
            // Whether to start the write-back of each piece of the data at
            // once (see `START_WRITEBACK_BYTES`).
            let hint = data.len() >= START_WRITEBACK_BYTES && inner.others_writing();
            let result = match &seal {
                None => self
                    .segment
                    .write_reserved(data, data_offset)
                    .map(|()| {
                        if hint {
                            self.segment.start_writeback(data_offset, data.len() as u64);
                        }
                    })
                    .map_err(Failed::Write),
                Some(seal) => write_sealed(&self.segment, seal, chunk, data, data_offset, hint),
            };
            inner.data_written(self.segment.id(), offset);
            match result {
                Ok(()) => {}
                Err(Failed::Write(e)) => return Err(self.fail(e)),
                // Nothing of the chunk was written wrong, but its data is
                // missing: the entry cannot commit.
                Err(Failed::Seal(e)) => {
                    self.broken = Some(ErrorRecord::of(&e));
                    return Err(e);
                }
            }
            offset
        };
        self.chunks += 1;
        self.bytes += u64::from(length);
        Ok(ChunkRecord {
            position: LogPosition {
                file_id: self.segment.id(),
                offset,
            },
            crc,
            length,
        })
    }

    /// Begins a chunk of exactly `length` bytes, to be written in pieces
    /// through the returned [`ChunkWriter`] and completed with
    /// [`ChunkWriter::finish`].
    ///
    /// In an encrypted log, the bytes are encrypted and written a frame
    /// (64 KiB) at a time, the last frame at `finish`.
    pub fn begin_chunk(&mut self, length: u32) -> io::Result<ChunkWriter<'_, 'log>> {
        self.note_thread();
        self.check_usable()?;
        let inner = &self.log.inner;
        let layout = self.segment.layout().clone();
        let record_len = layout.chunk_record_len(length);
        let chunk = self.next_chunk(length);
        let (offset, mark) = inner.reserve(self.segment.id(), record_len)?;
        let header = self.header(RecordKind::Chunk, length, mark);
        // Sealed outside the lock: the reservation fixed the offset.
        let result = layout
            .encode(&header, chunk.index, self.segment.id(), offset)
            .and_then(|encoded| self.segment.write_reserved(&encoded, offset));
        inner.complete(self.segment.id(), Some(offset), None);
        if let Err(err) = result {
            inner.data_written(self.segment.id(), offset);
            return Err(self.fail(err));
        }
        let seal = layout.seal().cloned();
        let capacity = match &seal {
            Some(_) => FRAME_BYTES.min(length as usize),
            None => inner.config().buffer_bytes.min(length as usize),
        };
        Ok(ChunkWriter {
            entry: self,
            offset,
            data_offset: offset + layout.header_size() as u64,
            chunk,
            seal,
            frame: 0,
            sealed: Vec::new(),
            length,
            written: 0,
            flushed: 0,
            buffer: Vec::with_capacity(capacity),
            capacity: capacity.max(1),
            hasher: crc32fast::Hasher::new(),
            finished: false,
        })
    }

    /// Commits the entry and returns once it is durable (covered by an
    /// `fdatasync`, shared with concurrent commits).
    pub fn commit(self) -> io::Result<EntryId> {
        self.commit_with(Durability::Durable)
    }

    /// Commits the entry and returns once it is handed to the operating
    /// system in log order, without waiting for a sync: it survives a crash
    /// of the process, and becomes durable with the next sync (any durable
    /// commit, [`WriteAheadLog::sync`], or the background sync that
    /// [`Configuration::max_unsynced`](crate::Configuration::max_unsynced)
    /// sets up). After a power loss, buffered entries may be lost, but only
    /// as a suffix of the log. (An entry held open across a segment switch
    /// for longer than the switch waits finishes in the old segment, where
    /// recovery could not tell its loss from a torn tail while keeping
    /// later segments: such an entry is synced before this returns.)
    pub fn commit_buffered(self) -> io::Result<EntryId> {
        self.commit_with(Durability::Buffered)
    }

    /// Commits the entry with the given durability.
    pub fn commit_with(mut self, durability: Durability) -> io::Result<EntryId> {
        crate::trace::span!(DEBUG, "commit", entry = self.id.0, bytes = self.bytes, durability = ?durability);
        self.finished = true;
        if let Err(err) = self.check_usable() {
            self.write_end(RecordKind::Rollback).ok();
            return Err(err);
        }
        let inner = &self.log.inner;
        let end = self.write_end(RecordKind::Commit)?;
        match durability {
            Durability::Durable => {
                if self.bytes >= OWN_SYNC_BYTES as u64 {
                    // A large entry runs its own sync pass at once, which
                    // may overlap a group sync, instead of waiting for the
                    // running sync to end and the next to start: for large
                    // entries, overlapping syncs beat batching them (1 MiB
                    // commits at 4 and 16 threads: about 10% more).
                    inner.sync_own(&self.segment, end)?;
                }
                inner.wait_durable(&self.segment, end)?;
                inner.counters().durable_commit();
            }
            Durability::Buffered => {
                if self.segment.end_mark_due() {
                    // The entry began before a segment switch and outlived
                    // the switch's wait, so it ends in the old segment,
                    // whose successor does not record where it ends (its
                    // end mark is still owed). Recovery then keeps the
                    // later segment's entries whatever became of this
                    // one's unsynced tail: a power cut could lose this
                    // entry and keep entries committed after it. So it is
                    // made durable before it returns, as `commit` does
                    // (rare: only for entries held open across a switch).
                    inner.wait_durable(&self.segment, end)?;
                } else {
                    inner.hand_to_os(self.segment.id(), end)?;
                }
                inner.counters().buffered_commit();
                inner.buffered_commit_done();
                let unsynced = inner.counters().add_unsynced_bytes(self.bytes.max(1));
                if inner
                    .config()
                    .max_unsynced_bytes
                    .is_some_and(|limit| unsynced >= limit)
                {
                    self.log.sync()?;
                }
            }
        }
        Ok(self.id)
    }

    /// Abandons the entry: it is never recovered nor checkpointed.
    ///
    /// This writes a rollback record (so that readers of the live log and
    /// the segment's checkpoint can move past the entry), and that write
    /// can fail; hence the `Result`. The entry is abandoned either way: an
    /// entry without a commit record is never recovered, and a failed
    /// write stops the log like any other (see the crate docs).
    pub fn rollback(mut self) -> io::Result<()> {
        self.finished = true;
        self.write_end(RecordKind::Rollback).map(|_| ())
    }

    /// Writes a commit or rollback record and finishes the entry; returns
    /// the offset just past the record.
    fn write_end(&mut self, kind: RecordKind) -> io::Result<u64> {
        let inner = &self.log.inner;
        if kind == RecordKind::Rollback {
            inner.counters().rollback();
        }
        if kind == RecordKind::Rollback && self.chunks == 0 {
            // No chunk of this entry was finished, so recovery discards
            // whatever of it is on disk (an abandoned chunk's record is
            // walkable but has no commit): nothing to mark.
            inner.complete(self.segment.id(), None, Some(self.id.0));
            return Ok(0);
        }
        let header = self.header(kind, self.chunks, 0);
        let offset = inner.append(&self.segment, header, None, true, 0)?;
        Ok(offset + self.segment.layout().header_size() as u64)
    }
}

impl Drop for EntryWriter<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.finished = true;
            let _ = self.write_end(RecordKind::Rollback);
        }
    }
}

// A chunk that goes through the write buffer is sealed as one frame.
const _: () = assert!(INLINE_CHUNK_LIMIT <= FRAME_BYTES);

/// Why writing a large chunk's data failed.
enum Failed {
    /// Writing into the file: the log stops.
    Write(io::Error),
    /// Encrypting (the generator failed): only the entry is lost.
    Seal(io::Error),
}

/// Encrypts `data`, the whole of `chunk`, a few frames at a time, and
/// writes the frames at `data_offset`; with `hint`, starts the write-back
/// of each batch large enough as it lands.
fn write_sealed(
    segment: &Segment,
    seal: &SegmentSeal,
    chunk: ChunkId,
    data: &[u8],
    data_offset: u64,
    hint: bool,
) -> Result<(), Failed> {
    let frames = frame_count(chunk.length);
    let mut out = Vec::with_capacity(
        ((FRAME_BYTES + FRAME_OVERHEAD) as u64 * frames.min(SEAL_BATCH_FRAMES)) as usize,
    );
    let mut frame = 0;
    while frame < frames {
        let batch = (frames - frame).min(SEAL_BATCH_FRAMES);
        let (start, _) = frame_span(chunk.length, frame);
        let plain_start = frame as usize * FRAME_BYTES;
        let plain_end = (plain_start + batch as usize * FRAME_BYTES).min(data.len());
        out.clear();
        seal.seal_frames(chunk, frame, &data[plain_start..plain_end], &mut out)
            .map_err(Failed::Seal)?;
        segment
            .write_reserved(&out, data_offset + start)
            .map_err(Failed::Write)?;
        if hint && out.len() >= START_WRITEBACK_BYTES {
            segment.start_writeback(data_offset + start, out.len() as u64);
        }
        frame += batch;
    }
    Ok(())
}

fn chunk_length(len: usize) -> io::Result<u32> {
    u32::try_from(len).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a chunk of {len} bytes is larger than the 4 GiB chunk limit"),
        )
    })
}

/// A chunk being written in pieces; see [`EntryWriter::begin_chunk`].
///
/// Dropping it without [`ChunkWriter::finish`] makes its entry impossible
/// to commit (the chunk would fail its CRC, or in an encrypted log its
/// authentication).
#[derive(Debug)]
#[must_use = "a chunk dropped without `finish` leaves its entry unable to commit"]
pub struct ChunkWriter<'entry, 'log> {
    entry: &'entry mut EntryWriter<'log>,
    offset: u64,
    /// Where the chunk's data (or its first frame) starts.
    data_offset: u64,
    /// What the frames of an encrypted chunk are bound to.
    chunk: ChunkId,
    /// The segment's seal, in an encrypted log.
    seal: Option<Arc<SegmentSeal>>,
    /// The next frame to seal (encrypted logs).
    frame: u64,
    /// The sealed frame being written (encrypted logs).
    sealed: Vec<u8>,
    length: u32,
    written: u32,
    flushed: u32,
    buffer: Vec<u8>,
    capacity: usize,
    hasher: crc32fast::Hasher,
    finished: bool,
}

impl ChunkWriter<'_, '_> {
    fn write_out(&mut self, bytes: &[u8]) -> io::Result<()> {
        let at = self.data_offset + u64::from(self.flushed);
        match self.entry.segment.write_reserved(bytes, at) {
            Ok(()) => {
                if bytes.len() >= START_WRITEBACK_BYTES && self.entry.log.inner.others_writing() {
                    self.entry.segment.start_writeback(at, bytes.len() as u64);
                }
                self.flushed += bytes.len() as u32;
                Ok(())
            }
            Err(err) => Err(self.entry.fail(err)),
        }
    }

    fn flush_buffer(&mut self) -> io::Result<()> {
        if self.seal.is_some() {
            // Frames are written whole, as they fill.
            return Ok(());
        }
        if !self.buffer.is_empty() {
            let buffer = std::mem::take(&mut self.buffer);
            let result = self.write_out(&buffer);
            self.buffer = buffer;
            self.buffer.clear();
            result?;
        }
        Ok(())
    }

    /// Seals the buffered frame (it holds all of its plaintext) and
    /// writes it.
    fn write_frame(&mut self) -> io::Result<()> {
        let Some(seal) = self.seal.clone() else {
            return Ok(());
        };
        let (start, _) = frame_span(self.length, self.frame);
        self.sealed.clear();
        let sealed = seal.seal_frame(self.chunk, self.frame, &self.buffer, &mut self.sealed);
        if let Err(err) = sealed {
            self.entry.broken = Some(ErrorRecord::of(&err));
            return Err(err);
        }
        if let Err(err) = self
            .entry
            .segment
            .write_reserved(&self.sealed, self.data_offset + start)
        {
            return Err(self.entry.fail(err));
        }
        self.buffer.clear();
        self.frame += 1;
        Ok(())
    }

    /// Takes plaintext into the current frame, writing every frame that
    /// fills.
    fn write_frames(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            let (_, frame_len) = frame_span(self.length, self.frame);
            let take = (frame_len - self.buffer.len()).min(bytes.len());
            self.buffer.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.buffer.len() == frame_len {
                self.write_frame()?;
            }
        }
        Ok(())
    }

    /// How many more bytes the chunk expects.
    #[must_use]
    pub fn bytes_remaining(&self) -> u32 {
        self.length - self.written
    }

    /// Completes the chunk. Fails if fewer bytes were written than were
    /// declared to [`EntryWriter::begin_chunk`].
    pub fn finish(mut self) -> io::Result<ChunkRecord> {
        if self.written != self.length {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "chunk declared {} bytes but only {} were written",
                    self.length, self.written
                ),
            ));
        }
        let crc = self.hasher.clone().finalize();
        if self.seal.is_some() {
            // The last frame, shorter than the others (or the one empty
            // frame of an empty chunk), unless it filled exactly.
            if self.frame < frame_count(self.length) {
                self.write_frame()?;
            }
        } else {
            self.flush_buffer()?;
            let trailer_at = self.data_offset + u64::from(self.length);
            if let Err(err) = self
                .entry
                .segment
                .write_reserved(&crc.to_le_bytes(), trailer_at)
            {
                return Err(self.entry.fail(err));
            }
        }
        self.finished = true;
        self.entry.chunks += 1;
        self.entry.bytes += u64::from(self.length);
        Ok(ChunkRecord {
            position: LogPosition {
                file_id: self.entry.segment.id(),
                offset: self.offset,
            },
            crc,
            length: self.length,
        })
    }
}

impl Write for ChunkWriter<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.len() > self.bytes_remaining() as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "chunk declared {} bytes; writing {} more would exceed it by {}",
                    self.length,
                    buf.len(),
                    buf.len() - self.bytes_remaining() as usize
                ),
            ));
        }
        self.hasher.update(buf);
        self.written += buf.len() as u32;
        if self.seal.is_some() {
            self.write_frames(buf)?;
        } else if self.buffer.is_empty() && buf.len() >= self.capacity {
            self.write_out(buf)?;
        } else {
            self.buffer.extend_from_slice(buf);
            if self.buffer.len() >= self.capacity {
                self.flush_buffer()?;
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.flush_buffer()
    }
}

impl Drop for ChunkWriter<'_, '_> {
    fn drop(&mut self) {
        if !self.finished && !self.entry.log.inner.has_failed() {
            // An abandoned chunk's entry never commits, but recovery must
            // still be able to walk past its record to the ones after it:
            // writing the trailer (in an encrypted log, zeros over the
            // last frame's tag) makes the file cover the whole record even
            // when nothing else was written beyond it (a record that runs
            // past the end of the file reads as the torn tail).
            let (trailer_at, trailer) = match self.seal {
                Some(_) => (
                    self.data_offset + sealed_data_len(self.length) - TAG_BYTES as u64,
                    TAG_BYTES,
                ),
                None => (
                    self.data_offset + u64::from(self.length),
                    CHUNK_TRAILER_SIZE,
                ),
            };
            let zeros = [0_u8; TAG_BYTES];
            if let Err(err) = self
                .entry
                .segment
                .write_reserved(&zeros[..trailer], trailer_at)
            {
                self.entry.fail(err);
            }
        }
        // Finished or abandoned, the chunk no longer holds back the durable
        // mark (an abandoned chunk fails its CRC and its entry cannot commit).
        self.entry
            .log
            .inner
            .data_written(self.entry.segment.id(), self.offset);
        if !self.finished && self.entry.broken.is_none() {
            self.entry.broken = Some(ErrorRecord {
                kind: io::ErrorKind::InvalidInput,
                message: "a chunk begun with begin_chunk was never finished".into(),
            });
        }
    }
}
