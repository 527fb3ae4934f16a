//! Injected I/O errors: a failed sync or write fails its commit and
//! poisons the log until it is reopened; acknowledged commits survive; a
//! full disk while opening gives a clear error. The failed sync and write
//! tests run on a plain and on an encrypted log.

mod common;

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::encryption::Encryption;
use common::hooks::{Gate, Hooked, OpenOnDrop};
use common::{Model, Recorder, Rng};
use okaywal::fs::{CrashFileSystem, FaultKind, FileSystem, Operation, PowerLoss};
use okaywal::{Configuration, WriteAheadLog};
use testkit::disk::quiesce;

const DIR: &str = "/faults";
const PREALLOCATE: u64 = 4 * 1024 * 1024;

fn config(fs: &CrashFileSystem) -> Configuration {
    config_in(fs, Encryption::Off)
}

fn config_in(fs: &CrashFileSystem, encryption: Encryption) -> Configuration {
    // One big segment: no segment switch or checkpoint interferes with the
    // counting of operations.
    encryption.configure(
        Configuration::default_for(DIR)
            .file_system(fs.clone())
            .preallocate_bytes(PREALLOCATE)
            .checkpoint_after_bytes(1 << 30)
            .buffer_bytes(64 * 1024),
    )
}

fn open_quiet(fs: &CrashFileSystem, recorder: &Recorder) -> WriteAheadLog {
    open_quiet_in(fs, recorder, Encryption::Off)
}

fn open_quiet_in(
    fs: &CrashFileSystem,
    recorder: &Recorder,
    encryption: Encryption,
) -> WriteAheadLog {
    let log = config_in(fs, encryption).open(recorder.clone()).unwrap();
    quiesce(fs);
    log
}

/// Reopens without faults and checks the commits of `model`: every
/// acknowledged one present with its bytes, nothing rolled back, failed
/// commits whole or absent.
fn reopen_and_check(fs: &CrashFileSystem, model: &Model, what: &str) -> Vec<u64> {
    reopen_and_check_in(fs, model, what, Encryption::Off)
}

fn reopen_and_check_in(
    fs: &CrashFileSystem,
    model: &Model,
    what: &str,
    encryption: Encryption,
) -> Vec<u64> {
    fs.clear_faults();
    let recorder = Recorder::new();
    let log = config_in(fs, encryption)
        .open(recorder.clone())
        .unwrap_or_else(|e| panic!("{what}: reopening: {e}"));
    common::check_exactly_once(model, &common::Seen::default(), &recorder.seen())
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let ids = recorder.seen().recovered_ids();
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(b"after reopening").unwrap();
    entry.commit().unwrap();
    log.shutdown().unwrap();
    ids
}

fn assert_poisoned(log: &WriteAheadLog, what: &str) {
    for _ in 0..3 {
        assert!(
            log.begin_entry().is_err(),
            "{what}: begin_entry works on a poisoned log"
        );
    }
    assert!(
        log.checkpoint_active().is_err(),
        "{what}: checkpoint_active works on a poisoned log"
    );
}

