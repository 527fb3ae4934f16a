//! A store whose creation a crash cut short: on a real file system the
//! new `index` name can become durable before its contents (another file's
//! sync may commit the journal), leaving an empty or zeroed index and no
//! other file. Nothing was stored, so the store must open afresh; an
//! unreadable index next to data stays an error, and so does a file named
//! `index` that no creation of ours could have left, or WAL files without
//! an index (an okaywal log, or a store that lost its index): neither is
//! replaced or written into.

use sediment::{Database, Error};

#[test]
fn an_unfinished_index_alone_is_replaced_by_a_fresh_store() {
    for contents in [
        Vec::new(),
        vec![0_u8; 4096],
        vec![0_u8; 8192],
        b"SEDIN".to_vec(),
    ] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("index"), &contents).unwrap();
        let db = Database::recover(dir.path())
            .unwrap_or_else(|err| panic!("index of {} bytes: {err}", contents.len()));
        let mut tx = db.begin_transaction().unwrap();
        let id = tx.write(b"stored after all").unwrap();
        tx.commit().unwrap();
        db.shutdown().unwrap();
        let db = Database::recover(dir.path()).unwrap();
        assert_eq!(
            db.get(id).unwrap().as_deref(),
            Some(&b"stored after all"[..])
        );
        db.verify().unwrap();
    }
}

#[test]
fn an_unreadable_index_beside_other_store_files_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::recover(dir.path()).unwrap();
    let mut tx = db.begin_transaction().unwrap();
    tx.write(b"data").unwrap();
    tx.commit().unwrap();
    db.shutdown().unwrap();
    std::fs::write(dir.path().join("index"), vec![0_u8; 8192]).unwrap();
    match Database::recover(dir.path()) {
        Err(Error::Corrupt { what, .. }) => {
            assert!(what.contains("index header"), "{what}");
        }
        Err(other) => panic!("unexpected error: {other}"),
        Ok(_) => panic!("a store with data and an unreadable index opened"),
    }
}

/// A user's own file named `index` (not empty, not zeros, not the start of
/// an index copy) is not a store whose creation was cut short: opening
/// for writing refuses and leaves it, and a read-only open says what the
/// file is not.
#[test]
fn a_foreign_file_named_index_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let index = dir.path().join("index");
    std::fs::write(&index, b"my notes about the index of my thesis\n").unwrap();
    std::fs::write(dir.path().join("notes.txt"), b"other notes").unwrap();
    let before = testkit::disk::snapshot(dir.path());
    match Database::recover(dir.path()) {
        Err(Error::Corrupt { path, what }) => {
            assert_eq!(path, index);
            assert!(what.contains("not a sediment index"), "{what}");
        }
        Err(other) => panic!("unexpected error: {other}"),
        Ok(_) => panic!("a directory with a foreign index file opened as a store"),
    }
    let err = Database::open_read_only(dir.path())
        .err()
        .map(|e| e.to_string());
    assert!(
        err.as_deref()
            .is_some_and(|e| e.contains("not a sediment index")),
        "{err:?}"
    );
    // The lock files are the only ones an open may leave.
    let mut after = testkit::disk::snapshot(dir.path());
    after.retain(|name, _| name.extension().is_none_or(|e| e != "lock"));
    assert!(before == after, "the directory changed");
}

/// WAL files without an index: an okaywal log of its own, or a store that
/// lost its index. Neither open creates an index there, writes into the
/// log, or leaves a file of its own (read-only opens write nothing at
/// all; a refused writable open removes the lock file it created).
#[test]
fn wal_files_without_an_index_are_not_a_store() {
    // An okaywal log with an entry, and a directory holding one empty
    // file named like a segment.
    let log_dir = tempfile::tempdir().unwrap();
    let log = okaywal::WriteAheadLog::recover(log_dir.path(), okaywal::LogVoid).unwrap();
    let mut entry = log.begin_entry().unwrap();
    entry
        .write_chunk(b"an okaywal entry, not a sediment record")
        .unwrap();
    entry.commit().unwrap();
    log.shutdown().unwrap();
    drop(log);
    let stray = tempfile::tempdir().unwrap();
    std::fs::write(stray.path().join("wal-1"), b"").unwrap();

    for dir in [log_dir.path(), stray.path()] {
        let before = testkit::disk::snapshot(dir);
        let read_only = Database::open_read_only(dir).err().map(|e| e.to_string());
        assert!(
            read_only
                .as_deref()
                .is_some_and(|e| e.contains("index file is missing")),
            "{read_only:?}"
        );
        assert!(
            before == testkit::disk::snapshot(dir),
            "a read-only open wrote"
        );
        match Database::recover(dir) {
            Err(Error::Corrupt { what, .. }) => {
                assert!(what.contains("1 write-ahead log file"), "{what}")
            }
            Err(other) => panic!("unexpected error: {other}"),
            Ok(_) => panic!("WAL files without an index opened as a store"),
        }
        assert!(!dir.join("index").exists(), "an index was created");
        // Not even a lock file is left behind.
        assert!(
            before == testkit::disk::snapshot(dir),
            "a refused writable open changed the directory"
        );
    }
}
