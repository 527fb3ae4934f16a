//! Durability modes, reading the live log, recovery modes and statistics.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use okaywal::fs::{CrashFileSystem, FaultKind, FileSystem, Operation, PowerLoss};
use okaywal::{Configuration, Durability, EntryId, LogVoid, RecoveryMode, WriteAheadLog};

mod common;

use common::encryption::Encryption;
use common::follow::{follow, ChunkRecorder as Recorder, WaitsForReader};
use common::{jitter_budget, test_seed, Rng};

const DIR: &str = "/log";

fn config(fs: &CrashFileSystem) -> Configuration {
    common::small_log_on(fs)
}

fn payload(id: u64) -> Vec<u8> {
    (0..(id % 700) as usize)
        .map(|i| (i as u64 ^ id) as u8)
        .collect()
}

/// What a single writer did, in order: (id, durability, acknowledged).
type Script = Vec<(u64, Durability, bool)>;

/// One thread commits 60 entries, every third durable, the rest buffered,
/// with a `sync()` now and then.
fn workload(log: &WriteAheadLog) -> (Script, BTreeSet<u64>) {
    let mut script = Vec::new();
    let mut synced = BTreeSet::new();
    for i in 0..60 {
        let Ok(mut entry) = log.begin_entry() else {
            break;
        };
        let id = entry.id().0;
        if entry.write_chunk(&payload(id)).is_err() {
            break;
        }
        let durability = if i % 3 == 0 {
            Durability::Durable
        } else {
            Durability::Buffered
        };
        let ok = entry.commit_with(durability).is_ok();
        script.push((id, durability, ok));
        if !ok {
            break;
        }
        if i % 10 == 9 {
            if log.sync().is_err() {
                break;
            }
            synced.extend(script.iter().filter(|s| s.2).map(|s| s.0));
        }
    }
    (script, synced)
}

/// Recovers after a power loss and checks the crash run of `workload`:
/// bytes intact, every durable or synced entry present, and the suffix
/// property (once an entry is missing, nothing logged after it survives).
fn check_suffix(
    fs: &CrashFileSystem,
    encryption: Encryption,
    script: &Script,
    synced: &BTreeSet<u64>,
    what: &str,
) -> Result<(), String> {
    let recorder = Recorder::default();
    let log = encryption
        .configure(config(fs))
        .open(recorder.clone())
        .map_err(|e| format!("{what}: reopen: {e}"))?;
    let recovered = recorder.recovered.lock().unwrap().clone();
    for (id, chunks) in &recovered {
        if chunks.concat() != payload(*id) {
            return Err(format!("{what}: entry {id} came back with other bytes"));
        }
    }
    for (id, durability, ok) in script {
        if *ok && *durability == Durability::Durable && !recovered.contains_key(id) {
            return Err(format!("{what}: durable entry {id} lost"));
        }
    }
    if let Some(id) = synced.iter().find(|id| !recovered.contains_key(id)) {
        return Err(format!("{what}: synced entry {id} lost"));
    }
    let mut lost = None;
    for (id, _, _) in script {
        match (lost, recovered.contains_key(id)) {
            (None, false) => lost = Some(*id),
            (Some(first), true) => {
                return Err(format!(
                    "{what}: entry {id} survived although {first} before it was lost"
                ))
            }
            _ => {}
        }
    }
    log.shutdown().ok();
    Ok(())
}

/// The suffix property with power cuts at random syncs and writes while
/// the disk delays every operation at random (the background thread's
/// syncs and checkpoints then interleave with the writer in new ways).
#[test]
fn buffered_entries_are_lost_only_as_a_suffix_with_jittered_io() {
    let mut rng = Rng::new(test_seed(
        "buffered_entries_are_lost_only_as_a_suffix_with_jittered_io",
    ));
    let mut next = || rng.next_u64();
    let start = Instant::now();
    let mut failures = Vec::new();
    let (mut runs, mut fired) = (0, 0);
    let budget = jitter_budget(8);
    while start.elapsed() < budget || runs < 20 {
        // Every other run encrypted: the budget is shared.
        let encryption = Encryption::BOTH[runs % 2];
        let fs = CrashFileSystem::new();
        let jitter = next();
        fs.jitter(jitter, Duration::from_micros(150));
        let log = encryption.configure(config(&fs)).open(LogVoid).unwrap();
        let (op, count) = if next() % 2 == 0 {
            (Operation::Sync, 40)
        } else {
            (Operation::Write, 80)
        };
        let at = fs.operation_count(op) + next() % count;
        fs.inject(op, at, FaultKind::PowerOff);
        let (script, synced) = workload(&log);
        fired += usize::from(fs.is_powered_off());
        drop(log);
        fs.jitter(0, Duration::ZERO);
        let policy = match next() % 3 {
            0 => PowerLoss::Clean,
            1 => PowerLoss::TornPrefix,
            _ => PowerLoss::Random(next()),
        };
        fs.power_loss(policy);
        runs += 1;
        let what =
            format!("power cut at {op:?} #{at}, {policy:?}, {encryption:?}, jitter seed {jitter}");
        if let Err(err) = check_suffix(&fs, encryption, &script, &synced, &what) {
            failures.push(err);
        }
    }
    println!(
        "{runs} jittered runs ({fired} cut the power mid-run), {} failures",
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {runs} runs failed:\n{}",
        failures.len(),
        failures[..failures.len().min(5)].join("\n")
    );
    assert!(fired * 2 > runs, "only {fired} of {runs} power cuts fired");
}

