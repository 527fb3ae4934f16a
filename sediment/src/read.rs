//! Reading blobs: [`Database::get`] (through the blob cache) and
//! [`Database::read`], from the WAL while a blob's bytes are only there,
//! from its stratum after.

use std::io::{self, Read};
use std::path::PathBuf;
use std::sync::Arc;

use okaywal::fs::FileHandle;
use okaywal::ChunkReader;

use crate::commit_record::SequenceId;
use crate::db::Database;
use crate::error::{Context, Error, Result};
use crate::format::{placement, GrainHeader, GRAIN_HEADER_SIZE};
use crate::grain_id::GrainId;
use crate::reclamation::{Location, Pending};
use crate::stratum::Stratum;
use crate::wal_entry::skip_data_prefix;

impl Database {
    /// Returns the blob stored at `id`, or `None` if no committed blob is
    /// there (never written, or freed by a checkpoint).
    ///
    /// Fails with [`Error::InvalidGrainId`] for ids that cannot name a blob
    /// and [`Error::ChecksumMismatch`] if the stored bytes are damaged.
    pub fn get(&self, id: GrainId) -> Result<Option<Vec<u8>>> {
        self.check_open()?;
        let shared = &self.shared();
        // Only live blobs are ever cached, and freeing removes them.
        if let Some(hit) = shared.cache().get(id) {
            return Ok(Some(hit.to_vec()));
        }
        // Read before the liveness check inside `read`: if the blob is
        // freed after that check, the epoch moves and it is not cached.
        let epoch = shared
            .strata()
            .stratum_of(id)?
            .map(|stratum| (stratum.reuse_epoch(), stratum));
        match self.read(id)? {
            Some(mut reader) => {
                let mut data = Vec::with_capacity(reader.len() as usize);
                reader.read_to_end(&mut data).map_err(|e| reader.error(e))?;
                if let Some((epoch, stratum)) = epoch {
                    shared
                        .cache()
                        .insert_if(id, &data, || stratum.reuse_epoch() == epoch);
                }
                Ok(Some(data))
            }
            None => Ok(None),
        }
    }

    /// Like [`Database::get`], but returns a reader that streams the blob
    /// (and checks its CRC when it reaches the end), for large blobs.
    pub fn read(&self, id: GrainId) -> Result<Option<GrainReader>> {
        self.check_open()?;
        // A blob's bytes move from the WAL to its stratum at checkpoints and
        // freed grains may be reused; retry if either happens mid-lookup.
        for _ in 0..16 {
            let stratum = self.shared().strata().stratum_of(id)?;
            let (pending, epoch) = match self.shared().reclamation().locate(id, stratum.as_deref())
            {
                Location::Wal(found) => (Some(found), 0),
                Location::Stratum { epoch } => (None, epoch),
                Location::Nowhere => return Ok(None),
            };
            if let Some(pending) = pending {
                match self.wal().read_at(pending.position) {
                    Ok(mut chunk) => {
                        skip_data_prefix(&mut chunk)
                            .context(|| format!("reading grain {id} from the WAL"))?;
                        return Ok(Some(GrainReader::wal(id, chunk, pending)));
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e).context(|| format!("reading grain {id} from the WAL")),
                }
            }
            let Some(stratum) = stratum else {
                return Ok(None);
            };
            let read = GrainReader::stratum(id, &stratum);
            if stratum.reuse_epoch() == epoch {
                return read.map(Some);
            }
        }
        Err(Error::Io {
            context: format!("reading grain {id}"),
            source: io::Error::other("the grain kept moving while being read"),
        })
    }
}

/// Streams one blob; the CRC is checked when the end is reached, and a
/// mismatch is reported as an `InvalidData` error from `read`.
#[derive(Debug)]
pub struct GrainReader {
    id: GrainId,
    source: Source,
    length: u32,
    remaining: u32,
    sequence: u64,
    expected_crc: u32,
    hasher: crc32fast::Hasher,
    location: (PathBuf, u64),
}

#[derive(Debug)]
enum Source {
    Wal(ChunkReader),
    Stratum {
        file: Arc<dyn FileHandle>,
        next: u64,
        /// The first bytes of the blob, read with the header.
        head: Vec<u8>,
    },
}

