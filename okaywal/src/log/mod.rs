//! The log's front end ([`WriteAheadLog`]) and the state its threads
//! share ([`Inner`]).
//!
//! `Inner`'s methods are split by path: `append` (reserving, buffering and
//! writing records), `sync` (sync passes, end marks, naming segments, the
//! sync ledger), `open` (recovery's replay and the first active segment),
//! `handles` (what other modules may use), `waiters` (threads waiting
//! for writes in flight, woken one by one); this file keeps beginning
//! entries, reading chunks and making spares. `Inner`'s fields are private
//! to `log`; the rest of the crate goes through `handles`' named methods.
//! The impl is spread over these files, not split into types, because it
//! is one object's behaviour under one lock.
//!
//! Under the one state lock, [`State`] holds three owners, each opaque to
//! the others: [`Segments`] (active, live, spare and recycled segment
//! files, `crate::segments`), [`CheckpointStatus`] (`crate::checkpoint`),
//! and the entry bookkeeping kept here (next id, open entries, commits
//! not yet durable).
//!
//! # Lock order
//!
//! Outer before inner; no path takes them the other way round:
//!
//! 1. `naming` (held while new segments are renamed and the directory
//!    synced);
//! 2. `state` (the [`State`] mutex);
//! 3. everything that is only ever taken alone or innermost: the group
//!    commit's lock (then the failure record's), a segment's `end_mark`
//!    and `pending_name`, `maintenance_thread`, `legacy_files`, and the
//!    maintenance [`Signal`]'s.
//!
//! No file is written or synced with `state` held, except a new segment's
//! header (see `Segments::switch`), once per segment. A sync pass takes
//! its targets and buffered records under `state`, releases it, writes,
//! and runs `fdatasync` through the sync ledger.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::{JoinHandle, ThreadId};
use std::time::Duration;

use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::checkpoint::{self, CheckpointStatus};
use crate::config::Configuration;
use crate::failure::Failure;
use crate::format::HEADER_SIZE;
use crate::fs::{zero_fill, FileSystem, LockGuard, OpenMode};
use crate::group_commit::GroupCommit;
use crate::manager::LogManager;
use crate::position::LogPosition;
use crate::reader::{chunk_at, ChunkReader};
use crate::segment::{FileName, Segment, SyncHandles};
use crate::segments::{Segments, Spare};
use crate::stats::{Counters, LogStats};
use crate::tail::LogEntries;
use crate::tuning::{DRAIN_WAIT, MAX_UNCHECKPOINTED, MIN_PREALLOCATE_BYTES, STALL_WAIT};
use crate::writer::EntryWriter;
use crate::EntryId;
use sync::ledger::SyncLedger;
use waiters::HoleWaiters;

/// A write-ahead log: many threads append entries; each commit returns once
/// its entry is durable, and concurrent commits share one `fdatasync`.
///
/// Cloning is cheap and every clone refers to the same log.
#[derive(Debug, Clone)]
pub struct WriteAheadLog {
    pub(crate) inner: Arc<Inner>,
    /// Shared by every handle the user holds (not by the one the
    /// maintenance thread lends to `checkpoint_to`): when the last goes,
    /// the maintenance thread is stopped and joined.
    _owner: Option<Arc<Owner>>,
}

#[derive(Debug)]
struct Owner {
    inner: Arc<Inner>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        // Wait for the thread (and any checkpoint it is running) so that a
        // log reopened right after this drop never overlaps with it.
        {
            let mut state = self.inner.state.lock();
            state.begin_shutdown();
            self.inner.synced.notify_all();
        }
        self.inner.signal.stop();
        let handle = self.inner.maintenance.lock().take();
        if let Some(handle) = handle {
            if handle.thread().id() != std::thread::current().id() {
                let _ = handle.join();
            }
        }
    }
}

