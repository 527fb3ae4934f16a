//! Identifiers that users store: entry ids and chunk positions.

use std::fmt;
use std::io::{self, Read, Write};

/// The id of an entry: unique within a log and increasing in the order
/// entries were begun, across reopens.
///
/// Every id that left a record on disk (a chunk, a commit or a rollback
/// record) is below every id handed out after a reopen; the id of an entry
/// that was begun but wrote nothing before a crash or shutdown may be
/// handed out again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct EntryId(pub u64);

impl fmt::Display for EntryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Where a chunk lives in the log: the segment (named by its first entry id)
/// and the byte offset of the chunk's record in it.
///
/// Positions stay valid until the segment is checkpointed and recycled;
/// after that [`WriteAheadLog::read_at`](crate::WriteAheadLog::read_at)
/// reports `NotFound`, never another chunk's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LogPosition {
    /// The id of the segment file (its first entry id).
    pub file_id: u64,
    /// The offset of the chunk's record inside the segment file.
    pub offset: u64,
}

impl LogPosition {
    /// The length of [`LogPosition::to_bytes`]'s output.
    pub const SERIALIZED_LENGTH: u8 = 16;

    /// The position as 16 bytes: `file_id` then `offset`, little-endian.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut bytes = [0; 16];
        bytes[..8].copy_from_slice(&self.file_id.to_le_bytes());
        bytes[8..].copy_from_slice(&self.offset.to_le_bytes());
        bytes
    }

    /// The inverse of [`LogPosition::to_bytes`].
    #[must_use]
    pub fn from_bytes(bytes: &[u8; 16]) -> Self {
        Self {
            file_id: u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")),
            offset: u64::from_le_bytes(bytes[8..].try_into().expect("8 bytes")),
        }
    }

    /// Writes [`LogPosition::to_bytes`] to `destination`.
    pub fn serialize_to<W: Write>(&self, mut destination: W) -> io::Result<()> {
        destination.write_all(&self.to_bytes())
    }

    /// Reads 16 bytes written by [`LogPosition::serialize_to`].
    pub fn read_from<R: Read>(mut source: R) -> io::Result<Self> {
        let mut bytes = [0; 16];
        source.read_exact(&mut bytes)?;
        Ok(Self::from_bytes(&bytes))
    }

    /// The same as [`LogPosition::read_from`], under the name okaywal 0.3
    /// users know.
    pub fn deserialize_from<R: Read>(source: R) -> io::Result<Self> {
        Self::read_from(source)
    }
}

impl fmt::Display for LogPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.file_id, self.offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_round_trips() {
        let position = LogPosition {
            file_id: 77,
            offset: 1 << 40,
        };
        assert_eq!(LogPosition::from_bytes(&position.to_bytes()), position);
        let mut buffer = Vec::new();
        position.serialize_to(&mut buffer).unwrap();
        assert_eq!(buffer.len(), usize::from(LogPosition::SERIALIZED_LENGTH));
        assert_eq!(LogPosition::read_from(&buffer[..]).unwrap(), position);
        assert!(LogPosition::read_from(&buffer[..15]).is_err());
        assert_eq!(
            LogPosition::deserialize_from(&buffer[..]).unwrap(),
            position
        );
        assert!(LogPosition::deserialize_from(&buffer[..15]).is_err());
    }
}
