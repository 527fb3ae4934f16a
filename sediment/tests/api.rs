//! The public API used from the outside: reads of uncommitted blobs,
//! streaming reads from the WAL and from the strata, other files in the
//! directory, extreme arguments, and long-open transactions.

use std::io::Read;

use sediment::{Config, Database, Error, GrainId, SequenceId};

/// A blob written by a transaction that has not committed is not visible,
/// not even to archive or to name as the embedded header from another
/// transaction.
#[test]
fn uncommitted_blobs_are_invisible() {
    let db = Database::in_memory();
    let mut tx = db.begin_transaction().unwrap();
    let small = tx.write(b"small").unwrap();
    let large = tx.write(&vec![7_u8; 300_000]).unwrap();
    let empty = tx.write(b"").unwrap();
    for id in [small, large, empty] {
        assert_eq!(db.get(id).unwrap(), None, "{id}");
        assert!(db.read(id).unwrap().is_none(), "{id}");
        let mut other = db.begin_transaction().unwrap();
        assert!(matches!(other.archive(id), Err(Error::NotAllocated(_))));
        assert!(matches!(
            other.set_embedded_header(Some(id)),
            Err(Error::NotAllocated(_))
        ));
        other.rollback();
    }
    // The writing transaction may name its own blob as the header.
    tx.set_embedded_header(Some(small)).unwrap();
    let sequence = tx.commit().unwrap();
    assert_eq!(db.embedded_header(), Some(small));
    assert_eq!(db.get(small).unwrap().as_deref(), Some(&b"small"[..]));
    assert_eq!(db.get(empty).unwrap().as_deref(), Some(&b""[..]));
    assert_eq!(db.get(large).unwrap(), Some(vec![7_u8; 300_000]));
    let records: Vec<_> = db.commit_log(SequenceId(0)).unwrap().collect();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].sequence, sequence);
    assert_eq!(
        records[0]
            .new_grains
            .iter()
            .map(|g| (g.id, g.length))
            .collect::<Vec<_>>(),
        vec![(small, 5), (large, 300_000), (empty, 0)]
    );
    assert_eq!(records[0].embedded_header, Some(Some(small)));
    db.shutdown().unwrap();
}

/// `read` streams a blob in small pieces, from the WAL and from the
/// strata, and the text and byte forms of its id round-trip.
#[test]
fn streaming_reads_match_get_before_and_after_the_wal_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let db = Config::for_directory(dir.path())
        .wal(|wal| wal.checkpoint_after_bytes(1 << 20))
        .open()
        .unwrap();
    let blobs: Vec<Vec<u8>> = [0_usize, 1, 15, 16, 17, 4095, 60_000, 70_000, 1 << 20]
        .iter()
        .map(|&len| (0..len).map(|i| (i * 31 % 253) as u8).collect())
        .collect();
    let mut tx = db.begin_transaction().unwrap();
    let ids: Vec<GrainId> = blobs.iter().map(|b| tx.write(b).unwrap()).collect();
    tx.commit().unwrap();
    let check = |db: &Database, when: &str| {
        for (id, data) in ids.iter().zip(&blobs) {
            assert_eq!(id.to_string().parse::<GrainId>().unwrap(), *id);
            assert_eq!(GrainId::from_bytes(id.to_bytes()).unwrap(), *id);
            assert_eq!(db.get(*id).unwrap().as_ref(), Some(data), "{when} {id}");
            let mut reader = db.read(*id).unwrap().expect("committed");
            assert_eq!(reader.len(), data.len() as u64);
            let mut read = Vec::new();
            let mut piece = [0_u8; 1000];
            loop {
                let n = reader.read(&mut piece).unwrap();
                if n == 0 {
                    break;
                }
                read.extend_from_slice(&piece[..n]);
            }
            assert_eq!(&read, data, "{when} {id}");
        }
    };
    check(&db, "in the WAL");
    db.checkpoint_wal().unwrap();
    check(&db, "in the strata");
    db.shutdown().unwrap();
    let db = Database::recover(dir.path()).unwrap();
    check(&db, "after reopening");
    db.verify().unwrap();
    db.shutdown().unwrap();
}

