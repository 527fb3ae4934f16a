//! Power cuts at every sync (and at a sample of writes) of a concurrent
//! workload on the crash-simulating file system, followed by each kind of
//! power loss and a reopen: every acknowledged commit must come back with
//! its bytes, and nothing may come back partially or changed. Every test
//! runs on a plain and on an encrypted log.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::encryption::Encryption;
use common::{
    cut_power, jitter_budget, test_seed, try_run_workload, Mix, Model, Recorder, Rng, Workload,
    ALL_OPERATIONS,
};
use okaywal::fs::{CrashFileSystem, FaultKind, FileSystem, Operation, PowerLoss};
use okaywal::Configuration;

const DIR: &str = "/crash";

fn config(fs: &CrashFileSystem, encryption: Encryption) -> Configuration {
    encryption.configure(
        Configuration::default_for(DIR)
            .file_system(fs.clone())
            .preallocate_bytes(16 * 1024)
            .checkpoint_after_bytes(16 * 1024),
    )
}

fn workload(threads: usize, entries_per_thread: usize) -> Workload {
    Workload {
        threads,
        entries_per_thread,
        seed: 7,
        mix: Mix {
            max_chunk: 3000,
            multi_chunk: 25,
            streamed: 25,
            presealed: 30,
            rollback: 10,
            drop: 5,
            unfinished: 3,
            large: 2,
        },
    }
}

fn policies(k: u64) -> [PowerLoss; 4] {
    [
        PowerLoss::Clean,
        PowerLoss::TornPrefix,
        PowerLoss::SectorHole,
        PowerLoss::Random(k.wrapping_mul(0x9E37_79B9) + 1),
    ]
}

#[derive(Debug, Default)]
struct Report {
    /// The injected power cut happened during the workload (not at the
    /// cut after it).
    fired: bool,
    acknowledged: usize,
    /// How many operations of each kind the workload made.
    counts: BTreeMap<Operation, u64>,
}

/// Runs the workload with a power cut planned at `fault`, cuts the power
/// at the end if it is still on, loses power as `policy` says, reopens and
/// checks the outcome.
fn crash_run(
    fault: Option<(Operation, u64)>,
    policy: PowerLoss,
    work: &Workload,
    encryption: Encryption,
) -> Result<Report, String> {
    crash_run_on(CrashFileSystem::new(), fault, policy, work, encryption)
}

/// `crash_run` on a given (for instance jittered) disk.
fn crash_run_on(
    fs: CrashFileSystem,
    fault: Option<(Operation, u64)>,
    policy: PowerLoss,
    work: &Workload,
    encryption: Encryption,
) -> Result<Report, String> {
    if let Some((op, n)) = fault {
        fs.inject(op, n, FaultKind::PowerOff);
    }
    let before = Recorder::new();
    let mut report = Report::default();
    let model = match config(&fs, encryption).open(before.clone()) {
        Ok(log) => {
            let model = try_run_workload(&log, work, Duration::from_secs(30))?;
            report.fired = fs.is_powered_off();
            for op in ALL_OPERATIONS {
                report.counts.insert(op, fs.operation_count(op));
            }
            cut_power(&fs);
            // Stops the background thread; it fails (the power is off).
            let _ = log.shutdown();
            drop(log);
            model
        }
        Err(_) => {
            report.fired = fs.is_powered_off();
            Model::default()
        }
    };
    report.acknowledged = model.committed.len();
    fs.jitter(0, Duration::ZERO);
    fs.power_loss(policy);

    let after = Recorder::new();
    let log = config(&fs, encryption)
        .open(after.clone())
        .map_err(|e| format!("reopening after the power loss failed: {e}"))?;
    let before = before.seen();
    let seen = after.seen();
    let mut present = BTreeSet::new();
    for checkpoint in &before.checkpoints {
        for (id, chunks) in &checkpoint.entries {
            model.check(*id, chunks, "checkpointed before the power loss")?;
            present.insert(*id);
        }
    }
    let mut recovered = BTreeSet::new();
    for (id, chunks) in &seen.recovered {
        model.check(*id, chunks, "recovered after the power loss")?;
        if !recovered.insert(*id) {
            return Err(format!("entry {id} recovered twice"));
        }
        present.insert(*id);
    }
    if !seen.aborted.is_empty() {
        return Err(format!("aborted entries recovered: {:?}", seen.aborted));
    }
    let lost: Vec<_> = model
        .committed
        .keys()
        .filter(|id| !present.contains(id))
        .collect();
    if !lost.is_empty() {
        return Err(format!(
            "{} of {} acknowledged commits lost, e.g. {:?}",
            lost.len(),
            model.committed.len(),
            &lost[..lost.len().min(8)]
        ));
    }
    // New entries get ids above every id the manager was ever given.
    let highest = before
        .max_id()
        .max(seen.max_id())
        .max(model.max_committed());
    drop((before, seen));
    let mut entry = log
        .begin_entry()
        .map_err(|e| format!("begin after reopen: {e}"))?;
    if entry.id().0 <= highest {
        return Err(format!(
            "after reopening, a new entry got id {} although id {highest} was already handed \
             to the manager or acknowledged",
            entry.id()
        ));
    }
    entry
        .write_chunk(b"after the crash")
        .map_err(|e| format!("write after reopen: {e}"))?;
    entry
        .commit()
        .map_err(|e| format!("commit after reopen: {e}"))?;
    log.shutdown()
        .map_err(|e| format!("shutdown after reopen: {e}"))?;
    Ok(report)
}

