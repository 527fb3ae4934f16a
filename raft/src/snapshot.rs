//! The snapshot file format: the metadata, then every key and value,
//! streamed so that neither building nor installing holds the data set in
//! memory.
//!
//! ```text
//! "SRSNAP01" | u32 meta length | meta (JSON)
//! { 1 | u32 key length | key | u64 value length | value } ...
//! 0 | u64 record count | u32 CRC32 of everything before it
//! ```

use std::io::{self, Read, Write};

use crate::types::{SnapshotMeta, MAX_KEY_BYTES, MAX_VALUE_BYTES};

const MAGIC: &[u8; 8] = b"SRSNAP01";
const RECORD: u8 = 1;
const END: u8 = 0;

fn invalid(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

/// Writes a snapshot to `out`, checksumming as it goes.
#[derive(Debug)]
pub struct SnapshotWriter<W: Write> {
    out: W,
    crc: crc32fast::Hasher,
    records: u64,
}

impl<W: Write> SnapshotWriter<W> {
    /// Writes the header.
    pub fn new(mut out: W, meta: &SnapshotMeta) -> io::Result<Self> {
        let meta = serde_json::to_vec(meta).map_err(io::Error::other)?;
        let mut crc = crc32fast::Hasher::new();
        let mut header = Vec::with_capacity(12 + meta.len());
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&(meta.len() as u32).to_le_bytes());
        header.extend_from_slice(&meta);
        crc.update(&header);
        out.write_all(&header)?;
        Ok(Self {
            out,
            crc,
            records: 0,
        })
    }

    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.crc.update(bytes);
        self.out.write_all(bytes)
    }

    /// Adds one key and its value.
    pub fn add(&mut self, key: &str, value: &[u8]) -> io::Result<()> {
        self.put(&[RECORD])?;
        self.put(&(key.len() as u32).to_le_bytes())?;
        self.put(key.as_bytes())?;
        self.put(&(value.len() as u64).to_le_bytes())?;
        self.put(value)?;
        self.records += 1;
        Ok(())
    }

    /// Writes the trailer and returns the output.
    pub fn finish(mut self) -> io::Result<W> {
        self.put(&[END])?;
        self.put(&self.records.to_le_bytes())?;
        let crc = self.crc.clone().finalize();
        self.out.write_all(&crc.to_le_bytes())?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Reads a snapshot written by [`SnapshotWriter`], verifying the checksum
/// at the end: callers must not commit what they read before
/// [`SnapshotReader::next_record`] returned `Ok(None)`.
#[derive(Debug)]
pub struct SnapshotReader<R: Read> {
    input: R,
    crc: crc32fast::Hasher,
    records: u64,
    /// The snapshot's metadata.
    pub meta: SnapshotMeta,
}

impl<R: Read> SnapshotReader<R> {
    /// Reads the header.
    pub fn new(mut input: R) -> io::Result<Self> {
        let mut crc = crc32fast::Hasher::new();
        let mut head = [0_u8; 12];
        input.read_exact(&mut head)?;
        if &head[..8] != MAGIC {
            return Err(invalid("not a snapshot file"));
        }
        crc.update(&head);
        let len = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes")) as usize;
        if len > 64 << 20 {
            return Err(invalid(format!("snapshot metadata of {len} bytes")));
        }
        let mut meta = vec![0; len];
        input.read_exact(&mut meta)?;
        crc.update(&meta);
        let meta = serde_json::from_slice(&meta)
            .map_err(|e| invalid(format!("bad snapshot metadata: {e}")))?;
        Ok(Self {
            input,
            crc,
            records: 0,
            meta,
        })
    }

    fn take(&mut self, buf: &mut [u8]) -> io::Result<()> {
        self.input.read_exact(buf)?;
        self.crc.update(buf);
        Ok(())
    }

    /// The next key and value, or `None` at a verified end.
    pub fn next_record(&mut self) -> io::Result<Option<(String, Vec<u8>)>> {
        let mut tag = [0_u8; 1];
        self.take(&mut tag)?;
        match tag[0] {
            RECORD => {
                let mut len = [0_u8; 4];
                self.take(&mut len)?;
                let key_len = u32::from_le_bytes(len) as usize;
                if key_len == 0 || key_len > MAX_KEY_BYTES {
                    return Err(invalid(format!("snapshot key of {key_len} bytes")));
                }
                let mut key = vec![0; key_len];
                self.take(&mut key)?;
                let key =
                    String::from_utf8(key).map_err(|_| invalid("snapshot key is not UTF-8"))?;
                let mut len = [0_u8; 8];
                self.take(&mut len)?;
                let value_len = u64::from_le_bytes(len);
                if value_len > MAX_VALUE_BYTES as u64 {
                    return Err(invalid(format!("snapshot value of {value_len} bytes")));
                }
                let mut value = vec![0; value_len as usize];
                self.take(&mut value)?;
                self.records += 1;
                Ok(Some((key, value)))
            }
            END => {
                let mut count = [0_u8; 8];
                self.take(&mut count)?;
                let expected = self.crc.clone().finalize();
                let mut crc = [0_u8; 4];
                self.input.read_exact(&mut crc)?;
                if u64::from_le_bytes(count) != self.records {
                    return Err(invalid("snapshot record count mismatch"));
                }
                if u32::from_le_bytes(crc) != expected {
                    return Err(invalid("snapshot checksum mismatch"));
                }
                Ok(None)
            }
            other => Err(invalid(format!("bad snapshot record tag {other}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> SnapshotMeta {
        SnapshotMeta {
            snapshot_id: "1-2-3".into(),
            ..Default::default()
        }
    }

    fn sample() -> Vec<u8> {
        let mut writer = SnapshotWriter::new(Vec::new(), &meta()).unwrap();
        writer.add("alpha", b"one").unwrap();
        writer.add("beta", &[7; 1000]).unwrap();
        writer.finish().unwrap()
    }

    #[test]
    fn snapshot_round_trips() {
        let bytes = sample();
        let mut reader = SnapshotReader::new(&bytes[..]).unwrap();
        assert_eq!(reader.meta, meta());
        assert_eq!(
            reader.next_record().unwrap(),
            Some(("alpha".into(), b"one".to_vec()))
        );
        assert_eq!(reader.next_record().unwrap().unwrap().1, vec![7; 1000]);
        assert_eq!(reader.next_record().unwrap(), None);
    }

    #[test]
    fn damaged_or_cut_snapshots_are_errors() {
        let bytes = sample();
        let mut flipped = bytes.clone();
        flipped[40] ^= 0x10;
        let read_all = |b: &[u8]| -> io::Result<()> {
            let mut reader = SnapshotReader::new(b)?;
            while reader.next_record()?.is_some() {}
            Ok(())
        };
        assert!(read_all(&flipped).is_err());
        assert!(read_all(&bytes[..bytes.len() - 2]).is_err());
        assert!(read_all(b"garbage!garbage!").is_err());
        assert!(read_all(&bytes).is_ok());
    }
}
