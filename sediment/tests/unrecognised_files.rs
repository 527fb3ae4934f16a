//! A file of another program in the store directory, named like one of
//! the store's (the next stratum, a later stratum, a commit log file after
//! the current one), is neither overwritten nor deleted: the store does
//! not open while it is there, the error names it, and once it is moved
//! away the store opens with everything in it. What a crash leaves under
//! those names (an empty or zeroed stratum file, the start of a stratum
//! header, an interrupted rekey's copy of a commit log file) is still
//! taken for what it is.

mod common;

use std::path::Path;

use sediment::{Config, Database, Error, GrainId};

/// A store holding one blob, closed; returns its id.
fn store_with_a_blob(dir: &Path) -> GrainId {
    let db = Database::recover(dir).unwrap();
    let mut tx = db.begin_transaction().unwrap();
    let id = tx.write(b"kept").unwrap();
    tx.commit().unwrap();
    db.shutdown().unwrap();
    id
}

fn assert_refused(dir: &Path, name: &str, contents: &[u8]) {
    let path = dir.join(name);
    for writable in [true, false] {
        let opened = Config::for_directory(dir).read_only(!writable).open();
        match opened {
            Err(Error::UnrecognisedFile { path: named, .. }) => {
                assert_eq!(named, path, "{name}, writable {writable}")
            }
            Err(other) => panic!("{name}, writable {writable}: {other}"),
            Ok(_) => panic!("{name}, writable {writable}: opened"),
        }
        assert_eq!(
            std::fs::read(&path).unwrap(),
            contents,
            "{name} was changed (writable {writable})"
        );
    }
}

#[test]
fn another_programs_files_named_like_the_stores_are_left_alone_and_named() {
    let notes = b"my notes, not a store file\n";
    for name in ["stratum-0-1", "stratum-0-7", "commits-5"] {
        let dir = tempfile::tempdir().unwrap();
        let id = store_with_a_blob(dir.path());
        let path = dir.path().join(name);
        std::fs::write(&path, notes).unwrap();
        let message = Config::for_directory(dir.path())
            .open()
            .err()
            .unwrap_or_else(|| panic!("{name}: opened"))
            .to_string();
        assert!(message.contains("not a file of this store"), "{message}");
        assert!(message.contains(name), "{message}");
        assert!(!message.contains("damaged"), "{message}");
        assert_refused(dir.path(), name, notes);

        std::fs::remove_file(&path).unwrap();
        let db = Database::recover(dir.path()).unwrap();
        common::assert_blob(&db, id, b"kept", name);
        db.verify().unwrap();
        db.shutdown().unwrap();
    }
}

#[test]
fn what_a_crash_leaves_under_a_stratum_name_is_still_created_afresh() {
    for contents in [Vec::new(), vec![0_u8; 4096], b"SEDSTR".to_vec()] {
        let dir = tempfile::tempdir().unwrap();
        let id = store_with_a_blob(dir.path());
        std::fs::write(dir.path().join("stratum-0-1"), &contents).unwrap();
        let db = Database::recover(dir.path())
            .unwrap_or_else(|err| panic!("{} bytes: {err}", contents.len()));
        common::assert_blob(&db, id, b"kept", "after a cut-short stratum");
        db.verify().unwrap();
        db.shutdown().unwrap();
    }
}

/// An encrypted store holding one blob, closed; returns its id and the
/// name of its commit log file.
fn encrypted_store_with_a_blob(dir: &Path) -> (GrainId, String) {
    let db = Config::for_directory(dir)
        .encryption(common::test_key())
        .open()
        .unwrap();
    let mut tx = db.begin_transaction().unwrap();
    let id = tx.write(b"kept").unwrap();
    tx.commit().unwrap();
    db.shutdown().unwrap();
    let commits = common::files_with_prefix(dir, "commits-")
        .pop()
        .expect("a commit log file");
    (id, commits)
}

#[test]
fn a_file_named_like_a_rekeys_leftover_copy_is_removed_only_when_it_is_one() {
    // What an interrupted rekey leaves: nothing written yet, zeros, or
    // the resealed copy of a commit log file. Open removes it.
    for leftover in ["empty", "zeros", "copy"] {
        let dir = tempfile::tempdir().unwrap();
        let (id, commits) = encrypted_store_with_a_blob(dir.path());
        let name = format!("rekey-{commits}");
        let contents = match leftover {
            "empty" => Vec::new(),
            "zeros" => vec![0; 4096],
            _ => std::fs::read(dir.path().join(&commits)).unwrap(),
        };
        std::fs::write(dir.path().join(&name), contents).unwrap();
        let db = Config::for_directory(dir.path())
            .encryption(common::test_key())
            .open()
            .unwrap_or_else(|err| panic!("{leftover}: {err}"));
        assert!(!dir.path().join(&name).exists(), "{leftover} was kept");
        common::assert_blob(&db, id, b"kept", leftover);
        db.verify().unwrap();
        db.shutdown().unwrap();
    }

    // Another program's file of that name stays as it is, and the store
    // opens once it is moved away.
    let dir = tempfile::tempdir().unwrap();
    let (id, commits) = encrypted_store_with_a_blob(dir.path());
    let name = format!("rekey-{commits}");
    let path = dir.path().join(&name);
    let notes = b"my notes, not a store file\n";
    std::fs::write(&path, notes).unwrap();
    match Config::for_directory(dir.path())
        .encryption(common::test_key())
        .open()
    {
        Err(err @ Error::UnrecognisedFile { .. }) => {
            let message = err.to_string();
            assert!(message.contains(&name), "{message}");
            assert!(message.contains("a rekey's copy"), "{message}");
        }
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("opened"),
    }
    assert_eq!(std::fs::read(&path).unwrap(), notes);
    std::fs::remove_file(&path).unwrap();
    let db = Config::for_directory(dir.path())
        .encryption(common::test_key())
        .open()
        .unwrap();
    common::assert_blob(&db, id, b"kept", "after moving the notes away");
    db.shutdown().unwrap();
}
