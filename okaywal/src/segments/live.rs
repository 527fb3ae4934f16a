//! The write bookkeeping of one live segment: reservations, writes in
//! flight, the write buffer and the entries open in it. Only
//! [`super::Segments`] changes it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::Ranges;
use crate::segment::Segment;
use crate::tuning::RANGE_CAPACITY;

/// The write bookkeeping of one live segment, owned by [`super::Segments`].
#[derive(Debug)]
pub(crate) struct SegmentState {
    pub(super) segment: Arc<Segment>,
    /// The next free offset.
    pub(super) reserved_end: u64,
    /// Reservations whose record header is not written yet: start → end.
    pub(super) in_flight: BTreeMap<u64, u64>,
    /// Large chunk records whose data is not written yet (their writers
    /// copy it outside the lock; the header is in the file or the write
    /// buffer): their start offsets. They bound the durable mark, not the
    /// sync.
    pub(super) data_in_flight: BTreeSet<u64>,
    /// Small records (and large chunks' headers and trailers) copied into
    /// memory at reservation, in offset order, not yet written to the
    /// file: (start, bytes). The next sync leader (or a writer that finds
    /// too much buffered) writes them in one `pwrite` per contiguous range.
    pub(super) buffered: Ranges,
    pub(super) buffered_bytes: usize,
    /// Entries begun in this segment and not yet committed or rolled back.
    pub(super) open_entries: usize,
    /// Entries begun in this segment since it became active.
    pub(super) entries_begun: u64,
    /// The active segment passed its size (`Segments::segment_bytes`).
    pub(super) full: bool,
    /// No new entries go here; it is checkpointed once `open_entries` is 0.
    pub(super) sealed: bool,
    /// The highest entry id begun in this segment; `None` also for an
    /// abandoned segment, whose entries are not checkpointed.
    pub(super) last_entry_id: Option<u64>,
    /// The highest entry id known to be used in this segment (for naming
    /// the file when it is recycled, so ids never go backwards).
    pub(super) highest_id: u64,
    /// The highest id of an entry committed in this segment: once the
    /// segment is recycled, a reader that has not reached it lost entries.
    pub(super) highest_committed_id: Option<u64>,
}

impl SegmentState {
    pub(super) fn new(segment: Arc<Segment>, reserved_end: u64) -> Self {
        let highest_id = segment.id();
        Self {
            segment,
            reserved_end,
            in_flight: BTreeMap::new(),
            data_in_flight: BTreeSet::new(),
            buffered: Vec::new(),
            buffered_bytes: 0,
            open_entries: 0,
            entries_begun: 0,
            full: false,
            sealed: false,
            last_entry_id: None,
            highest_id,
            highest_committed_id: None,
        }
    }

    /// A segment recovered at open: sealed, its records ending at `end`.
    pub fn recovered(
        segment: Arc<Segment>,
        end: u64,
        last_entry_id: Option<u64>,
        highest_committed_id: Option<u64>,
    ) -> Self {
        let id = segment.id();
        let mut state = Self::new(segment, end);
        state.sealed = true;
        state.last_entry_id = last_entry_id;
        state.highest_id = last_entry_id.unwrap_or(id).max(id);
        state.highest_committed_id = highest_committed_id;
        state
    }

    /// The segment file.
    pub fn segment(&self) -> &Arc<Segment> {
        &self.segment
    }

    /// The highest id of an entry committed in this segment.
    pub fn highest_committed_id(&self) -> Option<u64> {
        self.highest_committed_id
    }

    /// The end of the reservations.
    pub fn reserved_end(&self) -> u64 {
        self.reserved_end
    }

    /// Records wait in the write buffer.
    pub fn has_buffered(&self) -> bool {
        !self.buffered.is_empty()
    }

    /// The segment is closed, owes an end mark, and every write into it
    /// has landed: the mark can be written at its end.
    pub fn end_mark_due(&self) -> bool {
        self.sealed
            && self.open_entries == 0
            && self.in_flight.is_empty()
            && self.data_in_flight.is_empty()
            && self.segment.end_mark_due()
    }

    /// Every record below this offset has its header in the file (page
    /// cache) or in the buffer that the next sync writes first, so a sync
    /// up to here leaves a log recovery can walk.
    pub fn written_to(&self) -> u64 {
        self.in_flight
            .keys()
            .next()
            .copied()
            .unwrap_or(self.reserved_end)
    }

