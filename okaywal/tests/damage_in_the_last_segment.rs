//! A flipped byte in the last segment, where nothing written later vouches
//! for the records (no later record's durable mark, no successor's
//! recorded end: the process ended right after its last commit, without a
//! shutdown), reads as a torn tail: recovery ends the segment there and
//! drops every entry from there on, committed or not. That is right after a
//! power cut in the middle of writing them, and a loss otherwise, and the
//! log cannot tell the two apart. Inspection names every entry so dropped
//! whose commit record still verifies (`committed_past_end`, `incomplete`),
//! so a tool built on it never calls such a log healthy without saying so.
//!
//! After a `shutdown`, an end mark past the last record vouches for all of
//! them: the same damage is an error that names it, and nothing is
//! dropped unless a recovery mode says so.

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

/// A log of three committed entries: the first synced on its own, the
/// second (buffered) and third synced together, so that no record's
/// durable mark reaches past the first entry; then the process ends
/// without a shutdown (`shut_down` false) or after one. Returns the three
/// ids and the segment's records (kind, offset, entry).
fn three_entries(dir: &Path) -> ([EntryId; 3], Vec<(RecordType, u64, u64)>) {
    three_entries_then(dir, false)
}

fn three_entries_then(dir: &Path, shut_down: bool) -> ([EntryId; 3], Vec<(RecordType, u64, u64)>) {
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
    if shut_down {
        log.shutdown().unwrap();
    }
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

/// Opens the log with `mode`; the ids recovered, or the error.
fn recovered_with(dir: &Path, mode: okaywal::RecoveryMode) -> io::Result<Vec<EntryId>> {
    let manager = Recovered::default();
    let log = Configuration::default_for(dir)
        .recovery_mode(mode)
        .open(manager.clone())?;
    log.shutdown()?;
    let ids = manager.0.lock().unwrap().clone();
    Ok(ids)
}

#[test]
fn after_a_shutdown_damage_before_the_last_record_is_an_error_not_a_torn_tail() {
    for (what, flipped_in) in [("a record header", 3_u64), ("a chunk's data", 25 + 2)] {
        let dir = tempfile::tempdir().unwrap();
        let (ids, records) = three_entries_then(dir.path(), true);
        // The shutdown left an end mark after the last commit.
        let last = records.last().unwrap();
        assert_eq!((last.0, last.2), (RecordType::Padding, ids[0].0), "{what}");
        // The second entry's second chunk ("bravo").
        let at = chunk_of(&records, ids[1], 1);
        flip(dir.path(), ids[0], at + flipped_in);

        let inspection = Configuration::default_for(dir.path()).inspect().unwrap();
        assert_eq!(
            inspection.problems.len(),
            1,
            "{what}: {:?}",
            inspection.problems
        );
        assert_eq!(inspection.problems[0].offset, Some(at), "{what}");
        let error =
            recovered_with(dir.path(), okaywal::RecoveryMode::ErrorOnCorruption).expect_err(what);
        assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{what}: {error}");
        assert!(error.to_string().contains("wal-"), "{what}: {error}");
        // The modes that drop damage say what they keep.
        assert_eq!(
            recovered_with(dir.path(), okaywal::RecoveryMode::SkipCorrupted).unwrap(),
            [ids[0], ids[2]],
            "{what}"
        );
    }
}

#[test]
fn a_shutdown_after_its_last_commit_leaves_every_entry_recoverable() {
    let dir = tempfile::tempdir().unwrap();
    let (ids, _) = three_entries_then(dir.path(), true);
    let inspection = Configuration::default_for(dir.path()).inspect().unwrap();
    assert!(inspection.is_ok(), "{:?}", inspection.problems);
    assert_eq!(inspection.segments[0].entries, ids);
    // A manager that never checkpoints, so that every entry stays.
    let manager = Recovered::default();
    let log = Configuration::default_for(dir.path())
        .checkpoint_after_bytes(u64::MAX)
        .open(manager.clone())
        .unwrap();
    assert_eq!(*manager.0.lock().unwrap(), ids);
    // And the reopened log takes more entries, shut down again.
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(b"after").unwrap();
    let fourth = entry.commit().unwrap();
    log.shutdown().unwrap();
    drop(log);
    let inspection = Configuration::default_for(dir.path()).inspect().unwrap();
    assert!(inspection.is_ok(), "{:?}", inspection.problems);
    let kept: Vec<EntryId> = inspection
        .segments
        .iter()
        .flat_map(|segment| segment.entries.iter().copied())
        .collect();
    assert!(kept.ends_with(&[fourth]), "{kept:?}");
}
