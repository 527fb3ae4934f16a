//! A store opened read-only: every blob (in the strata and still in the
//! WAL) reads back, verify runs, writes are refused, and not one byte,
//! name or modification time in the directory changes. The lock is
//! shared among readers and keeps writers out. Verify of a store whose WAL
//! holds a damaged committed transaction names the damage and the blobs
//! it took.

mod common;

use std::path::{Path, PathBuf};

use common::blob;
use sediment::{Config, Database, Error, GrainId};
use testkit::disk::snapshot;

fn config(dir: &Path) -> Config {
    Config::for_directory(dir).wal(|wal| {
        wal.checkpoint_after_bytes(1 << 20)
            .preallocate_bytes(64 << 10)
    })
}

fn commit(db: &Database, tag: u64, sizes: &[usize]) -> Vec<(GrainId, Vec<u8>)> {
    let mut tx = db.begin_transaction().unwrap();
    let blobs = sizes
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let data = blob(tag * 100 + i as u64, len);
            (tx.write(&data).unwrap(), data)
        })
        .collect();
    tx.commit().unwrap();
    blobs
}

/// A store with blobs in the strata and, after a crash, more in the WAL.
fn store(dir: &Path) -> Vec<(GrainId, Vec<u8>)> {
    let db = config(dir).open().unwrap();
    let mut blobs = commit(&db, 1, &[10, 3000, 80_000]);
    db.checkpoint_wal().unwrap();
    blobs.extend(commit(&db, 2, &[20, 500, 70_290]));
    // The process dies with the second transaction only in the WAL.
    drop(db);
    blobs
}

#[test]
fn a_read_only_store_serves_every_blob_refuses_writes_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let blobs = store(dir.path());
    let before = snapshot(dir.path());
    std::thread::sleep(std::time::Duration::from_millis(20));

    let db = Database::open_read_only(dir.path()).unwrap();
    assert!(db.is_read_only());
    for (id, data) in &blobs {
        assert_eq!(db.get(*id).unwrap().as_deref(), Some(&data[..]), "{id}");
    }
    db.verify().unwrap();
    // One record checkpointed into the commit log, one still in the WAL.
    assert_eq!(db.commit_log(sediment::SequenceId(0)).unwrap().count(), 2);
    assert!(matches!(db.begin_transaction(), Err(Error::ReadOnly)));
    assert!(matches!(db.checkpoint_wal(), Err(Error::ReadOnly)));
    assert!(db.wal_stats().is_none());
    db.shutdown().unwrap();
    assert_eq!(
        snapshot(dir.path()),
        before,
        "a read-only open wrote to the store"
    );

    // Opening for writing afterwards finds everything too.
    let db = config(dir.path()).open().unwrap();
    for (id, data) in &blobs {
        assert_eq!(db.get(*id).unwrap().as_deref(), Some(&data[..]), "{id}");
    }
    db.shutdown().unwrap();
}

#[test]
fn readers_share_the_store_and_keep_writers_out() {
    let dir = tempfile::tempdir().unwrap();
    store(dir.path());
    let first = Database::open_read_only(dir.path()).unwrap();
    let second = Database::open_read_only(dir.path()).unwrap();
    let err = config(dir.path())
        .open()
        .map(drop)
        .expect_err("a writer beside readers");
    assert!(err.to_string().contains("lock"), "{err}");
    drop((first, second));

    let writer = config(dir.path()).open().unwrap();
    let err = Database::open_read_only(dir.path())
        .map(drop)
        .expect_err("a reader beside a writer");
    assert!(err.to_string().contains("lock"), "{err}");
    writer.shutdown().unwrap();
    Database::open_read_only(dir.path()).unwrap();
}

/// A copy of a store that left its lock files out (a backup that skips
/// empty files, say): a read-only open creates none, and still keeps a
/// writer out while it lives, by its shared lock on the index.
#[test]
fn a_copy_without_its_lock_file_still_keeps_a_writer_out_of_its_readers() {
    let dir = tempfile::tempdir().unwrap();
    let blobs = store(dir.path());
    for lock in ["sediment.lock", "okaywal.lock"] {
        std::fs::remove_file(dir.path().join(lock)).unwrap();
    }
    let before = snapshot(dir.path());
    let reader = Database::open_read_only(dir.path()).unwrap();
    let second = Database::open_read_only(dir.path()).unwrap();
    assert!(before == snapshot(dir.path()), "a read-only open wrote");
    let err = config(dir.path())
        .open()
        .map(drop)
        .expect_err("a writer beside readers of a copy without its lock file");
    assert!(err.to_string().contains("lock"), "{err}");
    assert!(
        !dir.path().join("sediment.lock").exists(),
        "the refused writer left its lock file"
    );
    for (id, data) in &blobs {
        assert_eq!(reader.get(*id).unwrap().as_deref(), Some(&data[..]));
    }
    reader.verify().unwrap();
    drop((reader, second));

    // Once they are gone, a writer opens it (and makes the lock file),
    // and a reader is kept out in turn.
    let writer = config(dir.path()).open().unwrap();
    assert!(Database::open_read_only(dir.path()).is_err());
    writer.shutdown().unwrap();
    Database::open_read_only(dir.path()).unwrap();
}

