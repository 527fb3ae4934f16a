//! Encrypted segments (FORMAT.md, "Encrypted logs"): the key and the
//! generation of one segment, and the sealing and opening of its header,
//! its record headers and its chunks' frames. The byte layouts are in
//! `crate::format`; the cipher is `crate::encryption`'s.
//!
//! Every seal binds its bytes to their place through the associated
//! data: the segment's id and *generation* (the nonce of the key check
//! in its header, fresh every time a header is written, so two uses of a
//! file, even under the same id, never share it), and for a record header
//! its offset, kind and length; a chunk's frames are bound to the entry
//! id and chunk index that the record header (bound to its offset)
//! carries, and to their own index and the chunk's length.

use std::fmt;
use std::io;
use std::ops::Deref;
use std::path::Path;
use std::sync::Arc;

use crate::encryption::{Cipher, Seal, SealingKey, NONCE_BYTES, TAG_BYTES};
use crate::format::{
    frame_span, peek_sealed_record, sealed_record_crc, sealed_record_len, RecordError,
    RecordHeader, RecordKind, SealedSegmentHeader, SegmentHeader, ENCRYPTED_FORMAT_VERSION,
    FRAME_OVERHEAD, MAX_VERSION_INFO, RECORD_HEADER_SIZE, SEALED_HEADER_BODY, SEALED_RECORD_BODY,
    SEALED_RECORD_CRC_AT, SEALED_RECORD_HEADER_SIZE,
};

/// The context of every segment header's key check.
const KEY_CHECK_CONTEXT: &[u8] = b"okaywal segment";
/// Associated data prefixes, one per kind of seal.
const HEADER_CONTEXT: &[u8] = b"okaywal segment header v2";
const RECORD_CONTEXT: &[u8] = b"okaywal record v2";
const FRAME_CONTEXT: &[u8] = b"okaywal frame v2";
/// Bytes of a record header's associated data: context, segment id,
/// generation, offset, kind and length.
const RECORD_ASSOCIATED: usize = 17 + 8 + NONCE_BYTES + 8 + 5;
/// Bytes of a frame's associated data: context, segment id, generation,
/// entry id, chunk index, chunk length, frame index.
const FRAME_ASSOCIATED: usize = 16 + 8 + NONCE_BYTES + 8 + 4 + 4 + 8;
const _: () = assert!(RECORD_CONTEXT.len() == 17 && FRAME_CONTEXT.len() == 16);

/// The key and generation of one encrypted segment.
pub(crate) struct SegmentSeal {
    id: u64,
    generation: [u8; NONCE_BYTES],
    key: SealingKey,
    /// Format version 3: the segment may hold pre-sealed chunks.
    presealed: bool,
}

impl fmt::Debug for SegmentSeal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SegmentSeal")
            .field("id", &self.id)
            .field("key_id", &self.key.id())
            .finish_non_exhaustive()
    }
}

fn damaged_header(what: &Path, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("segment {}: header is damaged ({why})", what.display()),
    )
}

