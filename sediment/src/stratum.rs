//! One stratum file: its double header and its grains, its allocation
//! bitmaps in memory, and its `fdatasync`s. The bitmaps' lock is private:
//! each method takes it for one operation, with no other lock under it,
//! so it sits below `meta` and `pending` in the lock order (see
//! `reclamation`).
//!
//! The syncs of one file are coalesced by okaywal's [`GroupCommit`], the
//! protocol the log uses for its own segments, in the kind that does not
//! gather: one sync at a time, shared by every caller that arrived while
//! the previous one ran.
//!
//! The header copies' bytes, plain or sealed, and a sealed stratum's
//! stamps are `sealed`'s.

mod sealed;

use sealed::read_copy;
pub(crate) use sealed::{stamp_of, CopyError, CopyState};

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use okaywal::fs::{FileHandle, FileSystem, OpenMode};
use okaywal::GroupCommit;
use parking_lot::{Mutex, RwLock};

use crate::allocator::StratumBits;
use crate::error::{Context, Error, Result};
use crate::files::open_existing;
use crate::format::{grain_size, newest, stratum_capacity, HeaderError, Layout, StratumHeader};
use crate::sealing::Sealer;
use sealed::Stamps;

/// The file name of stratum `number` of `basin`.
pub(crate) fn file_name(basin: u8, number: u32) -> String {
    format!("stratum-{basin}-{number}")
}

/// Parses `stratum-{basin}-{number}`.
pub(crate) fn parse_file_name(name: &str) -> Option<(u8, u32)> {
    let rest = name.strip_prefix("stratum-")?;
    let (basin, number) = rest.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(basin) || !digits(number) {
        return None;
    }
    Some((basin.parse().ok()?, number.parse().ok()?))
}

/// A stratum file, open for the life of the database.
///
/// Its identity (basin, number, path, file handle) never changes; its
/// bytes are written, and its bitmaps changed, only through its methods.
#[derive(Debug)]
pub(crate) struct Stratum {
    basin: u8,
    number: u32,
    path: PathBuf,
    file: Arc<dyn FileHandle>,
    bits: RwLock<StratumBits>,
    /// Which header copy to overwrite next, and the generation to write.
    header: Mutex<(usize, u64)>,
    /// The durable bitmaps changed since the header was last written.
    dirty: AtomicBool,
    /// Bumped whenever freed grains become reusable, so a reader can tell
    /// that the grain it read may have been reused underneath it.
    reuse_epoch: AtomicU64,
    /// Orders the `fdatasync`s of this file: at most one runs at a time
    /// (see [`Stratum::sync`]).
    syncs: GroupCommit,
    /// How many syncs have started.
    syncs_started: AtomicU64,
    /// The number of the last sync that succeeded.
    syncs_finished: AtomicU64,
    /// Why a sync of this file failed, if one did.
    sync_failure: Mutex<Option<String>>,
    /// The store's sealing context if it is encrypted (format version 2).
    sealer: Option<Arc<Sealer>>,
    /// Sealed: the sequence (low 32 bits) that wrote each blob.
    stamps: Option<Stamps>,
    /// Odd while grains of this file are rewritten in place (only
    /// `Database::rekey` does that); a reader whose sealed piece fails to
    /// open while it moved reads it again.
    rewrites: AtomicU64,
    /// Opened read-only as a creation cut short (see
    /// [`Stratum::unfinished`]): no header, no grains.
    unfinished: bool,
}

impl Stratum {
    /// Creates a new, empty stratum file and makes it durable (file and
    /// directory entry) before any grain in it is handed out.
    pub fn create(
        fs: &dyn FileSystem,
        directory: &Path,
        basin: u8,
        number: u32,
        sealer: Option<&Arc<Sealer>>,
    ) -> Result<Self> {
        let path = directory.join(file_name(basin, number));
        let file = fs
            .open(&path, OpenMode::Create)
            .context(|| format!("creating stratum {}", path.display()))?;
        let mut header = StratumHeader::empty(basin, number);
        header.generation = 1;
        let stamps = match sealer {
            Some(_) => {
                let (stamps_path, stamps_file) =
                    Stamps::open_file(fs, directory, basin, number, true)
                        .and_then(|(path, file)| {
                            if let Some(file) = &file {
                                file.set_len(0)?;
                            }
                            Ok((path, file))
                        })
                        .context(|| format!("creating the stamps of stratum {}", path.display()))?;
                Some(Stamps::new(
                    basin,
                    Vec::new(),
                    [Vec::new(), Vec::new()],
                    (stamps_path, stamps_file),
                ))
            }
            None => None,
        };
        file.set_len(0)
            .and_then(|()| match (sealer, &stamps) {
                (Some(sealer), Some(stamps)) => {
                    sealed::write_copy(&*file, sealer, &header, 0, stamps, false)
                }
                _ => file.write_all_at(&header.encode(), 0),
            })
            .and_then(|()| file.sync_data())
            .and_then(|()| fs.sync_dir(directory))
            .context(|| format!("initializing stratum {}", path.display()))?;
        Ok(Self::from_parts(
            basin,
            number,
            path,
            file,
            header,
            0,
            (sealer.cloned(), stamps),
        ))
    }

