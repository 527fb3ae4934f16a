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

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use okaywal::fs::{FileHandle, FileSystem, OpenMode};
use okaywal::GroupCommit;
use parking_lot::{Mutex, RwLock};

use crate::allocator::StratumBits;
use crate::error::{Context, Error, Result};
use crate::files::open_existing;
use crate::format::{
    grain_offset, grain_size, newest, stratum_capacity, stratum_slot_size, HeaderError,
    StratumHeader,
};

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
}

impl Stratum {
    /// Creates a new, empty stratum file and makes it durable (file and
    /// directory entry) before any grain in it is handed out.
    pub fn create(fs: &dyn FileSystem, directory: &Path, basin: u8, number: u32) -> Result<Self> {
        let path = directory.join(file_name(basin, number));
        let file = fs
            .open(&path, OpenMode::Create)
            .context(|| format!("creating stratum {}", path.display()))?;
        let mut header = StratumHeader::empty(basin, number);
        header.generation = 1;
        file.set_len(0)
            .and_then(|()| file.write_all_at(&header.encode(), 0))
            .and_then(|()| file.sync_data())
            .and_then(|()| fs.sync_dir(directory))
            .context(|| format!("initializing stratum {}", path.display()))?;
        Ok(Self::from_parts(basin, number, path, file, header, 0))
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
    ) -> Result<Self> {
        let path = directory.join(file_name(basin, number));
        let file = open_existing(fs, &path, writable)
            .context(|| format!("opening stratum {}", path.display()))?;
        let (first, second) = read_headers(&*file, basin, number)
            .context(|| format!("reading stratum {}", path.display()))?;
        let copies = [first.clone(), second.clone()];
        let (slot, header) =
            newest(first, second, |h| h.generation).map_err(|(a, b)| Error::Corrupt {
                path: path.clone(),
                what: format!("both stratum header copies are invalid ({a}; {b})"),
            })?;
        if writable && copies[1 - slot].as_ref() != Ok(&header) {
            // A checkpoint leaves both copies alike (see `mirror_header`),
            // so the other one was being written when a crash hit, or has
            // decayed since: make it a copy of the good one again, so that
            // damage to either one later loses nothing.
            file.write_all_at(
                &header.encode(),
                (1 - slot as u64) * stratum_slot_size(basin),
            )
            .and_then(|()| file.sync_data())
            .context(|| format!("repairing a header copy of {}", path.display()))?;
        }
        Ok(Self::from_parts(basin, number, path, file, header, slot))
    }

    /// A stratum whose creation a crash cut short, opened read-only: it
    /// holds no grains, and its file is left as it is.
    pub fn unfinished(
        fs: &dyn FileSystem,
        directory: &Path,
        basin: u8,
        number: u32,
    ) -> Result<Self> {
        let path = directory.join(file_name(basin, number));
        let file = fs
            .open(&path, OpenMode::Read)
            .context(|| format!("opening stratum {}", path.display()))?;
        let header = StratumHeader::empty(basin, number);
        Ok(Self::from_parts(basin, number, path, file, header, 0))
    }