impl SegmentSeal {
    /// A new segment's seal, under the provider's current key, and its
    /// header's bytes.
    pub fn create(cipher: &Cipher, header: &SegmentHeader) -> io::Result<(Self, Vec<u8>)> {
        let key = cipher.current_key()?;
        let check = key.key_check(KEY_CHECK_CONTEXT)?;
        let mut body = [0_u8; SEALED_HEADER_BODY];
        let (previous_id, previous_end) = header.previous.unwrap_or((0, 0));
        body[..8].copy_from_slice(&previous_id.to_le_bytes());
        body[8..16].copy_from_slice(&previous_end.to_le_bytes());
        let info = &header.version_info;
        if info.len() > MAX_VERSION_INFO {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "version_info is too long for a segment header",
            ));
        }
        body[16] = info.len() as u8;
        body[17..17 + info.len()].copy_from_slice(info);
        let mut raw = SealedSegmentHeader {
            version: ENCRYPTED_FORMAT_VERSION,
            first_entry_id: header.first_entry_id,
            key_check: check.to_bytes(),
            body_nonce: [0; NONCE_BYTES],
            body_tag: [0; TAG_BYTES],
            body,
        };
        let associated = [HEADER_CONTEXT, &raw.associated()].concat();
        let seal = key.seal(&associated, &mut raw.body)?;
        raw.body_nonce = seal.nonce;
        raw.body_tag = seal.tag;
        let seal = Self {
            id: header.first_entry_id,
            generation: check.nonce,
            key,
            presealed: true,
        };
        Ok((seal, raw.encode()))
    }

    /// Opens the header of the encrypted segment file `what` whose bytes
    /// verified as `raw`: checks the key (a wrong or missing one is a
    /// `PermissionDenied` error carrying a
    /// [`KeyError`](crate::encryption::KeyError) naming the file and key
    /// id), then decrypts the header's encrypted part.
    pub fn open(
        cipher: &Cipher,
        raw: &SealedSegmentHeader,
        what: &Path,
    ) -> io::Result<(Self, SegmentHeader)> {
        let check = Seal::from_bytes(&raw.key_check);
        let key = cipher.key_by_id(check.key_id, what.display())?;
        key.verify_key_check(&check, KEY_CHECK_CONTEXT, what.display())?;
        let mut body = raw.body;
        let seal = Seal {
            key_id: check.key_id,
            nonce: raw.body_nonce,
            tag: raw.body_tag,
        };
        let associated = [HEADER_CONTEXT, &raw.associated()].concat();
        key.open(&seal, &associated, &mut body).map_err(|_| {
            damaged_header(
                what,
                "its checksum matches but its encrypted part does not authenticate",
            )
        })?;
        let previous_id = u64::from_le_bytes(body[..8].try_into().expect("8 bytes"));
        let previous_end = u64::from_le_bytes(body[8..16].try_into().expect("8 bytes"));
        let len = usize::from(body[16]);
        let header = SegmentHeader {
            first_entry_id: raw.first_entry_id,
            previous: (previous_end != 0).then_some((previous_id, previous_end)),
            version_info: body[17..17 + len].to_vec(),
        };
        let seal = Self {
            id: raw.first_entry_id,
            generation: check.nonce,
            key,
            presealed: raw.version >= ENCRYPTED_FORMAT_VERSION,
        };
        Ok((seal, header))
    }

    /// The associated data of the record header at `offset` whose kind
    /// and length bytes are `prefix`.
    fn record_associated(&self, offset: u64, prefix: &[u8]) -> [u8; RECORD_ASSOCIATED] {
        let mut associated = [0_u8; RECORD_ASSOCIATED];
        let mut at = 0;
        for piece in [
            RECORD_CONTEXT,
            &self.id.to_le_bytes(),
            &self.generation,
            &offset.to_le_bytes(),
            &prefix[..5],
        ] {
            associated[at..at + piece.len()].copy_from_slice(piece);
            at += piece.len();
        }
        associated
    }

    /// Encodes a record header at `offset`: `number` is the chunk's index
    /// in its entry for a chunk (a commit's chunk count is its
    /// `header.length`).
    pub fn encode_record(
        &self,
        header: &RecordHeader,
        number: u32,
        offset: u64,
    ) -> io::Result<[u8; SEALED_RECORD_HEADER_SIZE]> {
        let (length, number) = match header.kind {
            RecordKind::Chunk | RecordKind::PresealedChunk => (header.length, number),
            RecordKind::Commit => (0, header.length),
            RecordKind::Rollback => (0, 0),
            RecordKind::Padding => (header.length, 0),
        };
        let mut bytes = [0_u8; SEALED_RECORD_HEADER_SIZE];
        bytes[0] = header.kind as u8;
        bytes[1..5].copy_from_slice(&length.to_le_bytes());
        let mut body = [0_u8; SEALED_RECORD_BODY];
        body[..8].copy_from_slice(&header.entry_id.to_le_bytes());
        body[8..16].copy_from_slice(&header.durable_mark.to_le_bytes());
        body[16..20].copy_from_slice(&number.to_le_bytes());
        let seal = self
            .key
            .seal(&self.record_associated(offset, &bytes[..5]), &mut body)?;
        bytes[5..29].copy_from_slice(&seal.nonce);
        bytes[29..45].copy_from_slice(&seal.tag);
        bytes[45..65].copy_from_slice(&body);
        let crc = sealed_record_crc(self.id, &bytes[..SEALED_RECORD_CRC_AT]);
        bytes[SEALED_RECORD_CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        Ok(bytes)
    }

    /// Decodes the record header at `offset` from the start of `bytes`:
    /// the header (a commit's chunk count in `length`) and, for a chunk,
    /// its index in its entry.
    pub fn decode_record(
        &self,
        bytes: &[u8],
        offset: u64,
    ) -> Result<(RecordHeader, u32), RecordError> {
        let (kind, length) = peek_sealed_record(bytes, self.id)?;
        if kind == RecordKind::PresealedChunk && !self.presealed {
            return Err(RecordError::BadKind(kind as u8));
        }
        let seal = Seal {
            key_id: self.key.id(),
            nonce: bytes[5..29].try_into().expect("24 bytes"),
            tag: bytes[29..45].try_into().expect("16 bytes"),
        };
        let mut body: [u8; SEALED_RECORD_BODY] = bytes[45..65].try_into().expect("20 bytes");
        self.key
            .open(
                &seal,
                &self.record_associated(offset, &bytes[..5]),
                &mut body,
            )
            .map_err(|_| RecordError::Unauthentic)?;
        let entry_id = u64::from_le_bytes(body[..8].try_into().expect("8 bytes"));
        let durable_mark = u64::from_le_bytes(body[8..16].try_into().expect("8 bytes"));
        let number = u32::from_le_bytes(body[16..20].try_into().expect("4 bytes"));
        let length = if kind == RecordKind::Commit {
            number
        } else {
            length
        };
        Ok((
            RecordHeader {
                kind,
                entry_id,
                length,
                durable_mark,
            },
            number,
        ))
    }

    /// The associated data of frame `frame` of `chunk`.
    fn frame_associated(&self, chunk: ChunkId, frame: u64) -> [u8; FRAME_ASSOCIATED] {
        let mut associated = [0_u8; FRAME_ASSOCIATED];
        let mut at = 0;
        for piece in [
            FRAME_CONTEXT,
            &self.id.to_le_bytes(),
            &self.generation,
            &chunk.entry_id.to_le_bytes(),
            &chunk.index.to_le_bytes(),
            &chunk.length.to_le_bytes(),
            &frame.to_le_bytes(),
        ] {
            associated[at..at + piece.len()].copy_from_slice(piece);
            at += piece.len();
        }
        associated
    }

    /// Appends frame `frame` of chunk `index` of entry `entry_id` (a chunk
    /// of `length` bytes) to `out`: nonce, `plaintext` encrypted, tag.
    pub fn seal_frame(
        &self,
        chunk: ChunkId,
        frame: u64,
        plaintext: &[u8],
        out: &mut Vec<u8>,
    ) -> io::Result<()> {
        debug_assert_eq!(frame_span(chunk.length, frame).1, plaintext.len());
        let start = out.len();
        out.extend_from_slice(&[0; NONCE_BYTES]);
        out.extend_from_slice(plaintext);
        let associated = self.frame_associated(chunk, frame);
        let seal = self
            .key
            .seal(&associated, &mut out[start + NONCE_BYTES..])?;
        out[start..start + NONCE_BYTES].copy_from_slice(&seal.nonce);
        out.extend_from_slice(&seal.tag);
        Ok(())
    }

    /// Seals the frames `first..` of a chunk whose plaintext from frame
    /// `first` on is `plaintext` (whole frames, the last one of the chunk
    /// possibly shorter), appending them to `out`.
    pub fn seal_frames(
        &self,
        chunk: ChunkId,
        first: u64,
        plaintext: &[u8],
        out: &mut Vec<u8>,
    ) -> io::Result<()> {
        let mut frame = first;
        let mut rest = plaintext;
        loop {
            let len = frame_span(chunk.length, frame).1.min(rest.len());
            self.seal_frame(chunk, frame, &rest[..len], out)?;
            rest = &rest[len..];
            frame += 1;
            if rest.is_empty() {
                return Ok(());
            }
        }
    }

    /// Opens frame `frame` of `chunk`: `bytes` holds its nonce, ciphertext
    /// and tag; on success its plaintext is `bytes[NONCE_BYTES..len - TAG_BYTES]`.
    pub fn open_frame(&self, chunk: ChunkId, frame: u64, bytes: &mut [u8]) -> bool {
        let (_, len) = frame_span(chunk.length, frame);
        if bytes.len() != len + FRAME_OVERHEAD {
            return false;
        }
        let seal = Seal {
            key_id: self.key.id(),
            nonce: bytes[..NONCE_BYTES].try_into().expect("24 bytes"),
            tag: bytes[NONCE_BYTES + len..].try_into().expect("16 bytes"),
        };
        let associated = self.frame_associated(chunk, frame);
        self.key
            .open(
                &seal,
                &associated,
                &mut bytes[NONCE_BYTES..NONCE_BYTES + len],
            )
            .is_ok()
    }
}

