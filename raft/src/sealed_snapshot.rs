//! Sealed snapshot files: the snapshot stream of [`crate::snapshot`] cut
//! into blocks of [`BLOCK_BYTES`], each sealed on its own, so that a
//! snapshot can be written as it streams in and read from any offset as
//! it streams out.
//!
//! ```text
//! "SRSNAPX1" | u32 block bytes | key check (48) | u32 CRC32 of the 60 bytes before
//! { seal (48) | sealed block } ...
//! ```
//!
//! Every block but the last holds exactly `block bytes` of the stream;
//! the last holds 1 to `block bytes` (0 only if the stream is empty).
//! Each block's seal authenticates it with the file's header (whose key
//! check has a nonce of its own, so no two files share it), the block's
//! index and whether it is the last: a changed block, a block moved
//! within the file or from another file, a file cut short at a block
//! boundary or a header from another file fails to open.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use okaywal::encryption::{Cipher, Seal, SEAL_BYTES};

use crate::encryption::{key_check_header, verify_key_check_header};
use crate::log_format::open_or_damaged;

/// The magic of a sealed snapshot file.
pub const SEALED_MAGIC: &[u8; 8] = b"SRSNAPX1";
/// The magic of a plain snapshot file.
pub const PLAIN_MAGIC: &[u8; 8] = b"SRSNAP01";
/// Bytes of stream in each block but the last.
pub const BLOCK_BYTES: usize = 64 << 10;
/// Bytes of a sealed snapshot file's header.
pub const HEADER_BYTES: usize = 8 + 4 + SEAL_BYTES + 4;
/// What a snapshot file's key check is bound to.
const KEY_CONTEXT: &[u8] = b"sediment-raft snapshot";
/// What a snapshot block is bound to (with its place).
const BLOCK_CONTEXT: &[u8] = b"sediment-raft snapshot block";

fn damaged(path: &Path, detail: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{}: {detail}", path.display()),
    )
}

/// The form the file at `path` has, from its magic: `Some(true)` sealed,
/// `Some(false)` plain, `None` neither (or shorter than a magic).
///
/// # Errors
///
/// The file cannot be opened or read.
pub fn is_sealed(path: &Path) -> io::Result<Option<bool>> {
    let mut magic = [0_u8; 8];
    let mut file = File::open(path)?;
    let mut read = 0;
    while read < magic.len() {
        match file.read(&mut magic[read..])? {
            0 => return Ok(None),
            n => read += n,
        }
    }
    Ok(match &magic {
        m if m == SEALED_MAGIC => Some(true),
        m if m == PLAIN_MAGIC => Some(false),
        _ => None,
    })
}

fn block_context(header: &[u8], index: u64, last: bool) -> Vec<u8> {
    let mut associated = Vec::with_capacity(BLOCK_CONTEXT.len() + header.len() + 9);
    associated.extend_from_slice(BLOCK_CONTEXT);
    associated.extend_from_slice(header);
    associated.extend_from_slice(&index.to_le_bytes());
    associated.push(u8::from(last));
    associated
}

/// Reads the stream of a sealed snapshot file from any offset, opening
/// one block at a time.
#[derive(Debug)]
pub struct SealedSnapshotReader {
    file: File,
    path: PathBuf,
    cipher: Cipher,
    header: Vec<u8>,
    block_bytes: u64,
    blocks: u64,
    len: u64,
    position: u64,
    /// The last block opened: its index and bytes.
    cached: Option<(u64, Vec<u8>)>,
}

