//! Damaged segment files: truncated, overwritten with garbage, flipped
//! bits, zeroed, damaged headers. Reopening must never panic nor hand over
//! wrong bytes; entries before the damage must survive it. The tests that
//! damage a log written by the log itself run on a plain and on an
//! encrypted log.

mod common;

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use common::encryption::Encryption;
use common::{check_exactly_once, Model, Recorder, Rng, Seen};
use okaywal::format::{
    encode_chunk, RecordHeader, RecordKind, SegmentHeader, HEADER_SIZE, RECORD_HEADER_SIZE,
};
use okaywal::fs::{CrashFileSystem, FileSystem, OpenMode};
use okaywal::{Configuration, RecoveryMode, WriteAheadLog};

const DIR: &str = "/wal";

/// A small log, written once and copied for every damaged variant.
struct Base {
    /// Every file of the log directory after the last commit, without a
    /// shutdown.
    files: Vec<(String, Vec<u8>)>,
    /// The segment file holding the entries.
    segment: String,
    /// Committed entries in id order: id, chunks, offset of the first
    /// record, offset just past the commit record.
    entries: Vec<(u64, Vec<Vec<u8>>, u64, u64)>,
    rolled_back: u64,
    encryption: Encryption,
}

impl Base {
    fn last(&self) -> &(u64, Vec<Vec<u8>>, u64, u64) {
        self.entries.last().expect("entries")
    }

    fn model(&self) -> Model {
        let mut model = Model::default();
        for (id, chunks, _, _) in &self.entries {
            model.committed.insert(*id, chunks.clone());
        }
        model.rolled_back.insert(self.rolled_back);
        model
    }

    fn segment_bytes(&self) -> Vec<u8> {
        self.files
            .iter()
            .find(|(name, _)| *name == self.segment)
            .map(|(_, bytes)| bytes.clone())
            .expect("the segment file")
    }

    /// The files with the segment replaced by `segment`.
    fn with_segment(&self, segment: Vec<u8>) -> Vec<(String, Vec<u8>)> {
        self.files
            .iter()
            .map(|(name, bytes)| {
                if *name == self.segment {
                    (name.clone(), segment.clone())
                } else {
                    (name.clone(), bytes.clone())
                }
            })
            .collect()
    }
}

fn config(fs: &CrashFileSystem, buffer_bytes: usize, encryption: Encryption) -> Configuration {
    encryption.configure(
        Configuration::default_for(DIR)
            .file_system(fs.clone())
            .preallocate_bytes(4096)
            .checkpoint_after_bytes(1 << 20)
            .buffer_bytes(buffer_bytes),
    )
}

/// Offset just past the commit record of the entry whose chunks start at
/// `records`, checked against the records the log's own listing of the
/// segment shows (in either format).
fn commit_end(listing: &okaywal::SegmentRecords, id: u64, chunks: &[Vec<u8>], records: u64) -> u64 {
    let first = listing
        .records
        .iter()
        .position(|record| record.offset == records)
        .expect("the entry's first record");
    let own = &listing.records[first..=first + chunks.len()];
    for (record, chunk) in own.iter().zip(chunks) {
        assert_eq!(record.kind, okaywal::RecordType::Chunk);
        assert_eq!(record.entry_id, id);
        assert_eq!(record.length as usize, chunk.len());
        assert_eq!(record.crc_ok, Some(true));
    }
    let commit = own.last().expect("the commit record");
    assert_eq!(commit.kind, okaywal::RecordType::Commit);
    assert_eq!(commit.entry_id, id);
    assert_eq!(commit.length as usize, chunks.len());
    listing.records.get(first + chunks.len() + 1).map_or_else(
        || listing.end.as_ref().expect("records end").offset,
        |next| next.offset,
    )
}