#[test]
fn a_failed_sync_fails_its_commit_and_every_later_one() {
    for (k, encryption) in (0..6).flat_map(|k| Encryption::BOTH.map(|e| (k, e))) {
        for power_loss in [false, true] {
            let what = format!(
                "sync error on the {k}th commit's sync (power loss: {power_loss}, {encryption:?})"
            );
            let fs = CrashFileSystem::new();
            let log = open_quiet_in(&fs, &Recorder::new(), encryption);
            // An entry begun before the fault, finished after it.
            let mut held = log.begin_entry().unwrap();
            held.write_chunk(b"begun before the fault").unwrap();
            let held_id = held.id().0;

            fs.inject(
                Operation::Sync,
                fs.operation_count(Operation::Sync) + k,
                FaultKind::Error(io::ErrorKind::Other),
            );
            let mut model = Model::default();
            model.rolled_back.insert(held_id);
            let mut rng = Rng::new(k);
            let mut failed_at = None;
            for i in 0..12 {
                let mut entry = match log.begin_entry() {
                    Ok(entry) => entry,
                    Err(_) => {
                        assert!(failed_at.is_some(), "{what}: begin failed first");
                        continue;
                    }
                };
                assert!(failed_at.is_none(), "{what}: begin after a failed commit");
                let data = rng.bytes(200);
                entry.write_chunk(&data).unwrap();
                let id = entry.id().0;
                match entry.commit() {
                    Ok(_) => {
                        model.committed.insert(id, vec![data]);
                    }
                    Err(err) => {
                        assert!(!err.to_string().is_empty());
                        model.unacked.insert(id, vec![data]);
                        failed_at = Some(i);
                    }
                }
            }
            assert_eq!(failed_at, Some(k), "{what}: the wrong commit failed");
            assert_eq!(model.committed.len() as u64, k);
            assert!(held.write_chunk(b"more").is_err(), "{what}");
            assert!(held.commit().is_err(), "{what}");
            assert_poisoned(&log, &what);
            assert!(
                log.shutdown().is_err(),
                "{what}: shutdown hides the failure"
            );
            drop(log);
            if power_loss {
                fs.power_loss(PowerLoss::Clean);
            }
            reopen_and_check_in(&fs, &model, &what, encryption);
        }
    }
}

#[test]
fn a_failed_sync_under_concurrent_commits() {
    for (fault, encryption) in [3_u64, 10, 25]
        .into_iter()
        .flat_map(|f| Encryption::BOTH.map(|e| (f, e)))
    {
        let fs = CrashFileSystem::new();
        let log = open_quiet_in(&fs, &Recorder::new(), encryption);
        fs.inject(
            Operation::Sync,
            fs.operation_count(Operation::Sync) + fault,
            FaultKind::Error(io::ErrorKind::Other),
        );
        let threads: Vec<_> = (0..4_u64)
            .map(|t| {
                let log = log.clone();
                std::thread::spawn(move || {
                    let mut rng = Rng::new(t);
                    let mut outcomes = Vec::new();
                    for _ in 0..40 {
                        let mut entry = match log.begin_entry() {
                            Ok(entry) => entry,
                            Err(_) => {
                                outcomes.push((None, Vec::new(), false));
                                continue;
                            }
                        };
                        let len = rng.range(1, 2000);
                        let data = rng.bytes(len);
                        let id = entry.id().0;
                        let ok = entry.write_chunk(&data).is_ok() && entry.commit().is_ok();
                        outcomes.push((Some(id), data, ok));
                    }
                    outcomes
                })
            })
            .collect();
        let mut model = Model::default();
        for thread in threads {
            let outcomes = thread.join().unwrap();
            let first_failure = outcomes
                .iter()
                .position(|(_, _, ok)| !ok)
                .expect("the fault fired");
            assert!(
                outcomes[first_failure..].iter().all(|(_, _, ok)| !ok),
                "fault at sync {fault}: a commit succeeded after a failed one: {:?}",
                outcomes.iter().map(|o| o.2).collect::<Vec<_>>()
            );
            for (id, data, ok) in outcomes {
                if let Some(id) = id {
                    if ok {
                        model.committed.insert(id, vec![data]);
                    } else {
                        model.unacked.insert(id, vec![data]);
                    }
                }
            }
        }
        let what = format!("fault at sync {fault}, {encryption:?}");
        assert!(!model.committed.is_empty(), "{what}");
        assert_poisoned(&log, &what);
        drop(log);
        reopen_and_check_in(&fs, &model, &what, encryption);
    }
}

