//! After `shutdown`, every call on the log fails cleanly, including the
//! commit of an entry begun before it: nothing is acknowledged by a log
//! that was shut down. `read_at` alone still reads what was committed.

use std::collections::BTreeSet;
use std::io::{self, Read};
use std::time::Duration;

use okaywal::{ChunkRecord, EntryId, LogVoid, WriteAheadLog};
use testkit::recorder::Recorder;

fn read_back(log: &WriteAheadLog, record: &ChunkRecord) -> io::Result<Vec<u8>> {
    let mut reader = log.read_at(record.position)?;
    let mut data = Vec::new();
    reader.read_to_end(&mut data)?;
    assert!(reader.crc_is_valid()?);
    Ok(data)
}

/// After `shutdown`, every call on the log reports an error (none panics
/// or hangs), and nothing written after it is acknowledged.
#[test]
fn calls_after_shutdown_fail_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let log = WriteAheadLog::recover(dir.path(), LogVoid).unwrap();
    let mut kept = log.begin_entry().unwrap();
    let kept_record = kept.write_chunk(b"kept").unwrap();
    let kept_id = kept.commit().unwrap();
    let clone = log.clone();
    let mut late = log.begin_entry().unwrap();
    late.write_chunk(b"begun before shutdown").unwrap();
    let mut writing = log.begin_entry().unwrap();
    let mut rolled = log.begin_entry().unwrap();
    rolled.write_chunk(b"rolled back after shutdown").unwrap();

    clone.shutdown().unwrap();

    assert!(writing.write_chunk(b"small").is_err());
    assert!(writing.write_chunk(&vec![1; 200_000]).is_err());
    assert!(writing.begin_chunk(10).is_err());
    assert!(writing.commit().is_err());
    rolled.rollback().unwrap();

    for error in [
        log.begin_entry().err(),
        log.sync().err(),
        log.checkpoint_active().err(),
    ] {
        let error = error.expect("a call after shutdown succeeded");
        assert_eq!(error.kind(), io::ErrorKind::BrokenPipe, "{error}");
    }
    let mut follower = log.entries_from(EntryId(0));
    assert!(matches!(follower.next(), Some(Err(_))));
    assert!(follower.next_timeout(Duration::from_secs(5)).is_err());
    let _ = log.stats();
    let late_id = late.id();
    let committed = late.commit();
    assert!(
        committed.is_err(),
        "entry {late_id} was acknowledged after the log was shut down"
    );
    // Reading what was committed before still works, as documented.
    assert_eq!(read_back(&log, &kept_record).unwrap(), b"kept");
    // Every handle goes before the reopen: a follower keeps the log open
    // (and locked) as a clone does.
    drop(follower);
    drop(clone);
    drop(log);

    let manager = Recorder::new();
    let log = WriteAheadLog::recover(dir.path(), manager.clone()).unwrap();
    assert_eq!(manager.seen().recovered_ids(), vec![kept_id.0]);
    log.shutdown().unwrap();
}

/// Shutting the log down while other threads commit: every thread ends,
/// and every commit that returned `Ok` is recovered at the next open.
#[test]
fn a_shutdown_racing_committers_keeps_every_acknowledged_commit() {
    let dir = tempfile::tempdir().unwrap();
    // The committers write hundreds of megabytes: keep only the ids.
    let recorder = Recorder {
        ids_only: true,
        ..Recorder::new()
    };
    let log = WriteAheadLog::recover(dir.path(), recorder.clone()).unwrap();
    let acknowledged = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..8_u8)
            .map(|t| {
                let log = &log;
                scope.spawn(move || {
                    let mut acknowledged = Vec::new();
                    for i in 0_u32.. {
                        let Ok(mut entry) = log.begin_entry() else {
                            break;
                        };
                        let data = vec![t; 1 + (i as usize * 7919) % 200_000];
                        if entry.write_chunk(&data).is_err() {
                            break;
                        }
                        let result = if i % 2 == 0 {
                            entry.commit()
                        } else {
                            entry.commit_buffered()
                        };
                        if let Ok(id) = result {
                            acknowledged.push(id.0);
                        }
                    }
                    acknowledged
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        let _ = log.shutdown();
        threads
            .into_iter()
            .flat_map(|thread| thread.join().unwrap())
            .collect::<Vec<u64>>()
    });
    drop(log);
    assert!(!acknowledged.is_empty());
    // Checkpointed before the shutdown, or recovered after it.
    let log = WriteAheadLog::recover(dir.path(), recorder.clone()).unwrap();
    let seen: BTreeSet<u64> = {
        let seen = recorder.seen();
        let recovered = seen.recovered_ids().into_iter();
        recovered.chain(seen.checkpointed_ids()).collect()
    };
    for id in &acknowledged {
        assert!(seen.contains(id), "acknowledged entry {id} was lost");
    }
    log.shutdown().unwrap();
}
