//! Counters a user can export, and the snapshot `WriteAheadLog::stats`
//! returns.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Live counters, updated with relaxed atomics on the paths they count,
/// through methods named for what happened.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    durable_commits: AtomicU64,
    buffered_commits: AtomicU64,
    rollbacks: AtomicU64,
    syncs: AtomicU64,
    synced_commits: AtomicU64,
    bytes_written: AtomicU64,
    checkpoints: AtomicU64,
    checkpoint_failures: AtomicU64,
    checkpoint_nanos: AtomicU64,
    last_checkpoint_nanos: AtomicU64,
    recycled_segments: AtomicU64,
    /// Commit records appended since the last sync (for `synced_commits`).
    unsynced_commits: AtomicU64,
    /// Bytes of buffered commits not yet covered by a sync.
    unsynced_bytes: AtomicU64,
}

impl Counters {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// The log wrote `bytes` bytes of records.
    pub fn wrote(&self, bytes: u64) {
        Self::add(&self.bytes_written, bytes);
    }

    /// A commit record was appended.
    pub fn commit_appended(&self) {
        Self::add(&self.unsynced_commits, 1);
    }

    /// The commit records appended since the last call: those a sync
    /// starting now covers.
    pub fn take_unsynced_commits(&self) -> u64 {
        self.unsynced_commits.swap(0, Ordering::AcqRel)
    }

    /// A sync pass covering `covered` commits ended; `synced_a_file` if it
    /// synced at least one file. Buffered bytes are no longer unsynced.
    pub fn sync_done(&self, synced_a_file: bool, covered: u64) {
        if synced_a_file {
            Self::add(&self.syncs, 1);
        }
        Self::add(&self.synced_commits, covered);
        self.unsynced_bytes.store(0, Ordering::Release);
    }

    /// Syncs counted so far (for readers of the live log).
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Acquire)
    }

    /// A durable commit returned.
    pub fn durable_commit(&self) {
        Self::add(&self.durable_commits, 1);
    }

    /// A buffered commit returned.
    pub fn buffered_commit(&self) {
        Self::add(&self.buffered_commits, 1);
    }

    /// Buffered commits counted so far (for readers of the live log).
    pub fn buffered_commits(&self) -> u64 {
        self.buffered_commits.load(Ordering::Acquire)
    }

    /// A buffered commit of `bytes` bytes is not synced yet; returns the
    /// bytes now waiting for a sync.
    pub fn add_unsynced_bytes(&self, bytes: u64) -> u64 {
        self.unsynced_bytes.fetch_add(bytes, Ordering::AcqRel) + bytes
    }

    /// Whether buffered commits wait for a sync.
    pub fn has_unsynced_bytes(&self) -> bool {
        self.unsynced_bytes.load(Ordering::Acquire) > 0
    }

    /// An entry was rolled back.
    pub fn rollback(&self) {
        Self::add(&self.rollbacks, 1);
    }

    /// A checkpoint succeeded after `nanos` nanoseconds.
    pub fn checkpoint_done(&self, nanos: u64) {
        Self::add(&self.checkpoints, 1);
        Self::add(&self.checkpoint_nanos, nanos);
        self.last_checkpoint_nanos.store(nanos, Ordering::Relaxed);
    }

    /// A checkpoint failed.
    pub fn checkpoint_failed(&self) {
        Self::add(&self.checkpoint_failures, 1);
    }

    /// A checkpointed segment was recycled.
    pub fn segment_recycled(&self) {
        Self::add(&self.recycled_segments, 1);
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
