//! An entry held open while the same thread (or others) keeps writing:
//! the open entry keeps its segment from being checkpointed, but writing
//! goes on instead of waiting for a checkpoint that the open entry itself
//! holds back.

use std::sync::mpsc;
use std::time::Duration;

use okaywal::{Configuration, LogVoid};

#[test]
fn writing_goes_on_while_an_older_entry_stays_open() {
    let dir = tempfile::tempdir().unwrap();
    let (done, finished) = mpsc::channel();
    let path = dir.path().to_path_buf();
    std::thread::spawn(move || {
        let log = Configuration::default_for(&path)
            .preallocate_bytes(16 * 1024)
            .checkpoint_after_bytes(16 * 1024)
            .open(LogVoid)
            .unwrap();
        let mut open = log.begin_entry().unwrap();
        open.write_chunk(b"held open").unwrap();
        // Many segments' worth of entries from the same thread.
        for i in 0..200_u32 {
            let mut entry = log.begin_entry().unwrap();
            entry.write_chunk(&[i as u8; 4000]).unwrap();
            entry.commit().unwrap();
        }
        open.commit().unwrap();
        log.checkpoint_active().unwrap();
        log.shutdown().unwrap();
        done.send(()).unwrap();
    });
    assert!(
        finished.recv_timeout(Duration::from_secs(30)).is_ok(),
        "writing stalled behind a checkpoint that the open entry holds back"
    );
}
