//! Bytes on disk ↔ structs for every sediment file, with no I/O policy.
//! `FORMAT.md` in the crate describes the same layouts in prose.
//!
//! Format version 1 is a plain store; version 2 an encrypted one, whose
//! layouts are the second half of this file (the sealing itself, with
//! keys, is `sealing`'s: here are only the byte positions).

use okaywal::encryption::{Seal, SEAL_BYTES};

use crate::grain_id::GrainId;

/// Bytes before a blob's data in its first grain: sequence, length, CRC.
pub const GRAIN_HEADER_SIZE: usize = 16;
/// Number of basins (grain-size classes): grain sizes 16 B × 2^0..2^21.
pub const BASINS: usize = 22;
/// The most consecutive grains one blob may span.
pub const MAX_GRAINS_PER_BLOB: u32 = 32;
/// Bits of a grain index; a stratum holds at most 2^18 grains.
pub const STRATUM_INDEX_BITS: u32 = 18;
/// The largest blob the format can hold (32 grains of 32 MiB, less the
/// grain header).
pub const MAX_FORMAT_BLOB_BYTES: u64 =
    MAX_GRAINS_PER_BLOB as u64 * (16 << (BASINS - 1)) - GRAIN_HEADER_SIZE as u64;
/// Size of one index header copy.
pub const INDEX_SLOT_SIZE: u64 = 4096;
/// Offset of the per-basin strata counts in an index header copy.
const INDEX_STRATA_AT: usize = 80;

const STRATUM_MAGIC: [u8; 8] = *b"SEDSTRAT";
const INDEX_MAGIC: [u8; 8] = *b"SEDINDEX";
const FORMAT_VERSION: u8 = 1;
/// Bytes of a stratum header before its bitmaps.
const STRATUM_FIXED: usize = 32;

/// The grain size of `basin`.
#[must_use]
pub fn grain_size(basin: u8) -> u64 {
    16 << basin
}

/// How many grains a stratum of `basin` holds: about 256 MiB of grains,
/// at least 64 and at most 2^18 (a multiple of 64 in every case).
#[must_use]
pub fn stratum_capacity(basin: u8) -> u32 {
    ((256 << 20) / grain_size(basin)).clamp(64, 1 << STRATUM_INDEX_BITS) as u32
}

/// Bytes of one stratum header copy (a multiple of 4096).
#[must_use]
pub fn stratum_slot_size(basin: u8) -> u64 {
    let used = STRATUM_FIXED as u64 + u64::from(stratum_capacity(basin)) / 4 + 4;
    used.div_ceil(4096) * 4096
}

/// Offset of grain `index` in a stratum file of `basin`.
#[must_use]
pub fn grain_offset(basin: u8, index: u32) -> u64 {
    2 * stratum_slot_size(basin) + u64::from(index) * grain_size(basin)
}

/// Chooses the basin and grain count for a blob of `len` bytes: the
/// smallest grain size that fits the blob (with its 16-byte header) in at
/// most 32 grains. Above 512 bytes that means more than 16 grains, so
/// rounding up wastes under 1/16 of the blob. `None` if it is too large.
#[must_use]
pub fn placement(len: u64) -> Option<(u8, u32)> {
    fit(len.checked_add(GRAIN_HEADER_SIZE as u64)?)
}

/// The smallest grain size that holds `bytes` in at most 32 grains, and
/// the grain count. `None` if they do not fit.
#[must_use]
pub fn fit(bytes: u64) -> Option<(u8, u32)> {
    (0..BASINS as u8).find_map(|basin| {
        let count = bytes.max(1).div_ceil(grain_size(basin));
        (count <= u64::from(MAX_GRAINS_PER_BLOB)).then_some((basin, count as u32))
    })
}

/// The CRC stored with a grain: over its sequence, length and data.
#[must_use]
pub fn grain_crc(sequence: u64, data: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&sequence.to_le_bytes());
    hasher.update(&(data.len() as u32).to_le_bytes());
    hasher.update(data);
    hasher.finalize()
}

/// The 16 bytes before a blob's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrainHeader {
    /// The sequence (transaction) that wrote the blob.
    pub sequence: u64,
    /// The blob's length in bytes.
    pub length: u32,
    /// [`grain_crc`] of the blob.
    pub crc: u32,
}

impl GrainHeader {
    /// Encodes the header.
    #[must_use]
    pub fn encode(&self) -> [u8; GRAIN_HEADER_SIZE] {
        let mut bytes = [0; GRAIN_HEADER_SIZE];
        bytes[..8].copy_from_slice(&self.sequence.to_le_bytes());
        bytes[8..12].copy_from_slice(&self.length.to_le_bytes());
        bytes[12..].copy_from_slice(&self.crc.to_le_bytes());
        bytes
    }

