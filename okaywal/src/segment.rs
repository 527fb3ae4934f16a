//! One segment file and the bookkeeping of writes into it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::fs::FileHandle;

/// Initial capacity of a new range in the write buffer.
const RANGE_CAPACITY: usize = 4096;

/// A segment file while it is live (active, sealed or being checkpointed).
#[derive(Debug)]
pub(crate) struct Segment {
    /// The first entry id the segment may hold; also its name and CRC salt.
    pub id: u64,
    pub file: Arc<dyn FileHandle>,
    /// The segment's name, `wal-{id}`.
    pub path: PathBuf,
    /// The name the file still has (a spare's) until the first sync of the
    /// segment renames it to `path`: the header must be durable before the
    /// name is, or recovery would find a `wal-{id}` whose header was lost.
    pub pending_name: Mutex<Option<PathBuf>>,
    /// Every record below this offset is durable (the last completed sync);
    /// commits are acknowledged against it. The data of a large chunk may
    /// still have been in flight below it (its header was written first).
    pub synced_to: AtomicU64,
    /// Every byte below this offset is durable, large chunks' data
    /// included: the `durable_mark` written into record headers, which
    /// recovery takes as proof that damage below it is not a torn tail.
    pub marked_to: AtomicU64,
    /// The directory entry naming this file is durable.
    pub name_durable: AtomicBool,
    /// Whether this segment owes an end mark (FORMAT.md, "End marks"):
    /// the next segment started while entries were still open here, so its
    /// header could not record where this one ends. The lock is held for
    /// the mark's write only, so that a recycled file never gets one.
    pub end_mark: Mutex<EndMark>,
    /// The version information in the segment's header.
    pub version_info: Arc<Vec<u8>>,
}

/// Where a segment stands with its end mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EndMark {
    /// None is owed, or it is written and durable.
    NotDue,
    /// Owed: the next sync pass that finds the segment closed writes it.
    Due,
    /// The segment is being recycled: nothing may be written into it.
    Retired,
}

/// The mutable write state of a live segment, kept under the log's lock.
#[derive(Debug)]
pub(crate) struct SegmentState {
    pub segment: Arc<Segment>,
    /// The next free offset.
    pub reserved_end: u64,
    /// Reservations whose record header is not written yet: start → end.
    pub in_flight: BTreeMap<u64, u64>,
    /// Large chunk records whose data is not written yet (their writers
    /// copy it outside the lock; the header is in the file or the write
    /// buffer): their start offsets. They bound the durable mark, not the
    /// sync.
    pub data_in_flight: BTreeSet<u64>,
    /// Small records (and large chunks' headers and trailers) copied into
    /// memory at reservation, in offset order, not yet written to the
    /// file: (start, bytes). The next sync leader (or a writer that finds
    /// too much buffered) writes them in one `pwrite` per contiguous range.
    pub buffered: Vec<(u64, Vec<u8>)>,
    pub buffered_bytes: usize,
    /// Entries begun in this segment and not yet committed or rolled back.
    pub open_entries: usize,
    /// The active segment passed `checkpoint_after_bytes`.
    pub full: bool,
    /// No new entries go here; it is checkpointed once `open_entries` is 0.
    pub sealed: bool,
    /// The highest entry id begun in this segment; `None` also for an
    /// abandoned segment, whose entries are not checkpointed.
    pub last_entry_id: Option<u64>,
    /// The highest entry id known to be used in this segment (for naming
    /// the file when it is recycled, so ids never go backwards).
    pub highest_id: u64,
    /// The highest id of an entry committed in this segment: once the
    /// segment is recycled, a reader that has not reached it lost entries.
    pub highest_committed_id: Option<u64>,
}

impl SegmentState {
    pub fn new(segment: Arc<Segment>, reserved_end: u64) -> Self {
        let highest_id = segment.id;
        Self {
            segment,
            reserved_end,
            in_flight: BTreeMap::new(),
            data_in_flight: BTreeSet::new(),
            buffered: Vec::new(),
            buffered_bytes: 0,
            open_entries: 0,
            full: false,
            sealed: false,
            last_entry_id: None,
            highest_id,
            highest_committed_id: None,
        }
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

    pub fn ready_for_checkpoint(&self) -> bool {
        self.sealed && self.open_entries == 0 && self.in_flight.is_empty()
    }

    /// Appends `bytes`, which start at `offset`, to the write buffer.
    pub fn buffer(&mut self, offset: u64, bytes: &[&[u8]]) {
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
    pub fn take_buffered(&mut self) -> Vec<(u64, Vec<u8>)> {
        let ranges = std::mem::take(&mut self.buffered);
        self.buffered_bytes = 0;
        for (start, data) in &ranges {
            self.in_flight.insert(*start, start + data.len() as u64);
        }
        ranges
    }
}

/// The file a running log holds locked (see `FileSystem::lock_exclusive`);
/// its contents are never read or written.
pub(crate) const LOCK_FILE: &str = "okaywal.lock";

/// What a file name in the log directory means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileName {
    /// `wal-{id}`: a segment whose first entry id is `id`.
    Segment(u64),
    /// `wal-recycled-{id}`: a checkpointed segment whose entry ids were at
    /// most `id`; reusable.
    Recycled(u64),
    /// `wal-spare-{n}`: a fresh preallocated file; reusable.
    Spare(u64),
}

impl FileName {
    pub fn parse(name: &str) -> Option<Self> {
        let rest = name.strip_prefix("wal-")?;
        let number = |s: &str| -> Option<u64> {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                None
            } else {
                s.parse().ok()
            }
        };
        if let Some(id) = rest.strip_prefix("recycled-") {
            number(id).map(FileName::Recycled)
        } else if let Some(n) = rest.strip_prefix("spare-") {
            number(n).map(FileName::Spare)
        } else {
            number(rest).map(FileName::Segment)
        }
    }

    pub fn path_in(self, directory: &Path) -> PathBuf {
        directory.join(match self {
            FileName::Segment(id) => format!("wal-{id}"),
            FileName::Recycled(id) => format!("wal-recycled-{id}"),
            FileName::Spare(n) => format!("wal-spare-{n}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::{FileSystem, MemoryFileSystem, OpenMode};

    #[test]
    fn only_a_batch_s_first_range_gets_a_page_of_capacity() {
        let fs = MemoryFileSystem::new();
        fs.create_dir_all(Path::new("/")).expect("root");
        let file = fs
            .open(Path::new("/wal-1"), OpenMode::CreateNew)
            .expect("memory file");
        let segment = Arc::new(Segment {
            id: 1,
            file,
            path: PathBuf::from("/wal-1"),
            pending_name: Mutex::new(None),
            synced_to: 0.into(),
            marked_to: 0.into(),
            name_durable: true.into(),
            end_mark: Mutex::new(EndMark::NotDue),
            version_info: Arc::default(),
        });
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

    #[test]
    fn file_names_round_trip() {
        for name in [
            FileName::Segment(1),
            FileName::Recycled(99),
            FileName::Spare(0),
        ] {
            let path = name.path_in(Path::new("d"));
            let file = path.file_name().unwrap().to_str().unwrap();
            assert_eq!(FileName::parse(file), Some(name));
        }
        for junk in [
            "wal-",
            "wal-x",
            "wal--1",
            "wal-1a",
            "index",
            "wal-spare-",
            "wal-+1",
        ] {
            assert_eq!(FileName::parse(junk), None, "{junk}");
        }
    }
}
