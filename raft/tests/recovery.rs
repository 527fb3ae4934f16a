//! A node's stores reopened after a clean shutdown, after being dropped
//! without one, and after a simulated power loss return the same vote, log
//! and applied data.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use okaywal::fs::{CrashFileSystem, FaultKind, Operation, PowerLoss};
use openraft::{CommittedLeaderId, EntryPayload};
use sediment_raft::log_store::log_ids;
use sediment_raft::types::{Entry, LogId, Request, Vote};
use sediment_raft::{LogStore, LogStoreConfig, StateMachine, StateMachineConfig};

fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn put(term: u64, index: u64) -> Entry {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(Request::Put {
            key: format!("key-{}", index % 50),
            value: value_of(term, index),
        }),
    }
}

fn value_of(term: u64, index: u64) -> Vec<u8> {
    format!("value of {index} in term {term}")
        .into_bytes()
        .repeat(1 + (index % 7) as usize)
}

/// Appends and waits for the durable callback.
fn append_durably(log: &LogStore, entries: Vec<Entry>) {
    let (tx, rx) = mpsc::channel();
    log.append_entries(entries, Box::new(move |r| tx.send(r).unwrap()))
        .unwrap();
    rx.recv().unwrap().unwrap();
}

/// Drives a log and a state machine through appends (across several WAL
/// checkpoints), a vote, a truncation, a purge and applies.
fn workload(log: &LogStore, sm: &StateMachine) {
    for batch in 0..30 {
        let entries = (1..=10).map(|i| put(1, batch * 10 + i)).collect();
        append_durably(log, entries);
        if batch % 10 == 9 {
            log.checkpoint().unwrap();
        }
    }
    log.save_vote_blocking(Vote::new(2, 1)).unwrap();
    // A new leader overwrites the tail from 291 on.
    log.truncate_blocking(291).unwrap();
    append_durably(log, (291..=305).map(|i| put(2, i)).collect());
    log.save_committed_blocking(Some(log_id(2, 300))).unwrap();
    log.purge_blocking(log_id(1, 120)).unwrap();
    let committed = log.read_entries(..=300).unwrap();
    for chunk in committed.chunks(17) {
        sm.apply_entries(chunk.to_vec()).unwrap();
    }
}

struct Observed {
    vote: Option<Vote>,
    committed: Option<LogId>,
    purged: Option<LogId>,
    last: Option<LogId>,
    ids: Vec<LogId>,
    applied: Option<LogId>,
    data: Vec<(String, Option<Vec<u8>>)>,
}

fn observe(log: &LogStore, sm: &StateMachine) -> Observed {
    let state = log.log_state();
    let entries = log.read_entries(..).unwrap();
    Observed {
        vote: log.vote(),
        committed: log.committed(),
        purged: state.last_purged_log_id,
        last: state.last_log_id,
        ids: log_ids(&entries),
        applied: sm.applied().0,
        data: sm
            .keys()
            .into_iter()
            .map(|k| {
                let v = sm.get(&k).unwrap();
                (k, v)
            })
            .collect(),
    }
}

fn check_expected(seen: &Observed) {
    assert_eq!(seen.vote, Some(Vote::new(2, 1)));
    assert_eq!(seen.committed, Some(log_id(2, 300)));
    assert_eq!(seen.purged, Some(log_id(1, 120)));
    assert_eq!(seen.last, Some(log_id(2, 305)));
    let expected: Vec<LogId> = (121..=290)
        .map(|i| log_id(1, i))
        .chain((291..=305).map(|i| log_id(2, i)))
        .collect();
    assert_eq!(seen.ids, expected);
    assert_eq!(seen.applied, Some(log_id(2, 300)));
    assert_eq!(seen.data.len(), 50);
    for (key, value) in &seen.data {
        let slot: u64 = key.trim_start_matches("key-").parse().unwrap();
        // The last index ≤ 300 with this slot.
        let index = (1..=300).rev().find(|i| i % 50 == slot).unwrap();
        let term = if index > 290 { 2 } else { 1 };
        assert_eq!(value.as_deref(), Some(&value_of(term, index)[..]), "{key}");
    }
}

