//! Following the live log (`entries_from`), with and without buffered
//! entries: what a follower returns survives what the log promises, every
//! committed entry arrives once, whole and in order under jittered I/O,
//! and a rollback that unblocks a waiting follower wakes it.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use okaywal::fs::{CrashFileSystem, FileSystem, OpenMode};
use okaywal::{Configuration, EntryId, LogVoid, WriteAheadLog};

mod common;

use common::follow::{follow, ChunkRecorder as Recorder, WaitsForReader};
use common::hooks::Hooked;
use common::{jitter_budget, test_seed};

const DIR: &str = "/log";

/// A rename that gives a segment its real name (`wal-<digits>`) waits
/// while `gate` is set, and sets `blocked` when it had to wait.
fn gated_renames(
    disk: &CrashFileSystem,
    gate: &Arc<AtomicBool>,
    blocked: &Arc<AtomicBool>,
) -> Hooked {
    let (gate, blocked) = (gate.clone(), blocked.clone());
    Hooked::renames(disk, move |to: &Path| {
        let name = to.file_name().unwrap().to_str().unwrap();
        let names_segment = name
            .strip_prefix("wal-")
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()));
        while names_segment && gate.load(Ordering::SeqCst) {
            blocked.store(true, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(1));
        }
    })
}

/// What a crash of the process (not of the machine) leaves: every file's
/// visible contents under its visible name. Copied onto a fresh disk.
fn after_process_crash(fs: &CrashFileSystem) -> CrashFileSystem {
    let copy = CrashFileSystem::new();
    copy.create_dir_all(Path::new(DIR)).unwrap();
    for name in fs.list_files(Path::new(DIR)).unwrap() {
        let path = Path::new(DIR).join(&name);
        let bytes = fs.contents(&path).unwrap();
        let file = copy.open(&path, OpenMode::CreateNew).unwrap();
        file.write_all_at(&bytes, 0).unwrap();
        file.sync_data().unwrap();
    }
    copy.sync_dir(Path::new(DIR)).unwrap();
    copy
}

#[test]
fn an_entry_a_follower_returned_with_buffered_entries_survives_a_process_crash() {
    let disk = CrashFileSystem::new();
    let gate = Arc::new(AtomicBool::new(true));
    let blocked = Arc::new(AtomicBool::new(false));
    let fs = gated_renames(&disk, &gate, &blocked);
    // A fresh log: its first segment keeps its spare name until a sync.
    let log = Configuration::default_for(DIR)
        .file_system(fs.clone())
        .preallocate_bytes(64 * 1024)
        .checkpoint_after_bytes(64 * 1024)
        .open(LogVoid)
        .unwrap();
    std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            let mut entry = log.begin_entry().unwrap();
            entry.write_chunk(b"replicated").unwrap();
            entry.commit_buffered().unwrap().0
        });
        let mut reader = log.entries_from(EntryId(1)).include_buffered();
        let deadline = Instant::now() + Duration::from_secs(1);
        let seen = loop {
            if let Some(entry) = reader.next_timeout(Duration::from_millis(10)).unwrap() {
                break Some(entry);
            }
            if Instant::now() > deadline {
                break None;
            }
        };
        let blocked = blocked.load(Ordering::SeqCst);
        let snapshot = after_process_crash(&disk);
        gate.store(false, Ordering::SeqCst);
        let id = writer.join().unwrap();
        let Some(seen) = seen else {
            // Not returned while its file was unnamed: once named, it is.
            let entry = reader
                .next_timeout(Duration::from_secs(10))
                .unwrap()
                .expect("after naming");
            assert_eq!(entry.id().0, id);
            return;
        };
        assert_eq!(seen.id().0, id);
        println!(
            "files at crash: {:?}",
            snapshot.list_files(Path::new(DIR)).unwrap()
        );
        let recorder = Recorder::default();
        let reopened = Configuration::default_for(DIR)
            .file_system(snapshot)
            .open(recorder.clone())
            .unwrap();
        let recovered: Vec<u64> = recorder.recovered.lock().unwrap().keys().copied().collect();
        reopened.shutdown().unwrap();
        assert!(
            recovered.contains(&id),
            "the reader returned entry {id} (rename blocked: {blocked}) but a process crash then loses it; recovered {recovered:?}"
        );
    });
    drop(log);
}

fn payload(id: u64, c: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64).wrapping_mul(31) as u8 ^ (id as u8) ^ (c as u8 * 17))
        .collect()
}

/// (id, chunks) or None for rolled back.
fn write_one(log: &WriteAheadLog, rng: &mut u64) -> Option<(u64, Vec<Vec<u8>>)> {
    let mut next = || {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        *rng
    };
    let mut entry = log.begin_entry().unwrap();
    let id = entry.id().0;
    let mut chunks = Vec::new();
    for c in 0..(1 + next() % 3) {
        let kind = next() % 10;
        let len = match kind {
            0 => 65 * 1024 + (next() % 20_000) as usize,
            1 => 20_000 + (next() % 30_000) as usize,
            _ => (next() % 700) as usize,
        };
        let data = payload(id, c, len);
        if next() % 6 == 0 {
            use std::io::Write;
            let mut writer = entry.begin_chunk(len as u32).unwrap();
            for piece in data.chunks(7_000) {
                writer.write_all(piece).unwrap();
                if next() % 4 == 0 {
                    std::thread::yield_now();
                }
            }
            if next() % 40 == 0 {
                drop(writer); // abandoned: the entry cannot commit
                let _ = entry.commit_buffered();
                return None;
            }
            writer.finish().unwrap();
        } else {
            entry.write_chunk(&data).unwrap();
        }
        chunks.push(data);
    }
    match next() % 6 {
        0 => {
            entry.rollback().unwrap();
            None
        }
        1 => {
            entry.commit().unwrap();
            Some((id, chunks))
        }
        _ => {
            entry.commit_buffered().unwrap();
            Some((id, chunks))
        }
    }
}

