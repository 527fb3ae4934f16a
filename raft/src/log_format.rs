//! Bytes ↔ structs for the Raft log store: WAL chunks, archive records and
//! the metadata file, plain or sealed (see [`crate::encryption`]). No I/O
//! policy here.

use std::io;

use okaywal::encryption::{Cipher, OpenError, Seal, SEAL_BYTES};
use openraft::CommittedLeaderId;
use serde::{Deserialize, Serialize};

use crate::encryption::{key_check_header, verify_key_check_header};
use crate::types::{LogId, Vote};
use crate::validate;

const ENTRY: u8 = 1;
const VOTE: u8 = 2;
const COMMITTED: u8 = 3;
const TRUNCATE: u8 = 4;
const PURGE: u8 = 5;
const CHECKPOINTED: u8 = 6;

/// Size of the fixed part of an entry chunk: kind, index, term, node.
pub const ENTRY_HEADER: usize = 1 + 8 + 8 + 8;

/// One chunk of a WAL entry written by the log store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WalRecord {
    /// A Raft entry; `payload` is the bincode-encoded [`crate::types::Entry`].
    Entry {
        /// The entry's log id.
        log_id: LogId,
        /// The encoded entry.
        payload: Vec<u8>,
    },
    /// The vote was saved.
    Vote(Vote),
    /// The committed log id was saved.
    Committed(Option<LogId>),
    /// Entries from `since` on were dropped.
    Truncate {
        /// The first dropped index.
        since: u64,
    },
    /// Entries up to and including this log id were purged.
    Purge(LogId),
    /// The metadata file was written covering every WAL entry up to this
    /// id (sealed logs only): metadata older than this is refused.
    Checkpointed(u64),
}

fn log_id_parts(log_id: &LogId) -> [u64; 3] {
    [
        log_id.index,
        log_id.leader_id.term,
        log_id.leader_id.node_id,
    ]
}

fn log_id_from(index: u64, term: u64, node: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, node), index)
}

fn u64_at(bytes: &[u8], at: usize) -> Result<u64, String> {
    bytes
        .get(at..at + 8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .ok_or_else(|| format!("record ends at {} before a field at {at}", bytes.len()))
}

/// Writes the header of an entry chunk; the encoded entry follows it.
pub fn encode_entry_header(out: &mut Vec<u8>, log_id: &LogId) {
    out.push(ENTRY);
    for part in log_id_parts(log_id) {
        out.extend_from_slice(&part.to_le_bytes());
    }
}

impl WalRecord {
    /// Encodes the record as one WAL chunk.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            WalRecord::Entry { log_id, payload } => {
                encode_entry_header(&mut out, log_id);
                out.extend_from_slice(payload);
            }
            WalRecord::Vote(vote) => {
                out.push(VOTE);
                out.extend(bincode::serialize(vote).expect("a vote serializes"));
            }
            WalRecord::Committed(committed) => {
                out.push(COMMITTED);
                out.extend(bincode::serialize(committed).expect("a log id serializes"));
            }
            WalRecord::Truncate { since } => {
                out.push(TRUNCATE);
                out.extend_from_slice(&since.to_le_bytes());
            }
            WalRecord::Purge(log_id) => {
                out.push(PURGE);
                for part in log_id_parts(log_id) {
                    out.extend_from_slice(&part.to_le_bytes());
                }
            }
            WalRecord::Checkpointed(through) => {
                out.push(CHECKPOINTED);
                out.extend_from_slice(&through.to_le_bytes());
            }
        }
        out
    }

    /// Checks the terms and indexes the record holds against
    /// [`validate::MAX_TERM`] and [`validate::MAX_LOG_INDEX`].
    pub fn check_bounds(&self) -> Result<(), String> {
        match self {
            WalRecord::Entry { log_id, .. } => validate::check_log_id(log_id, "a log entry"),
            WalRecord::Vote(vote) => validate::check_vote(vote, "the saved vote"),
            WalRecord::Committed(committed) => {
                validate::check_opt_log_id(committed.as_ref(), "the saved committed log id")
            }
            WalRecord::Truncate { since } => {
                if *since > validate::MAX_LOG_INDEX {
                    Err(format!("a truncation at index {since}"))
                } else {
                    Ok(())
                }
            }
            WalRecord::Purge(log_id) => validate::check_log_id(log_id, "a purge"),
            WalRecord::Checkpointed(_) => Ok(()),
        }
    }

    /// Decodes a chunk written by [`WalRecord::encode`].
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let (&kind, rest) = bytes.split_first().ok_or("empty log record")?;
        match kind {
            ENTRY => {
                let log_id = log_id_from(u64_at(rest, 0)?, u64_at(rest, 8)?, u64_at(rest, 16)?);
                Ok(WalRecord::Entry {
                    log_id,
                    payload: rest[24..].to_vec(),
                })
            }
            VOTE => validate::decode_all(rest)
                .map(WalRecord::Vote)
                .map_err(|e| format!("bad vote record: {e}")),
            COMMITTED => validate::decode_all(rest)
                .map(WalRecord::Committed)
                .map_err(|e| format!("bad committed record: {e}")),
            TRUNCATE => Ok(WalRecord::Truncate {
                since: u64_at(rest, 0)?,
            }),
            PURGE => Ok(WalRecord::Purge(log_id_from(
                u64_at(rest, 0)?,
                u64_at(rest, 8)?,
                u64_at(rest, 16)?,
            ))),
            CHECKPOINTED => Ok(WalRecord::Checkpointed(u64_at(rest, 0)?)),
            other => Err(format!("unknown log record kind {other}")),
        }
    }
}

