//! The background thread: checkpoints sealed segments in order, recycles
//! them once their readers are gone, and keeps a spare segment ready.

use std::io;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::config::RecoveryMode;
use crate::failure::ErrorRecord;
use crate::format::HEADER_SIZE;
use crate::fs::zero_fill;
use crate::log::{weak, Inner};
use crate::manager::LogManager;
use crate::recovery::SegmentReader;
use crate::segment::{FileName, Segment, SyncHandles};
use crate::segments::{Checkpointable, Spare};
use crate::tuning::{IDLE_WAIT, MAX_BACKOFF, MIN_SYNC_INTERVAL};
use crate::{EntryId, WriteAheadLog};

pub(crate) fn start(log: &WriteAheadLog, manager: Box<dyn LogManager>) -> io::Result<()> {
    if let Some(interval) = log.inner.config().max_unsynced {
        let weak = weak(log);
        let signal = log.inner.signal().clone();
        std::thread::Builder::new()
            .name("okaywal-sync".into())
            .spawn(move || sync_periodically(&weak, &signal, interval))?;
    }
    let weak = weak(log);
    let handle = std::thread::Builder::new()
        .name("okaywal-checkpoint".into())
        .spawn(move || run(&weak, manager))?;
    log.inner.set_maintenance(handle);
    Ok(())
}

/// Syncs buffered commits at least every `interval` (see
/// `Configuration::max_unsynced`), until the log is dropped or shut down.
fn sync_periodically(weak: &Weak<Inner>, signal: &crate::log::Signal, interval: Duration) {
    let interval = interval.max(MIN_SYNC_INTERVAL);
    loop {
        if signal.stopped_after(interval) {
            return;
        }
        let Some(inner) = weak.upgrade() else {
            return;
        };
        if inner.lock_state().is_shutting_down() {
            return;
        }
        if inner.counters().has_unsynced_bytes() {
            // A failure poisons the log; commits report it.
            let _ = WriteAheadLog::borrowed(inner).sync();
        }
    }
}

/// Where the checkpointer stands, kept in the log's state (under its
/// lock) so that writers and callers of `checkpoint_active` can see it.
/// Only this module changes it.
#[derive(Debug, Default)]
pub(crate) struct CheckpointStatus {
    /// Why the last checkpoint attempt (or the making of a spare) failed,
    /// with the error's kind; cleared by the next successful checkpoint.
    /// Unlike the log's failure it does not stop the log: a failed
    /// checkpoint is retried.
    error: Option<ErrorRecord>,
    attempts: u64,
    /// A caller of `checkpoint_active` is waiting: retry a failed
    /// checkpoint now rather than after the backoff.
    requested: bool,
    /// The id of the segment being checkpointed right now.
    checkpointing: Option<u64>,
    /// White-box tests stop the background checkpointer from taking
    /// segments whose bookkeeping they are still looking at.
    #[cfg(test)]
    paused: bool,
}

impl CheckpointStatus {
    /// The last checkpoint attempt (or the making of a spare) failed.
    pub fn is_failing(&self) -> bool {
        self.error.is_some()
    }

    /// Keeps the background checkpointer from starting another checkpoint.
    #[cfg(test)]
    pub fn pause(&mut self) {
        self.paused = true;
    }
}

enum Work {
    Checkpoint {
        segment: Arc<Segment>,
        limit: u64,
        last_entry_id: Option<u64>,
    },
    Spare,
    Wait,
    Stop,
}

