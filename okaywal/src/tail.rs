//! Reading the live log while it is written: committed entries in id
//! order (durable ones, or also those handed to the operating system), and
//! waiting for the next one.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::RecoveryMode;
use crate::position::EntryId;
use crate::recovery::{ChunkLocation, SegmentReader, SegmentScanner};
use crate::segment::Segment;
use crate::WriteAheadLog;

/// An entry's chunk locations and the offset of its commit record.
type Located = (Vec<ChunkLocation>, u64);

/// A committed entry read back from the live log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveEntry {
    id: EntryId,
    chunks: Vec<Vec<u8>>,
    /// Whether each chunk is pre-sealed.
    presealed: Vec<bool>,
}

impl LiveEntry {
    /// The entry's id.
    #[must_use]
    pub fn id(&self) -> EntryId {
        self.id
    }

    /// The entry's chunks, in the order they were written.
    #[must_use]
    pub fn chunks(&self) -> &[Vec<u8>] {
        &self.chunks
    }

    /// Takes the chunks.
    #[must_use]
    pub fn into_chunks(self) -> Vec<Vec<u8>> {
        self.chunks
    }

    /// Whether chunk `index` was written with
    /// [`EntryWriter::write_presealed_chunk`](crate::EntryWriter::write_presealed_chunk)
    /// into an encrypted log, so that only its writer's own seal
    /// authenticates it (see
    /// [`EntryChunk::is_presealed`](crate::EntryChunk::is_presealed));
    /// `false` for every other chunk and for an index past the last.
    #[must_use]
    pub fn is_presealed(&self, index: usize) -> bool {
        self.presealed.get(index).copied().unwrap_or(false)
    }
}

/// Committed entries of the live log from some id on, in id order; see
/// [`WriteAheadLog::entries_from`]. Iterating ends when no further entry
/// is durable yet (or, with [`LogEntries::include_buffered`], handed to
/// the operating system); [`LogEntries::next_timeout`] waits for the next
/// one.
#[derive(Debug)]
pub struct LogEntries {
    log: WriteAheadLog,
    /// Entries committed with [`Durability::Buffered`](crate::Durability)
    /// are returned before they are synced.
    include_buffered: bool,
    next: u64,
    ready: VecDeque<LiveEntry>,
    /// One walk per live segment, by segment id, each advanced to the
    /// segment's readable end at every refill.
    scanners: HashMap<u64, SegmentScanner>,
    /// The walks' read buffer.
    buffer: Vec<u8>,
}

impl LogEntries {
    pub(crate) fn new(log: WriteAheadLog, from: EntryId) -> Self {
        Self {
            log,
            include_buffered: false,
            // Ids start at 1.
            next: from.0.max(1),
            ready: VecDeque::new(),
            scanners: HashMap::new(),
            buffer: Vec::new(),
        }
    }

    /// Also returns entries whose commit is not durable yet: those
    /// committed with [`Durability::Buffered`](crate::Durability::Buffered)
    /// as soon as their records are handed to the operating system, in a
    /// segment file that has its name (so that a crash of the process
    /// keeps them). Such an entry may still be lost to a power loss, and
    /// its writer's commit call may still fail (a failed sync that
    /// [`Configuration::max_unsynced_bytes`](crate::Configuration::max_unsynced_bytes)
    /// started): a replica that applies it may get ahead of what the log
    /// keeps.
    ///
    /// ```
    /// # fn main() -> std::io::Result<()> {
    /// use okaywal::{Configuration, LogVoid};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let log = Configuration::default_for(dir.path()).open(LogVoid)?;
    /// // (The first commit into a segment file is synced in any case.)
    /// log.begin_entry()?.commit()?;
    /// let mut entry = log.begin_entry()?;
    /// entry.write_chunk(b"not synced yet")?;
    /// let id = entry.commit_buffered()?;
    ///
    /// assert!(log.entries_from(id).next().is_none(), "not durable");
    /// let mut buffered = log.entries_from(id).include_buffered();
    /// let seen = buffered.next().expect("handed to the OS")?;
    /// assert_eq!(seen.chunks(), [b"not synced yet".to_vec()]);
    /// log.shutdown()?;
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn include_buffered(mut self) -> Self {
        if !self.include_buffered {
            self.include_buffered = true;
            self.log.inner.follow_buffered(true);
        }
        self
    }

