//! Damaged commit log bytes cost the readers of the log (replicas) the
//! records they held, never a blob: a store whose `commits-*` file has any
//! byte flipped opens, serves every blob exactly, reports the damage from
//! `verify` and from `commit_log` (never a wrong record), keeps committing,
//! and reopens with the damage still reported until a checkpoint drops it.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{assert_blob, blob};
use sediment::{CommitLogDamage, CommitRecord, Config, Database, Error, GrainId, SequenceId};

/// Opens the store with small WAL segments (the copies below stay small)
/// that never fill by themselves, so the tests decide what is checkpointed,
/// and with blobs of 2 KiB and more written straight into their strata.
fn open(dir: &Path) -> Database {
    Config::for_directory(dir)
        .direct_write_bytes(2048)
        .wal(|wal| {
            wal.checkpoint_after_bytes(1 << 20)
                .preallocate_bytes(16 << 10)
        })
        .open()
        .unwrap_or_else(|e| panic!("opening {}: {e}", dir.display()))
}

/// One frame of a commit log file, from the documented layout:
/// `[length u32][CRC32 u32][record]`, a record starting with its sequence.
#[derive(Debug, Clone, Copy)]
struct Frame {
    offset: u64,
    len: u64,
    sequence: u64,
}

fn frames(bytes: &[u8]) -> Vec<Frame> {
    let mut frames = Vec::new();
    let mut offset = 0;
    while offset < bytes.len() {
        let len = u32::from_le_bytes(bytes[offset..offset + 4].try_into().unwrap()) as usize;
        let sequence = u64::from_le_bytes(bytes[offset + 8..offset + 16].try_into().unwrap());
        frames.push(Frame {
            offset: offset as u64,
            len: 8 + len as u64,
            sequence,
        });
        offset += 8 + len;
    }
    assert_eq!(offset, bytes.len(), "the frames end where the file ends");
    frames
}

/// A store with every kind of commit record, some in the commit log and
/// the strata, some only in the WAL, and what reading it must give.
struct Fixture {
    dir: tempfile::TempDir,
    /// Every blob that must read back: live ones and archived ones that no
    /// checkpoint freed.
    blobs: BTreeMap<GrainId, Vec<u8>>,
    /// Blobs archived and not freed, with the archiving sequence.
    archived: Vec<(GrainId, SequenceId)>,
    header: Option<GrainId>,
    checkpointed_to: u64,
    /// The sequences checkpointed into the commit log; higher ones are only
    /// in the WAL.
    in_files: u64,
    /// `commit_log(0)` of the undamaged store.
    records: Vec<CommitRecord>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    let mut blobs = BTreeMap::new();
    let mut put = |tx: &mut sediment::Transaction<'_>, tag: u64, size: usize| {
        let data = blob(tag, size);
        let id = tx.write(&data).unwrap();
        blobs.insert(id, data);
        id
    };

    // Blobs of several sizes (an empty one, and one written straight into
    // its stratum) and the embedded header.
    let mut tx = db.begin_transaction().unwrap();
    let a = put(&mut tx, 1, 100);
    let b = put(&mut tx, 2, 3000);
    let c = put(&mut tx, 3, 10);
    let d = put(&mut tx, 4, 0);
    tx.set_embedded_header(Some(a)).unwrap();
    tx.commit().unwrap();
    let mut tx = db.begin_transaction().unwrap();
    let e = put(&mut tx, 5, 40);
    tx.archive(c).unwrap();
    let s2 = tx.commit().unwrap();
    let mut tx = db.begin_transaction().unwrap();
    put(&mut tx, 6, 500);
    tx.archive(d).unwrap();
    let s3 = tx.commit().unwrap();
    // Frees `c`; the next blob of its size may take its grain.
    let mut tx = db.begin_transaction().unwrap();
    tx.checkpoint_to(s2).unwrap();
    tx.commit().unwrap();
    let mut tx = db.begin_transaction().unwrap();
    let g = put(&mut tx, 7, 10);
    tx.archive(e).unwrap();
    let e_archived = tx.commit().unwrap();
    db.checkpoint_wal().unwrap();

    // Archives and a header change, then a checkpoint that frees `d`.
    let mut tx = db.begin_transaction().unwrap();
    let h = put(&mut tx, 8, 64);
    tx.archive(b).unwrap();
    tx.set_embedded_header(Some(h)).unwrap();
    let b_archived = tx.commit().unwrap();
    let mut tx = db.begin_transaction().unwrap();
    tx.checkpoint_to(s3).unwrap();
    let in_files = tx.commit().unwrap().0;
    db.checkpoint_wal().unwrap();

    // Left in the WAL: a write and an archive, and a direct write.
    let mut tx = db.begin_transaction().unwrap();
    put(&mut tx, 9, 30);
    tx.archive(g).unwrap();
    let g_archived = tx.commit().unwrap();
    let mut tx = db.begin_transaction().unwrap();
    put(&mut tx, 10, 2500);
    tx.commit().unwrap();
    drop(db);

    blobs.remove(&c);
    blobs.remove(&d);
    let mut fixture = Fixture {
        dir,
        blobs,
        archived: vec![(b, b_archived), (e, e_archived), (g, g_archived)],
        header: Some(h),
        checkpointed_to: s3.0,
        in_files,
        records: Vec::new(),
    };
    // What the undamaged store gives, read from a copy (opening replays
    // and may write).
    let copy = copy_store(fixture.dir.path());
    let db = open(copy.path());
    fixture.records = db.commit_log(SequenceId(0)).unwrap().collect();
    assert_eq!(db.checkpointed_to().0, fixture.checkpointed_to);
    check_blobs(&db, &fixture, &[], "the undamaged store");
    db.verify().unwrap();
    fixture
}