/// Size of an archive record's header: length, CRC, index, term, node.
pub const ARCHIVE_HEADER: usize = 4 + 4 + 8 + 8 + 8;

/// The header of one entry in an archive file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchiveHeader {
    /// Length of the encoded entry that follows.
    pub len: u32,
    /// CRC32 of the encoded entry.
    pub crc: u32,
    /// The entry's log id.
    pub log_id: LogId,
}

impl ArchiveHeader {
    /// The header of `payload` stored as `log_id`.
    #[must_use]
    pub fn for_payload(log_id: LogId, payload: &[u8]) -> Self {
        Self {
            len: payload.len() as u32,
            crc: crc32fast::hash(payload),
            log_id,
        }
    }

    /// Encodes the header.
    #[must_use]
    pub fn encode(&self) -> [u8; ARCHIVE_HEADER] {
        let mut out = [0_u8; ARCHIVE_HEADER];
        out[0..4].copy_from_slice(&self.len.to_le_bytes());
        out[4..8].copy_from_slice(&self.crc.to_le_bytes());
        for (i, part) in log_id_parts(&self.log_id).into_iter().enumerate() {
            out[8 + i * 8..16 + i * 8].copy_from_slice(&part.to_le_bytes());
        }
        out
    }

    /// Decodes a header; a length of zero marks the unwritten end.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        if bytes.len() < ARCHIVE_HEADER {
            return Err(format!("archive header of {} bytes", bytes.len()));
        }
        let len = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes"));
        let crc = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
        let log_id = log_id_from(u64_at(bytes, 8)?, u64_at(bytes, 16)?, u64_at(bytes, 24)?);
        Ok(Self { len, crc, log_id })
    }
}

/// Which entries of one archive file are part of the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchiveRange {
    /// The file's number (the last WAL entry id of the checkpoint that
    /// wrote it).
    pub file: u64,
    /// The first index of the file that is in the log.
    pub first: u64,
    /// The last index of the file that is in the log.
    pub last: u64,
}

/// The durable state of the log store outside the WAL, rewritten (to a
/// temporary file, synced, renamed) at every WAL checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogMeta {
    /// The last saved vote.
    pub vote: Option<Vote>,
    /// The last saved committed log id.
    pub committed: Option<LogId>,
    /// The last purged log id.
    pub purged: Option<LogId>,
    /// Every WAL entry up to this id is reflected here; recovery skips them.
    pub checkpointed_through: u64,
    /// The archive files and the ranges of them in the log.
    pub archives: Vec<ArchiveRange>,
}

const META_MAGIC: &[u8; 8] = b"SRLOGMT1";
/// The magic of a sealed metadata file.
pub const SEALED_META_MAGIC: &[u8; 8] = b"SRLOGME1";
/// What a sealed metadata file's key check is bound to.
const META_KEY_CONTEXT: &[u8] = b"sediment-raft log meta";
/// What a sealed metadata file's body is bound to (with its header).
const META_BODY_CONTEXT: &[u8] = b"sediment-raft log meta body";
/// Bytes before a sealed metadata file's body seal: magic, key check,
/// CRC32, body length.
const SEALED_META_PREFIX: usize = 8 + SEAL_BYTES + 4 + 4;

