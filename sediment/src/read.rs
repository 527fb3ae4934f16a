//! Reading blobs: [`Database::get`] (through the blob cache) and
//! [`Database::read`], from the WAL while a blob's bytes are only there,
//! from its stratum after.

use std::io::{self, Read};
use std::path::PathBuf;
use std::sync::Arc;

use okaywal::fs::FileHandle;
use okaywal::ChunkReader;

use okaywal::encryption::{KeyId, SEAL_BYTES};

use crate::commit_record::SequenceId;
use crate::db::Database;
use crate::error::{Context, Error, Result};
use crate::format::{
    fit, placement, sealed_chunk_span, sealed_image_len, GrainHeader, GRAIN_HEADER_SIZE,
    SEALED_IMAGE_HEAD,
};
use crate::grain_id::GrainId;
use crate::reclamation::{Location, Pending};
use crate::sealing::{Sealer, Unsealed};
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
        // A blob freed by a checkpoint while it is read (its grains may
        // already hold another blob's bytes) is looked up again: it is
        // gone, or another blob is committed there by now.
        let mut attempts = 0;
        loop {
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
            let Some(mut reader) = self.read(id)? else {
                return Ok(None);
            };
            let mut data = Vec::with_capacity(reader.len() as usize);
            match reader.read_to_end(&mut data).map_err(|e| reader.error(e)) {
                Ok(_) => {}
                Err(Error::NotAllocated(_)) if attempts < 16 => {
                    attempts += 1;
                    continue;
                }
                Err(e) => return Err(e),
            }
            if let Some((epoch, stratum)) = epoch {
                shared
                    .cache()
                    .insert_if(id, &data, || stratum.reuse_epoch() == epoch);
            }
            return Ok(Some(data));
        }
    }

    /// Like [`Database::get`], but returns a reader that streams the blob
    /// (and checks its CRC when it reaches the end), for large blobs.
    ///
    /// A blob that a checkpoint frees while it is being streamed (another
    /// thread archived it and checkpointed past it) cannot be read to its
    /// end: its grains may already hold another blob. The reader then
    /// fails with an [`io::Error`] of kind [`io::ErrorKind::NotFound`]
    /// that says so, where damaged bytes give
    /// [`io::ErrorKind::InvalidData`]. ([`Database::get`] looks such a
    /// blob up again, and returns `None` or the blob committed there
    /// since.)
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
                        let sealer = self.shared().strata().sealer();
                        return GrainReader::wal(id, chunk, pending, sealer).map(Some);
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
                return read.map(|mut reader| {
                    reader.freed_check = Some((stratum, epoch));
                    Some(reader)
                });
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
    /// For a blob read from its stratum: the stratum and its reuse epoch
    /// when the blob was found live, to tell a blob freed (and its grains
    /// reused) while it was read from a damaged one.
    freed_check: Option<(Arc<Stratum>, u64)>,
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
    /// A sealed blob's image, opened chunk by chunk.
    Sealed(Box<Sealed>),
}

/// Where a sealed blob's image is read from, and how far it was opened.
#[derive(Debug)]
struct Sealed {
    sealer: Arc<Sealer>,
    origin: Origin,
    header: GrainHeader,
    next_chunk: u64,
    /// The chunk read last: its seal, then its plaintext.
    piece: Vec<u8>,
    /// The plaintext of `piece` not handed out yet starts here.
    at: usize,
}

#[derive(Debug)]
enum Origin {
    /// The image follows in a WAL chunk.
    Wal(ChunkReader),
    /// The image starts at `offset` of the stratum.
    Stratum(Arc<Stratum>, u64),
}

/// Reads a piece of a sealed image at `at` of `stratum` into `buf` and
/// opens it with `open`. A piece that fails to open while a rewrite of the
/// file ran (see `Stratum::rewrite_blob`) may have been read half old,
/// half new: it is read again. A file too short for the piece is damage.
pub(crate) fn read_stable<T>(
    stratum: &Stratum,
    at: u64,
    buf: &mut [u8],
    mut open: impl FnMut(&mut [u8]) -> Result<T, Unsealed>,
) -> io::Result<Result<T, Unsealed>> {
    let mut attempt = 0;
    loop {
        let before = stratum.rewrites();
        let complete = match stratum.file().read_exact_at(buf, at) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => false,
            Err(e) => return Err(e),
        };
        let result = if complete {
            open(buf)
        } else {
            Err(Unsealed::Damaged)
        };
        let moved = before % 2 == 1 || stratum.rewrites() != before;
        match result {
            Err(Unsealed::Damaged) if moved && attempt < 10_000 => {
                attempt += 1;
                std::thread::yield_now();
            }
            other => return Ok(other),
        }
    }
}