    /// Decodes a header from the first 16 bytes of `bytes`.
    #[must_use]
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let bytes = bytes.get(..GRAIN_HEADER_SIZE)?;
        Some(Self {
            sequence: u64::from_le_bytes(bytes[..8].try_into().ok()?),
            length: u32::from_le_bytes(bytes[8..12].try_into().ok()?),
            crc: u32::from_le_bytes(bytes[12..].try_into().ok()?),
        })
    }
}

/// One copy of a stratum file's header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StratumHeader {
    /// The basin the stratum belongs to.
    pub basin: u8,
    /// The stratum's number within its basin.
    pub stratum: u32,
    /// Incremented on every write; the newer valid copy wins.
    pub generation: u64,
    /// Bit per grain: allocated.
    pub allocated: Vec<u64>,
    /// Bit per grain: first grain of a blob.
    pub starts: Vec<u64>,
}

/// Why bytes did not decode as a header.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderError {
    /// Not enough bytes.
    Truncated,
    /// Wrong magic: not this kind of file, or never written.
    BadMagic,
    /// Unknown format version.
    UnknownVersion(u8),
    /// The checksum does not match.
    BadChecksum,
    /// The fields contradict each other or the file name.
    Inconsistent(String),
    /// A sealed copy (format version 2) whose checksum is right does not
    /// open with the key that its key check proves right: damaged, or
    /// bytes from another place.
    NotAuthentic,
}

impl std::fmt::Display for HeaderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeaderError::Truncated => f.write_str("header is truncated"),
            HeaderError::BadMagic => f.write_str("header magic is wrong"),
            HeaderError::UnknownVersion(v) => write!(f, "unknown format version {v}"),
            HeaderError::BadChecksum => f.write_str("header checksum mismatch"),
            HeaderError::Inconsistent(why) => write!(f, "header is inconsistent: {why}"),
            HeaderError::NotAuthentic => {
                f.write_str("sealed header failed authentication (damaged, or not from this place)")
            }
        }
    }
}

fn read_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn read_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

fn words_to_bytes(words: &[u64], out: &mut Vec<u8>) {
    for word in words {
        out.extend_from_slice(&word.to_le_bytes());
    }
}

fn bytes_to_words(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

impl StratumHeader {
    /// An empty header for a new stratum.
    #[must_use]
    pub fn empty(basin: u8, stratum: u32) -> Self {
        let words = stratum_capacity(basin) as usize / 64;
        Self {
            basin,
            stratum,
            generation: 0,
            allocated: vec![0; words],
            starts: vec![0; words],
        }
    }

    /// Encodes one header copy, padded to [`stratum_slot_size`].
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let capacity = stratum_capacity(self.basin);
        let mut bytes = Vec::with_capacity(stratum_slot_size(self.basin) as usize);
        bytes.extend_from_slice(&STRATUM_MAGIC);
        bytes.push(FORMAT_VERSION);
        bytes.push(self.basin);
        bytes.extend_from_slice(&[0, 0]);
        bytes.extend_from_slice(&(grain_size(self.basin) as u32).to_le_bytes());
        bytes.extend_from_slice(&capacity.to_le_bytes());
        bytes.extend_from_slice(&self.stratum.to_le_bytes());
        bytes.extend_from_slice(&self.generation.to_le_bytes());
        words_to_bytes(&self.allocated, &mut bytes);
        words_to_bytes(&self.starts, &mut bytes);
        let crc = crc32fast::hash(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        bytes.resize(stratum_slot_size(self.basin) as usize, 0);
        bytes
    }

    /// Decodes one header copy; `basin` and `stratum` are what the file
    /// name says.
    pub fn decode(bytes: &[u8], basin: u8, stratum: u32) -> Result<Self, HeaderError> {
        if bytes.len() < STRATUM_FIXED {
            return Err(HeaderError::Truncated);
        }
        if bytes[..8] != STRATUM_MAGIC {
            return Err(HeaderError::BadMagic);
        }
        if bytes[8] != FORMAT_VERSION {
            return Err(HeaderError::UnknownVersion(bytes[8]));
        }
        if usize::from(basin) >= BASINS || bytes[9] != basin {
            return Err(HeaderError::Inconsistent(format!(
                "header says basin {}, file name says {basin}",
                bytes[9]
            )));
        }
        let capacity = stratum_capacity(basin);
        let bitmap_bytes = capacity as usize / 8;
        let crc_at = STRATUM_FIXED + 2 * bitmap_bytes;
        if bytes.len() < crc_at + 4 {
            return Err(HeaderError::Truncated);
        }
        if crc32fast::hash(&bytes[..crc_at]) != read_u32(bytes, crc_at) {
            return Err(HeaderError::BadChecksum);
        }
        if u64::from(read_u32(bytes, 12)) != grain_size(basin) || read_u32(bytes, 16) != capacity {
            return Err(HeaderError::Inconsistent(
                "grain size or capacity does not match the basin".into(),
            ));
        }
        if read_u32(bytes, 20) != stratum {
            return Err(HeaderError::Inconsistent(format!(
                "header says stratum {}, file name says {stratum}",
                read_u32(bytes, 20)
            )));
        }
        Ok(Self {
            basin,
            stratum,
            generation: read_u64(bytes, 24),
            allocated: bytes_to_words(&bytes[STRATUM_FIXED..STRATUM_FIXED + bitmap_bytes]),
            starts: bytes_to_words(&bytes[STRATUM_FIXED + bitmap_bytes..crc_at]),
        })
    }
}

/// One copy of the `index` file's header.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IndexHeader {
    /// Incremented on every write; the newer valid copy wins.
    pub generation: u64,
    /// The last WAL entry (= sequence) whose effects are in the strata and
    /// the commit log files.
    pub wal_checkpointed_entry: u64,
    /// The sequence given to the last committed `checkpoint_to`.
    pub checkpointed_to: u64,
    /// The embedded header (root pointer) as of `wal_checkpointed_entry`.
    pub embedded_header: Option<GrainId>,
    /// First sequence of the commit log file being appended to (its name),
    /// or 0 if there is none yet.
    pub commit_log_file: u64,
    /// Valid length of that file.
    pub commit_log_end: u64,
    /// The highest committed sequence applied so far.
    pub last_committed: u64,
    /// Per basin, how many strata had a durable header when this copy was
    /// written. Open refuses a database in which one of them is missing or
    /// has lost both header copies, instead of starting it afresh (0 in
    /// databases written before the field existed: nothing is known).
    pub strata: [u32; BASINS],
}

