//! One segment file: its identity, how far it is durable, its name and its
//! end mark; and the names of the files in a log directory.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use std::io;

use crate::format::{RecordHeader, RecordKind};
use crate::fs::{FileHandle, FileSystem};
use crate::sealed::Layout;
use crate::tuning::SYNC_HANDLES;

/// A segment file while it is live (active, sealed or being checkpointed).
///
/// Its identity (`id`, `file`, `path`, `version_info`) never changes; how
/// far it is durable, whether its name is, and whether it owes an end
/// mark change only through its methods, which the sync path calls.
#[derive(Debug)]
pub(crate) struct Segment {
    /// The first entry id the segment may hold; also its name and CRC salt.
    id: u64,
    file: Arc<dyn FileHandle>,
    /// The segment's name, `wal-{id}`.
    path: PathBuf,
    /// The name the file still has (a spare's) until the first sync of the
    /// segment renames it to `path`: the header must be durable before the
    /// name is, or recovery would find a `wal-{id}` whose header was lost.
    pending_name: Mutex<Option<PathBuf>>,
    /// Every record below this offset is durable (the last completed sync);
    /// commits are acknowledged against it. The data of a large chunk may
    /// still have been in flight below it (its header was written first).
    synced_to: AtomicU64,
    /// Every byte below this offset is durable, large chunks' data
    /// included: the `durable_mark` written into record headers, which
    /// recovery takes as proof that damage below it is not a torn tail.
    marked_to: AtomicU64,
    /// The directory entry naming this file is durable.
    name_durable: AtomicBool,
    /// The data syncs of this file that are running, and how far the
    /// completed ones reached: a sync pass whose bytes a running sync
    /// covers waits for it instead of starting another.
    data_syncs: DataSyncs,
    /// Handles of the file's own that syncs use one at a time.
    sync_handles: SyncHandles,
    /// Whether this segment owes an end mark (FORMAT.md, "End marks"):
    /// the next segment started while entries were still open here, so its
    /// header could not record where this one ends. The lock is held for
    /// the mark's write only, so that a recycled file never gets one.
    end_mark: Mutex<EndMark>,
    /// The version information in the segment's header.
    version_info: Arc<Vec<u8>>,
    /// How its records are laid out: plain, or encrypted with its key and
    /// generation.
    layout: Layout,
}

