//! The log: shared state, the write path's reservations, syncing, opening.

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::{JoinHandle, ThreadId};
use std::time::Duration;

use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::config::Configuration;
use crate::failure::{ErrorRecord, Failure};
use crate::format::{
    aligned_chunk_start, RecordHeader, RecordKind, SegmentHeader, CHUNK_ALIGNMENT,
    CHUNK_TRAILER_SIZE, HEADER_SIZE, RECORD_HEADER_SIZE,
};
use crate::fs::{zero_fill, FileHandle, FileSystem, LockGuard, OpenMode};
use crate::group_commit::GroupCommit;
use crate::manager::{LogManager, RecoveredSegment, Recovery};
use crate::position::LogPosition;
use crate::reader::ChunkReader;
use crate::recovery::{find_segments, FoundSegment, Look, SegmentReader};
use crate::segment::{EndMark, FileName, Segment, SegmentState, LOCK_FILE};
use crate::stats::{Counters, LogStats};
use crate::sync_ledger::SyncLedger;
use crate::tail::LogEntries;
use crate::writer::EntryWriter;
use crate::{checkpoint, EntryId};

/// Spare segment files kept for reuse; more are deleted after recycling.
pub(crate) const MAX_SPARES: usize = 2;
/// Live segments (active plus those waiting for their checkpoint) above
/// which `begin_entry` waits for the checkpointer.
const MAX_UNCHECKPOINTED: usize = 4;

/// The smallest size a spare segment file is preallocated to when the disk
/// is too full for `Configuration::preallocate_bytes` (see
/// `Inner::create_spare`).
const MIN_PREALLOCATE_BYTES: u64 = 64 << 10;

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
            state.shutting_down = true;
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
    pub config: Configuration,
    pub fs: Arc<dyn FileSystem>,
    pub state: Mutex<State>,
    /// Signalled when an in-flight write's header lands (a sync leader may
    /// be waiting for a hole below its own record to fill).
    pub progress: Condvar,
    /// Wakes the maintenance thread (which waits without holding the log).
    pub signal: Arc<Signal>,
    /// Signalled after every checkpoint attempt.
    pub checkpointed: Condvar,
    /// Signalled when a full active segment's last open entry finishes.
    pub drained: Condvar,
    /// The log's one failure state: the first write or sync error, which
    /// stops the log until it is reopened. Shared by `group` and `ledger`.
    pub failure: Arc<Failure>,
    pub group: GroupCommit,
    /// Every `fdatasync` of a segment file goes through it.
    pub ledger: SyncLedger,
    pub maintenance: Mutex<Option<JoinHandle<()>>>,
    pub maintenance_thread: Mutex<Option<ThreadId>>,
    pub counters: Counters,
    /// The highest entry id whose commit record has been written.
    pub last_committed_id: AtomicU64,
    /// Signalled after every completed sync (for readers tailing the log),
    /// and after buffered commits while `buffered_followers` is above 0.
    pub synced: Condvar,
    /// Readers of the live log that also take buffered entries.
    pub buffered_followers: std::sync::atomic::AtomicUsize,
    /// Rollbacks of the lowest open entry (they let readers move on).
    pub unblocking_rollbacks: AtomicU64,
    /// Held while segments are renamed and the directory synced.
    pub naming: Mutex<()>,
    /// Segments in the okaywal 0.2/0.3 format being checkpointed while
    /// the log opens, for `read_at` (see `crate::legacy`).
    pub legacy_files: Mutex<BTreeMap<u64, crate::legacy::OpenLegacyFile>>,
    /// Keeps other processes out of the directory while anything (a
    /// handle, the maintenance thread, a reader) can still write to it.
    pub _lock: LockGuard,
}

#[derive(Debug)]
pub(crate) struct Spare {
    pub file: Arc<dyn FileHandle>,
    pub path: PathBuf,
}

#[derive(Debug)]
pub(crate) struct State {
    pub next_entry_id: u64,
    pub active: u64,
    /// Every live segment: active, sealed with open entries, or waiting to
    /// be checkpointed.
    pub segments: BTreeMap<u64, SegmentState>,
    pub spares: Vec<Spare>,
    /// Checkpointed segments waiting for their last reader to finish.
    pub recycling: Vec<(Arc<Segment>, PathBuf)>,
    pub next_spare_number: u64,
    pub progress_waiters: usize,
    pub want_spare: bool,
    pub shutting_down: bool,
    /// Why the last checkpoint attempt (or the making of a spare) failed,
    /// with the error's kind; cleared by the next successful checkpoint.
    /// Unlike the log's `failure` it does not stop the log: a failed
    /// checkpoint is retried.
    pub checkpoint_error: Option<ErrorRecord>,
    pub checkpoint_attempts: u64,
    /// A caller of `checkpoint_active` is waiting: retry a failed
    /// checkpoint now rather than after the backoff.
    pub checkpoint_requested: bool,
    /// The id of the segment being checkpointed right now.
    pub checkpointing: Option<u64>,
    /// Entries begun and not yet committed or rolled back, with the thread
    /// that began each.
    pub open_ids: BTreeMap<u64, ThreadId>,
    /// Commit records written but perhaps not yet durable: entry id →
    /// (segment, offset just past the record). Pruned after every sync.
    pub pending_commits: BTreeMap<u64, (u64, u64)>,
    /// The highest id of an entry committed in a segment that has been
    /// checkpointed and recycled (rolled-back entries do not count: a
    /// reader waiting at one has lost nothing). At open, the id before the
    /// first live segment: what an earlier run recycled is not known in
    /// more detail.
    pub recycled_through: u64,
    /// White-box tests stop the background checkpointer from taking
    /// segments whose bookkeeping they are still looking at.
    #[cfg(test)]
    pub checkpoints_paused: bool,
}