fn copy_store(from: &Path) -> tempfile::TempDir {
    let to = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), to.path().join(entry.file_name())).unwrap();
        }
    }
    to
}

/// Every blob reads back exactly, and the embedded header is the last one
/// set.
fn check_blobs(db: &Database, fixture: &Fixture, more: &[(GrainId, Vec<u8>)], context: &str) {
    for (id, data) in fixture
        .blobs
        .iter()
        .chain(more.iter().map(|(id, d)| (id, d)))
    {
        assert_blob(db, *id, data, context);
    }
    assert_eq!(db.embedded_header(), fixture.header, "{context}");
}

/// Reads `commit_log(since)`: its records, or the damage it fails with.
fn read_log(db: &Database, since: u64) -> (Vec<CommitRecord>, Option<CommitLogDamage>) {
    match db.commit_log(SequenceId(since)) {
        Ok(log) => (log.collect(), None),
        Err(Error::CommitLogDamaged(damage)) => (Vec::new(), Some(damage)),
        Err(other) => panic!("commit_log failed with {other}"),
    }
}

/// The commit log of a store whose frame `frame` of `name` is damaged: a
/// read from before it fails with the damage, naming the frame and every
/// sequence from the damaged record to the end of the file (a damaged
/// frame's length cannot be trusted); from the sequence after it on, the
/// undamaged records again. Returns the damage.
fn check_log(
    db: &Database,
    fixture: &Fixture,
    name: &str,
    frame: Frame,
    context: &str,
) -> CommitLogDamage {
    let (records, damage) = read_log(db, 0);
    let damage = damage.unwrap_or_else(|| panic!("{context}: commit_log reports no damage"));
    assert!(damage.path.ends_with(name), "{context}: {damage}");
    assert_eq!(damage.offset, frame.offset, "{context}: {damage}");
    // Records at or below the checkpoint are dropped, not lost.
    assert_eq!(
        damage.first.0,
        frame.sequence.max(fixture.checkpointed_to + 1),
        "{context}: {damage}"
    );
    assert_eq!(damage.last.0, fixture.in_files, "{context}: {damage}");
    assert!(
        records.is_empty(),
        "{context}: a read whose range holds the damage fails"
    );
    let (after, more) = read_log(db, damage.last.0 + 1);
    assert_eq!(more, None, "{context}: damage after the damaged range");
    let expected: Vec<CommitRecord> = fixture
        .records
        .iter()
        .filter(|r| r.sequence > damage.last)
        .cloned()
        .collect();
    assert_eq!(
        after.get(..expected.len()),
        Some(&expected[..]),
        "{context}: the records after the damage"
    );
    damage
}

/// `verify` fails, listing exactly the damaged frame.
fn check_verify(db: &Database, damage: &CommitLogDamage, context: &str) {
    let report = match db.verify() {
        Err(Error::Verification(report)) => report,
        other => panic!("{context}: verify should report the damage, gave {other:?}"),
    };
    assert_eq!(report.commit_log_damage.len(), 1, "{context}: {report}");
    let found = &report.commit_log_damage[0];
    assert_eq!(
        (&found.path, found.offset, found.last),
        (&damage.path, damage.offset, damage.last),
        "{context}: {report}"
    );
    assert_eq!(report.problems.len(), 1, "{context}: {report}");
    assert_eq!(
        report.problems[0].location,
        format!("{} offset {}", damage.path.display(), damage.offset),
        "{context}: {report}"
    );
}

