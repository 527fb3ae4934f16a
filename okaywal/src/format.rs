//! Bytes on disk ↔ structs, with no I/O policy. `FORMAT.md` describes the
//! same layout in prose.

/// The first seven bytes of every segment file.
pub const MAGIC: [u8; 7] = *b"OKAYWAL";
/// The version of the byte format written by this crate for logs without
/// encryption.
pub const FORMAT_VERSION: u8 = 1;
/// The version of the byte format this crate writes for encrypted logs
/// (FORMAT.md, "Encrypted logs"): version 2 with pre-sealed chunks.
pub const ENCRYPTED_FORMAT_VERSION: u8 = 3;
/// The first version of the encrypted format, still read: the same
/// layout without pre-sealed chunks.
pub const FIRST_ENCRYPTED_FORMAT_VERSION: u8 = 2;

/// Whether `version` is a version of the encrypted format this crate
/// reads.
#[must_use]
pub fn is_encrypted_version(version: u8) -> bool {
    (FIRST_ENCRYPTED_FORMAT_VERSION..=ENCRYPTED_FORMAT_VERSION).contains(&version)
}
/// Size of the segment header; records start at this offset.
pub const HEADER_SIZE: u64 = 512;
/// Size of a record header (every record starts with one).
pub const RECORD_HEADER_SIZE: usize = 25;
/// Size of the CRC32 that follows a chunk's data.
pub const CHUNK_TRAILER_SIZE: usize = 4;
/// The most bytes of `version_info` a segment header can hold.
pub const MAX_VERSION_INFO: usize = 255;
/// The data of a chunk written whole by its writer (larger than 64 KiB)
/// starts at a multiple of this offset, after a padding record if needed.
pub const CHUNK_ALIGNMENT: u64 = 4096;
/// Size of a record header in an encrypted segment.
pub const SEALED_RECORD_HEADER_SIZE: usize = 69;
/// Where the CRC of an encrypted record header starts.
pub const SEALED_RECORD_CRC_AT: usize = SEALED_RECORD_HEADER_SIZE - 4;
/// Size of the encrypted part of an encrypted record header: entry id,
/// durable mark and a number (the chunk's index in its entry, or the
/// commit's chunk count).
pub const SEALED_RECORD_BODY: usize = 20;
/// Plaintext bytes in each frame of an encrypted chunk's data (the last
/// frame may hold fewer).
pub const FRAME_BYTES: usize = 64 * 1024;
/// Bytes a frame adds to its plaintext: a 24-byte nonce before it and a
/// 16-byte tag after it.
pub const FRAME_OVERHEAD: usize = 24 + 16;
/// Size of the encrypted part of an encrypted segment header: previous
/// id, previous end, `version_info` length and `version_info` padded to
/// its largest size.
pub const SEALED_HEADER_BODY: usize = 8 + 8 + 1 + MAX_VERSION_INFO;
/// Where the encrypted part of an encrypted segment header starts.
pub const SEALED_HEADER_BODY_AT: usize = 100;

/// The header at offset 0 of every segment file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentHeader {
    /// The id of the first entry this segment may hold; also the segment's
    /// id and the salt of every record CRC inside it.
    pub first_entry_id: u64,
    /// The segment before this one and where it ended, when it was closed
    /// before this one was started: recovery checks that nothing of it was
    /// lost before trusting this segment.
    pub previous: Option<(u64, u64)>,
    /// The user's version information.
    pub version_info: Vec<u8>,
}

/// Why bytes did not decode as a segment header.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderError {
    /// Fewer than [`HEADER_SIZE`] bytes.
    TooShort,
    /// The magic bytes are wrong: not a segment file (or never written).
    BadMagic,
    /// A format version this crate cannot read.
    UnknownVersion(u8),
    /// The header's checksum does not match its contents.
    BadChecksum,
}

impl std::fmt::Display for HeaderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeaderError::TooShort => f.write_str("segment header is truncated"),
            HeaderError::BadMagic => f.write_str("segment header has no okaywal magic"),
            HeaderError::UnknownVersion(v) => write!(f, "unknown segment format version {v}"),
            HeaderError::BadChecksum => f.write_str("segment header checksum mismatch"),
        }
    }
}

