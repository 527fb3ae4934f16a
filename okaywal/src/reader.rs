//! Reading one chunk's data, checking its CRC at the end (or, in an
//! encrypted log, authenticating every frame before any of its bytes are
//! returned; a pre-sealed chunk's CRC is checked as in a plain log).

use std::io::{self, Read};
use std::sync::Arc;

use crate::encryption::NONCE_BYTES;
use crate::format::{
    frame_span, RecordKind, CHUNK_TRAILER_SIZE, FRAME_OVERHEAD, HEADER_SIZE,
    SEALED_RECORD_HEADER_SIZE,
};
use crate::fs::FileHandle;
use crate::position::LogPosition;
use crate::sealed::{ChunkId, Layout, SegmentSeal};
use crate::segment::Segment;

/// A reader over the data of one chunk, returned by
/// [`WriteAheadLog::read_at`](crate::WriteAheadLog::read_at).
///
/// The CRC stored after the data is compared once the data has been read
/// to the end: see [`ChunkReader::crc_is_valid`]. Reading past a mismatch
/// is not prevented, so callers that need verified bytes read everything
/// and then check.
///
/// In an encrypted log the chunk's data is stored in frames of 64 KiB,
/// each authenticated on its own: the reader opens a frame before it
/// returns any byte of it, so it never returns bytes that do not
/// authenticate. Reading fails with `InvalidData` at the first frame that
/// does not, and [`ChunkReader::crc_is_valid`] then returns `false`. A
/// pre-sealed chunk ([`ChunkReader::is_presealed`]) is the exception: its
/// bytes are read and checked against their CRC as in a log without
/// encryption, and its writer's own seal authenticates them.
#[derive(Debug)]
pub struct ChunkReader {
    // Holding the file (not just a path) keeps the segment from being
    // recycled under this reader: recycling waits for readers to finish.
    pub(crate) _segment: Option<Arc<Segment>>,
    file: Arc<dyn FileHandle>,
    position: LogPosition,
    data_offset: u64,
    length: u32,
    read: u32,
    hasher: crc32fast::Hasher,
    /// The data and its CRC trailer, when they were read together with the
    /// record header (small chunks read back from a segment).
    prefetched: Option<Vec<u8>>,
    /// The CRC trailer, kept when the prefetched buffer was handed out by
    /// `take_all`.
    stored_crc: Option<u32>,
    /// The frames of a chunk in an encrypted segment.
    frames: Option<Box<Frames>>,
    /// A pre-sealed chunk of an encrypted segment: its bytes are as its
    /// writer gave them, checked by their CRC only.
    presealed: bool,
}

/// The frames of an encrypted chunk, opened one at a time.
#[derive(Debug)]
struct Frames {
    seal: Arc<SegmentSeal>,
    chunk: ChunkId,
    /// All frames, when they were read together with the record header
    /// (small chunks).
    raw: Option<Vec<u8>>,
    /// The frame opened last: nonce, plaintext, tag.
    frame: Vec<u8>,
    /// Its plaintext bytes not handed out yet start here (after the nonce).
    at: usize,
    /// Where its plaintext ends.
    end: usize,
    /// The next frame to open.
    next: u64,
    /// A frame did not authenticate.
    failed: bool,
}

impl ChunkReader {
    pub(crate) fn new(
        file: Arc<dyn FileHandle>,
        position: LogPosition,
        data_offset: u64,
        length: u32,
    ) -> Self {
        Self {
            _segment: None,
            file,
            position,
            data_offset,
            length,
            read: 0,
            hasher: crc32fast::Hasher::new(),
            prefetched: None,
            stored_crc: None,
            frames: None,
            presealed: false,
        }
    }

    /// Marks the chunk as pre-sealed (see [`ChunkReader::is_presealed`]).
    pub(crate) fn with_presealed(mut self, presealed: bool) -> Self {
        self.presealed = presealed;
        self
    }

    /// A reader over a chunk of an encrypted segment whose frames start at
    /// `data_offset` in `file`, or (`raw`) were read already.
    pub(crate) fn sealed(
        file: Arc<dyn FileHandle>,
        position: LogPosition,
        data_offset: u64,
        seal: Arc<SegmentSeal>,
        chunk: ChunkId,
        raw: Option<Vec<u8>>,
    ) -> Self {
        Self {
            frames: Some(Box::new(Frames {
                seal,
                chunk,
                raw,
                frame: Vec::new(),
                at: NONCE_BYTES,
                end: NONCE_BYTES,
                next: 0,
                failed: false,
            })),
            ..Self::new(file, position, data_offset, chunk.length)
        }
    }

