//! The live segments: the active one, those sealed and waiting for their
//! checkpoint, the spare files ready to become the next active segment,
//! and the checkpointed files waiting for their last reader before they
//! are reused.
//!
//! [`Segments`] owns all of them and the write bookkeeping of each live
//! segment ([`SegmentState`]); it lives inside the log's state, under the
//! log's one lock, and nothing outside this module changes its fields.
//! Others use its operations: the append path reserves and buffers
//! records, the sync path takes buffered ranges and asks what a sync must
//! cover, the checkpointer asks for the next checkpointable segment and
//! finishes it, the maintenance thread hands over new spares. Operations
//! that should wake a thread say so in their result; waking is the
//! caller's (this module knows no condition variables).
//!
//! The file is a little over 700 lines because `Segments`' methods belong
//! together: each is a short operation on the same private maps, and
//! they keep one set of invariants (ids and offsets only grow, a segment
//! is checkpointed only once sealed, drained and fully written) that a
//! split would spread over files. The per-segment bookkeeping is apart,
//! in `live.rs`.

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

pub(crate) use live::SegmentState;

use crate::encryption::Cipher;
use crate::format::{
    aligned_chunk_start_after, RecordHeader, RecordKind, SegmentHeader, CHUNK_ALIGNMENT,
    CHUNK_TRAILER_SIZE, HEADER_SIZE,
};
use crate::fs::FileHandle;
use crate::sealed::{Layout, SegmentSeal};
use crate::segment::{FileName, Segment, SyncHandles};
use crate::tuning::{
    MAX_PREALLOCATE_BYTES, MAX_SEGMENT_GROWTH, MAX_SPARES, MIN_ENTRIES_PER_SEGMENT,
    MIN_SIZED_SEGMENT_BYTES,
};

mod live;

/// A preallocated file ready to become a segment.
#[derive(Debug)]
pub(crate) struct Spare {
    /// The open file.
    pub file: Arc<dyn FileHandle>,
    /// The file's own handles for overlapping syncs.
    pub sync_handles: SyncHandles,
    /// Its current (spare or recycled) name.
    pub path: PathBuf,
    /// A recycled segment that grew past its preallocated size: cut back
    /// to that size once the log is idle (see [`Segments::trim_spares`]).
    pub grown: bool,
}

/// Buffered ranges taken for writing: (start offset, bytes).
pub(crate) type Ranges = Vec<(u64, Vec<u8>)>;

/// What the settings of the log that segments need.
#[derive(Debug)]
pub(crate) struct SegmentSettings {
    /// The log's directory.
    pub directory: PathBuf,
    /// Written into every new segment's header.
    pub version_info: Arc<Vec<u8>>,
    /// The active segment is full from this many bytes on (more for
    /// large entries: see [`Segments::segment_bytes`]).
    pub checkpoint_after_bytes: u64,
    /// A segment's write buffer is written out from this many bytes on.
    pub buffer_bytes: usize,
    /// New segments are encrypted with the provider's current key.
    pub cipher: Option<Cipher>,
}

/// A record placed in a segment (see [`Segments::append_record`]).
#[derive(Debug)]
pub(crate) struct Placed {
    /// The record's offset.
    pub offset: u64,
    /// The offset just past it.
    pub end: u64,
    /// Bytes it took in the segment (padding included).
    pub bytes: u64,
    /// The segment's write buffer is full: write these ranges now.
    pub flush: Option<Ranges>,
    /// The maintenance thread has work: a spare is due, or the segment can
    /// be checkpointed.
    pub wake: bool,
}

/// What finishing an entry in a segment changed.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Finished {
    /// The segment can be checkpointed now.
    pub checkpointable: bool,
    /// The segment is full and no entry is open in it any more.
    pub drained: bool,
}

/// The segment checkpointed next, as [`Segments::next_checkpointable`]
/// found it.
#[derive(Debug)]
pub(crate) struct Checkpointable {
    /// The segment.
    pub segment: Arc<Segment>,
    /// Where its records end.
    pub limit: u64,
    /// The highest entry id begun in it.
    pub last_entry_id: Option<u64>,
}

/// What a checkpointed segment held, for naming its file and for readers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Retired {
    /// The highest entry id used in it.
    pub highest_id: u64,
    /// The highest id of an entry committed in it.
    pub highest_committed_id: Option<u64>,
}