#[test]
fn buffered_entries_are_lost_only_as_a_suffix_at_every_sync_point() {
    for encryption in Encryption::BOTH {
        buffered_entries_are_lost_only_as_a_suffix_at_every_sync_point_of(encryption);
    }
}

fn buffered_entries_are_lost_only_as_a_suffix_at_every_sync_point_of(encryption: Encryption) {
    let config = |fs: &CrashFileSystem| encryption.configure(config(fs));
    let count_fs = CrashFileSystem::new();
    let log = config(&count_fs).open(LogVoid).unwrap();
    workload(&log);
    drop(log);
    let syncs = count_fs.operation_count(Operation::Sync);
    let mut points = 0;
    for crash_at in 0..syncs {
        for policy in [
            PowerLoss::Clean,
            PowerLoss::TornPrefix,
            PowerLoss::Random(crash_at),
        ] {
            let fs = CrashFileSystem::new();
            let log = config(&fs).open(LogVoid).unwrap();
            let opened_syncs = fs.operation_count(Operation::Sync);
            fs.inject(
                Operation::Sync,
                opened_syncs + crash_at,
                FaultKind::PowerOff,
            );
            let (script, synced) = workload(&log);
            drop(log);
            fs.power_loss(policy);
            let what = format!("sync point {crash_at}, {policy:?}, {encryption:?}");
            if let Err(err) = check_suffix(&fs, encryption, &script, &synced, &what) {
                panic!("{err}");
            }
            points += 1;
        }
    }
    println!("{points} crash points (sync points × power-loss policies)");
    assert!(points > 20);
}

#[test]
fn buffered_entries_survive_a_process_crash() {
    for encryption in Encryption::BOTH {
        buffered_entries_survive_a_process_crash_of(encryption);
    }
}

fn buffered_entries_survive_a_process_crash_of(encryption: Encryption) {
    let config = |fs: &CrashFileSystem| encryption.configure(config(fs));
    let fs = CrashFileSystem::new();
    let log = config(&fs).open(LogVoid).unwrap();
    let mut ids = Vec::new();
    for _ in 0..40 {
        let mut entry = log.begin_entry().unwrap();
        let id = entry.id().0;
        entry.write_chunk(&payload(id)).unwrap();
        ids.push(entry.commit_buffered().unwrap().0);
    }
    // A process crash: the log is gone without a shutdown, the operating
    // system (the simulated disk's visible contents) keeps what it got.
    drop(log);
    let recorder = Recorder::default();
    let _log = config(&fs).open(recorder.clone()).unwrap();
    let recovered = recorder.recovered.lock().unwrap().clone();
    for id in ids {
        assert_eq!(recovered.get(&id).map(|c| c.concat()), Some(payload(id)));
    }
}

#[test]
fn sync_and_max_unsynced_make_buffered_entries_durable() {
    for background in [false, true] {
        let fs = CrashFileSystem::new();
        let mut configuration = config(&fs);
        if background {
            configuration = configuration.max_unsynced(Duration::from_millis(20));
        }
        let log = configuration.open(LogVoid).unwrap();
        let mut last = 0;
        for _ in 0..25 {
            let mut entry = log.begin_entry().unwrap();
            let id = entry.id().0;
            entry.write_chunk(&payload(id)).unwrap();
            last = entry.commit_buffered().unwrap().0;
        }
        if background {
            std::thread::sleep(Duration::from_millis(200));
        } else {
            assert_eq!(log.sync().unwrap(), EntryId(last));
        }
        fs.inject(
            Operation::Write,
            fs.operation_count(Operation::Write),
            FaultKind::PowerOff,
        );
        drop(log);
        fs.power_loss(PowerLoss::Clean);
        let recorder = Recorder::default();
        let _log = config(&fs).open(recorder.clone()).unwrap();
        let recovered = recorder.recovered.lock().unwrap().clone();
        assert_eq!(recovered.len(), 25, "background sync: {background}");
        assert!(recovered.contains_key(&last));
    }
}

#[test]
fn max_unsynced_bytes_syncs_from_the_committing_thread() {
    let fs = CrashFileSystem::new();
    let log = config(&fs).max_unsynced_bytes(2000).open(LogVoid).unwrap();
    let syncs_before = fs.operation_count(Operation::Sync);
    for _ in 0..10 {
        let mut entry = log.begin_entry().unwrap();
        entry.write_chunk(&[7; 500]).unwrap();
        entry.commit_buffered().unwrap();
    }
    let stats = log.stats();
    assert_eq!(stats.buffered_commits, 10);
    assert!(
        fs.operation_count(Operation::Sync) > syncs_before,
        "no sync happened"
    );
    assert!(stats.syncs >= 2, "{stats:?}");
}

