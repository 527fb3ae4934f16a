//! A store whose creation a crash cut short: on a real file system the
//! new `index` name can become durable before its contents (another file's
//! sync may commit the journal), leaving an empty or zeroed index and no
//! other file. Nothing was stored, so the store must open afresh; an
//! unreadable index next to data stays an error.

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