/// Files in the database directory that are not the store's are left
/// alone, through writes, checkpoints and reopening.
#[test]
fn other_files_in_the_directory_are_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let foreign = [
        ("notes.txt", &b"mine"[..]),
        ("index.old", b"an old index"),
        ("wal-notes", b"not a segment"),
        ("commits-notes", b"not a commit log"),
        ("stratum-notes", b"not a stratum"),
    ];
    for (name, contents) in foreign {
        std::fs::write(dir.path().join(name), contents).unwrap();
    }
    let db = Database::recover(dir.path()).unwrap();
    let mut tx = db.begin_transaction().unwrap();
    let id = tx.write(b"stored").unwrap();
    let archived = tx.write(b"archived").unwrap();
    tx.commit().unwrap();
    let mut tx = db.begin_transaction().unwrap();
    tx.archive(archived).unwrap();
    let at = tx.commit().unwrap();
    let mut tx = db.begin_transaction().unwrap();
    tx.checkpoint_to(at).unwrap();
    tx.commit().unwrap();
    db.shutdown().unwrap();
    let db = Database::recover(dir.path()).unwrap();
    assert_eq!(db.get(id).unwrap().as_deref(), Some(&b"stored"[..]));
    assert_eq!(db.get(archived).unwrap(), None);
    db.verify().unwrap();
    db.shutdown().unwrap();
    for (name, contents) in foreign {
        assert_eq!(
            std::fs::read(dir.path().join(name)).unwrap(),
            contents,
            "{name}"
        );
    }
}

/// Extreme arguments give errors or empty answers, never a panic.
#[test]
fn extreme_arguments_fail_cleanly() {
    let db = Database::in_memory();
    assert_eq!(db.commit_log(SequenceId(u64::MAX)).unwrap().count(), 0);
    let mut tx = db.begin_transaction().unwrap();
    assert!(matches!(
        tx.checkpoint_to(SequenceId(u64::MAX)),
        Err(Error::FutureSequence { .. })
    ));
    let id = tx.write(b"").unwrap();
    let sequence = tx.commit().unwrap();
    assert_eq!(db.get(id).unwrap().as_deref(), Some(&b""[..]));
    let mut tx = db.begin_transaction().unwrap();
    tx.checkpoint_to(SequenceId(0)).unwrap();
    tx.checkpoint_to(sequence).unwrap();
    tx.commit().unwrap();
    assert_eq!(db.get(id).unwrap().as_deref(), Some(&b""[..]));
    for raw in [0_u64, 1, u64::MAX, 1 << 51, (1 << 52) - 1] {
        if let Ok(id) = GrainId::from_u64(raw) {
            let _ = db.get(id);
            let _ = db.read(id);
            let mut tx = db.begin_transaction().unwrap();
            let _ = tx.archive(id);
            let _ = tx.set_embedded_header(Some(id));
            tx.rollback();
        }
    }
    let small = Config::for_directory("/small")
        .file_system(okaywal::fs::MemoryFileSystem::new())
        .max_blob_bytes(10)
        .open()
        .unwrap();
    let mut tx = small.begin_transaction().unwrap();
    assert!(matches!(tx.write(&[0; 11]), Err(Error::TooLarge { .. })));
    tx.write(&[0; 10]).unwrap();
    tx.commit().unwrap();
    small.shutdown().unwrap();
    db.verify().unwrap();
    db.shutdown().unwrap();
}

/// A blob streamed from the WAL stays readable, whole and correct, when
/// the WAL segment holding it is checkpointed halfway through the read
/// (and when more writes follow that could reuse the segment's file).
#[test]
fn a_blob_streamed_from_the_wal_survives_a_checkpoint_halfway() {
    let dir = tempfile::tempdir().unwrap();
    let db = Config::for_directory(dir.path())
        .direct_write_bytes(u64::MAX)
        .wal(|wal| {
            wal.preallocate_bytes(256 << 10)
                .checkpoint_after_bytes(256 << 10)
        })
        .open()
        .unwrap();
    let data: Vec<u8> = (0..200_000_u32).map(|i| (i % 241) as u8).collect();
    let mut tx = db.begin_transaction().unwrap();
    let id = tx.write(&data).unwrap();
    tx.commit().unwrap();
    let mut reader = db.read(id).unwrap().expect("committed");
    let mut read = vec![0_u8; 50_000];
    reader.read_exact(&mut read).unwrap();
    db.checkpoint_wal().unwrap();
    for i in 0..20_u8 {
        let mut tx = db.begin_transaction().unwrap();
        tx.write(&vec![i; 100_000]).unwrap();
        tx.commit().unwrap();
    }
    db.checkpoint_wal().unwrap();
    reader.read_to_end(&mut read).unwrap();
    assert!(read == data, "the streamed blob changed under its reader");
    assert_eq!(db.get(id).unwrap().as_ref(), Some(&data));
    db.shutdown().unwrap();
}

