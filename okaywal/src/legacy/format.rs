//! The okaywal 0.2/0.3 byte format: headers, the CRC32C of its records,
//! the walk over a segment's records, and reading one chunk back.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::format::MAGIC;
use crate::fs::FileHandle;
use crate::position::LogPosition;
use crate::reader::ChunkReader;
use crate::recovery::ChunkLocation;

/// The first four bytes of a 0.2/0.3 segment: `okw` and format version 0.
pub(crate) const LEGACY_MAGIC: [u8; 4] = *b"okw\0";
/// The name of the format in messages.
pub(crate) const FORMAT_NAME: &str = "okaywal 0.3 format";

/// The byte that starts an entry: then its id (u64).
pub(super) const NEW_ENTRY: u8 = 1;
/// The byte that starts a chunk: then its length (u32), the data and the
/// CRC-32C of the data (u32).
pub(super) const CHUNK: u8 = 2;
/// The byte that ends (commits) an entry.
pub(super) const END_OF_ENTRY: u8 = 3;
/// An entry header: the kind byte and the id.
pub(super) const ENTRY_HEADER: u64 = 9;
/// A chunk header: the kind byte and the length.
pub(super) const CHUNK_HEADER: u64 = 5;
/// The bytes a chunk record has besides its data (header and CRC).
pub(crate) const CHUNK_OVERHEAD: usize = 9;

/// The CRC-32C (Castagnoli) lookup tables, slicing by 8.
const CRC32C_TABLES: [[u32; 256]; 8] = crc32c_tables();

const fn crc32c_tables() -> [[u32; 256]; 8] {
    // The reflected Castagnoli polynomial.
    const POLY: u32 = 0x82F6_3B78;
    let mut tables = [[0_u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ POLY
            } else {
                crc >> 1
            };
            bit += 1;
        }
        tables[0][i] = crc;
        i += 1;
    }
    let mut i = 0;
    while i < 256 {
        let mut slice = 1;
        while slice < 8 {
            let previous = tables[slice - 1][i];
            tables[slice][i] = (previous >> 8) ^ tables[0][(previous & 0xff) as usize];
            slice += 1;
        }
        i += 1;
    }
    tables
}

/// Extends `crc`, the CRC-32C of some bytes (0 for none), with `data`:
/// `crc32c(a ++ b) == crc32c_append(crc32c_append(0, a), b)`.
pub(crate) fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    let t = &CRC32C_TABLES;
    let mut crc = !crc;
    let mut words = data.chunks_exact(8);
    for word in &mut words {
        let low = u32::from_le_bytes([word[0], word[1], word[2], word[3]]) ^ crc;
        let high = u32::from_le_bytes([word[4], word[5], word[6], word[7]]);
        crc = t[7][(low & 0xff) as usize]
            ^ t[6][((low >> 8) & 0xff) as usize]
            ^ t[5][((low >> 16) & 0xff) as usize]
            ^ t[4][(low >> 24) as usize]
            ^ t[3][(high & 0xff) as usize]
            ^ t[2][((high >> 8) & 0xff) as usize]
            ^ t[1][((high >> 16) & 0xff) as usize]
            ^ t[0][(high >> 24) as usize];
    }
    for &byte in words.remainder() {
        crc = t[0][((crc ^ u32::from(byte)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

/// The header of a 0.2/0.3 segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LegacyHeader {
    /// The user's version information (up to 255 bytes).
    pub version_info: Vec<u8>,
    /// Where the entries start (just past the header); `None` if the file
    /// ends inside its header, when it holds no entries.
    pub records_start: Option<u64>,
}

/// What the first bytes of a `wal-*` file are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HeaderKind {
    /// Nothing but zeros (or an empty file): a header never written.
    Unwritten,
    /// This crate's magic: one of its own headers (perhaps one that never
    /// became durable, or damaged).
    Ours,
    /// An okaywal 0.2/0.3 header.
    Legacy(LegacyHeader),
    /// Anything else, described for an error message.
    Foreign(String),
}

/// Classifies the first bytes of a file (up to this format's header size;
/// fewer only if the file is shorter).
pub(crate) fn classify(bytes: &[u8]) -> HeaderKind {
    // (A file cut inside the magic counts too.)
    if bytes.starts_with(&MAGIC) || (!bytes.is_empty() && MAGIC.starts_with(bytes)) {
        return HeaderKind::Ours;
    }
    if bytes.iter().all(|&b| b == 0) {
        return HeaderKind::Unwritten;
    }
    if bytes.starts_with(&LEGACY_MAGIC[..3]) || LEGACY_MAGIC[..3].starts_with(bytes) {
        match bytes.get(3) {
            None | Some(0) => {}
            Some(version) => {
                return HeaderKind::Foreign(format!(
                    "an okaywal header of format version {version}, which this crate cannot read \
                     (it reads okaywal 0.2 and 0.3 logs, format version 0)"
                ))
            }
        }
        let version_info_len = bytes.get(4).map(|&n| usize::from(n));
        let version_info = version_info_len.and_then(|n| bytes.get(5..5 + n));
        return HeaderKind::Legacy(match version_info {
            Some(info) => LegacyHeader {
                version_info: info.to_vec(),
                records_start: Some(5 + info.len() as u64),
            },
            None => LegacyHeader {
                version_info: Vec::new(),
                records_start: None,
            },
        });
    }
    let shown = &bytes[..bytes.len().min(16)];
    let hex: Vec<String> = shown.iter().map(|b| format!("{b:02x}")).collect();
    let text: String = shown
        .iter()
        .map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                char::from(b)
            } else {
                '.'
            }
        })
        .collect();
    HeaderKind::Foreign(format!(
        "a header of neither this crate's format (\"OKAYWAL\") nor the {FORMAT_NAME} \
         (\"okw\\0\"), and not zeros either: it begins with {} (\"{text}\")",
        hex.join(" ")
    ))
}