#[test]
fn entries_from_sees_every_durable_entry_once_in_order_while_16_threads_write() {
    let dir = tempfile::tempdir().unwrap();
    let reader_at = Arc::new(AtomicU64::new(0));
    let manager = WaitsForReader {
        reader_at: reader_at.clone(),
        checkpointed: Arc::default(),
    };
    let log = Configuration::default_for(dir.path())
        .preallocate_bytes(64 * 1024)
        .checkpoint_after_bytes(64 * 1024)
        .open(manager.clone())
        .unwrap();
    let committed = Arc::new(Mutex::new(BTreeMap::new()));
    let rolled_back = Arc::new(Mutex::new(BTreeSet::new()));
    let per_thread = 60;
    let seen = std::thread::scope(|scope| {
        let reader = {
            let log = log.clone();
            let reader_at = reader_at.clone();
            scope.spawn(move || {
                let entries = log.entries_from(EntryId(1));
                follow(entries, &reader_at, None, 20, Duration::from_millis(50))
                    .into_iter()
                    .map(|(id, chunks)| (id, chunks.concat()))
                    .collect::<Vec<_>>()
            })
        };
        let writers: Vec<_> = (0..16)
            .map(|t| {
                let (log, committed, rolled_back) = (&log, committed.clone(), rolled_back.clone());
                scope.spawn(move || {
                    for i in 0..per_thread {
                        let mut entry = log.begin_entry().unwrap();
                        let id = entry.id().0;
                        entry.write_chunk(&payload(id)).unwrap();
                        if (t + i) % 9 == 4 {
                            entry.rollback().unwrap();
                            rolled_back.lock().unwrap().insert(id);
                        } else {
                            entry.commit().unwrap();
                            committed.lock().unwrap().insert(id, payload(id));
                        }
                    }
                })
            })
            .collect();
        for writer in writers {
            writer.join().unwrap();
        }
        reader.join().unwrap()
    });
    let ids: Vec<u64> = seen.iter().map(|(id, _)| *id).collect();
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(ids, sorted, "entries out of order or repeated");
    let committed = committed.lock().unwrap();
    assert_eq!(
        ids.len(),
        committed.len(),
        "every committed entry seen once"
    );
    for (id, bytes) in &seen {
        assert_eq!(committed.get(id), Some(bytes), "entry {id}");
    }
    assert!(ids
        .iter()
        .all(|id| !rolled_back.lock().unwrap().contains(id)));
    // Checkpoints happened while reading.
    log.checkpoint_active().unwrap();
    assert!(!manager.checkpointed.lock().unwrap().is_empty());
    // Positions of recycled entries are a clear NotFound.
    let error = log.entries_from(EntryId(1)).next().unwrap().unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::NotFound);
    log.shutdown().unwrap();
}

#[test]
fn a_reader_waiting_at_a_rolled_back_entry_is_not_told_it_lost_entries_when_its_segment_is_recycled(
) {
    let dir = tempfile::tempdir().unwrap();
    let log = Configuration::default_for(dir.path())
        .open(LogVoid)
        .unwrap();
    let mut first = log.begin_entry().unwrap();
    let first_id = first.id();
    first.write_chunk(b"kept").unwrap();
    first.commit().unwrap();
    let mut entries = log.entries_from(first_id);
    let entry = entries.next().unwrap().unwrap();
    assert_eq!(
        (entry.id(), entry.chunks()),
        (first_id, &[b"kept".to_vec()][..])
    );
    assert!(entries.next().is_none());

    // The segment's last entry is rolled back, and the segment is then
    // checkpointed and recycled: the reader has seen every committed
    // entry of it, so nothing is lost.
    let mut second = log.begin_entry().unwrap();
    second.write_chunk(b"dropped").unwrap();
    second.rollback().unwrap();
    log.checkpoint_active().unwrap();
    assert_eq!(
        entries
            .next_timeout(Duration::from_millis(20))
            .map_err(|e| e.to_string()),
        Ok(None)
    );

    let mut third = log.begin_entry().unwrap();
    let third_id = third.id();
    third.write_chunk(b"next segment").unwrap();
    third.commit().unwrap();
    let entry = entries
        .next_timeout(Duration::from_secs(5))
        .unwrap()
        .unwrap();
    assert_eq!(entry.id(), third_id);
    assert_eq!(entry.into_chunks(), vec![b"next segment".to_vec()]);

    // A reader that had not reached the committed entry is told.
    let error = log.entries_from(first_id).next().unwrap().unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::NotFound);
    log.shutdown().unwrap();
}

/// A log on a crash-simulating file system whose spare segment is made,
/// so that the maintenance thread reads and writes nothing more while a
/// test counts operations.
fn quiet_log(fs: &CrashFileSystem, dir: &str) -> WriteAheadLog {
    let log = Configuration::default_for(dir)
        .file_system(fs.clone())
        .preallocate_bytes(4 << 20)
        .checkpoint_after_bytes(1 << 30)
        .buffer_bytes(64 * 1024)
        .open(LogVoid)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut last = fs.operation_count(Operation::Write);
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let now = fs.operation_count(Operation::Write);
        if now == last || Instant::now() > deadline {
            return log;
        }
        last = now;
    }
}

