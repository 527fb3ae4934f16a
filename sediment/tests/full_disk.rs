//! A store left by a crash on a full disk still opens for writing, when
//! archiving and checkpointing is how its user frees space. A stratum (or
//! index) no checkpoint has written yet has only its first header copy; an
//! open for writing copies it into the second, which may need a block the
//! disk no longer has (the copy's place can be a hole in the file). That
//! copy waits for the first checkpoint instead of failing the open; a
//! header that was checkpointed still fails it, since its second copy
//! holds state worth keeping twice. A blob whose own write fails on a
//! full disk fails only its transaction.

use std::path::Path;

use okaywal::fs::{CrashFileSystem, FaultKind, Operation, PowerLoss};
use sediment::format::stratum_slot_size;
use sediment::{Config, Database, GrainId};

const DIR: &str = "/db";

fn open(fs: &CrashFileSystem) -> sediment::Result<Database> {
    Config::for_directory(DIR).file_system(fs.clone()).open()
}

/// Makes the next `count` writes fail with "no space left on device".
fn fill_disk(fs: &CrashFileSystem, count: u64) {
    let next = fs.operation_count(Operation::Write);
    for nth in next..next + count {
        fs.inject(
            Operation::Write,
            nth,
            FaultKind::Error(std::io::ErrorKind::StorageFull),
        );
    }
}

/// Whether copy 1 of `id`'s stratum header holds anything.
fn second_copy_written(fs: &CrashFileSystem, id: GrainId) -> bool {
    let path = Path::new(DIR).join(format!("stratum-{}-{}", id.basin(), id.stratum()));
    let bytes = fs.contents(&path).unwrap();
    let slot = stratum_slot_size(id.basin()) as usize;
    bytes
        .get(slot..2 * slot)
        .is_some_and(|copy| copy.iter().any(|b| *b != 0))
}

#[test]
fn a_new_stratum_without_its_second_header_copy_opens_on_a_full_disk() {
    let fs = CrashFileSystem::new();
    let db = open(&fs).unwrap();
    // Written straight into a new stratum, then a crash before any
    // checkpoint: the stratum has its first header copy only.
    let blob = vec![0x42_u8; 200_000];
    let mut tx = db.begin_transaction().unwrap();
    let id = tx.write(&blob).unwrap();
    tx.commit().unwrap();
    fs.power_loss(PowerLoss::Clean);
    drop(db);
    assert!(!second_copy_written(&fs, id));

    // Every write of the opening's header repairs fails; the WAL's own
    // writes come after them and succeed.
    fill_disk(&fs, 2);
    let db = open(&fs).unwrap();
    fs.clear_faults();
    assert_eq!(db.get(id).unwrap().as_deref(), Some(&blob[..]));
    db.shutdown().unwrap();
    // The checkpoint at shutdown wrote both copies.
    assert!(second_copy_written(&fs, id));
    let db = open(&fs).unwrap();
    db.verify().unwrap();
    assert_eq!(db.get(id).unwrap().as_deref(), Some(&blob[..]));
    db.shutdown().unwrap();
}

#[test]
fn a_checkpointed_header_whose_second_copy_is_gone_still_fails_on_a_full_disk() {
    let fs = CrashFileSystem::new();
    let db = open(&fs).unwrap();
    let mut tx = db.begin_transaction().unwrap();
    let id = tx.write(&vec![7_u8; 200_000]).unwrap();
    tx.commit().unwrap();
    db.shutdown().unwrap();
    assert!(second_copy_written(&fs, id));
    // The second copy decays to zeros.
    let path = Path::new(DIR).join(format!("stratum-{}-{}", id.basin(), id.stratum()));
    let mut bytes = fs.contents(&path).unwrap();
    let slot = stratum_slot_size(id.basin()) as usize;
    bytes[slot..2 * slot].fill(0);
    assert!(fs.set_contents(&path, bytes));

    fill_disk(&fs, 2);
    let Err(err) = open(&fs) else {
        panic!("the repair's failure should fail the open");
    };
    assert!(err.to_string().contains("repairing a header copy"), "{err}");
    fs.clear_faults();
    let db = open(&fs).unwrap();
    db.verify().unwrap();
    db.shutdown().unwrap();
}

/// A blob written straight into its grain whose write fails on a full
/// disk fails its own transaction only: nothing of it was committed, so
/// the store goes on taking commits, and a reopen finds every blob that
/// was acknowledged and none of the failed one.
#[test]
fn a_failed_blob_write_fails_only_its_own_transaction() {
    let fs = CrashFileSystem::new();
    let db = open(&fs).unwrap();
    let mut tx = db.begin_transaction().unwrap();
    let before = tx.write(b"before the disk filled").unwrap();
    tx.commit().unwrap();

    // Large enough to be written into its grain by `write` itself.
    let large = vec![0x5a_u8; 300_000];
    let mut tx = db.begin_transaction().unwrap();
    fill_disk(&fs, 1);
    let err = tx.write(&large).unwrap_err();
    fs.clear_faults();
    assert!(
        matches!(&err, sediment::Error::Io { source, .. }
            if source.kind() == std::io::ErrorKind::StorageFull),
        "{err}"
    );
    drop(tx);

    let mut tx = db.begin_transaction().unwrap();
    let after = tx.write(b"after space was freed").unwrap();
    let large_after = tx.write(&large).unwrap();
    tx.commit().unwrap();
    assert_eq!(
        db.get(before).unwrap().as_deref(),
        Some(&b"before the disk filled"[..])
    );
    db.shutdown().unwrap();

    let db = open(&fs).unwrap();
    db.verify().unwrap();
    assert_eq!(
        db.get(before).unwrap().as_deref(),
        Some(&b"before the disk filled"[..])
    );
    assert_eq!(
        db.get(after).unwrap().as_deref(),
        Some(&b"after space was freed"[..])
    );
    assert_eq!(db.get(large_after).unwrap().as_deref(), Some(&large[..]));
    db.shutdown().unwrap();
}
