//! Every I/O tuning constant of the log in one place: buffer and window
//! sizes, thresholds that choose between two ways of doing the same
//! thing, bounds on waits and on how many files are kept.
//!
//! None of them is part of the on-disk format (`crate::format` holds
//! those) or of the durability contract: each trades throughput, latency
//! or disk space, and the log stays correct with any positive value.
//! What a user may choose lives in [`crate::Configuration`] instead
//! (`buffer_bytes`, `preallocate_bytes`, `checkpoint_after_bytes`,
//! `max_unsynced`).

use std::time::Duration;

// --- The write path -------------------------------------------------------

/// Chunks larger than this are copied into the file by their writers,
/// outside the log's lock, while their header and trailer go through the
/// write buffer, so that other committers need not wait for the copy (see
/// FORMAT.md).
pub(crate) const INLINE_CHUNK_LIMIT: usize = 64 * 1024;

/// An encrypted large chunk is sealed and written this many frames
/// (64 KiB each) at a time, so that its writer holds one batch of
/// ciphertext in memory, not the whole chunk.
pub(crate) const SEAL_BATCH_FRAMES: u64 = 16;

/// Entries from this size commit with a sync pass of their own (see
/// `EntryWriter::commit_with`): their writers gain more from overlapping
/// syncs than from sharing one.
pub(crate) const OWN_SYNC_BYTES: usize = 256 * 1024;

/// A large chunk's writer starts the write-back of its data as soon as
/// it is in the file when the chunk (or, encrypted, one batch of its
/// frames) is at least this large (see `FileHandle::start_writeback`):
/// with several writers, the device then writes each one's data while the
/// others still copy theirs, where otherwise it all waits for the first
/// sync. The same size as [`OWN_SYNC_BYTES`]: smaller chunks commit with
/// group syncs, which send many writers' records in one request anyway.
/// Only when another entry is open (`Inner::others_writing`).
pub(crate) const START_WRITEBACK_BYTES: usize = 256 * 1024;

/// Handles of its own (open file descriptions) each segment file keeps
/// for syncs that overlap (see `FileHandle::sync_handle`): a sync
/// through one counts at once, one through the shared handle only once
/// every sync that overlapped it has ended.
pub(crate) const SYNC_HANDLES: usize = 8;

/// Initial capacity of the first range of a batch in a segment's write
/// buffer (see `SegmentState::buffer`).
pub(crate) const RANGE_CAPACITY: usize = 4096;

// --- Group commit ---------------------------------------------------------

/// The longest a sync leader waits for committers to join its sync.
pub(crate) const MAX_GATHER: Duration = Duration::from_millis(1);

/// A leader gathers for at most the previous sync's duration divided by
/// this.
pub(crate) const GATHER_DIVISOR: u32 = 2;

/// The shortest pause of the background sync thread: a zero (or tiny)
/// `max_unsynced` would otherwise keep a core busy polling for the whole
/// life of the log.
pub(crate) const MIN_SYNC_INTERVAL: Duration = Duration::from_millis(1);

// --- Segments and spares --------------------------------------------------

/// Spare segment files kept for reuse; more are deleted after recycling.
pub(crate) const MAX_SPARES: usize = 2;

/// Live segments (active plus those waiting for their checkpoint) above
/// which `begin_entry` waits for the checkpointer (a write stall).
pub(crate) const MAX_UNCHECKPOINTED: usize = 4;

/// How often a writer held back by [`MAX_UNCHECKPOINTED`] looks again
/// (it is woken after every checkpoint as well).
pub(crate) const STALL_WAIT: Duration = Duration::from_millis(100);

/// How long a thread waiting for writes in flight to land sleeps before
/// it looks again (it is woken when they land as well).
pub(crate) const PROGRESS_WAIT: Duration = Duration::from_millis(10);

/// The smallest size a spare segment file is preallocated to when the disk
/// is too full for `Configuration::preallocate_bytes` (see
/// `Inner::create_spare`).
pub(crate) const MIN_PREALLOCATE_BYTES: u64 = 64 << 10;

/// The largest `Configuration::preallocate_bytes` an open accepts: every
/// spare segment file is zero-filled to it, and on a disk too full for
/// that, filled again at half the size.
pub(crate) const MAX_PREALLOCATE_BYTES: u64 = 4 << 30;

/// The largest `Configuration::buffer_bytes` an open accepts: every
/// segment scan allocates a read buffer of this size.
pub(crate) const MAX_BUFFER_BYTES: usize = 256 << 20;

/// A log whose full segments hold fewer entries than this (entries of
/// hundreds of KiB and more) makes its later segments larger, up to
/// [`MAX_SEGMENT_GROWTH`] × `Configuration::checkpoint_after_bytes`:
/// every switch drains the open entries, syncs the new header, and renames
/// the file with a directory sync, and with 1 MiB entries in 32 MiB
/// segments that came every 32 commits (see `Segments::segment_bytes`).
pub(crate) const MIN_ENTRIES_PER_SEGMENT: u64 = 128;

/// The smallest `Configuration::checkpoint_after_bytes` for which
/// segments are sized up for large entries: a log configured with smaller
/// segments asked to checkpoint that often, and keeps them.
pub(crate) const MIN_SIZED_SEGMENT_BYTES: u64 = 1 << 20;

/// How many times `Configuration::checkpoint_after_bytes` a segment of
/// large entries may hold (and its spare be preallocated to, scaled from
/// `preallocate_bytes`) before it is full.
pub(crate) const MAX_SEGMENT_GROWTH: u64 = 8;

/// How long `begin_entry` waits for the entries still open in a full
/// active segment to finish before it starts the next segment anyway.
pub(crate) const DRAIN_WAIT: Duration = Duration::from_millis(100);

/// The largest single write of zeros when a file is preallocated.
pub(crate) const ZERO_FILL_PIECE: usize = 1 << 20;

// --- Reading segments -----------------------------------------------------

/// Chunks up to this size are read together with their header, through
/// the reader's window.
pub(crate) const PREFETCH_CHUNK_BYTES: usize = 64 * 1024;

/// The most a reader's window reads ahead of the record it was asked for.
pub(crate) const WINDOW_BYTES: usize = 256 * 1024;

/// The least read-ahead a window shrinks to.
pub(crate) const MIN_AHEAD: usize = 4096;

// --- The background thread ------------------------------------------------

/// How long the maintenance thread sleeps when it has nothing to do, and
/// the first retry delay after a failed checkpoint or spare.
pub(crate) const IDLE_WAIT: Duration = Duration::from_millis(100);

/// The longest retry delay after repeated failures.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(2);

// --- Locking the directory ------------------------------------------------

/// How long to wait for another process to let go of the directory's
/// lock: one that was just killed keeps its locks until the kernel has
/// torn it down.
pub(crate) const LOCK_PATIENCE: Duration = Duration::from_secs(2);