/// The error for a file whose header is [`HeaderKind::Foreign`].
pub(crate) fn foreign_file_error(path: &Path, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "{}: not a segment of this log: the file has {what}. The log never reuses or \
             overwrites a file it does not recognise, so it does not open while the file is \
             there: move it out of the directory (or give it a name that does not start with \
             \"wal-\") if it belongs to something else, and open the log again",
            path.display()
        ),
    )
}

/// A `wal-{id}` file with an okaywal 0.2/0.3 header, found at open.
#[derive(Debug)]
pub(crate) struct LegacySegment {
    pub id: u64,
    pub path: PathBuf,
    pub file: Arc<dyn FileHandle>,
    pub header: LegacyHeader,
}

/// For a `wal-{id}` file whose header is not a valid one of this format:
/// the 0.2/0.3 segment, if `header_bytes` (its first bytes) are that
/// format's header.
pub(crate) fn recognise(
    id: u64,
    path: &Path,
    file: &Arc<dyn FileHandle>,
    header_bytes: &[u8],
) -> Option<LegacySegment> {
    match classify(header_bytes) {
        HeaderKind::Legacy(header) => Some(LegacySegment {
            id,
            path: path.to_path_buf(),
            file: file.clone(),
            header,
        }),
        _ => None,
    }
}

/// For a `wal-{id}` file whose header is not a valid one of this format
/// and holds no records of it: an error naming the file unless its first
/// bytes are this format's magic or zeros (a header that never became
/// durable) or a 0.2/0.3 header. Such a file is never reused.
pub(crate) fn refuse_foreign(path: &Path, header_bytes: &[u8]) -> io::Result<()> {
    match classify(header_bytes) {
        HeaderKind::Foreign(what) => Err(foreign_file_error(path, &what)),
        _ => Ok(()),
    }
}

/// The id in the name of a segment okaywal 0.2/0.3 had checkpointed,
/// `wal-{id}-cp`.
pub(crate) fn checkpointed_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("wal-")?.strip_suffix("-cp")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// A committed entry whose chunk failed its CRC-32C while entries committed
/// after it follow in the same file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Damage {
    pub entry_id: u64,
    /// The offset of the chunk that failed.
    pub offset: u64,
}

/// What walking a 0.2/0.3 segment found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct LegacyScan {
    /// Committed entries whose chunks all verified, by id.
    pub entries: BTreeMap<u64, Vec<ChunkLocation>>,
    /// The highest id of any entry header the walk read.
    pub max_entry_id: Option<u64>,
    /// Where the walk ended.
    pub end: u64,
    /// Entries that were rolled back, never finished, torn or damaged.
    pub discarded: usize,
    /// The first committed entry with a bad chunk that committed entries
    /// follow.
    pub damage: Option<Damage>,
}

/// Reads a file through a buffer.
struct Bytes<'a> {
    file: &'a dyn FileHandle,
    len: u64,
    buffer: Vec<u8>,
    start: u64,
    filled: usize,
}

impl<'a> Bytes<'a> {
    fn new(file: &'a dyn FileHandle, len: u64, buffer_bytes: usize) -> Self {
        // Never more than the file: a small file costs a small buffer.
        let size = buffer_bytes
            .clamp(4096, 1 << 20)
            .min(usize::try_from(len).unwrap_or(usize::MAX))
            .max(16);
        Self {
            file,
            len,
            buffer: vec![0; size],
            start: 0,
            filled: 0,
        }
    }