/// Which form a metadata file's first bytes say it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaForm {
    /// `SRLOGMT1`: plain.
    Plain,
    /// `SRLOGME1`: sealed.
    Sealed,
    /// Neither.
    Unknown,
}

impl MetaForm {
    /// The form of the metadata file `bytes`.
    #[must_use]
    pub fn of(bytes: &[u8]) -> Self {
        match bytes.get(..8) {
            Some(magic) if magic == META_MAGIC => Self::Plain,
            Some(magic) if magic == SEALED_META_MAGIC => Self::Sealed,
            _ => Self::Unknown,
        }
    }
}

fn damaged(detail: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, detail.into())
}

impl LogMeta {
    /// Encodes with a magic, length and CRC.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let body = bincode::serialize(self).expect("metadata serializes");
        let mut out = Vec::with_capacity(body.len() + 16);
        out.extend_from_slice(META_MAGIC);
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Decodes bytes written by [`LogMeta::encode`].
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        if bytes.len() < 16 || &bytes[..8] != META_MAGIC {
            return Err("not a log metadata file".into());
        }
        let len = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes"));
        let body = bytes
            .get(16..16 + len)
            .ok_or_else(|| format!("metadata of {len} bytes is cut short"))?;
        if crc32fast::hash(body) != crc {
            return Err("metadata checksum mismatch".into());
        }
        let meta: Self = validate::decode_all(body).map_err(|e| format!("bad metadata: {e}"))?;
        meta.check()?;
        Ok(meta)
    }

    fn check(&self) -> Result<(), String> {
        validate::check_opt_log_id(self.committed.as_ref(), "the committed log id")?;
        validate::check_opt_log_id(self.purged.as_ref(), "the purged log id")?;
        if let Some(vote) = &self.vote {
            validate::check_vote(vote, "the saved vote")?;
        }
        Ok(())
    }

    /// Encodes sealed with `cipher`: magic `SRLOGME1`, a key check, a
    /// CRC32 of both, the body's length, the body's seal and the sealed
    /// body (see `FORMAT.md`).
    ///
    /// # Errors
    ///
    /// The key provider's.
    pub fn seal(&self, cipher: &Cipher) -> io::Result<Vec<u8>> {
        let mut body = bincode::serialize(self).expect("metadata serializes");
        let mut out = key_check_header(cipher, SEALED_META_MAGIC, META_KEY_CONTEXT)?;
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        let associated = [META_BODY_CONTEXT, &out[..]].concat();
        let seal = cipher.seal(&associated, &mut body)?;
        out.extend_from_slice(&seal.to_bytes());
        out.extend_from_slice(&body);
        Ok(out)
    }

    /// Decodes bytes written by [`LogMeta::seal`]; `what` names the file
    /// in errors.
    ///
    /// # Errors
    ///
    /// `InvalidData` for damage; a `KeyError` (kind `PermissionDenied`)
    /// for a wrong or missing key.
    pub fn open_sealed(bytes: &[u8], cipher: &Cipher, what: &str) -> io::Result<Self> {
        if MetaForm::of(bytes) != MetaForm::Sealed || bytes.len() < SEALED_META_PREFIX + SEAL_BYTES
        {
            return Err(damaged("not a sealed log metadata file"));
        }
        verify_key_check_header(cipher, bytes, META_KEY_CONTEXT, what)?;
        let prefix = &bytes[..SEALED_META_PREFIX];
        let len = u32::from_le_bytes(
            bytes[SEALED_META_PREFIX - 4..SEALED_META_PREFIX]
                .try_into()
                .expect("4 bytes"),
        ) as usize;
        let seal: &[u8; SEAL_BYTES] = bytes[SEALED_META_PREFIX..SEALED_META_PREFIX + SEAL_BYTES]
            .try_into()
            .expect("a seal");
        let body_at = SEALED_META_PREFIX + SEAL_BYTES;
        if bytes.len() != body_at + len {
            return Err(damaged(format!(
                "a metadata body of {len} bytes in a file of {}",
                bytes.len()
            )));
        }
        let mut body = bytes[body_at..].to_vec();
        let associated = [META_BODY_CONTEXT, prefix].concat();
        open_or_damaged(
            cipher,
            &Seal::from_bytes(seal),
            &associated,
            &mut body,
            what,
        )?;
        let meta: Self =
            validate::decode_all(&body).map_err(|e| damaged(format!("bad metadata: {e}")))?;
        meta.check().map_err(damaged)?;
        Ok(meta)
    }
}