fn commit_one(log: &WriteAheadLog, data: &[u8]) -> u64 {
    let mut entry = log.begin_entry().unwrap();
    let id = entry.id().0;
    entry.write_chunk(data).unwrap();
    entry.commit().unwrap();
    id
}

#[test]
fn a_reader_that_retries_after_a_read_error_loses_no_entry() {
    // The error hits each read of the refill in turn: the walk of the
    // segment (in the middle of a large chunk, with another entry's chunk
    // walked before it) or the reading of the entries found.
    for failing_read in 0..6 {
        let fs = CrashFileSystem::new();
        let log = quiet_log(&fs, DIR);
        let first = commit_one(&log, b"first");
        let mut entries = log.entries_from(EntryId(first));
        assert_eq!(entries.next().unwrap().unwrap().id().0, first);

        let mut large = log.begin_entry().unwrap();
        let mut open = log.begin_entry().unwrap();
        let open_id = open.id().0;
        open.write_chunk(b"written before the error, committed after")
            .unwrap();
        large.write_chunk(&vec![7_u8; 200_000]).unwrap();
        let large_id = large.commit().unwrap().0;
        let small = commit_one(&log, b"small");

        fs.inject(
            Operation::Read,
            fs.operation_count(Operation::Read) + failing_read,
            FaultKind::Error(io::ErrorKind::Other),
        );
        let mut got = Vec::new();
        let mut errors = 0;
        // The caller retries after the error.
        for _ in 0..3 {
            match entries.next() {
                Some(Ok(entry)) => got.push(entry.id().0),
                Some(Err(_)) => errors += 1,
                None => break,
            }
        }
        open.commit().unwrap();
        let last = commit_one(&log, b"last");
        while let Some(entry) = entries.next_timeout(Duration::from_millis(500)).unwrap() {
            got.push(entry.id().0);
        }
        assert_eq!(
            got,
            vec![large_id, open_id, small, last],
            "read {failing_read} of the refill failed ({errors} errors seen)"
        );
        if failing_read < 2 {
            assert_eq!(errors, 1, "the error reached the reader");
        }
        drop(entries);
        log.shutdown().unwrap();
    }
}

#[test]
fn a_streamed_chunk_the_reader_passed_half_written_is_read_whole_once_committed() {
    let fs = CrashFileSystem::new();
    let log = quiet_log(&fs, DIR);
    let first = commit_one(&log, b"first");
    let mut entries = log.entries_from(EntryId(first));
    assert_eq!(entries.next().unwrap().unwrap().id().0, first);

    let mut small = log.begin_entry().unwrap();
    let small_id = small.id().0;
    let mut streamed = log.begin_entry().unwrap();
    let streamed_id = streamed.id().0;
    let mut abandoned = log.begin_entry().unwrap();
    let mut other = log.begin_entry().unwrap();
    let other_id = other.id().0;
    let mut chunk = streamed.begin_chunk(300_000).unwrap();
    chunk.write_all(&[1; 100_000]).unwrap();
    {
        let mut left = abandoned.begin_chunk(1000).unwrap();
        left.write_all(&[3; 10]).unwrap();
    }
    drop(abandoned);
    other.write_chunk(b"other").unwrap();
    other.commit().unwrap();
    small.write_chunk(b"small").unwrap();
    small.commit().unwrap();
    // The reader's walk passes the streamed chunk, two thirds unwritten.
    assert_eq!(entries.next().unwrap().unwrap().id().0, small_id);
    assert!(entries.next().is_none());
    chunk.write_all(&[2; 200_000]).unwrap();
    chunk.finish().unwrap();
    streamed.commit().unwrap();

    let got: Vec<(u64, Vec<Vec<u8>>)> =
        std::iter::from_fn(|| entries.next_timeout(Duration::from_millis(300)).unwrap())
            .map(|entry| (entry.id().0, entry.into_chunks()))
            .collect();
    let mut expected_stream = vec![1_u8; 100_000];
    expected_stream.extend([2_u8; 200_000]);
    assert_eq!(
        got,
        vec![
            (streamed_id, vec![expected_stream]),
            (other_id, vec![b"other".to_vec()])
        ]
    );
    log.shutdown().unwrap();
}

