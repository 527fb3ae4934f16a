//! The WAL entry of one sediment transaction, as bytes (see FORMAT.md):
//! one chunk per blob that travels through the WAL and a final chunk with
//! the transaction's commit record (`[2][record]`). A blob's chunk is
//! `[1][grain id: u64][data]` in a plain store; an encrypted store writes
//! `[3][number: u32][image]` with `write_presealed_chunk` (the image is
//! sealed already, so the log stores it as it is), where `number` is the
//! blob's place in the commit record's new grains. Encoding and decoding
//! only: replay, the WAL checkpoint, reads of blobs still in the WAL and
//! `verify` all read entries through this module.

use std::io::{self, Read};

use okaywal::{Entry, EntryChunk, LogPosition, ReadChunkResult};

use crate::commit_record::CommitRecord;
use crate::grain_id::GrainId;

/// Tag of a chunk carrying a blob's bytes, named by its grain id.
pub(crate) const DATA_CHUNK: u8 = 1;
/// Tag of the chunk carrying the commit record.
pub(crate) const RECORD_CHUNK: u8 = 2;
/// Tag of a pre-sealed chunk carrying a blob's sealed image, named by its
/// place in the commit record's new grains (encrypted stores).
pub(crate) const IMAGE_CHUNK: u8 = 3;
/// Bytes before a blob's data in a data chunk.
pub(crate) const DATA_PREFIX: usize = 9;
/// Bytes before a blob's image in an image chunk.
pub(crate) const IMAGE_PREFIX: usize = 5;

/// Replaces `out` with the data chunk of blob `id` holding `data`.
pub(crate) fn encode_data_chunk(out: &mut Vec<u8>, id: GrainId, data: &[u8]) {
    out.clear();
    out.push(DATA_CHUNK);
    out.extend_from_slice(&id.to_bytes());
    out.extend_from_slice(data);
}

/// Replaces `out` with the image chunk of the `number`th new grain of the
/// transaction, holding its sealed `image`.
#[cfg(test)]
pub(crate) fn encode_image_chunk(out: &mut Vec<u8>, number: u32, image: &[u8]) {
    begin_image_chunk(out, number);
    out.extend_from_slice(image);
}

/// Replaces `out` with the start of the image chunk of the `number`th
/// new grain of the transaction: its image is appended next.
pub(crate) fn begin_image_chunk(out: &mut Vec<u8>, number: u32) {
    out.clear();
    out.push(IMAGE_CHUNK);
    out.extend_from_slice(&number.to_le_bytes());
}

/// Replaces `out` with the chunk holding `record`.
pub(crate) fn encode_record_chunk(out: &mut Vec<u8>, record: &CommitRecord) {
    out.clear();
    out.push(RECORD_CHUNK);
    record.encode(out);
}

/// Reads past a data or image chunk's prefix, leaving `chunk` at the
/// blob's first byte (or its image's).
pub(crate) fn skip_data_prefix(chunk: &mut impl Read) -> io::Result<()> {
    let mut tag = [0_u8; 1];
    chunk.read_exact(&mut tag)?;
    let mut rest = [0_u8; DATA_PREFIX - 1];
    let rest = match tag[0] {
        DATA_CHUNK => &mut rest[..],
        IMAGE_CHUNK => &mut rest[..IMAGE_PREFIX - 1],
        other => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a blob's WAL chunk has the unknown tag {other}"),
            ))
        }
    };
    chunk.read_exact(rest)
}

/// The blob (or image) in a whole data or image chunk's bytes; `None` if
/// they are too short to be one.
pub(crate) fn data_of_chunk(bytes: &[u8]) -> Option<&[u8]> {
    match *bytes.first()? {
        DATA_CHUNK => bytes.get(DATA_PREFIX..),
        IMAGE_CHUNK => bytes.get(IMAGE_PREFIX..),
        _ => None,
    }
}

/// The grain a whole or partial chunk names, if it is a data chunk (an
/// image chunk names its grain only through the commit record).
pub(crate) fn grain_of_data_chunk(bytes: &[u8]) -> Option<GrainId> {
    match bytes.get(..DATA_PREFIX)? {
        [DATA_CHUNK, id @ ..] => GrainId::from_bytes(id.try_into().ok()?).ok(),
        _ => None,
    }
}