fn build_base(encryption: Encryption) -> Base {
    let fs = CrashFileSystem::new();
    let log = config(&fs, 4096, encryption).open(Recorder::new()).unwrap();
    let mut rng = Rng::new(99);
    let mut written = Vec::new();

    // Entry 1: one chunk.
    let mut entry = log.begin_entry().unwrap();
    let a = rng.bytes(300);
    let first = entry.write_chunk(&a).unwrap();
    written.push((entry.commit().unwrap().0, vec![a], first.position));

    // Entry 2: a streamed chunk and an empty one.
    let mut entry = log.begin_entry().unwrap();
    let b = rng.bytes(40);
    let mut writer = entry.begin_chunk(40).unwrap();
    writer.write_all(&b[..13]).unwrap();
    writer.write_all(&b[13..]).unwrap();
    let first = writer.finish().unwrap();
    entry.write_chunk(b"").unwrap();
    written.push((
        entry.commit().unwrap().0,
        vec![b, Vec::new()],
        first.position,
    ));

    // Entry 3: rolled back.
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(&rng.bytes(50)).unwrap();
    let rolled_back = entry.id().0;
    entry.rollback().unwrap();

    // Entry 4, the last: three chunks, one streamed.
    let mut entry = log.begin_entry().unwrap();
    let c = rng.bytes(30);
    let d = rng.bytes(70);
    let first = entry.write_chunk(&c).unwrap();
    let mut writer = entry.begin_chunk(70).unwrap();
    writer.write_all(&d).unwrap();
    writer.finish().unwrap();
    entry.write_chunk(&[7]).unwrap();
    written.push((
        entry.commit().unwrap().0,
        vec![c, d, vec![7]],
        first.position,
    ));
    // Synced, then closed without a shutdown, as a crash right after the
    // last commit leaves it: nothing after the last entry vouches for it
    // (a shutdown leaves an end mark there, which makes damage below it
    // an error; see `damage_after_a_shutdown`).
    log.sync().unwrap();
    drop(log);

    let segment_id = written[0].2.file_id;
    assert!(written.iter().all(|(_, _, p)| p.file_id == segment_id));
    let segment = format!("wal-{segment_id}");
    let mut files = Vec::new();
    for name in fs.list_files(Path::new(DIR)).unwrap() {
        let bytes = fs.contents(&Path::new(DIR).join(&name)).unwrap();
        files.push((name, bytes));
    }
    files.sort();
    let bytes = files
        .iter()
        .find(|(name, _)| *name == segment)
        .expect("the segment file")
        .1
        .clone();
    let listing = config(&fs, 4096, encryption)
        .inspect_segment(segment_id)
        .unwrap();
    let entries: Vec<_> = written
        .into_iter()
        .map(|(id, chunks, position)| {
            let end = commit_end(&listing, id, &chunks, position.offset);
            (id, chunks, position.offset, end)
        })
        .collect();
    let end = entries.last().unwrap().3 as usize;
    assert!(
        bytes[end..end + RECORD_HEADER_SIZE].iter().all(|b| *b == 0),
        "the last entry is the last record"
    );
    Base {
        files,
        segment,
        entries,
        rolled_back,
        encryption,
    }
}

fn fresh_fs(files: &[(String, Vec<u8>)]) -> CrashFileSystem {
    let fs = CrashFileSystem::new();
    fs.create_dir_all(Path::new(DIR)).unwrap();
    for (name, bytes) in files {
        let path = Path::new(DIR).join(name);
        fs.open(&path, OpenMode::CreateNew).unwrap();
        assert!(fs.set_contents(&path, bytes.clone()));
    }
    fs
}

/// Opens the damaged log. On success, checks the recovered entries: each
/// one of `base` with its exact bytes, nothing twice, no rolled-back entry,
/// then writes one more entry, reopens and checks that nothing handed over
/// before is lost or changed.
fn reopen(
    files: &[(String, Vec<u8>)],
    base: &Base,
    buffer_bytes: usize,
    what: &str,
) -> io::Result<Vec<u64>> {
    reopen_mode(files, base, buffer_bytes, what, RecoveryMode::default())
}

