//! A store that an earlier version of sediment wrote, and left as a crash
//! leaves it (committed transactions still only in the WAL), opens with
//! everything in it, reads without writing, and takes new writes.

mod common;

use std::collections::BTreeMap;

use sediment::{Config, Database, GrainId};

fn check(db: &Database, stored: &BTreeMap<GrainId, Vec<u8>>, context: &str) {
    for (id, data) in stored {
        common::assert_blob(db, *id, data, context);
    }
}

#[test]
fn a_plain_store_an_earlier_version_left_by_a_crash_opens_with_every_blob() {
    let dir = tempfile::tempdir().unwrap();
    let (mut stored, ids) = common::copy_fixture("plain-store-left-by-a-crash", dir.path());
    assert_eq!(stored.len(), 80);

    // Read-only first: transactions 9 to 16 are replayed in memory, and no
    // file changes.
    let before = common::files(dir.path());
    let db = Database::open_read_only(dir.path()).unwrap();
    check(&db, &stored, "read-only, replayed from the WAL");
    assert_eq!(db.last_committed().0, 16);
    assert_eq!(db.embedded_header(), Some(ids[3]));
    db.verify().unwrap();
    drop(db);
    assert_eq!(common::files(dir.path()), before, "a read-only open wrote");

    // Open for writing: the same blobs, and new ones beside them.
    let db = Config::for_directory(dir.path()).open().unwrap();
    check(&db, &stored, "replayed from the WAL");
    assert_eq!(db.last_committed().0, 16);
    assert_eq!(db.embedded_header(), Some(ids[3]));
    let mut tx = db.begin_transaction().unwrap();
    let new = [common::blob(1, 300), common::blob(2, 90_000)];
    for data in &new {
        stored.insert(tx.write(data).unwrap(), data.clone());
    }
    tx.archive(ids[0]).unwrap();
    let archived = tx.commit().unwrap();
    stored.remove(&ids[0]);
    let mut tx = db.begin_transaction().unwrap();
    tx.checkpoint_to(archived).unwrap();
    tx.commit().unwrap();
    check(&db, &stored, "after new writes");
    db.verify().unwrap();
    db.shutdown().unwrap();

    let db = Config::for_directory(dir.path()).open().unwrap();
    check(&db, &stored, "reopened");
    assert_eq!(
        db.get(ids[0]).unwrap(),
        None,
        "blob 0 was archived and freed"
    );
    assert_eq!(db.embedded_header(), Some(ids[3]));
    db.verify().unwrap();
    db.shutdown().unwrap();
}