/// Each entry: a small chunk, a 200 KiB chunk streamed in small pieces
/// (written out in 64 KiB buffers), then the commit.
fn write_entry(log: &WriteAheadLog, rng: &mut Rng) -> (Option<u64>, Vec<Vec<u8>>, io::Result<()>) {
    let small = rng.bytes(100);
    let large = rng.bytes(200 * 1024);
    let mut entry = match log.begin_entry() {
        Ok(entry) => entry,
        Err(err) => return (None, Vec::new(), Err(err)),
    };
    let id = entry.id().0;
    let chunks = vec![small.clone(), large.clone()];
    let result = (|| {
        entry.write_chunk(&small)?;
        let mut writer = entry.begin_chunk(large.len() as u32)?;
        for piece in large.chunks(1000) {
            writer.write_all(piece)?;
        }
        writer.finish()?;
        Ok(())
    })();
    let result = match result {
        Ok(()) => entry.commit().map(|_| ()),
        Err(err) => {
            // The entry cannot be committed any more.
            assert!(
                entry.commit().is_err(),
                "entry {id} committed after a failed write"
            );
            Err(err)
        }
    };
    (Some(id), chunks, result)
}

#[test]
fn a_failed_write_fails_its_entry_and_poisons_the_log() {
    for encryption in Encryption::BOTH {
        a_failed_write_fails_its_entry_and_poisons_the_log_in(encryption);
    }
}

fn a_failed_write_fails_its_entry_and_poisons_the_log_in(encryption: Encryption) {
    let mut fired = 0;
    for k in 0..24 {
        let what = format!("write error at the {k}th write ({encryption:?})");
        let fs = CrashFileSystem::new();
        let log = open_quiet_in(&fs, &Recorder::new(), encryption);
        let base = fs.operation_count(Operation::Write);
        fs.inject(
            Operation::Write,
            base + k,
            FaultKind::Error(io::ErrorKind::Other),
        );
        let mut rng = Rng::new(k);
        let mut model = Model::default();
        let mut failed = None;
        for _ in 0..4 {
            let (id, chunks, result) = write_entry(&log, &mut rng);
            match (id, result) {
                (Some(id), Ok(())) => {
                    assert!(failed.is_none(), "{what}: a commit after the failure");
                    model.committed.insert(id, chunks);
                }
                (Some(id), Err(_)) => {
                    assert!(failed.is_none(), "{what}: a write after the failure");
                    // Its commit record was never written: it must not
                    // come back.
                    model.rolled_back.insert(id);
                    failed = Some(id);
                }
                (None, Err(_)) => assert!(failed.is_some(), "{what}: begin failed first"),
                (None, Ok(())) => unreachable!(),
            }
        }
        if fs.operation_count(Operation::Write) > base + k {
            fired += 1;
            assert!(failed.is_some(), "{what}: no entry failed");
            assert_poisoned(&log, &what);
        }
        drop(log);
        reopen_and_check_in(&fs, &model, &what, encryption);
    }
    assert!(fired >= 20, "{encryption:?}: {fired}");
}

fn spare_files_are_whole(fs: &CrashFileSystem, what: &str) {
    for name in fs.list_files(Path::new(DIR)).unwrap_or_default() {
        if name.starts_with("wal-spare-") {
            let len = fs.contents(&Path::new(DIR).join(&name)).unwrap().len() as u64;
            assert!(
                len >= PREALLOCATE,
                "{what}: a half-filled spare file {name} ({len} bytes) was left behind"
            );
        }
    }
}