impl IndexHeader {
    /// Encodes one copy ([`INDEX_SLOT_SIZE`] bytes).
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = vec![0_u8; INDEX_SLOT_SIZE as usize];
        bytes[..8].copy_from_slice(&INDEX_MAGIC);
        bytes[8] = FORMAT_VERSION;
        bytes[16..24].copy_from_slice(&self.generation.to_le_bytes());
        bytes[24..32].copy_from_slice(&self.wal_checkpointed_entry.to_le_bytes());
        bytes[32..40].copy_from_slice(&self.checkpointed_to.to_le_bytes());
        if let Some(header) = self.embedded_header {
            bytes[40] = 1;
            bytes[48..56].copy_from_slice(&header.to_bytes());
        }
        bytes[56..64].copy_from_slice(&self.commit_log_file.to_le_bytes());
        bytes[64..72].copy_from_slice(&self.commit_log_end.to_le_bytes());
        bytes[72..80].copy_from_slice(&self.last_committed.to_le_bytes());
        for (basin, count) in self.strata.iter().enumerate() {
            let at = INDEX_STRATA_AT + 4 * basin;
            bytes[at..at + 4].copy_from_slice(&count.to_le_bytes());
        }
        let crc_at = INDEX_SLOT_SIZE as usize - 4;
        let crc = crc32fast::hash(&bytes[..crc_at]);
        bytes[crc_at..].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// Decodes one copy.
    pub fn decode(bytes: &[u8]) -> Result<Self, HeaderError> {
        let bytes = bytes
            .get(..INDEX_SLOT_SIZE as usize)
            .ok_or(HeaderError::Truncated)?;
        if bytes[..8] != INDEX_MAGIC {
            return Err(HeaderError::BadMagic);
        }
        if bytes[8] != FORMAT_VERSION {
            return Err(HeaderError::UnknownVersion(bytes[8]));
        }
        let crc_at = INDEX_SLOT_SIZE as usize - 4;
        if crc32fast::hash(&bytes[..crc_at]) != read_u32(bytes, crc_at) {
            return Err(HeaderError::BadChecksum);
        }
        let embedded_header = match bytes[40] {
            0 => None,
            1 => Some(
                GrainId::from_u64(read_u64(bytes, 48))
                    .map_err(|e| HeaderError::Inconsistent(e.to_string()))?,
            ),
            other => {
                return Err(HeaderError::Inconsistent(format!(
                    "embedded header flag {other}"
                )))
            }
        };
        Ok(Self {
            generation: read_u64(bytes, 16),
            wal_checkpointed_entry: read_u64(bytes, 24),
            checkpointed_to: read_u64(bytes, 32),
            embedded_header,
            commit_log_file: read_u64(bytes, 56),
            commit_log_end: read_u64(bytes, 64),
            last_committed: read_u64(bytes, 72),
            strata: std::array::from_fn(|basin| read_u32(bytes, INDEX_STRATA_AT + 4 * basin)),
        })
    }
}