/// The active segment, the live ones, the spares and the files being
/// recycled (see the module docs).
#[derive(Debug)]
pub(crate) struct Segments {
    settings: SegmentSettings,
    /// The id of the active segment (new entries go there).
    active: u64,
    /// Every live segment: active, sealed with open entries, or waiting to
    /// be checkpointed.
    live: BTreeMap<u64, SegmentState>,
    spares: Vec<Spare>,
    /// Checkpointed segments waiting for their last reader to finish.
    recycling: Vec<(Arc<Segment>, PathBuf)>,
    next_spare_number: u64,
    /// The maintenance thread should make a spare (once the active
    /// segment is half full).
    want_spare: bool,
    /// How many bytes the active segment takes before it is full:
    /// `checkpoint_after_bytes`, or more for a log of large entries. When
    /// a segment fills up, the next ones are sized to hold
    /// [`MIN_ENTRIES_PER_SEGMENT`] entries of the average size it held,
    /// between `checkpoint_after_bytes` and [`MAX_SEGMENT_GROWTH`] times
    /// that. A size goes up only after two segments in a row held fewer
    /// entries (one burst of a few huge entries does not make every spare
    /// large), and down at once; an idle log goes back to
    /// `checkpoint_after_bytes` ([`Segments::trim_spares`]). Segments
    /// configured under [`MIN_SIZED_SEGMENT_BYTES`] keep their size.
    segment_bytes: u64,
    /// The last segment that filled up held fewer than
    /// [`MIN_ENTRIES_PER_SEGMENT`] entries.
    few_entries_before: bool,
}

impl Segments {
    /// The segments an open found: `live` (recovered, all sealed) and the
    /// reusable files.
    pub fn new(
        settings: SegmentSettings,
        live: BTreeMap<u64, SegmentState>,
        spares: Vec<Spare>,
        next_spare_number: u64,
    ) -> Self {
        let settings_bytes = settings.checkpoint_after_bytes;
        Self {
            settings,
            active: 0,
            live,
            spares,
            recycling: Vec::new(),
            next_spare_number,
            want_spare: false,
            segment_bytes: settings_bytes,
            few_entries_before: false,
        }
    }

    fn live(&mut self, segment: u64) -> io::Result<&mut SegmentState> {
        self.live
            .get_mut(&segment)
            .ok_or_else(|| io::Error::other(format!("segment {segment} is no longer live")))
    }

    /// Fails unless `segment` is live.
    pub fn check_live(&mut self, segment: u64) -> io::Result<()> {
        self.live(segment).map(|_| ())
    }

    // --- Counting ---------------------------------------------------------

    /// How many segments are live.
    pub fn live_count(&self) -> usize {
        self.live.len()
    }

    /// How many spare files are ready.
    pub fn spare_count(&self) -> usize {
        self.spares.len()
    }

    /// The ids of the live segments, in order.
    pub fn live_ids(&self) -> Vec<u64> {
        self.live.keys().copied().collect()
    }

    /// The live segments, in id order.
    pub fn live_segments(&self) -> Vec<Arc<Segment>> {
        self.live.values().map(|seg| seg.segment.clone()).collect()
    }

    /// The live segments with the end of their reservations, in id order.
    pub fn reserved_ends(&self) -> Vec<(Arc<Segment>, u64)> {
        self.live
            .values()
            .map(|seg| (seg.segment.clone(), seg.reserved_end))
            .collect()
    }

    /// The active segment and its end, if it holds records, every one of
    /// them written and durable, large chunks' data included, and none
    /// still being written: where a shutdown leaves an end mark.
    pub fn quiet_active_end(&self) -> Option<(Arc<Segment>, u64)> {
        let seg = self.active_state()?;
        let end = seg.reserved_end;
        let quiet = end > HEADER_SIZE
            && seg.in_flight.is_empty()
            && seg.data_in_flight.is_empty()
            && seg.buffered.is_empty()
            && seg.segment.synced_to() >= end
            && seg.segment.marked_to() >= end;
        quiet.then(|| (seg.segment.clone(), end))
    }

    /// The bookkeeping of every live segment, in id order (read-only).
    pub fn states(&self) -> impl Iterator<Item = &SegmentState> {
        self.live.values()
    }

    /// The id of the first live segment.
    pub fn first_id(&self) -> Option<u64> {
        self.live.keys().next().copied()
    }