fn reopen_mode(
    files: &[(String, Vec<u8>)],
    base: &Base,
    buffer_bytes: usize,
    what: &str,
    mode: RecoveryMode,
) -> io::Result<Vec<u64>> {
    let fs = fresh_fs(files);
    let recorder = Recorder::new();
    let log = config(&fs, buffer_bytes, base.encryption)
        .recovery_mode(mode)
        .open(recorder.clone())?;
    let model = base.model();
    let recovered = {
        let seen = recorder.seen();
        assert!(
            seen.aborted.is_empty(),
            "{what}: aborted {:?}",
            seen.aborted
        );
        // Recovered entries must be exactly what was written.
        check_exactly_once(
            &Model {
                committed: BTreeMap::new(),
                unacked: model.committed.clone(),
                ..model.clone()
            },
            &Seen::default(),
            &seen,
        )
        .unwrap_or_else(|e| panic!("{what}: {e}"));
        seen.recovered.clone()
    };
    let ids: Vec<u64> = recovered.iter().map(|(id, _)| *id).collect();

    // The log works after the damage, and keeps what it recovered.
    let mut after = Model::default();
    for (id, chunks) in &recovered {
        after.committed.insert(*id, chunks.clone());
    }
    let mut entry = log.begin_entry().unwrap();
    let new_id = entry.id().0;
    assert!(
        ids.iter().all(|id| *id < new_id),
        "{what}: new id {new_id} after {ids:?}"
    );
    entry.write_chunk(b"written after the damage").unwrap();
    entry.commit().unwrap();
    after
        .committed
        .insert(new_id, vec![b"written after the damage".to_vec()]);
    log.shutdown()
        .unwrap_or_else(|e| panic!("{what}: shutdown: {e}"));
    drop(log);

    let second = Recorder::new();
    let log = config(&fs, buffer_bytes, base.encryption)
        .recovery_mode(mode)
        .open(second.clone())
        .unwrap_or_else(|e| panic!("{what}: second reopen: {e}"));
    let first = recorder.seen();
    // Entries recovered from the damaged segment may be handed over again
    // by the first run's checkpoint: compare against the second run only
    // what the first did not checkpoint.
    let first_run = Seen {
        checkpoints: first.checkpoints.clone(),
        ..Seen::default()
    };
    check_exactly_once(&after, &first_run, &second.seen())
        .unwrap_or_else(|e| panic!("{what}: after a second reopen: {e}"));
    log.shutdown().unwrap();
    Ok(ids)
}

fn ids_before(base: &Base, end: u64) -> Vec<u64> {
    base.entries
        .iter()
        .filter(|(_, _, _, commit_end)| *commit_end <= end)
        .map(|(id, _, _, _)| *id)
        .collect()
}

/// For every byte of the last entry's records: cut the file there, fill
/// from there to the end with garbage, or flip one bit there.
#[test]
fn damage_anywhere_in_the_last_entry_loses_only_that_entry() {
    for encryption in Encryption::BOTH {
        damage_anywhere_in_the_last_entry_of(build_base(encryption));
    }
}

fn damage_anywhere_in_the_last_entry_of(base: Base) {
    let original = base.segment_bytes();
    let (last_id, _, start, end) = base.last().clone();
    let earlier: Vec<u64> = base.entries[..base.entries.len() - 1]
        .iter()
        .map(|e| e.0)
        .collect();
    let mut rng = Rng::new(1234);
    let mut cases = 0;
    let mut last_survived_garbage = 0;
    for offset in start..end {
        let at = offset as usize;
        let buffer = if offset % 2 == 0 { 4096 } else { 40 };

        let truncated = original[..at].to_vec();
        let what = format!("truncated at {offset}");
        let ids = reopen(&base.with_segment(truncated), &base, buffer, &what)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(ids, earlier, "{what}");

        let mut garbage = original.clone();
        rng.fill(&mut garbage[at..]);
        let what = format!("garbage from {offset}");
        let ids = reopen(&base.with_segment(garbage), &base, buffer, &what)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(&ids[..earlier.len()], earlier, "{what}");
        assert!(ids.len() == earlier.len() || ids.last() == Some(&last_id));
        last_survived_garbage += ids.len() - earlier.len();

        let mut flipped = original.clone();
        flipped[at] ^= 1 << (offset % 8);
        let what = format!("bit {} flipped at {offset}", offset % 8);
        let ids = reopen(&base.with_segment(flipped), &base, buffer, &what)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        // Every byte of a record is covered by a checksum.
        assert_eq!(ids, earlier, "{what}");
        cases += 3;
    }
    println!(
        "{:?}: {cases} damaged variants of a {}-byte last entry; it survived garbage {} times",
        base.encryption,
        end - start,
        last_survived_garbage
    );
}

/// Every byte of the first entry's records (chunk headers, chunk data,
/// CRCs, commit record), flipped: the later entries were synced after it,
/// so this is damage, never a torn tail. Chunk data matters most: each
/// commit record carries a durable mark from before its own chunks, so
/// only the later records prove the chunks were durable (a walk that
/// trusted only an entry's own commit record would drop the entry silently
/// for 304 of these 354 flips, the data ones).
#[test]
fn damage_in_an_earlier_entry_is_refused_by_default_and_never_yields_wrong_bytes() {
    for encryption in Encryption::BOTH {
        damage_in_an_earlier_entry_of(build_base(encryption));
    }
}