    /// Opens an existing stratum, trusting the newer valid header copy.
    /// A writable open repairs the other copy when it differs; a read-only
    /// one leaves the file as it is.
    pub fn open(
        fs: &dyn FileSystem,
        directory: &Path,
        basin: u8,
        number: u32,
        writable: bool,
        sealer: Option<&Arc<Sealer>>,
    ) -> Result<Self> {
        let path = directory.join(file_name(basin, number));
        let file = open_existing(fs, &path, writable)
            .context(|| format!("opening stratum {}", path.display()))?;
        let stamps_file = match sealer {
            Some(_) => Some(
                Stamps::open_file(fs, directory, basin, number, false)
                    .context(|| format!("opening the stamps of stratum {}", path.display()))?,
            ),
            None => None,
        };
        let sealed = sealer.map(|sealer| {
            let file = stamps_file.as_ref().and_then(|(_, file)| file.as_deref());
            (&**sealer, file)
        });
        let [first, second] = read_copies(&*file, sealed, basin, number, &path)
            .context(|| format!("reading stratum {}", path.display()))?;
        // A key that is missing or wrong is never taken for damage.
        let first =
            header_result(first).context(|| format!("opening stratum {}", path.display()))?;
        let second =
            header_result(second).context(|| format!("opening stratum {}", path.display()))?;
        let copies = [first.clone(), second.clone()];
        let (slot, state) =
            newest(first, second, |c| c.header.generation).map_err(|(a, b)| Error::Corrupt {
                path: path.clone(),
                what: format!("both stratum header copies are invalid ({a}; {b})"),
            })?;
        let stamps = match stamps_file {
            Some(read_only) => {
                // The keys are settled: a writable store may now create a
                // stamps file that is missing.
                let stamps_file = if writable {
                    Stamps::open_file(fs, directory, basin, number, true)
                        .context(|| format!("opening the stamps of stratum {}", path.display()))?
                } else {
                    read_only
                };
                let other = copies[1 - slot]
                    .as_ref()
                    .map(|c| c.versions.clone())
                    .unwrap_or_default();
                let mut versions = [Vec::new(), Vec::new()];
                versions[slot] = state.versions.clone();
                versions[1 - slot] = other;
                Some(Stamps::new(
                    basin,
                    state.stamps.clone(),
                    versions,
                    stamps_file,
                ))
            }
            None => None,
        };
        let same = copies[1 - slot]
            .as_ref()
            .is_ok_and(|other| other.same_state(&state));
        if writable && !same {
            // A checkpoint leaves both copies alike (see `mirror_header`),
            // so the other one was being written when a crash hit, or has
            // decayed since: make it a copy of the good one again, so that
            // damage to either one later loses nothing.
            let other = 1 - slot as u64;
            let repaired = match (sealer, &stamps) {
                (Some(sealer), Some(stamps)) => {
                    sealed::write_copy(&*file, sealer, &state.header, other, stamps, true)
                }
                _ => file.write_all_at(
                    &state.header.encode(),
                    other * Layout::Plain.slot_size(basin),
                ),
            }
            .and_then(|()| file.sync_data());
            match repaired {
                // A stratum no checkpoint has written yet (generation 1,
                // the other copy never written) holds no checkpointed blob,
                // and its first checkpoint writes both copies. On a full
                // disk (the copy's place may be a hole in the file) the
                // repair waits for that rather than keep the store from
                // opening, when archiving and checkpointing is what frees
                // space.
                Err(err)
                    if err.kind() == std::io::ErrorKind::StorageFull
                        && state.header.generation == 1
                        && copies[1 - slot].is_err() => {}
                repaired => {
                    repaired.context(|| format!("repairing a header copy of {}", path.display()))?
                }
            }
        }
        Ok(Self::from_parts(
            basin,
            number,
            path,
            file,
            state.header,
            slot,
            (sealer.cloned(), stamps),
        ))
    }