    /// The live segment holding entry `id`: the one with the highest id
    /// not above it.
    pub fn holding(&self, id: u64) -> Option<u64> {
        self.live
            .range(..=id)
            .next_back()
            .map(|(segment, _)| *segment)
    }

    /// The range of entry ids that live in the oldest live segment (up to
    /// the next one's first id), if any segment is live.
    pub fn oldest_ids(&self) -> Option<std::ops::Range<u64>> {
        let mut ids = self.live.keys();
        let oldest = *ids.next()?;
        let next = ids.next().copied().unwrap_or(u64::MAX);
        Some(oldest..next)
    }

    // --- The active segment ----------------------------------------------

    /// The id of the active segment.
    pub fn active_id(&self) -> u64 {
        self.active
    }

    fn active_state(&self) -> Option<&SegmentState> {
        self.live.get(&self.active)
    }

    /// The active segment passed `checkpoint_after_bytes` (or was sealed
    /// for a checkpoint) and should be replaced by the next entry.
    pub fn active_is_full(&self) -> bool {
        self.active_state().is_some_and(|seg| seg.full)
    }

    /// The active segment is full or past half of its size.
    pub fn active_is_half_full(&self) -> bool {
        self.active_state()
            .is_some_and(|seg| seg.full || seg.reserved_end >= self.segment_bytes / 2)
    }

    /// Entries begun and not yet finished in the active segment.
    pub fn active_open_entries(&self) -> usize {
        self.active_state().map_or(0, |seg| seg.open_entries)
    }

    /// The active segment holds records.
    pub fn active_has_records(&self) -> bool {
        self.active_state()
            .is_some_and(|seg| seg.reserved_end > HEADER_SIZE)
    }

    /// Marks the active segment full, so that the next entry (or the
    /// maintenance thread) replaces it.
    pub fn seal_active(&mut self) {
        if let Some(seg) = self.live.get_mut(&self.active) {
            seg.full = true;
        }
    }

    /// Begins entry `id` in the active segment.
    pub fn begin_entry(&mut self, id: u64) -> io::Result<Arc<Segment>> {
        let active = self.active;
        let segment = self.live(active)?;
        segment.open_entries += 1;
        segment.entries_begun += 1;
        segment.last_entry_id = Some(id);
        segment.highest_id = id;
        Ok(segment.segment.clone())
    }

    // --- Spares -----------------------------------------------------------

    /// A spare file is ready.
    pub fn has_spare(&self) -> bool {
        !self.spares.is_empty()
    }

    /// Asks for a spare to be made (by the maintenance thread, once the
    /// active segment is half full).
    pub fn ask_for_spare(&mut self) {
        self.want_spare = true;
    }

    /// A spare is wanted, none is ready and no recycled file is about to
    /// become one.
    pub fn spare_wanted(&self) -> bool {
        self.want_spare && self.spares.is_empty() && self.recycling.is_empty()
    }

    /// The number for the next spare file's name.
    pub fn next_spare_number(&mut self) -> u64 {
        let number = self.next_spare_number;
        // Only a stray file name gets here near u64::MAX; a wrapped number
        // that exists fails to be created, harmlessly.
        self.next_spare_number = number.wrapping_add(1);
        number
    }

    /// Adds a new spare made because one was wanted.
    pub fn spare_made(&mut self, spare: Spare) {
        self.spares.push(spare);
        self.want_spare = false;
    }

    /// Adds a spare file (a new one, or a recycled one).
    pub fn add_spare(&mut self, spare: Spare) {
        self.spares.push(spare);
    }

    /// Cuts every spare that a burst grew past its preallocated size back
    /// to `size`, and sizes later segments by `checkpoint_after_bytes`
    /// again (see [`Segments::segment_bytes`]), so an idle log takes the
    /// same space whatever bursts it has seen. Called only once nothing
    /// has been written for a while: the truncation runs under the log's
    /// lock (a spare cannot become the active segment half cut), and a log
    /// that is still busy keeps the blocks, which its next overshoot would
    /// otherwise allocate again, one `fdatasync` of file-size changes after
    /// another.
    pub fn trim_spares(&mut self, size: u64) -> io::Result<()> {
        self.segment_bytes = self.settings.checkpoint_after_bytes;
        self.few_entries_before = false;
        for spare in self.spares.iter_mut().filter(|spare| spare.grown) {
            // Tried once: a file that cannot be cut keeps its size.
            spare.grown = false;
            spare.file.set_len(size).map_err(|err| {
                io::Error::new(
                    err.kind(),
                    format!("shrinking recycled segment {}: {err}", spare.path.display()),
                )
            })?;
        }
        Ok(())
    }

