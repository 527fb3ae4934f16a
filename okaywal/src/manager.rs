//! The callbacks through which the log hands its data to the user's store.

use std::io;

use crate::recovery::{Entry, SegmentReader};
use crate::WriteAheadLog;

/// What to do with a segment found during recovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// Replay the segment's entries through [`LogManager::recover`].
    Recover,
    /// Discard the segment without replaying it: it is recycled before
    /// the open returns, so its entries never come back, not even after a
    /// crash right after the open.
    Abandon,
}

/// A segment found on disk when the log is opened.
#[derive(Debug, Clone)]
pub struct RecoveredSegment {
    /// The segment's id (the first entry id it may contain).
    pub id: u64,
    /// The version information written in the segment's header.
    pub version_info: Vec<u8>,
}

impl RecoveredSegment {
    /// The version information written in the segment's header.
    #[must_use]
    pub fn version_info(&self) -> &[u8] {
        &self.version_info
    }
}

/// The user's side of the log: replays entries at open and moves entries
/// into the primary store when a segment is checkpointed.
///
/// Recovery calls happen on the thread that opens the log; checkpoints
/// happen on the log's background thread, one at a time, in segment order.
pub trait LogManager: Send + 'static {
    /// Decides whether a segment found at open is replayed or abandoned.
    /// The default recovers every segment.
    fn should_recover_segment(&mut self, _segment: &RecoveredSegment) -> io::Result<Recovery> {
        Ok(Recovery::Recover)
    }

    /// Called once for each complete (committed) entry found at open, in id
    /// order. Rolled-back, torn and partially written entries are never
    /// passed here.
    ///
    /// An entry may be replayed again after it was checkpointed if the
    /// process died between `checkpoint_to` returning and the segment being
    /// recycled; managers that cannot apply an entry twice should remember
    /// the last checkpointed id and skip entries at or below it.
    fn recover(&mut self, entry: &mut Entry<'_>) -> io::Result<()>;

    /// Makes every entry in `checkpointed_entries` durable in the primary
    /// store. Every entry with an id ≤ `last_checkpointed_id` that was not
    /// handed to an earlier `checkpoint_to` is in this segment, and none
    /// after it. When this returns `Ok`, the segment is recycled; on `Err`
    /// it is kept and the checkpoint is retried later: after 0.1 s, then
    /// after twice as long each time up to 2 s, or at once when
    /// [`WriteAheadLog::checkpoint_active`] is called. A panic here fails
    /// the checkpoint the same way (its message becomes the error that
    /// `checkpoint_active` returns); the panic is still printed.
    ///
    /// While checkpoints fail, writers are not held back: the log keeps
    /// taking commits into new segments, which the next successful
    /// checkpoints work through in order, so a manager that keeps failing
    /// lets the directory grow.
    fn checkpoint_to(
        &mut self,
        last_checkpointed_id: crate::EntryId,
        checkpointed_entries: &mut SegmentReader,
        wal: &WriteAheadLog,
    ) -> io::Result<()>;
}

/// A [`LogManager`] that ignores everything: recovered entries are dropped
/// and checkpoints succeed at once.
#[derive(Debug, Default, Clone, Copy)]
pub struct LogVoid;

impl LogManager for LogVoid {
    fn recover(&mut self, _entry: &mut Entry<'_>) -> io::Result<()> {
        Ok(())
    }

    fn checkpoint_to(
        &mut self,
        _last_checkpointed_id: crate::EntryId,
        _checkpointed_entries: &mut SegmentReader,
        _wal: &WriteAheadLog,
    ) -> io::Result<()> {
        Ok(())
    }
}