    /// Whether this stratum was opened as a creation cut short
    /// ([`Stratum::unfinished`]): its header copies were never written.
    pub fn is_unfinished(&self) -> bool {
        self.unfinished
    }

    /// A stratum whose creation a crash cut short, opened read-only: it
    /// holds no grains, and its file is left as it is.
    pub fn unfinished(
        fs: &dyn FileSystem,
        directory: &Path,
        basin: u8,
        number: u32,
        sealer: Option<&Arc<Sealer>>,
    ) -> Result<Self> {
        let path = directory.join(file_name(basin, number));
        let file = fs
            .open(&path, OpenMode::Read)
            .context(|| format!("opening stratum {}", path.display()))?;
        let header = StratumHeader::empty(basin, number);
        let stamps = match sealer {
            Some(_) => Some(Stamps::new(
                basin,
                Vec::new(),
                [Vec::new(), Vec::new()],
                Stamps::open_file(fs, directory, basin, number, false)
                    .context(|| format!("opening the stamps of stratum {}", path.display()))?,
            )),
            None => None,
        };
        Ok(Self {
            unfinished: true,
            ..Self::from_parts(
                basin,
                number,
                path,
                file,
                header,
                0,
                (sealer.cloned(), stamps),
            )
        })
    }

    fn from_parts(
        basin: u8,
        number: u32,
        path: PathBuf,
        file: Arc<dyn FileHandle>,
        header: StratumHeader,
        newest_slot: usize,
        (sealer, stamps): (Option<Arc<Sealer>>, Option<Stamps>),
    ) -> Self {
        let generation = header.generation;
        Self {
            basin,
            number,
            path,
            file,
            bits: RwLock::new(StratumBits::from_durable(
                stratum_capacity(basin),
                header.allocated,
                header.starts,
            )),
            header: Mutex::new((1 - newest_slot, generation + 1)),
            dirty: AtomicBool::new(false),
            reuse_epoch: AtomicU64::new(0),
            syncs: GroupCommit::new(),
            syncs_started: AtomicU64::new(0),
            syncs_finished: AtomicU64::new(0),
            sync_failure: Mutex::new(None),
            sealer,
            stamps,
            rewrites: AtomicU64::new(0),
            unfinished: false,
        }
    }

    /// The basin the stratum belongs to.
    pub fn basin(&self) -> u8 {
        self.basin
    }

    /// The stratum's number within its basin.
    pub fn number(&self) -> u32 {
        self.number
    }

    /// The stratum file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open file, for a reader that streams a grain's data.
    pub fn file(&self) -> &Arc<dyn FileHandle> {
        &self.file
    }

    /// The file's length in bytes.
    pub fn file_len(&self) -> std::io::Result<u64> {
        self.file.len()
    }