/// Picks the copy to trust of a header stored twice: the valid one with
/// the higher generation. Returns its slot (0 or 1) and value.
pub fn newest<T>(
    first: Result<T, HeaderError>,
    second: Result<T, HeaderError>,
    generation: impl Fn(&T) -> u64,
) -> Result<(usize, T), (HeaderError, HeaderError)> {
    match (first, second) {
        (Ok(a), Ok(b)) => {
            if generation(&b) > generation(&a) {
                Ok((1, b))
            } else {
                Ok((0, a))
            }
        }
        (Ok(a), Err(_)) => Ok((0, a)),
        (Err(_), Ok(b)) => Ok((1, b)),
        (Err(a), Err(b)) => Err((a, b)),
    }
}

// ---------------------------------------------------------------------
// Format version 2: encrypted stores.
//
// Every header is an *envelope*: magic, version, a key check and the seal
// of the body in plaintext, then the body's ciphertext and a CRC over all
// of it. A blob's grains hold its *image*: a sealed grain header, then the
// blob in sealed chunks. See FORMAT.md.
// ---------------------------------------------------------------------

/// The format version of an encrypted store's index and stratum headers.
pub const SEALED_FORMAT_VERSION: u8 = 2;
/// Bytes of an envelope before its body's ciphertext: magic (8), version
/// (1), zeros (7), key check seal and body seal.
pub const ENVELOPE_HEAD: usize = 16 + 2 * SEAL_BYTES;
/// Bytes of the plaintext body of a sealed index header copy.
pub const SEALED_INDEX_BODY: usize = 172 + MAX_KEY_CHECKS * SEAL_BYTES;
/// The most key checks a sealed index holds (one per key id in use).
pub const MAX_KEY_CHECKS: usize = 32;
/// Bytes of plaintext in one chunk of a sealed blob (the last one may be
/// shorter).
pub const SEALED_CHUNK: u64 = 64 << 10;
/// Bytes of a sealed blob's image before its chunks: the seal and
/// ciphertext of its grain header.
pub const SEALED_IMAGE_HEAD: u64 = (SEAL_BYTES + GRAIN_HEADER_SIZE) as u64;
/// Stamps (4 bytes each) in one page of a sealed stratum header copy; a
/// page is its seal and their ciphertext, 4096 bytes in all.
pub const STAMPS_PER_PAGE: u32 = ((4096 - SEAL_BYTES) / 4) as u32;
/// Bytes of one stamp page.
pub const STAMP_PAGE_BYTES: u64 = 4096;
/// The largest blob an encrypted store holds: its image fills 32 grains of
/// 32 MiB.
pub const MAX_SEALED_BLOB_BYTES: u64 = max_sealed_blob_bytes();

const fn max_sealed_blob_bytes() -> u64 {
    let space = MAX_GRAINS_PER_BLOB as u64 * (16 << (BASINS - 1));
    // The chunk count of the space left after the head, rounded up, is at
    // least that of the largest blob; lower the blob until its image fits.
    let mut len = space - SEALED_IMAGE_HEAD;
    while SEALED_IMAGE_HEAD + len + SEAL_BYTES as u64 * len.div_ceil(SEALED_CHUNK) > space {
        len -= 1;
    }
    len
}

/// How blobs and headers are laid out: in a plain store (format version
/// 1) or an encrypted one (version 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Format version 1: plaintext with CRCs.
    Plain,
    /// Format version 2: sealed with okaywal's cipher (AES-256-GCM).
    Sealed,
}

impl Layout {
    /// Bytes a blob of `len` bytes takes in its grains (`None` if the
    /// arithmetic overflows).
    #[must_use]
    pub fn stored_len(self, len: u64) -> Option<u64> {
        match self {
            Layout::Plain => len.checked_add(GRAIN_HEADER_SIZE as u64),
            Layout::Sealed => sealed_image_len(len),
        }
    }

    /// The basin and grain count of a blob of `len` bytes.
    #[must_use]
    pub fn placement(self, len: u64) -> Option<(u8, u32)> {
        fit(self.stored_len(len)?)
    }

    /// The largest blob the layout holds.
    #[must_use]
    pub fn max_blob_bytes(self) -> u64 {
        match self {
            Layout::Plain => MAX_FORMAT_BLOB_BYTES,
            Layout::Sealed => MAX_SEALED_BLOB_BYTES,
        }
    }

    /// Bytes of one stratum header copy of `basin`: the same in both
    /// layouts (a sealed copy's stamp pages are in the stratum's stamps
    /// file), so grains are where [`grain_offset`] says in both.
    #[must_use]
    pub fn slot_size(self, basin: u8) -> u64 {
        stratum_slot_size(basin)
    }

