//! Logs written by okaywal 0.2 and 0.3 (the published crate), whose
//! segment files share the `wal-{id}` names of this crate's but not its
//! byte format. `FORMAT.md` ("Logs written by okaywal 0.2 and 0.3")
//! describes that format and what opening such a log does.
//!
//! At open, a `wal-{id}` file whose header starts with `okw\0` is walked
//! the way okaywal 0.3.1's own recovery walks it; its committed entries are
//! replayed through [`LogManager::recover`] before this crate's segments,
//! then handed to [`LogManager::checkpoint_to`] before the open returns, and
//! only then is the file recycled. A `wal-{id}-cp` file (a segment 0.3 had
//! checkpointed) holds nothing to replay: only the entry ids in it count.
//! A `wal-{id}` or `wal-{id}-cp` file whose header belongs to neither
//! format, and is not unwritten either, makes the open fail: it is never
//! reused or overwritten.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::RecoveryMode;
use crate::format::MAGIC;
use crate::fs::{FileHandle, FileSystem, OpenMode};
use crate::manager::{LogManager, RecoveredSegment, Recovery};
use crate::position::{EntryId, LogPosition};
use crate::reader::ChunkReader;
use crate::recovery::{ChunkLocation, SegmentReader};
use crate::segment::FileName;
use crate::WriteAheadLog;

/// The first four bytes of a 0.2/0.3 segment: `okw` and format version 0.
pub(crate) const LEGACY_MAGIC: [u8; 4] = *b"okw\0";
/// The name of the format in messages.
pub(crate) const FORMAT_NAME: &str = "okaywal 0.3 format";

/// The byte that starts an entry: then its id (u64).
const NEW_ENTRY: u8 = 1;
/// The byte that starts a chunk: then its length (u32), the data and the
/// CRC-32C of the data (u32).
const CHUNK: u8 = 2;
/// The byte that ends (commits) an entry.
const END_OF_ENTRY: u8 = 3;
/// An entry header: the kind byte and the id.
const ENTRY_HEADER: u64 = 9;
/// A chunk header: the kind byte and the length.
const CHUNK_HEADER: u64 = 5;
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
                    chunks.push(ChunkLocation { offset: at, length });
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

/// A 0.2/0.3 segment with what its walk found.
#[derive(Debug)]
struct Scanned {
    segment: LegacySegment,
    scan: LegacyScan,
    abandoned: bool,
}

impl Scanned {
    fn highest_id(&self) -> u64 {
        self.scan.max_entry_id.unwrap_or(0).max(self.segment.id)
    }

    fn reader(&self) -> SegmentReader {
        SegmentReader::legacy(
            self.segment.id,
            &self.segment.header.version_info,
            self.segment.file.clone(),
            self.scan.entries.clone(),
            self.scan.end,
        )
    }
}

/// The okaywal 0.2/0.3 files of a log directory.
#[derive(Debug, Default)]
pub(crate) struct LegacyLog {
    segments: Vec<Scanned>,
    /// `wal-{id}-cp` files, with the highest entry id each shows.
    checkpointed: Vec<(PathBuf, u64)>,
    max_id: u64,
}