    /// Reads into `buf` from `offset`; how many bytes were read (0 at the
    /// end of the file).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        self.file.read_at(buf, offset)
    }

    /// Writes `bytes` (grain headers and data) at `offset`, not synced:
    /// grains a transaction writes straight into the file, or those the
    /// WAL checkpoint copies there.
    pub fn write_grains(&self, bytes: &[u8], offset: u64) -> std::io::Result<()> {
        self.file.write_all_at(bytes, offset)
    }

    /// Makes every write to this file that completed before the call
    /// durable (`fdatasync`), sharing a sync with concurrent callers.
    ///
    /// Once a sync of this file has failed, every later call fails too.
    /// Linux reports a failed writeback to one `fdatasync` of a file
    /// description and may drop the pages it could not write; the
    /// description is shared by all writers, so a sync that succeeds after
    /// another failed does not mean that the caller's writes are on disk.
    /// Syncs run one at a time, so that one cannot report success while an
    /// earlier one is still returning its failure.
    pub fn sync(&self) -> Result<()> {
        let failed = |why: &str| Error::Io {
            context: format!("syncing {}", self.path.display()),
            source: std::io::Error::other(format!(
                "an fdatasync of this file failed ({why}); writes it covered may be lost"
            )),
        };
        if let Some(why) = &*self.sync_failure.lock() {
            return Err(failed(why));
        }
        // A sync that starts from now on covers the caller's writes; the
        // one running may have started before they completed.
        let needed = self.syncs_started.load(Ordering::SeqCst) + 1;
        let mut own_sync_failed = false;
        let result = self.syncs.wait(
            || self.syncs_finished.load(Ordering::SeqCst) >= needed,
            || {
                let number = self.syncs_started.fetch_add(1, Ordering::SeqCst) + 1;
                let result = self.file.sync_data();
                match &result {
                    Ok(()) => {
                        self.syncs_finished.fetch_max(number, Ordering::SeqCst);
                    }
                    Err(err) => {
                        self.sync_failure.lock().get_or_insert(err.to_string());
                        own_sync_failed = true;
                    }
                }
                result
            },
        );
        match result {
            Ok(()) => Ok(()),
            Err(err) if own_sync_failed => {
                Err(err).context(|| format!("syncing {}", self.path.display()))
            }
            Err(err) => {
                let why = self.sync_failure.lock().clone();
                Err(failed(&why.unwrap_or_else(|| err.to_string())))
            }
        }
    }

    /// Reserves `count` adjacent free grains; their first index, or `None`
    /// if the stratum has no such run.
    pub fn reserve(&self, count: u32) -> Option<u32> {
        self.bits.write().reserve(count)
    }

    /// Gives back reserved, never committed, grains.
    pub fn release(&self, start: u32, count: u32) {
        self.bits.write().release(start, count);
    }

    /// True if grains `start..start + count` are exactly one committed blob.
    pub fn is_live_blob(&self, start: u32, count: u32) -> bool {
        self.bits.read().is_live_blob(start, count)
    }

    /// A committed blob's grains (written by `sequence`) became live;
    /// `replayed` (at open, where nothing reserved them) also marks them
    /// busy.
    pub fn blob_committed(&self, start: u32, count: u32, replayed: bool, sequence: u64) {
        // The stamp before the bits: a reader that finds the blob live
        // finds its stamp.
        if let Some(stamps) = &self.stamps {
            stamps.set_live(start, sequence);
        }
        let mut bits = self.bits.write();
        if replayed {
            bits.mark_busy(start, count);
        }
        bits.set_live(start, count, true);
    }

    /// A blob was freed: its grains are no longer live. The reuse epoch
    /// moves after, so that a reader that saw the blob live before this
    /// does not cache it.
    pub fn blob_freed(&self, start: u32, count: u32) {
        self.bits.write().set_live(start, count, false);
        self.reuse_epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// Freed grains become reusable: the reuse epoch moves first, then
    /// they go back to the free space.
    pub fn freed_grains_reusable(&self, start: u32, count: u32) {
        self.reuse_epoch.fetch_add(1, Ordering::AcqRel);
        self.bits.write().release(start, count);
    }

    /// The reuse epoch: it moves whenever grains of this stratum are freed
    /// or become reusable, so a reader can tell that a grain it read may
    /// have been reused underneath it.
    pub fn reuse_epoch(&self) -> u64 {
        self.reuse_epoch.load(Ordering::Acquire)
    }

    /// A copy of the bitmaps.
    pub fn bits_snapshot(&self) -> StratumBits {
        self.bits.read().clone()
    }

    /// Runs `f` on the bitmaps under their read lock; `f` must take no
    /// lock (the bitmaps' lock is taken last, see `reclamation`).
    pub fn with_bits<R>(&self, f: impl FnOnce(&StratumBits) -> R) -> R {
        f(&self.bits.read())
    }

    /// The WAL checkpoint records a blob (written by `sequence`) in
    /// (`live`) or out of the durable bitmaps; the header must be written
    /// again.
    pub fn set_durable(&self, start: u32, count: u32, live: bool, sequence: u64) {
        if let (true, Some(stamps)) = (live, &self.stamps) {
            stamps.set_durable(start, sequence);
        }
        self.bits.write().set_durable(start, count, live);
        self.dirty.store(true, Ordering::Release);
    }

    /// The header must be written again (a checkpoint that wrote it failed).
    pub fn mark_dirty(&self) {
        self.dirty.store(true, Ordering::Release);
    }

    /// Whether the header must be written again; clears it.
    pub fn take_dirty(&self) -> bool {
        self.dirty.swap(false, Ordering::AcqRel)
    }

    /// Whether the durable bitmaps changed since the header was written.
    pub fn is_dirty(&self) -> bool {
        self.dirty.load(Ordering::Acquire)
    }

    /// Byte offset of grain `index`.
    pub fn offset_of(&self, index: u32) -> u64 {
        self.layout().grain_offset(self.basin, index)
    }

    /// How this stratum's blobs and headers are laid out.
    pub fn layout(&self) -> Layout {
        if self.sealer.is_some() {
            Layout::Sealed
        } else {
            Layout::Plain
        }
    }

    /// The store's sealing context, if it is encrypted.
    pub fn sealer(&self) -> Option<&Arc<Sealer>> {
        self.sealer.as_ref()
    }

    /// The stamp (low 32 bits of the writing sequence) of the blob
    /// committed at grain `index`, in a sealed stratum.
    pub fn stamp(&self, index: u32) -> Option<u32> {
        self.stamps.as_ref().map(|stamps| stamps.live(index))
    }

    /// The checkpointed stamps of `indexes`, in a sealed stratum (for
    /// `verify`).
    pub fn durable_stamps(&self, indexes: &std::collections::HashSet<u32>) -> Vec<(u32, u32)> {
        self.stamps
            .as_ref()
            .map(|stamps| stamps.durable_of(indexes))
            .unwrap_or_default()
    }

    /// The count of in-place rewrites begun and ended: odd while one runs.
    pub fn rewrites(&self) -> u64 {
        self.rewrites.load(Ordering::Acquire)
    }

    /// Rewrites, in place, the bytes of the blob at grain `start` (of
    /// `count` grains) written by `sequence`, if it is still that blob:
    /// `pieces` are (offset in the blob's image, bytes). Returns whether
    /// it wrote. Frees and reuse wait meanwhile (they take the bitmaps'
    /// write lock), so the blob cannot change under the write.
    pub fn rewrite_blob(
        &self,
        start: u32,
        count: u32,
        sequence: u64,
        pieces: &[(u64, &[u8])],
    ) -> std::io::Result<bool> {
        let bits = self.bits.read();
        let still = bits.is_live_blob(start, count)
            && self
                .stamps
                .as_ref()
                .is_some_and(|stamps| stamps.live(start) == sealed::stamp_of(sequence));
        if !still {
            return Ok(false);
        }
        self.rewrites.fetch_add(1, Ordering::AcqRel);
        let base = self.offset_of(start);
        let result = pieces
            .iter()
            .try_for_each(|(at, bytes)| self.file.write_all_at(bytes, base + at));
        self.rewrites.fetch_add(1, Ordering::AcqRel);
        drop(bits);
        result.map(|()| true)
    }

    /// Bytes per grain.
    pub fn grain_size(&self) -> u64 {
        grain_size(self.basin)
    }

    /// Writes the durable bitmaps into the older header copy (not synced).
    pub fn write_header(&self) -> Result<()> {
        let mut slot = self.header.lock();
        self.write_header_copy(slot.0, slot.1)?;
        *slot = (1 - slot.0, slot.1 + 1);
        Ok(())
    }

    /// Writes the header that [`Stratum::write_header`] wrote last into
    /// the other copy too (not synced), once that one is durable.
    ///
    /// The two copies protect against a torn header write, which can only
    /// hit the copy being written. Left one state apart, they would not
    /// protect against a durable copy that decays later: falling back to
    /// the other copy would silently forget every blob allocated since,
    /// and hand their grains out again. So after each checkpoint both hold
    /// the same state.
    ///
    /// It re-encodes the durable bitmaps rather than keeping the bytes
    /// written: only checkpoints change those bitmaps, and they run one at
    /// a time, so nothing can change them between the two writes.
    pub fn mirror_header(&self) -> Result<()> {
        let slot = self.header.lock();
        self.write_header_copy(slot.0, slot.1 - 1)
    }

    /// Writes both header copies again, every stamp page included, under
    /// the current key (`Database::rekey`), syncing after each; runs where
    /// checkpoints cannot (with the store locked).
    pub fn rewrite_headers(&self) -> Result<()> {
        let mut slot = self.header.lock();
        for (copy, generation) in [(slot.0, slot.1), (1 - slot.0, slot.1)] {
            self.write_header_copy_with(copy, generation, true)?;
            self.sync()?;
        }
        *slot = (1 - slot.0, slot.1 + 1);
        Ok(())
    }

    /// Writes the durable bitmaps, as `generation`, into copy `slot`.
    fn write_header_copy(&self, slot: usize, generation: u64) -> Result<()> {
        self.write_header_copy_with(slot, generation, false)
    }

    /// Writes the durable bitmaps, as `generation`, into copy `slot`; a
    /// sealed copy writes its changed stamp pages (every one, if `full`).
    fn write_header_copy_with(&self, slot: usize, generation: u64, full: bool) -> Result<()> {
        let (allocated, starts) = {
            let bits = self.bits.read();
            (bits.durable_allocated.clone(), bits.durable_starts.clone())
        };
        let header = StratumHeader {
            basin: self.basin,
            stratum: self.number,
            generation,
            allocated,
            starts,
        };
        match (&self.sealer, &self.stamps) {
            (Some(sealer), Some(stamps)) => {
                sealed::write_copy(&*self.file, sealer, &header, slot as u64, stamps, full)
            }
            _ => self.file.write_all_at(
                &header.encode(),
                slot as u64 * Layout::Plain.slot_size(self.basin),
            ),
        }
        .context(|| format!("writing header of {}", self.path.display()))
    }

    /// Reads both header copies as they are on disk now (for `verify`).
    pub fn read_copies(&self) -> std::io::Result<[std::result::Result<CopyState, CopyError>; 2]> {
        let sealed = self.sealer.as_deref().map(|sealer| {
            let file = self.stamps.as_ref().and_then(|stamps| stamps.file());
            (sealer, file)
        });
        read_copies(&*self.file, sealed, self.basin, self.number, &self.path)
    }

    /// Bytes of the stratum file, and of its stamps file if it has one.
    pub fn bytes_on_disk(&self) -> std::io::Result<u64> {
        let stamps = match self.stamps.as_ref().and_then(|stamps| stamps.file()) {
            Some(file) => file.len()?,
            None => 0,
        };
        Ok(self.file_len()? + stamps)
    }
}