fn damage_in_an_earlier_entry_of(base: Base) {
    let original = base.segment_bytes();
    let (first_id, _, start, end) = base.entries[0].clone();
    let others: Vec<u64> = base.entries[1..].iter().map(|(id, ..)| *id).collect();
    for offset in start..end {
        let at = offset as usize;
        let mut flipped = original.clone();
        flipped[at] ^= 0x80;
        let what = format!(
            "high bit flipped at {offset} in entry {first_id} ({:?})",
            base.encryption
        );
        // By default: an error naming the segment, never a silent drop.
        let err = reopen(&base.with_segment(flipped.clone()), &base, 4096, &what).expect_err(&what);
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{what}: {err}");
        assert!(err.to_string().contains("wal-"), "{what}: {err}");
        // Point in time keeps what precedes the damage: nothing here.
        let ids = reopen_mode(
            &base.with_segment(flipped.clone()),
            &base,
            4096,
            &what,
            RecoveryMode::PointInTime,
        )
        .unwrap_or_else(|e| panic!("{what} (PointInTime): {e}"));
        assert!(ids.is_empty(), "{what} (PointInTime): {ids:?}");
        // Skipping loses the damaged entry only.
        let ids = reopen_mode(
            &base.with_segment(flipped),
            &base,
            4096,
            &what,
            RecoveryMode::SkipCorrupted,
        )
        .unwrap_or_else(|e| panic!("{what} (SkipCorrupted): {e}"));
        assert_eq!(ids, others, "{what} (SkipCorrupted)");
    }
}

#[test]
fn truncating_the_segment_keeps_exactly_the_whole_entries() {
    for encryption in Encryption::BOTH {
        truncating_the_segment_of(build_base(encryption));
    }
}

fn truncating_the_segment_of(base: Base) {
    let original = base.segment_bytes();
    let mut lengths: Vec<u64> = vec![
        0,
        1,
        7,
        16,
        100,
        511,
        512,
        513,
        536,
        537,
        original.len() as u64,
    ];
    for (_, _, start, end) in &base.entries {
        for delta in [0, 1, 24, 25, 26, 68, 69, 70] {
            lengths.push(start + delta);
            lengths.push(end - delta.min(end - start));
            lengths.push(end + delta);
        }
    }
    lengths.sort_unstable();
    lengths.dedup();
    for len in lengths {
        let len = len.min(original.len() as u64);
        let what = format!("segment cut to {len} bytes ({:?})", base.encryption);
        let ids = reopen(
            &base.with_segment(original[..len as usize].to_vec()),
            &base,
            4096,
            &what,
        )
        .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(ids, ids_before(&base, len), "{what}");
    }
}

#[test]
fn garbage_and_zeroed_segment_files_recover_nothing() {
    for encryption in Encryption::BOTH {
        garbage_and_zeroed_segment_files_of(build_base(encryption));
    }
}

fn garbage_and_zeroed_segment_files_of(base: Base) {
    let original = base.segment_bytes();
    let mut rng = Rng::new(77);
    for round in 0..20 {
        let mut garbage = vec![0; original.len()];
        rng.fill(&mut garbage);
        if round % 2 == 1 {
            // Garbage after a valid header: the records fail their checks.
            garbage[..HEADER_SIZE as usize].copy_from_slice(&original[..HEADER_SIZE as usize]);
        }
        let what = format!("garbage segment, round {round}");
        match reopen(&base.with_segment(garbage), &base, 4096, &what) {
            Ok(ids) => assert!(ids.is_empty(), "{what}: {ids:?}"),
            Err(err) => assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{what}: {err}"),
        }
    }
    for len in [0, 100, original.len()] {
        let what = format!("{len} zero bytes");
        let ids = reopen(&base.with_segment(vec![0; len]), &base, 4096, &what)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(ids.is_empty(), "{what}: {ids:?}");
    }
}

#[test]
fn a_damaged_segment_header_gives_an_error_or_nothing() {
    for encryption in Encryption::BOTH {
        a_damaged_segment_header_of(build_base(encryption));
    }
}

