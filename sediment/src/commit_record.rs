//! Commit records: what each transaction did, as bytes (see FORMAT.md)
//! and as the public [`CommitRecord`]; the identifiers they use; and how
//! commit log damage is described to callers. No I/O: the files that hold
//! the records are `commit_log`'s.

use std::fmt;
use std::path::PathBuf;

use crate::grain_id::GrainId;

/// The id of a committed transaction: increasing in the order transactions
/// started writing, never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct SequenceId(pub u64);

impl fmt::Display for SequenceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A blob written by a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewGrain {
    /// Where it is stored.
    pub id: GrainId,
    /// Its length in bytes.
    pub length: u32,
    /// The CRC32 stored with it (over sequence, length and data).
    pub crc: u32,
}

/// What one committed transaction did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitRecord {
    /// The transaction's sequence.
    pub sequence: SequenceId,
    /// Blobs it wrote.
    pub new_grains: Vec<NewGrain>,
    /// Grains it archived.
    pub archived: Vec<GrainId>,
    /// Grains its `checkpoint_to` freed.
    pub freed: Vec<GrainId>,
    /// `Some(new value)` if it called `set_embedded_header`.
    pub embedded_header: Option<Option<GrainId>>,
    /// The sequence it checkpointed to, if it called `checkpoint_to`.
    pub checkpointed_to: Option<SequenceId>,
}

/// Commit log bytes that cannot be read back: a frame whose length, CRC,
/// record or sequence is wrong, or a file shorter than the index says.
///
/// A frame's length cannot be trusted once its bytes are damaged, so
/// nothing after the damaged frame in the same file is read: the records of
/// sequences `first..=last` are lost to readers. The next file (named by its
/// first sequence) starts a reliable new run of records, so the records
/// after `last` read as usual (see [`Database::commit_log`]).
///
/// [`Database::commit_log`]: crate::Database::commit_log
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitLogDamage {
    /// The damaged commit log file.
    pub path: PathBuf,
    /// Offset in that file of the first frame that cannot be read.
    pub offset: u64,
    /// The lowest sequence whose record may be lost (the one after the
    /// last record read back from the file, or the file's first sequence).
    pub first: SequenceId,
    /// The highest sequence whose record may be lost (the one before the
    /// next file's first sequence, or the last sequence the index counts
    /// as written to the commit log).
    pub last: SequenceId,
    /// What is wrong with the frame.
    pub what: String,
}

impl fmt::Display for CommitLogDamage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} offset {}: damaged commit record ({}); the records of sequences {} to {} \
             cannot be read",
            self.path.display(),
            self.offset,
            self.what,
            self.first,
            self.last
        )
    }
}

fn put_ids(out: &mut Vec<u8>, ids: &[GrainId]) {
    out.extend_from_slice(&(ids.len() as u32).to_le_bytes());
    for id in ids {
        out.extend_from_slice(&id.to_bytes());
    }
}

/// A cursor that never reads out of bounds.
struct Cursor<'a> {
    bytes: &'a [u8],
}

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        if self.bytes.len() < n {
            return Err(format!("record ends {} bytes early", n - self.bytes.len()));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    fn grain(&mut self) -> Result<GrainId, String> {
        GrainId::from_u64(self.u64()?).map_err(|e| e.to_string())
    }

    /// Reads a count of items of `item_size` bytes, refusing counts the
    /// remaining bytes cannot hold (so garbage never allocates much).
    fn count(&mut self, item_size: usize) -> Result<usize, String> {
        let count = self.u32()? as usize;
        if count.saturating_mul(item_size) > self.bytes.len() {
            return Err(format!("count {count} exceeds the record"));
        }
        Ok(count)
    }

    fn ids(&mut self) -> Result<Vec<GrainId>, String> {
        let count = self.count(8)?;
        (0..count).map(|_| self.grain()).collect()
    }
}