/// True if the calling thread began an entry, still open, in the oldest
/// live segment (whose checkpoint every later one waits for). An entry
/// lives in the segment with the highest id not above its own: each
/// segment is named for the next entry id when it becomes active.
fn holds_oldest_segment(state: &State) -> bool {
    let mut ids = state.segments.keys();
    let Some(&oldest) = ids.next() else {
        return false;
    };
    let next = ids.next().copied().unwrap_or(u64::MAX);
    let me = std::thread::current().id();
    state
        .open_ids
        .range(oldest..next)
        .any(|(_, thread)| *thread == me)
}

impl State {
    fn live(&mut self, segment: u64) -> io::Result<&mut SegmentState> {
        self.segments
            .get_mut(&segment)
            .ok_or_else(|| io::Error::other(format!("segment {segment} is no longer live")))
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
        let _state = self.state.lock();
        self.progress.notify_all();
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
        while state.segments.len() > MAX_UNCHECKPOINTED
            && state.checkpoint_error.is_none()
            && !holds_oldest_segment(&state)
            && *self.maintenance_thread.lock() != Some(std::thread::current().id())
        {
            self.checkpointed
                .wait_for(&mut state, Duration::from_millis(100));
            self.check_usable(&state)?;
        }
        if state.segments[&state.active].full {
            self.drain_active(&mut state)?;
        }
        if state.segments[&state.active].full {
            if state.spares.is_empty() {
                // Keep growing the full segment rather than stall every
                // writer on a zero-fill; the maintenance thread makes one.
                state.want_spare = true;
                self.signal.wake();
            } else {
                self.switch_segment(&mut state)?;
            }
        }
        let id = state.next_entry_id;
        state.next_entry_id = id.checked_add(1).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "every entry id up to u64::MAX has been used",
            )
        })?;
        state.open_ids.insert(id, std::thread::current().id());
        let active = state.active;
        let segment = state.live(active)?;
        segment.open_entries += 1;
        segment.last_entry_id = Some(id);
        segment.highest_id = id;
        Ok((id, segment.segment.clone()))
    }

    /// Waits (briefly) for the entries still open in the full active
    /// segment to finish, so that it can be closed at a known end before
    /// the next segment starts: recovery relies on that end to never keep
    /// a later segment when an earlier one lost its tail. An entry held
    /// open longer than this only costs that check for one segment.
    fn drain_active(&self, state: &mut MutexGuard<'_, State>) -> io::Result<()> {
        const DRAIN_WAIT: Duration = Duration::from_millis(100);
        let deadline = std::time::Instant::now() + DRAIN_WAIT;
        let active = state.active;
        while state.active == active
            && state.segments[&active].open_entries > 0
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
    pub fn switch_segment(&self, state: &mut State) -> io::Result<()> {
        let spare = state
            .spares
            .pop()
            .ok_or_else(|| io::Error::other("no spare segment file available"))?;
        let id = state.next_entry_id;
        crate::trace::span!(INFO, "switch_segment", segment = id);
        let path = FileName::Segment(id).path_in(self.directory());
        let previous = state
            .segments
            .get(&state.active)
            .filter(|old| old.segment.id != 0 && old.open_entries == 0)
            .map(|old| (old.segment.id, old.reserved_end));
        let header = SegmentHeader {
            first_entry_id: id,
            previous,
            version_info: self.config.version_info.to_vec(),
        }
        .encode();
        // The file keeps its spare name until the first sync pass renames
        // it (see `sync_targets`), but the header is synced now, before any
        // record salted with `id` can reach the file: records that reach
        // the disk without it would, after a crash, sit in a file no header
        // ties to `id`; the next run could then start a segment with the
        // same id in that file, and those records would verify again past
        // its own, bringing back entries that had vanished. One sync per
        // segment. On failure the spare is dropped; the next open sorts out
        // whatever is left on disk.
        spare.file.write_all_at(&header, 0)?;
        spare.file.sync_data()?;
        let old = state.active;
        let old_state = state.live(old)?;
        old_state.sealed = true;
        if previous.is_none() && old != 0 {
            *old_state.segment.end_mark.lock() = EndMark::Due;
        }
        if old_state.ready_for_checkpoint() {
            self.signal.wake();
        }
        let segment = Arc::new(Segment {
            id,
            file: spare.file,
            path,
            pending_name: Mutex::new(Some(spare.path)),
            synced_to: 0.into(),
            marked_to: 0.into(),
            name_durable: false.into(),
            end_mark: Mutex::new(EndMark::NotDue),
            version_info: self.config.version_info.clone(),
        });
        state
            .segments
            .insert(id, SegmentState::new(segment, HEADER_SIZE));
        state.active = id;
        if state.spares.is_empty() {
            // Made once this segment is half full (see `spare_due`), not
            // now: a new log's first commits need the disk to themselves.
            state.want_spare = true;
        }
        Ok(())
    }

    /// Wakes the maintenance thread to make the next spare when a write
    /// from `from` to `to` in the active segment crosses its half.
    fn spare_due(&self, state: &State, from: u64, to: u64) {
        let half = self.config.checkpoint_after_bytes / 2;
        if state.want_spare && from < half && to >= half {
            self.signal.wake();
        }
    }

    /// Reserves `len` bytes in `segment` for a large chunk record; returns
    /// the offset and the durable mark to write into the record's header.
    /// The chunk's data counts as in flight until [`Inner::data_written`].
    pub fn reserve(&self, segment: u64, len: u64) -> io::Result<(u64, u64)> {
        let mut state = self.state.lock();
        self.check_usable(&state)?;
        let active = state.active;
        let checkpoint_after = self.config.checkpoint_after_bytes;
        let seg = state.live(segment)?;
        let offset = seg.reserved_end;
        seg.reserved_end += len;
        seg.in_flight.insert(offset, seg.reserved_end);
        seg.data_in_flight.insert(offset);
        Counters::add(&self.counters.bytes_written, len);
        if segment == active && seg.reserved_end >= checkpoint_after {
            seg.full = true;
        }
        let end = seg.reserved_end;
        let mark = seg.segment.marked_to.load(Ordering::Acquire);
        if segment == active {
            self.spare_due(&state, offset, end);
        }
        Ok((offset, mark))
    }

    /// Reserves room for a chunk record whose data the caller writes into
    /// the file itself, and puts the record's header and CRC trailer into
    /// the segment's write buffer in the same critical section: the record
    /// is never a hole for other committers' syncs (the next sync pass
    /// writes both with its other buffered records), and the writer's only
    /// system call is the `pwrite` of its data, which runs outside the lock
    /// in parallel with other writers'. The data counts as in flight until
    /// [`Inner::data_written`]. The record is placed so that its data
    /// starts on a page, after a padding record when needed (see
    /// `aligned_chunk_start`). Returns the record's offset.
    pub fn reserve_chunk(
        &self,
        segment: &Arc<Segment>,
        header: RecordHeader,
        crc: u32,
    ) -> io::Result<u64> {
        let mut state = self.state.lock();
        self.check_usable(&state)?;
        let active = state.active;
        let seg = state.live(segment.id)?;
        let mark = seg.segment.marked_to.load(Ordering::Acquire);
        let free = seg.reserved_end;
        let (pad, offset) = aligned_chunk_start(free);
        if pad > 0 {
            // Parallel writers of large chunks then never share a page,
            // and each data `pwrite` covers whole pages: concurrent
            // writes into one page serialise on its lock in the kernel,
            // and every sync would write the shared page again.
            let padding = RecordHeader {
                kind: RecordKind::Padding,
                entry_id: header.entry_id,
                length: (pad - RECORD_HEADER_SIZE as u64) as u32,
                durable_mark: mark,
            };
            let zeros = [0_u8; 2 * CHUNK_ALIGNMENT as usize];
            seg.buffer(
                free,
                &[
                    &padding.encode(segment.id),
                    &zeros[..padding.length as usize],
                ],
            );
            Counters::add(&self.counters.bytes_written, pad);
        }
        let header = RecordHeader {
            durable_mark: mark,
            ..header
        };
        let record_len = header.record_len();
        seg.reserved_end = offset + record_len;
        seg.data_in_flight.insert(offset);
        seg.buffer(offset, &[&header.encode(segment.id)]);
        seg.buffer(
            offset + record_len - CHUNK_TRAILER_SIZE as u64,
            &[&crc.to_le_bytes()],
        );
        Counters::add(&self.counters.bytes_written, record_len);
        if segment.id == active && seg.reserved_end >= self.config.checkpoint_after_bytes {
            seg.full = true;
        }
        let end = seg.reserved_end;
        let flush = (seg.buffered_bytes >= self.config.buffer_bytes).then(|| seg.take_buffered());
        if segment.id == active {
            self.spare_due(&state, free, end);
        }
        drop(state);
        if let Some(ranges) = flush {
            self.write_ranges(segment, ranges)?;
        }
        Ok(offset)
    }

    /// Reserves room for a small record and copies it into the segment's
    /// write buffer in the same critical section, so it never leaves a
    /// hole; optionally finishes the entry that wrote it. Returns the
    /// record's offset.
    pub fn append(
        &self,
        segment: &Arc<Segment>,
        header: RecordHeader,
        data: Option<(&[u8], u32)>,
        finishes_entry: bool,
    ) -> io::Result<u64> {
        let mut state = self.state.lock();
        // After `shutdown` no chunk or commit is taken any more (its sync
        // has run, and it promised that later calls fail); a rollback
        // still finishes its entry.
        let refused = match header.kind {
            RecordKind::Rollback => None,
            _ => self.check_usable(&state).err(),
        };
        if finishes_entry {
            if header.kind == RecordKind::Rollback
                && state.open_ids.keys().next() == Some(&header.entry_id)
            {
                self.unblocking_rollbacks.fetch_add(1, Ordering::AcqRel);
                self.synced.notify_all();
            }
            state.open_ids.remove(&header.entry_id);
        }
        let active = state.active;
        let seg = state.live(segment.id)?;
        if finishes_entry {
            seg.open_entries -= 1;
            if seg.full && seg.open_entries == 0 {
                self.drained.notify_all();
            }
        }
        if let Some(err) = self.failed().or(refused) {
            return Err(err);
        }
        let offset = seg.reserved_end;
        let header = RecordHeader {
            durable_mark: seg.segment.marked_to.load(Ordering::Acquire),
            ..header
        };
        seg.reserved_end += header.record_len();
        Counters::add(&self.counters.bytes_written, header.record_len());
        let record_end = seg.reserved_end;
        if header.kind == RecordKind::Commit {
            seg.highest_committed_id = seg.highest_committed_id.max(Some(header.entry_id));
            Counters::add(&self.counters.unsynced_commits, 1);
            self.last_committed_id
                .fetch_max(header.entry_id, Ordering::AcqRel);
        }
        let encoded = header.encode(segment.id);
        match data {
            Some((bytes, crc)) => seg.buffer(offset, &[&encoded, bytes, &crc.to_le_bytes()]),
            None => seg.buffer(offset, &[&encoded]),
        }
        if segment.id == active && seg.reserved_end >= self.config.checkpoint_after_bytes {
            seg.full = true;
        }
        if seg.ready_for_checkpoint() {
            self.signal.wake();
        }
        let flush = (seg.buffered_bytes >= self.config.buffer_bytes).then(|| seg.take_buffered());
        if header.kind == RecordKind::Commit {
            state
                .pending_commits
                .insert(header.entry_id, (segment.id, record_end));
        }
        if segment.id == active {
            self.spare_due(&state, offset, record_end);
        }
        drop(state);
        if let Some(ranges) = flush {
            self.write_ranges(segment, ranges)?;
        }
        Ok(offset)
    }

    /// Writes ranges taken with `take_buffered` and marks them written.
    pub fn write_ranges(
        &self,
        segment: &Arc<Segment>,
        ranges: Vec<(u64, Vec<u8>)>,
    ) -> io::Result<()> {
        let mut result = Ok(());
        for (start, data) in &ranges {
            if let Err(err) = segment.file.write_all_at(data, *start) {
                result = Err(self.poison(err));
                break;
            }
        }
        let mut state = self.state.lock();
        if let Some(seg) = state.segments.get_mut(&segment.id) {
            for (start, _) in &ranges {
                seg.in_flight.remove(start);
            }
            if seg.ready_for_checkpoint() {
                self.signal.wake();
            }
        }
        if state.progress_waiters > 0 {
            self.progress.notify_all();
        }
        result
    }

    /// Writes whatever `segment` has buffered.
    pub fn flush_segment(&self, segment: u64) -> io::Result<()> {
        let taken = {
            let mut state = self.state.lock();
            state
                .segments
                .get_mut(&segment)
                .filter(|seg| !seg.buffered.is_empty())
                .map(|seg| (seg.segment.clone(), seg.take_buffered()))
        };
        match taken {
            Some((segment, ranges)) => self.write_ranges(&segment, ranges),
            None => Ok(()),
        }
    }

    /// Writes whatever a closed `segment` has buffered and waits until
    /// every write into it has landed, including buffered records another
    /// thread took for writing just before (a sync leader or a flushing
    /// writer): only then is the file whole, to be read by a checkpoint.
    pub fn settle_segment(&self, segment: u64) -> io::Result<()> {
        self.flush_segment(segment)?;
        let mut state = self.state.lock();
        self.wait_for_progress_while(&mut state, |state| {
            state
                .segments
                .get(&segment)
                .is_some_and(|seg| !seg.in_flight.is_empty() || !seg.data_in_flight.is_empty())
        })
    }

    /// Waits, with `state` released meanwhile, until `busy` is false: for
    /// writes in flight to land. Fails once a sync has failed (the writes
    /// waited for may never land).
    fn wait_for_progress_while(
        &self,
        state: &mut MutexGuard<'_, State>,
        busy: impl Fn(&State) -> bool,
    ) -> io::Result<()> {
        while busy(state) {
            if let Some(err) = self.failed() {
                return Err(err);
            }
            state.progress_waiters += 1;
            self.progress.wait_for(state, Duration::from_millis(10));
            state.progress_waiters -= 1;
        }
        Ok(())
    }

    /// Marks the reservation at `offset` as written (its header is in the
    /// file), optionally finishing the entry that made it.
    pub fn complete(&self, segment: u64, offset: Option<u64>, finished_entry: Option<u64>) {
        let mut state = self.state.lock();
        if let Some(id) = finished_entry {
            if state.open_ids.keys().next() == Some(&id) {
                self.unblocking_rollbacks.fetch_add(1, Ordering::AcqRel);
                self.synced.notify_all();
            }
            state.open_ids.remove(&id);
        }
        let finishes_entry = finished_entry.is_some();
        let Some(seg) = state.segments.get_mut(&segment) else {
            return;
        };
        if let Some(offset) = offset {
            seg.in_flight.remove(&offset);
        }
        if finishes_entry {
            seg.open_entries -= 1;
            if seg.ready_for_checkpoint() {
                self.signal.wake();
            }
            if seg.full && seg.open_entries == 0 {
                self.drained.notify_all();
            }
        }
        if state.progress_waiters > 0 {
            self.progress.notify_all();
        }
    }

    /// Marks the data of the large chunk reserved at `offset` as written
    /// (or abandoned: a chunk whose data never lands fails its CRC, and its
    /// entry cannot commit).
    pub fn data_written(&self, segment: u64, offset: u64) {
        let mut state = self.state.lock();
        if let Some(seg) = state.segments.get_mut(&segment) {
            seg.data_in_flight.remove(&offset);
        }
        if state.progress_waiters > 0 {
            self.progress.notify_all();
        }
    }

    /// Returns once every byte below `end` in `segment` is durable.
    pub fn wait_durable(&self, segment: &Arc<Segment>, end: u64) -> io::Result<()> {
        self.group.wait(
            || {
                segment.synced_to.load(Ordering::Acquire) >= end
                    && segment.name_durable.load(Ordering::Acquire)
            },
            || self.sync_pass(segment.id, end),
        )
    }

    /// A sync pass of the caller's own, outside the group commit, unless
    /// `end` is durable already: for large entries, whose writers gain
    /// more from overlapping syncs than from sharing one. Concurrent sync
    /// passes are safe: each covers what was written before it started.
    pub fn sync_own(&self, segment: &Arc<Segment>, end: u64) -> io::Result<()> {
        if segment.synced_to.load(Ordering::Acquire) >= end
            && segment.name_durable.load(Ordering::Acquire)
        {
            return Ok(());
        }
        self.sync_pass(segment.id, end)
    }

    /// Returns once every record below `end` in `segment` (and every
    /// record of earlier closed segments) is in the file, i.e. handed to the
    /// operating system: what a buffered commit promises.
    pub fn hand_to_os(&self, segment: u64, end: u64) -> io::Result<()> {
        let mut state = self.state.lock();
        self.wait_for_holes(&mut state, segment, end)?;
        let mut writes = Vec::new();
        for seg in state.segments.range_mut(..=segment).map(|(_, s)| s) {
            if !seg.buffered.is_empty() {
                writes.push((seg.segment.clone(), seg.take_buffered()));
            }
        }
        let unnamed = state
            .segments
            .range(..=segment)
            .any(|(_, seg)| !seg.segment.name_durable.load(Ordering::Acquire));
        drop(state);
        for (segment, ranges) in writes {
            self.write_ranges(&segment, ranges)?;
        }
        if unnamed {
            // A segment file gets its name only once its header is synced;
            // a buffered commit must be in a named file to survive a crash
            // of the process, so the first one in a segment pays that sync.
            // It is a whole sync pass: syncing the new segment alone could
            // make it durable while its predecessor's tail is not.
            self.sync_pass(segment, end)?;
        }
        Ok(())
    }

    /// Waits until no write below `end` in `segment`, nor in an earlier
    /// closed segment, is still in flight.
    fn wait_for_holes(
        &self,
        state: &mut MutexGuard<'_, State>,
        segment: u64,
        end: u64,
    ) -> io::Result<()> {
        self.wait_for_progress_while(state, |state| {
            let written = state
                .segments
                .get(&segment)
                .map_or(u64::MAX, SegmentState::written_to);
            // Earlier segments that were closed must be synced whole with
            // this one: recovery drops a segment whose predecessor ends
            // short of where it was closed.
            let earlier_complete = state
                .segments
                .range(..segment)
                .all(|(_, seg)| seg.open_entries > 0 || seg.in_flight.is_empty());
            !(written >= end && earlier_complete)
        })
    }

    /// One sync, run by a group-commit leader: waits briefly for writes
    /// below `end` to land, then syncs every segment with unsynced records
    /// and, if a segment was created or renamed since, the directory.
    fn sync_pass(&self, segment: u64, end: u64) -> io::Result<()> {
        let mut state = self.state.lock();
        self.wait_for_holes(&mut state, segment, end)?;
        self.sync_buffered_and_targets(state)
    }

    /// Takes every target segment's buffered records in the same critical
    /// section that fixes the targets (the sync covers up to where each
    /// segment was written, buffered records included), writes them, and
    /// syncs.
    fn sync_buffered_and_targets(&self, mut state: MutexGuard<'_, State>) -> io::Result<()> {
        let targets = sync_targets(&state);
        let mut writes = Vec::new();
        for SyncTarget { segment, .. } in &targets {
            if let Some(seg) = state.segments.get_mut(&segment.id) {
                if !seg.buffered.is_empty() {
                    writes.push((segment.clone(), seg.take_buffered()));
                }
            }
        }
        drop(state);
        for (segment, ranges) in writes {
            self.write_ranges(&segment, ranges)?;
        }
        self.sync_targets(&targets)
    }
    pub fn sync_targets(&self, targets: &[SyncTarget]) -> io::Result<()> {
        let covered = self.counters.unsynced_commits.swap(0, Ordering::AcqRel);
        crate::trace::span!(DEBUG, "sync", segments = targets.len(), commits = covered);
        // Which targets this call syncs; the others were covered by an
        // earlier sync, which may have started before a large chunk's data
        // was written, so their durable mark stays.
        let mut synced = Vec::with_capacity(targets.len());
        for SyncTarget {
            segment,
            written,
            complete,
            end_mark,
            ..
        } in targets
        {
            // Data that landed since the last sync (a large chunk's) needs
            // a sync too before a later segment's: see `sync_targets`.
            let needed = *written > segment.synced_to.load(Ordering::Acquire)
                || *complete > segment.marked_to.load(Ordering::Acquire);
            if needed {
                self.ledger
                    .run(|| segment.file.sync_data())
                    .map_err(|e| self.poison(e))?;
            }
            synced.push(needed);
            if let Some(end) = end_mark {
                // Durable below `end` now (synced here or before).
                self.write_end_mark(segment, *end)
                    .map_err(|e| self.poison(e))?;
            }
        }
        if synced.contains(&true) {
            Counters::add(&self.counters.syncs, 1);
        }
        Counters::add(&self.counters.synced_commits, covered);
        self.counters.unsynced_bytes.store(0, Ordering::Release);
        if targets.iter().any(|target| target.name) {
            self.name_segments(targets)?;
        }
        for (
            SyncTarget {
                segment,
                written,
                complete,
                ..
            },
            synced,
        ) in targets.iter().zip(synced)
        {
            segment.synced_to.fetch_max(*written, Ordering::AcqRel);
            if synced {
                segment.marked_to.fetch_max(*complete, Ordering::AcqRel);
            }
        }
        self.prune_pending_commits();
        self.synced.notify_all();
        Ok(())
    }

    /// Writes and syncs a closed segment's end mark at `end`, every byte
    /// below which is durable: a padding record with no filler whose
    /// durable mark is `end` (FORMAT.md, "End marks"). Recovery then knows
    /// that damage anywhere below it is damage, not a torn tail, although
    /// the next segment's header could not say where this one ends.
    fn write_end_mark(&self, segment: &Segment, end: u64) -> io::Result<()> {
        {
            // Held for the write only: a sync pass that wants the same
            // mark writes the same bytes, and does not wait for this
            // pass's sync to do so.
            let state = segment.end_mark.lock();
            if *state != EndMark::Due {
                return Ok(());
            }
            let mark = RecordHeader {
                kind: RecordKind::Padding,
                entry_id: segment.id,
                length: 0,
                durable_mark: end,
            }
            .encode(segment.id);
            segment.file.write_all_at(&mark, end)?;
        }
        self.ledger.run(|| segment.file.sync_data())?;
        let mut state = segment.end_mark.lock();
        if *state == EndMark::Due {
            *state = EndMark::NotDue;
        }
        Ok(())
    }

    /// Gives the targets' segments their real names once their headers
    /// are durable (the caller has just synced them), and syncs the
    /// directory. Serialised: when large entries' writers run sync passes
    /// of their own, all of them find the new segment unnamed; one
    /// directory sync names it for all of them (each directory sync is a
    /// journal commit, and sixteen of them per segment cost more than the
    /// data's own syncs).
    fn name_segments(&self, targets: &[SyncTarget]) -> io::Result<()> {
        let _naming = self.naming.lock();
        let unnamed: Vec<&Arc<Segment>> = targets
            .iter()
            .filter(|target| target.name && !target.segment.name_durable.load(Ordering::Acquire))
            .map(|target| &target.segment)
            .collect();
        if unnamed.is_empty() {
            // Named by another sync pass, whose directory sync completed
            // before it released `naming`.
            return Ok(());
        }
        for segment in &unnamed {
            let mut pending = segment.pending_name.lock();
            if let Some(from) = pending.as_ref() {
                self.fs
                    .rename(from, &segment.path)
                    .map_err(|e| self.poison(e))?;
                *pending = None;
            }
        }
        self.fs
            .sync_dir(self.directory())
            .map_err(|e| self.poison(e))?;
        for segment in unnamed {
            segment.name_durable.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Forgets commit records that are durable now.
    pub fn prune_pending_commits(&self) {
        let mut state = self.state.lock();
        let state = &mut *state;
        let segments = &state.segments;
        state.pending_commits.retain(|_, (segment, end)| {
            segments.get(segment).is_some_and(|seg| {
                seg.segment.synced_to.load(Ordering::Acquire) < *end
                    || !seg.segment.name_durable.load(Ordering::Acquire)
            })
        });
    }

    /// One sync pass over every segment, with whatever they have buffered.
    pub fn sync_all_written(&self) -> io::Result<()> {
        self.sync_buffered_and_targets(self.state.lock())
    }

    /// Syncs everything written so far (used at shutdown).
    pub fn sync_all(&self) -> io::Result<()> {
        let ids: Vec<u64> = self.state.lock().segments.keys().copied().collect();
        for id in ids {
            self.flush_segment(id)?;
        }
        // Records appended since those flushes are taken with the targets:
        // computed alone, the targets would count them as written while
        // they were still only in memory, and mark them durable.
        self.sync_buffered_and_targets(self.state.lock())
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
            let header_end = position.offset.saturating_add(RECORD_HEADER_SIZE as u64);
            self.wait_for_progress_while(&mut state, |state| {
                state.segments.get(&position.file_id).is_some_and(|seg| {
                    position.offset >= HEADER_SIZE
                        && header_end <= seg.reserved_end
                        && seg.written_to() < header_end
                })
            })?;
            let seg = state.segments.get(&position.file_id).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "no live segment {} in {} (checkpointed and recycled, or never written)",
                        position.file_id,
                        self.directory().display()
                    ),
                )
            })?;
            (seg.segment.clone(), seg.reserved_end)
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
        let mut header = [0_u8; RECORD_HEADER_SIZE];
        segment.file.read_exact_at(&mut header, position.offset)?;
        let header =
            RecordHeader::decode(&header, segment.id).map_err(|e| invalid(&format!("{e:?}")))?;
        if header.kind != RecordKind::Chunk {
            return Err(invalid("the record there is not a chunk"));
        }
        if position.offset + header.record_len() > limit {
            return Err(invalid("the chunk extends past the written records"));
        }
        let mut reader = ChunkReader::new(
            segment.file.clone(),
            position,
            position.offset + RECORD_HEADER_SIZE as u64,
            header.length,
        );
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
        let number = {
            let mut state = self.state.lock();
            let number = state.next_spare_number;
            // Only a stray file name gets here near u64::MAX; a wrapped
            // number that exists fails `CreateNew` below, harmlessly.
            state.next_spare_number = number.wrapping_add(1);
            number
        };
        let path = FileName::Spare(number).path_in(self.directory());
        let file = self.fs.open(&path, OpenMode::CreateNew)?;
        let mut bytes = self.config.preallocate_bytes.max(HEADER_SIZE);
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
        Ok(Spare { file, path })
    }
}