#[derive(Debug)]
pub(crate) struct Inner {
    config: Configuration,
    fs: Arc<dyn FileSystem>,
    state: Mutex<State>,
    /// Signalled when an in-flight write's header lands (a sync leader may
    /// be waiting for a hole below its own record to fill).
    progress: Condvar,
    /// Wakes the maintenance thread (which waits without holding the log).
    signal: Arc<Signal>,
    /// Signalled after every checkpoint attempt.
    checkpointed: Condvar,
    /// Signalled when a full active segment's last open entry finishes.
    drained: Condvar,
    /// The log's one failure state: the first write or sync error, which
    /// stops the log until it is reopened. Shared by `group` and `ledger`.
    failure: Arc<Failure>,
    group: GroupCommit,
    /// Every `fdatasync` of a segment file goes through it.
    ledger: SyncLedger,
    maintenance: Mutex<Option<JoinHandle<()>>>,
    maintenance_thread: Mutex<Option<ThreadId>>,
    counters: Counters,
    /// The highest entry id whose commit record has been written.
    last_committed_id: AtomicU64,
    /// Signalled after every completed sync (for readers tailing the log),
    /// and after buffered commits while `buffered_followers` is above 0.
    synced: Condvar,
    /// Readers of the live log that also take buffered entries.
    buffered_followers: std::sync::atomic::AtomicUsize,
    /// Rollbacks of the lowest open entry (they let readers move on).
    unblocking_rollbacks: AtomicU64,
    /// Held while segments are renamed and the directory synced.
    naming: Mutex<()>,
    /// Segments in the okaywal 0.2/0.3 format being checkpointed while
    /// the log opens, for `read_at` (see `crate::legacy`).
    legacy_files: Mutex<BTreeMap<u64, crate::legacy::OpenLegacyFile>>,
    /// Keeps other processes out of the directory while anything (a
    /// handle, the maintenance thread, a reader) can still write to it.
    _lock: LockGuard,
}

#[derive(Debug)]
pub(crate) struct State {
    /// The active, live and spare segments and their bookkeeping.
    pub(crate) segments: Segments,
    next_entry_id: u64,
    progress_waiters: usize,
    /// Sync passes waiting for the holes below their records to fill.
    hole_waiters: HoleWaiters,
    shutting_down: bool,
    /// The shutdown's end mark was written (or found not due).
    shutdown_marked: bool,
    /// The checkpointer's progress and last failure.
    pub(crate) checkpoints: CheckpointStatus,
    /// Entries begun and not yet committed or rolled back, with the thread
    /// that began each.
    open_ids: BTreeMap<u64, ThreadId>,
    /// Commit records written but perhaps not yet durable: entry id →
    /// (segment, offset just past the record). Durable ones are forgotten
    /// as later commits are added and when a reader of the live log looks.
    pending_commits: BTreeMap<u64, (u64, u64)>,
    /// The highest id of an entry committed in a segment that has been
    /// checkpointed and recycled (rolled-back entries do not count: a
    /// reader waiting at one has lost nothing). At open, the id before the
    /// first live segment: what an earlier run recycled is not known in
    /// more detail.
    recycled_through: u64,
}

/// True if the calling thread began an entry, still open, in the oldest
/// live segment (whose checkpoint every later one waits for). An entry
/// lives in the segment with the highest id not above its own: each
/// segment is named for the next entry id when it becomes active.
fn holds_oldest_segment(state: &State) -> bool {
    let Some(oldest) = state.segments.oldest_ids() else {
        return false;
    };
    let me = std::thread::current().id();
    state
        .open_ids
        .range(oldest)
        .any(|(_, thread)| *thread == me)
}