impl CommitRecord {
    /// An empty record for `sequence`.
    #[must_use]
    pub fn new(sequence: SequenceId) -> Self {
        Self {
            sequence,
            new_grains: Vec::new(),
            archived: Vec::new(),
            freed: Vec::new(),
            embedded_header: None,
            checkpointed_to: None,
        }
    }

    /// Appends the record's encoding (see FORMAT.md) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.sequence.0.to_le_bytes());
        let mut flags = 0_u8;
        if self.embedded_header.is_some() {
            flags |= 1;
        }
        if self.checkpointed_to.is_some() {
            flags |= 2;
        }
        out.push(flags);
        if let Some(header) = self.embedded_header {
            out.extend_from_slice(&header.map_or(u64::MAX, GrainId::as_u64).to_le_bytes());
        }
        if let Some(to) = self.checkpointed_to {
            out.extend_from_slice(&to.0.to_le_bytes());
        }
        out.extend_from_slice(&(self.new_grains.len() as u32).to_le_bytes());
        for grain in &self.new_grains {
            out.extend_from_slice(&grain.id.to_bytes());
            out.extend_from_slice(&grain.length.to_le_bytes());
            out.extend_from_slice(&grain.crc.to_le_bytes());
        }
        put_ids(out, &self.archived);
        put_ids(out, &self.freed);
    }

    /// Decodes a record produced by [`CommitRecord::encode`].
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let mut cursor = Cursor { bytes };
        let sequence = SequenceId(cursor.u64()?);
        let flags = cursor.u8()?;
        if flags & !3 != 0 {
            return Err(format!("unknown flags {flags:#x}"));
        }
        let embedded_header = if flags & 1 == 1 {
            match cursor.u64()? {
                u64::MAX => Some(None),
                raw => Some(Some(GrainId::from_u64(raw).map_err(|e| e.to_string())?)),
            }
        } else {
            None
        };
        let checkpointed_to = if flags & 2 == 2 {
            Some(SequenceId(cursor.u64()?))
        } else {
            None
        };
        let count = cursor.count(16)?;
        let mut new_grains = Vec::with_capacity(count);
        for _ in 0..count {
            new_grains.push(NewGrain {
                id: cursor.grain()?,
                length: cursor.u32()?,
                crc: cursor.u32()?,
            });
        }
        let archived = cursor.ids()?;
        let freed = cursor.ids()?;
        if !cursor.bytes.is_empty() {
            return Err(format!(
                "{} unexpected bytes after the record",
                cursor.bytes.len()
            ));
        }
        Ok(Self {
            sequence,
            new_grains,
            archived,
            freed,
            embedded_header,
            checkpointed_to,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CommitRecord {
        CommitRecord {
            sequence: SequenceId(42),
            new_grains: vec![NewGrain {
                id: GrainId::new(1, 0, 5, 3).unwrap(),
                length: 40,
                crc: 7,
            }],
            archived: vec![GrainId::new(2, 1, 0, 1).unwrap()],
            freed: vec![GrainId::new(0, 0, 0, 2).unwrap()],
            embedded_header: Some(None),
            checkpointed_to: Some(SequenceId(40)),
        }
    }

    #[test]
    fn records_round_trip() {
        let record = sample();
        let mut bytes = Vec::new();
        record.encode(&mut bytes);
        assert_eq!(CommitRecord::decode(&bytes).unwrap(), record);
        let empty = CommitRecord::new(SequenceId(1));
        bytes.clear();
        empty.encode(&mut bytes);
        assert_eq!(CommitRecord::decode(&bytes).unwrap(), empty);
    }

    #[test]
    fn damaged_records_are_errors_not_panics() {
        let mut bytes = Vec::new();
        sample().encode(&mut bytes);
        for cut in 0..bytes.len() {
            assert!(CommitRecord::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut huge_count = bytes.clone();
        huge_count[9 + 8 + 8..9 + 8 + 8 + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(CommitRecord::decode(&huge_count).is_err());
        for at in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0xFF;
            let _ = CommitRecord::decode(&damaged);
        }
    }
}