#[test]
fn after_opening_with_skip_corrupted_the_reader_gets_the_entries_recovery_replayed() {
    let fs = CrashFileSystem::new();
    let ids: Vec<u64> = {
        let log = quiet_log(&fs, DIR);
        let ids = [
            b"first-entry-aaaa",
            b"second-entry-bbb",
            b"third-entry-cccc",
        ]
        .iter()
        .map(|data| commit_one(&log, *data))
        .collect();
        log.shutdown().unwrap();
        ids
    };
    let name = fs
        .list_files(Path::new(DIR))
        .unwrap()
        .into_iter()
        .find(|name| name.starts_with("wal-") && name[4..].chars().all(|c| c.is_ascii_digit()))
        .expect("a segment file");
    let path = Path::new(DIR).join(name);
    let mut bytes = fs.contents(&path).unwrap();
    let data_at = bytes
        .windows(16)
        .position(|w| w == b"second-entry-bbb")
        .unwrap();
    // Damage the second entry's chunk header (just before its data).
    bytes[data_at - 3] ^= 0xff;
    assert!(fs.set_contents(&path, bytes));

    let recorder = Recorder::default();
    let log = Configuration::default_for(DIR)
        .file_system(fs.clone())
        .recovery_mode(RecoveryMode::SkipCorrupted)
        .open(recorder.clone())
        .unwrap();
    let recovered: Vec<u64> = recorder.recovered.lock().unwrap().keys().copied().collect();
    assert_eq!(recovered, vec![ids[0], ids[2]]);
    let read: Vec<u64> = log
        .entries_from(EntryId(ids[0]))
        .map(|entry| entry.unwrap().id().0)
        .collect();
    assert_eq!(read, recovered, "the reader sees what recovery replayed");
    log.shutdown().unwrap();
}

#[test]
fn after_a_reopen_entries_an_earlier_run_recycled_are_not_found() {
    let fs = CrashFileSystem::new();
    let (first, kept) = {
        let log = quiet_log(&fs, DIR);
        let first = commit_one(&log, b"checkpointed");
        log.checkpoint_active().unwrap();
        let kept = commit_one(&log, b"still in the log");
        log.shutdown().unwrap();
        (first, kept)
    };
    let log = Configuration::default_for(DIR)
        .file_system(fs.clone())
        .open(Recorder::default())
        .unwrap();
    let error = log
        .entries_from(EntryId(first))
        .next()
        .unwrap()
        .unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::NotFound, "{error}");
    // From the first live entry on, and from id 0 (there is no entry 0)
    // when nothing was recycled, reading works.
    let read: Vec<u64> = log
        .entries_from(EntryId(kept))
        .map(|entry| entry.unwrap().id().0)
        .collect();
    assert_eq!(read, vec![kept]);
    log.shutdown().unwrap();

    let fresh = CrashFileSystem::new();
    let log = quiet_log(&fresh, DIR);
    let id = commit_one(&log, b"one");
    let read: Vec<u64> = log
        .entries_from(EntryId(0))
        .map(|entry| entry.unwrap().id().0)
        .collect();
    assert_eq!(read, vec![id]);
    log.shutdown().unwrap();
}

#[test]
fn a_reader_including_buffered_entries_gets_them_before_any_sync() {
    let fs = CrashFileSystem::new();
    let log = quiet_log(&fs, DIR);
    let durable = commit_one(&log, b"durable");
    let mut buffered_ids = Vec::new();
    for data in [&b"one"[..], b"two"] {
        let mut entry = log.begin_entry().unwrap();
        entry.write_chunk(data).unwrap();
        buffered_ids.push(entry.commit_buffered().unwrap().0);
    }
    let syncs = log.stats().syncs;

    let durable_only: Vec<u64> = log
        .entries_from(EntryId(durable))
        .map(|entry| entry.unwrap().id().0)
        .collect();
    assert_eq!(durable_only, vec![durable]);
    let mut with_buffered = log.entries_from(EntryId(durable)).include_buffered();
    let all: Vec<(u64, Vec<Vec<u8>>)> = with_buffered
        .by_ref()
        .map(|entry| {
            let entry = entry.unwrap();
            (entry.id().0, entry.into_chunks())
        })
        .collect();
    assert_eq!(
        all,
        vec![
            (durable, vec![b"durable".to_vec()]),
            (buffered_ids[0], vec![b"one".to_vec()]),
            (buffered_ids[1], vec![b"two".to_vec()]),
        ]
    );
    assert_eq!(log.stats().syncs, syncs, "reading synced nothing");

    // A waiting reader is woken by a buffered commit from another thread,
    // not by its timeout.
    let (waited, seen) = std::thread::scope(|scope| {
        let reader = scope.spawn(|| {
            let start = Instant::now();
            let entry = with_buffered
                .next_timeout(Duration::from_secs(30))
                .unwrap()
                .expect("an entry");
            (start.elapsed(), entry.id().0)
        });
        std::thread::sleep(Duration::from_millis(100));
        let mut entry = log.begin_entry().unwrap();
        entry.write_chunk(b"three").unwrap();
        let id = entry.commit_buffered().unwrap().0;
        let (waited, seen) = reader.join().unwrap();
        assert_eq!(seen, id);
        (waited, seen)
    });
    assert!(
        waited < Duration::from_secs(10),
        "woken after {waited:?} for entry {seen}"
    );

    // Once synced, the durable-only reader has them too.
    log.sync().unwrap();
    let durable_only: Vec<u64> = log
        .entries_from(EntryId(durable))
        .map(|entry| entry.unwrap().id().0)
        .collect();
    assert_eq!(durable_only.len(), 4);
    drop(with_buffered);
    log.shutdown().unwrap();
}