fn a_damaged_segment_header_of(base: Base) {
    let original = base.segment_bytes();
    let mut errors = 0;
    for at in 0..HEADER_SIZE as usize {
        let mut flipped = original.clone();
        flipped[at] ^= 1 << (at % 8);
        let what = format!("header bit {} flipped at {at}", at % 8);
        match reopen(&base.with_segment(flipped), &base, 4096, &what) {
            // Whatever was recovered was checked byte for byte by reopen.
            Ok(_) => {}
            Err(err) => {
                assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{what}: {err}");
                assert!(
                    err.to_string().contains(&base.segment),
                    "{what}: the error does not name the file: {err}"
                );
                errors += 1;
            }
        }
    }
    println!(
        "{:?}: {errors} of {HEADER_SIZE} header bit flips refused with an error",
        base.encryption
    );
}

#[test]
fn a_damaged_header_and_first_record_before_intact_records_is_an_error() {
    // Damage across the start of the file (one bad sector, say) took the
    // header and the first record. The entries after them must not be
    // dropped silently by treating the file as an unused one.
    for encryption in Encryption::BOTH {
        a_damaged_header_and_first_record_of(build_base(encryption));
    }
}

fn a_damaged_header_and_first_record_of(base: Base) {
    let original = base.segment_bytes();
    let first_record = HEADER_SIZE as usize;
    for (header_at, record_at) in [(0, first_record), (100, first_record + 5)] {
        let mut damaged = original.clone();
        damaged[header_at] ^= 0x10;
        damaged[record_at] ^= 0x10;
        let what = format!("header byte {header_at} and record byte {record_at} flipped");
        for mode in [RecoveryMode::default(), RecoveryMode::SkipCorrupted] {
            let err = reopen_mode(
                &base.with_segment(damaged.clone()),
                &base,
                4096,
                &what,
                mode,
            )
            .expect_err(&what);
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{what}: {err}");
            assert!(
                err.to_string().contains(&base.segment) && err.to_string().contains("header"),
                "{what}: {err}"
            );
        }
    }
}

/// The same on the real file system, truncating the real file.
#[test]
fn truncated_segment_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let open = |recorder: Recorder| -> io::Result<WriteAheadLog> {
        Configuration::default_for(dir.path())
            .preallocate_bytes(8192)
            .checkpoint_after_bytes(1 << 20)
            .open(recorder)
    };
    let log = open(Recorder::new()).unwrap();
    let mut rng = Rng::new(5);
    let mut written = Vec::new();
    for _ in 0..3 {
        let mut entry = log.begin_entry().unwrap();
        let data = rng.bytes(200);
        let record = entry.write_chunk(&data).unwrap();
        written.push((entry.commit().unwrap().0, data, record.position));
    }
    log.shutdown().unwrap();
    drop(log);
    let (_, _, last) = written[2];
    let path: PathBuf = dir.path().join(format!("wal-{}", last.file_id));
    let original = std::fs::read(&path).unwrap();
    let end = last.offset + 25 + 200 + 4 + 25;
    for cut in (last.offset..end).step_by(11) {
        for name in common::files_in(dir.path()) {
            std::fs::remove_file(dir.path().join(name)).unwrap();
        }
        std::fs::write(&path, &original[..cut as usize]).unwrap();
        let recorder = Recorder::new();
        let log = open(recorder.clone()).unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
        let seen = recorder.seen();
        assert_eq!(
            seen.recovered_ids(),
            vec![written[0].0, written[1].0],
            "cut at {cut}"
        );
        for ((_, chunks), (_, data, _)) in seen.recovered.iter().zip(&written) {
            assert!(chunks == &vec![data.clone()], "cut at {cut}");
        }
        drop(seen);
        log.shutdown().unwrap();
    }
}

/// A segment file that a crash left under its spare name (activated, its
/// first records synced, the rename to `wal-<id>` never done) holds records
/// salted with an id that no open counts. If the next run gave its new
/// segment the same id in the same file, the old records past the new ones
/// would verify again: a later crash would bring back entries that were
/// never acknowledged, with ids the new run may have used for others.
#[test]
fn records_left_in_an_unnamed_segment_file_never_come_back() {
    for encryption in Encryption::BOTH {
        records_left_in_an_unnamed_segment_file_of(encryption);
    }
}

