//! White-box tests of the write bookkeeping in `log.rs`: interleavings of
//! writers, sync leaders and the checkpointer that the public API cannot
//! pin down, set up step by step on a log's `Inner`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::sync::sync_targets;
use super::Inner;
use crate::format::SegmentHeader;
use crate::format::{
    aligned_chunk_start, RecordHeader, RecordKind, CHUNK_ALIGNMENT, HEADER_SIZE, RECORD_HEADER_SIZE,
};
use crate::fs::{CrashFileSystem, MemoryFileSystem, PowerLoss};
use crate::segment::Segment;
use crate::{Configuration, EntryId, LogManager, LogVoid, SegmentReader, WriteAheadLog};

fn open() -> WriteAheadLog {
    Configuration::default_for("/log")
        .file_system(MemoryFileSystem::new())
        .checkpoint_after_bytes(1 << 30)
        .open(LogVoid)
        .unwrap()
}

fn header(kind: RecordKind, entry_id: u64, length: u32) -> RecordHeader {
    RecordHeader {
        kind,
        entry_id,
        length,
        durable_mark: 0,
    }
}

/// Begins an entry and buffers one small chunk and its commit record, as
/// `EntryWriter` does, without waiting for a sync. Returns the entry id.
fn buffer_entry(inner: &Inner, data: &[u8]) -> (u64, Arc<Segment>) {
    let (id, segment) = inner.begin().unwrap();
    let chunk = header(RecordKind::Chunk, id, data.len() as u32);
    inner
        .append(
            &segment,
            chunk,
            Some((data, crc32fast::hash(data))),
            false,
            0,
        )
        .unwrap();
    inner
        .append(&segment, header(RecordKind::Commit, id, 1), None, true, 0)
        .unwrap();
    (id, segment)
}

/// Takes a segment's buffered records the way a sync leader or a flushing
/// writer does, leaving them to be written later.
fn take_buffered(inner: &Inner, segment: u64) -> Vec<(u64, Vec<u8>)> {
    let mut state = inner.state.lock();
    state
        .segments
        .take_buffered(segment)
        .map(|(_, ranges)| ranges)
        .unwrap_or_default()
}

/// Makes a spare and switches the log to it, as a full active segment
/// does.
fn switch_to_a_new_segment(inner: &Inner) {
    let spare = inner.create_spare().unwrap();
    let mut state = inner.state.lock();
    state.segments.add_spare(spare);
    inner.switch_segment(&mut state).unwrap();
}

/// The ids of the segments the next sync pass would sync, in order.
/// Where the reservations in segment `id` end.
fn reserved_end(inner: &Inner, id: u64) -> u64 {
    inner.state.lock().segments.state(id).reserved_end()
}

fn next_sync_covers(inner: &Inner) -> Vec<u64> {
    sync_targets(&inner.state.lock().segments)
        .iter()
        .map(|target| target.segment.id())
        .collect()
}

#[derive(Clone, Default)]
struct Ids(Arc<Mutex<Vec<u64>>>);

impl LogManager for Ids {
    fn recover(&mut self, _entry: &mut crate::Entry<'_>) -> std::io::Result<()> {
        Ok(())
    }

    fn checkpoint_to(
        &mut self,
        _last: EntryId,
        entries: &mut SegmentReader,
        _wal: &WriteAheadLog,
    ) -> std::io::Result<()> {
        while let Some(entry) = entries.read_entry()? {
            self.0.lock().unwrap().push(entry.id().0);
        }
        Ok(())
    }
}