#[test]
fn a_reader_including_buffered_entries_sees_each_once_in_order_while_writers_mix_durabilities() {
    for encryption in Encryption::BOTH {
        follow_while_four_threads_write(encryption, 128 * 1024, true, |thread, i| {
            match (thread + i) % 5 {
                0 => Ending::RolledBack,
                1 => Ending::Durable,
                _ => Ending::Buffered,
            }
        });
    }
}

/// The chunks of test entry `id`: one to three, with every tenth entry's
/// first chunk over 64 KiB (those are copied into the file by their
/// writers, outside the log's lock).
fn chunks_of(id: u64) -> Vec<Vec<u8>> {
    (0..=id % 3)
        .map(|c| {
            let len = if id % 10 == 0 && c == 0 {
                70_000 + (id as usize % 5_000)
            } else {
                ((id * 31 + c * 7) % 900) as usize
            };
            (0..len).map(|i| (i as u64 ^ id ^ c) as u8).collect()
        })
        .collect()
}

#[test]
fn a_reader_following_the_log_gets_large_and_multi_chunk_entries_whole_across_segments() {
    for encryption in Encryption::BOTH {
        follow_while_four_threads_write(encryption, 256 * 1024, false, |_, _| Ending::Durable);
    }
}

/// How a writer in [`follow_while_four_threads_write`] ends an entry.
#[derive(Debug, Clone, Copy)]
enum Ending {
    Durable,
    Buffered,
    RolledBack,
}

/// Four writers write 150 entries each (`chunks_of`), ended as `ending`
/// (thread, index) says, while a reader follows from the first entry.
/// Segments of `segment_bytes` fill quickly and are checkpointed and
/// recycled under the reader (the manager waits until it has passed
/// them). Every committed entry must be read once, whole, in id order.
fn follow_while_four_threads_write(
    encryption: Encryption,
    segment_bytes: u64,
    include_buffered: bool,
    ending: fn(u64, u64) -> Ending,
) {
    let dir = tempfile::tempdir().unwrap();
    let reader_at = Arc::new(AtomicU64::new(0));
    let manager = WaitsForReader {
        reader_at: reader_at.clone(),
        checkpointed: Arc::default(),
    };
    let log = encryption
        .configure(
            Configuration::default_for(dir.path())
                .preallocate_bytes(segment_bytes)
                .checkpoint_after_bytes(segment_bytes),
        )
        .open(manager.clone())
        .unwrap();
    let (seen, committed) = std::thread::scope(|scope| {
        let reader = {
            let log = log.clone();
            scope.spawn(move || {
                let mut entries = log.entries_from(EntryId(1));
                if include_buffered {
                    entries = entries.include_buffered();
                }
                follow(entries, &reader_at, None, 20, Duration::from_millis(50))
            })
        };
        let writers: Vec<_> = (0..4_u64)
            .map(|thread| {
                let log = &log;
                scope.spawn(move || {
                    let mut ids = Vec::new();
                    for i in 0..150_u64 {
                        let mut entry = log.begin_entry().unwrap();
                        let id = entry.id().0;
                        for chunk in chunks_of(id) {
                            entry.write_chunk(&chunk).unwrap();
                        }
                        match ending(thread, i) {
                            Ending::RolledBack => {
                                entry.rollback().unwrap();
                                continue;
                            }
                            Ending::Durable => entry.commit().unwrap(),
                            Ending::Buffered => entry.commit_buffered().unwrap(),
                        };
                        ids.push(id);
                    }
                    ids
                })
            })
            .collect();
        let mut committed: Vec<u64> = writers
            .into_iter()
            .flat_map(|writer| writer.join().unwrap())
            .collect();
        committed.sort_unstable();
        (reader.join().unwrap(), committed)
    });
    let ids: Vec<u64> = seen.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, committed, "every committed entry once, in id order");
    for (id, chunks) in &seen {
        assert_eq!(chunks, &chunks_of(*id), "entry {id}");
    }
    assert!(
        !manager.checkpointed.lock().unwrap().is_empty(),
        "segments were checkpointed and recycled while the reader followed"
    );
    log.shutdown().unwrap();
}

/// Writes several segments of entries, returns the ids in each segment
/// file and the data of each entry.
fn multi_segment_log(fs: &CrashFileSystem) -> Vec<(String, Vec<u64>)> {
    let log = config(fs).open(Recorder::default()).unwrap();
    for i in 0..120 {
        let mut entry = log.begin_entry().unwrap();
        let id = entry.id().0;
        entry.write_chunk(&payload(id)).unwrap();
        entry.commit().unwrap();
        if i % 30 == 29 {
            // Start a new segment (the refused checkpoint keeps the old one).
            log.checkpoint_active().unwrap_err();
        }
    }
    log.shutdown().unwrap();
    drop(log);
    let mut segments: Vec<(u64, String)> = fs
        .list_files(Path::new(DIR))
        .unwrap()
        .into_iter()
        .filter_map(|name| Some((name.strip_prefix("wal-")?.parse().ok()?, name)))
        .collect();
    segments.sort_unstable();
    let all: Vec<u64> = (1..=120).collect();
    let mut out = Vec::new();
    for (i, (first, name)) in segments.iter().enumerate() {
        let end = segments.get(i + 1).map_or(u64::MAX, |s| s.0);
        out.push((
            name.clone(),
            all.iter()
                .copied()
                .filter(|id| id >= first && *id < end)
                .collect(),
        ));
    }
    out
}

