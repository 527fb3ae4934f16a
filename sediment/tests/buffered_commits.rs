//! `Transaction::commit_buffered`, `Database::sync` and the
//! `Config::max_unsynced*` bounds: what a buffered commit shows at once,
//! what a power cut may take away (simulated on okaywal's
//! `CrashFileSystem`), what a sync or a durable commit makes durable, and
//! when the grains a buffered commit frees are reused.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{blob, power_cut, Rng};
use okaywal::fs::CrashFileSystem;
use sediment::{Config, Database, GrainId, SequenceId};

const DIR: &str = "/buffered-db";

fn config(fs: &CrashFileSystem) -> Config {
    Config::for_directory(DIR).file_system(fs.clone())
}

fn open(fs: &CrashFileSystem) -> Database {
    config(fs).open().expect("open the database")
}

fn write_one(db: &Database, data: &[u8], buffered: bool) -> (GrainId, SequenceId) {
    let mut tx = db.begin_transaction().unwrap();
    let id = tx.write(data).unwrap();
    let sequence = if buffered {
        tx.commit_buffered().unwrap()
    } else {
        tx.commit().unwrap()
    };
    (id, sequence)
}

fn archive(db: &Database, id: GrainId, buffered: bool) -> SequenceId {
    let mut tx = db.begin_transaction().unwrap();
    tx.archive(id).unwrap();
    if buffered {
        tx.commit_buffered().unwrap()
    } else {
        tx.commit().unwrap()
    }
}

fn checkpoint(db: &Database, to: SequenceId, buffered: bool) -> SequenceId {
    let mut tx = db.begin_transaction().unwrap();
    tx.checkpoint_to(to).unwrap();
    if buffered {
        tx.commit_buffered().unwrap()
    } else {
        tx.commit().unwrap()
    }
}

fn archived_flag(db: &Database, id: GrainId) -> Option<bool> {
    db.grains()
        .unwrap()
        .map(Result::unwrap)
        .find(|info| info.id == id)
        .map(|info| info.archived)
}

#[test]
fn a_buffered_commit_is_visible_at_once_and_listed_in_the_commit_log() {
    let db = Database::in_memory();
    let (durable, first) = write_one(&db, b"durable", false);
    let mut tx = db.begin_transaction().unwrap();
    let small = tx.write(b"buffered").unwrap();
    let large = tx.write(&blob(7, 100_000)).unwrap();
    tx.set_embedded_header(Some(small)).unwrap();
    let buffered = tx.commit_buffered().unwrap();
    assert!(buffered > first);
    assert_eq!(db.get(small).unwrap().as_deref(), Some(&b"buffered"[..]));
    assert_eq!(db.get(large).unwrap(), Some(blob(7, 100_000)));
    assert_eq!(db.get(durable).unwrap().as_deref(), Some(&b"durable"[..]));
    assert_eq!(db.embedded_header(), Some(small));
    assert_eq!(db.last_committed(), buffered);
    let log: Vec<SequenceId> = db
        .commit_log(SequenceId(0))
        .unwrap()
        .map(|r| r.sequence)
        .collect();
    assert_eq!(log, vec![first, buffered]);
    // A buffered sequence is committed: checkpoint_to accepts it.
    let archived = archive(&db, small, true);
    checkpoint(&db, archived, true);
    assert_eq!(db.get(small).unwrap(), None);
    let stats = db.wal_stats().unwrap();
    assert_eq!((stats.durable_commits, stats.buffered_commits), (1, 3));
    db.verify().unwrap();
    assert!(db.sync().unwrap() >= db.last_committed());
    db.shutdown().unwrap();
}

#[test]
fn a_power_cut_takes_buffered_commits_after_the_last_sync_and_keeps_the_rest() {
    let fs = CrashFileSystem::new();
    let db = open(&fs);
    let mut kept = Vec::new();
    let mut lost = Vec::new();
    for i in 0..6_u64 {
        // Every third blob is large enough to bypass the WAL.
        let len = if i % 3 == 2 { 80_000 } else { 500 };
        kept.push((write_one(&db, &blob(i, len), true).0, blob(i, len)));
    }
    let synced = db.sync().unwrap();
    assert!(synced >= db.last_committed());
    for i in 10..16_u64 {
        let len = if i % 3 == 2 { 80_000 } else { 500 };
        lost.push(write_one(&db, &blob(i, len), true).0);
    }
    power_cut(&fs, db);

    let db = open(&fs);
    for (id, data) in &kept {
        assert_eq!(db.get(*id).unwrap().as_ref(), Some(data), "{id}");
    }
    for id in &lost {
        assert_eq!(db.get(*id).unwrap(), None, "{id} was never synced");
    }
    assert_eq!(db.last_committed(), synced);
    db.verify().unwrap();
}