impl Sealed {
    /// Reads and opens the next chunk into `piece`.
    fn next(&mut self, id: GrainId, location: &(PathBuf, u64)) -> io::Result<()> {
        let len = u64::from(self.header.length);
        let chunk = self.next_chunk;
        let (offset, plain) = sealed_chunk_span(len, chunk);
        self.piece.resize(SEAL_BYTES + plain, 0);
        let what = format!("{} offset {}", location.0.display(), location.1);
        let (sealer, header) = (&self.sealer, &self.header);
        let opened = match &mut self.origin {
            Origin::Wal(chunk_reader) => {
                chunk_reader.read_exact(&mut self.piece)?;
                sealer.open_image_chunk(id, header, chunk, &mut self.piece, &what)
            }
            Origin::Stratum(stratum, start) => {
                read_stable(stratum, *start + offset, &mut self.piece, |piece| {
                    sealer.open_image_chunk(id, header, chunk, piece, &what)
                })?
            }
        };
        match opened {
            Ok(_) => {
                self.next_chunk += 1;
                self.at = SEAL_BYTES;
                Ok(())
            }
            Err(Unsealed::Damaged) => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "grain {id}: chunk {chunk} failed authentication ({what}): damaged or \
                     not from this place"
                ),
            )),
            Err(Unsealed::Key(error)) => Err(error),
        }
    }
}

/// The error for a sealed head that did not open: damage as
/// [`Error::ChecksumMismatch`], a key error as [`Error::Key`].
fn unsealed_error(error: Unsealed, mismatch: impl FnOnce() -> Error, id: GrainId) -> Error {
    match error {
        Unsealed::Damaged => mismatch(),
        Unsealed::Key(source) => Error::from_io(format!("reading grain {id}"), source),
    }
}

impl GrainReader {
    fn wal(
        id: GrainId,
        mut chunk: ChunkReader,
        pending: Pending,
        sealer: Option<&Arc<Sealer>>,
    ) -> Result<Self> {
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&pending.sequence.to_le_bytes());
        hasher.update(&pending.length.to_le_bytes());
        let position = chunk.position();
        let location = (
            PathBuf::from(format!("wal-{}", position.file_id)),
            position.offset,
        );
        let source = match sealer {
            None => Source::Wal(chunk),
            Some(sealer) => {
                let mismatch = || Error::ChecksumMismatch {
                    grain: id,
                    path: location.0.clone(),
                    offset: location.1,
                };
                let mut head = [0_u8; SEALED_IMAGE_HEAD as usize];
                chunk
                    .read_exact(&mut head)
                    .context(|| format!("reading grain {id} from the WAL"))?;
                let what = format!("WAL {position}");
                let (header, _) = sealer
                    .open_image_head(id, &mut head, &what)
                    .map_err(|e| unsealed_error(e, mismatch, id))?;
                // The image must be the one the commit record lists.
                if (header.sequence, header.length, header.crc)
                    != (pending.sequence, pending.length, pending.crc)
                {
                    return Err(mismatch());
                }
                Source::Sealed(Box::new(Sealed {
                    sealer: sealer.clone(),
                    origin: Origin::Wal(chunk),
                    header,
                    next_chunk: 0,
                    piece: Vec::new(),
                    at: 0,
                }))
            }
        };
        Ok(Self {
            id,
            source,
            length: pending.length,
            remaining: pending.length,
            sequence: pending.sequence,
            expected_crc: pending.crc,
            hasher,
            location,
            freed_check: None,
        })
    }

    /// Opens the sealed blob `id` of `stratum` (whose image starts at
    /// `offset`): its head is read and checked now.
    fn sealed_stratum(
        id: GrainId,
        stratum: &Arc<Stratum>,
        sealer: &Arc<Sealer>,
        offset: u64,
    ) -> Result<Self> {
        let location = (stratum.path().to_path_buf(), offset);
        let mismatch = || Error::ChecksumMismatch {
            grain: id,
            path: stratum.path().to_path_buf(),
            offset,
        };
        let (header, _) = open_sealed_head(stratum, sealer, id)
            .context(|| format!("reading grain {id} from {}", stratum.path().display()))?
            .map_err(|e| unsealed_error(e, mismatch, id))?;
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&header.sequence.to_le_bytes());
        hasher.update(&header.length.to_le_bytes());
        Ok(Self {
            id,
            source: Source::Sealed(Box::new(Sealed {
                sealer: sealer.clone(),
                origin: Origin::Stratum(stratum.clone(), offset),
                header,
                next_chunk: 0,
                piece: Vec::new(),
                at: 0,
            })),
            length: header.length,
            remaining: header.length,
            sequence: header.sequence,
            expected_crc: header.crc,
            hasher,
            location,
            freed_check: None,
        })
    }

    fn stratum(id: GrainId, stratum: &Arc<Stratum>) -> Result<Self> {
        let offset = stratum.offset_of(id.index());
        if let Some(sealer) = stratum.sealer() {
            return Self::sealed_stratum(id, stratum, sealer, offset);
        }
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
            freed_check: None,
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
    /// mismatches (and failed authentication), a blob freed while it was
    /// read ([`Error::NotAllocated`]) and key errors.
    pub(crate) fn error(&self, err: io::Error) -> Error {
        if err.kind() == io::ErrorKind::NotFound && self.freed_check.is_some() {
            return Error::NotAllocated(self.id);
        }
        if err.kind() == io::ErrorKind::InvalidData {
            Error::ChecksumMismatch {
                grain: self.id,
                path: self.location.0.clone(),
                offset: self.location.1,
            }
        } else {
            Error::from_io(format!("reading grain {}", self.id), err)
        }
    }
}