/// A blob whose archiving record is readable is still archived (a later
/// checkpoint frees it as usual). One whose archiving record the damage
/// hides is live and not archived: it is kept, not freed, and can be
/// archived again.
fn check_archived(db: &Database, fixture: &Fixture, damage: &CommitLogDamage, context: &str) {
    for &(grain, by) in &fixture.archived {
        let mut tx = db.begin_transaction().unwrap();
        let again = tx.archive(grain);
        if damage.first <= by && by <= damage.last {
            assert!(
                again.is_ok(),
                "{context}: archiving {grain} again: {again:?}"
            );
        } else {
            assert!(
                matches!(again, Err(Error::AlreadyArchived(_))),
                "{context}: {grain} archived by {by} should still be archived: {again:?}"
            );
        }
        tx.rollback();
    }
}

/// Copies the store, flips the byte at `at` of its file `name`, and checks
/// everything a damaged commit log must leave working.
fn check_flip(fixture: &Fixture, name: &str, frames: &[Frame], at: u64) {
    let context = format!("byte {at} of {name} flipped");
    let copy = copy_store(fixture.dir.path());
    let path = copy.path().join(name);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[at as usize] ^= 0xFF;
    std::fs::write(&path, bytes).unwrap();
    let frame = *frames
        .iter()
        .find(|f| (f.offset..f.offset + f.len).contains(&at))
        .expect("every byte is in a frame");

    let db = open(copy.path());
    check_blobs(&db, fixture, &[], &context);
    let damage = check_log(&db, fixture, name, frame, &context);
    check_verify(&db, &damage, &context);
    check_archived(&db, fixture, &damage, &context);

    // New commits go on, and their records are readable after the damage.
    let mut tx = db.begin_transaction().unwrap();
    let data = blob(1000 + at, 20);
    let id = tx.write(&data).unwrap();
    let sequence = tx.commit().unwrap();
    let after = |db: &Database| {
        let (records, more) = read_log(db, damage.last.0 + 1);
        assert_eq!(more, None, "{context}");
        records.last().map(|r| r.sequence)
    };
    assert_eq!(after(&db), Some(sequence), "{context}: the new record");
    // Moves everything into the strata and the commit log files.
    db.shutdown().unwrap();

    let db = open(copy.path());
    let context = format!("{context}, after reopening");
    check_blobs(&db, fixture, &[(id, data)], &context);
    assert_eq!(check_log(&db, fixture, name, frame, &context), damage);
    assert_eq!(after(&db), Some(sequence), "{context}: the new record");
    check_verify(&db, &damage, &context);
    drop(db);
}

#[test]
fn every_flipped_commit_log_byte_costs_readers_records_but_never_a_blob() {
    let fixture = fixture();
    let names = common::files_with_prefix(fixture.dir.path(), "commits-");
    assert!(!names.is_empty());
    for name in &names {
        let bytes = std::fs::read(fixture.dir.path().join(name)).unwrap();
        // Every byte of the file belongs to a frame the index counts (the
        // file ends where its last frame ends), so no flip is irrelevant.
        let frames = frames(&bytes);
        assert!(frames.len() >= 5, "{name} holds {} records", frames.len());
        // Two at a time: most of the time goes to waiting for syncs.
        std::thread::scope(|scope| {
            for half in 0..2 {
                let (fixture, frames, len) = (&fixture, &frames, bytes.len() as u64);
                scope.spawn(move || {
                    for at in (half..len).step_by(2) {
                        check_flip(fixture, name, frames, at);
                    }
                });
            }
        });
    }
}

/// Flips one byte of the record in the middle of `commits-1` of a copy.
fn damaged_copy(fixture: &Fixture) -> (tempfile::TempDir, Frame) {
    let copy = copy_store(fixture.dir.path());
    let path = copy.path().join("commits-1");
    let mut bytes = std::fs::read(&path).unwrap();
    let all = frames(&bytes);
    let frame = all[all.len() / 2];
    bytes[(frame.offset + frame.len - 1) as usize] ^= 0x01;
    std::fs::write(&path, bytes).unwrap();
    (copy, frame)
}