    /// What makes more entries readable: syncs, and buffered commits when
    /// this reader takes them.
    fn progress(&self) -> u64 {
        let counters = self.log.inner.counters();
        let syncs = counters.syncs() + self.log.inner.unblocking_rollbacks();
        if self.include_buffered {
            syncs + counters.buffered_commits()
        } else {
            syncs
        }
    }

    /// The id the next entry returned will have at least.
    #[must_use]
    pub fn position(&self) -> EntryId {
        self.ready.front().map_or(EntryId(self.next), LiveEntry::id)
    }

    /// Returns the next entry, waiting up to `timeout` for one to become
    /// durable (or, with [`LogEntries::include_buffered`], handed to the
    /// operating system); `Ok(None)` if none did. A wait ends with an
    /// error as soon as the log is shut down or has failed. A timeout too
    /// long for the clock (such as `Duration::MAX`) waits without a limit.
    pub fn next_timeout(&mut self, timeout: Duration) -> io::Result<Option<LiveEntry>> {
        // A timeout too long to add to the clock (`Duration::MAX`, say)
        // waits without a deadline.
        let deadline = Instant::now().checked_add(timeout);
        loop {
            if let Some(entry) = self.ready.pop_front() {
                return Ok(Some(entry));
            }
            let before = self.progress();
            self.refill()?;
            if let Some(entry) = self.ready.pop_front() {
                return Ok(Some(entry));
            }
            let inner = &self.log.inner;
            let mut state = inner.lock_state();
            // `synced` is shared by every reader: a wake-up that moved
            // nothing this reader counts (a buffered commit, for a reader
            // of durable entries only) waits again instead of refilling.
            // A shut-down or failed log wakes readers too: the refill
            // then returns its error.
            while self.progress() == before && inner.check_usable(&state).is_ok() {
                let timed_out = inner.wait_for_sync(&mut state, deadline);
                if timed_out {
                    drop(state);
                    self.refill()?;
                    return Ok(self.ready.pop_front());
                }
            }
        }
    }