/// What one sync covers in one segment.
#[derive(Debug)]
pub(crate) struct SyncTarget {
    pub segment: Arc<Segment>,
    /// Every record below this offset is in the file before the sync
    /// starts: `synced_to` becomes this.
    pub written: u64,
    /// Every byte below this offset, large chunks' data included, is in
    /// the file before the sync starts: `marked_to` becomes this.
    pub complete: u64,
    /// The segment still has its spare name: rename it and sync the
    /// directory after syncing the data.
    pub name: bool,
    /// The segment is closed and owes an end mark (see
    /// [`Segment::end_mark_due`]): write it at this offset once the
    /// segment is durable below it.
    pub end_mark: Option<u64>,
}

/// The segments the next sync must cover, in id order. A segment after
/// one that is closed with writes still in flight is left for a later
/// sync (see [`SegmentState::closed_with_writes_in_flight`]).
fn sync_targets(state: &MutexGuard<'_, State>) -> Vec<SyncTarget> {
    let mut targets = Vec::new();
    for seg in state.segments.values() {
        let written = seg.written_to();
        let complete = seg.complete_to();
        let name = !seg.segment.name_durable.load(Ordering::Acquire);
        let end_mark = (seg.sealed
            && seg.open_entries == 0
            && seg.in_flight.is_empty()
            && seg.data_in_flight.is_empty()
            && *seg.segment.end_mark.lock() == EndMark::Due)
            .then_some(seg.reserved_end);
        // A segment whose mark lags its complete bytes is synced again even
        // with no new records: a closed segment must be durable to its end,
        // large chunks' data (and an abandoned chunk's trailer) included,
        // before the next segment's first sync tells recovery it was.
        if written > seg.segment.synced_to.load(Ordering::Acquire)
            || complete > seg.segment.marked_to.load(Ordering::Acquire)
            || name
            || !seg.buffered.is_empty()
            || end_mark.is_some()
        {
            targets.push(SyncTarget {
                segment: seg.segment.clone(),
                written,
                complete,
                name,
                end_mark,
            });
        }
        if seg.closed_with_writes_in_flight() {
            break;
        }
    }
    targets
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

    pub(crate) fn open(
        config: Configuration,
        mut manager: Box<dyn LogManager>,
    ) -> io::Result<Self> {
        crate::trace::span!(INFO, "open", directory = %config.directory.display());
        let fs = config.file_system.clone();
        let directory = config.directory.clone();
        let minimum_next_entry_id = config.minimum_next_entry_id;
        crate::fs::create_dir_durably(&*fs, &directory)?;
        let lock = fs.lock_exclusive(&directory.join(LOCK_FILE))?;
        let mut segments = Vec::new();
        let mut reusable = Vec::new();
        let mut max_id = 0_u64;
        let mut next_spare_number = 0;
        let mut legacy_checkpointed = Vec::new();
        for name in fs.list_files(&directory)? {
            match FileName::parse(&name) {
                Some(FileName::Segment(id)) => {
                    // A segment may hold ids from `id` on; whether `id`
                    // itself was used, its records tell.
                    max_id = max_id.max(id.saturating_sub(1));
                    segments.push(id);
                }
                Some(file @ FileName::Recycled(id)) => {
                    max_id = max_id.max(id);
                    reusable.push(file.path_in(&directory));
                }
                Some(file @ FileName::Spare(n)) => {
                    next_spare_number = next_spare_number.max(n.saturating_add(1));
                    reusable.push(file.path_in(&directory));
                }
                // A segment okaywal 0.2/0.3 had checkpointed.
                None => legacy_checkpointed.extend(
                    crate::legacy::checkpointed_name(&name).map(|id| (id, directory.join(&name))),
                ),
            }
        }
        segments.sort_unstable();

        let mut found = find_segments(
            &*fs,
            &directory,
            &segments,
            config.buffer_bytes,
            Look::Recover(config.recovery_mode),
        )?;
        max_id = max_id.max(found.max_id);
        legacy_checkpointed.sort_unstable();
        let mut legacy = crate::legacy::LegacyLog::read(
            &*fs,
            std::mem::take(&mut found.legacy),
            legacy_checkpointed,
            config.buffer_bytes,
            config.recovery_mode,
        )?;
        max_id = max_id.max(legacy.max_id());
        for path in &reusable {
            // A spare or recycled file that a crash caught after it became
            // a segment but before its rename holds records salted with that
            // segment's id, which no segment name records. Reused under the
            // same id, those records would verify again past the new ones,
            // and a later crash would bring back entries never acknowledged.
            // Ids past it make every new salt differ.
            if let Some(id) = stale_segment_id(&*fs, path)? {
                max_id = max_id.max(id);
            }
        }
        reusable.extend(found.reusable);
        if !found.dropped.is_empty() {
            for (path, highest) in found.dropped {
                // Its records are salted with its id: reused under that id
                // (the next one, if nothing of it was read), they would
                // verify again. Ids past it make every new salt differ.
                max_id = max_id.max(highest);
                let recycled = FileName::Recycled(highest).path_in(&directory);
                fs.rename(&path, &recycled)?;
                reusable.push(recycled);
            }
            fs.sync_dir(&directory)?;
        }
        // Entries of okaywal 0.2/0.3 segments come first: their ids are
        // below every id of this format's segments.
        legacy.recover(&mut *manager)?;
        let mut live = BTreeMap::new();
        let mut abandoned = false;
        for found in found.segments {
            let FoundSegment {
                id,
                path,
                file,
                header,
                scan,
            } = found;
            let info = RecoveredSegment {
                id,
                version_info: header.version_info,
            };
            let decision = manager.should_recover_segment(&info)?;
            if decision == Recovery::Abandon {
                // Discarded for good at once, as a checkpoint would: left
                // live until the background thread got to it, a shutdown
                // right after open kept it, and the next open replayed it.
                let highest = scan.max_entry_id.unwrap_or(id).max(id);
                // As for dropped segments: no new segment may take its id.
                max_id = max_id.max(highest);
                let recycled = FileName::Recycled(highest).path_in(&directory);
                drop(file);
                fs.rename(&path, &recycled)?;
                reusable.push(recycled);
                abandoned = true;
                continue;
            }
            // After a crash of the process alone, what the walk read may be
            // in the page cache only. It counts as synced from here on (and
            // the next segment's header vouches for its end), so it must be
            // on the disk before the log goes on.
            file.sync_data()?;
            let segment = Arc::new(Segment {
                id,
                file: file.clone(),
                path,
                pending_name: Mutex::new(None),
                synced_to: scan.end.into(),
                marked_to: scan.end.into(),
                name_durable: true.into(),
                end_mark: Mutex::new(EndMark::NotDue),
                version_info: Arc::new(info.version_info.clone()),
            });
            let mut state = SegmentState::new(segment, scan.end);
            state.sealed = true;
            state.last_entry_id = scan.max_entry_id;
            state.highest_id = scan.max_entry_id.unwrap_or(id).max(id);
            state.highest_committed_id = scan.committed.keys().next_back().copied();
            let mut reader =
                SegmentReader::new(id, &info.version_info, file.clone(), scan.committed, None);
            while let Some(mut entry) = reader.read_entry()? {
                manager.recover(&mut entry)?;
            }
            live.insert(id, state);
        }
        // The names of the segments kept, too: a crash of the process may
        // have left a rename that no directory sync followed.
        if abandoned || !live.is_empty() {
            fs.sync_dir(&directory)?;
        }

        let mut spares = Vec::new();
        for path in reusable {
            if spares.len() < MAX_SPARES + live.len() + 1 {
                let file = fs.open(&path, OpenMode::ReadWrite)?;
                spares.push(Spare { file, path });
            } else {
                fs.remove_file(&path)?;
            }
        }

        let next_entry_id = max_id
            .checked_add(1)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{}: a file name or record there claims entry id {max_id}, which                          leaves no id for new entries",
                        directory.display()
                    ),
                )
            })?
            .max(minimum_next_entry_id);
        // Every entry below the first live segment was in a segment that
        // an earlier run checkpointed and recycled.
        let recycled_through = live
            .keys()
            .next()
            .map_or(next_entry_id, |first| *first)
            .saturating_sub(1);
        // What `sync` reports before the first new commit: the entries
        // recovered were committed (and are durable) before any call, and
        // with none live, every entry an earlier run checkpointed is.
        let last_committed_id = live
            .values()
            .filter_map(|segment| segment.highest_committed_id)
            .max()
            .unwrap_or(recycled_through);
        let failure = Arc::new(Failure::default());
        let inner = Arc::new(Inner {
            config,
            fs,
            state: Mutex::new(State {
                next_entry_id,
                active: 0,
                segments: live,
                spares,
                recycling: Vec::new(),
                next_spare_number,
                progress_waiters: 0,
                want_spare: false,
                shutting_down: false,
                checkpoint_error: None,
                checkpoint_attempts: 0,
                checkpoint_requested: false,
                checkpointing: None,
                open_ids: BTreeMap::new(),
                pending_commits: BTreeMap::new(),
                recycled_through,
                #[cfg(test)]
                checkpoints_paused: false,
            }),
            progress: Condvar::new(),
            signal: Arc::default(),
            checkpointed: Condvar::new(),
            drained: Condvar::new(),
            group: GroupCommit::with_failure(failure.clone()),
            ledger: SyncLedger::with_failure(failure.clone()),
            failure,
            maintenance: Mutex::new(None),
            maintenance_thread: Mutex::new(None),
            counters: Counters::default(),
            last_committed_id: AtomicU64::new(last_committed_id),
            synced: Condvar::new(),
            buffered_followers: 0.into(),
            unblocking_rollbacks: AtomicU64::new(0),
            naming: Mutex::new(()),
            legacy_files: Mutex::new(BTreeMap::new()),
            _lock: lock,
        });
        // The first active segment: a reused file if any, else a new one.
        if inner.state.lock().spares.is_empty() {
            let spare = inner.create_spare()?;
            inner.state.lock().spares.push(spare);
        }
        {
            let mut state = inner.state.lock();
            let state = &mut *state;
            // A placeholder "previous active" so switch_segment has one to
            // seal: the highest recovered segment, or a dummy entry.
            if state.segments.is_empty() {
                inner.activate_first(state)?;
            } else {
                state.active = *state.segments.keys().next_back().expect("not empty");
                inner.switch_segment(state)?;
            }
        }
        let log = WriteAheadLog {
            _owner: Some(Arc::new(Owner {
                inner: inner.clone(),
            })),
            inner,
        };
        // Segments in the okaywal 0.2/0.3 format are checkpointed (and
        // recycled) now: the log writes only this crate's format.
        legacy.checkpoint_and_recycle(&log, &mut *manager)?;
        checkpoint::start(&log, manager)?;
        Ok(log)
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
    /// If the calling thread began one of them and has not committed or
    /// rolled it back, it fails at once with
    /// [`io::ErrorKind::WouldBlock`] (naming the entry and its segment)
    /// instead of waiting forever for an entry that only this thread can
    /// finish; nothing is sealed then. Called from inside
    /// `checkpoint_to`, it only seals and does not wait.
    pub fn checkpoint_active(&self) -> io::Result<()> {
        checkpoint::checkpoint_active(self)
    }

    /// Stops the background thread after its current checkpoint and syncs
    /// what has been written. Later calls on any clone of this log fail,
    /// and so do chunk writes and commits of entries begun before (such an
    /// entry is never recovered; rolling it back still succeeds).
    /// Segments not yet checkpointed are replayed at the next open.
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
            state
                .segments
                .values()
                .map(|seg| (seg.segment.clone(), seg.reserved_end))
                .collect()
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
            (state.segments.len() as u64, state.spares.len() as u64)
        };
        LogStats::from_counters(&self.inner.counters, live, spares)
    }

    /// The directory holding the segment files.
    #[must_use]
    pub fn directory(&self) -> &std::path::Path {
        self.inner.directory()
    }
}

