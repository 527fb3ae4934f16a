//! Bytes ↔ structs for the Raft log store: WAL chunks, archive records and
//! the metadata file. No I/O policy here.

use openraft::CommittedLeaderId;
use serde::{Deserialize, Serialize};

use crate::types::{LogId, Vote};
use crate::validate;

const ENTRY: u8 = 1;
const VOTE: u8 = 2;
const COMMITTED: u8 = 3;
const TRUNCATE: u8 = 4;
const PURGE: u8 = 5;

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
        validate::check_opt_log_id(meta.committed.as_ref(), "the committed log id")?;
        validate::check_opt_log_id(meta.purged.as_ref(), "the purged log id")?;
        if let Some(vote) = &meta.vote {
            validate::check_vote(vote, "the saved vote")?;
        }
        Ok(meta)
    }
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
