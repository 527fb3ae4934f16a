//! The buffered front-to-back reader a segment walk reads through, and
//! its search for the next record header that verifies.

use std::io;

use crate::format::{
    peek_sealed_record, sealed_record_len, RecordHeader, RECORD_HEADER_SIZE,
    SEALED_RECORD_HEADER_SIZE,
};
use crate::fs::FileHandle;
use crate::sealed::Layout;

/// Reads a file front to back through a buffer.
pub(super) struct Sequential<'a> {
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
    pub(super) fn new(file: &'a dyn FileHandle, buffer_bytes: usize) -> Self {
        Self::with_buffer(file, Vec::new(), buffer_bytes)
    }

    /// Reuses `buffer` (its contents are ignored) if it has the size
    /// `buffer_bytes` asks for.
    pub(super) fn with_buffer(
        file: &'a dyn FileHandle,
        mut buffer: Vec<u8>,
        buffer_bytes: usize,
    ) -> Self {
        let size = buffer_bytes.max(SEALED_RECORD_HEADER_SIZE * 2);
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

    /// Filling the buffer stops at `limit`, where the caller's walk ends.
    pub(super) fn stop_filling_at(&mut self, limit: u64) {
        self.limit = limit;
    }

    pub(super) fn into_buffer(self) -> Vec<u8> {
        self.buffer
    }

    /// Drops what the buffer holds, so that the next read goes to the file.
    pub(super) fn forget(&mut self) {
        self.buffer_len = 0;
    }

    /// Returns up to `len` bytes at `offset`, fewer only at the end of the
    /// file. `len` must not exceed the buffer size.
    pub(super) fn bytes_at(&mut self, offset: u64, len: usize) -> io::Result<&[u8]> {
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

    /// The `len` bytes at `offset` appended to `out`, read in pieces the
    /// size of the buffer; fewer only at the end of the file.
    pub(super) fn read_into(
        &mut self,
        offset: u64,
        len: usize,
        out: &mut Vec<u8>,
    ) -> io::Result<()> {
        let mut at = offset;
        let end = offset + len as u64;
        while at < end {
            let piece = ((end - at) as usize).min(self.buffer.len());
            let bytes = self.bytes_at(at, piece)?;
            if bytes.is_empty() {
                break;
            }
            out.extend_from_slice(bytes);
            at += bytes.len() as u64;
        }
        Ok(())
    }

    /// Finds the next offset at or after `from` (and below `limit`) where a
    /// record header of this segment verifies: its header and length.
    pub(super) fn next_record(
        &mut self,
        from: u64,
        limit: u64,
        salt: u64,
        probe: Probe<'_>,
    ) -> io::Result<Option<(u64, RecordHeader, u64)>> {
        // Windows overlap by the longest header a record may have, and a
        // record may start as late as the shortest fits.
        let (shortest, longest) = probe.header_sizes();
        let mut at = from;
        while at + shortest as u64 <= limit {
            let window = (self.buffer.len() - longest).min((limit - at) as usize);
            let bytes = self.bytes_at(at, window + longest)?.to_vec();
            if bytes.len() < shortest {
                return Ok(None);
            }
            for i in 0..=(bytes.len() - shortest) {
                // A record starts with its kind (1–5): skip everything else,
                // which makes zeroed space cheap to cross.
                if !(1..=5).contains(&bytes[i]) {
                    continue;
                }
                let offset = at + i as u64;
                if let Some((header, len)) = probe.accept(&bytes[i..], salt, offset) {
                    if offset + len <= limit {
                        return Ok(Some((offset, header, len)));
                    }
                }
            }
            if bytes.len() < window + longest {
                // The end of the file: every offset was tried.
                return Ok(None);
            }
            at += (bytes.len() - longest + 1) as u64;
        }
        Ok(None)
    }
}

/// What [`Sequential::next_record`] takes for a record.
#[derive(Debug, Clone, Copy)]
pub(super) enum Probe<'a> {
    /// A record of this layout that verifies (and, encrypted, opens).
    Layout(&'a Layout),
    /// A record of either layout whose checksum verifies, for a segment
    /// whose header (and so its layout and key) is unknown.
    AnyLayout,
}

impl Probe<'_> {
    /// The shortest and the longest record header the probe takes.
    fn header_sizes(self) -> (usize, usize) {
        match self {
            Probe::Layout(layout) => (layout.header_size(), layout.header_size()),
            Probe::AnyLayout => (RECORD_HEADER_SIZE, SEALED_RECORD_HEADER_SIZE),
        }
    }

    /// The header and length of the record at the start of `bytes`, if
    /// it verifies and belongs to segment `salt`.
    fn accept(self, bytes: &[u8], salt: u64, offset: u64) -> Option<(RecordHeader, u64)> {
        match self {
            Probe::Layout(layout) => {
                let (header, _) = layout.decode(bytes, salt, offset).ok()?;
                (header.entry_id >= salt).then(|| (header, layout.record_len(&header)))
            }
            Probe::AnyLayout => {
                if let Ok(header) = RecordHeader::decode(bytes, salt) {
                    if header.entry_id >= salt {
                        return Some((header, header.record_len()));
                    }
                }
                let (kind, length) = peek_sealed_record(bytes, salt).ok()?;
                let header = RecordHeader {
                    kind,
                    entry_id: salt,
                    length,
                    durable_mark: 0,
                };
                Some((header, sealed_record_len(kind, length)))
            }
        }
    }
}