    /// Some spare grew past its preallocated size, or segments are sized
    /// up for large entries (see [`Segments::trim_spares`]).
    pub fn has_grown(&self) -> bool {
        self.spares.iter().any(|spare| spare.grown)
            || self.segment_bytes > self.settings.checkpoint_after_bytes
    }

    /// The size to preallocate a spare to: `preallocated` (the configured
    /// size) scaled like [`Segments::segment_bytes`], at most
    /// [`MAX_PREALLOCATE_BYTES`].
    pub fn spare_bytes(&self, preallocated: u64) -> u64 {
        let base = self.settings.checkpoint_after_bytes.max(1);
        if self.segment_bytes <= base {
            return preallocated;
        }
        let scaled = u128::from(preallocated) * u128::from(self.segment_bytes) / u128::from(base);
        u64::try_from(scaled)
            .unwrap_or(u64::MAX)
            .min(MAX_PREALLOCATE_BYTES)
            .max(preallocated)
    }

    /// Sizes the segments after one that filled up with `entries` entries
    /// in `bytes` (see [`Segments::segment_bytes`]).
    fn size_after_full(&mut self, entries: u64, bytes: u64) {
        if self.settings.checkpoint_after_bytes < MIN_SIZED_SEGMENT_BYTES {
            return;
        }
        let few = entries < MIN_ENTRIES_PER_SEGMENT;
        let confirmed = self.few_entries_before;
        self.few_entries_before = few;
        if few && !confirmed {
            return;
        }
        let base = self.settings.checkpoint_after_bytes;
        let limit = base
            .saturating_mul(MAX_SEGMENT_GROWTH)
            .min(MAX_PREALLOCATE_BYTES)
            .max(base);
        let wanted = (bytes / entries).saturating_mul(MIN_ENTRIES_PER_SEGMENT);
        self.segment_bytes = wanted
            .min(limit)
            .next_multiple_of(1 << 20)
            .clamp(base, limit);
    }

    /// Where writing has got to: the active segment and its reserved end.
    /// The same position read twice means nothing was reserved between.
    pub fn write_position(&self) -> (u64, u64) {
        (
            self.active,
            self.active_state().map_or(0, |seg| seg.reserved_end),
        )
    }

    /// The pool has room for a recycled file.
    pub fn keeps_another_spare(&self) -> bool {
        self.spares.len() < MAX_SPARES
    }

    /// Where a write into `segment` makes a spare due: the half of the
    /// active segment while a spare is wanted (see [`spare_due`]).
    fn spare_half(&self, segment: u64) -> Option<u64> {
        (segment == self.active && self.want_spare).then_some(self.segment_bytes / 2)
    }

    // --- Switching --------------------------------------------------------