impl State {
    /// The log is shutting down (or its last handle is gone): no new
    /// commits, and the background threads stop.
    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down
    }

    /// Marks the log as shutting down.
    pub(crate) fn begin_shutdown(&mut self) {
        self.shutting_down = true;
    }

    /// A segment whose highest committed entry was `committed` has been
    /// checkpointed and recycled.
    pub(crate) fn note_recycled(&mut self, committed: Option<u64>) {
        self.recycled_through = self.recycled_through.max(committed.unwrap_or(0));
    }

    /// The highest id of an entry committed in a segment that has been
    /// checkpointed and recycled (at open: the id before the first live
    /// segment).
    pub(crate) fn recycled_through(&self) -> u64 {
        self.recycled_through
    }

    /// The lowest id below `below` of an entry the calling thread holds
    /// open.
    pub(crate) fn entry_held_by_this_thread(&self, below: u64) -> Option<u64> {
        let me = std::thread::current().id();
        self.open_ids
            .range(..below)
            .find(|(_, thread)| **thread == me)
            .map(|(id, _)| *id)
    }

    /// Forgets the oldest commit records while they are durable: done
    /// where a commit record is added, under the lock already held, so
    /// that the map stays as short as the commits in flight without a
    /// pass of its own after each sync. A durable record behind one that
    /// is not stays until that one is durable; readers see the same
    /// either way (see [`State::readable_through`]), and
    /// `Inner::prune_pending_commits` forgets them all.
    pub(crate) fn forget_durable_commits(&mut self) {
        while let Some(entry) = self.pending_commits.first_entry() {
            let (segment, end) = *entry.get();
            if !self.segments.durable_to(segment, end) {
                break;
            }
            entry.remove();
        }
    }

    /// The id through which a reader of the live log may move on: every
    /// entry up to it is finished, and every commit among them durable
    /// or, given `in_file` (per segment, where the records in the file
    /// end), in the file.
    pub(crate) fn readable_through(&self, in_file: Option<&HashMap<u64, u64>>) -> u64 {
        // A commit not yet durable holds the reader back; with buffered
        // entries, only one whose record is not in the file.
        let pending = match in_file {
            Some(in_file) => self
                .pending_commits
                .iter()
                .find(|(_, (segment, end))| in_file.get(segment).map_or(true, |limit| end > limit))
                .map(|(id, _)| id),
            None => self.pending_commits.keys().next(),
        };
        // Every entry up to here is finished, and every commit among them
        // readable: the reader may move past all of them.
        let blocked = [self.open_ids.keys().next(), pending]
            .into_iter()
            .flatten()
            .min()
            .copied()
            .unwrap_or(self.next_entry_id);
        blocked - 1
    }
}

impl Inner {
    pub fn directory(&self) -> &std::path::Path {
        &self.config.directory
    }

    /// The error every operation gets once the log has failed: the first
    /// failure's kind and message (see `crate::failure`).
    pub fn failed(&self) -> Option<io::Error> {
        self.failure.error(crate::failure::STOPPED)
    }

