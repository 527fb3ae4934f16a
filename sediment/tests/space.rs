//! Archiving and checkpointing free space that later writes reuse, so a
//! steady write/archive/checkpoint workload runs in bounded disk space; and
//! the errors around archiving and checkpointing.

mod common;

use std::path::Path;

use common::{
    assert_blob, blob, dir_bytes, file_len, files_with_prefix, open_small_wal, seed, Rng,
};
use sediment::{Database, Error, GrainId, SequenceId};

const WAL_BYTES: u64 = 64 << 10;

/// Bytes per kind of file: (strata, WAL, commit log, index).
fn breakdown(dir: &Path) -> (u64, u64, u64, u64) {
    let size = |prefix: &str| -> u64 {
        files_with_prefix(dir, prefix)
            .iter()
            .filter_map(|name| file_len(&dir.join(name)))
            .sum()
    };
    (
        size("stratum-"),
        size("wal-"),
        size("commits-"),
        size("index"),
    )
}

/// Each cycle writes a ~1 KiB blob, archives the previous one and
/// checkpoints to the previous sequence (freeing the blob archived one
/// cycle earlier). The directory must stop growing.
#[test]
fn write_archive_checkpoint_cycles_run_in_bounded_space() {
    let seed = seed("write_archive_checkpoint_cycles_run_in_bounded_space");
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let db = open_small_wal(dir.path(), WAL_BYTES);

    // (id, contents) of the last three blobs, newest last.
    let mut recent: Vec<(GrainId, Vec<u8>)> = Vec::new();
    let mut previous_sequence = None;
    let mut after_1000 = None;
    let mut strata_after_1000 = 0;
    let mut max_after_1000 = 0;
    const CYCLES: u64 = 10_000;
    for cycle in 0..CYCLES {
        // 960..=1008 bytes: all in the 32-byte basin, 31 or 32 grains.
        let data = blob(cycle, rng.between(960, 1008) as usize);
        let mut tx = db.begin_transaction().unwrap();
        let id = tx.write(&data).unwrap();
        if let Some((previous, _)) = recent.last() {
            tx.archive(*previous).unwrap();
        }
        if let Some(sequence) = previous_sequence {
            tx.checkpoint_to(sequence).unwrap();
        }
        let sequence = tx.commit().unwrap();
        previous_sequence = Some(sequence);
        recent.push((id, data));
        if recent.len() > 3 {
            recent.remove(0);
        }

        // The blob archived by the previous cycle was freed by this one.
        if recent.len() == 3 {
            let freed = recent[0].0;
            assert_eq!(
                db.get(freed).unwrap(),
                None,
                "cycle {cycle}: {freed} was freed by sequence {sequence}"
            );
        }
        if cycle % 97 == 0 {
            for (id, data) in &recent[recent.len().saturating_sub(2)..] {
                assert_blob(&db, *id, data, &format!("cycle {cycle}"));
            }
        }
        if cycle + 1 == 1000 {
            let bytes = dir_bytes(dir.path());
            let parts = breakdown(dir.path());
            println!("after 1000 cycles: {bytes} bytes (strata, WAL, commit log, index) {parts:?}");
            after_1000 = Some(bytes);
            strata_after_1000 = parts.0;
        }
        if cycle >= 1000 && cycle % 250 == 0 {
            max_after_1000 = max_after_1000.max(dir_bytes(dir.path()));
        }
    }
    let after_1000 = after_1000.unwrap();
    let at_end = dir_bytes(dir.path());
    let (strata, wal, commits, index) = breakdown(dir.path());
    println!(
        "after {CYCLES} cycles: {at_end} bytes (strata {strata}, WAL {wal}, commit log \
         {commits}, index {index}); largest seen after 1000 cycles: {max_after_1000}"
    );
    // The commit log may hold up to two 1 MiB files before trimming drops
    // the older one; everything else should be flat.
    let slack = 2 << 20;
    assert!(
        at_end <= after_1000 + slack && max_after_1000 <= after_1000 + slack,
        "the directory kept growing: {after_1000} bytes after 1000 cycles, {at_end} after \
         {CYCLES}, up to {max_after_1000} in between"
    );
    // The strata only hold the live blobs and a few just freed: they must
    // not keep growing.
    assert!(
        strata <= strata_after_1000 + (512 << 10),
        "the strata kept growing: {strata_after_1000} bytes after 1000 cycles, {strata} after \
         {CYCLES}"
    );
    // Two live blobs of at most 32 grains each.
    let stats = db.stats().unwrap();
    let used: u64 = stats.basins.iter().map(|b| b.grains_used).sum();
    assert!(used <= 64, "{used} grains still in use");
    assert_eq!(
        stats.basins.iter().map(|b| b.strata).sum::<u32>(),
        1,
        "one stratum holds everything"
    );
    db.verify().unwrap();
    db.shutdown().unwrap();

    // Reopened, the live blobs are there and the freed one is not.
    let db = open_small_wal(dir.path(), WAL_BYTES);
    for (id, data) in &recent[1..] {
        assert_blob(&db, *id, data, "after reopen");
    }
    assert_eq!(db.get(recent[0].0).unwrap(), None);
    db.verify().unwrap();
    db.shutdown().unwrap();
}