    /// Reads what has become readable (durable, or with
    /// `include_buffered` in the file) since the last call.
    fn refill(&mut self) -> io::Result<()> {
        let inner = &self.log.inner;
        inner.prune_pending_commits();
        let (segments, in_file, stable_through, recycled_through) = {
            let state = inner.lock_state();
            inner.check_usable(&state)?;
            let segments: Vec<Arc<Segment>> = state.segments.live_segments();
            // With buffered entries: per segment, where the records that
            // are in the file end (none below is still in the write
            // buffer or being written by another thread).
            let in_file: HashMap<u64, u64> = if self.include_buffered {
                state.segments.in_file_ends()
            } else {
                HashMap::new()
            };
            let stable_through = state.readable_through(self.include_buffered.then_some(&in_file));
            (segments, in_file, stable_through, state.recycled_through())
        };
        if self.next <= recycled_through {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "entry {} is no longer in the log: committed entries through {recycled_through} were \
                     checkpointed and their segments recycled",
                    self.next
                ),
            ));
        }
        if stable_through < self.next {
            return Ok(());
        }
        // Walks of segments that were recycled are of no further use.
        self.scanners
            .retain(|id, _| segments.iter().any(|segment| segment.id() == *id));
        // Entry id → (index into `segments`, (chunks, commit offset)).
        let mut found: BTreeMap<u64, (usize, Located)> = BTreeMap::new();
        for (index, segment) in segments.iter().enumerate() {
            // Only the durable part, or the part in the file: either is
            // final, and large chunks' data not yet copied in is read
            // again at their commit (see `SegmentScanner`).
            let synced = segment.synced_to();
            let limit = in_file
                .get(&segment.id())
                .map_or(synced, |in_file| synced.max(*in_file));
            if limit <= crate::format::HEADER_SIZE {
                continue;
            }
            let scanner = self.scanners.entry(segment.id()).or_insert_with(|| {
                SegmentScanner::with_layout(
                    segment.layout().clone(),
                    segment.id(),
                    inner.config().buffer_bytes,
                )
            });
            // Damage is skipped where recovery skipped it, so the entries
            // recovery presented after it are not passed over here.
            let skip_damage = inner.config().recovery_mode == RecoveryMode::SkipCorrupted;
            scanner.advance(&**segment.file(), limit, skip_damage, &mut self.buffer)?;
            // Every byte below `limit` is final, so a walk that stops short
            // of it, or finds damage, met bytes that changed after they were
            // written: going on would pass over an acknowledged entry. The
            // reader stays where it is, and every retry reports the same.
            if !skip_damage {
                let scan = scanner.scan_mut();
                let failed = scan
                    .failed_commit
                    .as_ref()
                    .map(|failed| (failed.at, failed.reason.clone()));
                if let Some((offset, reason)) = scan
                    .damage
                    .clone()
                    .or_else(|| scan.stopped.clone())
                    .or(failed)
                {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "segment {}: damaged record at offset {offset} ({reason}); the \
                             entries from {} on cannot be read past it. Reopening the log \
                             reports it (or ends the log there); RecoveryMode::PointInTime \
                             keeps only what precedes it, RecoveryMode::SkipCorrupted skips it",
                            segment.path().display(),
                            self.next,
                        ),
                    ));
                }
            }
            // Entries before `next` were returned already (or were not
            // asked for); entries after `stable_through` wait for a later
            // refill, when every entry before them is finished.
            found.extend(
                scanner
                    .scan_mut()
                    .committed
                    .range(self.next..=stable_through)
                    .map(|(id, located)| (*id, (index, located.clone()))),
            );
        }
        // Only once every entry was read do they leave the scanners and
        // does `next` move on: after an error, the caller's retry finds
        // them again.
        let ready_before = self.ready.len();
        if let Err(err) = self.read_found(&segments, found) {
            self.ready.truncate(ready_before);
            return Err(err);
        }
        for scanner in self.scanners.values_mut() {
            let committed = &mut scanner.scan_mut().committed;
            *committed = committed.split_off(&(stable_through + 1));
        }
        self.next = stable_through + 1;
        Ok(())
    }

    /// Reads the chunks of `found` (entry id → index into `segments`,
    /// location) into `ready`, in id order.
    fn read_found(
        &mut self,
        segments: &[Arc<Segment>],
        found: BTreeMap<u64, (usize, Located)>,
    ) -> io::Result<()> {
        // Read runs of consecutive entries of one segment with one reader.
        let mut found = found.into_iter().peekable();
        while let Some((id, (index, chunks))) = found.next() {
            let mut entries = BTreeMap::from([(id, chunks)]);
            while let Some((next_id, (_, next_chunks))) =
                found.next_if(|(_, (next_index, _))| *next_index == index)
            {
                entries.insert(next_id, next_chunks);
            }
            let segment = &segments[index];
            let mut reader = SegmentReader::new(
                segment.id(),
                segment.version_info(),
                segment.file().clone(),
                segment.layout().clone(),
                entries,
                None,
            );
            while let Some(mut entry) = reader.read_entry()? {
                let id = entry.id();
                let (chunks, presealed) = entry.read_all_chunks_flagged()?.ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("entry {id} changed while being read"),
                    )
                })?;
                self.ready.push_back(LiveEntry {
                    id,
                    chunks,
                    presealed,
                });
            }
        }
        Ok(())
    }
}

impl Drop for LogEntries {
    fn drop(&mut self) {
        if self.include_buffered {
            self.log.inner.follow_buffered(false);
        }
    }
}

impl Iterator for LogEntries {
    type Item = io::Result<LiveEntry>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.ready.is_empty() {
            if let Err(err) = self.refill() {
                return Some(Err(err));
            }
        }
        self.ready.pop_front().map(Ok)
    }
}