    pub fn check_usable(&self, state: &State) -> io::Result<()> {
        if let Some(err) = self.failed() {
            return Err(err);
        }
        if state.shutting_down {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                format!(
                    "the log in {} has been shut down",
                    self.directory().display()
                ),
            ));
        }
        Ok(())
    }

    /// Poisons the log after a failed write or sync and returns the error
    /// for the caller.
    pub fn poison(&self, err: io::Error) -> io::Error {
        self.group.fail(&err);
        let state = self.state.lock();
        self.progress.notify_all();
        state.hole_waiters.wake_all();
        self.signal.wake();
        self.checkpointed.notify_all();
        self.synced.notify_all();
        err
    }

    /// Starts a new entry in the active segment.
    pub fn begin(&self) -> io::Result<(u64, Arc<Segment>)> {
        let mut state = self.state.lock();
        self.check_usable(&state)?;
        // Writers that outrun the checkpointer wait for it instead of
        // filling the disk with segments (a write stall).
        // A failing checkpoint reports its error instead (through
        // `checkpoint_active`); stalling then would only hang the writers.
        // So would waiting on an entry this thread holds open in the oldest
        // segment: checkpoints go in order, and none can run before it
        // finishes.
        while state.segments.live_count() > MAX_UNCHECKPOINTED
            && !state.checkpoints.is_failing()
            && !holds_oldest_segment(&state)
            && *self.maintenance_thread.lock() != Some(std::thread::current().id())
        {
            self.checkpointed.wait_for(&mut state, STALL_WAIT);
            self.check_usable(&state)?;
        }
        if state.segments.active_is_full() {
            self.drain_active(&mut state)?;
        }
        if state.segments.active_is_full() {
            if state.segments.has_spare() {
                self.switch_segment(&mut state)?;
            } else {
                // Keep growing the full segment rather than stall every
                // writer on a zero-fill; the maintenance thread makes one.
                state.segments.ask_for_spare();
                self.signal.wake();
            }
        }
        let id = state.next_entry_id;
        state.next_entry_id = id.checked_add(1).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "every entry id up to u64::MAX has been used: ids go on above every id \
                     the log's file names in {} show (a stray file such as \
                     wal-18446744073709551615 leaves none)",
                    self.directory().display()
                ),
            )
        })?;
        state.open_ids.insert(id, std::thread::current().id());
        let segment = state.segments.begin_entry(id)?;
        Ok((id, segment))
    }

    /// Waits (briefly) for the entries still open in the full active
    /// segment to finish, so that it can be closed at a known end before
    /// the next segment starts: recovery relies on that end to never keep
    /// a later segment when an earlier one lost its tail. An entry held
    /// open longer than this only costs that check for one segment.
    fn drain_active(&self, state: &mut MutexGuard<'_, State>) -> io::Result<()> {
        let deadline = std::time::Instant::now() + DRAIN_WAIT;
        let active = state.segments.active_id();
        while state.segments.active_id() == active
            && state.segments.active_open_entries() > 0
            && *self.maintenance_thread.lock() != Some(std::thread::current().id())
        {
            if self.drained.wait_until(state, deadline).timed_out() {
                break;
            }
            self.check_usable(state)?;
        }
        Ok(())
    }

    /// Makes a spare the active segment, named for the next entry id.
    /// Must hold the state lock so ids and segments change together.
    /// The open entry `id` is used by `thread` now (its `EntryWriter`
    /// moved there).
    pub fn entry_moved(&self, id: u64, thread: ThreadId) {
        if let Some(holder) = self.state.lock().open_ids.get_mut(&id) {
            *holder = thread;
        }
    }

    pub fn switch_segment(&self, state: &mut State) -> io::Result<()> {
        if state.segments.switch(state.next_entry_id)? {
            self.signal.wake();
        }
        Ok(())
    }

    pub fn read_at(&self, position: LogPosition) -> io::Result<ChunkReader> {
        let legacy = self.legacy_files.lock().get(&position.file_id).cloned();
        if let Some(legacy) = legacy {
            return crate::legacy::read_at(&legacy, position);
        }
        // The chunk may still be in the write buffer: put it in the file.
        self.flush_segment(position.file_id)?;
        let (segment, limit) = {
            let mut state = self.state.lock();
            // Another thread (a sync leader, or a writer flushing a full
            // buffer) may have taken the record from the write buffer and
            // not written it yet: wait for it to land. Such writes are in
            // flight only briefly.
            self.wait_for_progress_while(&mut state, |state| {
                state
                    .segments
                    .header_pending(position.file_id, position.offset)
            })?;
            state.segments.readable(position.file_id).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "no live segment {} in {} (checkpointed and recycled, or never written)",
                        position.file_id,
                        self.directory().display()
                    ),
                )
            })?
        };
        let invalid = |why: &str| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("no chunk at {position}: {why}"),
            )
        };
        if position.offset < HEADER_SIZE || position.offset >= limit {
            return Err(invalid("offset is outside the segment's records"));
        }
        let mut reader = chunk_at(segment.file(), segment.layout(), position, limit)?;
        reader._segment = Some(segment);
        Ok(reader)
    }

    /// Creates a new zero-filled spare segment file.
    ///
    /// On a full disk (`StorageFull`) the file is emptied and filled again
    /// to half the size, down to `MIN_PREALLOCATE_BYTES`: a segment grows
    /// past its preallocation as records need, so a smaller file lets the
    /// log go on once a little space is free.
    pub fn create_spare(&self) -> io::Result<Spare> {
        let preallocated = self.config.preallocate_bytes.max(HEADER_SIZE);
        let (number, mut bytes) = {
            let mut state = self.state.lock();
            let number = state.segments.next_spare_number();
            (number, state.segments.spare_bytes(preallocated))
        };
        let path = FileName::Spare(number).path_in(self.directory());
        let file = self.fs.open(&path, OpenMode::CreateNew)?;
        let floor = MIN_PREALLOCATE_BYTES.max(HEADER_SIZE);
        let result = loop {
            match zero_fill(&*file, 0, bytes).and_then(|()| file.sync_data()) {
                Err(err) if err.kind() == io::ErrorKind::StorageFull && bytes / 2 >= floor => {
                    // Give the blocks back before asking for fewer.
                    if let Err(err) = file.set_len(0) {
                        break Err(err);
                    }
                    bytes /= 2;
                }
                filled => break filled,
            }
        };
        if let Err(err) = result {
            // Do not leave a half-filled file behind on ENOSPC.
            let _ = self.fs.remove_file(&path);
            return Err(io::Error::new(
                err.kind(),
                format!("preallocating segment file {}: {err}", path.display()),
            ));
        }
        Ok(Spare {
            sync_handles: SyncHandles::open(&*file),
            file,
            path,
            // Sized up for large entries: cut back once the log is idle.
            grown: bytes > preallocated,
        })
    }
}

