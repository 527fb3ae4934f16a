//! Durations a caller passes to mean "no limit" (`Duration::MAX`) must not
//! overflow the clock: not in `LogEntries::next_timeout`, and not in the
//! background sync thread that `Configuration::max_unsynced` starts.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use okaywal::{Configuration, LogVoid, WriteAheadLog};

/// `next_timeout` takes any `Duration`, as a caller that wants to wait
/// "forever" would pass: `Duration::MAX` must not panic on the deadline.
#[test]
fn next_timeout_accepts_an_unbounded_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let log = WriteAheadLog::recover(dir.path(), LogVoid).unwrap();
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(b"one").unwrap();
    let first = entry.commit().unwrap();

    let mut reader = log.entries_from(first);
    let got = reader.next_timeout(Duration::MAX).unwrap().unwrap();
    assert_eq!(got.id(), first);
    assert_eq!(got.chunks(), [b"one".to_vec()]);

    // Waiting with no entry ready: a later commit wakes the reader.
    std::thread::scope(|scope| {
        let waiter = scope.spawn(move || reader.next_timeout(Duration::MAX));
        std::thread::sleep(Duration::from_millis(50));
        let mut entry = log.begin_entry().unwrap();
        entry.write_chunk(b"two").unwrap();
        let second = entry.commit().unwrap();
        let got = waiter.join().unwrap().unwrap().unwrap();
        assert_eq!(got.id(), second);
        assert_eq!(got.chunks(), [b"two".to_vec()]);
    });
    log.shutdown().unwrap();
}

/// The background sync thread that `max_unsynced` starts must not panic
/// on a large interval (a caller's way of saying "rarely").
#[test]
fn max_unsynced_accepts_an_unbounded_interval() {
    let panicked = Arc::new(Mutex::new(Vec::<String>::new()));
    let previous = Arc::new(std::panic::take_hook());
    {
        let panicked = panicked.clone();
        let previous = previous.clone();
        std::panic::set_hook(Box::new(move |info| {
            let name = std::thread::current().name().unwrap_or("").to_string();
            if name.starts_with("okaywal") {
                panicked.lock().unwrap().push(format!("{name}: {info}"));
            }
            previous(info);
        }));
    }
    let dir = tempfile::tempdir().unwrap();
    let log = Configuration::default_for(dir.path())
        .max_unsynced(Duration::MAX)
        .open(LogVoid)
        .unwrap();
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(b"buffered").unwrap();
    let id = entry.commit_buffered().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(log.sync().unwrap(), id);
    log.shutdown().unwrap();
    drop(log);
    drop(std::panic::take_hook());
    std::panic::set_hook(Box::new(move |info| previous(info)));
    let panicked = panicked.lock().unwrap();
    assert!(panicked.is_empty(), "{panicked:?}");
}

/// CPU time (user + system, in clock ticks) of this process's threads
/// named `name`, from `/proc/self/task/*/stat`.
fn cpu_ticks_of_threads(name: &str) -> u64 {
    let mut ticks = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid ..." where comm may contain spaces.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        if &stat[open + 1..close] != name {
            continue;
        }
        let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
        // utime and stime are fields 14 and 15 of the whole line, so
        // 12 and 13 after "state" (index 0 here).
        ticks += fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    }
    ticks
}

/// `max_unsynced(Duration::ZERO)` still syncs buffered commits in the
/// background, and the sync thread pauses between passes instead of
/// polling without a break for the life of the log.
#[test]
fn a_zero_interval_syncs_in_the_background_without_spinning() {
    let dir = tempfile::tempdir().unwrap();
    let log = Configuration::default_for(dir.path())
        .max_unsynced(Duration::ZERO)
        .open(LogVoid)
        .unwrap();
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(b"buffered").unwrap();
    entry.commit_buffered().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while log.stats().syncs == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        log.stats().syncs > 0,
        "the buffered commit was never synced"
    );

    // Idle for a second: a thread polling without pause burns most of it.
    let ticks_per_second = 100; // USER_HZ on Linux
    let before = cpu_ticks_of_threads("okaywal-sync");
    std::thread::sleep(Duration::from_secs(1));
    let used = cpu_ticks_of_threads("okaywal-sync") - before;
    assert!(
        used * 4 < ticks_per_second,
        "the sync thread used {used} ticks of CPU in one idle second"
    );
    log.shutdown().unwrap();
}