impl Segment {
    /// A segment whose bytes below `durable_to` are durable. With a
    /// `pending_name` the file still has that (spare) name, and its real
    /// one becomes durable at its first sync pass.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: u64,
        file: Arc<dyn FileHandle>,
        sync_handles: SyncHandles,
        path: PathBuf,
        pending_name: Option<PathBuf>,
        durable_to: u64,
        version_info: Arc<Vec<u8>>,
        layout: Layout,
    ) -> Self {
        Self {
            id,
            file,
            path,
            name_durable: pending_name.is_none().into(),
            pending_name: Mutex::new(pending_name),
            synced_to: durable_to.into(),
            marked_to: durable_to.into(),
            data_syncs: DataSyncs::default(),
            sync_handles,
            end_mark: Mutex::new(EndMark::NotDue),
            version_info,
            layout,
        }
    }

    /// The first entry id the segment may hold; also its name and CRC salt.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The open segment file.
    pub fn file(&self) -> &Arc<dyn FileHandle> {
        &self.file
    }

    /// The segment's name, `wal-{id}`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `bytes` at `offset`, a range the caller reserved (through
    /// `Segments`); not synced.
    pub fn write_reserved(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(bytes, offset)
    }

    /// Starts the write-back of `len` bytes just written at `offset`,
    /// without waiting (see [`FileHandle::start_writeback`]). A hint: the
    /// sync that makes the bytes durable comes later, and an error here
    /// changes nothing about it, so none is returned.
    pub fn start_writeback(&self, offset: u64, len: u64) {
        let _ = self.file.start_writeback(offset, len);
    }

    /// The version information in the segment's header.
    pub fn version_info(&self) -> &Arc<Vec<u8>> {
        &self.version_info
    }

    /// How its records are laid out: plain, or encrypted with its key and
    /// generation.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Every record below this offset is durable.
    pub fn synced_to(&self) -> u64 {
        self.synced_to.load(Ordering::Acquire)
    }

    /// Every byte below this offset is durable, large chunks' data
    /// included: the durable mark for new record headers.
    pub fn marked_to(&self) -> u64 {
        self.marked_to.load(Ordering::Acquire)
    }

    /// The directory entry naming this file is durable.
    pub fn name_is_durable(&self) -> bool {
        self.name_durable.load(Ordering::Acquire)
    }

    /// A sync that covered the records below `written` (and, if it synced
    /// the file itself, every byte below `complete`) has completed.
    pub fn synced(&self, written: u64, complete: Option<u64>) {
        self.synced_to.fetch_max(written, Ordering::AcqRel);
        if let Some(complete) = complete {
            self.marked_to.fetch_max(complete, Ordering::AcqRel);
        }
    }

    /// Makes every record below `written` and every byte below `complete`
    /// durable (all of them are in the file): runs `sync` (the file's
    /// `fdatasync`, through the log's ledger), unless a sync that
    /// succeeded has covered them already, or, with [`Overlap::Join`], a
    /// data sync that started after those bytes were written is running:
    /// then it waits for that one and takes its outcome. When the segment
    /// closes, every sync pass of its last large entries' writers needs
    /// the whole file synced; one sync serves them all instead of one
    /// each. Group commits and checkpoints sync with [`Overlap::Own`]:
    /// they never wait for a sync that started before them (a checkpoint
    /// goes on as soon as its own sync ends).
    ///
    /// `sync` gets a handle of the file's own that no other sync uses
    /// meanwhile, if one is free (see [`SyncHandles`]), or `None`: then
    /// it syncs through [`Segment::file`], which other syncs share.
    ///
    /// A sync that fails leaves nothing covered: its waiters then run
    /// their own `sync`, which fails too once the log has failed.
    pub fn sync_data_through(
        &self,
        written: u64,
        complete: u64,
        overlap: Overlap,
        sync: impl FnOnce(Option<&dyn FileHandle>) -> io::Result<()>,
    ) -> io::Result<()> {
        let ticket = {
            let mut syncs = self.data_syncs.state.lock();
            loop {
                if syncs.reached(written, complete) {
                    return Ok(());
                }
                let covering = match overlap {
                    Overlap::Join => syncs.covering(written, complete),
                    Overlap::Own => None,
                };
                let Some((covering, ended)) = covering else {
                    break;
                };
                while syncs.is_running(covering) {
                    ended.wait(&mut syncs);
                }
            }
            syncs.start(written, complete)
        };
        let handle = self.sync_handles.take();
        let result = sync(handle.as_deref());
        if let Some(handle) = handle {
            self.sync_handles.give_back(handle);
        }
        let ended = self.data_syncs.state.lock().end(ticket, result.is_ok());
        if let Some(ended) = ended {
            ended.notify_all();
        }
        result
    }

    /// Gives the file its real name if it still has its spare one (the
    /// caller has synced its header, and syncs the directory next).
    pub fn rename_to_final(&self, fs: &dyn FileSystem) -> io::Result<()> {
        let mut pending = self.pending_name.lock();
        if let Some(from) = pending.as_ref() {
            fs.rename(from, &self.path)?;
            self.file.renamed(&self.path);
            self.sync_handles.renamed(&self.path);
            *pending = None;
        }
        Ok(())
    }

    /// Test access: the spare name the file still has.
    #[cfg(test)]
    pub fn pending_name(&self) -> Option<PathBuf> {
        self.pending_name.lock().clone()
    }

    /// The directory sync after [`Segment::rename_to_final`] completed.
    pub fn name_made_durable(&self) {
        self.name_durable.store(true, Ordering::Release);
    }

    /// The segment owes an end mark (see [`EndMark::Due`]).
    pub fn end_mark_due(&self) -> bool {
        *self.end_mark.lock() == EndMark::Due
    }

    /// The next segment started while entries were open here: an end
    /// mark is owed once this one is closed and durable.
    pub fn owe_end_mark(&self) {
        *self.end_mark.lock() = EndMark::Due;
    }

    /// The segment is being recycled: no end mark may be written into it.
    pub fn retire(&self) {
        *self.end_mark.lock() = EndMark::Retired;
    }

    /// Writes the end mark at `end` if one is owed: a padding record with
    /// no filler whose durable mark is `end` (FORMAT.md, "End marks").
    /// Returns false if none was owed. The caller syncs the file, then
    /// calls [`Segment::end_mark_written`].
    pub fn write_end_mark(&self, end: u64) -> io::Result<bool> {
        // Held for the write only: a sync pass that wants the same mark
        // writes the same bytes, and does not wait for this pass's sync to
        // do so; a retired file never gets one.
        let state = self.end_mark.lock();
        if *state != EndMark::Due {
            return Ok(false);
        }
        self.file.write_all_at(&self.end_mark_record(end)?, end)?;
        Ok(true)
    }

    /// An end mark at `end`: a padding record of no length, the segment's
    /// id as its entry id, and `end` as its durable mark.
    fn end_mark_record(&self, end: u64) -> io::Result<crate::sealed::EncodedHeader> {
        let mark = RecordHeader {
            kind: RecordKind::Padding,
            entry_id: self.id,
            length: 0,
            durable_mark: end,
        };
        self.layout.encode(&mark, 0, self.id, end)
    }

    /// Writes an end mark at `end` of the active segment at shutdown,
    /// once every byte below `end` is durable (the caller checked): the
    /// same record as [`Segment::write_end_mark`]'s. Recovery then tells
    /// damage below it from a torn tail, where otherwise nothing written
    /// after the last sync would prove those bytes were synced. Nothing is
    /// written after it; a rollback after the shutdown may overwrite it
    /// (losing only the proof).
    pub fn write_shutdown_mark(&self, end: u64) -> io::Result<()> {
        self.file.write_all_at(&self.end_mark_record(end)?, end)?;
        self.file.sync_data()
    }

    /// The end mark written by [`Segment::write_end_mark`] is durable.
    pub fn end_mark_written(&self) {
        let mut state = self.end_mark.lock();
        if *state == EndMark::Due {
            *state = EndMark::NotDue;
        }
    }

    /// Every byte below `end` is durable, and so is the file's name: what
    /// a commit whose record ends at `end` waits for. The one test of
    /// durability the log makes.
    pub fn is_durable_to(&self, end: u64) -> bool {
        self.synced_to() >= end && self.name_is_durable()
    }
}