#[test]
fn a_durable_commit_makes_every_buffered_commit_before_it_durable() {
    let fs = CrashFileSystem::new();
    let db = open(&fs);
    let mut kept = Vec::new();
    for i in 0..5_u64 {
        let len = if i == 3 { 70_000 } else { 300 };
        kept.push((write_one(&db, &blob(i, len), true).0, blob(i, len)));
    }
    kept.push((write_one(&db, b"durable", false).0, b"durable".to_vec()));
    let (after, _) = write_one(&db, b"buffered after", true);
    power_cut(&fs, db);

    let db = open(&fs);
    for (id, data) in &kept {
        assert_eq!(db.get(*id).unwrap().as_ref(), Some(data), "{id}");
    }
    assert_eq!(db.get(after).unwrap(), None);
    db.verify().unwrap();
}

#[test]
fn sync_returns_a_sequence_at_or_above_every_commit_returned_before_it() {
    let fs = CrashFileSystem::new();
    let db = open(&fs);
    let highest_returned = AtomicU64::new(0);
    let acknowledged = parking_lot::Mutex::new(BTreeMap::new());
    std::thread::scope(|scope| {
        for thread in 0..4_u64 {
            let (db, highest_returned, acknowledged) = (&db, &highest_returned, &acknowledged);
            scope.spawn(move || {
                let mut rng = Rng::new(thread + 1);
                for i in 0..40_u64 {
                    if rng.percent(20) {
                        let before = highest_returned.load(Ordering::SeqCst);
                        let synced = db.sync().unwrap();
                        assert!(
                            synced.0 >= before,
                            "sync returned {synced}, below the {before} a commit returned before"
                        );
                        continue;
                    }
                    let key = thread << 32 | i;
                    let len = if rng.percent(10) { 66_000 } else { 200 };
                    let (id, sequence) = write_one(db, &blob(key, len), rng.percent(70));
                    highest_returned.fetch_max(sequence.0, Ordering::SeqCst);
                    acknowledged.lock().insert(id, (key, len));
                }
            });
        }
    });
    let synced = db.sync().unwrap();
    assert!(synced.0 >= highest_returned.load(Ordering::SeqCst));
    assert_eq!(synced, db.last_committed());
    // Everything acknowledged before that last sync survives a power cut.
    power_cut(&fs, db);
    let db = open(&fs);
    for (id, (key, len)) in acknowledged.into_inner() {
        assert_eq!(db.get(id).unwrap(), Some(blob(key, len)), "{id}");
    }
    assert_eq!(db.last_committed(), synced);
    db.verify().unwrap();
}