impl SegmentHeader {
    /// Encodes the header into exactly [`HEADER_SIZE`] bytes.
    ///
    /// # Panics
    /// If `version_info` is longer than [`MAX_VERSION_INFO`]; the
    /// configuration rejects such values before they get here.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        assert!(self.version_info.len() <= MAX_VERSION_INFO);
        let mut bytes = vec![0_u8; HEADER_SIZE as usize];
        bytes[..7].copy_from_slice(&MAGIC);
        bytes[7] = FORMAT_VERSION;
        bytes[8..16].copy_from_slice(&self.first_entry_id.to_le_bytes());
        let (previous_id, previous_end) = self.previous.unwrap_or((0, 0));
        bytes[16..24].copy_from_slice(&previous_id.to_le_bytes());
        bytes[24..32].copy_from_slice(&previous_end.to_le_bytes());
        bytes[32] = self.version_info.len() as u8;
        bytes[33..33 + self.version_info.len()].copy_from_slice(&self.version_info);
        let crc_at = HEADER_SIZE as usize - 4;
        let crc = crc32fast::hash(&bytes[..crc_at]);
        bytes[crc_at..].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// The format version of an intact header of this crate's layout with
    /// a version other than this crate's two: its magic and its checksum
    /// verify, so it was written whole by another version of the format,
    /// not torn or damaged. `None` for anything else.
    #[must_use]
    pub fn other_version(bytes: &[u8]) -> Option<u8> {
        let bytes = bytes.get(..HEADER_SIZE as usize)?;
        let crc_at = HEADER_SIZE as usize - 4;
        let stored = u32::from_le_bytes(bytes[crc_at..].try_into().ok()?);
        (bytes[..7] == MAGIC
            && bytes[7] != FORMAT_VERSION
            && !is_encrypted_version(bytes[7])
            && crc32fast::hash(&bytes[..crc_at]) == stored)
            .then_some(bytes[7])
    }

    /// Decodes a header from the first [`HEADER_SIZE`] bytes of `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<Self, HeaderError> {
        let bytes = bytes
            .get(..HEADER_SIZE as usize)
            .ok_or(HeaderError::TooShort)?;
        if bytes[..7] != MAGIC {
            return Err(HeaderError::BadMagic);
        }
        if bytes[7] != FORMAT_VERSION {
            return Err(HeaderError::UnknownVersion(bytes[7]));
        }
        let crc_at = HEADER_SIZE as usize - 4;
        let stored = u32::from_le_bytes(bytes[crc_at..].try_into().expect("4 bytes"));
        if crc32fast::hash(&bytes[..crc_at]) != stored {
            return Err(HeaderError::BadChecksum);
        }
        let first_entry_id = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
        let previous_id = u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes"));
        let previous_end = u64::from_le_bytes(bytes[24..32].try_into().expect("8 bytes"));
        let len = usize::from(bytes[32]);
        Ok(Self {
            first_entry_id,
            previous: (previous_end != 0).then_some((previous_id, previous_end)),
            version_info: bytes[33..33 + len].to_vec(),
        })
    }
}

/// An encrypted segment header (format version
/// [`ENCRYPTED_FORMAT_VERSION`]) as it is on disk, before its encrypted
/// part is opened:
///
/// | offset | size | field |
/// | --- | --- | --- |
/// | 0 | 7 | magic |
/// | 7 | 1 | format version, 2 |
/// | 8 | 8 | `first_entry_id` |
/// | 16 | 44 | key check: key id (u32), nonce, tag |
/// | 60 | 24 | nonce of the encrypted part |
/// | 84 | 16 | tag of the encrypted part |
/// | 100 | 272 | encrypted part (see [`SEALED_HEADER_BODY`]) |
/// | 372 | 136 | zeros |
/// | 508 | 4 | CRC32 of bytes 0..508 |
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedSegmentHeader {
    /// The format version (2 or 3; this crate writes 3).
    pub version: u8,
    /// The id of the first entry this segment may hold.
    pub first_entry_id: u64,
    /// Key id, nonce and tag of the key check (`Cipher::key_check`).
    pub key_check: [u8; 44],
    /// Nonce of the encrypted part.
    pub body_nonce: [u8; 24],
    /// Tag of the encrypted part.
    pub body_tag: [u8; 16],
    /// The encrypted part, as stored.
    pub body: [u8; SEALED_HEADER_BODY],
}