    /// Makes a spare the active segment, named for `next_entry_id`, and
    /// seals the one before. Returns true if that one can be checkpointed
    /// now (the maintenance thread should be woken).
    pub fn switch(&mut self, next_entry_id: u64) -> io::Result<bool> {
        let id = next_entry_id;
        crate::trace::span!(INFO, "switch_segment", segment = id);
        let path = FileName::Segment(id).path_in(&self.settings.directory);
        let previous = self
            .live
            .get(&self.active)
            .filter(|old| old.segment.id() != 0 && old.open_entries == 0)
            .map(|old| (old.segment.id(), old.reserved_end));
        let header = SegmentHeader {
            first_entry_id: id,
            previous,
            version_info: self.settings.version_info.to_vec(),
        };
        // An encrypted segment is sealed with the key current now (its
        // header's key check names it) and gets a new generation.
        let (layout, header) = match &self.settings.cipher {
            Some(cipher) => {
                let (seal, bytes) = SegmentSeal::create(cipher, &header)?;
                (Layout::Sealed(Arc::new(seal)), bytes)
            }
            None => (Layout::Plain, header.encode()),
        };
        // Taken only now: a key provider that fails leaves it in the pool.
        let Some(spare) = self.spares.pop() else {
            return Err(io::Error::other("no spare segment file available"));
        };
        // The file keeps its spare name until the first sync pass renames
        // it (see `crate::log::sync`), but the header is synced now, before
        // any record salted with `id` can reach the file: records that
        // reach the disk without it would, after a crash, sit in a file no
        // header ties to `id`; the next run could then start a segment
        // with the same id in that file, and those records would verify
        // again past its own, bringing back entries that had vanished. One
        // sync per segment. On failure the spare is dropped; the next open
        // sorts out whatever is left on disk.
        spare.file.write_all_at(&header, 0)?;
        spare.file.sync_data()?;
        let old = self.active;
        let segment_bytes = self.segment_bytes;
        let old_state = self.live(old)?;
        // A segment that filled up (not one sealed early, nor a recovered
        // one) sizes the next ones.
        let filled = (old_state.reserved_end >= segment_bytes && old_state.entries_begun > 0)
            .then_some((
                old_state.entries_begun,
                old_state.reserved_end.saturating_sub(HEADER_SIZE),
            ));
        old_state.sealed = true;
        if previous.is_none() && old != 0 {
            old_state.segment.owe_end_mark();
        }
        let wake = old_state.ready_for_checkpoint();
        let segment = Arc::new(Segment::new(
            id,
            spare.file,
            spare.sync_handles,
            path,
            Some(spare.path),
            0,
            self.settings.version_info.clone(),
            layout,
        ));
        self.live
            .insert(id, SegmentState::new(segment, HEADER_SIZE));
        self.active = id;
        if let Some((entries, bytes)) = filled {
            self.size_after_full(entries, bytes);
        }
        if self.spares.is_empty() {
            // Made once this segment is half full (see `spare_due`), not
            // now: a new log's first commits need the disk to themselves.
            self.want_spare = true;
        }
        Ok(wake)
    }

    /// The last recovered segment and where its records end, if a log
    /// just opened could go on writing there: a plain segment of a plain
    /// log (a new segment would be encrypted with the current key) whose
    /// id is at most `next_entry_id`. See [`Segments::resume_last`].
    pub fn resumable_last(&self, next_entry_id: u64) -> Option<(Arc<Segment>, u64)> {
        if self.settings.cipher.is_some() {
            return None;
        }
        let (&last, seg) = self.live.iter().next_back()?;
        (last <= next_entry_id && matches!(seg.segment.layout(), Layout::Plain))
            .then(|| (seg.segment.clone(), seg.reserved_end))
    }

    /// Instead of [`Segments::start`], on a disk too full for a new
    /// segment file: the last recovered segment becomes the active one
    /// again, new records going on where its records end, in the blocks
    /// it already has. The caller checked [`Segments::resumable_last`] and
    /// zero-filled the segment past that end and synced it, so nothing a
    /// crash left there can read as a record after the new ones. A spare
    /// is made once the disk has room for one.
    pub fn resume_last(&mut self) -> io::Result<()> {
        let Some((&last, seg)) = self.live.iter_mut().next_back() else {
            return Err(io::Error::other("no segment to resume"));
        };
        seg.sealed = false;
        seg.full = false;
        self.active = last;
        self.want_spare = true;
        Ok(())
    }

    /// Starts the first active segment of a log just opened, named for
    /// `next_entry_id`, after the recovered ones (a spare must be ready).
    /// Returns true if the maintenance thread should be woken.
    pub fn start(&mut self, next_entry_id: u64) -> io::Result<bool> {
        // An empty last segment (a header and no record: a switch made just
        // before the process ended) is named for `next_entry_id` as well,
        // and the new segment takes its place under that name. Its header
        // recorded where the segment before it ended; the new header must
        // record that end too, not the empty segment's own, or damage in the
        // earlier segment would later read as a torn tail.
        if let Some(&last) = self.live.keys().next_back() {
            let empty = self
                .live
                .get(&last)
                .is_some_and(|seg| seg.reserved_end <= HEADER_SIZE && seg.open_entries == 0);
            if last == next_entry_id && empty {
                self.live.remove(&last);
            }
        }
        if let Some(&last) = self.live.keys().next_back() {
            // The highest recovered segment is the "previous active" one
            // the switch seals.
            self.active = last;
            return self.switch(next_entry_id);
        }
        // The switch seals the previous active segment; a throwaway sealed
        // state stands in for it and is removed right after.
        let placeholder = Arc::new(Segment::new(
            0,
            self.spares[0].file.clone(),
            SyncHandles::none(),
            PathBuf::new(),
            None,
            0,
            Arc::default(),
            Layout::Plain,
        ));
        self.live.insert(0, SegmentState::new(placeholder, 0));
        self.active = 0;
        let result = self.switch(next_entry_id);
        self.live.remove(&0);
        result
    }

