//! `verify` on a store that other threads are writing to reports only real
//! damage: blobs committed, archived and freed while it runs are not
//! reported as problems.

use std::sync::atomic::{AtomicBool, Ordering};

use sediment::Config;

#[test]
fn verify_while_other_threads_commit_reports_no_false_problems() {
    let dir = tempfile::tempdir().unwrap();
    let db = Config::for_directory(dir.path())
        .wal(|wal| {
            wal.checkpoint_after_bytes(256 << 10)
                .preallocate_bytes(256 << 10)
        })
        .open()
        .unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        for t in 0..3_u8 {
            let (db, stop) = (&db, &stop);
            scope.spawn(move || {
                let mut previous = Vec::new();
                let mut i = 0_usize;
                while !stop.load(Ordering::Acquire) {
                    let mut tx = db.begin_transaction().unwrap();
                    let mut written = Vec::new();
                    for j in 0..4 {
                        let len = (i * 131 + j * 977) % 3000;
                        written.push(tx.write(&vec![t ^ j as u8; len]).unwrap());
                    }
                    for id in previous.drain(..) {
                        tx.archive(id).unwrap();
                    }
                    let sequence = tx.commit().unwrap();
                    previous = written;
                    if i % 3 == 2 {
                        let mut tx = db.begin_transaction().unwrap();
                        if tx.checkpoint_to(sequence).is_ok() {
                            tx.commit().unwrap();
                        }
                    }
                    i += 1;
                }
            });
        }
        let mut failures = Vec::new();
        for _ in 0..60 {
            std::thread::sleep(std::time::Duration::from_millis(5));
            if let Err(err) = db.verify() {
                failures.push(err.to_string());
            }
        }
        assert!(db.last_committed().0 > 60, "{:?}", db.last_committed());
        stop.store(true, Ordering::Release);
        assert!(
            failures.is_empty(),
            "{} of 60 runs: {}",
            failures.len(),
            failures[0]
        );
    });
    db.verify().unwrap();
    db.shutdown().unwrap();
}