impl SealedSegmentHeader {
    /// Bytes 0..60: what the encrypted part's tag also authenticates.
    #[must_use]
    pub fn associated(&self) -> [u8; 60] {
        let mut bytes = [0_u8; 60];
        bytes[..7].copy_from_slice(&MAGIC);
        bytes[7] = self.version;
        bytes[8..16].copy_from_slice(&self.first_entry_id.to_le_bytes());
        bytes[16..60].copy_from_slice(&self.key_check);
        bytes
    }

    /// Encodes the header into exactly [`HEADER_SIZE`] bytes.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = vec![0_u8; HEADER_SIZE as usize];
        bytes[..60].copy_from_slice(&self.associated());
        bytes[60..84].copy_from_slice(&self.body_nonce);
        bytes[84..100].copy_from_slice(&self.body_tag);
        bytes[SEALED_HEADER_BODY_AT..SEALED_HEADER_BODY_AT + SEALED_HEADER_BODY]
            .copy_from_slice(&self.body);
        let crc_at = HEADER_SIZE as usize - 4;
        let crc = crc32fast::hash(&bytes[..crc_at]);
        bytes[crc_at..].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// Decodes an encrypted header from the first [`HEADER_SIZE`] bytes
    /// of `bytes` (its encrypted part stays encrypted).
    pub fn decode(bytes: &[u8]) -> Result<Self, HeaderError> {
        let bytes = bytes
            .get(..HEADER_SIZE as usize)
            .ok_or(HeaderError::TooShort)?;
        if bytes[..7] != MAGIC {
            return Err(HeaderError::BadMagic);
        }
        if !is_encrypted_version(bytes[7]) {
            return Err(HeaderError::UnknownVersion(bytes[7]));
        }
        let crc_at = HEADER_SIZE as usize - 4;
        let stored = u32::from_le_bytes(bytes[crc_at..].try_into().expect("4 bytes"));
        if crc32fast::hash(&bytes[..crc_at]) != stored {
            return Err(HeaderError::BadChecksum);
        }
        Ok(Self {
            version: bytes[7],
            first_entry_id: u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes")),
            key_check: bytes[16..60].try_into().expect("44 bytes"),
            body_nonce: bytes[60..84].try_into().expect("24 bytes"),
            body_tag: bytes[84..100].try_into().expect("16 bytes"),
            body: bytes[SEALED_HEADER_BODY_AT..SEALED_HEADER_BODY_AT + SEALED_HEADER_BODY]
                .try_into()
                .expect("body bytes"),
        })
    }
}

/// A segment header of either format version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnyHeader {
    /// Format version 1: no encryption.
    Plain(SegmentHeader),
    /// Format version 2: encrypted.
    Sealed(Box<SealedSegmentHeader>),
}

impl AnyHeader {
    /// Decodes a header of either version.
    pub fn decode(bytes: &[u8]) -> Result<Self, HeaderError> {
        match bytes.get(7) {
            Some(&version) if is_encrypted_version(version) && bytes.starts_with(&MAGIC) => {
                SealedSegmentHeader::decode(bytes).map(|header| Self::Sealed(Box::new(header)))
            }
            _ => SegmentHeader::decode(bytes).map(Self::Plain),
        }
    }

    /// The id of the first entry the segment may hold.
    #[must_use]
    pub fn first_entry_id(&self) -> u64 {
        match self {
            Self::Plain(header) => header.first_entry_id,
            Self::Sealed(header) => header.first_entry_id,
        }
    }
}

/// How many frames an encrypted chunk of `length` bytes has: one per
/// [`FRAME_BYTES`] begun, and one for an empty chunk.
#[must_use]
pub fn frame_count(length: u32) -> u64 {
    u64::from(length).div_ceil(FRAME_BYTES as u64).max(1)
}

/// The bytes an encrypted chunk of `length` bytes takes after its
/// record header: its frames.
#[must_use]
pub fn sealed_data_len(length: u32) -> u64 {
    u64::from(length) + frame_count(length) * FRAME_OVERHEAD as u64
}