impl GrainReader {
    /// For bytes that do not check out: whether the blob was freed by a
    /// checkpoint while it was read, rather than damaged. Its stratum's
    /// reuse epoch moved since it was found live, and the blob is no
    /// longer live or its grains now begin with another blob's header.
    fn freed_while_read(&self) -> bool {
        let Some((stratum, epoch)) = &self.freed_check else {
            return false;
        };
        // Looked at again while the stratum changes under the look (a blob
        // freed or committed between the liveness check and the header).
        for _ in 0..16 {
            let now = stratum.reuse_epoch();
            if now == *epoch {
                return false;
            }
            if !stratum.is_live_blob(self.id.index(), self.id.count()) {
                return true;
            }
            let sequence = match stratum.sealer() {
                Some(sealer) => match open_sealed_head(stratum, sealer, self.id) {
                    Ok(Ok((header, _))) => Some(header.sequence),
                    _ => None,
                },
                None => {
                    let mut head = [0_u8; GRAIN_HEADER_SIZE];
                    stratum
                        .file()
                        .read_exact_at(&mut head, stratum.offset_of(self.id.index()))
                        .ok()
                        .and_then(|()| GrainHeader::decode(&head))
                        .map(|header| header.sequence)
                }
            };
            if stratum.reuse_epoch() == now {
                return sequence.is_some_and(|sequence| sequence != self.sequence);
            }
            std::thread::yield_now();
        }
        // Grains of the stratum kept being freed all along: this blob's
        // among them, most likely.
        true
    }

    /// The error for bytes that do not check out: the blob was freed
    /// while it was read (`NotFound`), or it is damaged (`InvalidData`).
    fn bad_bytes(&self, damaged: io::Error) -> io::Error {
        if self.freed_while_read() {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "grain {} was freed by a checkpoint while it was being read (its grains \
                     may hold another blob now)",
                    self.id
                ),
            )
        } else {
            damaged
        }
    }

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
            Source::Sealed(sealed) => {
                if sealed.at >= sealed.piece.len() {
                    if let Err(e) = sealed.next(self.id, &self.location) {
                        return Err(match e.kind() {
                            io::ErrorKind::InvalidData => self.bad_bytes(e),
                            _ => e,
                        });
                    }
                }
                let n = wanted.min(sealed.piece.len() - sealed.at);
                buf[..n].copy_from_slice(&sealed.piece[sealed.at..sealed.at + n]);
                sealed.at += n;
                n
            }
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
            return Err(self.bad_bytes(self.checksum_error()));
        }
        Ok(n)
    }
}

/// Reads and opens the head of the sealed blob `id` of `stratum`: its grain
/// header, checked against the extent (the length must need exactly its
/// grains) and against the stratum's stamp (an old image of a grain that
/// was freed and reused carries another sequence), and its key id.
pub(crate) fn open_sealed_head(
    stratum: &Stratum,
    sealer: &Sealer,
    id: GrainId,
) -> io::Result<Result<(GrainHeader, KeyId), Unsealed>> {
    let offset = stratum.offset_of(id.index());
    let what = format!("{} offset {offset}", stratum.path().display());
    let mut head = [0_u8; SEALED_IMAGE_HEAD as usize];
    let opened = read_stable(stratum, offset, &mut head, |piece| {
        sealer.open_image_head(id, piece, &what)
    })?;
    Ok(opened.and_then(|(header, key_id)| {
        let extent = sealed_image_len(u64::from(header.length)).and_then(fit);
        let stamp = stratum.stamp(id.index());
        if extent != Some((id.basin(), id.count()))
            || stamp != Some(crate::stratum::stamp_of(header.sequence))
        {
            return Err(Unsealed::Damaged);
        }
        Ok((header, key_id))
    }))
}