    /// Offset of grain `index` in a stratum file of `basin`: the same in
    /// both layouts.
    #[must_use]
    pub fn grain_offset(self, basin: u8, index: u32) -> u64 {
        grain_offset(basin, index)
    }
}

/// Bytes of the image of a sealed blob of `len` bytes: its sealed grain
/// header, then one seal per chunk and the ciphertext.
#[must_use]
pub fn sealed_image_len(len: u64) -> Option<u64> {
    let chunks = len.div_ceil(SEALED_CHUNK);
    SEALED_IMAGE_HEAD
        .checked_add(len)?
        .checked_add(chunks.checked_mul(SEAL_BYTES as u64)?)
}

/// Chunks of a sealed blob of `len` bytes (none for an empty blob).
#[must_use]
pub fn sealed_chunks(len: u64) -> u64 {
    len.div_ceil(SEALED_CHUNK)
}

/// Where chunk `chunk` of a sealed blob of `len` bytes lies in its image
/// (its seal first) and how many plaintext bytes it holds.
#[must_use]
pub fn sealed_chunk_span(len: u64, chunk: u64) -> (u64, usize) {
    let offset = SEALED_IMAGE_HEAD + chunk * (SEAL_BYTES as u64 + SEALED_CHUNK);
    let plain = len.saturating_sub(chunk * SEALED_CHUNK).min(SEALED_CHUNK);
    (offset, plain as usize)
}

/// Stamp pages of a sealed stratum header copy of `basin`.
#[must_use]
pub fn stamp_pages(basin: u8) -> u32 {
    stratum_capacity(basin).div_ceil(STAMPS_PER_PAGE)
}

/// Bytes of the plaintext body of a sealed stratum header copy: fixed
/// fields, both bitmaps and a version per stamp page.
#[must_use]
pub fn sealed_stratum_body_len(basin: u8) -> usize {
    24 + stratum_capacity(basin) as usize / 4 + 8 * stamp_pages(basin) as usize
}

/// Bytes of a sealed stratum header copy (envelope, body, CRC): it fits in
/// [`stratum_slot_size`], like a plain copy.
#[must_use]
pub fn sealed_stratum_header_len(basin: u8) -> u64 {
    (ENVELOPE_HEAD + sealed_stratum_body_len(basin) + 4) as u64
}

/// Offset of stamp page `page` of header copy `copy` in the stamps file
/// of a stratum of `basin` (`stamps-{basin}-{n}`): the pages of copy 0,
/// then those of copy 1.
#[must_use]
pub fn stamp_page_offset(basin: u8, copy: u64, page: u32) -> u64 {
    (copy * u64::from(stamp_pages(basin)) + u64::from(page)) * STAMP_PAGE_BYTES
}

/// The plaintext parts of an envelope (see [`open_envelope`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// The key check: a seal of nothing by the key the body is sealed with.
    pub key_check: Seal,
    /// The seal of the body.
    pub body_seal: Seal,
    /// The body's ciphertext.
    pub body: Vec<u8>,
}

/// Encodes an envelope of `magic` whose body ciphertext is `body`; the
/// result is `body.len() + ENVELOPE_HEAD + 4` bytes.
#[must_use]
pub fn encode_envelope(magic: [u8; 8], key_check: &Seal, body_seal: &Seal, body: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(ENVELOPE_HEAD + body.len() + 4);
    bytes.extend_from_slice(&magic);
    bytes.push(SEALED_FORMAT_VERSION);
    bytes.extend_from_slice(&[0; 7]);
    bytes.extend_from_slice(&key_check.to_bytes());
    bytes.extend_from_slice(&body_seal.to_bytes());
    bytes.extend_from_slice(body);
    let crc = crc32fast::hash(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    bytes
}

/// Reads an envelope of `magic` with a body of `body_len` bytes from the
/// start of `bytes`, checking magic, version and CRC (not the seals: that
/// needs the key).
pub fn open_envelope(
    bytes: &[u8],
    magic: [u8; 8],
    body_len: usize,
) -> Result<Envelope, HeaderError> {
    if bytes.len() < 16 {
        return Err(HeaderError::Truncated);
    }
    if bytes[..8] != magic {
        return Err(HeaderError::BadMagic);
    }
    if bytes[8] != SEALED_FORMAT_VERSION {
        return Err(HeaderError::UnknownVersion(bytes[8]));
    }
    let crc_at = ENVELOPE_HEAD + body_len;
    if bytes.len() < crc_at + 4 {
        return Err(HeaderError::Truncated);
    }
    if crc32fast::hash(&bytes[..crc_at]) != read_u32(bytes, crc_at) {
        return Err(HeaderError::BadChecksum);
    }
    let seal = |at: usize| {
        Seal::from_bytes(
            bytes[at..at + SEAL_BYTES]
                .try_into()
                .expect("SEAL_BYTES bytes"),
        )
    };
    Ok(Envelope {
        key_check: seal(16),
        body_seal: seal(16 + SEAL_BYTES),
        body: bytes[ENVELOPE_HEAD..crc_at].to_vec(),
    })
}

/// The magic of an index header copy.
pub const INDEX_MAGIC_BYTES: [u8; 8] = INDEX_MAGIC;
/// The magic of a stratum header copy.
pub const STRATUM_MAGIC_BYTES: [u8; 8] = STRATUM_MAGIC;

/// The format version byte of a header copy, if it has the magic.
#[must_use]
pub fn version_of(bytes: &[u8], magic: [u8; 8]) -> Option<u8> {
    (bytes.get(..8) == Some(&magic[..])).then(|| bytes.get(8).copied())?
}

/// What a sealed index header copy holds besides an [`IndexHeader`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedIndex {
    /// The index fields, as in format version 1.
    pub header: IndexHeader,
    /// The store's random id, bound into every other sealed unit.
    pub store_id: [u8; 16],
    /// A key check for each key id the store's files may be sealed with.
    pub key_checks: Vec<Seal>,
}