/// Opens `buffer` in place: `InvalidData` if it does not authenticate, a
/// `KeyError` naming `what` for a missing key.
pub(crate) fn open_or_damaged(
    cipher: &Cipher,
    seal: &Seal,
    associated: &[u8],
    buffer: &mut [u8],
    what: &str,
) -> io::Result<()> {
    match cipher.open(seal, associated, buffer) {
        Ok(()) => Ok(()),
        Err(OpenError::Key(error)) => Err(error.into_io(what)),
        Err(OpenError::Damaged) => Err(damaged(OpenError::Damaged.to_string())),
        Err(OpenError::Provider(error)) => Err(error),
    }
}

/// The magic of a sealed archive file.
pub const SEALED_ARCHIVE_MAGIC: &[u8; 8] = b"SRARCHX1";
/// Bytes of a sealed archive file's header: magic, key check, CRC32.
pub const SEALED_ARCHIVE_HEADER: usize = 8 + SEAL_BYTES + 4;
/// Bytes of a sealed archive record before its sealed payload: length,
/// index, term, node, seal.
pub const SEALED_RECORD_HEADER: usize = 4 + 8 + 8 + 8 + SEAL_BYTES;
/// What a sealed archive file's key check is bound to.
const ARCHIVE_KEY_CONTEXT: &[u8] = b"sediment-raft archive";
/// What a sealed archive record is bound to (with its place).
const ARCHIVE_RECORD_CONTEXT: &[u8] = b"sediment-raft archive record";

/// A new sealed archive file's header, with a key check of `cipher`'s
/// current key.
///
/// # Errors
///
/// The key provider's.
pub fn sealed_archive_header(cipher: &Cipher) -> io::Result<Vec<u8>> {
    key_check_header(cipher, SEALED_ARCHIVE_MAGIC, ARCHIVE_KEY_CONTEXT)
}

/// Whether `header` starts with a sealed archive's magic.
#[must_use]
pub fn is_sealed_archive_header(header: &[u8]) -> bool {
    header.get(..8) == Some(&SEALED_ARCHIVE_MAGIC[..])
}

/// Checks a sealed archive file's header (its first
/// [`SEALED_ARCHIVE_HEADER`] bytes) and key check.
///
/// # Errors
///
/// `InvalidData` for damage (or a file that is not a sealed archive), a
/// `KeyError` for a wrong or missing key.
pub fn verify_sealed_archive_header(cipher: &Cipher, header: &[u8], what: &str) -> io::Result<()> {
    if !is_sealed_archive_header(header) {
        return Err(damaged("not a sealed archive file"));
    }
    verify_key_check_header(cipher, header, ARCHIVE_KEY_CONTEXT, what)
}

fn archive_record_context(file: u64, header: &[u8], offset: u64, prefix: &[u8]) -> Vec<u8> {
    let mut associated = Vec::with_capacity(ARCHIVE_RECORD_CONTEXT.len() + 16 + header.len() + 28);
    associated.extend_from_slice(ARCHIVE_RECORD_CONTEXT);
    associated.extend_from_slice(&file.to_le_bytes());
    associated.extend_from_slice(header);
    associated.extend_from_slice(&offset.to_le_bytes());
    associated.extend_from_slice(prefix);
    associated
}

fn sealed_record_prefix(len: u32, log_id: &LogId) -> [u8; 28] {
    let mut prefix = [0_u8; 28];
    prefix[..4].copy_from_slice(&len.to_le_bytes());
    for (i, part) in log_id_parts(log_id).into_iter().enumerate() {
        prefix[4 + i * 8..12 + i * 8].copy_from_slice(&part.to_le_bytes());
    }
    prefix
}