/// What a chunk's frames are bound to: its entry, its index in the
/// entry, its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChunkId {
    pub entry_id: u64,
    pub index: u32,
    pub length: u32,
}

/// The record layout of one segment: plain (format version 1) or
/// encrypted (version 2, with the segment's seal).
#[derive(Debug, Clone)]
pub(crate) enum Layout {
    Plain,
    Sealed(Arc<SegmentSeal>),
}

/// An encoded record header of either layout.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EncodedHeader {
    bytes: [u8; SEALED_RECORD_HEADER_SIZE],
    len: usize,
}

impl Deref for EncodedHeader {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl Layout {
    /// The segment's seal, if it is encrypted.
    pub fn seal(&self) -> Option<&Arc<SegmentSeal>> {
        match self {
            Layout::Plain => None,
            Layout::Sealed(seal) => Some(seal),
        }
    }

    /// The size of a record header.
    pub fn header_size(&self) -> usize {
        match self {
            Layout::Plain => RECORD_HEADER_SIZE,
            Layout::Sealed(_) => SEALED_RECORD_HEADER_SIZE,
        }
    }

    /// The number of bytes a record with this (decoded) header takes.
    pub fn record_len(&self, header: &RecordHeader) -> u64 {
        match self {
            Layout::Plain => header.record_len(),
            Layout::Sealed(_) => sealed_record_len(header.kind, header.length),
        }
    }

