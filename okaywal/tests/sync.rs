//! `WriteAheadLog::sync` returns the highest entry id committed before the
//! call, and entries recovered at open were committed before it too.

use okaywal::{EntryId, LogVoid, WriteAheadLog};
use testkit::recorder::Recorder;

/// `sync` returns the highest entry id committed before the call; entries
/// recovered at open were committed before it too.
#[test]
fn sync_after_a_reopen_covers_the_recovered_entries() {
    let dir = tempfile::tempdir().unwrap();
    let log = WriteAheadLog::recover(dir.path(), LogVoid).unwrap();
    let mut last = EntryId(0);
    for i in 0..3_u8 {
        let mut entry = log.begin_entry().unwrap();
        entry.write_chunk(&[i; 10]).unwrap();
        last = entry.commit().unwrap();
    }
    // A rolled-back entry after them is no committed entry.
    let mut rolled = log.begin_entry().unwrap();
    rolled.write_chunk(b"rolled back").unwrap();
    rolled.rollback().unwrap();
    log.shutdown().unwrap();
    drop(log);

    // Checkpoints fail, so that every segment stays live.
    let manager = Recorder::refusing();
    let log = WriteAheadLog::recover(dir.path(), manager.clone()).unwrap();
    assert_eq!(manager.seen().recovered_ids().last(), Some(&last.0));
    assert_eq!(log.sync().unwrap(), last, "after reopening");
    drop(manager);
    log.shutdown().unwrap();
    drop(log);

    // With every segment checkpointed and recycled, what an earlier run
    // checkpointed counts as durable.
    let log = WriteAheadLog::recover(dir.path(), LogVoid).unwrap();
    log.checkpoint_active().unwrap();
    log.shutdown().unwrap();
    drop(log);
    let log = WriteAheadLog::recover(dir.path(), LogVoid).unwrap();
    let synced = log.sync().unwrap();
    assert!(
        synced >= last,
        "sync returned {synced} after reopening; {last} was committed"
    );
    log.shutdown().unwrap();
}