#[test]
fn max_unsynced_makes_buffered_commits_durable_without_a_sync() {
    let fs = CrashFileSystem::new();
    let db = config(&fs)
        .max_unsynced(Duration::from_millis(5))
        .open()
        .unwrap();
    assert_eq!(
        db.wal_stats()
            .map(|s| s.durable_commits + s.buffered_commits),
        Some(0)
    );
    let mut written = Vec::new();
    for i in 0..10_u64 {
        let len = if i == 4 { 90_000 } else { 700 };
        written.push((write_one(&db, &blob(i, len), true).0, blob(i, len)));
    }
    // Wait (bounded) until the WAL's background syncs have covered every
    // commit record; the power cut below is what shows they are durable.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stats = db.wal_stats().unwrap();
        if stats.synced_commits >= 10 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the WAL never synced the buffered commits: {stats:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    power_cut(&fs, db);
    let db = open(&fs);
    for (id, data) in &written {
        assert_eq!(db.get(*id).unwrap().as_ref(), Some(data), "{id}");
    }
    db.verify().unwrap();
}

#[test]
fn max_unsynced_bytes_makes_the_buffered_commit_that_reaches_it_durable() {
    let fs = CrashFileSystem::new();
    // Each commit below brings more than 2,000 unsynced bytes: every
    // second one reaches the bound and syncs before it returns.
    let db = config(&fs).max_unsynced_bytes(4_000).open().unwrap();
    let mut written = Vec::new();
    for i in 0..6_u64 {
        written.push((write_one(&db, &blob(i, 2_500), true).0, blob(i, 2_500)));
    }
    let stats = db.wal_stats().unwrap();
    assert_eq!(stats.buffered_commits, 6);
    assert!(stats.synced_commits >= 6, "{stats:?}");
    let (last, _) = write_one(&db, &blob(99, 100), true);
    power_cut(&fs, db);
    let db = open(&fs);
    for (id, data) in &written {
        assert_eq!(db.get(*id).unwrap().as_ref(), Some(data), "{id}");
    }
    assert_eq!(db.get(last).unwrap(), None, "below the bound, not synced");
    db.verify().unwrap();
}

#[test]
fn grains_freed_by_a_buffered_commit_are_reused_only_once_it_is_durable() {
    // Each way of making the free durable: a durable commit, a sync, a
    // WAL checkpoint.
    for way in ["durable commit", "sync", "WAL checkpoint"] {
        let db = Database::in_memory();
        let (first, _) = write_one(&db, &blob(1, 100), false);
        let archived = archive(&db, first, false);
        checkpoint(&db, archived, true);
        assert_eq!(db.get(first).unwrap(), None, "{way}: freed at once");
        // Not durable yet: a new blob of the same size goes elsewhere.
        let (second, _) = write_one(&db, &blob(2, 100), true);
        assert_ne!(second, first, "{way}: reused before the free was durable");
        match way {
            "durable commit" => {
                let (third, _) = write_one(&db, &blob(3, 100), false);
                assert_ne!(third, first, "{way}: reserved before its commit");
            }
            "sync" => {
                db.sync().unwrap();
            }
            _ => db.checkpoint_wal().unwrap(),
        }
        let (reused, _) = write_one(&db, &blob(4, 100), true);
        assert_eq!(reused, first, "{way}: the durable free is reused");
        assert_eq!(db.get(reused).unwrap(), Some(blob(4, 100)));
        db.verify().unwrap();
    }
}

#[test]
fn a_free_lost_to_a_power_cut_leaves_the_archived_blob_intact() {
    for large in [false, true] {
        let len = if large { 100_000 } else { 3_000 };
        let fs = CrashFileSystem::new();
        let db = open(&fs);
        let (old, _) = write_one(&db, &blob(1, len), false);
        let archived = archive(&db, old, false);
        checkpoint(&db, archived, true);
        // Same size: it would take the freed grains if they were reusable.
        let (new, _) = write_one(&db, &blob(2, len), true);
        assert_ne!(new, old);
        power_cut(&fs, db);

        let db = open(&fs);
        assert_eq!(db.get(old).unwrap(), Some(blob(1, len)), "large {large}");
        assert_eq!(archived_flag(&db, old), Some(true), "large {large}");
        assert_eq!(db.get(new).unwrap(), None, "large {large}");
        db.verify().unwrap();
        // A later checkpoint frees it as usual.
        checkpoint(&db, archived, false);
        assert_eq!(db.get(old).unwrap(), None);
        db.verify().unwrap();
    }
}

#[test]
fn buffered_archives_and_checkpoints_survive_or_vanish_together_with_what_came_before() {
    let fs = CrashFileSystem::new();
    let db = open(&fs);
    let (first, _) = write_one(&db, &blob(1, 80_000), false);
    let (second, _) = write_one(&db, &blob(2, 80_000), false);
    // Archived and freed with buffered commits, then lost to a power cut:
    // the blob is live and not archived again.
    let archived = archive(&db, first, true);
    checkpoint(&db, archived, true);
    assert_eq!(db.get(first).unwrap(), None);
    power_cut(&fs, db);
    let db = open(&fs);
    assert_eq!(db.get(first).unwrap(), Some(blob(1, 80_000)));
    assert_eq!(archived_flag(&db, first), Some(false));
    db.verify().unwrap();

    // The same, then a sync: the archive and the free both survive.
    let archived = archive(&db, second, true);
    checkpoint(&db, archived, true);
    db.sync().unwrap();
    power_cut(&fs, db);
    let db = open(&fs);
    assert_eq!(db.get(second).unwrap(), None);
    assert_eq!(db.get(first).unwrap(), Some(blob(1, 80_000)));
    db.verify().unwrap();

    // A buffered archive freed by a durable checkpoint: the checkpoint
    // makes the archive durable too.
    let archived = archive(&db, first, true);
    checkpoint(&db, archived, false);
    power_cut(&fs, db);
    let db = open(&fs);
    assert_eq!(db.get(first).unwrap(), None);
    db.verify().unwrap();
}

#[test]
fn sync_on_a_read_only_store_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    Database::recover(dir.path()).unwrap().shutdown().unwrap();
    let db = Database::open_read_only(dir.path()).unwrap();
    assert!(matches!(db.sync(), Err(sediment::Error::ReadOnly)));
}