fn small_segments(dir: &std::path::Path) -> LogStoreConfig {
    LogStoreConfig::new(dir.join("log")).segment_bytes(64 << 10)
}

#[test]
fn reopened_after_clean_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let log = LogStore::open_with(small_segments(dir.path())).unwrap();
    let sm = StateMachine::open(dir.path().join("state")).unwrap();
    workload(&log, &sm);
    let before = observe(&log, &sm);
    check_expected(&before);
    assert!(
        log.archive_files() > 0,
        "checkpoints moved entries to archives"
    );
    log.shutdown().unwrap();
    drop(log);
    sm.shutdown().unwrap();

    let log = LogStore::open_with(small_segments(dir.path())).unwrap();
    let sm = StateMachine::open(dir.path().join("state")).unwrap();
    check_expected(&observe(&log, &sm));
}

#[test]
fn reopened_after_drop_without_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let log = LogStore::open_with(small_segments(dir.path())).unwrap();
    let sm = StateMachine::open(dir.path().join("state")).unwrap();
    workload(&log, &sm);
    drop(log);
    drop(sm);
    let log = LogStore::open_with(small_segments(dir.path())).unwrap();
    let sm = StateMachine::open(dir.path().join("state")).unwrap();
    check_expected(&observe(&log, &sm));
    // And again, after more checkpoints of the recovered log.
    log.checkpoint().unwrap();
    drop(log);
    drop(sm);
    let log = LogStore::open_with(small_segments(dir.path())).unwrap();
    let sm = StateMachine::open(dir.path().join("state")).unwrap();
    check_expected(&observe(&log, &sm));
}

#[test]
fn workload_survives_power_loss_on_the_crash_file_system() {
    let fs = CrashFileSystem::new();
    let snapshots = tempfile::tempdir().unwrap();
    let root = std::path::Path::new("/node");
    let log_config = || {
        LogStoreConfig::new(root.join("log"))
            .segment_bytes(64 << 10)
            .file_system(Arc::new(fs.clone()))
    };
    let sm_config = || StateMachineConfig {
        snapshot_directory: snapshots.path().to_path_buf(),
        ..StateMachineConfig::new(root.join("state")).file_system(Arc::new(fs.clone()))
    };
    let log = LogStore::open_with(log_config()).unwrap();
    let sm = StateMachine::open_with(sm_config()).unwrap();
    workload(&log, &sm);
    // Applies are synced within a bounded time (a node re-applies the rest
    // from its log, see power_cut_node.rs); once synced, with everything
    // the log acknowledged, a clean power cut loses nothing.
    sm.sync().unwrap();
    fs.power_loss(PowerLoss::Clean);
    drop(log);
    drop(sm);
    let log = LogStore::open_with(log_config()).unwrap();
    let sm = StateMachine::open_with(sm_config()).unwrap();
    check_expected(&observe(&log, &sm));
}

/// The `LogFlushed` path: an append's callback runs only after the WAL sync
/// that covers it. The power goes out at a chosen sync or rename (of the
/// WAL or of a checkpoint's archive and metadata) while appends are in
/// flight, and every entry whose callback had fired must come back, with no
/// hole before it.
#[test]
fn entries_acknowledged_as_durable_survive_power_loss() {
    for seed in 0..8_u64 {
        acknowledged_entries_survive(seed, None, false);
    }
}

/// The same for a sealed log (`LogStoreConfig::encryption`): sealed
/// archives, metadata and WAL, and the WAL records of its checkpoints.
#[test]
fn entries_acknowledged_as_durable_survive_power_loss_in_a_sealed_log() {
    for seed in 0..6_u64 {
        acknowledged_entries_survive(seed, None, true);
    }
}