fn records_left_in_an_unnamed_segment_file_of(encryption: Encryption) {
    // The stale file: entries 61–65 of another run, the way an activated
    // segment holds them (built here by a log that starts at id 61).
    let stale = CrashFileSystem::new();
    let log = encryption
        .configure(Configuration::default_for(DIR))
        .file_system(stale.clone())
        .minimum_next_entry_id(61)
        .open(Recorder::new())
        .unwrap();
    for i in 0..5_u8 {
        let mut entry = log.begin_entry().unwrap();
        entry.write_chunk(&[i; 1000]).unwrap();
        entry.commit().unwrap();
    }
    log.shutdown().unwrap();
    drop(log);
    let bytes = stale.contents(&Path::new(DIR).join("wal-61")).unwrap();

    // This run would start at 61 too, and finds the file as a spare.
    let fs = fresh_fs(&[("wal-spare-7".to_string(), bytes)]);
    let config = || {
        encryption
            .configure(Configuration::default_for(DIR))
            .file_system(fs.clone())
            .minimum_next_entry_id(61)
    };
    let log = config().open(Recorder::new()).unwrap();
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(&[9; 1000]).unwrap();
    let id = entry.commit().unwrap().0;
    drop(log);
    fs.power_loss(okaywal::fs::PowerLoss::Clean);

    let recorder = Recorder::new();
    let log = config().open(recorder.clone()).unwrap();
    let seen = recorder.seen();
    assert_eq!(
        seen.recovered_ids(),
        vec![id],
        "only the entry this run committed may come back"
    );
    assert!(seen.recovered[0].1 == vec![vec![9; 1000]], "its bytes");
    drop(seen);
    log.shutdown().unwrap();
}

/// A segment the manager abandons whose walk found no record (its first
/// record never reached the disk) still holds records salted with its id
/// further on. The next segment must not take that id in that file, or
/// those records verify again behind the new ones.
#[test]
fn an_abandoned_segment_s_id_is_never_reused_for_its_file() {
    let fs = CrashFileSystem::new();
    let dir = Path::new("/abandoned");
    fs.create_dir_all(dir).unwrap();
    let id = 5_u64;
    // Segment 5: a hole where its first record should be, then entry 6.
    let mut image = SegmentHeader {
        first_entry_id: id,
        previous: None,
        version_info: b"old".to_vec(),
    }
    .encode();
    image.resize(HEADER_SIZE as usize + 200, 0);
    let stale = b"STALE, never acknowledged";
    let record = |kind, length| RecordHeader {
        kind,
        entry_id: id + 1,
        length,
        durable_mark: 0,
    };
    encode_chunk(
        &mut image,
        &record(RecordKind::Chunk, stale.len() as u32),
        id,
        stale,
        crc32fast::hash(stale),
    );
    image.extend_from_slice(&record(RecordKind::Commit, 1).encode(id));
    image.resize(16 << 10, 0);
    let file = fs.open(&dir.join("wal-5"), OpenMode::CreateNew).unwrap();
    file.write_all_at(&image, 0).unwrap();
    file.sync_data().unwrap();
    fs.sync_dir(dir).unwrap();

    let config = || one_segment_log(&fs, dir);
    let abandoning = Recorder {
        abandon: Some(b"old".to_vec()),
        ..Recorder::default()
    };
    let log = config().open(abandoning).unwrap();
    let mut entry = log.begin_entry().unwrap();
    assert!(entry.id().0 > id, "id {} reused", entry.id());
    // Chunk (25 + 146 + 4) and commit (25) records: 200 bytes, ending
    // where the stale records begin, were the file reused as segment 5.
    entry.write_chunk(&[1_u8; 146]).unwrap();
    let new = entry.commit().unwrap();
    log.shutdown().unwrap();
    drop(log);

    let recorder = Recorder::new();
    let log = config().open(recorder.clone()).unwrap();
    let recovered = recorder.seen().recovered.clone();
    log.shutdown().unwrap();
    let ids: Vec<u64> = recovered.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, vec![new.0], "recovered {recovered:?}");
}

