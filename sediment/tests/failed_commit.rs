//! A commit whose WAL sync fails has an unknown outcome: its records may
//! be in the WAL file, and the next open may replay it. Nothing the
//! process does after the failure may make such a transaction read back
//! wrong bytes.

use okaywal::fs::{CrashFileSystem, FaultKind, Operation};
use sediment::{Config, Database};

const DIR: &str = "/db";

fn open(fs: &CrashFileSystem) -> sediment::Result<Database> {
    Config::for_directory(DIR).file_system(fs.clone()).open()
}

#[test]
fn a_blob_whose_commit_failed_never_reads_back_another_transactions_bytes() {
    let fs = CrashFileSystem::new();
    let db = open(&fs).unwrap();
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
    let db = open(&fs).unwrap();
    match db.get(id) {
        Ok(None) => {}
        Ok(Some(bytes)) => assert!(bytes == first, "{id} reads back bytes it never held"),
        Err(err) => panic!("{id} is damaged: {err}"),
    }
    db.verify().unwrap();
    db.shutdown().unwrap();
}
