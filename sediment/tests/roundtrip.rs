//! Blobs of every interesting size come back byte for byte: straight after
//! the commit (from the WAL or, for large blobs, the stratum), after the WAL
//! is checkpointed into the strata, and after the database is reopened
//! (after a clean shutdown, with or without a checkpoint first, and after
//! being dropped without a shutdown). Rolled-back work is invisible and its
//! space is reused; oversized blobs are refused.

mod common;

use std::io::Read;
use std::path::Path;

use common::{assert_blob, blob};
use sediment::format::{grain_size, placement, GRAIN_HEADER_SIZE, MAX_FORMAT_BLOB_BYTES};
use sediment::{Config, Database, Error, GrainId, SequenceId, DEFAULT_DIRECT_WRITE_BYTES};

/// 0, 1, and around every boundary where the grain count or the basin
/// changes for basins 0..=12, plus around the direct-write threshold and
/// 1 MiB.
fn interesting_sizes() -> Vec<usize> {
    let header = GRAIN_HEADER_SIZE as u64;
    let mut sizes = vec![0_u64, 1, 2, 7, 8, 9];
    for basin in 0..=12_u8 {
        let grain = grain_size(basin);
        // The largest blob a 1-grain, a 17-grain and a 32-grain extent
        // hold, and one byte either side.
        for grains in [1_u64, 17, 32] {
            let fits = grains * grain - header;
            sizes.extend([fits.saturating_sub(1), fits, fits + 1]);
        }
    }
    let direct = DEFAULT_DIRECT_WRITE_BYTES;
    sizes.extend([direct - 1, direct, direct + 1, (1 << 20) - 1, 1 << 20]);
    sizes.sort_unstable();
    sizes.dedup();
    sizes.into_iter().map(|s| s as usize).collect()
}

/// Checks the id's shape, `get` and streaming `read` for every blob.
fn check_all(db: &Database, blobs: &[(GrainId, Vec<u8>)], phase: &str) {
    for (id, data) in blobs {
        let context = format!("{phase}, {} bytes", data.len());
        assert_eq!(
            placement(data.len() as u64),
            Some((id.basin(), id.count())),
            "{context}: {id} is not the documented placement"
        );
        assert_blob(db, *id, data, &context);
        let mut reader = db
            .read(*id)
            .unwrap_or_else(|e| panic!("{context}: read({id}): {e}"))
            .unwrap_or_else(|| panic!("{context}: read({id}) returned None"));
        assert_eq!(reader.id(), *id);
        assert_eq!(reader.len(), data.len() as u64, "{context}");
        assert_eq!(reader.is_empty(), data.is_empty(), "{context}");
        // Stream in awkward pieces.
        let mut streamed = Vec::new();
        let mut buf = [0_u8; 4099];
        loop {
            let n = reader
                .read(&mut buf)
                .unwrap_or_else(|e| panic!("{context}: streaming {id}: {e}"));
            if n == 0 {
                break;
            }
            streamed.extend_from_slice(&buf[..n]);
        }
        assert!(streamed == *data, "{context}: streamed {id} differs");
    }
}

/// Writes every interesting size: the small ones in one transaction, the
/// others one per transaction. Returns the blobs and the last sequence.
fn write_sizes(db: &Database, tag_base: u64) -> Vec<(GrainId, Vec<u8>)> {
    let mut blobs = Vec::new();
    let mut tx = db.begin_transaction().unwrap();
    let mut last = 0;
    for (i, size) in interesting_sizes().into_iter().enumerate() {
        let data = blob(tag_base + i as u64, size);
        if size < 4096 {
            let id = tx.write(&data).unwrap();
            blobs.push((id, data));
        } else {
            let mut own = db.begin_transaction().unwrap();
            let id = own.write(&data).unwrap();
            let sequence = own.commit().unwrap();
            assert!(sequence.0 > last, "sequences must increase");
            last = sequence.0;
            blobs.push((id, data));
        }
    }
    let sequence = tx.commit().unwrap();
    assert!(sequence.0 > 0);
    // Every blob has its own grains.
    let mut ids: Vec<GrainId> = blobs.iter().map(|(id, _)| *id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), blobs.len(), "two blobs were given the same id");
    blobs
}

#[derive(Debug, Clone, Copy)]
enum Ending {
    CheckpointThenShutdown,
    ShutdownOnly,
    DropWithoutShutdown,
    CheckpointThenDrop,
}

