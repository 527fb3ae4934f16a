//! Counters a user can export, and the snapshot `WriteAheadLog::stats`
//! returns.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Live counters, updated with relaxed atomics on the paths they count.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub durable_commits: AtomicU64,
    pub buffered_commits: AtomicU64,
    pub rollbacks: AtomicU64,
    pub syncs: AtomicU64,
    pub synced_commits: AtomicU64,
    pub bytes_written: AtomicU64,
    pub checkpoints: AtomicU64,
    pub checkpoint_failures: AtomicU64,
    pub checkpoint_nanos: AtomicU64,
    pub last_checkpoint_nanos: AtomicU64,
    pub recycled_segments: AtomicU64,
    /// Commit records appended since the last sync (for `synced_commits`).
    pub unsynced_commits: AtomicU64,
    /// Bytes of buffered commits not yet covered by a sync.
    pub unsynced_bytes: AtomicU64,
}

impl Counters {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// What the log has done since it was opened; see
/// [`WriteAheadLog::stats`](crate::WriteAheadLog::stats).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogStats {
    /// Entries committed with [`EntryWriter::commit`](crate::EntryWriter::commit)
    /// (durable when counted).
    pub durable_commits: u64,
    /// Entries committed with [`EntryWriter::commit_buffered`](crate::EntryWriter::commit_buffered).
    pub buffered_commits: u64,
    /// Entries rolled back (explicitly or by dropping the writer).
    pub rollbacks: u64,
    /// `fdatasync` passes over the log (each may cover many commits).
    pub syncs: u64,
    /// Commit records covered by those syncs.
    pub synced_commits: u64,
    /// Bytes of records written to segment files.
    pub bytes_written: u64,
    /// Segments handed to `LogManager::checkpoint_to` successfully.
    pub checkpoints: u64,
    /// Checkpoint attempts that failed (and were retried).
    pub checkpoint_failures: u64,
    /// Time spent in checkpoints, in total.
    pub checkpoint_time: Duration,
    /// Time the last checkpoint took.
    pub last_checkpoint_time: Duration,
    /// Segments currently live (active, waiting for or in checkpoint).
    pub live_segments: u64,
    /// Spare files ready to become segments.
    pub spare_segments: u64,
    /// Segments recycled since opening.
    pub recycled_segments: u64,
}

impl LogStats {
    /// The average group-commit batch: commits covered per sync.
    #[must_use]
    pub fn entries_per_sync(&self) -> f64 {
        if self.syncs == 0 {
            0.0
        } else {
            self.synced_commits as f64 / self.syncs as f64
        }
    }

    pub(crate) fn from_counters(counters: &Counters, live: u64, spares: u64) -> Self {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Self {
            durable_commits: get(&counters.durable_commits),
            buffered_commits: get(&counters.buffered_commits),
            rollbacks: get(&counters.rollbacks),
            syncs: get(&counters.syncs),
            synced_commits: get(&counters.synced_commits),
            bytes_written: get(&counters.bytes_written),
            checkpoints: get(&counters.checkpoints),
            checkpoint_failures: get(&counters.checkpoint_failures),
            checkpoint_time: Duration::from_nanos(get(&counters.checkpoint_nanos)),
            last_checkpoint_time: Duration::from_nanos(get(&counters.last_checkpoint_nanos)),
            live_segments: live,
            spare_segments: spares,
            recycled_segments: get(&counters.recycled_segments),
        }
    }
}