/// A segment found under its `wal-` name got it in a sync pass that synced
/// the segment before it whole. Damage to that segment's last record is
/// then damage, not a torn tail: the next segment's entries must not be
/// dropped silently, even when all its records carry durable mark 0 (as
/// the records of a segment's first commit do, acknowledged by that
/// segment's first sync).
#[test]
fn damage_to_a_segment_s_tail_never_silently_drops_the_next_segment() {
    let fs = CrashFileSystem::new();
    let dir = Path::new("/tail");
    let config = || one_segment_log(&fs, dir);
    let log = config().open(Recorder::refusing()).unwrap();
    for byte in 1..=5_u8 {
        let mut entry = log.begin_entry().unwrap();
        entry.write_chunk(&[byte; 100]).unwrap();
        entry.commit().unwrap();
    }
    log.shutdown().unwrap();
    drop(log);
    // Each entry: a chunk record (header, 100 bytes, CRC) and a commit record.
    let first_end = HEADER_SIZE + 5 * (2 * RECORD_HEADER_SIZE as u64 + 100 + 4);
    // Segment 6, started after segment 1 was closed at `first_end`, with
    // one entry written before its first sync.
    let mut image = SegmentHeader {
        first_entry_id: 6,
        previous: Some((1, first_end)),
        version_info: Vec::new(),
    }
    .encode();
    let data = [6_u8; 100];
    let record = |kind, length| RecordHeader {
        kind,
        entry_id: 6,
        length,
        durable_mark: 0,
    };
    encode_chunk(
        &mut image,
        &record(RecordKind::Chunk, data.len() as u32),
        6,
        &data,
        crc32fast::hash(&data),
    );
    image.extend_from_slice(&record(RecordKind::Commit, 1).encode(6));
    image.resize(16 << 10, 0);
    let second = fs.open(&dir.join("wal-6"), OpenMode::CreateNew).unwrap();
    second.write_all_at(&image, 0).unwrap();
    second.sync_data().unwrap();
    fs.sync_dir(dir).unwrap();
    drop(second);
    let intact = Recorder::refusing();
    drop(config().open(intact.clone()).unwrap());
    assert_eq!(intact.seen().recovered_ids(), vec![1, 2, 3, 4, 5, 6]);

    // Flip a byte of the first segment's last record.
    let first = dir.join("wal-1");
    let mut bytes = fs.contents(&first).unwrap();
    bytes[first_end as usize - 10] ^= 0xff;
    assert!(fs.set_contents(&first, bytes));

    let err = open_error(config().open(Recorder::refusing()));
    assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    let skipping = Recorder::refusing();
    drop(
        config()
            .recovery_mode(RecoveryMode::SkipCorrupted)
            .open(skipping.clone())
            .unwrap(),
    );
    assert_eq!(skipping.seen().recovered_ids(), vec![1, 2, 3, 4, 6]);
    let cutting = Recorder::refusing();
    drop(
        config()
            .recovery_mode(RecoveryMode::PointInTime)
            .open(cutting.clone())
            .unwrap(),
    );
    assert_eq!(cutting.seen().recovered_ids(), vec![1, 2, 3, 4]);
}

/// A stray file name with the largest id leaves no id for new entries:
/// opening fails with a clear error instead of wrapping around to ids (and
/// segment names) already in use.
#[test]
fn a_file_name_claiming_the_last_entry_id_is_refused_at_open() {
    let fs = CrashFileSystem::new();
    let dir = Path::new("/overflow");
    let config = || one_segment_log(&fs, dir);
    let log = config().open(Recorder::refusing()).unwrap();
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(b"acknowledged").unwrap();
    let id = entry.commit().unwrap();
    log.shutdown().unwrap();
    drop(log);
    let stray = dir.join(format!("wal-recycled-{}", u64::MAX));
    fs.open(&stray, OpenMode::CreateNew).unwrap();

    let err = open_error(config().open(Recorder::refusing()));
    assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    assert!(err.to_string().contains(&u64::MAX.to_string()), "{err}");
    fs.remove_file(&stray).unwrap();
    let recorder = Recorder::refusing();
    let log = config().open(recorder.clone()).unwrap();
    assert_eq!(recorder.seen().recovered_ids(), vec![id.0]);
    log.shutdown().unwrap();
}

/// The error of an open that must fail (without printing the whole log).
fn open_error(opened: io::Result<WriteAheadLog>) -> io::Error {
    match opened {
        Ok(_) => panic!("the log opened"),
        Err(err) => err,
    }
}

/// A log in `dir` whose segments (16 KiB) are never checkpointed for size.
fn one_segment_log(fs: &CrashFileSystem, dir: &Path) -> Configuration {
    Configuration::default_for(dir)
        .file_system(fs.clone())
        .preallocate_bytes(16 << 10)
        .checkpoint_after_bytes(1 << 30)
}