    /// Up to `n` (at most the buffer size) bytes at `offset`: fewer only
    /// at the end of the file.
    fn get(&mut self, offset: u64, n: usize) -> io::Result<&[u8]> {
        let n = n.min(self.buffer.len());
        let end = offset.saturating_add(n as u64).min(self.len);
        if offset < self.start || end > self.start + self.filled as u64 {
            self.start = offset;
            self.filled = 0;
            let want = usize::try_from(self.len.saturating_sub(offset))
                .unwrap_or(usize::MAX)
                .min(self.buffer.len());
            while self.filled < want {
                let read = self.file.read_at(
                    &mut self.buffer[self.filled..want],
                    offset + self.filled as u64,
                )?;
                if read == 0 {
                    break;
                }
                self.filled += read;
            }
        }
        let at = usize::try_from(offset - self.start).unwrap_or(usize::MAX);
        let available = self.filled.saturating_sub(at).min(n);
        Ok(&self.buffer[at.min(self.filled)..at.min(self.filled) + available])
    }

    fn byte(&mut self, offset: u64) -> io::Result<Option<u8>> {
        Ok(self.get(offset, 1)?.first().copied())
    }

    /// True if the `length` bytes at `offset` are followed by their
    /// CRC-32C; the caller has checked that both are inside the file.
    fn crc_matches(&mut self, offset: u64, length: u64) -> io::Result<bool> {
        let mut crc = 0;
        let mut at = offset;
        let end = offset + length;
        while at < end {
            let want = usize::try_from(end - at).unwrap_or(usize::MAX);
            let piece = self.get(at, want)?;
            if piece.is_empty() {
                return Ok(false);
            }
            crc = crc32c_append(crc, piece);
            at += piece.len() as u64;
        }
        let stored = self.get(end, 4)?;
        Ok(stored.len() == 4
            && u32::from_le_bytes([stored[0], stored[1], stored[2], stored[3]]) == crc)
    }
}

/// How an entry's records ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EntryEnd {
    /// An end-of-entry byte.
    Committed,
    /// A byte that is neither a chunk nor the end: the entry was never
    /// finished (0.3 goes on reading an entry header right there).
    Unfinished,
    /// A chunk cut short by the end of the file.
    Cut,
}

/// Walks a 0.2/0.3 segment whose name is `wal-{segment_id}`, as okaywal
/// 0.3.1's recovery walks it (FORMAT.md, "Logs written by okaywal 0.2 and
/// 0.3"), checking every chunk's CRC-32C. `upper` is the id of the next
/// 0.2/0.3 segment, if any: ids in this one lie below it.
pub(crate) fn scan(
    file: &dyn FileHandle,
    segment_id: u64,
    header: &LegacyHeader,
    upper: Option<u64>,
    buffer_bytes: usize,
) -> io::Result<LegacyScan> {
    let len = file.len()?;
    let mut scan = LegacyScan::default();
    let Some(start) = header.records_start else {
        scan.end = len;
        return Ok(scan);
    };
    let mut bytes = Bytes::new(file, len, buffer_bytes);
    let mut at = start;
    let mut previous: Option<u64> = None;
    // A committed entry with a bad chunk, not yet followed by a good one.
    let mut suspect: Option<Damage> = None;
    loop {
        scan.end = at;
        let header = bytes.get(at, ENTRY_HEADER as usize)?;
        if header.len() < ENTRY_HEADER as usize || header[0] != NEW_ENTRY {
            break;
        }
        let id = u64::from_le_bytes(header[1..9].try_into().expect("8 bytes"));
        // Stale bytes of the file's earlier use carry lower ids; ids in a
        // file only grow, and stay below the next file's name.
        if id < segment_id || previous.is_some_and(|p| id <= p) || upper.is_some_and(|u| id >= u) {
            break;
        }
        previous = Some(id);
        scan.max_entry_id = Some(id);
        at += ENTRY_HEADER;
        let mut chunks = Vec::new();
        let mut bad = None;
        let end = loop {
            match bytes.byte(at)? {
                Some(CHUNK) => {
                    let chunk = bytes.get(at, CHUNK_HEADER as usize)?;
                    if chunk.len() < CHUNK_HEADER as usize {
                        break EntryEnd::Cut;
                    }
                    let length = u32::from_le_bytes(chunk[1..5].try_into().expect("4 bytes"));
                    let record_end = at + CHUNK_OVERHEAD as u64 + u64::from(length);
                    if record_end > len {
                        break EntryEnd::Cut;
                    }
                    if !bytes.crc_matches(at + CHUNK_HEADER, u64::from(length))? && bad.is_none() {
                        bad = Some(at);
                    }
                    chunks.push(ChunkLocation {
                        offset: at,
                        length,
                        index: 0,
                        presealed: false,
                    });
                    at = record_end;
                }
                Some(END_OF_ENTRY) => {
                    at += 1;
                    break EntryEnd::Committed;
                }
                _ => break EntryEnd::Unfinished,
            }
        };
        match (end, bad) {
            (EntryEnd::Committed, None) => {
                if let Some(damage) = suspect.take() {
                    scan.damage.get_or_insert(damage);
                }
                scan.entries.insert(id, chunks);
            }
            (EntryEnd::Committed, Some(offset)) => {
                scan.discarded += 1;
                suspect.get_or_insert(Damage {
                    entry_id: id,
                    offset,
                });
            }
            (EntryEnd::Unfinished, _) => scan.discarded += 1,
            (EntryEnd::Cut, _) => {
                scan.discarded += 1;
                scan.end = at;
                return Ok(scan);
            }
        }
        if matches!(end, EntryEnd::Committed) {
            // 0.3 steps over anything that looks like a chunk after an
            // entry's end before it reads the next entry header (stale
            // bytes of an entry rolled back there, or of the file's earlier
            // use), without checking it.
            while bytes.byte(at)? == Some(CHUNK) {
                let chunk = bytes.get(at, CHUNK_HEADER as usize)?;
                if chunk.len() < CHUNK_HEADER as usize {
                    scan.end = at;
                    return Ok(scan);
                }
                let length = u32::from_le_bytes(chunk[1..5].try_into().expect("4 bytes"));
                at = at.saturating_add(CHUNK_OVERHEAD as u64 + u64::from(length));
            }
        }
    }
    Ok(scan)
}