    // --- Appending --------------------------------------------------------

    /// The active segment is full once it passed this many bytes (`None`
    /// for a segment that is not active).
    fn full_at(&self, segment: u64) -> Option<u64> {
        (segment == self.active).then_some(self.segment_bytes)
    }

    /// Reserves `len` bytes in `segment` for a chunk record its writer
    /// writes whole, header included; returns the offset, the durable mark
    /// for its header, and whether the maintenance thread should be woken.
    /// The reservation is in flight until [`Segments::header_written`],
    /// its data until [`Segments::data_written`].
    pub fn reserve(&mut self, segment: u64, len: u64) -> io::Result<(u64, u64, bool)> {
        let (full_at, half) = (self.full_at(segment), self.spare_half(segment));
        let seg = self.live(segment)?;
        let offset = seg.reserved_end;
        seg.reserved_end += len;
        seg.in_flight.insert(offset, seg.reserved_end);
        seg.data_in_flight.insert(offset);
        let end = seg.reserved_end;
        let mark = seg.segment.marked_to();
        seg.note_size(full_at);
        Ok((offset, mark, spare_due(half, offset, end)))
    }

    /// Reserves room for a chunk record whose data the caller writes into
    /// the file itself, and buffers the record's header and (in a plain
    /// segment) its CRC trailer, after a padding record when needed, so
    /// that its data starts on a page: see `aligned_chunk_start`. `index`
    /// is the chunk's index in its entry. The data is in flight until
    /// [`Segments::data_written`].
    pub fn reserve_chunk(
        &mut self,
        segment: u64,
        header: RecordHeader,
        crc: u32,
        index: u32,
    ) -> io::Result<Placed> {
        let (full_at, half) = (self.full_at(segment), self.spare_half(segment));
        let buffer_bytes = self.settings.buffer_bytes;
        let seg = self.live(segment)?;
        let layout = seg.segment.layout().clone();
        let header_size = layout.header_size() as u64;
        let mark = seg.segment.marked_to();
        let free = seg.reserved_end;
        let (pad, offset) = aligned_chunk_start_after(free, header_size);
        // Parallel writers of large chunks then never share a page, and
        // each data `pwrite` covers whole pages: concurrent writes into one
        // page serialise on its lock in the kernel, and every sync would
        // write the shared page again.
        let padding = RecordHeader {
            kind: RecordKind::Padding,
            entry_id: header.entry_id,
            length: pad.saturating_sub(header_size) as u32,
            durable_mark: mark,
        };
        let header = RecordHeader {
            durable_mark: mark,
            ..header
        };
        // Both headers are encoded before anything is reserved: a failure
        // leaves the segment as it was.
        let padding_bytes = match pad {
            0 => None,
            _ => Some(layout.encode(&padding, 0, segment, free)?),
        };
        let encoded = layout.encode(&header, index, segment, offset)?;
        if let Some(padding_bytes) = padding_bytes {
            let zeros = [0_u8; 2 * CHUNK_ALIGNMENT as usize];
            seg.buffer(free, &[&padding_bytes, &zeros[..padding.length as usize]]);
        }
        let record_len = layout.record_len(&header);
        seg.reserved_end = offset + record_len;
        seg.data_in_flight.insert(offset);
        seg.buffer(offset, &[&encoded]);
        if layout.stores_plain_data(header.kind) {
            seg.buffer(
                offset + record_len - CHUNK_TRAILER_SIZE as u64,
                &[&crc.to_le_bytes()],
            );
        }
        let end = seg.reserved_end;
        seg.note_size(full_at);
        Ok(Placed {
            offset,
            end,
            bytes: pad + record_len,
            flush: seg.overflow(buffer_bytes),
            wake: spare_due(half, free, end),
        })
    }

    /// Finishes an entry begun in `segment` (its commit or rollback record
    /// is placed, or it was abandoned).
    pub fn finish_entry(&mut self, segment: u64) -> io::Result<Finished> {
        let seg = self.live(segment)?;
        seg.open_entries -= 1;
        Ok(Finished {
            checkpointable: seg.ready_for_checkpoint(),
            drained: seg.full && seg.open_entries == 0,
        })
    }

