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