    /// A reader over `bytes`, the chunk's data followed by its trailer,
    /// already read from `file`.
    pub(crate) fn prefetched(
        file: Arc<dyn FileHandle>,
        position: LogPosition,
        data_offset: u64,
        bytes: Vec<u8>,
    ) -> Self {
        let length = (bytes.len() - CHUNK_TRAILER_SIZE) as u32;
        Self {
            prefetched: Some(bytes),
            ..Self::new(file, position, data_offset, length)
        }
    }

    /// Where this chunk is in the log.
    #[must_use]
    pub fn position(&self) -> LogPosition {
        self.position
    }

    /// Whether the chunk was written with
    /// [`EntryWriter::write_presealed_chunk`](crate::EntryWriter::write_presealed_chunk)
    /// into an encrypted log: its bytes are the writer's own sealed bytes,
    /// checked against their CRC32 (torn or damaged writes fail as
    /// `InvalidData`) but not authenticated by the log. `false` for every
    /// other chunk, and for every chunk of a log without encryption.
    #[must_use]
    pub fn is_presealed(&self) -> bool {
        self.presealed
    }

    /// The length of the chunk's data.
    #[must_use]
    pub fn chunk_length(&self) -> u32 {
        self.length
    }

    /// How many bytes of data have not been read yet.
    #[must_use]
    pub fn bytes_remaining(&self) -> u32 {
        self.length - self.read
    }

    /// Reads (and hashes) any unread data, then compares the CRC of the
    /// whole chunk with the one stored on disk. In an encrypted log: reads
    /// any unread data and returns whether every frame authenticated (for
    /// a pre-sealed chunk, whether its CRC matches).
    pub fn crc_is_valid(&mut self) -> io::Result<bool> {
        if self.frames.is_some() {
            let mut buffer = vec![0_u8; (self.bytes_remaining() as usize).min(256 * 1024)];
            while self.bytes_remaining() > 0 {
                let wanted = buffer.len().min(self.bytes_remaining() as usize);
                match self.read(&mut buffer[..wanted]) {
                    Ok(_) => {}
                    Err(_) if self.frames.as_ref().is_some_and(|f| f.failed) => break,
                    Err(error) => return Err(error),
                }
            }
            if let Err(error) = self.open_empty() {
                if !self.frames.as_ref().is_some_and(|f| f.failed) {
                    return Err(error);
                }
            }
            return Ok(!self.frames.as_ref().is_some_and(|f| f.failed));
        }
        self.hash_rest()?;
        if let Some(stored) = self.stored_crc {
            return Ok(self.hasher.clone().finalize() == stored);
        }
        let mut stored = [0_u8; CHUNK_TRAILER_SIZE];
        match &self.prefetched {
            Some(bytes) => stored.copy_from_slice(&bytes[self.length as usize..]),
            None => self
                .file
                .read_exact_at(&mut stored, self.data_offset + u64::from(self.length))?,
        }
        Ok(self.hasher.clone().finalize() == u32::from_le_bytes(stored))
    }

    /// Hashes the data not read yet. Prefetched bytes are hashed where they
    /// are; file data goes through one buffer for the whole rest, not
    /// `io::copy`'s stack buffer, which is zeroed on every call (that was
    /// a quarter of a checkpoint's instructions for small entries).
    fn hash_rest(&mut self) -> io::Result<()> {
        let remaining = self.bytes_remaining() as usize;
        if remaining == 0 {
            return Ok(());
        }
        if let Some(bytes) = &self.prefetched {
            let start = self.read as usize;
            self.hasher.update(&bytes[start..start + remaining]);
            self.read = self.length;
            return Ok(());
        }
        let mut buffer = vec![0_u8; remaining.min(256 * 1024)];
        while self.bytes_remaining() > 0 {
            let wanted = buffer.len().min(self.bytes_remaining() as usize);
            self.read_exact(&mut buffer[..wanted])?;
        }
        Ok(())
    }

    /// Reads the rest of the chunk (all of it if nothing was read yet),
    /// failing with `InvalidData` if the chunk's CRC does not match.
    pub fn read_all(mut self) -> io::Result<Vec<u8>> {
        self.take_all()
    }