impl SealedSnapshotReader {
    /// Opens the sealed snapshot at `path` and checks its header and key.
    ///
    /// # Errors
    ///
    /// `InvalidData` (naming the file) if it is not a whole sealed
    /// snapshot; a `KeyError` (kind `PermissionDenied`, naming the file and
    /// the key id) if the key is wrong or missing.
    pub fn open(path: &Path, cipher: &Cipher) -> io::Result<Self> {
        let file = File::open(path)?;
        let shown = path.display().to_string();
        let file_len = file.metadata()?.len();
        let mut header = vec![0_u8; HEADER_BYTES];
        if file_len < HEADER_BYTES as u64 {
            return Err(damaged(path, "not a sealed snapshot (too short)"));
        }
        file.read_exact_at(&mut header, 0)?;
        if &header[..8] != SEALED_MAGIC {
            return Err(damaged(path, "not a sealed snapshot"));
        }
        // The key check sits after the block size: move it to where the
        // shared check expects it (right after the magic).
        let mut check = Vec::with_capacity(8 + SEAL_BYTES + 4);
        check.extend_from_slice(&header[..8]);
        check.extend_from_slice(&header[12..12 + SEAL_BYTES]);
        let crc = u32::from_le_bytes(header[HEADER_BYTES - 4..].try_into().expect("4 bytes"));
        if crc32fast::hash(&header[..HEADER_BYTES - 4]) != crc {
            return Err(damaged(path, "header checksum mismatch"));
        }
        check.extend_from_slice(&crc32fast::hash(&check).to_le_bytes());
        verify_key_check_header(cipher, &check, KEY_CONTEXT, &shown)?;
        let block_bytes = u64::from(u32::from_le_bytes(
            header[8..12].try_into().expect("4 bytes"),
        ));
        if block_bytes == 0 || block_bytes > 64 << 20 {
            return Err(damaged(path, format!("blocks of {block_bytes} bytes")));
        }
        let body = file_len - HEADER_BYTES as u64;
        let stride = block_bytes + SEAL_BYTES as u64;
        let blocks = body.div_ceil(stride).max(1);
        let last = body
            .checked_sub((blocks - 1) * stride)
            .and_then(|rest| rest.checked_sub(SEAL_BYTES as u64))
            .ok_or_else(|| damaged(path, "the last block is cut short"))?;
        Ok(Self {
            file,
            path: path.to_path_buf(),
            cipher: cipher.clone(),
            header,
            block_bytes,
            blocks,
            len: (blocks - 1) * block_bytes + last,
            position: 0,
            cached: None,
        })
    }

    /// Bytes of stream the file holds.
    #[must_use]
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the stream is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The offset in the stream the next read starts at.
    #[must_use]
    pub fn position(&self) -> u64 {
        self.position
    }

    /// The file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn block(&mut self, index: u64) -> io::Result<&[u8]> {
        if self.cached.as_ref().map(|(i, _)| *i) != Some(index) {
            self.cached = None;
            let last = index + 1 == self.blocks;
            let len = if last {
                self.len - index * self.block_bytes
            } else {
                self.block_bytes
            };
            let at = HEADER_BYTES as u64 + index * (self.block_bytes + SEAL_BYTES as u64);
            let mut seal = [0_u8; SEAL_BYTES];
            self.file.read_exact_at(&mut seal, at)?;
            let mut bytes = vec![0_u8; len as usize];
            self.file
                .read_exact_at(&mut bytes, at + SEAL_BYTES as u64)?;
            let what = self.path.display().to_string();
            open_or_damaged(
                &self.cipher,
                &Seal::from_bytes(&seal),
                &block_context(&self.header, index, last),
                &mut bytes,
                &what,
            )
            .map_err(|e| {
                if e.kind() == io::ErrorKind::InvalidData {
                    damaged(&self.path, format_args!("block {index}: {e}"))
                } else {
                    e
                }
            })?;
            self.cached = Some((index, bytes));
        }
        Ok(&self.cached.as_ref().expect("just cached").1)
    }

    /// Up to `max` bytes from the current position (fewer at a block's
    /// end; none at the end of the stream), moving the position past them.
    ///
    /// # Errors
    ///
    /// I/O errors; `InvalidData` naming the file and block if a block does
    /// not open.
    pub fn read_chunk(&mut self, max: usize) -> io::Result<Vec<u8>> {
        if self.position >= self.len || max == 0 {
            return Ok(Vec::new());
        }
        let index = self.position / self.block_bytes;
        let at = (self.position % self.block_bytes) as usize;
        let block = self.block(index)?;
        let n = (block.len() - at).min(max);
        let out = block[at..at + n].to_vec();
        self.position += n as u64;
        Ok(out)
    }
}