/// What a sync pass does when a running sync of a segment already covers
/// what it needs (see [`Segment::sync_data_through`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Overlap {
    /// Wait for the running sync and take its outcome: large entries'
    /// writers, which sync on their own and overlap each other.
    Join,
    /// Sync anyway: group commits and checkpoints.
    Own,
}

/// Handles on one segment file, each an open file description of its
/// own (see [`FileHandle::sync_handle`]), lent to one sync at a
/// time: a sync through one of them learns of every failed write-back
/// since its handle's last sync by itself, so it need not wait for the
/// syncs it overlapped (`SyncLedger::run_alone`).
#[derive(Debug, Default)]
pub(crate) struct SyncHandles {
    free: Mutex<Vec<Arc<dyn FileHandle>>>,
}

impl SyncHandles {
    /// The file was renamed to `path` (see [`FileHandle::renamed`]); the
    /// handles lent out at this moment keep the old name.
    pub fn renamed(&self, path: &Path) {
        for handle in self.free.lock().iter() {
            handle.renamed(path);
        }
    }

    /// Opens up to [`SYNC_HANDLES`] handles on `file`, as many as the
    /// file system gives. They must be opened before any sync through the
    /// log could have seen a failure they would then miss: when the file
    /// is created or recycled, or the log opens it.
    pub fn open(file: &dyn FileHandle) -> Self {
        let mut free = Vec::new();
        while free.len() < SYNC_HANDLES {
            match file.sync_handle() {
                Ok(Some(handle)) => free.push(handle),
                // Fewer handles only mean more syncs through the shared one.
                Ok(None) | Err(_) => break,
            }
        }
        Self {
            free: Mutex::new(free),
        }
    }