impl SealedIndex {
    /// The plaintext body ([`SEALED_INDEX_BODY`] bytes).
    #[must_use]
    pub fn encode_body(&self) -> Vec<u8> {
        // The fields sit where format version 1 has them, 16 bytes on.
        let plain = self.header.encode();
        let mut body = vec![0_u8; SEALED_INDEX_BODY];
        body[..16].copy_from_slice(&self.store_id);
        body[16..168].copy_from_slice(&plain[16..168]);
        let checks = self.key_checks.len().min(MAX_KEY_CHECKS);
        body[168..172].copy_from_slice(&(checks as u32).to_le_bytes());
        for (i, check) in self.key_checks.iter().take(checks).enumerate() {
            let at = 172 + i * SEAL_BYTES;
            body[at..at + SEAL_BYTES].copy_from_slice(&check.to_bytes());
        }
        body
    }

    /// Decodes a plaintext body.
    pub fn decode_body(body: &[u8]) -> Result<Self, HeaderError> {
        if body.len() != SEALED_INDEX_BODY {
            return Err(HeaderError::Truncated);
        }
        let mut plain = vec![0_u8; INDEX_SLOT_SIZE as usize];
        plain[..8].copy_from_slice(&INDEX_MAGIC);
        plain[8] = FORMAT_VERSION;
        plain[16..168].copy_from_slice(&body[16..168]);
        let crc_at = INDEX_SLOT_SIZE as usize - 4;
        let crc = crc32fast::hash(&plain[..crc_at]);
        plain[crc_at..].copy_from_slice(&crc.to_le_bytes());
        let header = IndexHeader::decode(&plain)?;
        let count = read_u32(body, 168) as usize;
        if count > MAX_KEY_CHECKS {
            return Err(HeaderError::Inconsistent(format!(
                "{count} key checks, more than {MAX_KEY_CHECKS}"
            )));
        }
        let key_checks = (0..count)
            .map(|i| {
                let at = 172 + i * SEAL_BYTES;
                Seal::from_bytes(body[at..at + SEAL_BYTES].try_into().expect("seal"))
            })
            .collect();
        Ok(Self {
            header,
            store_id: body[..16].try_into().expect("16 bytes"),
            key_checks,
        })
    }
}

impl StratumHeader {
    /// The plaintext body of a sealed copy, with `page_versions` (one per
    /// stamp page: the generation that last wrote it, 0 for never).
    #[must_use]
    pub fn encode_sealed_body(&self, page_versions: &[u64]) -> Vec<u8> {
        let mut body = Vec::with_capacity(sealed_stratum_body_len(self.basin));
        body.push(self.basin);
        body.extend_from_slice(&[0; 3]);
        body.extend_from_slice(&(grain_size(self.basin) as u32).to_le_bytes());
        body.extend_from_slice(&stratum_capacity(self.basin).to_le_bytes());
        body.extend_from_slice(&self.stratum.to_le_bytes());
        body.extend_from_slice(&self.generation.to_le_bytes());
        words_to_bytes(&self.allocated, &mut body);
        words_to_bytes(&self.starts, &mut body);
        for version in page_versions {
            body.extend_from_slice(&version.to_le_bytes());
        }
        body
    }

