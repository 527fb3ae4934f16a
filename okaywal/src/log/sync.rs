//! The sync path: sync passes over the segments that hold unsynced
//! records, end marks, and the naming of new segment files.

use std::io;
use std::sync::Arc;

use parking_lot::MutexGuard;

use super::{Inner, State};
use crate::segment::{Overlap, Segment};
use crate::segments::Segments;
use crate::tuning::PROGRESS_WAIT;

pub(super) mod ledger;

impl Inner {
    /// Returns once every byte below `end` in `segment` is durable.
    pub fn wait_durable(&self, segment: &Arc<Segment>, end: u64) -> io::Result<()> {
        self.group.wait(
            || segment.is_durable_to(end),
            || self.sync_pass(segment.id(), end),
        )
    }

    /// A sync pass of the caller's own, outside the group commit, unless
    /// `end` is durable already: for large entries, whose writers gain
    /// more from overlapping syncs than from sharing one. Concurrent sync
    /// passes are safe: each covers what was written before it started.
    /// Where a running sync of a segment already covers the pass, the pass
    /// waits for it rather than syncing again (see
    /// [`Segment::sync_data_through`]).
    pub fn sync_own(&self, segment: &Arc<Segment>, end: u64) -> io::Result<()> {
        if segment.is_durable_to(end) {
            return Ok(());
        }
        let mut state = self.state.lock();
        self.wait_for_holes(&mut state, segment.id(), end)?;
        self.sync_buffered_and_targets(state, Overlap::Join)
    }

