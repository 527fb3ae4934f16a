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

/// Runs `body` on a thread of its own and fails the test if it has not
/// finished within 30 s: a call that hangs fails instead of hanging the
/// test run.
fn within_30_s<T: Send + 'static>(what: &str, body: impl FnOnce() -> T + Send + 'static) -> T {
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(body());
    });
    finished
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("{what} did not return within 30 s"))
}

#[test]
fn checkpoint_active_refuses_to_wait_for_an_entry_the_calling_thread_holds_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    within_30_s("checkpoint_active with an entry held open", move || {
        let log = Configuration::default_for(&path).open(LogVoid).unwrap();
        let mut committed = log.begin_entry().unwrap();
        committed.write_chunk(b"committed").unwrap();
        committed.commit().unwrap();
        let mut open = log.begin_entry().unwrap();
        open.write_chunk(b"held open").unwrap();
        let open_id = open.id();

        let err = log.checkpoint_active().unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::WouldBlock, "{err}");
        let message = err.to_string();
        assert!(
            message.contains("holds entry") && message.contains(&open_id.to_string()),
            "{message}"
        );
        assert!(message.contains("segment"), "{message}");

        // Nothing was sealed or broken: the entry commits, and then the
        // checkpoint goes through.
        open.write_chunk(b"more").unwrap();
        open.commit().unwrap();
        log.checkpoint_active().unwrap();
        log.shutdown().unwrap();
    });
}

#[test]
fn checkpoint_active_goes_through_once_the_held_entry_is_rolled_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    within_30_s("checkpoint_active after a rollback", move || {
        let log = Configuration::default_for(&path).open(LogVoid).unwrap();
        let mut open = log.begin_entry().unwrap();
        open.write_chunk(b"abandoned").unwrap();
        assert!(log.checkpoint_active().is_err());
        open.rollback().unwrap();
        log.checkpoint_active().unwrap();
        log.shutdown().unwrap();
    });
}

/// An entry that another thread holds open is waited for: that thread can
/// finish it.
#[test]
fn checkpoint_active_waits_for_an_entry_another_thread_holds_open() {
    let dir = tempfile::tempdir().unwrap();
    let log = Configuration::default_for(dir.path())
        .open(LogVoid)
        .unwrap();
    let (begun, wait_begun) = mpsc::channel();
    let (finish, wait_finish) = mpsc::channel::<()>();
    let holder = {
        let log = log.clone();
        std::thread::spawn(move || {
            let mut open = log.begin_entry().unwrap();
            open.write_chunk(b"held by another thread").unwrap();
            begun.send(()).unwrap();
            wait_finish.recv().unwrap();
            open.commit().unwrap();
        })
    };
    wait_begun.recv().unwrap();
    let checkpointing = log.clone();
    let (checkpointed, wait_checkpointed) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = checkpointed.send(checkpointing.checkpoint_active());
    });
    // Still waiting while the other thread holds its entry (no error).
    assert!(wait_checkpointed
        .recv_timeout(Duration::from_millis(200))
        .is_err());
    finish.send(()).unwrap();
    holder.join().unwrap();
    let result = wait_checkpointed
        .recv_timeout(Duration::from_secs(30))
        .expect("checkpoint_active did not return within 30 s of the entry's commit");
    result.unwrap();
    log.shutdown().unwrap();
}

/// An entry begun in the active segment after everything in it was
/// written is not covered when that segment holds no records: the
/// checkpoint of the earlier segments goes through.
#[test]
fn an_entry_open_in_an_empty_active_segment_does_not_block_checkpoint_active() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    within_30_s("checkpoint_active with an empty entry open", move || {
        let log = Configuration::default_for(&path).open(LogVoid).unwrap();
        let mut first = log.begin_entry().unwrap();
        first.write_chunk(b"committed").unwrap();
        first.commit().unwrap();
        log.checkpoint_active().unwrap();
        let open = log.begin_entry().unwrap();
        log.checkpoint_active().unwrap();
        open.rollback().unwrap();
        log.shutdown().unwrap();
    });
}

/// An `EntryWriter` moved to another thread counts as that thread's once
/// it is used there: `checkpoint_active` on that thread refuses to wait
/// for it (instead of waiting forever), and the thread that began it and
/// gave it away may wait for it.
#[test]
fn an_entry_moved_to_another_thread_is_held_by_the_thread_that_uses_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    within_30_s("checkpoint_active with a moved entry", move || {
        let log = Configuration::default_for(&path).open(LogVoid).unwrap();
        let mut before = log.begin_entry().unwrap();
        before.write_chunk(b"committed").unwrap();
        before.commit().unwrap();

        // Begun here, used and checkpointed there: refused at once.
        let entry = log.begin_entry().unwrap();
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let mut entry = entry;
                    entry.write_chunk(b"moved").unwrap();
                    let err = log.checkpoint_active().unwrap_err();
                    assert_eq!(err.kind(), std::io::ErrorKind::WouldBlock, "{err}");
                    entry.commit().unwrap();
                })
                .join()
                .unwrap();
        });

        // Begun here and given away: this thread waits for it, and the
        // checkpoint goes through once the other thread commits it.
        let entry = log.begin_entry().unwrap();
        let (used, used_there) = mpsc::channel();
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let mut entry = entry;
                entry.write_chunk(b"given away").unwrap();
                used.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(300));
                entry.commit().unwrap();
            });
            used_there.recv().unwrap();
            log.checkpoint_active().unwrap();
        });
        log.shutdown().unwrap();
    });
}