impl WriteAheadLog {
    /// Opens (or creates) the log in `directory` with the default
    /// [`Configuration`], replaying existing entries through `manager`.
    pub fn recover<P: AsRef<std::path::Path>, Manager: LogManager>(
        directory: P,
        manager: Manager,
    ) -> io::Result<Self> {
        Configuration::default_for(directory).open(manager)
    }

    /// Begins a new entry. Its id is assigned now; the entry is durable
    /// once [`EntryWriter::commit`] returns `Ok`, and rolled back if the
    /// writer is dropped without committing.
    pub fn begin_entry(&self) -> io::Result<EntryWriter<'_>> {
        let (id, segment) = self.inner.begin()?;
        Ok(EntryWriter::new(self, EntryId(id), segment))
    }

    /// Returns a reader over the chunk written at `position`.
    ///
    /// Fails with `NotFound` if the chunk's segment was checkpointed and
    /// recycled, and with `InvalidData` if no chunk record starts there.
    pub fn read_at(&self, position: LogPosition) -> io::Result<ChunkReader> {
        self.inner.read_at(position)
    }

    /// Seals the active segment (if it holds anything) and waits until it
    /// and every older segment have been checkpointed through
    /// [`LogManager::checkpoint_to`]. A checkpoint that failed before is
    /// retried at once (the background retries back off up to 2 s); if it
    /// fails again, its error is returned.
    ///
    /// The checkpoint waits for every entry open in the segments it covers.
    /// If the calling thread holds one of them (began it, or last wrote a
    /// chunk of it after its `EntryWriter` moved here) and has not
    /// committed or rolled it back, it fails at once with
    /// [`io::ErrorKind::WouldBlock`] (naming the entry and its segment)
    /// instead of waiting forever for an entry that only this thread can
    /// finish; nothing is sealed then. Called from inside
    /// `checkpoint_to`, it only seals and does not wait.
    pub fn checkpoint_active(&self) -> io::Result<()> {
        checkpoint::checkpoint_active(self)
    }

    /// Stops the background thread after its current checkpoint and syncs
    /// what has been written. Later calls on any clone of this log fail
    /// with [`io::ErrorKind::BrokenPipe`] ([`read_at`](Self::read_at)
    /// excepted: the files stay open, and a chunk of a segment not yet
    /// checkpointed still reads), and so do chunk writes and commits of
    /// entries begun before (such an entry is never recovered; rolling it
    /// back still succeeds). Segments not yet checkpointed are replayed at
    /// the next open.
    pub fn shutdown(&self) -> io::Result<()> {
        checkpoint::shutdown(self)
    }

    /// Returns once every entry committed before this call (buffered ones
    /// included) is durable, with the highest such entry id. Entries of
    /// earlier runs count: after a reopen it is at least the highest
    /// recovered entry (or, with every segment checkpointed, the id through
    /// which earlier runs checkpointed).
    pub fn sync(&self) -> io::Result<EntryId> {
        let inner = &self.inner;
        let last = inner.last_committed_id.load(Ordering::Acquire);
        let segments: Vec<(Arc<Segment>, u64)> = {
            let state = inner.state.lock();
            inner.check_usable(&state)?;
            state.segments.reserved_ends()
        };
        for (segment, end) in segments {
            inner.wait_durable(&segment, end)?;
        }
        Ok(EntryId(last))
    }

    /// Iterates the committed entries with ids ≥ `from` that are still in
    /// live (not yet recycled) segments, in id order, while writers go on.
    /// By default only durable entries are returned (see
    /// [`LogEntries::include_buffered`]). An entry whose segment was
    /// checkpointed and recycled gives a `NotFound` error (after a reopen:
    /// any id below the first live segment); a rolled-back entry does not.
    /// A log opened with
    /// [`RecoveryMode::SkipCorrupted`](crate::RecoveryMode::SkipCorrupted)
    /// is read past damage as recovery read it. An error leaves the
    /// iterator where it was: calling it again retries, and no entry is
    /// skipped.
    ///
    /// Ids come out in order, so the iterator stops below the lowest entry
    /// still open in any thread (begun, not yet committed or rolled back):
    /// that entry may still commit. Entries with higher ids, durable or
    /// not, wait for it, even when `from` is above it; an entry held open
    /// for long (or an `EntryWriter` kept alive by mistake) holds every
    /// follower back for as long.
    ///
    /// The iterator walks each live segment once: every refill goes on
    /// from where the last one stopped and reads only what became durable
    /// since, so following a busy log costs about as much as its new
    /// bytes. (The first refill of a new iterator walks the live segments
    /// from their start.)
    #[must_use]
    pub fn entries_from(&self, from: EntryId) -> LogEntries {
        LogEntries::new(self.clone(), from)
    }

    /// The id the next [`WriteAheadLog::begin_entry`] would get at this
    /// moment: a lower bound for every id handed out later.
    #[must_use]
    pub fn next_entry_id(&self) -> EntryId {
        EntryId(self.inner.state.lock().next_entry_id)
    }

    /// The id of the oldest entry begun and not yet finished, if any: every
    /// entry begun with a lower id has been committed or rolled back. An
    /// entry is finished once its commit or rollback record is written (its
    /// commit may still be waiting for a sync then). A caller that needs
    /// every entry up to some id finished can watch this.
    #[must_use]
    pub fn oldest_open_entry(&self) -> Option<EntryId> {
        let state = self.inner.state.lock();
        state.open_ids.keys().next().map(|id| EntryId(*id))
    }

    /// Counters: commits, syncs and entries per sync, bytes, checkpoints
    /// and their durations, segments.
    #[must_use]
    pub fn stats(&self) -> LogStats {
        let (live, spares) = {
            let state = self.inner.state.lock();
            (
                state.segments.live_count() as u64,
                state.segments.spare_count() as u64,
            )
        };
        LogStats::from_counters(&self.inner.counters, live, spares)
    }

    /// The directory holding the segment files.
    #[must_use]
    pub fn directory(&self) -> &std::path::Path {
        self.inner.directory()
    }
}