/// Appends to `out` (a sealed archive file's bytes from its start) the
/// record of `payload` stored as `log_id`, sealed and bound to archive
/// `file`, its `header` and the record's offset.
///
/// # Errors
///
/// The key provider's.
pub fn seal_archive_record(
    cipher: &Cipher,
    file: u64,
    header: &[u8],
    log_id: &LogId,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> io::Result<()> {
    let offset = out.len() as u64;
    let prefix = sealed_record_prefix(payload.len() as u32, log_id);
    let mut sealed = payload.to_vec();
    let seal = cipher.seal(
        &archive_record_context(file, header, offset, &prefix),
        &mut sealed,
    )?;
    out.extend_from_slice(&prefix);
    out.extend_from_slice(&seal.to_bytes());
    out.extend_from_slice(&sealed);
    Ok(())
}

/// The length and log id in a sealed record's header (at least
/// [`SEALED_RECORD_HEADER`] bytes). They are authenticated only when the
/// record is opened.
pub fn sealed_record_header(bytes: &[u8]) -> Result<(u32, LogId), String> {
    if bytes.len() < SEALED_RECORD_HEADER {
        return Err(format!("archive record header of {} bytes", bytes.len()));
    }
    let len = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes"));
    let log_id = log_id_from(u64_at(bytes, 4)?, u64_at(bytes, 12)?, u64_at(bytes, 20)?);
    Ok((len, log_id))
}

/// Opens the sealed record `record` (its header and payload, read from
/// `offset` of archive `file` whose header is `header`), expected to hold
/// `log_id`, and returns the payload.
///
/// # Errors
///
/// `InvalidData` if the record is not the one sealed there for `log_id`;
/// a `KeyError` naming `what` for a missing key.
pub fn open_archive_record(
    cipher: &Cipher,
    file: u64,
    header: &[u8],
    offset: u64,
    log_id: &LogId,
    mut record: Vec<u8>,
    what: &str,
) -> io::Result<Vec<u8>> {
    let len = record
        .len()
        .checked_sub(SEALED_RECORD_HEADER)
        .ok_or_else(|| damaged("archive record cut short"))?;
    let prefix = sealed_record_prefix(len as u32, log_id);
    let seal: [u8; SEAL_BYTES] = record[28..SEALED_RECORD_HEADER].try_into().expect("a seal");
    let associated = archive_record_context(file, header, offset, &prefix);
    let mut payload = record.split_off(SEALED_RECORD_HEADER);
    open_or_damaged(
        cipher,
        &Seal::from_bytes(&seal),
        &associated,
        &mut payload,
        what,
    )?;
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_id(term: u64, node: u64, index: u64) -> LogId {
        log_id_from(index, term, node)
    }

    #[test]
    fn wal_records_round_trip() {
        let records = [
            WalRecord::Entry {
                log_id: log_id(3, 2, 17),
                payload: b"entry".to_vec(),
            },
            WalRecord::Vote(Vote::new_committed(4, 1)),
            WalRecord::Committed(Some(log_id(1, 1, 9))),
            WalRecord::Committed(None),
            WalRecord::Truncate { since: 12 },
            WalRecord::Purge(log_id(2, 3, 40)),
            WalRecord::Checkpointed(77),
        ];
        for record in records {
            assert_eq!(WalRecord::decode(&record.encode()).unwrap(), record);
        }
    }

    #[test]
    fn short_or_unknown_wal_records_are_errors() {
        assert!(WalRecord::decode(&[]).is_err());
        assert!(WalRecord::decode(&[9, 0, 0]).is_err());
        assert!(WalRecord::decode(&[ENTRY, 1, 2, 3]).is_err());
        assert!(WalRecord::decode(&[TRUNCATE, 1]).is_err());
    }

    #[test]
    fn archive_header_round_trips() {
        let header = ArchiveHeader::for_payload(log_id(7, 1, 99), b"payload");
        assert_eq!(ArchiveHeader::decode(&header.encode()).unwrap(), header);
        assert!(ArchiveHeader::decode(&[0; 10]).is_err());
    }

    #[test]
    fn meta_round_trips_and_detects_damage() {
        let meta = LogMeta {
            vote: Some(Vote::new(3, 2)),
            committed: Some(log_id(3, 2, 10)),
            purged: Some(log_id(1, 1, 4)),
            checkpointed_through: 55,
            archives: vec![ArchiveRange {
                file: 55,
                first: 5,
                last: 10,
            }],
        };
        let mut bytes = meta.encode();
        assert_eq!(LogMeta::decode(&bytes).unwrap(), meta);
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        assert!(LogMeta::decode(&bytes).is_err());
        assert!(LogMeta::decode(&bytes[..bytes.len() - 3]).is_err());
        assert!(LogMeta::decode(b"nonsense").is_err());
    }
}