fn run(weak: &Weak<Inner>, mut manager: Box<dyn LogManager>) {
    // Checkpoints and spare files fail (and are retried) independently.
    let mut checkpoint_backoff = Backoff::default();
    let mut spare_backoff = Backoff::default();
    let mut quiet = Quiet::default();
    loop {
        // Hold the log only while working, so dropping every user handle
        // ends this thread.
        let Some(inner) = weak.upgrade() else {
            return;
        };
        let signal = inner.signal().clone();
        let mut wait = None;
        if std::mem::take(&mut inner.lock_state().checkpoints.requested) {
            checkpoint_backoff.retry_now();
        }
        recycle_finished(&inner);
        match next_work(&inner, checkpoint_backoff.ready(), spare_backoff.ready()) {
            Work::Stop => return,
            Work::Wait => {
                trim_when_idle(&inner, &mut quiet);
                let retry = [checkpoint_backoff.remaining(), spare_backoff.remaining()]
                    .into_iter()
                    .flatten()
                    .min();
                wait = Some(retry.unwrap_or(IDLE_WAIT).min(IDLE_WAIT));
            }
            Work::Spare => match inner.create_spare() {
                Ok(spare) => {
                    spare_backoff = Backoff::default();
                    inner.lock_state().segments.spare_made(spare);
                }
                Err(err) => {
                    inner.lock_state().checkpoints.error = Some(ErrorRecord::of(&err));
                    spare_backoff.failed();
                }
            },
            Work::Checkpoint {
                segment,
                limit,
                last_entry_id,
            } => {
                let log = WriteAheadLog::borrowed(inner.clone());
                let started = Instant::now();
                let result = checkpoint(&log, &mut *manager, &segment, limit, last_entry_id);
                let nanos = started.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
                drop(log);
                let counters = inner.counters();
                if result.is_ok() {
                    checkpoint_backoff = Backoff::default();
                    counters.checkpoint_done(nanos);
                } else {
                    checkpoint_backoff.failed();
                    counters.checkpoint_failed();
                }
                finish_checkpoint(&inner, segment, result);
                recycle_finished(&inner);
            }
        }
        drop(inner);
        if let Some(wait) = wait {
            if !signal.wait(wait) {
                return;
            }
        }
    }
}

/// Watches for a pause in writing: the same write position seen for
/// [`IDLE_WAIT`].
#[derive(Debug, Default)]
struct Quiet {
    seen: Option<((u64, u64), Instant)>,
}

/// Cuts spares that a burst grew back to the preallocated size once the
/// log has been idle for [`IDLE_WAIT`] (see `Segments::trim_spares`).
fn trim_when_idle(inner: &Inner, quiet: &mut Quiet) {
    let mut state = inner.lock_state();
    if !state.segments.has_grown() {
        quiet.seen = None;
        return;
    }
    let position = state.segments.write_position();
    let now = Instant::now();
    match quiet.seen {
        Some((seen, since)) if seen == position => {
            if now.duration_since(since) < IDLE_WAIT {
                return;
            }
        }
        _ => {
            quiet.seen = Some((position, now));
            return;
        }
    }
    quiet.seen = None;
    let preallocated = inner.config().preallocate_bytes.max(HEADER_SIZE);
    if let Err(err) = state.segments.trim_spares(preallocated) {
        state.checkpoints.error = Some(ErrorRecord::of(&err));
    }
}

/// Retry delays after failures: 100 ms doubling up to 2 s.
#[derive(Debug, Default)]
struct Backoff {
    delay: Option<Duration>,
    retry_at: Option<Instant>,
}

impl Backoff {
    fn failed(&mut self) {
        let delay = self.delay.map_or(IDLE_WAIT, |d| (d * 2).min(MAX_BACKOFF));
        self.delay = Some(delay);
        self.retry_at = Some(Instant::now() + delay);
    }

    /// Allows the next attempt at once; the delay after another failure
    /// still grows.
    fn retry_now(&mut self) {
        self.retry_at = None;
    }

    fn ready(&self) -> bool {
        self.retry_at.map_or(true, |at| Instant::now() >= at)
    }

    fn remaining(&self) -> Option<Duration> {
        self.retry_at
            .map(|at| at.saturating_duration_since(Instant::now()))
            .filter(|d| !d.is_zero())
    }
}

