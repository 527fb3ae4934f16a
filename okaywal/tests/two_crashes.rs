//! Two crashes in a row, or a crash of the process and then of the
//! power: states the one-crash-per-run tests in `crash.rs` never reach.
//! Each test builds the state left by the first crash deterministically
//! on the simulated file system, then crashes again, on a plain and on an
//! encrypted log.

mod common;

use common::encryption::Encryption;
use common::follow::ChunkRecorder as Recorder;
use okaywal::fs::{CrashFileSystem, FaultKind, Operation, PowerLoss};
use okaywal::{Configuration, LogVoid, WriteAheadLog};

fn config(fs: &CrashFileSystem, encryption: Encryption) -> Configuration {
    encryption.configure(common::small_log_on(fs))
}

fn commit(log: &WriteAheadLog, data: &[u8], durable: bool) -> u64 {
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(data).unwrap();
    if durable {
        entry.commit().unwrap().0
    } else {
        entry.commit_buffered().unwrap().0
    }
}

/// Process crash (kill -9) with a buffered (or in-flight, unsynced) entry
/// in the page cache; reopen; one or two durable commits; power loss.
fn process_crash_then_power_loss(
    durable_after_reopen: usize,
    encryption: Encryption,
) -> Result<(), String> {
    let config = |fs: &CrashFileSystem| config(fs, encryption);
    let fs = CrashFileSystem::new();
    let log = config(&fs).open(LogVoid).unwrap();
    commit(&log, b"a1 durable", true);
    commit(&log, b"a2 buffered: in the page cache only", false);
    // Process crash: no shutdown, the OS keeps what it was handed.
    drop(log);

    let log = config(&fs).open(Recorder::default()).unwrap();
    let mut acked = Vec::new();
    for i in 0..durable_after_reopen {
        acked.push(commit(&log, format!("b{i} durable").as_bytes(), true));
    }
    // Power loss: nothing more reaches the disk.
    fs.inject(
        Operation::Write,
        fs.operation_count(Operation::Write),
        FaultKind::PowerOff,
    );
    fs.inject(
        Operation::Sync,
        fs.operation_count(Operation::Sync),
        FaultKind::PowerOff,
    );
    drop(log);
    fs.power_loss(PowerLoss::Clean);

    let recorder = Recorder::default();
    let log = config(&fs)
        .open(recorder.clone())
        .map_err(|e| format!("reopen after the power loss failed: {e}"))?;
    let recovered = recorder.recovered.lock().unwrap().clone();
    for id in acked {
        if !recovered.contains_key(&id) {
            return Err(format!(
                "acknowledged durable entry {id} lost; recovered {:?}",
                recovered.keys().collect::<Vec<_>>()
            ));
        }
    }
    log.shutdown().unwrap();
    Ok(())
}

#[test]
fn durable_commit_after_process_crash_and_reopen_survives_power_loss() {
    for encryption in Encryption::BOTH {
        process_crash_then_power_loss(1, encryption).unwrap();
    }
}

#[test]
fn log_opens_after_process_crash_reopen_two_commits_and_power_loss() {
    for encryption in Encryption::BOTH {
        process_crash_then_power_loss(2, encryption).unwrap();
    }
}

/// The state of the first crash: entry 1 checkpointed (its file recycled),
/// segment 2 active in the fresh spare `wal-spare-1`, not synced yet.
/// Entries 2 (100-byte chunk, no commit) and 3 (50-byte chunk, committed)
/// reach the page cache; the power goes out at the sync of entry 3's
/// commit, which therefore fails. `seed` picks which unsynced writes the
/// power loss keeps. Returns whether the power loss kept records of the
/// segment but not its header.
fn crash_while_the_first_segment_records_are_unsynced(
    fs: &CrashFileSystem,
    seed: u64,
    encryption: Encryption,
) -> bool {
    let log = config(fs, encryption).open(LogVoid).unwrap();
    assert_eq!(commit(&log, b"entry one", true), 1);
    log.checkpoint_active().unwrap();
    let mut e2 = log.begin_entry().unwrap();
    let mut e3 = log.begin_entry().unwrap();
    assert_eq!((e2.id().0, e3.id().0), (2, 3));
    e2.write_chunk(&[0xA2; 100]).unwrap();
    e3.write_chunk(&[0xB3; 50]).unwrap();
    fs.inject(
        Operation::Sync,
        fs.operation_count(Operation::Sync),
        FaultKind::PowerOff,
    );
    assert!(e3.commit().is_err(), "entry 3 is never acknowledged");
    drop(e2);
    drop(log);
    fs.power_loss(PowerLoss::Random(seed));
    fs.contents(std::path::Path::new("/log/wal-spare-1"))
        .is_some_and(|bytes| bytes[..512].iter().all(|b| *b == 0) && bytes[512] == 1)
}

#[test]
fn an_entry_that_vanished_after_a_crash_never_comes_back() {
    let mut headers_lost = 0;
    for seed in 0..64 {
        let encryption = Encryption::BOTH[seed as usize % 2];
        let config = |fs: &CrashFileSystem| config(fs, encryption);
        let fs = CrashFileSystem::new();
        if crash_while_the_first_segment_records_are_unsynced(&fs, seed, encryption) {
            headers_lost += 1;
        }
        // Reopen. Entry 3's commit failed, so it may be there or not;
        // whatever this open shows is what every later open must show.
        let recorder = Recorder::default();
        let log = config(&fs).open(recorder.clone()).unwrap();
        let first = recorder.recovered.lock().unwrap().clone();
        assert!(first.keys().all(|id| *id == 3), "seed {seed}: {first:?}");
        // A new entry whose records end where the old entry 3's began, had
        // it been given the old segment's id again (in a plain log).
        let data = vec![0xC2; 75];
        let id = commit(&log, &data, true);
        log.shutdown().unwrap();
        drop(log);

        let recorder = Recorder::default();
        let log = config(&fs).open(recorder.clone()).unwrap();
        let recovered = recorder.recovered.lock().unwrap().clone();
        log.shutdown().unwrap();
        let summary: Vec<(u64, usize)> = recovered
            .iter()
            .map(|(id, chunks)| (*id, chunks.concat().len()))
            .collect();
        let mut expected = first.clone();
        assert!(!expected.contains_key(&id), "seed {seed}: id {id} reused");
        expected.insert(id, vec![data]);
        assert_eq!(
            recovered, expected,
            "seed {seed}: entries (id, bytes) recovered: {summary:?}"
        );
    }
    // The segment's header is synced before its records are written, so
    // no power loss keeps records without it.
    assert_eq!(headers_lost, 0);
}