impl Read for SealedSnapshotReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.position >= self.len || buf.is_empty() {
            return Ok(0);
        }
        let index = self.position / self.block_bytes;
        let at = (self.position % self.block_bytes) as usize;
        let block = self.block(index)?;
        let n = (block.len() - at).min(buf.len());
        buf[..n].copy_from_slice(&block[at..at + n]);
        self.position += n as u64;
        Ok(n)
    }
}

impl Seek for SealedSnapshotReader {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        let target = match pos {
            SeekFrom::Start(at) => Some(at),
            SeekFrom::End(delta) => self.len.checked_add_signed(delta),
            SeekFrom::Current(delta) => self.position.checked_add_signed(delta),
        };
        let target = target
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "seek before the start"))?;
        self.position = target;
        Ok(target)
    }
}

/// Writes a sealed snapshot file as its stream arrives: a block is sealed
/// once the byte after it arrives (so the last block is known to be the
/// last), and [`SealedSnapshotWriter::finish`] seals the last one.
#[derive(Debug)]
pub struct SealedSnapshotWriter {
    file: File,
    path: PathBuf,
    cipher: Cipher,
    header: Vec<u8>,
    sealed_blocks: u64,
    /// The stream after the sealed blocks (at most one block).
    pending: Vec<u8>,
}