fn next_work(inner: &Inner, may_checkpoint: bool, may_make_spare: bool) -> Work {
    let mut state = inner.lock_state();
    if state.is_shutting_down() {
        return Work::Stop;
    }
    // Segments are checkpointed strictly in order: only the oldest sealed
    // segment is a candidate, and only once its entries are all finished.
    // Checkpoints come before making spares: they free recycled files.
    // The next spare is made once the active segment is half full.
    let wants_spare =
        may_make_spare && state.segments.spare_wanted() && state.segments.active_is_half_full();
    // Unless writers are already growing a full active segment past its
    // size: a spare then comes first, or a slow checkpoint would let that
    // segment (and the next checkpoint) grow without bound.
    let active_full = state.segments.active_is_full();
    if wants_spare && active_full {
        return Work::Spare;
    }
    // A full active segment is normally sealed by the next `begin_entry`.
    // When writers went quiet right after filling it, seal it here so its
    // entries are checkpointed (and its file recycled) without waiting for
    // the next write.
    let idle = state.segments.active_open_entries() == 0;
    if active_full && idle && state.segments.has_spare() {
        if let Err(err) = inner.switch_segment(&mut state) {
            state.checkpoints.error = Some(ErrorRecord {
                kind: err.kind(),
                message: format!("sealing the full active segment: {err}"),
            });
        }
    }
    let candidate = state.segments.next_checkpointable();
    #[cfg(test)]
    let may_checkpoint = may_checkpoint && !state.checkpoints.paused;
    if let (
        true,
        Some(Checkpointable {
            segment,
            limit,
            last_entry_id,
        }),
    ) = (may_checkpoint, candidate)
    {
        state.checkpoints.checkpointing = Some(segment.id());
        return Work::Checkpoint {
            segment,
            limit,
            last_entry_id,
        };
    }
    if wants_spare {
        return Work::Spare;
    }
    Work::Wait
}

pub(crate) fn checkpoint(
    log: &WriteAheadLog,
    manager: &mut dyn LogManager,
    segment: &Arc<Segment>,
    limit: u64,
    last_entry_id: Option<u64>,
) -> io::Result<()> {
    crate::trace::span!(INFO, "checkpoint", segment = segment.id(), last_entry_id = ?last_entry_id);
    let inner = &log.inner;
    // After a failed sync (or recycle) nothing more is moved to the
    // manager: the segments stay, in order, for the next open to replay.
    if let Some(err) = inner.failed() {
        return Err(err);
    }
    // Rolled-back records may still be unsynced, and a sync leader may
    // still be writing records it took from the buffer after this segment
    // was chosen: the segment must be whole and durable before it is read
    // and forgotten. This sync also covers committers of its last entries
    // still waiting for one (and names the file, if no commit did).
    inner.settle_segment(segment.id())?;
    // First a pass over every segment, as a group commit's: this sync may
    // release committers of the segment's last entries, and each of them
    // must find durable every entry committed before it, buffered ones in
    // later segments included (a buffered entry becomes durable with the
    // next durable commit). Then the segment itself, to `limit`, in case
    // the pass found nothing to do for it.
    inner.sync_all_written()?;
    inner.sync_whole(segment, limit)?;
    let Some(last_entry_id) = last_entry_id else {
        return Ok(());
    };
    // Damage is skipped only where recovery skipped it: every entry it
    // presented from this segment must reach the manager before the
    // segment is recycled, and damage that appeared since open is an error
    // that keeps the segment. The scan happens only if the manager reads.
    let mut reader = SegmentReader::unscanned(
        segment.id(),
        segment.file().clone(),
        limit,
        inner.config().buffer_bytes,
        inner.config().recovery_mode == RecoveryMode::SkipCorrupted,
        segment.clone(),
    );
    // A manager that panics fails this checkpoint like one that returns
    // an error: it is retried, `checkpoint_active` reports it, and the
    // maintenance thread lives on to make spares and checkpoint later
    // segments (it used to die, leaving `checkpoint_active` waiting for
    // good and the active segment growing without end).
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        manager.checkpoint_to(EntryId(last_entry_id), &mut reader, log)
    }))
    .unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".to_string());
        Err(io::Error::other(format!(
            "LogManager::checkpoint_to panicked checkpointing segment {} through entry \
             {last_entry_id}: {what}",
            segment.id()
        )))
    })
}

