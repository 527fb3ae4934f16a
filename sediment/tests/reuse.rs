//! Freed grains are reusable as soon as the `checkpoint_to` that frees them
//! commits (not only after the WAL has moved it into the strata), without
//! ever letting an older transaction's record, or a freed blob's bytes still
//! in the WAL, overwrite the blob that reused them. (The one wait: a blob
//! freed while the WAL checkpoint is copying it keeps its grains until that
//! checkpoint ends.)

mod common;

use common::{assert_blob, blob, free, FileHooks, Gate, HookedFs, ReleaseOnDrop};
use sediment::{Config, Database, GrainId, SequenceId};

fn open(dir: &std::path::Path) -> Database {
    // Blobs of 1000 bytes or more bypass the WAL; 999-byte blobs travel
    // through it. Both take 16 grains of 64 bytes.
    Config::for_directory(dir)
        .direct_write_bytes(1000)
        .open()
        .expect("open the database")
}

fn write(db: &Database, data: &[u8]) -> (GrainId, SequenceId) {
    let mut tx = db.begin_transaction().unwrap();
    let id = tx.write(data).unwrap();
    (id, tx.commit().unwrap())
}

#[test]
fn freed_grains_are_reused_before_any_wal_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    let (a, _) = write(&db, &blob(1, 999));
    free(&db, a);
    assert_eq!(db.get(a).unwrap(), None);
    let before = db.stats().unwrap().wal_checkpointed_entry;
    let (b, _) = write(&db, &blob(2, 999));
    assert_eq!(b, a, "the freed grains should be handed out again");
    assert_eq!(
        db.stats().unwrap().wal_checkpointed_entry,
        before,
        "no WAL checkpoint was needed for the reuse"
    );
    assert_blob(&db, b, &blob(2, 999), "reused through the WAL");
    db.checkpoint_wal().unwrap();
    assert_blob(&db, b, &blob(2, 999), "after the WAL checkpoint");
    db.shutdown().unwrap();
    let db = open(dir.path());
    assert_blob(&db, b, &blob(2, 999), "after reopening");
    db.shutdown().unwrap();
}

/// A's bytes are still only in the WAL when A is freed and its grains get
/// a blob written straight into the stratum; the WAL checkpoint that later
/// copies A's entry must leave that blob alone, before and after a crash.
#[test]
fn a_freed_blob_still_in_the_wal_never_overwrites_its_successor() {
    for crash in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let db = open(dir.path());
        let (a, _) = write(&db, &blob(10, 999));
        free(&db, a);
        let (b, _) = write(&db, &blob(11, 1000));
        assert_eq!(b, a, "the direct write should reuse A's grains");
        if crash {
            // Drop without shutdown: the reopen replays A, the free and B.
            drop(db);
            let db = open(dir.path());
            assert_blob(&db, b, &blob(11, 1000), "after the crash");
            db.checkpoint_wal().unwrap();
            assert_blob(&db, b, &blob(11, 1000), "after the replayed checkpoint");
            db.shutdown().unwrap();
        } else {
            db.checkpoint_wal().unwrap();
            assert_blob(&db, b, &blob(11, 1000), "after the WAL checkpoint");
            db.shutdown().unwrap();
        }
        let db = open(dir.path());
        assert_blob(&db, b, &blob(11, 1000), "after reopening");
        assert!(db.verify().is_ok(), "verify after reopening");
        db.shutdown().unwrap();
    }
}

/// A transaction that started before the free has a lower sequence; its
/// record comes first in the WAL, so it must not get the freed grains
/// (the free, checkpointed after it, would mark them free on disk).
#[test]
fn transactions_older_than_the_free_do_not_get_its_grains() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    let (a, _) = write(&db, &blob(20, 999));
    let mut tx = db.begin_transaction().unwrap();
    tx.archive(a).unwrap();
    let archived = tx.commit().unwrap();
    let mut older = db.begin_transaction().unwrap();
    let x = older.write(&blob(21, 100)).unwrap();
    let mut tx = db.begin_transaction().unwrap();
    tx.checkpoint_to(archived).unwrap();
    tx.commit().unwrap();
    assert_eq!(db.get(a).unwrap(), None);
    let y = older.write(&blob(22, 999)).unwrap();
    assert_ne!(y, a, "an older transaction got grains freed after it began");
    older.commit().unwrap();
    // Once it finished, the grains are reusable.
    let (z, _) = write(&db, &blob(23, 999));
    assert_eq!(z, a);
    db.checkpoint_wal().unwrap();
    db.shutdown().unwrap();
    let db = open(dir.path());
    assert_blob(&db, x, &blob(21, 100), "x after reopening");
    assert_blob(&db, y, &blob(22, 999), "y after reopening");
    assert_blob(&db, z, &blob(23, 999), "z after reopening");
    assert!(db.verify().is_ok());
    db.shutdown().unwrap();
}

/// Holds the WAL checkpoint's first write to a stratum until released.
#[derive(Debug, Default)]
struct CheckpointWrite {
    gate: Gate,
}

impl FileHooks for CheckpointWrite {
    fn before_write(&self, name: &str) {
        let checkpoint = std::thread::current()
            .name()
            .is_some_and(|thread| thread.starts_with("okaywal-checkpoint"));
        if checkpoint && name.starts_with("stratum-") {
            self.gate.pass();
        }
    }
}

/// The WAL checkpoint copies blobs into the strata without holding a lock
/// against frees. A blob freed while that copy is under way must keep its
/// grains until the checkpoint ends: a direct write handed those grains
/// would be overwritten by the stale copy.
#[test]
fn a_blob_freed_during_its_checkpoint_keeps_its_grains_until_the_copy_is_done() {
    let dir = tempfile::tempdir().unwrap();
    let hooks = std::sync::Arc::new(CheckpointWrite::default());
    let gate = &hooks.gate;
    let open_gated = |hooks: &std::sync::Arc<CheckpointWrite>| {
        Config::for_directory(dir.path())
            .file_system(HookedFs {
                inner: okaywal::fs::StdFileSystem,
                hooks: hooks.clone(),
            })
            .direct_write_bytes(1000)
            .open()
            .expect("open the database")
    };
    let db = open_gated(&hooks);
    let (a, _) = write(&db, &blob(30, 999));
    gate.arm();
    std::thread::scope(|scope| {
        // Lets the checkpoint finish even if an assertion below fails.
        let _release = ReleaseOnDrop(gate);
        let checkpoint = scope.spawn(|| db.checkpoint_wal());
        // The checkpoint has checked A (not freed) and is about to copy it.
        gate.wait_entered();
        free(&db, a);
        assert_eq!(db.get(a).unwrap(), None);
        let (b, _) = write(&db, &blob(31, 1000));
        assert_ne!(b, a, "A's grains were reused while its copy was pending");
        gate.release();
        checkpoint.join().unwrap().unwrap();
        assert_blob(&db, b, &blob(31, 1000), "b after the checkpoint");
        // Once the checkpoint is over, A's grains are free again.
        let (c, _) = write(&db, &blob(32, 1000));
        assert_eq!(c, a, "A's grains were not released after the checkpoint");
        assert_blob(&db, c, &blob(32, 1000), "c");
    });
    db.shutdown().unwrap();
    let db = open(dir.path());
    assert!(db.verify().is_ok(), "verify after reopening");
    db.shutdown().unwrap();
}