impl WriteAheadLog {
    /// A handle for the maintenance thread's callbacks: it does not keep
    /// the thread running.
    pub(crate) fn borrowed(inner: Arc<Inner>) -> Self {
        Self {
            inner,
            _owner: None,
        }
    }
}

/// Wake-ups for the maintenance thread, kept outside [`Inner`] so the
/// thread can wait without keeping the log alive.
#[derive(Debug, Default)]
pub(crate) struct Signal {
    state: Mutex<(bool, bool)>,
    condvar: Condvar,
}

impl Signal {
    /// Asks the maintenance thread to look for work.
    pub fn wake(&self) {
        self.state.lock().0 = true;
        self.condvar.notify_all();
    }

    /// Asks the maintenance thread to exit.
    pub fn stop(&self) {
        self.state.lock().1 = true;
        self.condvar.notify_all();
    }

    /// Sleeps for `duration` unless stopped first; returns true if stopped.
    pub fn stopped_after(&self, duration: Duration) -> bool {
        // A duration too long to add to the clock waits until stopped.
        let deadline = std::time::Instant::now().checked_add(duration);
        let mut state = self.state.lock();
        while !state.1 {
            match deadline {
                Some(deadline) => {
                    if self.condvar.wait_until(&mut state, deadline).timed_out() {
                        break;
                    }
                }
                None => self.condvar.wait(&mut state),
            }
        }
        state.1
    }

    /// Waits for a wake-up or `timeout`; returns false once stopped.
    pub fn wait(&self, timeout: Duration) -> bool {
        let mut state = self.state.lock();
        if !state.0 && !state.1 {
            self.condvar.wait_for(&mut state, timeout);
        }
        state.0 = false;
        !state.1
    }
}

pub(crate) fn weak(log: &WriteAheadLog) -> Weak<Inner> {
    Arc::downgrade(&log.inner)
}

mod append;
mod handles;
mod open;
mod sync;
#[cfg(test)]
mod tests;
mod waiters;