    /// The length of a chunk record holding `length` bytes of data.
    pub fn chunk_record_len(&self, length: u32) -> u64 {
        self.chunk_record_len_of(RecordKind::Chunk, length)
    }

    /// The length of a chunk record of `kind` holding `length` bytes of
    /// data.
    pub fn chunk_record_len_of(&self, kind: RecordKind, length: u32) -> u64 {
        self.record_len(&RecordHeader {
            kind,
            entry_id: 0,
            length,
            durable_mark: 0,
        })
    }

    /// Whether a chunk record of `kind` stores its data as given,
    /// followed by their CRC32 (every chunk of a plain segment, and a
    /// pre-sealed one), rather than in sealed frames.
    pub fn stores_plain_data(&self, kind: RecordKind) -> bool {
        matches!(self, Layout::Plain) || kind == RecordKind::PresealedChunk
    }

    /// The kind of record [`EntryWriter::write_presealed_chunk`]
    /// (crate::EntryWriter::write_presealed_chunk) writes in this
    /// segment: a pre-sealed chunk where the format has them, an ordinary
    /// chunk otherwise.
    pub fn presealed_kind(&self) -> RecordKind {
        match self {
            Layout::Sealed(seal) if seal.presealed => RecordKind::PresealedChunk,
            _ => RecordKind::Chunk,
        }
    }

    /// Decodes the record header at `offset` in segment `salt` from the
    /// start of `bytes` (which holds at least [`Layout::header_size`]
    /// bytes, or the rest of the file): the header and, for a chunk of an
    /// encrypted segment, its index in its entry (0 otherwise).
    pub fn decode(
        &self,
        bytes: &[u8],
        salt: u64,
        offset: u64,
    ) -> Result<(RecordHeader, u32), RecordError> {
        match self {
            Layout::Plain => RecordHeader::decode(bytes, salt).map(|header| (header, 0)),
            Layout::Sealed(seal) => seal.decode_record(bytes, offset),
        }
    }