#[test]
fn with_jittered_io_a_buffered_follower_sees_each_committed_entry_once_whole_in_order() {
    let seed = test_seed("jittered_include_buffered_reader") | 1;
    let secs = jitter_budget(3).as_secs().max(1);
    let disk = CrashFileSystem::new();
    disk.jitter(seed, Duration::from_micros(150));
    let reader_at = Arc::new(AtomicU64::new(0));
    let log = Configuration::default_for(DIR)
        .file_system(disk.clone())
        .preallocate_bytes(192 * 1024)
        .checkpoint_after_bytes(192 * 1024)
        .buffer_bytes(8 * 1024)
        .open(WaitsForReader {
            reader_at: reader_at.clone(),
            ..WaitsForReader::default()
        })
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (seen, committed) = std::thread::scope(|scope| {
        let reader = {
            let log = log.clone();
            let stop = stop.clone();
            scope.spawn(move || {
                let entries = log.entries_from(EntryId(1)).include_buffered();
                follow(
                    entries,
                    &reader_at,
                    Some(&stop),
                    40,
                    Duration::from_millis(25),
                )
            })
        };
        let until = Instant::now() + Duration::from_secs(secs);
        let writers: Vec<_> = (0..3_u64)
            .map(|t| {
                let log = &log;
                scope.spawn(move || {
                    let mut rng = seed.wrapping_mul(t * 2 + 1) | 1;
                    let mut done = Vec::new();
                    while Instant::now() < until {
                        if let Some(entry) = write_one(log, &mut rng) {
                            done.push(entry);
                        }
                    }
                    done
                })
            })
            .collect();
        let mut committed: Vec<(u64, Vec<Vec<u8>>)> = writers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect();
        stop.store(true, Ordering::SeqCst);
        committed.sort_by_key(|(id, _)| *id);
        (reader.join().unwrap(), committed)
    });
    let seen_ids: Vec<u64> = seen.iter().map(|(id, _)| *id).collect();
    let committed_ids: Vec<u64> = committed.iter().map(|(id, _)| *id).collect();
    println!(
        "{} committed, {} seen, stats {:?}",
        committed.len(),
        seen.len(),
        log.stats()
    );
    assert_eq!(seen_ids, committed_ids, "seed {seed}");
    for ((id, a), (_, b)) in seen.iter().zip(&committed) {
        assert!(a == b, "entry {id} content differs, seed {seed}");
    }
    log.shutdown().unwrap();
}

fn rollback_wakes(include_buffered: bool) -> Duration {
    let disk = CrashFileSystem::new();
    let log = Configuration::default_for(DIR)
        .file_system(disk)
        .open(LogVoid)
        .unwrap();
    log.begin_entry().unwrap().commit().unwrap(); // names the segment
    let mut open = log.begin_entry().unwrap();
    open.write_chunk(b"x").unwrap();
    let first = open.id();
    let mut later = log.begin_entry().unwrap();
    later.write_chunk(b"y").unwrap();
    if include_buffered {
        later.commit_buffered().unwrap();
    } else {
        later.commit().unwrap();
    }
    let mut reader = log.entries_from(first);
    if include_buffered {
        reader = reader.include_buffered();
    }
    assert!(reader.next().is_none(), "held back by the open entry");
    std::thread::scope(|scope| {
        let waiter = scope.spawn(move || {
            let start = Instant::now();
            let got = reader.next_timeout(Duration::from_secs(3)).unwrap();
            assert!(got.is_some());
            start.elapsed()
        });
        std::thread::sleep(Duration::from_millis(100));
        open.rollback().unwrap();
        waiter.join().unwrap()
    })
}

#[test]
fn a_rollback_that_unblocks_a_waiting_follower_wakes_it() {
    let buffered = rollback_wakes(true);
    let durable = rollback_wakes(false);
    println!("include_buffered reader woke after {buffered:?}; default reader after {durable:?}");
    assert!(buffered < Duration::from_secs(1) && durable < Duration::from_secs(1));
}

#[test]
fn a_follower_waiting_for_entries_returns_the_shutdown_error_at_once() {
    for include_buffered in [false, true] {
        let log = Configuration::default_for(DIR)
            .file_system(CrashFileSystem::new())
            .open(LogVoid)
            .unwrap();
        let id = log.begin_entry().unwrap().commit().unwrap();
        let mut reader = log.entries_from(EntryId(id.0 + 1));
        if include_buffered {
            reader = reader.include_buffered();
        }
        let (sent, got) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let _ = sent.send(
                reader
                    .next_timeout(Duration::from_secs(3600))
                    .map(|e| e.is_some()),
            );
        });
        std::thread::sleep(Duration::from_millis(100));
        log.shutdown().unwrap();
        // Nothing was left to sync, so no sync wakes the reader: only the
        // shutdown itself can, and it must, or the reader sleeps an hour.
        let result = got
            .recv_timeout(Duration::from_secs(30))
            .expect("the waiting follower was not woken by the shutdown");
        let err = result.expect_err("a shut-down log has no more entries to give");
        assert_eq!(err.kind(), std::io::ErrorKind::BrokenPipe, "{err}");
        waiter.join().unwrap();
    }
}