/// Injects "no space left on device" at the `n`th operation of each kind
/// while opening a new or an existing log.
#[test]
fn a_full_disk_while_opening_gives_a_clear_error() {
    let mut refused = BTreeMap::new();
    for existing in [false, true] {
        for op in [
            Operation::Create,
            Operation::Write,
            Operation::Sync,
            Operation::SyncDir,
            Operation::Rename,
        ] {
            for n in 0..4 {
                let what = format!("{op:?} #{n} fails with StorageFull (existing log: {existing})");
                let fs = CrashFileSystem::new();
                let mut model = Model::default();
                if existing {
                    let log = open_quiet(&fs, &Recorder::new());
                    for i in 0..5_u8 {
                        let mut entry = log.begin_entry().unwrap();
                        entry.write_chunk(&[i; 64]).unwrap();
                        model
                            .committed
                            .insert(entry.commit().unwrap().0, vec![vec![i; 64]]);
                    }
                    log.shutdown().unwrap();
                    drop(log);
                }
                fs.inject(
                    op,
                    fs.operation_count(op) + n,
                    FaultKind::Error(io::ErrorKind::StorageFull),
                );
                // Refusing checkpoints keeps recovered entries in the log
                // for the final check.
                let recorder = Recorder::refusing();
                match config(&fs).open(recorder.clone()) {
                    Ok(log) => {
                        // The fault hit later work (or nothing): the log
                        // must still be consistent.
                        let recovered = recorder.seen().recovered_ids();
                        assert_eq!(
                            recovered,
                            model.committed.keys().copied().collect::<Vec<_>>(),
                            "{what}"
                        );
                        let _ = log.shutdown();
                    }
                    Err(err) => {
                        assert_eq!(err.kind(), io::ErrorKind::StorageFull, "{what}: {err}");
                        assert!(err.to_string().contains("injected"), "{what}: {err}");
                        *refused.entry(op).or_insert(0) += 1;
                    }
                }
                spare_files_are_whole(&fs, &what);
                // Once space is back, nothing acknowledged is lost.
                reopen_and_check(&fs, &model, &what);
            }
        }
    }
    println!("opens refused per operation: {refused:?}");
    // One failed write while a segment file is zero-filled no longer fails
    // the open: the file is made smaller instead (see
    // `a_nearly_full_disk_gets_smaller_segment_files`).
    for op in [Operation::Create, Operation::Sync] {
        assert!(
            refused.get(&op).copied().unwrap_or(0) > 0,
            "{op:?}: {refused:?}"
        );
    }
}

/// Lengths of the segment files (live and spare) in the log directory.
fn segment_file_lengths(fs: &CrashFileSystem) -> Vec<u64> {
    let mut lengths: Vec<u64> = fs
        .list_files(Path::new(DIR))
        .unwrap()
        .into_iter()
        .filter(|name| name.starts_with("wal-"))
        .map(|name| fs.contents(&Path::new(DIR).join(name)).unwrap().len() as u64)
        .collect();
    lengths.sort_unstable();
    lengths
}

/// A disk with too little room for a whole segment file: the zero-fill
/// that preallocates it fails with StorageFull, and the file is filled
/// again to half the size, and so on down to 64 KiB. The log opens and
/// commits in the smaller file, and its entries survive a reopen. Only when
/// even 64 KiB does not fit does the open fail, leaving no file behind.
#[test]
fn a_nearly_full_disk_gets_smaller_segment_files() {
    // Room for 1 MiB: the fills of 4 MiB and 2 MiB fail at their first write.
    let fs = CrashFileSystem::new();
    let first = fs.operation_count(Operation::Write);
    for n in 0..2 {
        fs.inject(
            Operation::Write,
            first + n,
            FaultKind::Error(io::ErrorKind::StorageFull),
        );
    }
    let log = config(&fs)
        .open(Recorder::new())
        .expect("opens on a nearly full disk");
    quiesce(&fs);
    let lengths = segment_file_lengths(&fs);
    assert!(
        lengths.contains(&(PREALLOCATE / 4)),
        "a segment file of {} bytes: {lengths:?}",
        PREALLOCATE / 4
    );
    for len in &lengths {
        assert!(
            *len == PREALLOCATE / 4 || *len >= PREALLOCATE,
            "only whole files: {lengths:?}"
        );
    }
    let mut model = Model::default();
    for i in 0..20_u8 {
        let mut entry = log.begin_entry().unwrap();
        entry.write_chunk(&[i; 100_000]).unwrap();
        model
            .committed
            .insert(entry.commit().unwrap().0, vec![vec![i; 100_000]]);
    }
    // 2 MB of entries: the smaller segment grew past its preallocation.
    assert!(
        segment_file_lengths(&fs)
            .iter()
            .any(|len| *len > PREALLOCATE / 4 && *len < PREALLOCATE),
        "{:?}",
        segment_file_lengths(&fs)
    );
    log.shutdown().unwrap();
    drop(log);
    reopen_and_check(&fs, &model, "after a smaller segment file");

    // No room even for 64 KiB: every size down to it fails (4 MiB to 64 KiB
    // is seven sizes), and the open fails with the disk's error.
    let fs = CrashFileSystem::new();
    let first = fs.operation_count(Operation::Write);
    for n in 0..7 {
        fs.inject(
            Operation::Write,
            first + n,
            FaultKind::Error(io::ErrorKind::StorageFull),
        );
    }
    let err = config(&fs).open(Recorder::new()).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::StorageFull, "{err}");
    assert!(err.to_string().contains("preallocating"), "{err}");
    assert_eq!(fs.operation_count(Operation::Write) - first, 7);
    assert_eq!(segment_file_lengths(&fs), Vec::<u64>::new(), "no file left");
    reopen_and_check(&fs, &Model::default(), "after a full disk");
}