impl Inner {
    /// Opens the very first segment of a log that has none.
    fn activate_first(&self, state: &mut State) -> io::Result<()> {
        // switch_segment seals the previous active segment; make a
        // throwaway sealed state that is removed right after.
        let placeholder = Arc::new(Segment {
            id: 0,
            file: state.spares[0].file.clone(),
            path: PathBuf::new(),
            pending_name: Mutex::new(None),
            synced_to: 0.into(),
            marked_to: 0.into(),
            name_durable: true.into(),
            end_mark: Mutex::new(EndMark::NotDue),
            version_info: Arc::default(),
        });
        state.segments.insert(0, SegmentState::new(placeholder, 0));
        state.active = 0;
        let result = self.switch_segment(state);
        state.segments.remove(&0);
        result
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

/// The segment id in the header of a spare or recycled file, if it has a
/// valid one (a file zero-filled as a spare has none).
fn stale_segment_id(fs: &dyn FileSystem, path: &std::path::Path) -> io::Result<Option<u64>> {
    let file = fs.open(path, OpenMode::Read)?;
    if file.len()? < HEADER_SIZE {
        return Ok(None);
    }
    let mut bytes = vec![0; HEADER_SIZE as usize];
    file.read_exact_at(&mut bytes, 0)?;
    // Reused only if it is ours: a file of another format version, or of
    // another program, is refused and left as it is.
    if let Some(version) = SegmentHeader::other_version(&bytes) {
        return Err(crate::recovery::other_version_error(path, version));
    }
    crate::legacy::refuse_foreign(path, &bytes)?;
    Ok(SegmentHeader::decode(&bytes)
        .ok()
        .map(|header| header.first_entry_id))
}

#[cfg(test)]
#[path = "log_tests.rs"]
mod tests;