    /// [`ChunkReader::read_all`] that leaves the reader usable (for
    /// `crc_is_valid` and `bytes_remaining`, which then reports 0).
    pub(crate) fn take_all(&mut self) -> io::Result<Vec<u8>> {
        if self.frames.is_some() {
            let mut data = vec![0; self.bytes_remaining() as usize];
            self.read_exact(&mut data)?;
            self.open_empty()?;
            return Ok(data);
        }
        let start = self.read as usize;
        let end = self.length as usize;
        if let Some(mut bytes) = self.prefetched.take() {
            // Hand over the prefetched buffer itself: no zero-filled copy
            // as `read_to_end` would make.
            self.hasher.update(&bytes[start..end]);
            self.read = self.length;
            let stored = u32::from_le_bytes(
                bytes[end..end + CHUNK_TRAILER_SIZE]
                    .try_into()
                    .expect("4 bytes"),
            );
            self.stored_crc = Some(stored);
            if self.hasher.clone().finalize() != stored {
                return Err(self.crc_mismatch());
            }
            bytes.truncate(end);
            bytes.drain(..start);
            return Ok(bytes);
        }
        let mut data = vec![0; end - start];
        self.read_exact(&mut data)?;
        if self.crc_is_valid()? {
            Ok(data)
        } else {
            Err(self.crc_mismatch())
        }
    }

    /// Opens the one frame of an empty encrypted chunk, which no read
    /// reaches.
    fn open_empty(&mut self) -> io::Result<()> {
        let position = self.position;
        let data_offset = self.data_offset;
        let file = self.file.clone();
        match self.frames.as_mut() {
            Some(frames) if frames.chunk.length == 0 && frames.next == 0 && !frames.failed => {
                frames.open_next(&*file, data_offset).map_err(|error| {
                    frames.failed = true;
                    error.unwrap_or_else(|| unauthentic(position))
                })
            }
            Some(frames) if frames.failed => Err(unauthentic(position)),
            _ => Ok(()),
        }
    }

    /// Reads from the frames of an encrypted chunk (see [`Frames`]).
    fn read_sealed(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let wanted = buf.len().min(self.bytes_remaining() as usize);
        if wanted == 0 {
            return Ok(0);
        }
        let position = self.position;
        let data_offset = self.data_offset;
        let file = self.file.clone();
        let frames = self.frames.as_mut().expect("an encrypted chunk");
        if frames.failed {
            return Err(unauthentic(position));
        }
        if frames.at == frames.end {
            frames.open_next(&*file, data_offset).map_err(|error| {
                frames.failed = true;
                match error {
                    Some(error) => error,
                    None => unauthentic(position),
                }
            })?;
        }
        let n = wanted.min(frames.end - frames.at);
        buf[..n].copy_from_slice(&frames.frame[frames.at..frames.at + n]);
        frames.at += n;
        self.read += n as u32;
        Ok(n)
    }

    fn crc_mismatch(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("chunk at {} failed its CRC check", self.position),
        )
    }
}

/// A reader over the chunk record at `position` in `file`, a segment of
/// `layout` whose records end at `limit`: `InvalidData` if no chunk
/// record whose header verifies starts there.
pub(crate) fn chunk_at(
    file: &Arc<dyn FileHandle>,
    layout: &Layout,
    position: LogPosition,
    limit: u64,
) -> io::Result<ChunkReader> {
    let invalid = |why: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("no chunk at {position}: {why}"),
        )
    };
    let header_size = layout.header_size();
    let header_end = position.offset.saturating_add(header_size as u64);
    if position.offset < HEADER_SIZE || header_end > limit {
        return Err(invalid("offset is outside the segment's records"));
    }
    let mut header = [0_u8; SEALED_RECORD_HEADER_SIZE];
    let header = &mut header[..header_size];
    file.read_exact_at(header, position.offset)?;
    let (header, index) = layout
        .decode(header, position.file_id, position.offset)
        .map_err(|e| invalid(&format!("{e:?}")))?;
    if !header.kind.is_chunk() {
        return Err(invalid("the record there is not a chunk"));
    }
    if position.offset + layout.record_len(&header) > limit {
        return Err(invalid("the chunk extends past the written records"));
    }
    Ok(match layout {
        Layout::Plain => ChunkReader::new(file.clone(), position, header_end, header.length),
        Layout::Sealed(_) if header.kind == RecordKind::PresealedChunk => {
            ChunkReader::new(file.clone(), position, header_end, header.length).with_presealed(true)
        }
        Layout::Sealed(seal) => ChunkReader::sealed(
            file.clone(),
            position,
            header_end,
            seal.clone(),
            ChunkId {
                entry_id: header.entry_id,
                index,
                length: header.length,
            },
            None,
        ),
    })
}