#[test]
fn a_read_error_during_recovery_is_reported() {
    for n in 0..6 {
        let what = format!("read #{n} fails during recovery");
        let fs = CrashFileSystem::new();
        let log = open_quiet(&fs, &Recorder::new());
        let mut model = Model::default();
        for i in 0..4_u8 {
            let mut entry = log.begin_entry().unwrap();
            entry.write_chunk(&[i; 5000]).unwrap();
            model
                .committed
                .insert(entry.commit().unwrap().0, vec![vec![i; 5000]]);
        }
        log.shutdown().unwrap();
        drop(log);
        fs.inject(
            Operation::Read,
            fs.operation_count(Operation::Read) + n,
            FaultKind::Error(io::ErrorKind::PermissionDenied),
        );
        let recorder = Recorder::refusing();
        match config(&fs).open(recorder.clone()) {
            Ok(log) => {
                assert_eq!(
                    recorder.seen().recovered_ids(),
                    model.committed.keys().copied().collect::<Vec<_>>(),
                    "{what}"
                );
                let _ = log.shutdown();
            }
            Err(err) => assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{what}: {err}"),
        }
        reopen_and_check(&fs, &model, &what);
    }
}

/// Linux reports a failed writeback to one `fdatasync` of a file
/// description and may drop the pages. A large entry's writer syncs on
/// its own; if its sync overlaps a sync that fails, its own success proves
/// nothing, and its commit must fail too.
#[test]
fn a_sync_overlapping_a_failed_one_acknowledges_nothing() {
    let fs = CrashFileSystem::new();
    let gate = Arc::new(Gate::default());
    let held = gate.clone();
    let hooked = Hooked {
        inner: fs.clone(),
        before_rename: Arc::new(|_| Ok(())),
        before_sync: Arc::new(move |_| {
            if std::thread::current().name() == Some("big") {
                held.hold();
            }
            Ok(())
        }),
    };
    let log = Configuration::default_for(DIR)
        .file_system(hooked)
        .preallocate_bytes(PREALLOCATE)
        .checkpoint_after_bytes(1 << 30)
        .open(okaywal::LogVoid)
        .unwrap();
    let _open = OpenOnDrop(&gate);
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(b"names the segment").unwrap();
    entry.commit().unwrap();

    let big_log = log.clone();
    let big = std::thread::Builder::new()
        .name("big".into())
        .spawn(move || {
            let mut entry = big_log.begin_entry()?;
            entry.write_chunk(&vec![7_u8; 300 << 10])?;
            entry.commit()
        })
        .unwrap();
    // The large entry's own sync has started; the next one fails.
    gate.wait_held();
    fs.inject(
        Operation::Sync,
        fs.operation_count(Operation::Sync),
        FaultKind::Error(io::ErrorKind::Other),
    );
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(b"small").unwrap();
    assert!(entry.commit().is_err(), "the failed sync's commit");
    assert!(log.begin_entry().is_err(), "the log is poisoned");
    gate.open();
    let result = big.join().unwrap();
    assert!(
        result.is_err(),
        "acknowledged ({result:?}) by a sync that overlapped a failed one"
    );
}