#[test]
fn a_checkpoint_past_the_damage_drops_it_and_verify_passes_again() {
    let fixture = fixture();
    let (copy, frame) = damaged_copy(&fixture);
    let db = open(copy.path());
    let damage = check_log(&db, &fixture, "commits-1", frame, "damaged");
    let mut tx = db.begin_transaction().unwrap();
    let data = blob(77, 300);
    let id = tx.write(&data).unwrap();
    let written = tx.commit().unwrap();
    let mut tx = db.begin_transaction().unwrap();
    tx.checkpoint_to(written).unwrap();
    let checkpoint = tx.commit().unwrap();
    // The records it hid are dropped now, so readers of the log no longer
    // reach it; verify reports the damaged bytes until the file is trimmed
    // (when the WAL checkpoint moves the checkpoint into the index).
    assert_eq!(read_log(&db, 0).1, None);
    check_verify(&db, &damage, "checkpointed past the damage");
    db.shutdown().unwrap();

    let db = open(copy.path());
    assert!(
        !copy.path().join("commits-1").exists(),
        "the damaged file was trimmed"
    );
    let report = db.verify().unwrap();
    assert!(report.commit_log_damage.is_empty());
    let (records, none) = read_log(&db, 0);
    assert_eq!(none, None);
    assert_eq!(
        records.iter().map(|r| r.sequence).collect::<Vec<_>>(),
        vec![checkpoint]
    );
    assert!(damage.last < written);
    // Blobs nobody archived read back; archived ones are freed or intact,
    // never wrong.
    for (grain, bytes) in fixture.blobs.iter().chain([(&id, &data)]) {
        if fixture
            .archived
            .iter()
            .any(|(archived, _)| archived == grain)
        {
            if let Some(stored) = db.get(*grain).unwrap() {
                assert_eq!(&stored, bytes, "archived blob {grain}");
            }
        } else {
            assert_blob(&db, *grain, bytes, "after the checkpoint");
        }
    }
    db.shutdown().unwrap();
}

#[test]
fn a_commit_log_file_cut_short_is_damage_that_stays_reported() {
    let fixture = fixture();
    let copy = copy_store(fixture.dir.path());
    let path = copy.path().join("commits-1");
    let bytes = std::fs::read(&path).unwrap();
    let all = frames(&bytes);
    // Cut at a frame boundary: nothing in the file itself looks wrong.
    let frame = all[all.len() - 2];
    std::fs::write(&path, &bytes[..frame.offset as usize]).unwrap();

    let db = open(copy.path());
    check_blobs(&db, &fixture, &[], "cut short");
    let damage = check_log(&db, &fixture, "commits-1", frame, "cut short");
    assert!(damage.what.contains("ends at byte"), "{damage}");
    check_verify(&db, &damage, "cut short");
    let mut tx = db.begin_transaction().unwrap();
    let data = blob(78, 90);
    let id = tx.write(&data).unwrap();
    tx.commit().unwrap();
    db.shutdown().unwrap();

    // The file left behind was filled up to the length the index gave it,
    // so its missing records stay visible as damage.
    assert_eq!(std::fs::metadata(&path).unwrap().len(), bytes.len() as u64);
    let db = open(copy.path());
    check_blobs(&db, &fixture, &[(id, data)], "cut short, reopened");
    let again = check_log(&db, &fixture, "commits-1", frame, "cut short, reopened");
    assert_eq!((again.offset, again.last), (damage.offset, damage.last));
    check_verify(&db, &again, "cut short, reopened");
    db.shutdown().unwrap();
}

#[test]
fn bytes_past_the_valid_end_of_the_current_file_are_not_read() {
    let fixture = fixture();
    let copy = copy_store(fixture.dir.path());
    let path = copy.path().join("commits-1");
    let mut bytes = std::fs::read(&path).unwrap();
    // What a checkpoint that a crash cut short may leave behind.
    bytes.extend_from_slice(&[0xEE; 100]);
    std::fs::write(&path, &bytes).unwrap();

    let db = open(copy.path());
    check_blobs(&db, &fixture, &[], "garbage past the end");
    db.verify().unwrap();
    let (records, damage) = read_log(&db, 0);
    assert_eq!(damage, None);
    assert_eq!(records, fixture.records);
    let mut tx = db.begin_transaction().unwrap();
    let data = blob(79, 30);
    let id = tx.write(&data).unwrap();
    tx.commit().unwrap();
    db.shutdown().unwrap();

    let db = open(copy.path());
    check_blobs(
        &db,
        &fixture,
        &[(id, data)],
        "garbage past the end, reopened",
    );
    db.verify().unwrap();
    assert_eq!(read_log(&db, 0).1, None);
    db.shutdown().unwrap();
}
