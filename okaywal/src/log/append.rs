//! The append path: reservations in a segment, copies into its write
//! buffer, the writes of buffered ranges into the file, and the
//! bookkeeping of writes that land. Where records go is
//! [`crate::segments::Segments`]'s decision; this module holds the lock,
//! counts, writes and wakes.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::MutexGuard;

use super::{Inner, State};
use crate::format::{RecordHeader, RecordKind};
use crate::segment::Segment;
use crate::segments::{Placed, Ranges};
use crate::tuning::PROGRESS_WAIT;

impl Inner {
    /// Reserves `len` bytes in `segment` for a large chunk record; returns
    /// the offset and the durable mark to write into the record's header.
    /// The chunk's data counts as in flight until [`Inner::data_written`].
    pub fn reserve(&self, segment: u64, len: u64) -> io::Result<(u64, u64)> {
        let mut state = self.state.lock();
        self.check_usable(&state)?;
        let (offset, mark, wake) = state.segments.reserve(segment, len)?;
        self.counters.wrote(len);
        if wake {
            self.signal.wake();
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
    /// `aligned_chunk_start`). `index` is the chunk's index in its entry.
    /// Returns the record's offset.
    pub fn reserve_chunk(
        &self,
        segment: &Arc<Segment>,
        header: RecordHeader,
        crc: u32,
        index: u32,
    ) -> io::Result<u64> {
        let mut state = self.state.lock();
        self.check_usable(&state)?;
        let placed = state
            .segments
            .reserve_chunk(segment.id(), header, crc, index)?;
        self.counters.wrote(placed.bytes);
        self.after_placing(state, segment, placed)
    }

    /// Reserves room for a small record and copies it into the segment's
    /// write buffer in the same critical section, so it never leaves a
    /// hole; optionally finishes the entry that wrote it. In an encrypted
    /// segment, `data` is the chunk's sealed frames, `index` its index in
    /// its entry (the header is sealed here, under the lock, where its
    /// offset and durable mark are known; the data was sealed by the
    /// caller before). Returns the record's offset.
    pub fn append(
        &self,
        segment: &Arc<Segment>,
        header: RecordHeader,
        data: Option<(&[u8], u32)>,
        finishes_entry: bool,
        index: u32,
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
        if !finishes_entry {
            state.segments.check_live(segment.id())?;
        } else if state.segments.finish_entry(segment.id())?.drained {
            self.drained.notify_all();
        }
        if let Some(err) = self.failed().or(refused) {
            return Err(err);
        }
        let placed = state
            .segments
            .append_record(segment.id(), header, data, index)?;
        self.counters.wrote(placed.bytes);
        if header.kind == RecordKind::Commit {
            state.forget_durable_commits();
            self.counters.commit_appended();
            self.last_committed_id
                .fetch_max(header.entry_id, Ordering::AcqRel);
            state
                .pending_commits
                .insert(header.entry_id, (segment.id(), placed.end));
        }
        self.after_placing(state, segment, placed)
    }

    /// After a record was placed: wakes the maintenance thread if it has
    /// work, releases the state lock and writes out the ranges a full
    /// write buffer gave up. Returns the record's offset.
    fn after_placing(
        &self,
        state: MutexGuard<'_, State>,
        segment: &Arc<Segment>,
        placed: Placed,
    ) -> io::Result<u64> {
        if placed.wake {
            self.signal.wake();
        }
        drop(state);
        if let Some(ranges) = placed.flush {
            self.write_ranges(segment, ranges)?;
        }
        Ok(placed.offset)
    }

    /// Writes ranges taken from a segment's write buffer and marks them
    /// written.
    pub fn write_ranges(&self, segment: &Arc<Segment>, ranges: Ranges) -> io::Result<()> {
        let mut result = Ok(());
        for (start, data) in &ranges {
            if let Err(err) = segment.write_reserved(data, *start) {
                result = Err(self.poison(err));
                break;
            }
        }
        let mut state = self.state.lock();
        if state
            .segments
            .written(segment.id(), ranges.iter().map(|(start, _)| *start))
        {
            self.signal.wake();
        }
        self.wake_progress(&state);
        result
    }

    /// Writes whatever `segment` has buffered.
    pub fn flush_segment(&self, segment: u64) -> io::Result<()> {
        let taken = self.state.lock().segments.take_buffered(segment);
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
        self.wait_for_progress_while(&mut state, |state| state.segments.writes_in_flight(segment))
    }

    /// Wakes the threads waiting for writes in flight, after one landed:
    /// all of those waiting on `progress`, and of those waiting for the
    /// holes below their records only the ones it unblocked.
    pub(super) fn wake_progress(&self, state: &State) {
        if state.progress_waiters > 0 {
            self.progress.notify_all();
        }
        state
            .hole_waiters
            .wake_unblocked(|segment, end| state.segments.holes_below(segment, end));
    }

    /// Waits, with `state` released meanwhile, until `busy` is false: for
    /// writes in flight to land. Fails once a sync has failed (the writes
    /// waited for may never land).
    pub(super) fn wait_for_progress_while(
        &self,
        state: &mut MutexGuard<'_, State>,
        busy: impl Fn(&State) -> bool,
    ) -> io::Result<()> {
        while busy(state) {
            if let Some(err) = self.failed() {
                return Err(err);
            }
            state.progress_waiters += 1;
            self.progress.wait_for(state, PROGRESS_WAIT);
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
        if let Some(offset) = offset {
            state.segments.header_written(segment, offset);
        }
        if finished_entry.is_some() {
            if let Ok(finished) = state.segments.finish_entry(segment) {
                if finished.checkpointable {
                    self.signal.wake();
                }
                if finished.drained {
                    self.drained.notify_all();
                }
            }
        }
        self.wake_progress(&state);
    }

    /// Whether an entry other than the caller's is open: then a large
    /// chunk's writer starts the write-back of its data at once (see
    /// [`crate::tuning::START_WRITEBACK_BYTES`]). A lone writer's own sync
    /// follows at once and sends the data with the record headers around
    /// it in one request, which the hint would only split (one writer of
    /// 1 MiB entries lost 12–16% to it).
    pub fn others_writing(&self) -> bool {
        self.state.lock().open_ids.len() > 1
    }

    /// Marks the data of the large chunk reserved at `offset` as written
    /// (or abandoned: a chunk whose data never lands fails its CRC, and its
    /// entry cannot commit).
    pub fn data_written(&self, segment: u64, offset: u64) {
        let mut state = self.state.lock();
        state.segments.data_written(segment, offset);
        self.wake_progress(&state);
    }
}