    /// Encodes a record header at `offset` of segment `salt`; `index` is a
    /// chunk's index in its entry.
    pub fn encode(
        &self,
        header: &RecordHeader,
        index: u32,
        salt: u64,
        offset: u64,
    ) -> io::Result<EncodedHeader> {
        let mut bytes = [0_u8; SEALED_RECORD_HEADER_SIZE];
        match self {
            Layout::Plain => {
                bytes[..RECORD_HEADER_SIZE].copy_from_slice(&header.encode(salt));
                Ok(EncodedHeader {
                    bytes,
                    len: RECORD_HEADER_SIZE,
                })
            }
            Layout::Sealed(seal) => Ok(EncodedHeader {
                bytes: seal.encode_record(header, index, offset)?,
                len: SEALED_RECORD_HEADER_SIZE,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encryption::{Key, KeyId, Keyring, StaticKey};
    use crate::format::{FRAME_BYTES, HEADER_SIZE};

    fn header(id: u64) -> SegmentHeader {
        SegmentHeader {
            first_entry_id: id,
            previous: Some((3, 4096)),
            version_info: b"v7".to_vec(),
        }
    }

    #[test]
    fn headers_open_only_with_their_key_and_hide_version_info() {
        let cipher = Cipher::new(StaticKey::new([1; 32]));
        let (seal, bytes) = SegmentSeal::create(&cipher, &header(9)).unwrap();
        assert_eq!(bytes.len() as u64, HEADER_SIZE);
        assert!(!bytes.windows(2).any(|w| w == b"v7"));
        let raw = SealedSegmentHeader::decode(&bytes).unwrap();
        let (opened, decoded) = SegmentSeal::open(&cipher, &raw, Path::new("wal-9")).unwrap();
        assert_eq!(decoded, header(9));
        assert_eq!(opened.generation, seal.generation);

        let wrong = Cipher::new(StaticKey::new([2; 32]));
        let error = SegmentSeal::open(&wrong, &raw, Path::new("wal-9")).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::PermissionDenied);
        let missing = Cipher::new(StaticKey::with_id(KeyId::new(2), Key::from_bytes([1; 32])));
        let error = SegmentSeal::open(&missing, &raw, Path::new("wal-9")).unwrap_err();
        assert_eq!(
            crate::encryption::KeyError::of(&error),
            Some(&crate::encryption::KeyError::Missing(KeyId::new(1)))
        );

        let mut tampered = raw.clone();
        tampered.body[40] ^= 1;
        let error = SegmentSeal::open(&cipher, &tampered, Path::new("wal-9")).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn record_headers_are_bound_to_segment_generation_and_offset() {
        let ring = Arc::new(Keyring::new(KeyId::new(1), Key::from_bytes([1; 32])));
        let cipher = Cipher::new(ring);
        let (seal, _) = SegmentSeal::create(&cipher, &header(9)).unwrap();
        let (again, _) = SegmentSeal::create(&cipher, &header(9)).unwrap();
        let record = RecordHeader {
            kind: RecordKind::Commit,
            entry_id: 12,
            length: 3,
            durable_mark: 700,
        };
        let bytes = seal.encode_record(&record, 0, 1000).unwrap();
        assert_eq!(seal.decode_record(&bytes, 1000), Ok((record, 3)));
        assert_eq!(
            seal.decode_record(&bytes, 1001),
            Err(RecordError::Unauthentic)
        );
        assert_eq!(
            again.decode_record(&bytes, 1000),
            Err(RecordError::Unauthentic),
            "another generation of the same segment id"
        );
        for at in 0..bytes.len() {
            let mut flipped = bytes;
            flipped[at] ^= 0x20;
            assert!(seal.decode_record(&flipped, 1000).is_err(), "flip at {at}");
        }
        // The entry id and count are not in the clear.
        assert!(!bytes.windows(8).any(|w| w == 12_u64.to_le_bytes()));
    }

    #[test]
    fn frames_open_only_in_their_chunk_and_position() {
        let cipher = Cipher::new(StaticKey::new([1; 32]));
        let (seal, _) = SegmentSeal::create(&cipher, &header(9)).unwrap();
        let length = (FRAME_BYTES * 2 + 10) as u32;
        let data: Vec<u8> = (0..length).map(|i| (i % 251) as u8).collect();
        let chunk = ChunkId {
            entry_id: 12,
            index: 1,
            length,
        };
        let mut out = Vec::new();
        seal.seal_frames(chunk, 0, &data, &mut out).unwrap();
        assert_eq!(out.len() as u64, crate::format::sealed_data_len(length));
        let mut plain = Vec::new();
        for frame in 0..3 {
            let (start, len) = frame_span(length, frame);
            let start = start as usize;
            let mut bytes = out[start..start + len + FRAME_OVERHEAD].to_vec();
            let mut other = bytes.clone();
            assert!(!seal.open_frame(ChunkId { index: 2, ..chunk }, frame, &mut other));
            let mut other = bytes.clone();
            assert!(!seal.open_frame(chunk, (frame + 1) % 3, &mut other));
            assert!(seal.open_frame(chunk, frame, &mut bytes));
            plain.extend_from_slice(&bytes[NONCE_BYTES..NONCE_BYTES + len]);
        }
        assert_eq!(plain, data);
    }
}
