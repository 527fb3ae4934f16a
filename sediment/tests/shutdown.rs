//! After one handle shuts the store down, every call on another handle
//! and on a transaction begun before fails with `Error::ShutDown`.

use sediment::{Database, Error, SequenceId};

/// After one handle shuts the store down, every call on another handle,
/// and on a transaction begun before, fails with an error (no panic), and
/// nothing that transaction did survives a reopen.
#[test]
fn calls_after_shutdown_fail_cleanly_and_leave_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::recover(dir.path()).unwrap();
    let mut tx = db.begin_transaction().unwrap();
    let kept = tx.write(b"kept").unwrap();
    tx.set_embedded_header(Some(kept)).unwrap();
    tx.commit().unwrap();

    let other = db.clone();
    let mut late = other.begin_transaction().unwrap();
    let late_blob = late.write(b"written before shutdown").unwrap();
    db.shutdown().unwrap();

    assert!(matches!(other.get(kept), Err(Error::ShutDown)));
    assert!(matches!(other.read(kept), Err(Error::ShutDown)));
    assert!(matches!(other.begin_transaction(), Err(Error::ShutDown)));
    assert!(matches!(
        other.commit_log(SequenceId(0)),
        Err(Error::ShutDown)
    ));
    assert!(other.verify().is_err());
    assert!(late.write(b"after shutdown").is_err());
    assert!(late.archive(kept).is_err());
    assert!(matches!(
        late.set_embedded_header(None),
        Err(Error::ShutDown)
    ));
    assert!(matches!(
        late.checkpoint_to(SequenceId(0)),
        Err(Error::ShutDown)
    ));
    assert!(late.commit().is_err());
    assert!(matches!(other.clone().shutdown(), Err(Error::ShutDown)));
    drop(other);

    let db = Database::recover(dir.path()).unwrap();
    assert_eq!(db.get(kept).unwrap().as_deref(), Some(&b"kept"[..]));
    assert_eq!(db.embedded_header(), Some(kept));
    if late_blob != kept {
        assert_eq!(db.get(late_blob).unwrap(), None);
    }
    db.verify().unwrap();
    db.shutdown().unwrap();
}

/// Shutting the store down while other handles commit: every thread ends
/// (no hang, no panic), every commit that returned `Ok` is present after
/// reopening, and the store verifies clean.
#[test]
fn a_shutdown_racing_committers_keeps_every_acknowledged_commit() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::recover(dir.path()).unwrap();
    let threads: Vec<_> = (0..4_u8)
        .map(|t| {
            let db = db.clone();
            std::thread::spawn(move || {
                let mut acknowledged = Vec::new();
                for i in 0_u32.. {
                    let data = vec![t; 10 + (i as usize * 97) % 90_000];
                    let Ok(mut tx) = db.begin_transaction() else {
                        break;
                    };
                    let Ok(id) = tx.write(&data) else { break };
                    if tx.commit().is_ok() {
                        acknowledged.push((id, data));
                    }
                }
                acknowledged
            })
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let _ = db.shutdown();
    let acknowledged: Vec<_> = threads
        .into_iter()
        .flat_map(|thread| thread.join().unwrap())
        .collect();
    assert!(!acknowledged.is_empty());
    let db = Database::recover(dir.path()).unwrap();
    for (id, data) in &acknowledged {
        assert_eq!(db.get(*id).unwrap().as_ref(), Some(data), "{id}");
    }
    db.verify().unwrap();
    db.shutdown().unwrap();
}