#[test]
fn each_recovery_mode_handles_damage_in_the_middle_of_a_multi_segment_log() {
    let original = CrashFileSystem::new();
    let segments = multi_segment_log(&original);
    assert!(segments.len() >= 3, "{segments:?}");
    let (name, ids) = &segments[segments.len() / 2];
    let path = Path::new(DIR).join(name);
    let mut bytes = original.contents(&path).unwrap();
    // Damage a byte inside the record header of an entry in the middle.
    let victim = ids[ids.len() / 2];
    let mut offset = 512;
    let mut damaged_at = None;
    while offset + 25 <= bytes.len() {
        let header = okaywal::format::RecordHeader::decode(&bytes[offset..], ids[0]).unwrap();
        if header.entry_id == victim {
            damaged_at = Some(offset);
            break;
        }
        offset += header.record_len() as usize;
    }
    let damaged_at = damaged_at.expect("found the victim's record");
    bytes[damaged_at + 3] ^= 0x40;

    let with_damage = || {
        let fs = CrashFileSystem::new();
        fs.create_dir_all(Path::new(DIR)).unwrap();
        for file in original.list_files(Path::new(DIR)).unwrap() {
            let path = Path::new(DIR).join(&file);
            let handle = fs.open(&path, okaywal::fs::OpenMode::Create).unwrap();
            handle
                .write_all_at(&original.contents(&path).unwrap(), 0)
                .unwrap();
        }
        assert!(fs.set_contents(&path, bytes.clone()));
        fs
    };
    let later: BTreeSet<u64> = segments
        .iter()
        .skip(segments.len() / 2 + 1)
        .flat_map(|(_, ids)| ids.iter().copied())
        .collect();

    // Default: an error naming the segment and the offset.
    let err = config(&with_damage())
        .open(Recorder::default())
        .unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    let message = err.to_string();
    assert!(message.contains(name.as_str()), "{message}");
    assert!(message.contains(&damaged_at.to_string()), "{message}");

    // Point in time: everything before the damage, nothing after.
    let recorder = Recorder::default();
    let log = config(&with_damage())
        .recovery_mode(RecoveryMode::PointInTime)
        .open(recorder.clone())
        .unwrap();
    let recovered: BTreeSet<u64> = recorder.recovered.lock().unwrap().keys().copied().collect();
    assert!(recovered.iter().all(|id| *id < victim), "{recovered:?}");
    assert!((1..victim).all(|id| recovered.contains(&id)));
    // New entries continue after every id seen, damaged ones included.
    let entry = log.begin_entry().unwrap();
    assert!(entry.id().0 > 120);
    drop(entry);
    drop(log);

    // Skip: everything but the damaged entry.
    let recorder = Recorder::default();
    let _log = config(&with_damage())
        .recovery_mode(RecoveryMode::SkipCorrupted)
        .open(recorder.clone())
        .unwrap();
    let recovered: BTreeSet<u64> = recorder.recovered.lock().unwrap().keys().copied().collect();
    assert!(!recovered.contains(&victim));
    let missing: Vec<u64> = (1..=120).filter(|id| !recovered.contains(id)).collect();
    assert!(
        later.iter().all(|id| recovered.contains(id)),
        "later entries kept; missing {missing:?}, victim {victim}, segments {segments:?}"
    );
    assert_eq!(recovered.len(), 119, "missing {missing:?}, victim {victim}");
}

#[test]
fn stats_count_a_scripted_workload() {
    let fs = CrashFileSystem::new();
    // Accepts every checkpoint.
    let log = config(&fs).open(common::Recorder::new()).unwrap();
    for i in 0..30_u64 {
        let mut entry = log.begin_entry().unwrap();
        entry.write_chunk(&[1; 100]).unwrap();
        match i % 3 {
            0 => {
                entry.commit().unwrap();
            }
            1 => {
                entry.commit_buffered().unwrap();
            }
            _ => entry.rollback().unwrap(),
        }
    }
    drop(log.begin_entry().unwrap()); // a dropped, empty entry rolls back too
    log.sync().unwrap();
    log.checkpoint_active().unwrap();
    let stats = log.stats();
    assert_eq!(stats.durable_commits, 10);
    assert_eq!(stats.buffered_commits, 10);
    assert_eq!(stats.rollbacks, 11);
    assert!(stats.syncs >= 1 && stats.syncs <= 20, "{stats:?}");
    assert_eq!(stats.synced_commits, 20, "{stats:?}");
    assert!(stats.entries_per_sync() >= 1.0);
    assert!(stats.bytes_written >= 20 * (25 + 100 + 4 + 25));
    assert!(stats.checkpoints >= 1, "{stats:?}");
    assert!(stats.live_segments >= 1);
    assert!(stats.recycled_segments >= 1);
    assert_eq!(stats.checkpoint_failures, 0);
}

