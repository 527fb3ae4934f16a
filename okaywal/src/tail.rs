//! Reading the live log while it is written: committed, durable entries in
//! id order, and waiting for the next one.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::sync::atomic::Ordering;
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
}

/// Committed entries of the live log from some id on, in id order; see
/// [`WriteAheadLog::entries_from`]. Iterating ends when no further entry
/// is durable yet; [`LogEntries::next_timeout`] waits for the next one.
#[derive(Debug)]
pub struct LogEntries {
    log: WriteAheadLog,
    next: u64,
    ready: VecDeque<LiveEntry>,
    /// One walk per live segment, by segment id, each advanced to the
    /// segment's synced end at every refill.
    scanners: HashMap<u64, SegmentScanner>,
    /// The walks' read buffer.
    buffer: Vec<u8>,
}

impl LogEntries {
    pub(crate) fn new(log: WriteAheadLog, from: EntryId) -> Self {
        Self {
            log,
            // Ids start at 1.
            next: from.0.max(1),
            ready: VecDeque::new(),
            scanners: HashMap::new(),
            buffer: Vec::new(),
        }
    }

    /// The id the next entry returned will have at least.
    #[must_use]
    pub fn position(&self) -> EntryId {
        self.ready.front().map_or(EntryId(self.next), LiveEntry::id)
    }

    /// Returns the next entry, waiting up to `timeout` for one to become
    /// durable; `Ok(None)` if none did.
    pub fn next_timeout(&mut self, timeout: Duration) -> io::Result<Option<LiveEntry>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(entry) = self.ready.pop_front() {
                return Ok(Some(entry));
            }
            let before = self.log.inner.counters.syncs.load(Ordering::Acquire);
            self.refill()?;
            if let Some(entry) = self.ready.pop_front() {
                return Ok(Some(entry));
            }
            let inner = &self.log.inner;
            let mut state = inner.state.lock();
            if inner.counters.syncs.load(Ordering::Acquire) == before
                && inner.synced.wait_until(&mut state, deadline).timed_out()
            {
                drop(state);
                self.refill()?;
                return Ok(self.ready.pop_front());
            }
        }
    }

    /// Reads what has become durable since the last call.
    fn refill(&mut self) -> io::Result<()> {
        let inner = &self.log.inner;
        inner.prune_pending_commits();
        let (segments, stable_through, recycled_through) = {
            let state = inner.state.lock();
            inner.check_usable(&state)?;
            // Every entry up to here is finished, and every commit among
            // them is durable: the reader may move past all of them.
            let blocked = [state.open_ids.first(), state.pending_commits.keys().next()]
                .into_iter()
                .flatten()
                .min()
                .copied()
                .unwrap_or(state.next_entry_id);
            let segments: Vec<Arc<Segment>> = state
                .segments
                .values()
                .map(|seg| seg.segment.clone())
                .collect();
            (segments, blocked - 1, state.recycled_through)
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
            .retain(|id, _| segments.iter().any(|segment| segment.id == *id));
        // Entry id → (index into `segments`, (chunks, commit offset)).
        let mut found: BTreeMap<u64, (usize, Located)> = BTreeMap::new();
        for (index, segment) in segments.iter().enumerate() {
            // Only the durable part: it is all in the file, with no holes.
            let limit = segment.synced_to.load(Ordering::Acquire);
            if limit <= crate::format::HEADER_SIZE {
                continue;
            }
            let scanner = self
                .scanners
                .entry(segment.id)
                .or_insert_with(|| SegmentScanner::new(segment.id, inner.config.buffer_bytes));
            // Damage is skipped where recovery skipped it, so the entries
            // recovery presented after it are not passed over here.
            let skip_damage = inner.config.recovery_mode == RecoveryMode::SkipCorrupted;
            scanner.advance(&*segment.file, limit, skip_damage, &mut self.buffer)?;
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
                segment.id,
                &segment.version_info,
                segment.file.clone(),
                entries,
                None,
            );
            while let Some(mut entry) = reader.read_entry()? {
                let id = entry.id();
                let chunks = entry.read_all_chunks()?.ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("entry {id} changed while being read"),
                    )
                })?;
                self.ready.push_back(LiveEntry { id, chunks });
            }
        }
        Ok(())
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