/// Runs `crash_run` for every planned fault and policy; fails with the
/// first few failures (each naming its crash point, policy and seed).
fn sweep(op: Operation, points: &[u64], work: &Workload, min_fired: usize, encryption: Encryption) {
    let start = Instant::now();
    let mut failures = Vec::new();
    let mut fired = 0;
    let mut runs = 0;
    for &k in points {
        for policy in policies(k) {
            runs += 1;
            match crash_run(Some((op, k)), policy, work, encryption) {
                Ok(report) => fired += usize::from(report.fired),
                Err(err) => failures.push(format!(
                    "power cut at {op:?} #{k}, {policy:?}, {encryption:?}, workload seed {}: \
                     {err}",
                    work.seed
                )),
            }
        }
    }
    println!(
        "{op:?} ({encryption:?}): {} crash points, {runs} runs, {fired} with the power cut inside the workload, \
         {} failures, {:?}",
        points.len(),
        failures.len(),
        start.elapsed()
    );
    assert!(
        failures.is_empty(),
        "{} of {runs} crash runs failed; first ones:\n{}",
        failures.len(),
        failures[..failures.len().min(6)].join("\n")
    );
    assert!(
        fired >= min_fired,
        "only {fired} of {runs} power cuts fired inside the workload"
    );
}

fn calibrate(work: &Workload, encryption: Encryption) -> Report {
    let report = crash_run(None, PowerLoss::Clean, work, encryption)
        .unwrap_or_else(|e| panic!("the workload without faults: {e}"));
    assert!(report.acknowledged > 0);
    report
}

#[test]
fn power_cut_at_every_sync() {
    for encryption in Encryption::BOTH {
        let work = workload(4, 30);
        let report = calibrate(&work, encryption);
        println!(
            "without faults ({encryption:?}): {} commits; operations: {:?}",
            report.acknowledged, report.counts
        );
        let points: Vec<u64> = (0..report.counts[&Operation::Sync]).collect();
        sweep(
            Operation::Sync,
            &points,
            &work,
            points.len() * 2,
            encryption,
        );
    }
}

#[test]
fn power_cut_at_sampled_writes() {
    for encryption in Encryption::BOTH {
        let work = workload(4, 30);
        let writes = calibrate(&work, encryption).counts[&Operation::Write];
        let points: Vec<u64> = (0..writes).step_by(3).collect();
        sweep(
            Operation::Write,
            &points,
            &work,
            points.len() * 2,
            encryption,
        );
    }
}

#[test]
fn power_cut_at_every_sync_single_writer() {
    // One writer makes the sync numbering deterministic, so a failure here
    // reproduces exactly.
    for encryption in Encryption::BOTH {
        let work = workload(1, 40);
        let syncs = calibrate(&work, encryption).counts[&Operation::Sync];
        let points: Vec<u64> = (0..syncs).collect();
        sweep(
            Operation::Sync,
            &points,
            &work,
            points.len() * 3,
            encryption,
        );
    }
}

#[test]
fn power_cut_at_every_directory_sync_rename_and_create() {
    for encryption in Encryption::BOTH {
        let work = workload(2, 30);
        let report = calibrate(&work, encryption);
        for op in [Operation::SyncDir, Operation::Rename, Operation::Create] {
            let points: Vec<u64> = (0..report.counts[&op]).collect();
            sweep(op, &points, &work, 1, encryption);
        }
    }
}