#[test]
fn a_read_only_open_of_a_missing_or_empty_directory_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    assert!(Database::open_read_only(&missing).is_err());
    assert!(!missing.exists());
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    assert!(Database::open_read_only(&empty).is_err());
    assert!(snapshot(&empty).is_empty());
}

#[test]
fn a_damaged_header_copy_is_read_around_not_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let blobs = store(dir.path());
    let stratum = dir.path().join(format!(
        "stratum-{}-{}",
        blobs[0].0.basin(),
        blobs[0].0.stratum()
    ));
    let mut bytes = std::fs::read(&stratum).unwrap();
    bytes[40] ^= 0x5a;
    std::fs::write(&stratum, &bytes).unwrap();
    let before = snapshot(dir.path());

    let db = Database::open_read_only(dir.path()).unwrap();
    assert_eq!(
        db.get(blobs[0].0).unwrap().as_deref(),
        Some(&blobs[0].1[..])
    );
    let report = match db.verify() {
        Err(Error::Verification(report)) => report,
        other => panic!("verify should report the bad copy: {other:?}"),
    };
    assert!(
        report.problems[0].location.contains("header copy 0"),
        "{report}"
    );
    db.shutdown().unwrap();
    assert_eq!(snapshot(dir.path()), before);
}

/// The WAL segment file the first run wrote.
fn first_segment(dir: &Path) -> PathBuf {
    let mut segments: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|entry| {
            let path = entry.unwrap().path();
            let id = path
                .file_name()?
                .to_str()?
                .strip_prefix("wal-")?
                .parse()
                .ok()?;
            Some((id, path))
        })
        .collect();
    segments.sort();
    segments.into_iter().next().unwrap().1
}

#[test]
fn verify_of_a_store_with_a_damaged_wal_entry_names_the_damage_and_every_lost_blob() {
    // A transaction of eight blobs (one written straight into its grains)
    // committed by one run, a second by the next: both crashed before a
    // checkpoint, so both are in the WAL, in two segments.
    let dir = tempfile::tempdir().unwrap();
    let db = config(dir.path()).open().unwrap();
    let lost = commit(&db, 1, &[40, 300, 1000, 17, 70_290, 5, 64, 2000]);
    drop(db);
    let kept = common::second_run_without_a_checkpoint(
        okaywal::Configuration::default_for(dir.path()).preallocate_bytes(64 << 10),
    );
    // A byte of the first blob's data chunk.
    let segment = first_segment(dir.path());
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes[512 + 25 + 9 + 20] ^= 0x01;
    std::fs::write(&segment, &bytes).unwrap();

    // The store does not open for writing, nor read-only by default.
    let err = config(dir.path())
        .open()
        .map(drop)
        .expect_err("the damage is an error");
    assert!(
        err.to_string().contains(&*segment.to_string_lossy()),
        "{err}"
    );
    assert!(Database::open_read_only(dir.path()).is_err());

    // Read-only past the damage, verify names it and the blobs it took.
    let before = snapshot(dir.path());
    let db = config(dir.path())
        .read_only(true)
        .wal(|wal| wal.recovery_mode(okaywal::RecoveryMode::SkipCorrupted))
        .open()
        .unwrap();
    assert_eq!(db.last_committed(), kept);
    let report = match db.verify() {
        Err(Error::Verification(report)) => report,
        other => panic!("verify should report the damage: {other:?}"),
    };
    let segment_name = segment.file_name().unwrap().to_string_lossy().to_string();
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.grain.is_none() && p.location.contains(&segment_name)),
        "{report}"
    );
    let mut named: Vec<GrainId> = report.problems.iter().filter_map(|p| p.grain).collect();
    named.sort();
    let mut expected: Vec<GrainId> = lost.iter().map(|(id, _)| *id).collect();
    expected.sort();
    assert_eq!(named, expected, "{report}");
    db.shutdown().unwrap();
    assert_eq!(snapshot(dir.path()), before);
}