#[test]
fn bytes_written_counts_large_and_streamed_chunks() {
    // Chunks above the inline limit are copied by their writers and
    // streamed chunks through `begin_chunk`; both are bytes the log wrote.
    let fs = CrashFileSystem::new();
    let log = config(&fs).open(LogVoid).unwrap();
    let before = log.stats().bytes_written;
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(&vec![7_u8; 300_000]).unwrap();
    let mut streamed = entry.begin_chunk(200_000).unwrap();
    streamed.write_all(&vec![9_u8; 200_000]).unwrap();
    streamed.finish().unwrap();
    entry.commit().unwrap();
    let written = log.stats().bytes_written - before;
    assert!(
        (500_000..510_000).contains(&written),
        "{written} bytes counted for 500,000 bytes of chunks"
    );
    log.shutdown().unwrap();
}

/// Large entries' writers run sync passes of their own, so several passes
/// at once find a new segment still unnamed. One directory sync names it
/// for all of them: every directory sync pairs with a rename (a segment
/// named, or a checkpointed one recycled), never one per pass.
#[test]
fn concurrent_large_commits_name_each_segment_with_one_directory_sync() {
    let fs = CrashFileSystem::new();
    fs.jitter(
        test_seed("concurrent_large_commits"),
        Duration::from_micros(300),
    );
    // Under 1 MiB, segments keep their configured size (a log of large
    // entries sizes larger ones up, and then fills only a few).
    let log = config(&fs)
        .preallocate_bytes(512 << 10)
        .checkpoint_after_bytes(512 << 10)
        .open(Recorder::default())
        .unwrap();
    let renames_before = fs.operation_count(Operation::Rename);
    let dir_syncs_before = fs.operation_count(Operation::SyncDir);
    let payload = vec![3_u8; 300 * 1024];
    std::thread::scope(|scope| {
        for _ in 0..6 {
            scope.spawn(|| {
                for _ in 0..8 {
                    let mut entry = log.begin_entry().unwrap();
                    entry.write_chunk(&payload).unwrap();
                    entry.commit().unwrap();
                }
            });
        }
    });
    log.shutdown().unwrap();
    let renames = fs.operation_count(Operation::Rename) - renames_before;
    let dir_syncs = fs.operation_count(Operation::SyncDir) - dir_syncs_before;
    // 48 entries of 300 KiB fill many 512 KiB segments (fewer when
    // writers outrun the spares and grow a full segment).
    assert!(renames >= 4, "only {renames} renames");
    assert!(
        dir_syncs <= renames,
        "{dir_syncs} directory syncs for {renames} renames"
    );

    let recorder = Recorder::default();
    let log = config(&fs).open(recorder.clone()).unwrap();
    log.shutdown().unwrap();
    // Everything was checkpointed at shutdown, or is replayed now: either
    // way, the log reopens cleanly and whatever it replays is whole.
    for chunks in recorder.recovered.lock().unwrap().values() {
        assert_eq!(chunks, &vec![payload.clone()]);
    }
}

/// `crc_is_valid` hashes whatever the caller has not read yet: after a
/// partial read, after no read at all, and over data damaged on disk.
#[test]
fn crc_is_valid_checks_unread_data_of_small_and_large_chunks() {
    let fs = CrashFileSystem::new();
    let log = Configuration::default_for(DIR)
        .file_system(fs.clone())
        .open(LogVoid)
        .unwrap();
    let small: Vec<u8> = (0..3_000_u32).map(|i| (i * 7) as u8).collect();
    let large: Vec<u8> = (0..700_000_u32).map(|i| (i * 13 + 5) as u8).collect();
    let mut entry = log.begin_entry().unwrap();
    let small_at = entry.write_chunk(&small).unwrap().position;
    let large_at = entry.write_chunk(&large).unwrap().position;
    entry.commit().unwrap();

    for (at, data) in [(small_at, &small), (large_at, &large)] {
        let mut reader = log.read_at(at).unwrap();
        assert!(reader.crc_is_valid().unwrap(), "unread chunk at {at}");
        let mut reader = log.read_at(at).unwrap();
        let mut head = [0_u8; 100];
        reader.read_exact(&mut head).unwrap();
        assert_eq!(&head[..], &data[..100]);
        assert!(reader.crc_is_valid().unwrap(), "partly read chunk at {at}");
        assert_eq!(reader.bytes_remaining(), 0);
    }

    // Damage one byte deep inside each chunk's data, on "disk".
    let path = Path::new(DIR).join(format!("wal-{}", large_at.file_id));
    let mut bytes = fs.contents(&path).expect("segment file");
    for at in [small_at, large_at] {
        bytes[at.offset as usize + 2_000] ^= 0x10;
    }
    assert!(fs.set_contents(&path, bytes));
    for at in [small_at, large_at] {
        let mut reader = log.read_at(at).unwrap();
        assert!(!reader.crc_is_valid().unwrap(), "damaged chunk at {at}");
        let mut reader = log.read_at(at).unwrap();
        let mut head = [0_u8; 10];
        reader.read_exact(&mut head).unwrap();
        assert!(!reader.crc_is_valid().unwrap(), "damaged chunk at {at}");
    }
    log.shutdown().unwrap();
}