fn unauthentic(position: LogPosition) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "chunk at {position} does not authenticate: its encrypted bytes are damaged or not \
             from this place"
        ),
    )
}

impl Frames {
    /// Reads and opens the next frame. `Err(None)` if it does not
    /// authenticate (or is cut short by the end of the file).
    fn open_next(
        &mut self,
        file: &dyn FileHandle,
        data_offset: u64,
    ) -> Result<(), Option<io::Error>> {
        let (start, len) = frame_span(self.chunk.length, self.next);
        let total = len + FRAME_OVERHEAD;
        self.frame.clear();
        match &self.raw {
            Some(raw) => {
                let start = start as usize;
                let bytes = raw.get(start..start + total).ok_or(None)?;
                self.frame.extend_from_slice(bytes);
            }
            None => {
                self.frame.resize(total, 0);
                match file.read_exact_at(&mut self.frame, data_offset + start) {
                    Ok(()) => {}
                    Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Err(None),
                    Err(error) => return Err(Some(error)),
                }
            }
        }
        if !self.seal.open_frame(self.chunk, self.next, &mut self.frame) {
            return Err(None);
        }
        self.next += 1;
        self.at = NONCE_BYTES;
        self.end = NONCE_BYTES + len;
        Ok(())
    }
}

impl Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.frames.is_some() {
            return self.read_sealed(buf);
        }
        let wanted = buf.len().min(self.bytes_remaining() as usize);
        if wanted == 0 {
            return Ok(0);
        }
        let n = match &self.prefetched {
            Some(bytes) => {
                let start = self.read as usize;
                buf[..wanted].copy_from_slice(&bytes[start..start + wanted]);
                wanted
            }
            None => self
                .file
                .read_at(&mut buf[..wanted], self.data_offset + u64::from(self.read))?,
        };
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "chunk at {} is cut short by the end of its file",
                    self.position
                ),
            ));
        }
        self.hasher.update(&buf[..n]);
        self.read += n as u32;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::{FileSystem, MemoryFileSystem, OpenMode};

    /// A prefetched reader over `data` whose stored CRC is `crc`.
    fn prefetched(data: &[u8], crc: u32) -> ChunkReader {
        let fs = MemoryFileSystem::new();
        fs.create_dir_all(std::path::Path::new("/d")).unwrap();
        let file = fs
            .open(std::path::Path::new("/d/f"), OpenMode::Create)
            .unwrap();
        let mut bytes = data.to_vec();
        bytes.extend(crc.to_le_bytes());
        let position = LogPosition {
            file_id: 1,
            offset: 100,
        };
        ChunkReader::prefetched(file, position, 125, bytes)
    }

    #[test]
    fn read_all_returns_the_unread_rest_and_checks_the_whole_chunk() {
        let data: Vec<u8> = (0..5000_u32).map(|i| (i * 7) as u8).collect();
        let crc = crc32fast::hash(&data);
        assert_eq!(prefetched(&data, crc).read_all().unwrap(), data);

        let mut reader = prefetched(&data, crc);
        let mut head = [0_u8; 10];
        reader.read_exact(&mut head).unwrap();
        assert_eq!(head, data[..10]);
        assert_eq!(reader.read_all().unwrap(), data[10..]);

        assert_eq!(
            prefetched(&[], crc32fast::hash(&[])).read_all().unwrap(),
            b""
        );
    }

    #[test]
    fn read_all_rejects_a_chunk_whose_crc_does_not_match() {
        let data = b"some chunk data".to_vec();
        let wrong = crc32fast::hash(&data) ^ 1;
        let err = prefetched(&data, wrong).read_all().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("failed its CRC"), "{err}");

        // Bytes read before `read_all` count too.
        let mut reader = prefetched(&data, wrong);
        let mut head = [0_u8; 4];
        reader.read_exact(&mut head).unwrap();
        assert!(reader.read_all().is_err());

        // After a failed `take_all` the reader is spent and still says why.
        let mut reader = prefetched(&data, wrong);
        assert!(reader.take_all().is_err());
        assert_eq!(reader.bytes_remaining(), 0);
        assert!(!reader.crc_is_valid().unwrap());
        assert_eq!(reader.read(&mut head).unwrap(), 0);
        // And after a good one, the CRC it checked is kept.
        let crc = crc32fast::hash(&data);
        let mut reader = prefetched(&data, crc);
        assert_eq!(reader.take_all().unwrap(), data);
        assert!(reader.crc_is_valid().unwrap());
        assert_eq!(reader.take_all().unwrap(), b"");
    }
}