    /// Places a small record (with its data and CRC for a chunk) in
    /// `segment`'s write buffer, its durable mark filled in; for a commit
    /// record, notes the committed id. In an encrypted segment `data` is
    /// the chunk's sealed frames (its CRC is not stored), or a pre-sealed
    /// chunk's data, and `index` the chunk's index in its entry.
    pub fn append_record(
        &mut self,
        segment: u64,
        header: RecordHeader,
        data: Option<(&[u8], u32)>,
        index: u32,
    ) -> io::Result<Placed> {
        let (full_at, half) = (self.full_at(segment), self.spare_half(segment));
        let buffer_bytes = self.settings.buffer_bytes;
        let seg = self.live(segment)?;
        let offset = seg.reserved_end;
        let header = RecordHeader {
            durable_mark: seg.segment.marked_to(),
            ..header
        };
        let layout = &seg.segment.layout();
        let record_len = layout.record_len(&header);
        let encoded = layout.encode(&header, index, segment, offset)?;
        seg.reserved_end += record_len;
        let end = seg.reserved_end;
        if header.kind == RecordKind::Commit {
            seg.highest_committed_id = seg.highest_committed_id.max(Some(header.entry_id));
        }
        match data {
            Some((bytes, crc)) if layout.stores_plain_data(header.kind) => {
                seg.buffer(offset, &[&encoded, bytes, &crc.to_le_bytes()]);
            }
            Some((sealed, _)) => {
                debug_assert_eq!(offset + encoded.len() as u64 + sealed.len() as u64, end);
                seg.buffer(offset, &[&encoded, sealed]);
            }
            None => seg.buffer(offset, &[&encoded]),
        }
        seg.note_size(full_at);
        let checkpointable = seg.ready_for_checkpoint();
        Ok(Placed {
            offset,
            end,
            bytes: record_len,
            flush: seg.overflow(buffer_bytes),
            wake: checkpointable || spare_due(half, offset, end),
        })
    }

    /// Takes `segment`'s write buffer for writing, if it holds anything.
    /// The ranges are in flight (a hole) until [`Segments::written`].
    pub fn take_buffered(&mut self, segment: u64) -> Option<(Arc<Segment>, Ranges)> {
        self.live
            .get_mut(&segment)
            .filter(|seg| !seg.buffered.is_empty())
            .map(|seg| (seg.segment.clone(), seg.take_buffered()))
    }

    /// Takes the write buffers of `segment` and every segment before it.
    pub fn take_buffered_through(&mut self, segment: u64) -> Vec<(Arc<Segment>, Ranges)> {
        self.live
            .range_mut(..=segment)
            .map(|(_, seg)| seg)
            .filter(|seg| !seg.buffered.is_empty())
            .map(|seg| (seg.segment.clone(), seg.take_buffered()))
            .collect()
    }

    /// The ranges starting at `starts`, taken from the write buffer, are
    /// in the file. Returns true if the segment can be checkpointed now.
    pub fn written(&mut self, segment: u64, starts: impl Iterator<Item = u64>) -> bool {
        let Some(seg) = self.live.get_mut(&segment) else {
            return false;
        };
        for start in starts {
            seg.in_flight.remove(&start);
        }
        seg.ready_for_checkpoint()
    }

    /// The header of the reservation at `offset` is in the file.
    pub fn header_written(&mut self, segment: u64, offset: u64) {
        if let Some(seg) = self.live.get_mut(&segment) {
            seg.in_flight.remove(&offset);
        }
    }

    /// The data of the large chunk reserved at `offset` is in the file (or
    /// abandoned).
    pub fn data_written(&mut self, segment: u64, offset: u64) {
        if let Some(seg) = self.live.get_mut(&segment) {
            seg.data_in_flight.remove(&offset);
        }
    }

    // --- Waiting for writes ---------------------------------------------

    /// Some write into `segment` (a record or a large chunk's data) has
    /// not landed yet.
    pub fn writes_in_flight(&self, segment: u64) -> bool {
        self.live
            .get(&segment)
            .is_some_and(|seg| !seg.in_flight.is_empty() || !seg.data_in_flight.is_empty())
    }