fn roundtrip(ending: Ending) {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::recover(dir.path()).unwrap();
    let blobs = write_sizes(&db, 1000);
    check_all(
        &db,
        &blobs,
        &format!("{ending:?}: before any WAL checkpoint"),
    );
    let in_wal = db.stats().unwrap().blobs_in_wal;
    let small = blobs
        .iter()
        .filter(|(_, d)| (d.len() as u64) < DEFAULT_DIRECT_WRITE_BYTES)
        .count() as u64;
    assert_eq!(
        in_wal, small,
        "every small blob travels through the WAL, every large one bypasses it"
    );

    match ending {
        Ending::CheckpointThenShutdown | Ending::CheckpointThenDrop => {
            db.checkpoint_wal().unwrap();
            assert_eq!(db.stats().unwrap().blobs_in_wal, 0);
            check_all(&db, &blobs, &format!("{ending:?}: after checkpoint_active"));
        }
        Ending::ShutdownOnly | Ending::DropWithoutShutdown => {}
    }
    match ending {
        Ending::CheckpointThenShutdown | Ending::ShutdownOnly => db.shutdown().unwrap(),
        Ending::DropWithoutShutdown | Ending::CheckpointThenDrop => drop(db),
    }

    let db = Database::recover(dir.path()).unwrap();
    check_all(&db, &blobs, &format!("{ending:?}: after reopening"));
    // Writes after a reopen work and do not disturb the old blobs.
    let mut more = Vec::new();
    let mut tx = db.begin_transaction().unwrap();
    for (i, size) in [0_usize, 100, 497, 4000, 65_536, 300_000]
        .into_iter()
        .enumerate()
    {
        let data = blob(5000 + i as u64, size);
        more.push((tx.write(&data).unwrap(), data));
    }
    tx.commit().unwrap();
    check_all(
        &db,
        &more,
        &format!("{ending:?}: new blobs after reopening"),
    );
    drop(db);
    let db = Database::recover(dir.path()).unwrap();
    check_all(&db, &blobs, &format!("{ending:?}: after the second reopen"));
    check_all(
        &db,
        &more,
        &format!("{ending:?}: new blobs after the second reopen"),
    );
    db.verify().unwrap();
    db.shutdown().unwrap();
}

#[test]
fn sizes_round_trip_checkpoint_then_shutdown() {
    roundtrip(Ending::CheckpointThenShutdown);
}

#[test]
fn sizes_round_trip_shutdown_without_checkpoint() {
    roundtrip(Ending::ShutdownOnly);
}

#[test]
fn sizes_round_trip_drop_without_shutdown() {
    roundtrip(Ending::DropWithoutShutdown);
}

#[test]
fn sizes_round_trip_checkpoint_then_drop() {
    roundtrip(Ending::CheckpointThenDrop);
}

#[test]
fn sixty_four_mib_blob_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::recover(dir.path()).unwrap();
    let data = blob(64, 64 << 20);
    let mut tx = db.begin_transaction().unwrap();
    let id = tx.write(&data).unwrap();
    let neighbour = tx.write(b"a small neighbour").unwrap();
    tx.commit().unwrap();
    assert_eq!(placement(data.len() as u64), Some((id.basin(), id.count())));
    let blobs = vec![(id, data), (neighbour, b"a small neighbour".to_vec())];
    check_all(&db, &blobs, "64 MiB: before checkpoint");
    db.checkpoint_wal().unwrap();
    check_all(&db, &blobs, "64 MiB: after checkpoint");
    drop(db);
    let db = Database::recover(dir.path()).unwrap();
    check_all(&db, &blobs, "64 MiB: after drop and reopen");
    db.shutdown().unwrap();
    let db = Database::recover(dir.path()).unwrap();
    check_all(&db, &blobs, "64 MiB: after shutdown and reopen");
    db.shutdown().unwrap();
}

#[test]
fn in_memory_database_round_trips() {
    let db = Database::in_memory();
    let blobs = write_sizes(&db, 9000);
    check_all(&db, &blobs, "in memory");
    db.checkpoint_wal().unwrap();
    check_all(&db, &blobs, "in memory after checkpoint");
    db.verify().unwrap();
}

fn header_after_reopen(dir: &Path, shutdown: bool, db: Database) -> Database {
    if shutdown {
        db.shutdown().unwrap();
    } else {
        drop(db);
    }
    Database::recover(dir).unwrap()
}