/// Reads and decodes both header copies of a stratum file (sealed if
/// `sealed` gives the sealer and the stamps file); `path` names it in key
/// errors.
pub(crate) fn read_copies(
    file: &dyn FileHandle,
    sealed: Option<(&Sealer, Option<&dyn FileHandle>)>,
    basin: u8,
    number: u32,
    path: &Path,
) -> std::io::Result<[std::result::Result<CopyState, CopyError>; 2]> {
    let what = path.display();
    Ok([
        read_copy(file, sealed, basin, number, 0, &what)?,
        read_copy(file, sealed, basin, number, 1, &what)?,
    ])
}

/// A copy as [`newest`] takes it: a key error is returned, not taken for
/// damage.
fn header_result(
    copy: std::result::Result<CopyState, CopyError>,
) -> std::io::Result<std::result::Result<CopyState, HeaderError>> {
    match copy {
        Ok(state) => Ok(Ok(state)),
        Err(CopyError::Header(error)) => Ok(Err(error)),
        Err(CopyError::Key(error)) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        assert_eq!(parse_file_name(&file_name(3, 17)), Some((3, 17)));
        for junk in [
            "stratum-",
            "stratum-1",
            "stratum-1-",
            "stratum-a-1",
            "stratum-1-2-3",
            "index",
        ] {
            assert_eq!(parse_file_name(junk), None, "{junk}");
        }
    }

    /// Both copies as read; panics on a key error.
    fn copies(stratum: &Stratum) -> [std::result::Result<CopyState, HeaderError>; 2] {
        stratum.read_copies().unwrap().map(|copy| match copy {
            Ok(state) => Ok(state),
            Err(CopyError::Header(error)) => Err(error),
            Err(CopyError::Key(error)) => panic!("{error}"),
        })
    }

    fn alike(stratum: &Stratum) -> bool {
        match copies(stratum) {
            [Ok(a), Ok(b)] => a.same_state(&b),
            _ => false,
        }
    }

    #[test]
    fn header_copies_are_made_alike_and_either_one_is_enough() {
        let key = okaywal::encryption::StaticKey::new([3; 32]);
        let sealer = Arc::new(Sealer::new(Arc::new(key), [1; 16], &[]).unwrap());
        for sealer in [None, Some(&sealer)] {
            let fs = okaywal::fs::MemoryFileSystem::new();
            let dir = Path::new("/db");
            fs.create_dir_all(dir).unwrap();
            let path = dir.join(file_name(2, 0));
            let stratum = Stratum::create(&fs, dir, 2, 0, sealer).unwrap();
            let layout = stratum.layout();
            stratum.set_durable(3, 2, true, 7);
            stratum.write_header().unwrap();
            stratum.set_durable(1500, 1, true, 8);
            stratum.write_header().unwrap();
            let file = fs.open(&path, OpenMode::ReadWrite).unwrap();
            // Without a mirror, the copies are one state apart, as after a
            // crash between the two writes of a checkpoint.
            assert!(!alike(&stratum), "{layout:?}");
            // Opening keeps the newest state and catches the other copy up.
            let reopened = Stratum::open(&fs, dir, 2, 0, true, sealer).unwrap();
            assert_eq!(
                reopened.bits.read().durable_blobs(),
                vec![(3, 2), (1500, 1)]
            );
            assert!(alike(&reopened), "{layout:?}");
            if sealer.is_some() {
                assert_eq!(
                    (reopened.stamp(3), reopened.stamp(1500)),
                    (Some(7), Some(8))
                );
            }
            // A checkpoint writes one copy, then mirrors it into the other.
            reopened.set_durable(20, 4, true, 9);
            reopened.write_header().unwrap();
            reopened.mirror_header().unwrap();
            assert!(alike(&reopened), "{layout:?}");
            let all = vec![(3, 2), (20, 4), (1500, 1)];
            // Damage to either copy alone (its first part, or a sealed
            // copy's stamp page) loses nothing, and is repaired.
            let stamps_path = dir.join(sealed::stamps_file_name(2, 0));
            let mut spots = vec![(path.clone(), 40, layout.slot_size(2))];
            if layout == Layout::Sealed {
                let pages = u64::from(crate::format::stamp_pages(2)) * 4096;
                spots.push((stamps_path, 100, pages));
            }
            for (damaged, at, copy_size) in spots {
                let damaged = fs.open(&damaged, OpenMode::ReadWrite).unwrap();
                for slot in 0..2 {
                    damaged
                        .write_all_at(&[0xFF; 8], slot * copy_size + at)
                        .unwrap();
                    let opened = Stratum::open(&fs, dir, 2, 0, true, sealer).unwrap();
                    assert_eq!(opened.bits.read().durable_blobs(), all, "slot {slot}");
                    assert!(alike(&opened), "slot {slot}, {layout:?}");
                }
            }
            file.write_all_at(&[0xFF; 8], 40).unwrap();
            file.write_all_at(&[0xFF; 8], layout.slot_size(2) + 40)
                .unwrap();
            assert!(matches!(
                Stratum::open(&fs, dir, 2, 0, true, sealer),
                Err(Error::Corrupt { .. })
            ));
        }
    }

    #[test]
    fn a_sealed_header_under_a_wrong_key_is_a_key_error_and_left_alone() {
        let fs = okaywal::fs::MemoryFileSystem::new();
        let dir = Path::new("/db");
        fs.create_dir_all(dir).unwrap();
        let key = okaywal::encryption::StaticKey::new([3; 32]);
        let sealer = Arc::new(Sealer::new(Arc::new(key), [1; 16], &[]).unwrap());
        let stratum = Stratum::create(&fs, dir, 2, 0, Some(&sealer)).unwrap();
        stratum.set_durable(3, 2, true, 7);
        stratum.write_header().unwrap();
        let file = fs.open(&dir.join(file_name(2, 0)), OpenMode::Read).unwrap();
        let mut before = vec![0; file.len().unwrap() as usize];
        file.read_exact_at(&mut before, 0).unwrap();
        let wrong = okaywal::encryption::StaticKey::new([4; 32]);
        let wrong = Arc::new(Sealer::new(Arc::new(wrong), [1; 16], &[]).unwrap());
        let error = Stratum::open(&fs, dir, 2, 0, true, Some(&wrong)).unwrap_err();
        assert!(
            matches!(
                error.key_error(),
                Some(okaywal::encryption::KeyError::Wrong(id)) if id.get() == 1
            ),
            "{error}"
        );
        let mut after = vec![0; file.len().unwrap() as usize];
        file.read_exact_at(&mut after, 0).unwrap();
        assert!(before == after, "nothing was repaired");
    }
}