    /// Every byte below this offset, large chunks' data included, is in
    /// the file or the write buffer: a sync up to here may raise the
    /// durable mark to here.
    pub fn complete_to(&self) -> u64 {
        let written = self.written_to();
        self.data_in_flight
            .first()
            .map_or(written, |&start| start.min(written))
    }

    /// This segment is closed (no entry is open in it) but some of its
    /// records are still being written. The next segment's header names
    /// it as its predecessor, and recovery takes any synced record there
    /// as proof that this one was synced whole, so the next segment must
    /// not be synced until these writes land.
    pub fn closed_with_writes_in_flight(&self) -> bool {
        self.open_entries == 0 && self.written_to() < self.reserved_end
    }

    pub(super) fn ready_for_checkpoint(&self) -> bool {
        self.sealed && self.open_entries == 0 && self.in_flight.is_empty()
    }

    /// Marks the segment full once it passed `full_at` (given for the
    /// active segment only).
    pub(super) fn note_size(&mut self, full_at: Option<u64>) {
        if full_at.is_some_and(|limit| self.reserved_end >= limit) {
            self.full = true;
        }
    }

    /// Takes the write buffer if it has grown past `buffer_bytes`.
    pub(super) fn overflow(&mut self, buffer_bytes: usize) -> Option<Ranges> {
        (self.buffered_bytes >= buffer_bytes).then(|| self.take_buffered())
    }

    /// Appends `bytes`, which start at `offset`, to the write buffer.
    pub(super) fn buffer(&mut self, offset: u64, bytes: &[&[u8]]) {
        let contiguous = self
            .buffered
            .last()
            .is_some_and(|(start, data)| start + data.len() as u64 == offset);
        if !contiguous {
            // Records arrive in pieces (header, data, trailer) and batches
            // of many: starting a batch at a page saves the reallocations
            // of growing from empty for every sync. Only the batch's first
            // range: large chunks leave a range per header and trailer,
            // thousands of them before an entry's commit, and a page each
            // would hold far more memory than they need.
            let len: usize = bytes.iter().map(|piece| piece.len()).sum();
            let capacity = if self.buffered.is_empty() {
                len.max(RANGE_CAPACITY)
            } else {
                len
            };
            self.buffered.push((offset, Vec::with_capacity(capacity)));
        }
        let range = &mut self.buffered.last_mut().expect("just ensured").1;
        for piece in bytes {
            range.extend_from_slice(piece);
            self.buffered_bytes += piece.len();
        }
    }

    /// Takes the buffered ranges for writing; they count as in flight (a
    /// hole) until written, so nobody syncs or checkpoints past them.
    pub(super) fn take_buffered(&mut self) -> Ranges {
        let ranges = std::mem::take(&mut self.buffered);
        self.buffered_bytes = 0;
        for (start, data) in &ranges {
            self.in_flight.insert(*start, start + data.len() as u64);
        }
        ranges
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    use crate::fs::{FileSystem, MemoryFileSystem, OpenMode};

    #[test]
    fn only_a_batch_s_first_range_gets_a_page_of_capacity() {
        let fs = MemoryFileSystem::new();
        fs.create_dir_all(Path::new("/")).expect("root");
        let file = fs
            .open(Path::new("/wal-1"), OpenMode::CreateNew)
            .expect("memory file");
        let segment = Arc::new(Segment::new(
            1,
            file,
            crate::segment::SyncHandles::none(),
            PathBuf::from("/wal-1"),
            None,
            0,
            Arc::default(),
            crate::sealed::Layout::Plain,
        ));
        let mut state = SegmentState::new(segment, 0);
        // A header and a trailer per large chunk, with the data between.
        for chunk in 0..1_000_u64 {
            let start = chunk * 100_000;
            state.buffer(start, &[&[1; 25]]);
            state.buffer(start + 50_000, &[&[2; 4]]);
        }
        assert_eq!(state.buffered.len(), 2_000);
        assert_eq!(state.buffered_bytes, 29_000);
        let capacity: usize = state.buffered.iter().map(|(_, data)| data.capacity()).sum();
        assert!(
            capacity < 29_000 + RANGE_CAPACITY + 2_000 * 8,
            "{capacity} bytes of capacity for 29,000 buffered"
        );
        // Contiguous records extend the first range.
        state.take_buffered();
        state.buffer(0, &[&[3; 100]]);
        state.buffer(100, &[&[4; 50]]);
        assert_eq!(state.buffered.len(), 1);
        assert_eq!(state.buffered[0].1.len(), 150);
    }
}