impl LegacyLog {
    /// Walks the 0.2/0.3 `segments` (in id order) and the checkpointed
    /// files named `wal-{id}-cp` in `checkpointed`. A committed entry that
    /// fails its CRC-32C while committed entries follow it is handled as
    /// `mode` says for damage; a foreign header in a checkpointed file is
    /// an error.
    pub fn read(
        fs: &dyn FileSystem,
        segments: Vec<LegacySegment>,
        checkpointed: Vec<(u64, PathBuf)>,
        buffer_bytes: usize,
        mode: RecoveryMode,
    ) -> io::Result<Self> {
        let mut log = LegacyLog::default();
        let uppers: Vec<Option<u64>> = segments
            .iter()
            .skip(1)
            .map(|s| Some(s.id))
            .chain([None])
            .collect();
        let mut cut = false;
        for (segment, upper) in segments.into_iter().zip(uppers) {
            let mut scan = scan(
                &*segment.file,
                segment.id,
                &segment.header,
                upper,
                buffer_bytes,
            )?;
            log.max_id = log
                .max_id
                .max(segment.id.saturating_sub(1))
                .max(scan.max_entry_id.unwrap_or(0));
            if cut {
                scan.entries.clear();
            } else if let Some(damage) = scan.damage.clone() {
                match mode {
                    RecoveryMode::ErrorOnCorruption => {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!(
                                "{}: segment in the {FORMAT_NAME}: entry {} was committed but its \
                                 chunk at offset {} fails its CRC-32C, and entries committed after \
                                 it follow; nothing was changed. Open with RecoveryMode::PointInTime \
                                 to keep only the entries before it, or RecoveryMode::SkipCorrupted \
                                 to skip it",
                                segment.path.display(),
                                damage.entry_id,
                                damage.offset
                            ),
                        ));
                    }
                    RecoveryMode::PointInTime => {
                        scan.entries.retain(|&id, _| id < damage.entry_id);
                        cut = true;
                    }
                    RecoveryMode::SkipCorrupted => {}
                }
            }
            log.segments.push(Scanned {
                segment,
                scan,
                abandoned: false,
            });
        }
        for (id, path) in checkpointed {
            let file = fs.open(&path, OpenMode::Read)?;
            let len = file.len()?;
            let mut header_bytes = vec![0; len.min(crate::format::HEADER_SIZE) as usize];
            file.read_exact_at(&mut header_bytes, 0)?;
            let highest =
                match classify(&header_bytes) {
                    HeaderKind::Unwritten => id,
                    HeaderKind::Legacy(header) => {
                        let scan = scan(&*file, id, &header, None, buffer_bytes)?;
                        scan.max_entry_id.unwrap_or(0).max(id)
                    }
                    HeaderKind::Ours => return Err(foreign_file_error(
                        &path,
                        "this crate's header under a name (`wal-{id}-cp`) only okaywal 0.2 and \
                         0.3 use",
                    )),
                    HeaderKind::Foreign(what) => return Err(foreign_file_error(&path, &what)),
                };
            log.max_id = log.max_id.max(highest);
            log.checkpointed.push((path, highest));
        }
        Ok(log)
    }

    /// The highest entry id the 0.2/0.3 files show (names included).
    pub fn max_id(&self) -> u64 {
        self.max_id
    }

    /// Replays the committed entries of every segment the manager does not
    /// abandon, in id order.
    pub fn recover(&mut self, manager: &mut dyn LogManager) -> io::Result<()> {
        for scanned in &mut self.segments {
            let info = RecoveredSegment {
                id: scanned.segment.id,
                version_info: scanned.segment.header.version_info.clone(),
            };
            if manager.should_recover_segment(&info)? == Recovery::Abandon {
                scanned.abandoned = true;
                continue;
            }
            let mut reader = scanned.reader();
            while let Some(mut entry) = reader.read_entry()? {
                manager.recover(&mut entry)?;
            }
        }
        Ok(())
    }

    /// Checkpoints every segment not abandoned through `manager`, in
    /// order, recycling each once its checkpoint returned, then recycles
    /// the checkpointed files. Of the files it recycled, only the one
    /// named for the highest id is kept (as `wal-recycled-{id}`, which
    /// keeps later ids above every id the old log used); the rest are
    /// removed. On an error the segments not yet checkpointed are kept.
    pub fn checkpoint_and_recycle(
        self,
        log: &WriteAheadLog,
        manager: &mut dyn LogManager,
    ) -> io::Result<()> {
        if self.segments.is_empty() && self.checkpointed.is_empty() {
            return Ok(());
        }
        let inner = &log.inner;
        let fs = inner.fs();
        let directory = inner.directory().to_path_buf();
        // Calls the manager makes on the log from `checkpoint_to` behave
        // as they do on the background thread (`checkpoint_active` seals
        // without waiting for a checkpoint nobody else would run).
        let _as_maintenance = AsMaintenanceThread::enter(log);
        let mut kept = BTreeMap::new();
        for scanned in self.segments {
            let path = scanned.segment.path.clone();
            if let (false, Some(last)) = (scanned.abandoned, scanned.scan.max_entry_id) {
                let mut reader = scanned.reader();
                let id = scanned.segment.id;
                inner.set_legacy_file(
                    id,
                    Some(OpenLegacyFile {
                        file: scanned.segment.file.clone(),
                        records_start: scanned.segment.header.records_start.unwrap_or(u64::MAX),
                    }),
                );
                let result = manager.checkpoint_to(EntryId(last), &mut reader, log);
                inner.set_legacy_file(id, None);
                result.map_err(|err| {
                    io::Error::new(
                        err.kind(),
                        format!(
                            "{}: checkpointing this segment in the {FORMAT_NAME} while opening the \
                             log failed (the segment is kept, and the next open replays and \
                             checkpoints it again): {err}",
                            path.display()
                        ),
                    )
                })?;
            }
            let highest = scanned.highest_id();
            drop(scanned);
            retire(fs, &directory, &path, highest, &mut kept)?;
        }
        for (path, highest) in self.checkpointed {
            retire(fs, &directory, &path, highest, &mut kept)?;
        }
        let highest = kept.keys().next_back().copied();
        let surplus: Vec<PathBuf> = kept
            .into_iter()
            .filter(|(id, _)| Some(*id) != highest)
            .map(|(_, path)| path)
            .collect();
        if !surplus.is_empty() {
            for path in surplus {
                fs.remove_file(&path)?;
            }
            fs.sync_dir(&directory)?;
        }
        Ok(())
    }
}