fn commit_one(db: &Database, data: &[u8]) -> (GrainId, SequenceId) {
    let mut tx = db.begin_transaction().unwrap();
    let id = tx.write(data).unwrap();
    (id, tx.commit().unwrap())
}

fn archive_one(db: &Database, id: GrainId) -> SequenceId {
    let mut tx = db.begin_transaction().unwrap();
    tx.archive(id).unwrap();
    tx.commit().unwrap()
}

fn checkpoint(db: &Database, to: SequenceId) -> SequenceId {
    let mut tx = db.begin_transaction().unwrap();
    tx.checkpoint_to(to).unwrap();
    tx.commit().unwrap()
}

#[test]
fn archived_blobs_stay_readable_until_a_checkpoint_covers_them() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::recover(dir.path()).unwrap();
    let (a, _) = commit_one(&db, b"blob a");
    let (b, _) = commit_one(&db, b"blob b");
    let (c, _) = commit_one(&db, &blob(3, 100_000));
    let archived_a = archive_one(&db, a);
    let archived_b = archive_one(&db, b);
    assert_blob(&db, a, b"blob a", "archived, not checkpointed");

    // A checkpoint before b's archive frees a only.
    let mut tx = db.begin_transaction().unwrap();
    tx.checkpoint_to(archived_a).unwrap();
    // Not freed before the commit.
    assert_blob(&db, a, b"blob a", "checkpoint not committed yet");
    let freed_at = tx.commit().unwrap();
    assert_eq!(db.get(a).unwrap(), None, "a is freed");
    assert!(db.read(a).unwrap().is_none());
    assert_blob(
        &db,
        b,
        b"blob b",
        "b was archived after the checkpoint target",
    );
    assert_eq!(db.checkpointed_to(), archived_a);
    let record = db.commit_log(freed_at).unwrap().next().unwrap();
    assert_eq!(record.freed, vec![a]);

    // Freed grains are no longer allocated.
    let mut tx = db.begin_transaction().unwrap();
    match tx.archive(a) {
        Err(Error::NotAllocated(id)) => assert_eq!(id, a),
        other => panic!("archiving freed {a} gave {other:?}"),
    }
    assert!(matches!(
        tx.set_embedded_header(Some(a)),
        Err(Error::NotAllocated(_))
    ));
    drop(tx);

    // Archived state and freed state survive a reopen without shutdown.
    drop(db);
    let db = Database::recover(dir.path()).unwrap();
    assert_eq!(db.get(a).unwrap(), None, "a after reopen");
    assert_blob(&db, b, b"blob b", "b after reopen");
    let mut tx = db.begin_transaction().unwrap();
    assert!(matches!(tx.archive(b), Err(Error::AlreadyArchived(id)) if id == b));
    drop(tx);

    // The large blob: archived and freed in one go with b.
    let archived_c = archive_one(&db, c);
    assert!(archived_c > archived_b);
    checkpoint(&db, archived_c);
    assert_eq!(db.get(b).unwrap(), None);
    assert_eq!(db.get(c).unwrap(), None);

    // Once the freeing transaction is through the WAL, the space is reused
    // by the next blob of the same size (first fit).
    db.checkpoint_wal().unwrap();
    let (reused_a, _) = commit_one(&db, b"blob A");
    let (reused_c, _) = commit_one(&db, &blob(33, 100_000));
    assert_eq!(reused_a, a, "a's grains were not reused");
    assert_eq!(reused_c, c, "c's grains were not reused");
    assert_blob(&db, a, b"blob A", "the new blob in a's grains");
    assert_blob(&db, c, &blob(33, 100_000), "the new blob in c's grains");
    db.verify().unwrap();
    db.shutdown().unwrap();
}

#[test]
fn space_freed_before_a_crash_is_reused_after_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::recover(dir.path()).unwrap();
    let (a, _) = commit_one(&db, &blob(1, 5000));
    let archived = archive_one(&db, a);
    checkpoint(&db, archived);
    // Dropped before any WAL checkpoint: the free is only in the WAL.
    drop(db);
    let db = Database::recover(dir.path()).unwrap();
    assert_eq!(db.get(a).unwrap(), None);
    db.checkpoint_wal().unwrap();
    let (b, _) = commit_one(&db, &blob(2, 5000));
    assert_eq!(b, a, "the freed grains were not reused after reopening");
    assert_blob(&db, b, &blob(2, 5000), "reused");
    db.verify().unwrap();
    db.shutdown().unwrap();
}