    /// No handles: every sync goes through the shared one.
    pub fn none() -> Self {
        Self::default()
    }

    fn take(&self) -> Option<Arc<dyn FileHandle>> {
        self.free.lock().pop()
    }

    fn give_back(&self, handle: Arc<dyn FileHandle>) {
        self.free.lock().push(handle);
    }
}

/// The data syncs of one segment file that are running, and how far the
/// ones that succeeded reached.
#[derive(Debug, Default)]
struct DataSyncs {
    state: Mutex<RunningSyncs>,
}

/// A running sync: what it covers, and the threads that joined it.
#[derive(Debug)]
struct Running {
    ticket: u64,
    /// Records covered.
    written: u64,
    /// Bytes covered.
    complete: u64,
    /// Signalled when it ends; only the threads that joined this sync
    /// wait on it.
    ended: Arc<Condvar>,
}

#[derive(Debug, Default)]
struct RunningSyncs {
    /// The ticket of the next sync to start.
    next: u64,
    /// The syncs running.
    running: Vec<Running>,
    /// Every record below this offset was covered by a sync that succeeded.
    written: u64,
    /// Every byte below this offset was covered by a sync that succeeded.
    complete: u64,
}

impl RunningSyncs {
    /// A sync that succeeded covered `written` and `complete`.
    fn reached(&self, written: u64, complete: u64) -> bool {
        self.written >= written && self.complete >= complete
    }

    /// A running sync that covers `written` and `complete`: its ticket,
    /// and what signals its end.
    fn covering(&self, written: u64, complete: u64) -> Option<(u64, Arc<Condvar>)> {
        self.running
            .iter()
            .find(|sync| sync.written >= written && sync.complete >= complete)
            .map(|sync| (sync.ticket, sync.ended.clone()))
    }

    fn is_running(&self, ticket: u64) -> bool {
        self.running.iter().any(|sync| sync.ticket == ticket)
    }

    /// A sync covering `written` and `complete` starts; returns its ticket.
    fn start(&mut self, written: u64, complete: u64) -> u64 {
        let ticket = self.next;
        self.next += 1;
        self.running.push(Running {
            ticket,
            written,
            complete,
            ended: Arc::new(Condvar::new()),
        });
        ticket
    }

    /// The sync with `ticket` ended; if it `succeeded`, what it covered is
    /// durable. Returns what wakes the threads that joined it.
    fn end(&mut self, ticket: u64, succeeded: bool) -> Option<Arc<Condvar>> {
        let at = self.running.iter().position(|sync| sync.ticket == ticket)?;
        let sync = self.running.swap_remove(at);
        if succeeded {
            self.written = self.written.max(sync.written);
            self.complete = self.complete.max(sync.complete);
        }
        Some(sync.ended)
    }
}

/// Where a segment stands with its end mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EndMark {
    /// None is owed, or it is written and durable.
    NotDue,
    /// Owed: the next sync pass that finds the segment closed writes it.
    Due,
    /// The segment is being recycled: nothing may be written into it.
    Retired,
}

/// The file a running log holds locked (see `FileSystem::lock_exclusive`);
/// its contents are never read or written.
pub(crate) const LOCK_FILE: &str = "okaywal.lock";

/// What a file name in the log directory means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileName {
    /// `wal-{id}`: a segment whose first entry id is `id`.
    Segment(u64),
    /// `wal-recycled-{id}`: a checkpointed segment whose entry ids were at
    /// most `id`; reusable.
    Recycled(u64),
    /// `wal-spare-{n}`: a fresh preallocated file; reusable.
    Spare(u64),
}

