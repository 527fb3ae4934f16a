//! A flipped byte in the last segment, where nothing written later vouches
//! for the records (no later record's durable mark, no successor's
//! recorded end), reads as a torn tail: recovery ends the segment there and
//! drops every entry from there on, committed or not. That is right after a
//! power cut in the middle of writing them, and a loss otherwise, and the
//! log cannot tell the two apart. Inspection names every entry so dropped
//! whose commit record still verifies (`committed_past_end`, `incomplete`),
//! so a tool built on it never calls such a log healthy without saying so.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use okaywal::{
    Configuration, Entry, EntryId, LogManager, LogVoid, ReadChunkResult, RecordType, SegmentReader,
};

/// Records the ids of the entries recovery hands over.
#[derive(Debug, Clone, Default)]
struct Recovered(Arc<Mutex<Vec<EntryId>>>);

impl LogManager for Recovered {
    fn recover(&mut self, entry: &mut Entry<'_>) -> io::Result<()> {
        while let ReadChunkResult::Chunk(mut chunk) = entry.read_chunk()? {
            chunk.read_all()?;
        }
        self.0.lock().unwrap().push(entry.id());
        Ok(())
    }

    fn checkpoint_to(
        &mut self,
        _last_checkpointed_id: EntryId,
        _checkpointed_entries: &mut SegmentReader,
        _wal: &okaywal::WriteAheadLog,
    ) -> io::Result<()> {
        Ok(())
    }
}

/// A log of three committed entries, closed: the first synced on its own,
/// the second (buffered) and third synced together, so that no record's
/// durable mark reaches past the first entry. Returns the three ids and
/// the segment's records (kind, offset, entry).
fn three_entries(dir: &Path) -> ([EntryId; 3], Vec<(RecordType, u64, u64)>) {
    let log = Configuration::default_for(dir).open(LogVoid).unwrap();
    let mut first = log.begin_entry().unwrap();
    first.write_chunk(b"synced alone").unwrap();
    let first = first.commit().unwrap();
    let mut second = log.begin_entry().unwrap();
    for chunk in [&b"alpha"[..], b"bravo", b"charlie"] {
        second.write_chunk(chunk).unwrap();
    }
    let second = second.commit_buffered().unwrap();
    let mut third = log.begin_entry().unwrap();
    third.write_chunk(&[9; 300]).unwrap();
    third.write_chunk(b"delta").unwrap();
    let third = third.commit().unwrap();
    log.shutdown().unwrap();
    drop(log);
    let listing = Configuration::default_for(dir)
        .inspect_segment(first.0)
        .unwrap();
    let records = listing
        .records
        .iter()
        .map(|r| (r.kind, r.offset, r.entry_id))
        .collect();
    ([first, second, third], records)
}

/// The offset of the `n`th chunk record of `entry`.
fn chunk_of(records: &[(RecordType, u64, u64)], entry: EntryId, n: usize) -> u64 {
    records
        .iter()
        .filter(|(kind, _, id)| *kind == RecordType::Chunk && *id == entry.0)
        .nth(n)
        .map(|(_, offset, _)| *offset)
        .unwrap()
}

fn flip(dir: &Path, segment: EntryId, offset: u64) {
    let path = dir.join(format!("wal-{}", segment.0));
    let file = OpenOptions::new().write(true).open(path).unwrap();
    let mut byte = [0];
    okaywal_read(dir, segment, offset, &mut byte);
    file.write_all_at(&[byte[0] ^ 0x20], offset).unwrap();
}

fn okaywal_read(dir: &Path, segment: EntryId, offset: u64, buf: &mut [u8]) {
    let path = dir.join(format!("wal-{}", segment.0));
    let file = OpenOptions::new().read(true).open(path).unwrap();
    file.read_exact_at(buf, offset).unwrap();
}

fn recovered(dir: &Path) -> Vec<EntryId> {
    let manager = Recovered::default();
    let log = Configuration::default_for(dir)
        .open(manager.clone())
        .unwrap();
    log.shutdown().unwrap();
    let ids = manager.0.lock().unwrap().clone();
    ids
}

#[test]
fn an_intact_or_unwritten_tail_names_no_entry() {
    let dir = tempfile::tempdir().unwrap();
    let (ids, _) = three_entries(dir.path());
    let inspection = Configuration::default_for(dir.path()).inspect().unwrap();
    assert!(inspection.is_ok());
    let segment = &inspection.segments[0];
    assert_eq!(segment.entries, ids);
    assert!(segment.committed_past_end.is_empty());
    assert!(segment.incomplete.is_empty());
    let listing = Configuration::default_for(dir.path())
        .inspect_segment(ids[0].0)
        .unwrap();
    assert!(listing.end.unwrap().commits_past_end.is_empty());
    assert_eq!(recovered(dir.path()), ids);
}

#[test]
fn a_damaged_record_header_names_every_commit_past_it() {
    let dir = tempfile::tempdir().unwrap();
    let (ids, records) = three_entries(dir.path());
    let at = chunk_of(&records, ids[1], 0);
    // Inside the record header of the second entry's first chunk.
    flip(dir.path(), ids[0], at + 3);

    let inspection = Configuration::default_for(dir.path()).inspect().unwrap();
    // No durable mark proves the bytes were synced: a torn tail, no problem
    // the log can prove...
    assert!(inspection.is_ok(), "{:?}", inspection.problems);
    let segment = &inspection.segments[0];
    assert_eq!(segment.entries, [ids[0]]);
    assert_eq!(segment.end, at);
    // ...but both commits past it are named.
    assert_eq!(segment.committed_past_end, [ids[1], ids[2]]);
    let listing = Configuration::default_for(dir.path())
        .inspect_segment(ids[0].0)
        .unwrap();
    let end = listing.end.unwrap();
    assert_eq!(end.offset, at);
    assert_eq!(end.commits_past_end, [ids[1].0, ids[2].0]);
    // And recovery drops them, as the inspection said.
    assert_eq!(recovered(dir.path()), [ids[0]]);
}

#[test]
fn a_damaged_chunk_names_its_entry_and_every_later_commit() {
    let dir = tempfile::tempdir().unwrap();
    let (ids, records) = three_entries(dir.path());
    // In the data of the second entry's second chunk ("bravo"), past its
    // 25-byte record header.
    flip(dir.path(), ids[0], chunk_of(&records, ids[1], 1) + 25 + 2);

    let inspection = Configuration::default_for(dir.path()).inspect().unwrap();
    assert!(inspection.is_ok(), "{:?}", inspection.problems);
    let segment = &inspection.segments[0];
    assert_eq!(segment.entries, [ids[0]]);
    assert_eq!(segment.incomplete.len(), 1);
    let incomplete = &segment.incomplete[0];
    assert_eq!(incomplete.id, ids[1]);
    assert_eq!(incomplete.chunks_committed, 3);
    assert_eq!(
        incomplete
            .chunks
            .iter()
            .map(|c| c.crc_ok)
            .collect::<Vec<_>>(),
        [true, false, true]
    );
    assert_eq!(segment.end, incomplete.commit_offset);
    assert_eq!(segment.committed_past_end, [ids[2]]);
    assert_eq!(recovered(dir.path()), [ids[0]]);
}