#[test]
fn archiving_twice_is_refused() {
    let db = Database::in_memory();
    let (a, _) = commit_one(&db, b"a");
    let (b, _) = commit_one(&db, b"b");

    // Twice in one transaction.
    let mut tx = db.begin_transaction().unwrap();
    tx.archive(a).unwrap();
    assert!(matches!(tx.archive(a), Err(Error::AlreadyArchived(id)) if id == a));
    // A second transaction running at the same time.
    let mut other = db.begin_transaction().unwrap();
    assert!(matches!(other.archive(a), Err(Error::AlreadyArchived(id)) if id == a));
    other.archive(b).unwrap();
    drop(other); // releases b's claim
    tx.commit().unwrap();
    // After the commit.
    let mut tx = db.begin_transaction().unwrap();
    assert!(matches!(tx.archive(a), Err(Error::AlreadyArchived(id)) if id == a));
    // b's claim was released by the rollback.
    tx.archive(b).unwrap();
    tx.commit().unwrap();
    let mut tx = db.begin_transaction().unwrap();
    assert!(matches!(tx.archive(b), Err(Error::AlreadyArchived(_))));
    // The error names the grain.
    let message = tx.archive(b).unwrap_err().to_string();
    assert!(message.contains(&b.to_string()), "{message}");
}

#[test]
fn archiving_what_was_never_allocated_is_refused() {
    let db = Database::in_memory();
    let (a, _) = commit_one(&db, &[1; 100]);
    let never = [
        // Right after a, in the same stratum.
        GrainId::new(a.basin(), a.stratum(), a.index() + a.count(), 1).unwrap(),
        // A stratum that does not exist.
        GrainId::new(a.basin(), 5, 0, 1).unwrap(),
        // A basin without strata.
        GrainId::new(9, 0, 0, 3).unwrap(),
        // Part of a.
        GrainId::new(a.basin(), a.stratum(), a.index() + 1, a.count() - 1).unwrap(),
        GrainId::new(a.basin(), a.stratum(), a.index(), a.count() - 1).unwrap(),
    ];
    let mut tx = db.begin_transaction().unwrap();
    for id in never {
        match tx.archive(id) {
            Err(Error::NotAllocated(reported)) => assert_eq!(reported, id),
            other => panic!("archiving never-allocated {id} gave {other:?}"),
        }
    }
    // A blob written by this very transaction is not committed yet.
    let fresh = tx.write(b"not committed").unwrap();
    assert!(matches!(tx.archive(fresh), Err(Error::NotAllocated(_))));
    // None of that broke the transaction.
    tx.archive(a).unwrap();
    tx.commit().unwrap();
    assert_blob(
        &db,
        fresh,
        b"not committed",
        "written next to failed archives",
    );
}

#[test]
fn checkpoint_to_a_future_sequence_is_refused() {
    let db = Database::in_memory();
    let (_, first) = commit_one(&db, b"first");
    let mut tx = db.begin_transaction().unwrap();
    for future in [first.0 + 1, first.0 + 1000, u64::MAX] {
        match tx.checkpoint_to(SequenceId(future)) {
            Err(Error::FutureSequence {
                requested,
                committed,
            }) => assert_eq!((requested, committed), (future, first.0)),
            other => panic!("checkpoint_to({future}) gave {other:?}"),
        }
    }
    tx.checkpoint_to(first).unwrap();
    tx.commit().unwrap();

    // A returned sequence is committed even while an earlier transaction
    // still runs: `checkpoint_to` takes it, and the commit waits for the
    // earlier transaction. This thread holds that one itself, so the
    // commit fails instead of waiting forever.
    let mut running = db.begin_transaction().unwrap();
    running.write(b"still running").unwrap();
    let (_, later) = commit_one(&db, b"committed after");
    let mut tx = db.begin_transaction().unwrap();
    tx.checkpoint_to(later).unwrap();
    match tx.commit() {
        Err(Error::CheckpointBlockedByOwnTransaction { requested, open }) => {
            assert_eq!(requested, later.0);
            assert!(open < later.0, "{open} {later}");
        }
        other => panic!("checkpoint past an own open transaction gave {other:?}"),
    }
    let running = running.commit().unwrap();
    assert!(running < later);
    let mut tx = db.begin_transaction().unwrap();
    tx.checkpoint_to(later).unwrap();
    tx.commit().unwrap();
    assert_eq!(db.checkpointed_to(), later);
}
