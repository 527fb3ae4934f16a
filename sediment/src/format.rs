//! Bytes on disk ↔ structs for every sediment file, with no I/O policy.
//! `FORMAT.md` in the crate describes the same layouts in prose.

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
    let needed = len.checked_add(GRAIN_HEADER_SIZE as u64)?;
    (0..BASINS as u8).find_map(|basin| {
        let count = needed.div_ceil(grain_size(basin));
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
}

impl std::fmt::Display for HeaderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeaderError::Truncated => f.write_str("header is truncated"),
            HeaderError::BadMagic => f.write_str("header magic is wrong"),
            HeaderError::UnknownVersion(v) => write!(f, "unknown format version {v}"),
            HeaderError::BadChecksum => f.write_str("header checksum mismatch"),
            HeaderError::Inconsistent(why) => write!(f, "header is inconsistent: {why}"),
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