    /// Decodes the plaintext body of a sealed copy, checking it against
    /// the file name's `basin` and `stratum`; returns the header and the
    /// page versions.
    pub fn decode_sealed_body(
        body: &[u8],
        basin: u8,
        stratum: u32,
    ) -> Result<(Self, Vec<u64>), HeaderError> {
        if usize::from(basin) >= BASINS {
            return Err(HeaderError::Inconsistent(format!("basin {basin}")));
        }
        if body.len() != sealed_stratum_body_len(basin) {
            return Err(HeaderError::Truncated);
        }
        if body[0] != basin {
            return Err(HeaderError::Inconsistent(format!(
                "header says basin {}, file name says {basin}",
                body[0]
            )));
        }
        let capacity = stratum_capacity(basin);
        if u64::from(read_u32(body, 4)) != grain_size(basin) || read_u32(body, 8) != capacity {
            return Err(HeaderError::Inconsistent(
                "grain size or capacity does not match the basin".into(),
            ));
        }
        if read_u32(body, 12) != stratum {
            return Err(HeaderError::Inconsistent(format!(
                "header says stratum {}, file name says {stratum}",
                read_u32(body, 12)
            )));
        }
        let bitmap = capacity as usize / 8;
        let versions_at = 24 + 2 * bitmap;
        Ok((
            Self {
                basin,
                stratum,
                generation: read_u64(body, 16),
                allocated: bytes_to_words(&body[24..24 + bitmap]),
                starts: bytes_to_words(&body[24 + bitmap..versions_at]),
            },
            body[versions_at..]
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_wastes_little() {
        assert_eq!(placement(0), Some((0, 1)));
        assert_eq!(placement(16), Some((0, 2)));
        for len in [513_u64, 1000, 1024, 4096, 65_536, 1 << 20, 64 << 20] {
            let (basin, count) = placement(len).unwrap();
            let used = u64::from(count) * grain_size(basin);
            let waste = (used - len) as f64 / len as f64;
            assert!(waste < 0.07, "len {len}: {used} bytes used");
            assert!(count > 16, "len {len}: only {count} grains");
        }
        for len in (0..5000).chain([MAX_FORMAT_BLOB_BYTES]) {
            let (basin, count) = placement(len).unwrap();
            assert!(u64::from(count) * grain_size(basin) >= len + 16);
            assert!(count <= MAX_GRAINS_PER_BLOB);
        }
        assert_eq!(placement(MAX_FORMAT_BLOB_BYTES + 1), None);
        assert_eq!(placement(u64::MAX), None);
    }

    /// Header and rounding together, as documented in FORMAT.md: at most
    /// 25% from 124 bytes, under 9% from 512 bytes; below that the
    /// fixed 16-byte header dominates.
    #[test]
    fn space_used_stays_within_a_quarter_from_116_bytes() {
        let overhead = |len: u64| {
            let (basin, count) = placement(len).unwrap();
            (u64::from(count) * grain_size(basin) - len) as f64 / len as f64
        };
        let sizes = (116..70_000_u64)
            .chain((16..=26).flat_map(|shift| {
                let base = 1_u64 << shift;
                [base - 17, base - 16, base - 1, base, base + 1, base * 3 / 2]
            }))
            .chain([MAX_FORMAT_BLOB_BYTES]);
        for len in sizes {
            let limit = if len >= 512 { 0.09 } else { 0.25 };
            assert!(overhead(len) <= limit, "len {len}: {}", overhead(len));
        }
        // Just below the bound the header is what costs: 115 + 16 bytes
        // round up to 144.
        assert!(overhead(115) > 0.25);
        assert_eq!(overhead(16), 1.0);
    }

    #[test]
    fn capacities_fit_the_index_bits_and_bitmaps() {
        for basin in 0..BASINS as u8 {
            let capacity = stratum_capacity(basin);
            assert_eq!(capacity % 64, 0);
            assert!(capacity <= 1 << STRATUM_INDEX_BITS);
            assert!(capacity >= MAX_GRAINS_PER_BLOB);
            assert_eq!(stratum_slot_size(basin) % 4096, 0);
        }
    }

    #[test]
    fn stratum_header_round_trips_and_rejects_damage() {
        let mut header = StratumHeader::empty(10, 3);
        header.generation = 9;
        header.allocated[0] = 0b1110;
        header.starts[0] = 0b0010;
        let bytes = header.encode();
        assert_eq!(bytes.len() as u64, stratum_slot_size(10));
        assert_eq!(StratumHeader::decode(&bytes, 10, 3).unwrap(), header);
        assert!(StratumHeader::decode(&bytes, 10, 4).is_err());
        assert!(StratumHeader::decode(&bytes, 11, 3).is_err());
        assert!(StratumHeader::decode(&bytes[..100], 10, 3).is_err());
        let used = STRATUM_FIXED + stratum_capacity(10) as usize / 4 + 4;
        for at in (0..used).step_by(7) {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x40;
            assert!(
                StratumHeader::decode(&damaged, 10, 3).is_err(),
                "flip at {at}"
            );
        }
    }

    #[test]
    fn index_header_round_trips_and_rejects_damage() {
        let header = IndexHeader {
            generation: 4,
            wal_checkpointed_entry: 100,
            checkpointed_to: 50,
            embedded_header: GrainId::new(1, 2, 3, 4),
            commit_log_file: 7,
            commit_log_end: 999,
            last_committed: 98,
            strata: std::array::from_fn(|basin| basin as u32 * 3),
        };
        let bytes = header.encode();
        assert_eq!(IndexHeader::decode(&bytes).unwrap(), header);
        for at in (0..bytes.len()).step_by(13) {
            let mut damaged = bytes.clone();
            damaged[at] ^= 1;
            assert!(IndexHeader::decode(&damaged).is_err(), "flip at {at}");
        }
        let picked = newest(
            IndexHeader::decode(&bytes),
            Err(HeaderError::BadMagic),
            |h| h.generation,
        )
        .unwrap();
        assert_eq!(picked.0, 0);
    }

    #[test]
    fn sealed_layouts_fit_as_documented() {
        assert_eq!(MAX_SEALED_BLOB_BYTES, 1_073_021_308);
        let space = u64::from(MAX_GRAINS_PER_BLOB) * grain_size(BASINS as u8 - 1);
        assert!(sealed_image_len(MAX_SEALED_BLOB_BYTES).unwrap() <= space);
        assert!(sealed_image_len(MAX_SEALED_BLOB_BYTES + 1).unwrap() > space);
        assert_eq!(Layout::Sealed.placement(MAX_SEALED_BLOB_BYTES + 1), None);
        assert_eq!(sealed_image_len(0), Some(60));
        assert_eq!(sealed_image_len(65_536), Some(60 + 44 + 65_536));
        assert_eq!(sealed_image_len(65_537), Some(60 + 88 + 65_537));
        assert_eq!(
            sealed_chunk_span(100_000, 1),
            (60 + 65_580, 100_000 - 65_536)
        );
        for basin in 0..BASINS as u8 {
            // A sealed header copy fits where a plain one is, so grains
            // are at the same offsets in both layouts.
            assert!(sealed_stratum_header_len(basin) <= stratum_slot_size(basin));
            assert_eq!(
                Layout::Sealed.grain_offset(basin, 5),
                Layout::Plain.grain_offset(basin, 5)
            );
            assert_eq!(
                stamp_page_offset(basin, 1, 0),
                u64::from(stamp_pages(basin)) * 4096
            );
            assert!(
                u64::from(stamp_pages(basin)) * u64::from(STAMPS_PER_PAGE)
                    >= u64::from(stratum_capacity(basin))
            );
        }
        assert_eq!(STAMPS_PER_PAGE, 1013);
        assert_eq!(SEALED_INDEX_BODY + ENVELOPE_HEAD + 4, 1688);
    }

    #[test]
    fn sealed_bodies_round_trip_and_refuse_garbage() {
        let index = SealedIndex {
            header: IndexHeader {
                generation: 3,
                wal_checkpointed_entry: 9,
                checkpointed_to: 2,
                embedded_header: GrainId::new(1, 2, 3, 4),
                commit_log_file: 5,
                commit_log_end: 77,
                last_committed: 8,
                strata: std::array::from_fn(|basin| basin as u32),
            },
            store_id: [7; 16],
            key_checks: Vec::new(),
        };
        let body = index.encode_body();
        assert_eq!(SealedIndex::decode_body(&body).unwrap(), index);
        assert!(SealedIndex::decode_body(&body[..100]).is_err());
        let mut many = body.clone();
        many[168] = 33;
        assert!(SealedIndex::decode_body(&many).is_err());

        let mut header = StratumHeader::empty(4, 2);
        header.generation = 6;
        header.allocated[0] = 0b110;
        header.starts[0] = 0b010;
        let versions = vec![3; stamp_pages(4) as usize];
        let body = header.encode_sealed_body(&versions);
        assert_eq!(body.len(), sealed_stratum_body_len(4));
        assert_eq!(
            StratumHeader::decode_sealed_body(&body, 4, 2).unwrap(),
            (header, versions)
        );
        assert!(StratumHeader::decode_sealed_body(&body, 4, 3).is_err());
        assert!(StratumHeader::decode_sealed_body(&body, 5, 2).is_err());
        assert!(StratumHeader::decode_sealed_body(&body[1..], 4, 2).is_err());
        assert!(StratumHeader::decode_sealed_body(&body, 99, 2).is_err());
    }

    #[test]
    fn grain_header_round_trips() {
        let header = GrainHeader {
            sequence: 5,
            length: 77,
            crc: grain_crc(5, &[1; 77]),
        };
        assert_eq!(GrainHeader::decode(&header.encode()), Some(header));
        assert_eq!(GrainHeader::decode(&[0; 3]), None);
        assert_ne!(grain_crc(5, b"a"), grain_crc(6, b"a"));
    }
}
