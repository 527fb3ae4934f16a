//! Reading one chunk's data, checking its CRC at the end.

use std::io::{self, Read};
use std::sync::Arc;

use crate::format::CHUNK_TRAILER_SIZE;
use crate::fs::FileHandle;
use crate::position::LogPosition;
use crate::segment::Segment;

/// A reader over the data of one chunk, returned by
/// [`WriteAheadLog::read_at`](crate::WriteAheadLog::read_at).
///
/// The CRC stored after the data is compared once the data has been read
/// to the end: see [`ChunkReader::crc_is_valid`]. Reading past a mismatch
/// is not prevented, so callers that need verified bytes read everything
/// and then check.
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
    /// whole chunk with the one stored on disk.
    pub fn crc_is_valid(&mut self) -> io::Result<bool> {
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

    fn crc_mismatch(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("chunk at {} failed its CRC check", self.position),
        )
    }
}

impl Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
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