/// Where frame `frame` of an encrypted chunk of `length` bytes starts,
/// counted from the end of the record header, and how many plaintext
/// bytes it holds.
#[must_use]
pub fn frame_span(length: u32, frame: u64) -> (u64, usize) {
    let start = frame * (FRAME_BYTES + FRAME_OVERHEAD) as u64;
    let before = frame * FRAME_BYTES as u64;
    let len = u64::from(length)
        .saturating_sub(before)
        .min(FRAME_BYTES as u64) as usize;
    (start, len)
}

/// The length of an encrypted record of `kind` (a record kind byte, 1–5)
/// whose plaintext `length` field is `length`.
#[must_use]
pub fn sealed_record_len(kind: RecordKind, length: u32) -> u64 {
    SEALED_RECORD_HEADER_SIZE as u64
        + match kind {
            RecordKind::Chunk => sealed_data_len(length),
            RecordKind::PresealedChunk => u64::from(length) + CHUNK_TRAILER_SIZE as u64,
            RecordKind::Commit | RecordKind::Rollback => 0,
            RecordKind::Padding => u64::from(length),
        }
}

/// The kind and plaintext length of an encrypted record header at the
/// start of `bytes` whose CRC (salted with the segment id `salt`)
/// verifies: what a walk needs to step over it, without the key.
pub fn peek_sealed_record(bytes: &[u8], salt: u64) -> Result<(RecordKind, u32), RecordError> {
    let bytes = bytes
        .get(..SEALED_RECORD_HEADER_SIZE)
        .ok_or(RecordError::Truncated)?;
    if bytes.iter().all(|b| *b == 0) {
        return Err(RecordError::Unwritten);
    }
    let stored = u32::from_le_bytes(bytes[SEALED_RECORD_CRC_AT..].try_into().expect("4 bytes"));
    if header_crc(salt, &bytes[..SEALED_RECORD_CRC_AT]) != stored {
        return Err(RecordError::BadChecksum);
    }
    let kind = RecordKind::from_byte(bytes[0]).ok_or(RecordError::BadKind(bytes[0]))?;
    Ok((
        kind,
        u32::from_le_bytes(bytes[1..5].try_into().expect("4 bytes")),
    ))
}

/// The CRC of an encrypted record header whose first
/// [`SEALED_RECORD_CRC_AT`] bytes are `bytes`, in segment `salt`.
#[must_use]
pub fn sealed_record_crc(salt: u64, bytes: &[u8]) -> u32 {
    header_crc(salt, bytes)
}

/// What a record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// A chunk of an entry: `length` bytes of data and a CRC32 follow.
    Chunk = 1,
    /// The entry is complete; `length` is its number of chunks.
    Commit = 2,
    /// The entry was rolled back; `length` is 0.
    Rollback = 3,
    /// Filler before a large chunk, so that its data starts at a multiple
    /// of [`CHUNK_ALIGNMENT`]: `length` bytes of no meaning follow.
    Padding = 4,
    /// Encrypted segments of format version 3 only: a chunk whose data its
    /// writer sealed itself, stored as given (`length` bytes) and followed
    /// by their CRC32, like a chunk of a plain segment.
    PresealedChunk = 5,
}

impl RecordKind {
    /// The kind whose byte is `byte`.
    #[must_use]
    pub fn from_byte(byte: u8) -> Option<Self> {
        match byte {
            1 => Some(RecordKind::Chunk),
            2 => Some(RecordKind::Commit),
            3 => Some(RecordKind::Rollback),
            4 => Some(RecordKind::Padding),
            5 => Some(RecordKind::PresealedChunk),
            _ => None,
        }
    }

    /// Whether the record is a chunk of an entry (of either kind).
    #[must_use]
    pub fn is_chunk(self) -> bool {
        matches!(self, RecordKind::Chunk | RecordKind::PresealedChunk)
    }
}