impl FileName {
    pub fn parse(name: &str) -> Option<Self> {
        let rest = name.strip_prefix("wal-")?;
        // Decimal without padding, as the log writes them: `wal-01` is
        // another file, not a second name for `wal-1` (whose path the log
        // would build to open it).
        let number = |s: &str| -> Option<u64> {
            if s.is_empty()
                || !s.bytes().all(|b| b.is_ascii_digit())
                || (s.len() > 1 && s.starts_with('0'))
            {
                None
            } else {
                s.parse().ok()
            }
        };
        if let Some(id) = rest.strip_prefix("recycled-") {
            number(id).map(FileName::Recycled)
        } else if let Some(n) = rest.strip_prefix("spare-") {
            number(n).map(FileName::Spare)
        } else {
            number(rest).map(FileName::Segment)
        }
    }

    pub fn path_in(self, directory: &Path) -> PathBuf {
        directory.join(match self {
            FileName::Segment(id) => format!("wal-{id}"),
            FileName::Recycled(id) => format!("wal-recycled-{id}"),
            FileName::Spare(n) => format!("wal-spare-{n}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_round_trip() {
        for name in [
            FileName::Segment(1),
            FileName::Recycled(99),
            FileName::Spare(0),
        ] {
            let path = name.path_in(Path::new("d"));
            let file = path.file_name().unwrap().to_str().unwrap();
            assert_eq!(FileName::parse(file), Some(name));
        }
        for junk in [
            "wal-",
            "wal-x",
            "wal--1",
            "wal-1a",
            "index",
            "wal-spare-",
            "wal-+1",
            "wal-01",
            "wal-00",
            "wal-spare-01",
            "wal-recycled-0100",
        ] {
            assert_eq!(FileName::parse(junk), None, "{junk}");
        }
    }

    use std::sync::atomic::AtomicUsize;
    use std::sync::mpsc;
    use std::time::Duration;

    use crate::fs::{MemoryFileSystem, OpenMode};

    fn segment() -> Segment {
        let fs = MemoryFileSystem::new();
        fs.create_dir_all(Path::new("/")).expect("root");
        let file = fs
            .open(Path::new("/wal-1"), OpenMode::CreateNew)
            .expect("memory file");
        Segment::new(
            1,
            file,
            SyncHandles::none(),
            PathBuf::from("/wal-1"),
            None,
            0,
            Arc::default(),
            Layout::Plain,
        )
    }

    /// Starts a sync of `segment` through `written`/`complete` on a thread
    /// of `scope` that blocks until `release` is sent its outcome.
    fn blocked_sync<'scope>(
        scope: &'scope std::thread::Scope<'scope, '_>,
        segment: &'scope Segment,
        (written, complete): (u64, u64),
    ) -> (
        mpsc::Sender<io::Result<()>>,
        std::thread::ScopedJoinHandle<'scope, io::Result<()>>,
    ) {
        let (entered, wait_entered) = mpsc::channel();
        let (release, released) = mpsc::channel::<io::Result<()>>();
        let first = scope.spawn(move || {
            segment.sync_data_through(written, complete, Overlap::Join, |_| {
                entered.send(()).unwrap();
                released.recv().unwrap()
            })
        });
        wait_entered.recv().unwrap();
        (release, first)
    }

    #[test]
    fn a_sync_pass_covered_by_a_running_sync_waits_for_it_instead_of_syncing() {
        let segment = segment();
        let own_syncs = AtomicUsize::new(0);
        std::thread::scope(|s| {
            let (release, first) = blocked_sync(s, &segment, (100, 200));
            let covered = s.spawn(|| {
                segment.sync_data_through(90, 200, Overlap::Join, |_| {
                    own_syncs.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                })
            });
            std::thread::sleep(Duration::from_millis(50));
            assert!(!covered.is_finished(), "waits for the running sync");
            release.send(Ok(())).unwrap();
            first.join().unwrap().unwrap();
            covered.join().unwrap().unwrap();
        });
        assert_eq!(own_syncs.load(Ordering::SeqCst), 0, "no sync of its own");
        // What the finished sync covered needs no sync any more; more does.
        segment
            .sync_data_through(100, 200, Overlap::Join, |_| panic!("covered already"))
            .unwrap();
        segment
            .sync_data_through(100, 201, Overlap::Join, |_| {
                own_syncs.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
            .unwrap();
        assert_eq!(own_syncs.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_sync_pass_that_does_not_join_runs_its_own_beside_a_covering_one() {
        let segment = segment();
        std::thread::scope(|s| {
            let (release, first) = blocked_sync(s, &segment, (100, 200));
            let mut own = false;
            segment
                .sync_data_through(90, 200, Overlap::Own, |_| {
                    own = true;
                    Ok(())
                })
                .unwrap();
            assert!(own, "synced itself while the covering sync ran");
            release.send(Ok(())).unwrap();
            first.join().unwrap().unwrap();
        });
    }

    #[test]
    fn a_sync_pass_reaching_past_a_running_sync_runs_its_own_at_once() {
        let segment = segment();
        std::thread::scope(|s| {
            let (release, first) = blocked_sync(s, &segment, (100, 100));
            // Bytes the running sync started before: it cannot cover them.
            segment
                .sync_data_through(150, 150, Overlap::Join, |_| Ok(()))
                .unwrap();
            release.send(Ok(())).unwrap();
            first.join().unwrap().unwrap();
        });
    }

    #[test]
    fn when_the_covering_sync_fails_its_waiters_sync_themselves() {
        let segment = segment();
        let own_syncs = AtomicUsize::new(0);
        std::thread::scope(|s| {
            let (release, first) = blocked_sync(s, &segment, (100, 100));
            let waiter = s.spawn(|| {
                segment.sync_data_through(100, 100, Overlap::Join, |_| {
                    own_syncs.fetch_add(1, Ordering::SeqCst);
                    Err(io::Error::other("the log failed earlier"))
                })
            });
            std::thread::sleep(Duration::from_millis(50));
            release.send(Err(io::Error::other("EIO"))).unwrap();
            assert!(first.join().unwrap().is_err());
            let err = waiter.join().unwrap().unwrap_err();
            assert!(err.to_string().contains("failed earlier"), "{err}");
        });
        assert_eq!(own_syncs.load(Ordering::SeqCst), 1, "synced itself");
        // Nothing counts as covered after the failure.
        let err = segment
            .sync_data_through(50, 50, Overlap::Join, |_| {
                Err(io::Error::other("still failed"))
            })
            .unwrap_err();
        assert!(err.to_string().contains("still failed"), "{err}");
    }

    #[test]
    fn syncs_borrow_the_file_s_own_handles_one_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let fs = crate::fs::StdFileSystem;
        let file = fs
            .open(&dir.path().join("wal-1"), OpenMode::CreateNew)
            .unwrap();
        let handles = SyncHandles::open(&*file);
        assert_eq!(handles.free.lock().len(), SYNC_HANDLES);
        let segment = Segment::new(
            1,
            file,
            handles,
            dir.path().join("wal-1"),
            None,
            0,
            Arc::default(),
            Layout::Plain,
        );
        std::thread::scope(|s| {
            // Every handle lent out at once: the next sync gets none.
            let mut running = Vec::new();
            for n in 0..SYNC_HANDLES as u64 {
                let (entered, wait_entered) = mpsc::channel();
                let (release, released) = mpsc::channel::<()>();
                let segment = &segment;
                running.push((
                    release,
                    s.spawn(move || {
                        segment.sync_data_through(n + 1, n + 1, Overlap::Join, |handle| {
                            entered.send(handle.is_some()).unwrap();
                            released.recv().unwrap();
                            handle.unwrap().sync_data()
                        })
                    }),
                ));
                assert!(wait_entered.recv().unwrap(), "sync {n} got a handle");
            }
            segment
                .sync_data_through(100, 100, Overlap::Join, |handle| {
                    assert!(handle.is_none(), "none left");
                    Ok(())
                })
                .unwrap();
            for (release, sync) in running {
                release.send(()).unwrap();
                sync.join().unwrap().unwrap();
            }
        });
        assert_eq!(segment.sync_handles.free.lock().len(), SYNC_HANDLES);
    }
}