impl GrainReader {
    fn wal(id: GrainId, chunk: ChunkReader, pending: Pending) -> Self {
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&pending.sequence.to_le_bytes());
        hasher.update(&pending.length.to_le_bytes());
        let position = chunk.position();
        Self {
            id,
            source: Source::Wal(chunk),
            length: pending.length,
            remaining: pending.length,
            sequence: pending.sequence,
            expected_crc: pending.crc,
            hasher,
            location: (
                PathBuf::from(format!("wal-{}", position.file_id)),
                position.offset,
            ),
        }
    }

    fn stratum(id: GrainId, stratum: &Stratum) -> Result<Self> {
        let offset = stratum.offset_of(id.index());
        let capacity = u64::from(id.count()) * stratum.grain_size();
        // One read covers the header and, for small blobs, all the data.
        let first_read = capacity.min(64 * 1024) as usize;
        let mut head = vec![0; first_read];
        let mut filled = 0;
        while filled < head.len() {
            let n = stratum
                .read_at(&mut head[filled..], offset + filled as u64)
                .context(|| format!("reading grain {id} from {}", stratum.path().display()))?;
            if n == 0 {
                break;
            }
            filled += n;
        }
        head.truncate(filled);
        let mismatch = || Error::ChecksumMismatch {
            grain: id,
            path: stratum.path().to_path_buf(),
            offset,
        };
        let header = GrainHeader::decode(&head).ok_or_else(mismatch)?;
        // The header's length must be one that this exact extent holds.
        if placement(u64::from(header.length)) != Some((id.basin(), id.count())) {
            return Err(mismatch());
        }
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&header.sequence.to_le_bytes());
        hasher.update(&header.length.to_le_bytes());
        head.drain(..GRAIN_HEADER_SIZE);
        head.truncate(header.length as usize);
        Ok(Self {
            id,
            source: Source::Stratum {
                file: stratum.file().clone(),
                next: offset + GRAIN_HEADER_SIZE as u64 + head.len() as u64,
                head,
            },
            length: header.length,
            remaining: header.length,
            sequence: header.sequence,
            expected_crc: header.crc,
            hasher,
            location: (stratum.path().to_path_buf(), offset),
        })
    }

    /// The blob's id.
    #[must_use]
    pub fn id(&self) -> GrainId {
        self.id
    }

    /// The blob's length in bytes.
    #[must_use]
    pub fn len(&self) -> u64 {
        u64::from(self.length)
    }

    /// True for a zero-length blob.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    /// The sequence of the transaction that wrote the blob.
    #[must_use]
    pub fn sequence(&self) -> SequenceId {
        SequenceId(self.sequence)
    }

    /// Turns a read error into the crate's error type, recognising CRC
    /// mismatches.
    pub(crate) fn error(&self, err: io::Error) -> Error {
        if err.kind() == io::ErrorKind::InvalidData {
            Error::ChecksumMismatch {
                grain: self.id,
                path: self.location.0.clone(),
                offset: self.location.1,
            }
        } else {
            Error::Io {
                context: format!("reading grain {}", self.id),
                source: err,
            }
        }
    }
}

impl GrainReader {
    fn checksum_error(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "grain {} failed its checksum ({}, offset {})",
                self.id,
                self.location.0.display(),
                self.location.1
            ),
        )
    }
}

impl Read for GrainReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.remaining == 0 {
            // An empty blob has no data to hash on the way: check its CRC
            // (over sequence and length) here.
            if self.length == 0 && self.hasher.clone().finalize() != self.expected_crc {
                return Err(self.checksum_error());
            }
            return Ok(0);
        }
        let wanted = buf.len().min(self.remaining as usize);
        let n = match &mut self.source {
            Source::Wal(chunk) => chunk.read(&mut buf[..wanted])?,
            Source::Stratum { file, next, head } => {
                if head.is_empty() {
                    let n = file.read_at(&mut buf[..wanted], *next)?;
                    *next += n as u64;
                    n
                } else {
                    let n = wanted.min(head.len());
                    buf[..n].copy_from_slice(&head[..n]);
                    head.drain(..n);
                    n
                }
            }
        };
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("grain {} ends early", self.id),
            ));
        }
        self.hasher.update(&buf[..n]);
        self.remaining -= n as u32;
        if self.remaining == 0 && self.hasher.clone().finalize() != self.expected_crc {
            return Err(self.checksum_error());
        }
        Ok(n)
    }
}