/// A checkpointed segment whose rename to `wal-recycled-*` fails stays
/// under its name and is replayed at the next open. Nothing after it may
/// reach the manager first: the log stops, and the replay comes in order.
#[test]
fn a_failed_recycle_rename_stops_the_log_so_the_replay_stays_in_order() {
    let fs = CrashFileSystem::new();
    let fail_rename = Arc::new(AtomicBool::new(false));
    let failing = fail_rename.clone();
    let hooked = Hooked {
        inner: fs.clone(),
        before_rename: Arc::new(move |to| {
            let recycling = to
                .file_name()
                .is_some_and(|name| name.to_string_lossy().starts_with("wal-recycled-"));
            if recycling && failing.swap(false, Ordering::SeqCst) {
                return Err(io::Error::other("injected rename failure"));
            }
            Ok(())
        }),
        before_sync: Arc::new(|_| Ok(())),
    };
    let recorder = Recorder::new();
    let log = Configuration::default_for(DIR)
        .file_system(hooked)
        .preallocate_bytes(64 << 10)
        .checkpoint_after_bytes(1 << 30)
        .open(recorder.clone())
        .unwrap();
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(b"old value").unwrap();
    let old = entry.commit().unwrap();
    fail_rename.store(true, Ordering::SeqCst);
    let checkpoint = log.checkpoint_active();
    assert!(
        checkpoint.is_err(),
        "checkpoint_active returned {checkpoint:?}"
    );
    assert!(
        log.begin_entry().is_err(),
        "the log goes on after the failure"
    );
    assert_eq!(recorder.seen().checkpointed_ids(), vec![old.0]);
    drop(log);

    let again = Recorder::new();
    let log = config(&fs).open(again.clone()).unwrap();
    assert_eq!(
        again.seen().recovered_ids(),
        vec![old.0],
        "replayed once more"
    );
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(b"new value").unwrap();
    let new = entry.commit().unwrap();
    assert!(new > old);
    log.checkpoint_active().unwrap();
    log.shutdown().unwrap();
}

/// Once a sync has failed, every error the log reports has that first
/// failure's kind (a full disk stays `StorageFull`, not a generic error)
/// and mentions its message, whichever call reports it.
#[test]
fn later_errors_keep_the_kind_and_message_of_the_first_failure() {
    let fs = CrashFileSystem::new();
    let log = open_quiet(&fs, &Recorder::new());
    let mut held = log.begin_entry().unwrap();
    held.write_chunk(b"begun before the fault").unwrap();
    fs.inject(
        Operation::Sync,
        fs.operation_count(Operation::Sync),
        FaultKind::Error(io::ErrorKind::StorageFull),
    );
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(b"its sync fails").unwrap();
    let first = entry.commit().unwrap_err();
    assert_eq!(first.kind(), io::ErrorKind::StorageFull, "{first}");
    let first_message = first.to_string();
    assert!(first_message.contains("injected"), "{first_message}");

    let later = [
        ("begin_entry", log.begin_entry().map(drop).unwrap_err()),
        (
            "write_chunk of an entry begun before the failure",
            held.write_chunk(b"more").map(drop).unwrap_err(),
        ),
        ("commit of that entry", held.commit().map(drop).unwrap_err()),
        ("sync", log.sync().map(drop).unwrap_err()),
        ("checkpoint_active", log.checkpoint_active().unwrap_err()),
        ("shutdown", log.shutdown().unwrap_err()),
    ];
    for (what, err) in later {
        assert_eq!(err.kind(), io::ErrorKind::StorageFull, "{what}: {err}");
        assert!(
            err.to_string().contains(&first_message),
            "{what}: {err:?} does not mention the first failure, {first_message:?}"
        );
    }
}