#[test]
fn embedded_header_round_trips_across_reopen() {
    for shutdown in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::recover(dir.path()).unwrap();
        assert_eq!(db.embedded_header(), None);

        // Set to a blob written by the same transaction.
        let mut tx = db.begin_transaction().unwrap();
        let root = tx.write(b"root v1").unwrap();
        tx.set_embedded_header(Some(root)).unwrap();
        // Not visible before the commit.
        assert_eq!(db.embedded_header(), None);
        tx.commit().unwrap();
        assert_eq!(db.embedded_header(), Some(root));
        let db = header_after_reopen(dir.path(), shutdown, db);
        assert_eq!(db.embedded_header(), Some(root), "shutdown={shutdown}");
        assert_blob(&db, root, b"root v1", "root after reopen");

        // A transaction that does not touch the header leaves it alone.
        let mut tx = db.begin_transaction().unwrap();
        let other = tx.write(b"another blob").unwrap();
        tx.commit().unwrap();
        assert_eq!(db.embedded_header(), Some(root));

        // Set to an earlier committed blob, through a WAL checkpoint.
        let mut tx = db.begin_transaction().unwrap();
        tx.set_embedded_header(Some(other)).unwrap();
        tx.commit().unwrap();
        db.checkpoint_wal().unwrap();
        assert_eq!(db.embedded_header(), Some(other));
        let db = header_after_reopen(dir.path(), shutdown, db);
        assert_eq!(db.embedded_header(), Some(other), "shutdown={shutdown}");

        // A rolled-back change is invisible, before and after reopening.
        let mut tx = db.begin_transaction().unwrap();
        tx.set_embedded_header(Some(root)).unwrap();
        tx.rollback();
        let mut tx = db.begin_transaction().unwrap();
        let orphan = tx.write(b"orphan root").unwrap();
        tx.set_embedded_header(Some(orphan)).unwrap();
        drop(tx);
        assert_eq!(db.embedded_header(), Some(other));
        let db = header_after_reopen(dir.path(), shutdown, db);
        assert_eq!(db.embedded_header(), Some(other), "shutdown={shutdown}");

        // Cleared.
        let mut tx = db.begin_transaction().unwrap();
        tx.set_embedded_header(None).unwrap();
        tx.commit().unwrap();
        assert_eq!(db.embedded_header(), None);
        let db = header_after_reopen(dir.path(), shutdown, db);
        assert_eq!(db.embedded_header(), None, "shutdown={shutdown}");
        db.verify().unwrap();
        db.shutdown().unwrap();
    }
}

/// Commits can return out of sequence order; the header the database
/// reports must be the one that a reopen (which applies records in
/// sequence order) and the commit log agree on: the highest sequence's.
#[test]
fn embedded_header_of_the_higher_sequence_wins_whatever_order_commits_return() {
    for shutdown in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::recover(dir.path()).unwrap();
        let mut first = db.begin_transaction().unwrap();
        let x = first.write(b"x").unwrap();
        let mut second = db.begin_transaction().unwrap();
        let y = second.write(b"y").unwrap();
        second.set_embedded_header(Some(y)).unwrap();
        let second_sequence = second.commit().unwrap();
        first.set_embedded_header(Some(x)).unwrap();
        let first_sequence = first.commit().unwrap();
        assert!(first_sequence < second_sequence);
        assert_eq!(db.embedded_header(), Some(y), "before reopening");
        let last_change = db
            .commit_log(SequenceId(0))
            .unwrap()
            .filter_map(|record| record.embedded_header)
            .last();
        assert_eq!(last_change, Some(Some(y)), "the commit log's order");
        let db = header_after_reopen(dir.path(), shutdown, db);
        assert_eq!(db.embedded_header(), Some(y), "shutdown={shutdown}");
        db.shutdown().unwrap();
    }
}

fn assert_gone(db: &Database, id: GrainId, context: &str) {
    assert_eq!(
        db.get(id).unwrap(),
        None,
        "{context}: rolled-back {id} is visible"
    );
    assert!(db.read(id).unwrap().is_none(), "{context}: read({id})");
    let mut tx = db.begin_transaction().unwrap();
    match tx.archive(id) {
        Err(Error::NotAllocated(reported)) => assert_eq!(reported, id),
        other => panic!("{context}: archive of rolled-back {id} gave {other:?}"),
    }
    match tx.set_embedded_header(Some(id)) {
        Err(Error::NotAllocated(_)) => {}
        other => panic!("{context}: set_embedded_header({id}) gave {other:?}"),
    }
}