    /// A write below `end` in `segment`, or in an earlier closed segment,
    /// is still in flight: a sync up to `end` would leave a hole.
    pub fn holes_below(&self, segment: u64, end: u64) -> bool {
        let written = self
            .live
            .get(&segment)
            .map_or(u64::MAX, SegmentState::written_to);
        // Earlier segments that were closed must be synced whole with this
        // one: recovery drops a segment whose predecessor ends short of
        // where it was closed.
        let earlier_complete = self
            .live
            .range(..segment)
            .all(|(_, seg)| seg.open_entries > 0 || seg.in_flight.is_empty());
        !(written >= end && earlier_complete)
    }

    /// The record header at `offset` in `segment` is reserved but not in
    /// the file yet.
    pub fn header_pending(&self, segment: u64, offset: u64) -> bool {
        self.live.get(&segment).is_some_and(|seg| {
            let header_end = offset.saturating_add(seg.segment.layout().header_size() as u64);
            offset >= HEADER_SIZE && header_end <= seg.reserved_end && seg.written_to() < header_end
        })
    }

    /// The live `segment` and the end of its reservations, for reading.
    pub fn readable(&self, segment: u64) -> Option<(Arc<Segment>, u64)> {
        self.live
            .get(&segment)
            .map(|seg| (seg.segment.clone(), seg.reserved_end))
    }

    /// `segment` and every one before it have durable names.
    pub fn named_through(&self, segment: u64) -> bool {
        self.live
            .range(..=segment)
            .all(|(_, seg)| seg.segment.name_is_durable())
    }

    /// Every byte below `end` in `segment` is durable (true for a segment
    /// no longer live).
    pub fn durable_to(&self, segment: u64, end: u64) -> bool {
        self.live
            .get(&segment)
            .map_or(true, |seg| seg.segment.is_durable_to(end))
    }

    /// Per live segment with a durable name: where the records that are in
    /// the file end (none below is still in the write buffer or being
    /// written by another thread).
    pub fn in_file_ends(&self) -> std::collections::HashMap<u64, u64> {
        self.live
            .values()
            // Only once the segment's name is durable: until then a crash
            // of the process loses the file's records (it keeps its spare
            // name), and its predecessor may still have writes in flight
            // (see `crate::log::sync`).
            .filter(|seg| seg.segment.name_is_durable())
            .map(|seg| {
                let unwritten = seg.buffered.first().map_or(u64::MAX, |(at, _)| *at);
                let synced = seg.segment.synced_to();
                (
                    seg.segment.id(),
                    seg.written_to().min(unwritten).max(synced),
                )
            })
            .collect()
    }

    // --- Checkpoints and recycling --------------------------------------

    /// The oldest live segment if it can be checkpointed now (sealed, not
    /// active, every entry finished, every write landed). Segments are
    /// checkpointed strictly in order.
    pub fn next_checkpointable(&self) -> Option<Checkpointable> {
        self.live
            .values()
            .next()
            .filter(|seg| seg.segment.id() != self.active && seg.ready_for_checkpoint())
            .map(|seg| Checkpointable {
                segment: seg.segment.clone(),
                limit: seg.reserved_end,
                last_entry_id: seg.last_entry_id,
            })
    }

    /// Forgets a checkpointed segment; returns what it held (`None` if it
    /// was not live).
    pub fn finish(&mut self, segment: u64) -> Option<Retired> {
        self.live.remove(&segment).map(|seg| Retired {
            highest_id: seg.highest_id,
            highest_committed_id: seg.highest_committed_id,
        })
    }

    /// Keeps a checkpointed segment, renamed to `path`, until its last
    /// reader is gone.
    pub fn retire(&mut self, segment: Arc<Segment>, path: PathBuf) {
        self.recycling.push((segment, path));
    }

    /// Takes the retired segments no reader holds any more.
    pub fn take_unread_retired(&mut self) -> Vec<(Arc<Segment>, PathBuf)> {
        let (done, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.recycling)
            .into_iter()
            .partition(|(segment, _)| Arc::strong_count(segment) == 1);
        self.recycling = waiting;
        done
    }

    /// Test access to one segment's bookkeeping.
    #[cfg(test)]
    pub fn state(&self, segment: u64) -> &SegmentState {
        &self.live[&segment]
    }
}

/// True if a write from `from` to `to` crosses `half` (the active
/// segment's, while a spare is wanted): the maintenance thread should
/// make the spare now.
fn spare_due(half: Option<u64>, from: u64, to: u64) -> bool {
    half.is_some_and(|half| from < half && to >= half)
}