    fn from_parts(
        basin: u8,
        number: u32,
        path: PathBuf,
        file: Arc<dyn FileHandle>,
        header: StratumHeader,
        newest_slot: usize,
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

    /// Reads and decodes both header copies, as they are on disk.
    pub fn read_headers(
        &self,
    ) -> std::io::Result<(
        Result<StratumHeader, HeaderError>,
        Result<StratumHeader, HeaderError>,
    )> {
        read_headers(&*self.file, self.basin, self.number)
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

    /// A committed blob's grains became live; `replayed` (at open, where
    /// nothing reserved them) also marks them busy.
    pub fn blob_committed(&self, start: u32, count: u32, replayed: bool) {
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

    /// The WAL checkpoint records a blob in (`live`) or out of the durable
    /// bitmaps; the header must be written again.
    pub fn set_durable(&self, start: u32, count: u32, live: bool) {
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
        grain_offset(self.basin, index)
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

    /// Writes the durable bitmaps, as `generation`, into copy `slot`.
    fn write_header_copy(&self, slot: usize, generation: u64) -> Result<()> {
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
        let offset = slot as u64 * stratum_slot_size(self.basin);
        self.file
            .write_all_at(&header.encode(), offset)
            .context(|| format!("writing header of {}", self.path.display()))
    }
}

/// Reads and decodes both header copies.
fn read_headers(
    file: &dyn FileHandle,
    basin: u8,
    number: u32,
) -> std::io::Result<(
    Result<StratumHeader, HeaderError>,
    Result<StratumHeader, HeaderError>,
)> {
    let slot = stratum_slot_size(basin);
    let len = file.len()?;
    let mut copies = Vec::with_capacity(2);
    for index in 0..2 {
        let start = index * slot;
        let available = len.saturating_sub(start).min(slot) as usize;
        let mut bytes = vec![0; available];
        file.read_exact_at(&mut bytes, start)?;
        copies.push(StratumHeader::decode(&bytes, basin, number));
    }
    let second = copies.pop().expect("two copies");
    let first = copies.pop().expect("two copies");
    Ok((first, second))
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

    #[test]
    fn header_copies_are_made_alike_and_either_one_is_enough() {
        let fs = okaywal::fs::MemoryFileSystem::new();
        let dir = Path::new("/db");
        fs.create_dir_all(dir).unwrap();
        let path = dir.join(file_name(2, 0));
        let stratum = Stratum::create(&fs, dir, 2, 0).unwrap();
        stratum.bits.write().set_durable(3, 2, true);
        stratum.write_header().unwrap();
        stratum.bits.write().set_durable(10, 1, true);
        stratum.write_header().unwrap();
        let file = fs.open(&path, OpenMode::ReadWrite).unwrap();
        // Without a mirror, the copies are one state apart, as after a
        // crash between the two writes of a checkpoint.
        let (first, second) = read_headers(&*file, 2, 0).unwrap();
        assert_ne!(first.unwrap(), second.unwrap());
        // Opening keeps the newest state and catches the other copy up.
        let reopened = Stratum::open(&fs, dir, 2, 0, true).unwrap();
        assert_eq!(reopened.bits.read().durable_blobs(), vec![(3, 2), (10, 1)]);
        let (first, second) = read_headers(&*file, 2, 0).unwrap();
        assert_eq!(first.unwrap(), second.unwrap());
        // A checkpoint writes one copy, then mirrors it into the other.
        reopened.bits.write().set_durable(20, 4, true);
        reopened.write_header().unwrap();
        reopened.mirror_header().unwrap();
        let (first, second) = read_headers(&*file, 2, 0).unwrap();
        assert_eq!(first.unwrap(), second.unwrap());
        let all = vec![(3, 2), (10, 1), (20, 4)];
        // Damage to either copy alone loses nothing, and is repaired.
        for slot in 0..2 {
            file.write_all_at(&[0xFF; 8], slot * stratum_slot_size(2) + 40)
                .unwrap();
            let opened = Stratum::open(&fs, dir, 2, 0, true).unwrap();
            assert_eq!(opened.bits.read().durable_blobs(), all, "slot {slot}");
            let (first, second) = read_headers(&*file, 2, 0).unwrap();
            assert_eq!(first.unwrap(), second.unwrap(), "slot {slot}");
        }
        file.write_all_at(&[0xFF; 8], 40).unwrap();
        file.write_all_at(&[0xFF; 8], stratum_slot_size(2) + 40)
            .unwrap();
        assert!(matches!(
            Stratum::open(&fs, dir, 2, 0, true),
            Err(Error::Corrupt { .. })
        ));
    }

    #[test]
    fn a_failed_sync_fails_every_later_one() {
        use okaywal::fs::{CrashFileSystem, FaultKind, Operation};
        let fs = CrashFileSystem::new();
        let dir = Path::new("/db");
        fs.create_dir_all(dir).unwrap();
        let stratum = Stratum::create(&fs, dir, 0, 0).unwrap();
        // Callers at once share syncs and all succeed.
        let before = fs.operation_count(Operation::Sync);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..10 {
                        stratum.sync().unwrap();
                    }
                });
            }
        });
        let syncs = fs.operation_count(Operation::Sync) - before;
        assert!((1..=40).contains(&syncs), "{syncs} syncs");

        let next = fs.operation_count(Operation::Sync);
        fs.inject(
            Operation::Sync,
            next,
            FaultKind::Error(std::io::ErrorKind::Other),
        );
        let own = stratum.sync().unwrap_err().to_string();
        assert!(own.starts_with("syncing /db/stratum-0-0"), "{own}");
        assert!(!own.contains("an fdatasync of this file failed"), "{own}");
        for _ in 0..2 {
            let later = stratum.sync().unwrap_err().to_string();
            assert!(later.starts_with("syncing /db/stratum-0-0"), "{later}");
            assert!(
                later.contains("an fdatasync of this file failed"),
                "{later}"
            );
        }
        assert_eq!(fs.operation_count(Operation::Sync), next + 1);
    }
}
