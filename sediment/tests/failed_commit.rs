//! A commit whose WAL sync fails has an unknown outcome: its records may
//! be in the WAL file, and the next open may replay it. Nothing the
//! process does after the failure may make such a transaction read back
//! wrong bytes. Each test runs on a plain store and on an encrypted one.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::{HeldStratumSync, HookedFs, Mode, ReleaseOnDrop};
use okaywal::fs::{CrashFileSystem, FaultKind, Operation};
use sediment::{Config, Database, Error};
use testkit::disk::quiesce;

const DIR: &str = "/db";

fn open(fs: &CrashFileSystem, mode: Mode) -> sediment::Result<Database> {
    mode.apply(Config::for_directory(DIR))
        .file_system(fs.clone())
        .open()
}

#[test]
fn a_blob_whose_commit_failed_never_reads_back_another_transactions_bytes() {
    for mode in Mode::BOTH {
        a_blob_whose_commit_failed_never_reads_back_another_transactions_bytes_in(mode);
    }
}

fn a_blob_whose_commit_failed_never_reads_back_another_transactions_bytes_in(mode: Mode) {
    let fs = CrashFileSystem::new();
    let db = open(&fs, mode).unwrap();
    // Large enough to be written straight into its grains, not the WAL.
    let first = vec![0x11_u8; 100_000];
    let second = vec![0x22_u8; 100_000];
    let mut warm_up = db.begin_transaction().unwrap();
    warm_up.write(b"names the WAL segment").unwrap();
    warm_up.commit().unwrap();

    // Begun before the failure, so its WAL entry is already open.
    let mut in_flight = db.begin_transaction().unwrap();
    in_flight.write(b"small").unwrap();

    let mut failing = db.begin_transaction().unwrap();
    let id = failing.write(&first).unwrap();
    // The commit syncs the stratum (this sync), then the WAL (the next).
    let syncs = fs.operation_count(Operation::Sync);
    fs.inject(
        Operation::Sync,
        syncs + 1,
        FaultKind::Error(std::io::ErrorKind::Other),
    );
    assert!(failing.commit().is_err());
    fs.clear_faults();

    // The store refuses further writes: a released grain written over
    // here would come back under `id` if the next open replays the commit.
    let refused = in_flight.write(&second);
    assert!(
        refused.is_err(),
        "a write after the failed commit was taken"
    );
    drop(in_flight);
    assert!(db.begin_transaction().and_then(|tx| tx.commit()).is_err());
    drop(db);

    // Restarted; the page cache still holds what was written.
    let db = open(&fs, mode).unwrap();
    match db.get(id) {
        Ok(None) => {}
        Ok(Some(bytes)) => assert!(bytes == first, "{id} reads back bytes it never held"),
        Err(err) => panic!("{id} is damaged: {err}"),
    }
    db.verify().unwrap();
    db.shutdown().unwrap();
}

/// Linux reports a failed writeback to one `fdatasync` of a file
/// description and may drop the pages it could not write. Blobs written
/// straight into a stratum share its file description, so once a sync of
/// it fails, a commit whose blob sits there must not be acknowledged, even
/// if its own sync then reports success.
#[test]
fn a_commit_is_refused_once_a_sync_of_its_stratum_failed() {
    for mode in Mode::BOTH {
        a_commit_is_refused_once_a_sync_of_its_stratum_failed_in(mode);
    }
}