/// Archived state survives reopening, before and after the WAL is
/// checkpointed: the grain is still readable, cannot be archived again,
/// and a `checkpoint_to` after the reopen frees it.
#[test]
fn archives_survive_reopening_and_are_freed_afterwards() {
    for wal_checkpoint in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::recover(dir.path()).unwrap();
        let mut tx = db.begin_transaction().unwrap();
        let small = tx.write(b"small").unwrap();
        let large = tx.write(&vec![5; 100_000]).unwrap();
        let kept = tx.write(b"kept").unwrap();
        tx.commit().unwrap();
        let mut tx = db.begin_transaction().unwrap();
        tx.archive(small).unwrap();
        tx.archive(large).unwrap();
        let archived_at = tx.commit().unwrap();
        if wal_checkpoint {
            db.checkpoint_wal().unwrap();
        }
        drop(db);

        let db = Database::recover(dir.path()).unwrap();
        assert_eq!(db.get(small).unwrap().as_deref(), Some(&b"small"[..]));
        assert_eq!(db.get(large).unwrap(), Some(vec![5; 100_000]));
        let mut tx = db.begin_transaction().unwrap();
        assert!(matches!(tx.archive(small), Err(Error::AlreadyArchived(_))));
        assert!(matches!(tx.archive(large), Err(Error::AlreadyArchived(_))));
        tx.checkpoint_to(archived_at).unwrap();
        let freeing = tx.commit().unwrap();
        assert_eq!(db.get(small).unwrap(), None, "{wal_checkpoint}");
        assert_eq!(db.get(large).unwrap(), None, "{wal_checkpoint}");
        assert_eq!(db.get(kept).unwrap().as_deref(), Some(&b"kept"[..]));
        let record = db
            .commit_log(freeing)
            .unwrap()
            .next()
            .expect("the freeing record");
        let mut freed = record.freed.clone();
        freed.sort();
        let mut expected = vec![small, large];
        expected.sort();
        assert_eq!(freed, expected);
        assert_eq!(record.checkpointed_to, Some(archived_at));
        db.shutdown().unwrap();
        let db = Database::recover(dir.path()).unwrap();
        assert_eq!(db.get(small).unwrap(), None);
        assert_eq!(db.get(large).unwrap(), None);
        db.verify().unwrap();
        db.shutdown().unwrap();
    }
}

/// A transaction left open while the same thread commits many others (far
/// more WAL segments' worth) neither blocks them nor is lost: it commits
/// last, and everything reads back.
#[test]
fn a_long_open_transaction_does_not_block_its_own_thread() {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let db = Config::for_directory("/long")
            .file_system(okaywal::fs::MemoryFileSystem::new())
            .wal(|wal| {
                wal.preallocate_bytes(16 << 10)
                    .checkpoint_after_bytes(16 << 10)
            })
            .open()
            .unwrap();
        let mut long = db.begin_transaction().unwrap();
        let first = long.write(b"written first, committed last").unwrap();
        let mut written = Vec::new();
        for i in 0..200_u32 {
            let mut tx = db.begin_transaction().unwrap();
            let data = vec![i as u8; 3000];
            written.push((tx.write(&data).unwrap(), data));
            tx.commit().unwrap();
        }
        long.commit().unwrap();
        db.checkpoint_wal().unwrap();
        assert_eq!(
            db.get(first).unwrap().as_deref(),
            Some(&b"written first, committed last"[..])
        );
        for (id, data) in &written {
            assert_eq!(db.get(*id).unwrap().as_ref(), Some(data));
        }
        db.verify().unwrap();
        db.shutdown().unwrap();
        done.send(()).unwrap();
    });
    assert!(
        finished
            .recv_timeout(std::time::Duration::from_secs(60))
            .is_ok(),
        "the thread holding a transaction open stalled (or failed)"
    );
}