#[test]
fn a_checkpoint_waits_for_records_another_thread_took_for_writing() {
    // The checkpointer picks a segment whose last records are still in the
    // write buffer; before it flushes them, a sync leader takes them for
    // its own write. The checkpoint must wait for that write, or it reads
    // (and then recycles) a segment without its last committed entries.
    let log = open();
    let inner = log.inner.clone();
    let (first, _) = buffer_entry(&inner, b"first");
    let (last, segment) = buffer_entry(&inner, b"last");
    let limit = reserved_end(&inner, segment.id());
    let taken = take_buffered(&inner, segment.id());

    let ids = Ids::default();
    let checkpointer = {
        let (log, segment, mut ids) = (
            WriteAheadLog::borrowed(inner.clone()),
            segment.clone(),
            ids.clone(),
        );
        std::thread::spawn(move || {
            crate::checkpoint::checkpoint(&log, &mut ids, &segment, limit, Some(last))
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    inner.write_ranges(&segment, taken).unwrap();
    checkpointer.join().unwrap().unwrap();
    assert_eq!(*ids.0.lock().unwrap(), vec![first, last]);
    log.shutdown().unwrap();
}

#[test]
fn a_segment_is_not_synced_while_its_closed_predecessor_is_still_written() {
    // Recovery takes a synced record in a segment as proof that the
    // segment before it was synced whole; so while the closed segment's
    // last records are being written, the next one must not be synced.
    let log = open();
    let inner = log.inner.clone();
    inner.state.lock().checkpoints.pause();
    let (_, first) = buffer_entry(&inner, b"in the first segment");
    let taken = take_buffered(&inner, first.id());
    switch_to_a_new_segment(&inner);
    let (_, second) = buffer_entry(&inner, b"in the second segment");
    assert_ne!(first.id(), second.id());

    assert_eq!(next_sync_covers(&inner), vec![first.id()]);
    inner.write_ranges(&first, taken).unwrap();
    assert_eq!(next_sync_covers(&inner), vec![first.id(), second.id()]);
    log.shutdown().unwrap();
}

#[test]
fn the_durable_mark_stays_below_a_large_chunk_until_its_data_is_written() {
    // A large chunk's header is written first and its data afterwards: a
    // sync may cover the header (so later commits can be acknowledged) but
    // not raise the durable mark past a chunk whose data is not written,
    // or recovery would call a torn chunk damage.
    let log = open();
    let inner = log.inner.clone();
    let (id, segment) = inner.begin().unwrap();
    let (offset, mark) = inner.reserve(segment.id(), 200_000).unwrap();
    assert_eq!(mark, 0);
    assert_eq!(offset, HEADER_SIZE);
    // The header is written: the reservation is no longer a hole.
    inner.complete(segment.id(), Some(offset), None);
    let (_, other_segment) = buffer_entry(&inner, b"another entry");
    assert_eq!(other_segment.id(), segment.id());
    let end = reserved_end(&inner, segment.id());
    inner.sync_pass(segment.id(), end).unwrap();
    assert_eq!(segment.synced_to(), end);
    assert_eq!(segment.marked_to(), offset);

    // The data lands: the mark stays (the last sync may have started
    // before the data was written) until the next sync, which syncs the
    // segment again although it has no new records.
    inner.data_written(segment.id(), offset);
    assert_eq!(segment.marked_to(), offset);
    inner.sync_pass(segment.id(), end).unwrap();
    assert_eq!(segment.marked_to(), end);
    inner
        .append(&segment, header(RecordKind::Rollback, id, 0), None, true, 0)
        .unwrap();
    let end = reserved_end(&inner, segment.id());
    inner.sync_pass(segment.id(), end).unwrap();
    assert_eq!(segment.marked_to(), end);
    log.shutdown().unwrap();
}

#[test]
fn a_closed_segment_is_synced_again_before_the_next_when_data_landed_after_its_sync() {
    // A chunk begun with `begin_chunk` and abandoned: its header was synced,
    // its trailer (which makes the file cover the record) lands after that
    // sync and its entry ends without a record. The next segment's first
    // sync tells recovery this segment was durable to its end, so this
    // segment must be synced again first, although it has no new records.
    let log = open();
    let inner = log.inner.clone();
    // Otherwise the checkpointer may take (and sync) the closed segment
    // before the test looks at the next sync's targets.
    inner.state.lock().checkpoints.pause();
    let (id, first) = inner.begin().unwrap();
    let (offset, _) = inner.reserve(first.id(), 200_000).unwrap();
    inner.complete(first.id(), Some(offset), None);
    let end = reserved_end(&inner, first.id());
    inner.sync_pass(first.id(), end).unwrap();
    assert_eq!(first.synced_to(), end);
    assert_eq!(first.marked_to(), offset);
    inner.data_written(first.id(), offset);
    inner.complete(first.id(), None, Some(id));
    switch_to_a_new_segment(&inner);
    let (_, second) = buffer_entry(&inner, b"in the second segment");
    assert_eq!(next_sync_covers(&inner), vec![first.id(), second.id()]);
    let second_end = reserved_end(&inner, second.id());
    inner.sync_pass(second.id(), second_end).unwrap();
    assert_eq!(first.marked_to(), end);
    assert_eq!(second.synced_to(), second_end);
    log.shutdown().unwrap();
}

#[test]
fn a_copied_chunk_is_never_a_hole_and_the_mark_waits_for_its_data() {
    // `reserve_chunk` buffers the header and trailer with the reservation,
    // so another committer's sync pass never waits for the copy; the
    // durable mark still stays below the chunk until its data is written
    // and synced.
    let log = open();
    let inner = log.inner.clone();
    let (id, segment) = inner.begin().unwrap();
    let data = vec![5_u8; 100_000];
    let crc = crc32fast::hash(&data);
    let offset = inner
        .reserve_chunk(&segment, header(RecordKind::Chunk, id, 100_000), crc, 0)
        .unwrap();
    // The data starts on a page, after a padding record from the header.
    assert_eq!(offset, aligned_chunk_start(HEADER_SIZE).1);
    assert_eq!((offset + RECORD_HEADER_SIZE as u64) % CHUNK_ALIGNMENT, 0);
    let (_, other) = buffer_entry(&inner, b"a later entry");
    assert_eq!(other.id(), segment.id());
    let end = reserved_end(&inner, segment.id());
    {
        let state = inner.state.lock();
        let seg = state.segments.state(segment.id());
        assert_eq!(seg.written_to(), end, "the copied chunk left a hole");
        assert_eq!(seg.complete_to(), offset);
    }
    // A sync pass for the later entry returns without the chunk's data and
    // writes the chunk's header and trailer.
    inner.sync_pass(segment.id(), end).unwrap();
    assert_eq!(segment.synced_to(), end);
    assert_eq!(segment.marked_to(), offset);
    let mut encoded = [0_u8; RECORD_HEADER_SIZE];
    segment.file().read_exact_at(&mut encoded, offset).unwrap();
    let written = RecordHeader::decode(&encoded, segment.id()).unwrap();
    assert_eq!(
        (written.kind, written.entry_id, written.length),
        (RecordKind::Chunk, id, 100_000)
    );
    segment
        .file()
        .read_exact_at(&mut encoded, HEADER_SIZE)
        .unwrap();
    let padding = RecordHeader::decode(&encoded, segment.id()).unwrap();
    assert_eq!(padding.kind, RecordKind::Padding);
    assert_eq!(padding.record_len(), offset - HEADER_SIZE);
    let trailer_at = offset + (RECORD_HEADER_SIZE + 100_000) as u64;
    let mut trailer = [0_u8; 4];
    segment
        .file()
        .read_exact_at(&mut trailer, trailer_at)
        .unwrap();
    assert_eq!(u32::from_le_bytes(trailer), crc);

    segment
        .file()
        .write_all_at(&data, offset + RECORD_HEADER_SIZE as u64)
        .unwrap();
    inner.data_written(segment.id(), offset);
    inner.sync_pass(segment.id(), end).unwrap();
    assert_eq!(segment.marked_to(), end);
    inner
        .append(&segment, header(RecordKind::Rollback, id, 0), None, true, 0)
        .unwrap();
    log.shutdown().unwrap();
}

#[test]
fn a_new_segment_header_is_durable_before_any_record_is_written() {
    // Records salted with a segment's id that reach the disk without the
    // header naming that id could verify again in a later segment given the
    // same id in the same file, after a second crash.
    let fs = CrashFileSystem::new();
    let log = Configuration::default_for("/log")
        .file_system(fs.clone())
        .checkpoint_after_bytes(1 << 30)
        .open(LogVoid)
        .unwrap();
    let inner = log.inner.clone();
    inner.state.lock().checkpoints.pause();
    buffer_entry(&inner, b"in the first segment");
    switch_to_a_new_segment(&inner);
    let (id, segment) = buffer_entry(&inner, b"in the second segment");
    let spare = segment.pending_name().expect("not named yet");
    // The spare's name is durable (not its data): what survives of the file
    // is what was synced.
    inner.fs.sync_dir(inner.directory()).unwrap();
    fs.power_loss(PowerLoss::Clean);
    let bytes = fs.contents(&spare).expect("the spare file");
    let header = SegmentHeader::decode(&bytes[..HEADER_SIZE as usize]).unwrap();
    assert_eq!(header.first_entry_id, id);
    assert_eq!(segment.id(), id);
}

#[test]
fn a_checkpoint_sync_covers_entries_buffered_in_later_segments() {
    // The checkpoint's sync of a closed segment may release a committer of
    // that segment's last entry; entries committed (buffered) before it in
    // the next segment must be durable by then as well.
    let log = open();
    let inner = log.inner.clone();
    inner.state.lock().checkpoints.pause();
    let (first_id, first) = buffer_entry(&inner, b"in the first segment");
    switch_to_a_new_segment(&inner);
    let (_, second) = buffer_entry(&inner, b"buffered in the second segment");
    let second_end = reserved_end(&inner, second.id());
    let limit = reserved_end(&inner, first.id());
    crate::checkpoint::checkpoint(&log, &mut Ids::default(), &first, limit, Some(first_id))
        .unwrap();
    assert_eq!(first.synced_to(), limit);
    assert_eq!(second.synced_to(), second_end);
    log.shutdown().unwrap();
}