/// Renames a 0.2/0.3 file whose entries are safe to `wal-recycled-{id}`
/// (recording in `kept` the names it made), or removes it if that name
/// exists already; the directory is synced before the next file is
/// looked at, so a segment is never replayed after a later one is gone.
fn retire(
    fs: &dyn FileSystem,
    directory: &Path,
    path: &Path,
    highest: u64,
    kept: &mut BTreeMap<u64, PathBuf>,
) -> io::Result<()> {
    let recycled = FileName::Recycled(highest).path_in(directory);
    if kept.contains_key(&highest) || fs.exists(&recycled)? {
        fs.remove_file(path)?;
    } else {
        fs.rename(path, &recycled)?;
        kept.insert(highest, recycled);
    }
    fs.sync_dir(directory)
}

/// Marks the calling thread as the log's maintenance thread while the 0.3
/// segments are checkpointed during open (before the real one starts).
struct AsMaintenanceThread<'a> {
    log: &'a WriteAheadLog,
}

impl<'a> AsMaintenanceThread<'a> {
    fn enter(log: &'a WriteAheadLog) -> Self {
        log.inner
            .set_maintenance_thread(Some(std::thread::current().id()));
        Self { log }
    }
}

impl Drop for AsMaintenanceThread<'_> {
    fn drop(&mut self) {
        self.log.inner.set_maintenance_thread(None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::MemoryFileSystem;

    /// Builds 0.3 segment images.
    struct Image {
        bytes: Vec<u8>,
    }

    impl Image {
        fn new(version_info: &[u8]) -> Self {
            let mut bytes = LEGACY_MAGIC.to_vec();
            bytes.push(version_info.len() as u8);
            bytes.extend_from_slice(version_info);
            Self { bytes }
        }

        fn begin(&mut self, id: u64) -> &mut Self {
            self.bytes.push(NEW_ENTRY);
            self.bytes.extend_from_slice(&id.to_le_bytes());
            self
        }

        fn chunk(&mut self, data: &[u8]) -> &mut Self {
            self.bytes.push(CHUNK);
            self.bytes
                .extend_from_slice(&(data.len() as u32).to_le_bytes());
            self.bytes.extend_from_slice(data);
            self.bytes
                .extend_from_slice(&crc32c_append(0, data).to_le_bytes());
            self
        }

        fn end(&mut self) -> &mut Self {
            self.bytes.push(END_OF_ENTRY);
            self
        }

        /// An entry of `chunks`, committed.
        fn entry(&mut self, id: u64, chunks: &[&[u8]]) -> &mut Self {
            self.begin(id);
            for chunk in chunks {
                self.chunk(chunk);
            }
            self.end()
        }
    }

    fn file_with(bytes: &[u8]) -> Arc<dyn FileHandle> {
        let fs = MemoryFileSystem::new();
        fs.create_dir_all(Path::new("/d")).unwrap();
        let file = fs.open(Path::new("/d/wal-1"), OpenMode::Create).unwrap();
        file.write_all_at(bytes, 0).unwrap();
        file
    }

    fn header_of(bytes: &[u8]) -> LegacyHeader {
        match classify(&bytes[..bytes.len().min(512)]) {
            HeaderKind::Legacy(header) => header,
            other => panic!("not a 0.3 header: {other:?}"),
        }
    }

    fn scan_bytes(bytes: &[u8], segment_id: u64, upper: Option<u64>) -> LegacyScan {
        let file = file_with(bytes);
        scan(&*file, segment_id, &header_of(bytes), upper, 4096).unwrap()
    }

    /// The committed entries of a scan, read back through the reader the
    /// manager gets.
    fn read_back(bytes: &[u8], segment_id: u64) -> Vec<(u64, Vec<Vec<u8>>)> {
        let file = file_with(bytes);
        let header = header_of(bytes);
        let scan = scan(&*file, segment_id, &header, None, 4096).unwrap();
        let mut reader = SegmentReader::legacy(
            segment_id,
            &header.version_info,
            file,
            scan.entries,
            scan.end,
        );
        let mut out = Vec::new();
        while let Some(mut entry) = reader.read_entry().unwrap() {
            assert_eq!(entry.segment().version_info(), header.version_info);
            let chunks = entry.read_all_chunks().unwrap().expect("complete");
            out.push((entry.id().0, chunks));
        }
        out
    }

    #[test]
    fn crc32c_matches_the_castagnoli_check_value_in_any_split() {
        assert_eq!(crc32c_append(0, b"123456789"), 0xE306_9283);
        assert_eq!(crc32c_append(0, b""), 0);
        let data: Vec<u8> = (0..1000_u32).map(|i| (i * 31 + 7) as u8).collect();
        let whole = crc32c_append(0, &data);
        for split in [0, 1, 7, 8, 9, 500, 999, 1000] {
            let (a, b) = data.split_at(split);
            assert_eq!(
                crc32c_append(crc32c_append(0, a), b),
                whole,
                "split {split}"
            );
        }
        // 32 bytes of zeros, a published CRC-32C test vector (RFC 3720).
        assert_eq!(crc32c_append(0, &[0; 32]), 0x8A91_36AA);
    }

    #[test]
    fn headers_are_told_apart() {
        assert_eq!(classify(&[]), HeaderKind::Unwritten);
        assert_eq!(classify(&[0; 512]), HeaderKind::Unwritten);
        let mut ours = MAGIC.to_vec();
        ours.resize(512, 0xAB);
        assert_eq!(classify(&ours), HeaderKind::Ours);
        assert_eq!(classify(b"OKAY"), HeaderKind::Ours, "cut inside the magic");
        assert_eq!(
            classify(b"okw\0\x03abcrest"),
            HeaderKind::Legacy(LegacyHeader {
                version_info: b"abc".to_vec(),
                records_start: Some(8),
            })
        );
        // Cut inside the header: a 0.3 file that holds nothing.
        for short in [&b"o"[..], b"ok", b"okw", b"okw\0", b"okw\0\x05ab"] {
            assert_eq!(
                classify(short),
                HeaderKind::Legacy(LegacyHeader {
                    version_info: Vec::new(),
                    records_start: None,
                }),
                "{short:?}"
            );
        }
        match classify(b"okw\x01\0") {
            HeaderKind::Foreign(what) => assert!(what.contains("version 1"), "{what}"),
            other => panic!("{other:?}"),
        }
        for foreign in [
            &b"SQLite format 3\0"[..],
            b"\x01",
            b"OKAYWA-",
            b"\0\0\0\0\0\0\0\x01",
        ] {
            match classify(foreign) {
                HeaderKind::Foreign(what) => assert!(what.contains("begins with"), "{what}"),
                other => panic!("{foreign:?}: {other:?}"),
            }
        }
        let err = foreign_file_error(Path::new("/d/wal-5"), "something");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("/d/wal-5"), "{err}");
    }

    #[test]
    fn checkpointed_names_are_parsed() {
        assert_eq!(checkpointed_name("wal-17-cp"), Some(17));
        for other in [
            "wal-17",
            "wal--cp",
            "wal-x-cp",
            "wal-1-cp-cp",
            "wal-+1-cp",
            "x-1-cp",
        ] {
            assert_eq!(checkpointed_name(other), None, "{other}");
        }
    }

    #[test]
    fn committed_entries_are_read_back_and_unfinished_ones_are_not() {
        let mut image = Image::new(b"v1");
        image
            .entry(10, &[b"first", b""])
            .entry(11, &[])
            // Never finished: the next entry header follows at once (0.3
            // reads on from there).
            .begin(12)
            .chunk(b"abandoned")
            .entry(13, &[&[7; 70_000], b"tail"]);
        // A rolled-back entry left at the end.
        image.begin(14).chunk(b"rolled back");
        let scan = scan_bytes(&image.bytes, 10, None);
        assert_eq!(
            scan.entries.keys().copied().collect::<Vec<_>>(),
            [10, 11, 13]
        );
        assert_eq!(scan.max_entry_id, Some(14));
        assert_eq!(scan.discarded, 2);
        assert_eq!(scan.damage, None);
        let entries = read_back(&image.bytes, 10);
        assert_eq!(
            entries,
            vec![
                (10, vec![b"first".to_vec(), Vec::new()]),
                (11, vec![]),
                (13, vec![vec![7; 70_000], b"tail".to_vec()]),
            ]
        );
    }

    #[test]
    fn the_walk_stops_at_stale_ids_and_at_the_next_segment_s_ids() {
        let mut image = Image::new(b"");
        image.entry(20, &[b"a"]).entry(21, &[b"b"]);
        let good = image.bytes.len();
        // An entry of the file's earlier use.
        image.entry(5, &[b"stale"]).entry(22, &[b"after stale"]);
        let scan = scan_bytes(&image.bytes, 20, None);
        assert_eq!(scan.entries.len(), 2);
        assert_eq!(scan.end, good as u64);

        let mut image = Image::new(b"");
        image.entry(20, &[b"a"]).entry(20, &[b"again"]);
        assert_eq!(scan_bytes(&image.bytes, 20, None).entries.len(), 1);

        let mut image = Image::new(b"");
        image.entry(20, &[b"a"]).entry(30, &[b"b"]);
        assert_eq!(scan_bytes(&image.bytes, 20, Some(30)).entries.len(), 1);
        assert_eq!(scan_bytes(&image.bytes, 20, None).entries.len(), 2);
    }

    #[test]
    fn chunk_lookalikes_after_an_entry_s_end_are_stepped_over() {
        let mut image = Image::new(b"");
        image.entry(1, &[b"one"]);
        // What a longer rolled-back entry leaves after a shorter one
        // written over it: a chunk of it, then the next entry.
        image.chunk(b"left over");
        image.entry(2, &[b"two"]);
        let entries = read_back(&image.bytes, 1);
        assert_eq!(
            entries,
            vec![(1, vec![b"one".to_vec()]), (2, vec![b"two".to_vec()])]
        );
    }

    #[test]
    fn every_truncation_keeps_a_prefix_of_the_entries() {
        let mut image = Image::new(b"info");
        for id in 1..=6_u64 {
            let data = vec![id as u8; (id * 50) as usize];
            image.entry(id, &[&data, b"x"]);
        }
        let full = scan_bytes(&image.bytes, 1, None);
        assert_eq!(full.entries.len(), 6);
        for len in 0..=image.bytes.len() {
            let bytes = &image.bytes[..len];
            let ids: Vec<u64> = match classify(&bytes[..len.min(512)]) {
                HeaderKind::Legacy(_) => read_back(bytes, 1).into_iter().map(|e| e.0).collect(),
                HeaderKind::Unwritten => Vec::new(),
                other => panic!("{len}: {other:?}"),
            };
            let expected = (1..=6_u64)
                .filter(|id| {
                    let committed_end = full.entries[id].last().map_or(0, |c| {
                        c.offset + CHUNK_OVERHEAD as u64 + u64::from(c.length)
                    }) + 1;
                    committed_end <= len as u64
                })
                .collect::<Vec<_>>();
            assert_eq!(ids, expected, "cut to {len} bytes");
        }
    }

    #[test]
    fn a_bad_checksum_is_a_torn_tail_at_the_end_and_damage_before_committed_entries() {
        let mut image = Image::new(b"");
        image
            .entry(1, &[b"one"])
            .entry(2, &[b"two"])
            .entry(3, &[b"three"]);
        let second_data = image
            .bytes
            .windows(3)
            .position(|w| w == b"two")
            .expect("data");
        let third_data = image.bytes.len() - 1 - 4 - 5;

        let mut torn = image.bytes.clone();
        torn[third_data] ^= 0xff;
        let scan = scan_bytes(&torn, 1, None);
        assert_eq!(scan.entries.keys().copied().collect::<Vec<_>>(), [1, 2]);
        assert_eq!(scan.damage, None);
        assert_eq!(scan.discarded, 1);

        let mut damaged = image.bytes.clone();
        damaged[second_data] ^= 0xff;
        let scan = scan_bytes(&damaged, 1, None);
        assert_eq!(scan.entries.keys().copied().collect::<Vec<_>>(), [1, 3]);
        assert_eq!(
            scan.damage,
            Some(Damage {
                entry_id: 2,
                offset: second_data as u64 - CHUNK_HEADER,
            })
        );
    }

    #[test]
    fn garbage_never_panics_nor_allocates_past_the_file() {
        // A chunk whose length field claims 4 GiB.
        let mut image = Image::new(b"");
        image.begin(1);
        image.bytes.push(CHUNK);
        image.bytes.extend_from_slice(&u32::MAX.to_le_bytes());
        image.bytes.extend_from_slice(&[0; 100]);
        let scan = scan_bytes(&image.bytes, 1, None);
        assert!(scan.entries.is_empty());
        assert_eq!(scan.max_entry_id, Some(1));

        // Lookalikes with huge lengths after an entry's end.
        let mut image = Image::new(b"");
        image.entry(1, &[b"ok"]);
        image.bytes.push(CHUNK);
        image.bytes.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(scan_bytes(&image.bytes, 1, None).entries.len(), 1);

        // Pseudo-random bytes after a valid header, with the kind bytes
        // made common.
        let mut state = 0x1234_5678_9abc_def0_u64;
        for round in 0..300 {
            let mut bytes = Image::new(b"r").bytes;
            let len = 1 + round * 7;
            for _ in 0..len {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let byte = match state % 5 {
                    0 => NEW_ENTRY,
                    1 => CHUNK,
                    2 => END_OF_ENTRY,
                    3 => 0,
                    _ => (state >> 32) as u8,
                };
                bytes.push(byte);
            }
            let entries = read_back(&bytes, 0);
            let ids: Vec<u64> = entries.iter().map(|e| e.0).collect();
            let mut sorted = ids.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(ids, sorted, "round {round}");
        }
    }

    #[test]
    fn read_at_checks_the_record_and_its_checksum() {
        let mut image = Image::new(b"");
        image.entry(1, &[b"hello"]);
        let chunk_at = 5 + ENTRY_HEADER;
        let open = OpenLegacyFile {
            file: file_with(&image.bytes),
            records_start: 5,
        };
        let position = |offset| LogPosition { file_id: 1, offset };
        assert_eq!(
            read_at(&open, position(chunk_at))
                .unwrap()
                .read_all()
                .unwrap(),
            b"hello"
        );
        for wrong in [0, 4, chunk_at + 1, image.bytes.len() as u64, u64::MAX] {
            let err = read_at(&open, position(wrong)).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{wrong}: {err}");
        }
        let mut bad = image.bytes.clone();
        bad[chunk_at as usize + 6] ^= 1;
        let open = OpenLegacyFile {
            file: file_with(&bad),
            records_start: 5,
        };
        let mut reader = read_at(&open, position(chunk_at)).unwrap();
        let mut data = Vec::new();
        io::Read::read_to_end(&mut reader, &mut data).unwrap();
        assert!(!reader.crc_is_valid().unwrap());
    }
}