fn finish_checkpoint(inner: &Inner, segment: Arc<Segment>, result: io::Result<()>) {
    match result {
        Ok(()) => {
            let highest_id = {
                let mut state = inner.lock_state();
                let retired = state.segments.finish(segment.id());
                let committed = retired.and_then(|s| s.highest_committed_id);
                state.note_recycled(committed);
                retired.map_or(segment.id(), |s| s.highest_id)
            };
            // Named for the highest id it held: if the active segment's own
            // name never became durable, this name still keeps a reopened
            // log from handing out an id the manager has already seen.
            let recycled = FileName::Recycled(highest_id).path_in(inner.directory());
            // No sync pass may write an end mark into the file once it can
            // be reused.
            segment.retire();
            // Once renamed (durably), the segment is never replayed again.
            let renamed = inner
                .fs()
                .rename(segment.path(), &recycled)
                .inspect(|()| segment.file().renamed(&recycled))
                .and_then(|()| inner.fs().sync_dir(inner.directory()));
            let mut state = inner.lock_state();
            state.checkpoints.checkpointing = None;
            state.checkpoints.attempts += 1;
            match renamed {
                Ok(()) => {
                    state.checkpoints.error = None;
                    inner.counters().segment_recycled();
                    state.segments.retire(segment, recycled);
                }
                Err(err) => {
                    // The entries are safe in the manager's store, but the
                    // file keeps its name and the next open replays them.
                    // Checkpointing a later segment would let that replay
                    // come after newer entries the manager already holds,
                    // and a failed directory sync is a failed sync: the log
                    // stops until it is reopened.
                    let message = format!(
                        "segment {} was checkpointed but could not be recycled (it is replayed                          at the next open): {err}",
                        segment.id()
                    );
                    let failed = io::Error::new(err.kind(), message);
                    state.checkpoints.error = Some(ErrorRecord::of(&failed));
                    // Failed before the state is released, so that no
                    // waiter in `checkpoint_active` sees the segment gone
                    // without seeing the failure.
                    inner.record_failure(&failed);
                    drop(state);
                    inner.poison(failed);
                }
            }
        }
        Err(err) => {
            let mut state = inner.lock_state();
            state.checkpoints.checkpointing = None;
            state.checkpoints.attempts += 1;
            state.checkpoints.error = Some(ErrorRecord {
                kind: err.kind(),
                message: format!(
                    "checkpointing segment {} failed (it is kept and retried): {err}",
                    segment.id()
                ),
            });
        }
    }
    inner.checkpoint_attempted();
}

/// Moves checkpointed segments that no reader holds any more into the
/// spare pool (or deletes them when the pool is full).
fn recycle_finished(inner: &Inner) {
    let finished = inner.lock_state().segments.take_unread_retired();
    for (segment, path) in finished {
        let keep = inner.lock_state().segments.keeps_another_spare();
        if keep {
            let file = segment.file().clone();
            // A segment that grew past its preallocated size (writers
            // outran the checkpointer, or entries overshot the switch)
            // keeps its blocks while the log is busy, and goes back to
            // that size once it is idle (`trim_when_idle`).
            let preallocated = inner.config().preallocate_bytes.max(HEADER_SIZE);
            // A log of large entries sizes its segments up (see
            // `Segments::segment_bytes`): a smaller recycled file is filled
            // to that size here, off the writers' path, rather than grown
            // by their appends, each `fdatasync` of which would then carry
            // a file-size change. A fill that fails (a full disk) leaves
            // the file to grow by appends as before.
            let wanted = inner.lock_state().segments.spare_bytes(preallocated);
            if let Ok(len) = file.len() {
                if len < wanted {
                    let _ = zero_fill(&*file, len, wanted - len).and_then(|()| file.sync_data());
                }
            }
            let grown = file.len().is_ok_and(|len| len > preallocated);
            // Handles of its own, opened now: the segment's may still be
            // lent to a sync pass that started before it was retired.
            let sync_handles = SyncHandles::open(&*file);
            inner.lock_state().segments.add_spare(Spare {
                file,
                sync_handles,
                path,
                grown,
            });
        } else if let Err(err) = inner.fs().remove_file(&path) {
            inner.lock_state().checkpoints.error = Some(ErrorRecord {
                kind: err.kind(),
                message: format!("removing surplus segment file: {err}"),
            });
        }
    }
}