/// Every segment is checkpointed, then the power fails before anything
/// else is synced: the ids given out after reopening must still be above
/// the checkpointed ones (a manager that skips ids it already stored would
/// otherwise drop new entries).
#[test]
fn ids_stay_above_checkpointed_ids_after_a_power_loss() {
    for (policy, encryption) in policies(3)
        .into_iter()
        .zip(Encryption::BOTH.into_iter().cycle())
    {
        let fs = CrashFileSystem::new();
        let recorder = Recorder::new();
        let log = config(&fs, encryption).open(recorder.clone()).unwrap();
        let mut last = 0;
        for i in 0..20_u8 {
            let mut entry = log.begin_entry().unwrap();
            entry.write_chunk(&[i; 100]).unwrap();
            last = entry.commit().unwrap().0;
        }
        log.checkpoint_active().unwrap();
        assert_eq!(recorder.seen().checkpointed_ids().len(), 20);
        cut_power(&fs);
        let _ = log.shutdown();
        drop(log);
        fs.power_loss(policy);

        let log = config(&fs, encryption).open(Recorder::new()).unwrap();
        let entry = log.begin_entry().unwrap();
        assert!(
            entry.id().0 > last,
            "{policy:?}: new entry id {} after entry {last} was checkpointed",
            entry.id()
        );
        drop(entry);
        log.shutdown().unwrap();
    }
}