fn a_commit_is_refused_once_a_sync_of_its_stratum_failed_in(mode: Mode) {
    let fs = CrashFileSystem::new();
    let hooks = Arc::new(HeldStratumSync::default());
    let db = mode
        .apply(Config::for_directory(DIR))
        .file_system(HookedFs {
            inner: fs.clone(),
            hooks: hooks.clone(),
        })
        .open()
        .unwrap();
    // Large enough to be written straight into the same stratum.
    let mut failing = db.begin_transaction().unwrap();
    failing.write(&[0x11; 100_000]).unwrap();
    let mut waiting = db.begin_transaction().unwrap();
    let id = waiting.write(&[0x22; 100_000]).unwrap();

    hooks.fail.store(true, Ordering::SeqCst);
    hooks.gate.arm();
    let _release = ReleaseOnDrop(&hooks.gate);
    std::thread::scope(|s| {
        let failed = s.spawn(move || failing.commit());
        hooks.gate.wait_entered();
        // The first sync is held, about to fail; the second commit reaches
        // its own sync meanwhile.
        let waited = s.spawn(move || waiting.commit());
        std::thread::sleep(Duration::from_millis(200));
        hooks.gate.release();
        assert!(failed.join().unwrap().is_err(), "the failed sync's commit");
        let waited = waited.join().unwrap();
        assert!(
            waited.is_err(),
            "acknowledged ({waited:?}) after a sync of its stratum failed"
        );
    });
    assert!(db.begin_transaction().and_then(|tx| tx.commit()).is_err());
    drop(db);

    let db = open(&fs, mode).unwrap();
    match db.get(id) {
        Ok(None) => {}
        Ok(Some(bytes)) => assert!(bytes == [0x22; 100_000], "{id} reads back other bytes"),
        Err(err) => panic!("{id} is damaged: {err}"),
    }
    db.verify().unwrap();
    db.shutdown().unwrap();
}

/// Once a commit's sync has failed, every later error of the store has
/// that first failure's I/O error kind (a full disk stays `StorageFull`,
/// not a generic error) and mentions its message, whatever reports it.
#[test]
fn later_errors_keep_the_kind_and_message_of_the_first_failure() {
    for mode in Mode::BOTH {
        later_errors_keep_the_kind_and_message_of_the_first_failure_in(mode);
    }
}

fn later_errors_keep_the_kind_and_message_of_the_first_failure_in(mode: Mode) {
    // A blob through the WAL (its WAL sync fails) and one written straight
    // into its grains (the stratum's sync fails).
    for size in [100, 100_000] {
        let fs = CrashFileSystem::new();
        let db = open(&fs, mode).unwrap();
        let mut warm_up = db.begin_transaction().unwrap();
        warm_up.write(b"names the WAL segment").unwrap();
        warm_up.commit().unwrap();
        let mut begun_before = db.begin_transaction().unwrap();
        begun_before.write(b"begun before the failure").unwrap();
        let mut failing = db.begin_transaction().unwrap();
        failing.write(&vec![0x33; size]).unwrap();
        quiesce(&fs);
        fs.inject(
            Operation::Sync,
            fs.operation_count(Operation::Sync),
            FaultKind::Error(std::io::ErrorKind::StorageFull),
        );
        let first = failing.commit().unwrap_err();
        let what = format!("a {size}-byte blob");
        let kind = |err: &Error| match err {
            Error::Io { source, .. } => Some(source.kind()),
            _ => None,
        };
        assert_eq!(
            kind(&first),
            Some(std::io::ErrorKind::StorageFull),
            "{what}: {first}"
        );
        let first_message = first.to_string();
        assert!(
            first_message.contains("injected"),
            "{what}: {first_message}"
        );

        let later = [
            (
                "a write of a transaction begun before",
                begun_before.write(b"more").map(drop).unwrap_err(),
            ),
            (
                "the commit of that transaction",
                begun_before.commit().map(drop).unwrap_err(),
            ),
            (
                "a write of a new transaction",
                db.begin_transaction()
                    .unwrap()
                    .write(b"after")
                    .map(drop)
                    .unwrap_err(),
            ),
            (
                "the commit of an empty transaction",
                db.begin_transaction()
                    .unwrap()
                    .commit()
                    .map(drop)
                    .unwrap_err(),
            ),
        ];
        for (call, err) in later {
            assert_eq!(
                kind(&err),
                Some(std::io::ErrorKind::StorageFull),
                "{what}, {call}: {err}"
            );
            assert!(
                err.to_string().contains(&first_message),
                "{what}, {call}: {err} does not mention the first failure, {first_message:?}"
            );
        }
        fs.clear_faults();
        drop(db);
    }
}
