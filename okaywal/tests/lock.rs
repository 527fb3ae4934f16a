//! A log is open in one process at a time: another process that opens the
//! same directory gets an error naming the lock file, and opens it once
//! the first has let go (a killed process lets go when the kernel reaps it).

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use okaywal::{LogVoid, WriteAheadLog};

const CHILD_ENV: &str = "OKAYWAL_LOCK_CHILD_DIR";

/// Runs only inside the child process: opens the log, says so, and holds
/// it until its stdin closes.
#[test]
fn child_holding_the_log() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let log = WriteAheadLog::recover(&dir, LogVoid).expect("child opens the log");
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(b"from the child").unwrap();
    entry.commit().unwrap();
    println!("OPEN");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    log.shutdown().unwrap();
}

/// Starts a child that holds the log open in `dir`; returns once it has.
fn child_holding(dir: &Path) -> Child {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_holding_the_log",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the child");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for line in lines.by_ref() {
        if line.expect("reading the child's output").contains("OPEN") {
            // Keeps reading, so the child's last words never hit a closed pipe.
            std::thread::spawn(move || lines.for_each(drop));
            return child;
        }
    }
    let status = child.wait();
    panic!("the child exited before opening the log: {status:?}");
}

#[test]
fn a_second_process_cannot_open_a_log_that_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = child_holding(dir.path());

    let err = WriteAheadLog::recover(dir.path(), LogVoid).expect_err("opened an open log");
    assert_eq!(err.kind(), ErrorKind::WouldBlock, "{err}");
    assert!(
        err.to_string().contains("okaywal.lock") && err.to_string().contains("another process"),
        "{err}"
    );

    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    let log = WriteAheadLog::recover(dir.path(), LogVoid).expect("opens once the child is done");
    log.shutdown().unwrap();
}

#[test]
fn a_killed_holder_lets_go() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = child_holding(dir.path());
    child.kill().unwrap();
    // Not reaped yet on purpose: the open waits for the kernel to tear the
    // child down.
    let log = WriteAheadLog::recover(dir.path(), LogVoid).expect("opens after the kill");
    log.shutdown().unwrap();
    child.wait().unwrap();
}

/// An open for writing that is refused before it changes anything (here a
/// key for a log written without one) leaves the directory as it found
/// it: a lock file it created goes again. One that was there stays.
#[test]
fn a_refused_open_leaves_no_lock_file_behind() {
    let dir = tempfile::tempdir().unwrap();
    let log = WriteAheadLog::recover(dir.path(), LogVoid).unwrap();
    log.shutdown().unwrap();
    drop(log);
    let lock = dir.path().join("okaywal.lock");
    assert!(lock.exists(), "an open leaves its lock file");
    let with_key = || {
        okaywal::Configuration::default_for(dir.path())
            .encryption(okaywal::encryption::StaticKey::new([7; 32]))
            .open(LogVoid)
            .map(drop)
    };

    // Refused with the lock file there: it stays.
    assert!(with_key().is_err());
    assert!(lock.exists(), "a lock file the open did not create went");

    // Refused without it: the open removes the one it created.
    std::fs::remove_file(&lock).unwrap();
    let names = |dir: &Path| {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        names
    };
    let before = names(dir.path());
    let error = with_key().unwrap_err();
    assert_eq!(error.kind(), ErrorKind::PermissionDenied, "{error}");
    assert_eq!(names(dir.path()), before, "the refused open left a file");

    // And the next open works as before.
    WriteAheadLog::recover(dir.path(), LogVoid)
        .unwrap()
        .shutdown()
        .unwrap();
    assert!(lock.exists());
}

/// An open waiting for the lock while its holder removes the lock file
/// (as a refused open does with one it created) does not take the lock on
/// the removed file, which no later open could find: it locks the file
/// the path names. A third open is then kept out.
#[test]
fn a_lock_file_removed_while_an_open_waits_is_locked_anew() {
    use okaywal::fs::{FileSystem, StdFileSystem};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("okaywal.lock");
    let fs = StdFileSystem;
    let first = fs.lock_exclusive(&path).unwrap();
    std::thread::scope(|s| {
        let waiting = s.spawn(|| fs.lock_exclusive(&path));
        // The second open has opened the file and waits on its lock.
        std::thread::sleep(std::time::Duration::from_millis(300));
        std::fs::remove_file(&path).unwrap();
        drop(first);
        let second = waiting.join().unwrap().expect("the waiting open locks");
        assert!(path.exists(), "the path names no lock file");
        let third = fs.lock_exclusive(&path);
        assert!(
            matches!(&third, Err(e) if e.kind() == ErrorKind::WouldBlock),
            "a third open got the lock while the second holds it: {third:?}"
        );
        drop(second);
    });
}