impl SealedSnapshotWriter {
    /// Creates (or truncates) `path` and writes the header, with a key
    /// check of `cipher`'s current key.
    ///
    /// # Errors
    ///
    /// I/O and key provider errors.
    pub fn create(path: &Path, cipher: &Cipher) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        let check = key_check_header(cipher, SEALED_MAGIC, KEY_CONTEXT)?;
        let mut header = Vec::with_capacity(HEADER_BYTES);
        header.extend_from_slice(SEALED_MAGIC);
        header.extend_from_slice(&(BLOCK_BYTES as u32).to_le_bytes());
        header.extend_from_slice(&check[8..8 + SEAL_BYTES]);
        let crc = crc32fast::hash(&header);
        header.extend_from_slice(&crc.to_le_bytes());
        file.write_all_at(&header, 0)?;
        Ok(Self {
            file,
            path: path.to_path_buf(),
            cipher: cipher.clone(),
            header,
            sealed_blocks: 0,
            pending: Vec::with_capacity(BLOCK_BYTES),
        })
    }

    /// The file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes of stream written so far.
    #[must_use]
    pub fn position(&self) -> u64 {
        self.sealed_blocks * BLOCK_BYTES as u64 + self.pending.len() as u64
    }

    fn block_at(index: u64) -> u64 {
        HEADER_BYTES as u64 + index * (BLOCK_BYTES + SEAL_BYTES) as u64
    }

    fn seal_pending(&mut self, last: bool) -> io::Result<()> {
        let index = self.sealed_blocks;
        let mut block = std::mem::take(&mut self.pending);
        let seal = self
            .cipher
            .seal(&block_context(&self.header, index, last), &mut block)?;
        let mut out = Vec::with_capacity(SEAL_BYTES + block.len());
        out.extend_from_slice(&seal.to_bytes());
        out.extend_from_slice(&block);
        self.file.write_all_at(&out, Self::block_at(index))?;
        self.sealed_blocks += 1;
        block.clear();
        self.pending = block;
        Ok(())
    }

    /// Reads back and opens the sealed block `index` (a whole block, not
    /// sealed as the last).
    fn reopen(&self, index: u64) -> io::Result<Vec<u8>> {
        let at = Self::block_at(index);
        let mut seal = [0_u8; SEAL_BYTES];
        self.file.read_exact_at(&mut seal, at)?;
        let mut block = vec![0_u8; BLOCK_BYTES];
        self.file
            .read_exact_at(&mut block, at + SEAL_BYTES as u64)?;
        let what = self.path.display().to_string();
        open_or_damaged(
            &self.cipher,
            &Seal::from_bytes(&seal),
            &block_context(&self.header, index, false),
            &mut block,
            &what,
        )
        .map_err(|e| damaged(&self.path, format_args!("block {index}: {e}")))?;
        Ok(block)
    }

    /// Goes back to offset `to` of the stream (a chunk sent again), dropping
    /// what was written after it. Going forward is refused: chunks arrive
    /// in order.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for an offset past what was written; I/O errors, or
    /// `InvalidData` if a block to resume from does not open.
    pub fn rewind(&mut self, to: u64) -> io::Result<u64> {
        let position = self.position();
        if to > position {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("snapshot chunk at offset {to} after only {position} bytes"),
            ));
        }
        let sealed_end = self.sealed_blocks * BLOCK_BYTES as u64;
        if to >= sealed_end {
            self.pending.truncate((to - sealed_end) as usize);
            return Ok(to);
        }
        let index = to / BLOCK_BYTES as u64;
        let keep = (to % BLOCK_BYTES as u64) as usize;
        let mut pending = Vec::with_capacity(BLOCK_BYTES);
        if keep > 0 {
            pending = self.reopen(index)?;
            pending.truncate(keep);
        }
        self.file.set_len(Self::block_at(index))?;
        self.sealed_blocks = index;
        self.pending = pending;
        Ok(to)
    }

    /// Seals the last block and syncs the file.
    ///
    /// # Errors
    ///
    /// I/O and key provider errors.
    pub fn finish(mut self) -> io::Result<File> {
        if !self.pending.is_empty() || self.sealed_blocks == 0 {
            self.seal_pending(true)?;
        } else {
            // The stream ends at a block boundary (after a rewind): the
            // block sealed last is the last, so seal it again as such.
            let index = self.sealed_blocks - 1;
            let at = Self::block_at(index);
            let block = self.reopen(index)?;
            self.file.set_len(at)?;
            self.sealed_blocks = index;
            self.pending = block;
            self.seal_pending(true)?;
        }
        self.file.sync_all()?;
        Ok(self.file)
    }
}