/// The active segment's header and its first record are both unsynced when
/// a checkpoint's directory sync makes the segment's new name durable. A
/// power loss that keeps the record but not the header (unsynced writes
/// reach the disk in any order) must not make the log impossible to open:
/// nothing in that segment was ever acknowledged.
#[test]
fn a_lost_header_of_an_unsynced_segment_does_not_block_reopening() {
    let mut failures = Vec::new();
    for seed in 0..32 {
        let encryption = Encryption::BOTH[seed as usize % 2];
        let fs = CrashFileSystem::new();
        let log = config(&fs, encryption).open(Recorder::new()).unwrap();
        let mut acknowledged = Vec::new();
        for i in 0..10_u8 {
            let mut entry = log.begin_entry().unwrap();
            entry.write_chunk(&[i; 300]).unwrap();
            acknowledged.push(entry.commit().unwrap().0);
        }
        // Seals the segment and recycles it; the new active segment's name
        // is made durable by the recycling's directory sync.
        log.checkpoint_active().unwrap();
        let mut entry = log.begin_entry().unwrap();
        entry.write_chunk(&[0xAB; 300]).unwrap();
        cut_power(&fs);
        drop(entry);
        let _ = log.shutdown();
        drop(log);
        fs.power_loss(PowerLoss::Random(seed));

        let recorder = Recorder::new();
        match config(&fs, encryption).open(recorder.clone()) {
            Ok(log) => {
                // Everything acknowledged was checkpointed before the cut.
                assert!(recorder.seen().recovered.is_empty());
                log.shutdown().unwrap();
            }
            Err(err) => failures.push(format!("PowerLoss::Random({seed}), {encryption:?}: {err}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of 32 power losses left a log that cannot be opened:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Power cuts at random writes and syncs while every disk operation is
/// delayed at random (and a sync covers only writes made before it began):
/// the races between committers, the sync leader and the checkpointer
/// that plain scheduling rarely produces. Runs for a fixed time with a
/// fresh seed each time; `OKAYWAL_TEST_SEED` replays one.
#[test]
fn power_cut_with_jittered_io() {
    let mut rng = Rng::new(test_seed("power_cut_with_jittered_io"));
    let mut next = || rng.next_u64();
    let start = Instant::now();
    let mut failures = Vec::new();
    let (mut runs, mut fired) = (0, 0);
    let budget = jitter_budget(20);
    while start.elapsed() < budget || runs < 20 {
        let mut work = workload(4, 30);
        work.seed = next();
        let jitter_seed = next();
        // Without jitter the workload makes about 245 writes, 97 syncs, 13
        // directory syncs and 12 renames.
        let (op, count) = match next() % 8 {
            0..=3 => (Operation::Write, 260),
            4..=6 => (Operation::Sync, 100),
            _ if next() % 2 == 0 => (Operation::SyncDir, 14),
            _ => (Operation::Rename, 13),
        };
        let point = next() % count;
        let policy = policies(next())[(next() % 4) as usize];
        // Every other run encrypted: the budget is shared.
        let encryption = Encryption::BOTH[runs % 2];
        let fs = CrashFileSystem::new();
        fs.jitter(jitter_seed, Duration::from_micros(150));
        runs += 1;
        match crash_run_on(fs, Some((op, point)), policy, &work, encryption) {
            Ok(report) => fired += usize::from(report.fired),
            Err(err) => failures.push(format!(
                "power cut at {op:?} #{point}, {policy:?}, {encryption:?}, workload seed {}, \
                 jitter seed {jitter_seed}: {err}",
                work.seed
            )),
        }
    }
    println!(
        "{runs} jittered crash runs, {fired} with the power cut inside the workload, {} \
         failures, {:?}",
        failures.len(),
        start.elapsed()
    );
    assert!(
        failures.is_empty(),
        "{} of {runs} jittered crash runs failed; first ones:\n{}",
        failures.len(),
        failures[..failures.len().min(6)].join("\n")
    );
    assert!(
        fired * 2 >= runs,
        "only {fired} of {runs} power cuts fired inside the workload"
    );
}

/// A chunk begun with `begin_chunk` and abandoned before its data was
/// written, at the end of a segment the log then leaves: the next
/// segment's header records where the abandoned one ended, and after a
/// power loss recovery must still walk the whole abandoned record (which
/// reaches past the preallocated file) instead of calling the segment cut
/// short and refusing to open. `power_cut_with_jittered_io` reaches this
/// state too.
#[test]
fn an_abandoned_chunk_at_the_end_of_a_segment_does_not_block_reopening() {
    for (policy, encryption) in policies(5)
        .into_iter()
        .flat_map(|policy| Encryption::BOTH.map(|encryption| (policy, encryption)))
    {
        let fs = CrashFileSystem::new();
        let before = Recorder::new();
        let log = config(&fs, encryption).open(before.clone()).unwrap();
        let mut acknowledged = BTreeMap::new();
        let mut commit = |log: &okaywal::WriteAheadLog, byte: u8| {
            let mut entry = log.begin_entry().unwrap();
            entry.write_chunk(&[byte; 1000]).unwrap();
            let id = entry.commit().unwrap();
            acknowledged.insert(id.0, byte);
        };
        // Past half of the 16 KiB segment, so the spare gets made.
        for byte in 0..10 {
            commit(&log, byte);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while !fs
            .list_files(std::path::Path::new(DIR))
            .unwrap()
            .iter()
            .any(|name| name.starts_with("wal-spare-"))
        {
            assert!(Instant::now() < deadline, "no spare segment was made");
            std::thread::sleep(Duration::from_millis(5));
        }
        {
            let mut entry = log.begin_entry().unwrap();
            let mut chunk = entry.begin_chunk(12 << 10).unwrap();
            std::io::Write::write_all(&mut chunk, &[0xEE; 100]).unwrap();
            // Both dropped unfinished.
        }
        // The active segment is full: these go to the next one, and the
        // second is written after that segment's first sync.
        for byte in 20..24 {
            commit(&log, byte);
        }
        cut_power(&fs);
        let _ = log.shutdown();
        drop(log);
        fs.power_loss(policy);

        let recorder = Recorder::new();
        let log = config(&fs, encryption)
            .open(recorder.clone())
            .unwrap_or_else(|e| panic!("{policy:?}, {encryption:?}: reopening failed: {e}"));
        // The log checkpoints full segments in the background: an entry
        // is either checkpointed (before or after the power loss) or
        // recovered, with its bytes.
        let seen = recorder.seen();
        for (id, chunks) in &seen.recovered {
            if let Some(byte) = acknowledged.get(id) {
                assert_eq!(chunks.concat(), vec![*byte; 1000], "{policy:?}: entry {id}");
            }
        }
        let mut present: BTreeSet<u64> = seen.recovered.iter().map(|(id, _)| *id).collect();
        present.extend(seen.checkpointed_ids());
        present.extend(before.seen().checkpointed_ids());
        drop(seen);
        for id in acknowledged.keys() {
            assert!(present.contains(id), "{policy:?}: entry {id} lost");
        }
        log.shutdown().unwrap();
    }
}
