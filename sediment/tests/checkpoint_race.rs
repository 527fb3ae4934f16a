//! Two transactions that call `checkpoint_to` at the same time. The first
//! to commit takes the archived grains it will free; until its record is
//! durable those grains are archived on disk, so the other transaction's
//! record must not drop the commit records that say so. If the first one
//! then fails, a reopen still knows the grains are archived and a later
//! checkpoint frees them; if it succeeds, nothing is freed twice.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use common::{blob, HeldStratumSync, HookedFs, ReleaseOnDrop};
use okaywal::fs::{CrashFileSystem, PowerLoss};
use sediment::{BasinStats, Config, Database, GrainId, SequenceId, Transaction};

const DIR: &str = "/db";

fn open_hooked(fs: &CrashFileSystem, hooks: &Arc<HeldStratumSync>) -> Database {
    Config::for_directory(DIR)
        .file_system(HookedFs {
            inner: fs.clone(),
            hooks: hooks.clone(),
        })
        .open()
        .unwrap()
}

fn reopen(fs: &CrashFileSystem) -> Database {
    Config::for_directory(DIR)
        .file_system(fs.clone())
        .open()
        .unwrap()
}

fn basin_of(db: &Database, basin: u8) -> BasinStats {
    db.stats()
        .unwrap()
        .basins
        .into_iter()
        .find(|stats| stats.basin == basin)
        .expect("the basin has a stratum")
}

/// Writes a blob and archives it in a second transaction.
fn write_and_archive(db: &Database, tag: u64) -> (GrainId, SequenceId) {
    let mut tx = db.begin_transaction().unwrap();
    let id = tx.write(&blob(tag, 100)).unwrap();
    tx.commit().unwrap();
    let mut tx = db.begin_transaction().unwrap();
    tx.archive(id).unwrap();
    (id, tx.commit().unwrap())
}

/// Commits `first` on another thread, holding its stratum sync (after it
/// has taken its grains to free) while `second` commits; then lets it go.
fn commit_while_held(
    hooks: &HeldStratumSync,
    first: Transaction<'_>,
    second: Transaction<'_>,
) -> sediment::Result<SequenceId> {
    hooks.gate.arm();
    std::thread::scope(|scope| {
        let _release = ReleaseOnDrop(&hooks.gate);
        let held = scope.spawn(move || first.commit());
        hooks.gate.wait_entered();
        second.commit().unwrap();
        hooks.gate.release();
        held.join().unwrap()
    })
}

#[test]
fn grains_taken_by_a_failed_checkpoint_are_freed_after_a_reopen() {
    let fs = CrashFileSystem::new();
    let hooks = Arc::new(HeldStratumSync::default());
    hooks.fail.store(true, Ordering::SeqCst);
    let db = open_hooked(&fs, &hooks);
    let (doomed, archived_at) = write_and_archive(&db, 1);

    // `failing` writes a blob large enough to go straight into its grains,
    // so its commit syncs a stratum after taking `doomed` to free.
    let mut failing = db.begin_transaction().unwrap();
    failing.write(&blob(2, 100_000)).unwrap();
    failing.checkpoint_to(archived_at).unwrap();
    let mut other = db.begin_transaction().unwrap();
    let kept = other.write(&blob(3, 100)).unwrap();
    other.checkpoint_to(archived_at).unwrap();
    assert!(
        commit_while_held(&hooks, failing, other).is_err(),
        "the injected failure"
    );

    // The failed sync poisoned the store; reopen it as after a restart.
    drop(db);
    let db = reopen(&fs);
    assert_eq!(db.get(kept).unwrap(), Some(blob(3, 100)));
    let before = basin_of(&db, doomed.basin());
    assert!(
        before.grains_archived >= u64::from(doomed.count()),
        "after the reopen {doomed} is no longer known to be archived: {before:?}"
    );
    let mut tx = db.begin_transaction().unwrap();
    tx.checkpoint_to(db.last_committed()).unwrap();
    tx.commit().unwrap();
    let after = basin_of(&db, doomed.basin());
    assert_eq!(
        db.get(doomed).unwrap(),
        None,
        "{doomed} still reads back after a checkpoint past its archiving: it was never freed"
    );
    assert_eq!(after.grains_archived, 0, "{after:?}");
    assert_eq!(
        after.grains_used,
        before.grains_used - before.grains_archived,
        "the checkpoint did not free {doomed}'s grains: before {before:?}, after {after:?}"
    );
    db.verify().unwrap();
    db.shutdown().unwrap();
}

/// The second record frees a grain archived after the sequence it records
/// as checkpointed to. A reopen reads that grain's archiving again; it must
/// not free it a second time, by then under a new blob.
#[test]
fn a_grain_freed_past_a_lowered_checkpoint_is_not_freed_again_after_a_reopen() {
    for crash in [true, false] {
        let fs = CrashFileSystem::new();
        let hooks = Arc::new(HeldStratumSync::default());
        let db = open_hooked(&fs, &hooks);
        let (first_archived, first_at) = write_and_archive(&db, 10);
        let (second_archived, second_at) = write_and_archive(&db, 11);

        let mut first = db.begin_transaction().unwrap();
        first.write(&blob(12, 100_000)).unwrap();
        first.checkpoint_to(first_at).unwrap();
        let mut second = db.begin_transaction().unwrap();
        second.write(&blob(13, 100)).unwrap();
        second.checkpoint_to(second_at).unwrap();
        commit_while_held(&hooks, first, second).unwrap();
        assert_eq!(db.get(first_archived).unwrap(), None);
        assert_eq!(db.get(second_archived).unwrap(), None);

        // The freed grains go to new blobs of the same size.
        let mut tx = db.begin_transaction().unwrap();
        let reused = [
            tx.write(&blob(14, 100)).unwrap(),
            tx.write(&blob(15, 100)).unwrap(),
        ];
        tx.commit().unwrap();
        assert!(
            reused.contains(&first_archived) && reused.contains(&second_archived),
            "{reused:?} did not reuse the freed blobs' grains ({first_archived}, {second_archived})"
        );
        if crash {
            // The reopen replays the records from the WAL.
            fs.power_loss(PowerLoss::Clean);
            drop(db);
        } else {
            // The records go into the commit log, which the reopen reads.
            db.shutdown().unwrap();
        }

        let db = reopen(&fs);
        let mut tx = db.begin_transaction().unwrap();
        tx.checkpoint_to(db.last_committed()).unwrap();
        tx.commit().unwrap();
        for (id, tag) in reused.into_iter().zip([14, 15]) {
            assert_eq!(
                db.get(id).unwrap(),
                Some(blob(tag, 100)),
                "{id}, a blob in freed grains (after a crash: {crash})"
            );
        }
        let basin = basin_of(&db, reused[0].basin());
        assert_eq!(basin.grains_archived, 0, "{basin:?}");
        db.verify().unwrap();
        db.shutdown().unwrap();
    }
}