/// The same with the disk delaying every operation at random, so that
/// appends, the sync thread and checkpoints interleave in more ways.
#[test]
fn entries_acknowledged_as_durable_survive_power_loss_with_jittered_io() {
    for seed in 0..12_u64 {
        acknowledged_entries_survive(
            seed,
            Some(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5EED),
            false,
        );
    }
}

fn acknowledged_entries_survive(seed: u64, jitter: Option<u64>, sealed: bool) {
    {
        let fs = CrashFileSystem::new();
        if let Some(jitter) = jitter {
            fs.jitter(jitter, Duration::from_micros(150));
        }
        let config = || {
            let config = LogStoreConfig::new("/log")
                .segment_bytes(32 << 10)
                .file_system(Arc::new(fs.clone()));
            if sealed {
                config.encryption(okaywal::encryption::StaticKey::new([0x5e; 32]))
            } else {
                config
            }
        };
        let log = LogStore::open_with(config()).unwrap();
        // Jittered runs get earlier crash points: with slow operations the
        // writer can reach its last entry before a late one comes.
        let (operation, nth) = match (seed % 2 == 0, jitter.is_some()) {
            (true, false) => (Operation::Sync, 40 + seed * 29),
            (false, false) => (Operation::Rename, 4 + seed * 3),
            (true, true) => (Operation::Sync, 20 + seed * 11),
            (false, true) => (Operation::Rename, 2 + seed),
        };
        fs.inject(
            operation,
            fs.operation_count(operation) + nth,
            FaultKind::PowerOff,
        );
        let acknowledged = Arc::new(AtomicU64::new(0));
        let writer = {
            let log = log.clone();
            let acknowledged = acknowledged.clone();
            std::thread::spawn(move || {
                let mut next = 1;
                // Until the power goes out (an append then fails): where
                // the cut falls depends on how often the checkpointer ran,
                // which load on the machine changes, so a fixed number of
                // entries can be too few. The deadline only stops a run
                // whose cut never comes, which the assertion below reports.
                let deadline = std::time::Instant::now() + Duration::from_secs(60);
                // Several appends in flight at once, as openraft issues them.
                while std::time::Instant::now() < deadline {
                    let entries: Vec<Entry> =
                        (next..next + 1 + next % 4).map(|i| put(1, i)).collect();
                    let last = entries.last().unwrap().log_id.index;
                    let acknowledged = acknowledged.clone();
                    let appended = log.append_entries(
                        entries,
                        Box::new(move |result| {
                            if result.is_ok() {
                                acknowledged.fetch_max(last, Ordering::SeqCst);
                            }
                        }),
                    );
                    if appended.is_err() {
                        break;
                    }
                    next = last + 1;
                }
            })
        };
        writer.join().unwrap();
        assert!(fs.is_powered_off(), "seed {seed}: the power went out");
        // Callbacks run on the sync thread; give the last ones a moment.
        std::thread::sleep(Duration::from_millis(20));
        let durable = acknowledged.load(Ordering::SeqCst);
        drop(log);
        fs.jitter(0, Duration::ZERO);
        let policy = match seed % 3 {
            0 => PowerLoss::Clean,
            1 => PowerLoss::TornPrefix,
            _ => PowerLoss::Random(seed),
        };
        fs.power_loss(policy);
        let log = LogStore::open_with(config()).unwrap();
        let ids = log_ids(&log.read_entries(..).unwrap());
        assert!(durable > 0, "seed {seed}: some appends were acknowledged");
        assert!(
            ids.len() as u64 >= durable,
            "seed {seed}: {durable} acknowledged, {} recovered",
            ids.len()
        );
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(id.index, i as u64 + 1, "seed {seed}: a hole in the log");
        }
        println!(
            "seed {seed}, jitter {jitter:?}, sealed {sealed}: power off at {operation:?} #{nth}: {durable} acknowledged, {} recovered, {} archive files",
            ids.len(),
            log.archive_files()
        );
    }
}