impl Write for SealedSnapshotWriter {
    fn write(&mut self, mut buf: &[u8]) -> io::Result<usize> {
        let written = buf.len();
        while !buf.is_empty() {
            if self.pending.len() == BLOCK_BYTES {
                self.seal_pending(false)?;
            }
            let n = (BLOCK_BYTES - self.pending.len()).min(buf.len());
            self.pending.extend_from_slice(&buf[..n]);
            buf = &buf[n..];
        }
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use okaywal::encryption::StaticKey;

    fn stream(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 300) as u8).collect()
    }

    fn write(path: &Path, cipher: &Cipher, bytes: &[u8], pieces: usize) {
        let mut writer = SealedSnapshotWriter::create(path, cipher).unwrap();
        for piece in bytes.chunks(pieces.max(1)) {
            writer.write_all(piece).unwrap();
        }
        writer.finish().unwrap();
    }

    fn read_all(path: &Path, cipher: &Cipher) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        SealedSnapshotReader::open(path, cipher)?.read_to_end(&mut out)?;
        Ok(out)
    }

    #[test]
    fn streams_of_every_shape_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let cipher = Cipher::new(StaticKey::new([3; 32]));
        let path = dir.path().join("s");
        for len in [
            0,
            1,
            1000,
            BLOCK_BYTES - 1,
            BLOCK_BYTES,
            BLOCK_BYTES + 1,
            3 * BLOCK_BYTES,
        ] {
            let bytes = stream(len);
            write(&path, &cipher, &bytes, 5000);
            assert_eq!(read_all(&path, &cipher).unwrap(), bytes, "length {len}");
            let mut reader = SealedSnapshotReader::open(&path, &cipher).unwrap();
            assert_eq!(reader.len(), len as u64);
            if len > 10 {
                reader.seek(SeekFrom::Start(len as u64 - 10)).unwrap();
                let mut tail = Vec::new();
                reader.read_to_end(&mut tail).unwrap();
                assert_eq!(tail, &bytes[len - 10..]);
            }
        }
    }

    #[test]
    fn a_rewound_writer_writes_the_same_file() {
        let dir = tempfile::tempdir().unwrap();
        let cipher = Cipher::new(StaticKey::new([3; 32]));
        let path = dir.path().join("s");
        let bytes = stream(3 * BLOCK_BYTES + 77);
        let mut writer = SealedSnapshotWriter::create(&path, &cipher).unwrap();
        writer.write_all(&bytes[..2 * BLOCK_BYTES + 10]).unwrap();
        for to in [2 * BLOCK_BYTES as u64 + 5, BLOCK_BYTES as u64 + 3, 0] {
            writer.rewind(to).unwrap();
            writer
                .write_all(&bytes[to as usize..2 * BLOCK_BYTES + 10])
                .unwrap();
        }
        assert!(writer.rewind(3 * BLOCK_BYTES as u64).is_err());
        writer.write_all(&bytes[2 * BLOCK_BYTES + 10..]).unwrap();
        writer.finish().unwrap();
        assert_eq!(read_all(&path, &cipher).unwrap(), bytes);
    }

    #[test]
    fn damage_moves_and_wrong_keys_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let cipher = Cipher::new(StaticKey::new([3; 32]));
        let bytes = stream(2 * BLOCK_BYTES + 100);
        let path = dir.path().join("s");
        write(&path, &cipher, &bytes, 9999);
        let original = std::fs::read(&path).unwrap();

        let wrong = Cipher::new(StaticKey::new([4; 32]));
        let error = read_all(&path, &wrong).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::PermissionDenied);
        assert!(error.to_string().contains("key id 1"), "{error}");

        let mut flipped = original.clone();
        flipped[HEADER_BYTES + SEAL_BYTES + 9] ^= 1;
        std::fs::write(&path, &flipped).unwrap();
        let error = read_all(&path, &cipher).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        assert!(error.to_string().contains("block 0"), "{error}");

        // The last block dropped: the one before was not sealed as last.
        let stride = BLOCK_BYTES + SEAL_BYTES;
        std::fs::write(&path, &original[..HEADER_BYTES + 2 * stride]).unwrap();
        assert_eq!(
            read_all(&path, &cipher).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );

        // Two blocks swapped.
        let mut swapped = original.clone();
        let (a, b) = (HEADER_BYTES, HEADER_BYTES + stride);
        let first = original[a..a + stride].to_vec();
        swapped[a..a + stride].copy_from_slice(&original[b..b + stride]);
        swapped[b..b + stride].copy_from_slice(&first);
        std::fs::write(&path, &swapped).unwrap();
        assert_eq!(
            read_all(&path, &cipher).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );

        // A block from another file of the same stream and key.
        let other = dir.path().join("t");
        write(&other, &cipher, &bytes, 9999);
        let mut mixed = original.clone();
        mixed[a..a + stride].copy_from_slice(&std::fs::read(&other).unwrap()[a..a + stride]);
        std::fs::write(&path, &mixed).unwrap();
        assert_eq!(
            read_all(&path, &cipher).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        for window in bytes.windows(16).step_by(4099) {
            assert!(!original.windows(16).any(|w| w == window));
        }
    }
}