#[test]
fn rollback_is_invisible_and_its_space_is_reused() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::recover(dir.path()).unwrap();
    let mut tx = db.begin_transaction().unwrap();
    let kept = tx.write(b"committed before").unwrap();
    let archived_later = tx.write(b"archived later").unwrap();
    let before = tx.commit().unwrap();
    let small = blob(1, 300);
    let large = blob(2, 100_000);

    for explicit in [true, false] {
        let context = if explicit { "rollback()" } else { "drop" };
        let mut tx = db.begin_transaction().unwrap();
        let a = tx.write(&small).unwrap();
        let b = tx.write(&large).unwrap();
        tx.archive(kept).unwrap();
        tx.set_embedded_header(Some(a)).unwrap();
        if explicit {
            tx.rollback();
        } else {
            drop(tx);
        }
        assert_gone(&db, a, context);
        assert_gone(&db, b, context);
        assert_eq!(db.embedded_header(), None, "{context}");
        assert_eq!(db.last_committed(), before, "{context}");
        assert!(db.commit_log(before).unwrap().all(|r| r.sequence == before));

        // The archive claim was released: another transaction may archive.
        let mut tx = db.begin_transaction().unwrap();
        tx.archive(kept).unwrap();
        tx.rollback();

        // The same sizes get the same grains back (first fit).
        let mut tx = db.begin_transaction().unwrap();
        let a2 = tx.write(&small).unwrap();
        let b2 = tx.write(&large).unwrap();
        assert_eq!(
            a2, a,
            "{context}: the rolled-back small grains were not reused"
        );
        assert_eq!(
            b2, b,
            "{context}: the rolled-back large grains were not reused"
        );
        tx.rollback();
    }

    // A rolled-back checkpoint frees nothing.
    let mut tx = db.begin_transaction().unwrap();
    tx.archive(archived_later).unwrap();
    let archived_at = tx.commit().unwrap();
    let mut tx = db.begin_transaction().unwrap();
    tx.checkpoint_to(archived_at).unwrap();
    tx.rollback();
    assert_blob(
        &db,
        archived_later,
        b"archived later",
        "after rolled-back checkpoint",
    );
    assert_eq!(db.checkpointed_to().0, 0);

    // Rolled-back grains that nobody reused stay absent after a reopen
    // that replays the WAL (which still holds the rolled-back chunks).
    let mut tx = db.begin_transaction().unwrap();
    let unused_small = tx.write(&blob(3, 5000)).unwrap();
    let unused_large = tx.write(&blob(4, 3 << 20)).unwrap();
    tx.rollback();
    let mut tx = db.begin_transaction().unwrap();
    let committed = tx.write(b"after the rollbacks").unwrap();
    tx.commit().unwrap();
    drop(db);
    let db = Database::recover(dir.path()).unwrap();
    assert_gone(&db, unused_small, "after reopen");
    assert_gone(&db, unused_large, "after reopen");
    assert_blob(&db, kept, b"committed before", "after reopen");
    assert_blob(&db, archived_later, b"archived later", "after reopen");
    assert_blob(&db, committed, b"after the rollbacks", "after reopen");
    assert_eq!(db.embedded_header(), None);
    db.verify().unwrap();
    // And their grains are handed out again after the reopen.
    let mut tx = db.begin_transaction().unwrap();
    assert_eq!(tx.write(&blob(5, 5000)).unwrap(), unused_small);
    assert_eq!(tx.write(&blob(6, 3 << 20)).unwrap(), unused_large);
    tx.commit().unwrap();
    assert_blob(&db, unused_small, &blob(5, 5000), "reused after reopen");
    assert_blob(&db, unused_large, &blob(6, 3 << 20), "reused after reopen");
    db.shutdown().unwrap();
}

#[test]
fn blobs_larger_than_the_maximum_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = Config::for_directory(dir.path())
        .max_blob_bytes(1000)
        .open()
        .unwrap();
    let mut tx = db.begin_transaction().unwrap();
    match tx.write(&[7; 1001]) {
        Err(Error::TooLarge { length, maximum }) => assert_eq!((length, maximum), (1001, 1000)),
        other => panic!("1001 bytes with a 1000-byte maximum gave {other:?}"),
    }
    // The transaction is still usable after the refusal.
    let fits = tx.write(&[7; 1000]).unwrap();
    tx.commit().unwrap();
    assert_blob(&db, fits, &[7; 1000], "the largest allowed blob");
    db.shutdown().unwrap();

    // The default maximum (checked before the data is looked at, so the
    // untouched zeroed allocation costs nothing).
    let dir = tempfile::tempdir().unwrap();
    let db = Database::recover(dir.path()).unwrap();
    let huge = vec![0_u8; (sediment::DEFAULT_MAX_BLOB_BYTES + 1) as usize];
    let mut tx = db.begin_transaction().unwrap();
    assert!(matches!(tx.write(&huge), Err(Error::TooLarge { .. })));
    drop(huge);
    tx.rollback();
    assert_eq!(db.last_committed().0, 0);
    db.shutdown().unwrap();

    // A configured maximum above what the format holds is refused, not
    // clamped (tests/config.rs has more).
    let config = Config::for_directory(dir.path()).max_blob_bytes(u64::MAX);
    assert_eq!(config.blob_size_limit(), u64::MAX);
    assert!(matches!(config.open(), Err(Error::InvalidConfig(_))));
    let db = Config::for_directory(dir.path())
        .max_blob_bytes(MAX_FORMAT_BLOB_BYTES)
        .open()
        .unwrap();
    db.shutdown().unwrap();
}