/// The fixed-size header that starts every record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    /// What the record is.
    pub kind: RecordKind,
    /// The entry the record belongs to.
    pub entry_id: u64,
    /// Data length for chunks, chunk count for commits, 0 for rollbacks,
    /// the number of filler bytes after the header for padding.
    pub length: u32,
    /// An offset in this segment below which everything was durable when
    /// the record was written; recovery uses it to tell a torn tail from
    /// damage in the middle of the log.
    pub durable_mark: u64,
}

/// Why bytes did not decode as a record header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordError {
    /// Every byte is zero: space that was never written.
    Unwritten,
    /// The header checksum does not match (torn, stale or damaged bytes).
    BadChecksum,
    /// The checksum matches but the kind byte is unknown.
    BadKind(u8),
    /// Fewer than [`RECORD_HEADER_SIZE`] bytes were available.
    Truncated,
    /// In an encrypted segment: the checksum matches but the record does
    /// not authenticate (tampered with, or written in another generation
    /// of the segment).
    Unauthentic,
}

impl RecordHeader {
    /// The number of bytes the whole record occupies.
    #[must_use]
    pub fn record_len(&self) -> u64 {
        match self.kind {
            RecordKind::Chunk | RecordKind::PresealedChunk => {
                RECORD_HEADER_SIZE as u64 + u64::from(self.length) + CHUNK_TRAILER_SIZE as u64
            }
            RecordKind::Commit | RecordKind::Rollback => RECORD_HEADER_SIZE as u64,
            RecordKind::Padding => RECORD_HEADER_SIZE as u64 + u64::from(self.length),
        }
    }

    /// Encodes the header; `salt` is the segment's first entry id, so that
    /// records left over from an earlier use of a recycled file fail their
    /// checksum.
    #[must_use]
    pub fn encode(&self, salt: u64) -> [u8; RECORD_HEADER_SIZE] {
        let mut bytes = [0_u8; RECORD_HEADER_SIZE];
        bytes[0] = self.kind as u8;
        bytes[1..9].copy_from_slice(&self.entry_id.to_le_bytes());
        bytes[9..13].copy_from_slice(&self.length.to_le_bytes());
        bytes[13..21].copy_from_slice(&self.durable_mark.to_le_bytes());
        let crc = header_crc(salt, &bytes[..21]);
        bytes[21..].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// Decodes a record header from the start of `bytes`.
    pub fn decode(bytes: &[u8], salt: u64) -> Result<Self, RecordError> {
        let bytes = bytes
            .get(..RECORD_HEADER_SIZE)
            .ok_or(RecordError::Truncated)?;
        if bytes.iter().all(|b| *b == 0) {
            return Err(RecordError::Unwritten);
        }
        let stored = u32::from_le_bytes(bytes[21..25].try_into().expect("4 bytes"));
        if header_crc(salt, &bytes[..21]) != stored {
            return Err(RecordError::BadChecksum);
        }
        // Pre-sealed chunks exist only in encrypted segments.
        let kind = RecordKind::from_byte(bytes[0])
            .filter(|kind| *kind != RecordKind::PresealedChunk)
            .ok_or(RecordError::BadKind(bytes[0]))?;
        Ok(Self {
            kind,
            entry_id: u64::from_le_bytes(bytes[1..9].try_into().expect("8 bytes")),
            length: u32::from_le_bytes(bytes[9..13].try_into().expect("4 bytes")),
            durable_mark: u64::from_le_bytes(bytes[13..21].try_into().expect("8 bytes")),
        })
    }
}

fn header_crc(salt: u64, bytes: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&salt.to_le_bytes());
    hasher.update(bytes);
    hasher.finalize()
}

/// Where a chunk written whole by its writer goes when the segment's free
/// space starts at `free`: returns `(padding, start)`, the length of the
/// padding record that fills `free..start` (0 when none is needed) and the
/// offset of the chunk record, whose data (after its header) then starts
/// at a multiple of [`CHUNK_ALIGNMENT`]. A padding record is at least a
/// record header long, so a gap shorter than that moves the chunk one
/// alignment further.
#[must_use]
pub fn aligned_chunk_start(free: u64) -> (u64, u64) {
    aligned_chunk_start_after(free, RECORD_HEADER_SIZE as u64)
}