pub(crate) fn checkpoint_active(log: &WriteAheadLog) -> io::Result<()> {
    let inner = &log.inner;
    let mut state = inner.lock_state();
    inner.check_usable(&state)?;
    let active = state.segments.active_id();
    let has_records = state.segments.active_has_records();
    let on_maintenance_thread = inner.on_maintenance_thread();
    if !on_maintenance_thread {
        // The checkpoint covers the active segment if it holds records,
        // else every segment before it; an entry open in any of those
        // keeps it from finishing. One the calling thread holds would
        // never finish while the thread waits here.
        let covered_below = if has_records { u64::MAX } else { active };
        if let Some(id) = state.entry_held_by_this_thread(covered_below) {
            let segment = state.segments.holding(id).unwrap_or(id);
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "checkpoint_active would wait forever: the calling thread holds entry {id} \
                     open in segment {segment}, which the checkpoint must wait for; commit or \
                     roll back that entry first"
                ),
            ));
        }
    }
    let target = if has_records {
        state.segments.seal_active();
        if !state.segments.has_spare() {
            drop(state);
            let made = inner.create_spare();
            state = inner.lock_state();
            match made {
                Ok(spare) => state.segments.add_spare(spare),
                Err(err)
                    if err.kind() == io::ErrorKind::StorageFull
                        && !on_maintenance_thread
                        && state
                            .segments
                            .first_id()
                            .is_some_and(|first| first < active) =>
                {
                    // No room for a new file: the segments before the
                    // active one are checkpointed first, and once recycled
                    // one of them takes the active one's place.
                    wait_for_checkpoint_through(inner, state, active - 1)?;
                    state = inner.lock_state();
                    if !state.segments.has_spare() {
                        return Err(err);
                    }
                }
                Err(err) => return Err(err),
            }
        }
        if state.segments.active_id() == active {
            inner.switch_segment(&mut state)?;
        }
        active
    } else {
        active.saturating_sub(1)
    };
    if on_maintenance_thread {
        inner.signal().wake();
        return Ok(());
    }
    wait_for_checkpoint_through(inner, state, target)
}

/// Waits until every segment up to `target` is checkpointed and recycled
/// (a failed checkpoint is retried at once, and its error returned).
fn wait_for_checkpoint_through(
    inner: &Inner,
    mut state: parking_lot::MutexGuard<'_, crate::log::State>,
    target: u64,
) -> io::Result<()> {
    // Someone waits for this checkpoint: a failed one is retried now, not
    // after a backoff of up to two seconds.
    state.checkpoints.requested = true;
    inner.signal().wake();
    let attempts_before = state.checkpoints.attempts;
    loop {
        // A segment being finished has left `segments` but is not yet
        // renamed as recycled: until then a crash would replay it, so the
        // checkpoint is not over.
        let pending = state
            .segments
            .first_id()
            .is_some_and(|first| first <= target)
            || state
                .checkpoints
                .checkpointing
                .is_some_and(|id| id <= target);
        if let Some(err) = inner.failed() {
            return Err(err);
        }
        if !pending {
            return Ok(());
        }
        if state.checkpoints.attempts > attempts_before && state.checkpoints.checkpointing.is_none()
        {
            if let Some(err) = &state.checkpoints.error {
                return Err(io::Error::new(err.kind, err.message.clone()));
            }
        }
        if state.is_shutting_down() {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the log was shut down before the checkpoint finished",
            ));
        }
        if inner.maintenance_has_died() {
            // Nothing would ever finish it.
            return Err(io::Error::other(
                "the log's checkpoint thread has stopped (it panicked): no checkpoint can finish; \
                 reopen the log",
            ));
        }
        inner.wait_for_checkpoint(&mut state, IDLE_WAIT);
    }
}

pub(crate) fn shutdown(log: &WriteAheadLog) -> io::Result<()> {
    let inner = &log.inner;
    {
        let mut state = inner.lock_state();
        state.begin_shutdown();
        inner.wake_all_waiters();
    }
    let handle = inner.take_maintenance();
    let mut panicked = None;
    if let Some(handle) = handle {
        if handle.thread().id() != std::thread::current().id() && handle.join().is_err() {
            panicked = Some(io::Error::other("the checkpoint thread panicked"));
        }
    }
    if let Some(err) = inner.failed() {
        return Err(err);
    }
    // What was written is synced all the same.
    inner.sync_all()?;
    // And an end mark after the active segment's last record proves it:
    // damage there later is reported, not taken for a torn tail that
    // drops the entries after it.
    inner.write_shutdown_mark()?;
    panicked.map_or(Ok(()), Err)
}