/// The commit record a whole chunk holds, if it is a record chunk that
/// decodes.
pub(crate) fn record_of_chunk(bytes: &[u8]) -> Option<CommitRecord> {
    match bytes.split_first() {
        Some((&RECORD_CHUNK, record)) => CommitRecord::decode(record).ok(),
        _ => None,
    }
}

/// A data chunk: its grain and where it is in the WAL.
pub(crate) struct DataChunk {
    /// The blob's grain.
    pub id: GrainId,
    /// Where the chunk is in the WAL.
    pub position: LogPosition,
    /// The blob's bytes, if they were asked for.
    pub data: Option<Vec<u8>>,
}

/// The rest of `chunk`, its CRC checked; a mismatch is reported as
/// `mismatch()` says. (`read_all`, unlike `read_to_end`, does not zero-fill
/// a buffer first.)
fn read_verified(
    mut chunk: EntryChunk<'_>,
    mismatch: impl FnOnce() -> String,
) -> io::Result<Vec<u8>> {
    chunk.read_all().map_err(|e| {
        if e.kind() == io::ErrorKind::InvalidData {
            io::Error::new(io::ErrorKind::InvalidData, mismatch())
        } else {
            e
        }
    })
}

/// Reads an entry's chunks; with `with_data`, also the blobs' bytes (an
/// encrypted store's: their images). `sealed` says the store is
/// encrypted: its blobs come in image chunks (or, written before those
/// existed, in data chunks the log sealed), and a chunk the log did not
/// authenticate (a pre-sealed one) may only be an image chunk, whose
/// image is bound to its grain by its own seal.
pub(crate) fn parse_entry(
    entry: &mut Entry<'_>,
    with_data: bool,
    sealed: bool,
) -> io::Result<(Vec<DataChunk>, CommitRecord)> {
    let invalid = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    let id = entry.id();
    let mut data = Vec::new();
    // Image chunks: (number in the record's new grains, position, bytes).
    let mut images: Vec<(u32, LogPosition, Option<Vec<u8>>)> = Vec::new();
    let mut record = None;
    // Where the rest of a blob's chunk is, and (`with_data`) its bytes.
    let blob_of = |chunk: EntryChunk<'_>| -> io::Result<(LogPosition, Option<Vec<u8>>)> {
        let position = chunk.position();
        let bytes = match with_data {
            true => Some(read_verified(chunk, || {
                format!("WAL entry {id}: chunk at {position} failed its CRC")
            })?),
            false => None,
        };
        Ok((position, bytes))
    };
    loop {
        let mut chunk = match entry.read_chunk()? {
            ReadChunkResult::Chunk(chunk) => chunk,
            ReadChunkResult::EndOfEntry => break,
            ReadChunkResult::AbortedEntry => {
                return Err(invalid(format!("WAL entry {id} changed while being read")))
            }
        };
        let presealed = chunk.is_presealed();
        let mut tag = [0_u8; 1];
        chunk.read_exact(&mut tag)?;
        if presealed && tag[0] != IMAGE_CHUNK {
            return Err(invalid(format!(
                "WAL entry {id}: a chunk the log did not seal has tag {}",
                tag[0]
            )));
        }
        match tag[0] {
            DATA_CHUNK => {
                let mut raw = [0_u8; 8];
                chunk.read_exact(&mut raw)?;
                let grain = GrainId::from_bytes(raw)
                    .map_err(|e| invalid(format!("WAL entry {id}: {e}")))?;
                let (position, bytes) = blob_of(chunk)?;
                data.push(DataChunk {
                    id: grain,
                    position,
                    data: bytes,
                });
            }
            IMAGE_CHUNK if sealed => {
                let mut raw = [0_u8; 4];
                chunk.read_exact(&mut raw)?;
                let number = u32::from_le_bytes(raw);
                let (position, bytes) = blob_of(chunk)?;
                images.push((number, position, bytes));
            }
            RECORD_CHUNK => {
                let position = chunk.position();
                let bytes = read_verified(chunk, || {
                    format!("WAL entry {id}: commit record at {position} failed its CRC")
                })?;
                let decoded = CommitRecord::decode(&bytes)
                    .map_err(|e| invalid(format!("WAL entry {id}: commit record: {e}")))?;
                if decoded.sequence.0 != id.0 {
                    return Err(invalid(format!(
                        "WAL entry {id} holds the record of sequence {}",
                        decoded.sequence
                    )));
                }
                record = Some(decoded);
            }
            other => {
                return Err(invalid(format!(
                    "WAL entry {id}: unknown chunk tag {other}"
                )))
            }
        }
    }
    let record = record.ok_or_else(|| invalid(format!("WAL entry {id} has no commit record")))?;
    // Each image chunk names a distinct new grain of the record.
    let mut named = vec![false; record.new_grains.len()];
    for (number, position, bytes) in images {
        let grain = record
            .new_grains
            .get(number as usize)
            .filter(|_| !std::mem::replace(&mut named[number as usize], true))
            .ok_or_else(|| {
                invalid(format!(
                    "WAL entry {id}: the image chunk at {position} names new grain {number} of \
                     {}, or one named before",
                    record.new_grains.len()
                ))
            })?;
        data.push(DataChunk {
            id: grain.id,
            position,
            data: bytes,
        });
    }
    Ok((data, record))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commit_record::{NewGrain, SequenceId};

    #[test]
    fn chunks_round_trip() {
        let id = GrainId::new(1, 0, 5, 1).unwrap();
        let mut bytes = Vec::new();
        encode_data_chunk(&mut bytes, id, b"blob");
        assert_eq!(grain_of_data_chunk(&bytes), Some(id));
        assert_eq!(data_of_chunk(&bytes), Some(&b"blob"[..]));
        assert_eq!(record_of_chunk(&bytes), None);
        let mut reader = &bytes[..];
        skip_data_prefix(&mut reader).unwrap();
        assert_eq!(reader, b"blob");

        let mut record = CommitRecord::new(SequenceId(7));
        record.new_grains.push(NewGrain {
            id,
            length: 4,
            crc: 9,
        });
        encode_record_chunk(&mut bytes, &record);
        assert_eq!(record_of_chunk(&bytes), Some(record));
        assert_eq!(grain_of_data_chunk(&bytes), None);
    }

    #[test]
    fn image_chunks_round_trip_and_name_no_grain() {
        let mut bytes = Vec::new();
        encode_image_chunk(&mut bytes, 7, b"sealed image");
        assert_eq!(&bytes[..IMAGE_PREFIX], &[IMAGE_CHUNK, 7, 0, 0, 0]);
        assert_eq!(data_of_chunk(&bytes), Some(&b"sealed image"[..]));
        assert_eq!(grain_of_data_chunk(&bytes), None);
        assert_eq!(record_of_chunk(&bytes), None);
        let mut reader = &bytes[..];
        skip_data_prefix(&mut reader).unwrap();
        assert_eq!(reader, b"sealed image");
        for cut in 0..IMAGE_PREFIX {
            assert_eq!(data_of_chunk(&bytes[..cut]), None, "cut at {cut}");
            assert!(
                skip_data_prefix(&mut &bytes[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        let error = skip_data_prefix(&mut &[9_u8, 0, 0, 0, 0][..]).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn damaged_chunks_are_refused_without_panics() {
        let id = GrainId::new(1, 0, 5, 1).unwrap();
        let mut bytes = Vec::new();
        encode_data_chunk(&mut bytes, id, b"");
        for cut in 0..DATA_PREFIX {
            assert_eq!(grain_of_data_chunk(&bytes[..cut]), None, "cut at {cut}");
            assert_eq!(data_of_chunk(&bytes[..cut]), None, "cut at {cut}");
        }
        let mut record = Vec::new();
        encode_record_chunk(&mut record, &CommitRecord::new(SequenceId(3)));
        for cut in 0..record.len() {
            assert_eq!(record_of_chunk(&record[..cut]), None, "cut at {cut}");
        }
        assert_eq!(record_of_chunk(&[]), None);
        assert_eq!(grain_of_data_chunk(&[3; DATA_PREFIX]), None);
    }
}