/// [`aligned_chunk_start`] for record headers of `header` bytes (an
/// encrypted segment's are [`SEALED_RECORD_HEADER_SIZE`] long).
#[must_use]
pub fn aligned_chunk_start_after(free: u64, header: u64) -> (u64, u64) {
    let mut start = (free + header).next_multiple_of(CHUNK_ALIGNMENT) - header;
    if start != free && start - free < header {
        start += CHUNK_ALIGNMENT;
    }
    (start - free, start)
}

/// Encodes a whole chunk record (header, data, data CRC) into `out`.
pub fn encode_chunk(out: &mut Vec<u8>, header: &RecordHeader, salt: u64, data: &[u8], crc: u32) {
    out.extend_from_slice(&header.encode(salt));
    out.extend_from_slice(data);
    out.extend_from_slice(&crc.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_rejects_damage() {
        let header = SegmentHeader {
            first_entry_id: 42,
            previous: Some((7, 4096)),
            version_info: b"v1.2".to_vec(),
        };
        let bytes = header.encode();
        assert_eq!(bytes.len() as u64, HEADER_SIZE);
        assert_eq!(SegmentHeader::decode(&bytes).unwrap(), header);
        for at in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x10;
            assert!(SegmentHeader::decode(&damaged).is_err(), "flip at {at}");
        }
        assert_eq!(
            SegmentHeader::decode(&bytes[..100]),
            Err(HeaderError::TooShort)
        );
        assert_eq!(
            SegmentHeader::decode(&vec![0; 512]),
            Err(HeaderError::BadMagic)
        );
    }

    #[test]
    fn full_version_info_fits() {
        let header = SegmentHeader {
            first_entry_id: u64::MAX,
            previous: None,
            version_info: vec![7; MAX_VERSION_INFO],
        };
        assert_eq!(SegmentHeader::decode(&header.encode()).unwrap(), header);
    }

    #[test]
    fn record_header_round_trips_and_is_salted() {
        let header = RecordHeader {
            kind: RecordKind::Chunk,
            entry_id: 9,
            length: 1000,
            durable_mark: 4096,
        };
        let bytes = header.encode(7);
        assert_eq!(RecordHeader::decode(&bytes, 7).unwrap(), header);
        assert_eq!(
            RecordHeader::decode(&bytes, 8),
            Err(RecordError::BadChecksum)
        );
        assert_eq!(
            RecordHeader::decode(&[0; RECORD_HEADER_SIZE], 7),
            Err(RecordError::Unwritten)
        );
        assert_eq!(
            RecordHeader::decode(&bytes[..10], 7),
            Err(RecordError::Truncated)
        );
        for at in 0..bytes.len() {
            let mut damaged = bytes;
            damaged[at] ^= 1;
            assert!(RecordHeader::decode(&damaged, 7).is_err(), "flip at {at}");
        }
        assert_eq!(header.record_len(), 25 + 1000 + 4);
        let padding = RecordHeader {
            kind: RecordKind::Padding,
            length: 100,
            ..header
        };
        assert_eq!(
            RecordHeader::decode(&padding.encode(7), 7).unwrap(),
            padding
        );
        assert_eq!(padding.record_len(), 125);
    }

    #[test]
    fn chunk_data_is_aligned_after_a_padding_record() {
        let header = RECORD_HEADER_SIZE as u64;
        for free in (HEADER_SIZE..3 * CHUNK_ALIGNMENT).chain([CHUNK_ALIGNMENT * 1000 - header]) {
            let (pad, start) = aligned_chunk_start(free);
            assert_eq!(start, free + pad, "free {free}");
            assert_eq!((start + header) % CHUNK_ALIGNMENT, 0, "free {free}");
            assert!(pad == 0 || pad >= header, "free {free}: pad {pad}");
            assert!(pad < CHUNK_ALIGNMENT + header, "free {free}: pad {pad}");
        }
        assert_eq!(
            aligned_chunk_start(CHUNK_ALIGNMENT - header),
            (0, CHUNK_ALIGNMENT - header)
        );
        assert_eq!(
            aligned_chunk_start(CHUNK_ALIGNMENT - header - 1),
            (CHUNK_ALIGNMENT + 1, 2 * CHUNK_ALIGNMENT - header)
        );
    }
}