/// A reader over a 0.2/0.3 chunk record (`bytes`: its header, data and
/// CRC-32C), or `None` if `bytes` is not a chunk record of that length.
/// The reader reports the chunk's CRC as valid exactly when the CRC-32C
/// matches the data.
pub(crate) fn chunk_reader(
    file: Arc<dyn FileHandle>,
    position: LogPosition,
    bytes: &[u8],
) -> Option<ChunkReader> {
    let length = bytes.len().checked_sub(CHUNK_OVERHEAD)?;
    if bytes[0] != CHUNK
        || u32::from_le_bytes(bytes[1..5].try_into().expect("4 bytes")) as usize != length
    {
        return None;
    }
    let data = &bytes[CHUNK_HEADER as usize..CHUNK_HEADER as usize + length];
    let stored = u32::from_le_bytes(bytes[bytes.len() - 4..].try_into().expect("4 bytes"));
    // The reader checks this crate's CRC-32 trailer: give it one that
    // matches only if the 0.3 checksum did.
    let mut trailer = crc32fast::hash(data);
    if crc32c_append(0, data) != stored {
        trailer = !trailer;
    }
    let mut prefetched = Vec::with_capacity(length + 4);
    prefetched.extend_from_slice(data);
    prefetched.extend_from_slice(&trailer.to_le_bytes());
    Some(ChunkReader::prefetched(
        file,
        position,
        position.offset + CHUNK_HEADER,
        prefetched,
    ))
}

/// A 0.2/0.3 segment file being checkpointed while the log opens, for
/// [`WriteAheadLog::read_at`].
#[derive(Debug, Clone)]
pub(crate) struct OpenLegacyFile {
    pub file: Arc<dyn FileHandle>,
    pub records_start: u64,
}

/// [`WriteAheadLog::read_at`] for a chunk in a 0.2/0.3 segment.
pub(crate) fn read_at(open: &OpenLegacyFile, position: LogPosition) -> io::Result<ChunkReader> {
    let invalid = |why: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("no chunk at {position} (a segment in the {FORMAT_NAME}): {why}"),
        )
    };
    let len = open.file.len()?;
    if position.offset < open.records_start || position.offset.saturating_add(CHUNK_HEADER) > len {
        return Err(invalid("offset is outside the segment's records"));
    }
    let mut header = [0_u8; CHUNK_HEADER as usize];
    open.file.read_exact_at(&mut header, position.offset)?;
    let length = u32::from_le_bytes(header[1..5].try_into().expect("4 bytes"));
    if header[0] != CHUNK {
        return Err(invalid("the record there is not a chunk"));
    }
    if position.offset + CHUNK_OVERHEAD as u64 + u64::from(length) > len {
        return Err(invalid("the chunk extends past the end of the file"));
    }
    let mut record = vec![0_u8; CHUNK_OVERHEAD + length as usize];
    open.file.read_exact_at(&mut record, position.offset)?;
    chunk_reader(open.file.clone(), position, &record)
        .ok_or_else(|| invalid("the chunk changed while it was read"))
}
