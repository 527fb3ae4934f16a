//! The blob cache holds what committed transactions wrote and what reads
//! read, and never serves a freed blob or an old blob in place of the one
//! that reused its grains, even while readers race with frees.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{blob, free};
use sediment::{Config, Database};

#[test]
fn a_cached_blob_is_forgotten_when_freed_and_its_successor_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::recover(dir.path()).unwrap();
    let mut tx = db.begin_transaction().unwrap();
    let a = tx.write(&blob(1, 1000)).unwrap();
    tx.commit().unwrap();
    assert_eq!(db.get(a).unwrap(), Some(blob(1, 1000)));
    assert_eq!(
        db.get(a).unwrap(),
        Some(blob(1, 1000)),
        "second read (cached)"
    );
    assert!(
        db.stats().unwrap().cache_bytes >= 1000,
        "the blob was not cached"
    );
    free(&db, a);
    assert_eq!(db.get(a).unwrap(), None, "a freed blob came from the cache");
    let mut tx = db.begin_transaction().unwrap();
    let b = tx.write(&blob(2, 1000)).unwrap();
    tx.commit().unwrap();
    assert_eq!(b, a, "same size: the freed grains are reused");
    assert_eq!(db.get(b).unwrap(), Some(blob(2, 1000)));
    db.shutdown().unwrap();
}

#[test]
fn committed_small_blobs_are_cached_before_their_first_read() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::recover(dir.path()).unwrap();
    let mut tx = db.begin_transaction().unwrap();
    let kept = tx.write(&blob(1, 1000)).unwrap();
    tx.commit().unwrap();
    let cached = db.stats().unwrap().cache_bytes;
    assert!(cached >= 1000, "a committed blob was not cached: {cached}");

    let mut tx = db.begin_transaction().unwrap();
    let dropped = tx.write(&blob(2, 1000)).unwrap();
    tx.rollback();
    assert_eq!(
        db.stats().unwrap().cache_bytes,
        cached,
        "a rolled-back blob was cached"
    );
    assert_eq!(db.get(dropped).unwrap(), None);

    let mut tx = db.begin_transaction().unwrap();
    let large = tx.write(&blob(3, 1 << 20)).unwrap();
    tx.commit().unwrap();
    assert_eq!(
        db.stats().unwrap().cache_bytes,
        cached,
        "a blob too large for the cache was cached"
    );
    assert_eq!(db.get(kept).unwrap(), Some(blob(1, 1000)));
    assert_eq!(db.get(large).unwrap(), Some(blob(3, 1 << 20)));
    db.shutdown().unwrap();

    // After a reopen the cache starts empty and reads fill it again.
    let db = Database::recover(dir.path()).unwrap();
    assert_eq!(db.stats().unwrap().cache_bytes, 0);
    assert_eq!(db.get(kept).unwrap(), Some(blob(1, 1000)));
    db.shutdown().unwrap();
}

#[test]
fn a_disabled_cache_holds_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = Config::for_directory(dir.path())
        .cache_bytes(0)
        .open()
        .unwrap();
    let mut tx = db.begin_transaction().unwrap();
    let a = tx.write(&blob(1, 1000)).unwrap();
    tx.commit().unwrap();
    assert_eq!(db.get(a).unwrap(), Some(blob(1, 1000)));
    assert_eq!(db.stats().unwrap().cache_bytes, 0);
    db.shutdown().unwrap();
}

/// Readers hammer a few grains while the writer frees and rewrites them
/// with new contents of the same size (so the same grain ids come back).
/// Right after each rewrite commits, `get` must return the new bytes, and
/// readers must only ever see some generation that was really written.
#[test]
fn readers_racing_frees_never_see_a_stale_blob() {
    race_readers_with_frees(sediment::DEFAULT_CACHE_BYTES);
}

/// The same without the cache: the plain read path must tell a blob whose
/// bytes are still in the WAL from one in its stratum even while the grain
/// is freed and reused under it.
#[test]
fn uncached_readers_racing_frees_never_see_a_stale_blob() {
    race_readers_with_frees(0);
}

fn race_readers_with_frees(cache_bytes: u64) {
    let dir = tempfile::tempdir().unwrap();
    let db = Config::for_directory(dir.path())
        .cache_bytes(cache_bytes)
        .open()
        .unwrap();
    const SLOTS: u64 = 4;
    const LEN: usize = 900;
    let mut ids = Vec::new();
    let mut tx = db.begin_transaction().unwrap();
    for slot in 0..SLOTS {
        ids.push(tx.write(&blob(slot << 32, LEN)).unwrap());
    }
    tx.commit().unwrap();
    let ids_start = ids.clone();
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        for _ in 0..3 {
            let (db, stop, ids) = (&db, &stop, &ids_start);
            scope.spawn(move || {
                let mut reads = 0_u64;
                while !stop.load(Ordering::Relaxed) {
                    for (slot, id) in ids.iter().enumerate() {
                        if let Some(data) = db.get(*id).unwrap() {
                            // `blob` starts with its tag: slot << 32 | generation.
                            let tag = u64::from_le_bytes(data[..8].try_into().unwrap());
                            assert_eq!(tag >> 32, slot as u64, "another slot's blob at {id}");
                            assert!(data == blob(tag, LEN), "torn or mixed blob at {id}");
                            reads += 1;
                        }
                    }
                }
                assert!(reads > 0);
            });
        }
        // Stops the readers even if an assertion below fails.
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _stop_readers = StopOnDrop(&stop);
        let started = Instant::now();
        let mut generation = 1_u64;
        while started.elapsed() < Duration::from_secs(2) {
            for (slot, slot_id) in ids.iter().enumerate() {
                free(&db, *slot_id);
                let tag = ((slot as u64) << 32) | generation;
                let mut attempts = 0;
                let id = loop {
                    let mut tx = db.begin_transaction().unwrap();
                    let id = tx.write(&blob(tag, LEN)).unwrap();
                    tx.commit().unwrap();
                    if id == *slot_id {
                        break id;
                    }
                    // A WAL checkpoint that may be copying the freed blob
                    // holds its grains until it ends.
                    attempts += 1;
                    assert!(attempts < 10, "the grains of {slot_id} are never reused");
                    free(&db, id);
                    db.checkpoint_wal().unwrap();
                };
                let got = db.get(id).unwrap();
                assert!(
                    got.as_deref() == Some(&blob(tag, LEN)[..]),
                    "generation {generation} of slot {slot}: get returned stale bytes"
                );
            }
            generation += 1;
        }
        stop.store(true, Ordering::Relaxed);
        assert!(generation > 10, "only {generation} generations");
    });
    db.shutdown().unwrap();
}