    /// Returns once every record below `end` in `segment` (and every
    /// record of earlier closed segments) is in the file, i.e. handed to the
    /// operating system: what a buffered commit promises.
    pub fn hand_to_os(&self, segment: u64, end: u64) -> io::Result<()> {
        let mut state = self.state.lock();
        self.wait_for_holes(&mut state, segment, end)?;
        let writes = state.segments.take_buffered_through(segment);
        let unnamed = !state.segments.named_through(segment);
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
    /// closed segment, is still in flight; woken by the write that makes
    /// it so (see [`waiters`](super::waiters)).
    fn wait_for_holes(
        &self,
        state: &mut MutexGuard<'_, State>,
        segment: u64,
        end: u64,
    ) -> io::Result<()> {
        while state.segments.holes_below(segment, end) {
            if let Some(err) = self.failed() {
                return Err(err);
            }
            let (ticket, woken) = state.hole_waiters.enter(segment, end);
            woken.wait_for(state, PROGRESS_WAIT);
            state.hole_waiters.leave(ticket);
        }
        Ok(())
    }

    /// One sync, run by a group-commit leader: waits briefly for writes
    /// below `end` to land, then syncs every segment with unsynced records
    /// and, if a segment was created or renamed since, the directory.
    pub(super) fn sync_pass(&self, segment: u64, end: u64) -> io::Result<()> {
        let mut state = self.state.lock();
        self.wait_for_holes(&mut state, segment, end)?;
        self.sync_buffered_and_targets(state, Overlap::Own)
    }

    /// Takes every target segment's buffered records in the same critical
    /// section that fixes the targets (the sync covers up to where each
    /// segment was written, buffered records included), writes them, and
    /// syncs.
    fn sync_buffered_and_targets(
        &self,
        mut state: MutexGuard<'_, State>,
        overlap: Overlap,
    ) -> io::Result<()> {
        let targets = sync_targets(&state.segments);
        let writes: Vec<_> = targets
            .iter()
            .filter_map(|target| state.segments.take_buffered(target.segment.id()))
            .collect();
        drop(state);
        for (segment, ranges) in writes {
            self.write_ranges(&segment, ranges)?;
        }
        self.sync_targets(&targets, overlap)
    }

    /// Syncs a closed `segment` whose every byte below `limit` is in the
    /// file, named if it is not yet (for a checkpoint, which must find it
    /// durable to its end).
    pub fn sync_whole(&self, segment: &Arc<Segment>, limit: u64) -> io::Result<()> {
        let name = !segment.name_is_durable();
        self.sync_targets(
            &[SyncTarget {
                segment: segment.clone(),
                written: limit,
                complete: limit,
                name,
                end_mark: None,
            }],
            Overlap::Own,
        )
    }

    /// Syncs `targets` (whose records are in their files), writes the end
    /// marks they owe, names the segments that still have spare names,
    /// and raises each segment's durable offsets to what was synced.
    fn sync_targets(&self, targets: &[SyncTarget], overlap: Overlap) -> io::Result<()> {
        let covered = self.counters.take_unsynced_commits();
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
            let needed = *written > segment.synced_to() || *complete > segment.marked_to();
            if needed {
                segment
                    .sync_data_through(*written, *complete, overlap, |handle| match handle {
                        Some(own) => self.ledger.run_alone(|| own.sync_data()),
                        None => self.ledger.run(|| segment.file().sync_data()),
                    })
                    .map_err(|e| self.poison(e))?;
            }
            synced.push(needed);
            if let Some(end) = end_mark {
                // Durable below `end` now (synced here or before).
                self.write_end_mark(segment, *end)
                    .map_err(|e| self.poison(e))?;
            }
        }
        self.counters.sync_done(synced.contains(&true), covered);
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
            segment.synced(*written, synced.then_some(*complete));
        }
        self.synced.notify_all();
        Ok(())
    }

    /// Writes and syncs a closed segment's end mark at `end`, every byte
    /// below which is durable (FORMAT.md, "End marks"). Recovery then
    /// knows that damage anywhere below it is damage, not a torn tail,
    /// although the next segment's header could not say where this one
    /// ends.
    fn write_end_mark(&self, segment: &Segment, end: u64) -> io::Result<()> {
        if !segment.write_end_mark(end)? {
            return Ok(());
        }
        self.ledger.run(|| segment.file().sync_data())?;
        segment.end_mark_written();
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
            .filter(|target| target.name && !target.segment.name_is_durable())
            .map(|target| &target.segment)
            .collect();
        if unnamed.is_empty() {
            // Named by another sync pass, whose directory sync completed
            // before it released `naming`.
            return Ok(());
        }
        for segment in &unnamed {
            segment
                .rename_to_final(&*self.fs)
                .map_err(|e| self.poison(e))?;
        }
        self.fs
            .sync_dir(self.directory())
            .map_err(|e| self.poison(e))?;
        for segment in unnamed {
            segment.name_made_durable();
        }
        Ok(())
    }

    /// Forgets commit records that are durable now.
    pub fn prune_pending_commits(&self) {
        let mut state = self.state.lock();
        let state = &mut *state;
        let segments = &state.segments;
        state
            .pending_commits
            .retain(|_, (segment, end)| !segments.durable_to(*segment, *end));
    }

    /// One sync pass over every segment, with whatever they have buffered.
    pub fn sync_all_written(&self) -> io::Result<()> {
        self.sync_buffered_and_targets(self.state.lock(), Overlap::Own)
    }

    /// At shutdown, after [`Inner::sync_all`]: writes and syncs an end
    /// mark after the active segment's last record if every record of it
    /// is durable and none is being written (see
    /// [`Segment::write_shutdown_mark`]). Written once per log.
    pub fn write_shutdown_mark(&self) -> io::Result<()> {
        let quiet = {
            let mut state = self.state.lock();
            if state.shutdown_marked {
                return Ok(());
            }
            state.shutdown_marked = true;
            state.segments.quiet_active_end()
        };
        if let Some((segment, end)) = quiet {
            segment
                .write_shutdown_mark(end)
                .map_err(|e| self.poison(e))?;
        }
        Ok(())
    }

    /// Syncs everything written so far (used at shutdown).
    pub fn sync_all(&self) -> io::Result<()> {
        let ids = self.state.lock().segments.live_ids();
        for id in ids {
            self.flush_segment(id)?;
        }
        // Records appended since those flushes are taken with the targets:
        // computed alone, the targets would count them as written while
        // they were still only in memory, and mark them durable.
        self.sync_buffered_and_targets(self.state.lock(), Overlap::Own)
    }
}

/// What one sync covers in one segment.
#[derive(Debug)]
pub(super) struct SyncTarget {
    /// The segment.
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
    /// [`crate::segments::SegmentState::end_mark_due`]): write it at this offset once the
    /// segment is durable below it.
    pub end_mark: Option<u64>,
}

/// The segments the next sync must cover, in id order. A segment after
/// one that is closed with writes still in flight is left for a later
/// sync (see [`crate::segments::SegmentState::closed_with_writes_in_flight`]).
pub(super) fn sync_targets(segments: &Segments) -> Vec<SyncTarget> {
    let mut targets = Vec::new();
    for seg in segments.states() {
        let segment = seg.segment();
        let written = seg.written_to();
        let complete = seg.complete_to();
        let name = !segment.name_is_durable();
        let end_mark = seg.end_mark_due().then_some(seg.reserved_end());
        // A segment whose mark lags its complete bytes is synced again even
        // with no new records: a closed segment must be durable to its end,
        // large chunks' data (and an abandoned chunk's trailer) included,
        // before the next segment's first sync tells recovery it was.
        if written > segment.synced_to()
            || complete > segment.marked_to()
            || name
            || seg.has_buffered()
            || end_mark.is_some()
        {
            targets.push(SyncTarget {
                segment: segment.clone(),
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
