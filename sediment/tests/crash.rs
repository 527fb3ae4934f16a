//! Power cuts at every sync and every write (and every directory sync,
//! creation, rename, removal and resize) of a concurrent workload, on
//! okaywal's `CrashFileSystem`. After each cut the disk keeps
//! only what was durable (plus torn or random unsynced writes, depending on
//! the policy) and the database is reopened on it:
//!
//! - every acknowledged transaction's blobs read back exactly, unless a
//!   later checkpoint may have freed them (then they are absent or intact,
//!   never other bytes);
//! - an unacknowledged transaction is wholly present or wholly absent;
//! - acknowledged commit records are in the commit log, and every record
//!   there belongs to a transaction that was attempted;
//! - the embedded header is the last acknowledged one or a later attempt;
//! - new sequences are above every earlier one; `verify` is clean.
//!
//! Every crash point runs on a plain store; a third of them (and half the
//! jittered runs) run on an encrypted one too.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use common::crash::{checked, with_timeout, CrashPoint, HUNG};
use common::{blob, seed, Mode, Rng, Watchdog};
use okaywal::fs::{CrashFileSystem, FaultKind, Operation, PowerLoss};
use sediment::format::grain_crc;
use sediment::{CommitRecord, Config, Database, Error, GrainId, SequenceId};

const THREADS: u64 = 3;
const TRANSACTIONS: u64 = 15;
const DIR: &str = "/crash-db";

fn open(fs: &CrashFileSystem, mode: Mode) -> sediment::Result<Database> {
    mode.apply(Config::for_directory(DIR))
        .file_system(fs.clone())
        .wal(|wal| {
            wal.checkpoint_after_bytes(24 << 10)
                .preallocate_bytes(32 << 10)
        })
        .open()
}

/// One transaction of the workload and what became of it.
#[derive(Debug, Clone, Default)]
struct Attempt {
    thread: u64,
    index: u64,
    writes: Vec<(GrainId, Vec<u8>)>,
    archives: Vec<GrainId>,
    checkpoint_to: Option<u64>,
    header: Option<GrainId>,
    commit_called: bool,
    /// `Some(Ok(sequence))` if acknowledged.
    outcome: Option<Result<u64, String>>,
}

impl Attempt {
    fn acked(&self) -> Option<u64> {
        match self.outcome {
            Some(Ok(sequence)) => Some(sequence),
            _ => None,
        }
    }
}

/// A thread's transactions: a `checkpoint_to` of its last sequence every
/// fourth transaction, 1-3 blobs (mostly small, sometimes large enough to
/// bypass the WAL), archives of its own acknowledged blobs (threads 1 and
/// 2), and (thread 0) the embedded header set to its first new blob. Stops
/// at the first error.
fn worker(db: &Database, thread: u64, seed: u64) -> Vec<Attempt> {
    let mut rng = Rng::new(seed ^ (thread + 1).wrapping_mul(0xA24B_AED4_963E_E407));
    let mut attempts = Vec::new();
    let mut archivable: Vec<GrainId> = Vec::new();
    let mut last_sequence = None;
    for index in 0..TRANSACTIONS {
        let mut attempt = Attempt {
            thread,
            index,
            ..Attempt::default()
        };
        let result = (|| -> sediment::Result<u64> {
            let mut tx = db.begin_transaction()?;
            // checkpoint_to comes before the first write: called while the
            // transaction's WAL entry is open, it can deadlock with a
            // writer stalled by WAL backpressure (reproduced on its own by
            // concurrency.rs checkpoint_to_completes_while_another_writer_
            // is_stalled_by_the_wal); this test is about crashes.
            if index % 4 == 3 {
                if let Some(sequence) = last_sequence {
                    match tx.checkpoint_to(SequenceId(sequence)) {
                        Ok(()) => attempt.checkpoint_to = Some(sequence),
                        Err(Error::FutureSequence { .. }) => {}
                        Err(e) => return Err(e),
                    }
                }
            }
            for j in 0..rng.between(1, 3) {
                let size = if rng.percent(10) {
                    rng.between(65_536, 90_000)
                } else {
                    rng.between(16, 6000)
                } as usize;
                let data = blob(thread << 40 | index << 8 | j, size);
                let id = tx.write(&data)?;
                attempt.writes.push((id, data));
            }
            if thread > 0 && rng.percent(50) {
                for _ in 0..rng.between(1, 2) {
                    if archivable.is_empty() {
                        break;
                    }
                    let id = archivable.swap_remove(rng.below(archivable.len() as u64) as usize);
                    tx.archive(id)?;
                    attempt.archives.push(id);
                }
            }
            if thread == 0 {
                let header = attempt.writes[0].0;
                tx.set_embedded_header(Some(header))?;
                attempt.header = Some(header);
            }
            attempt.commit_called = true;
            Ok(tx.commit()?.0)
        })();
        match result {
            Ok(sequence) => {
                attempt.outcome = Some(Ok(sequence));
                archivable.extend(attempt.writes.iter().map(|(id, _)| *id));
                last_sequence = Some(sequence);
                attempts.push(attempt);
            }
            Err(e) => {
                attempt.outcome = Some(Err(e.to_string()));
                attempts.push(attempt);
                break;
            }
        }
    }
    attempts
}

/// Opens the database on `fs`, runs the workload and drops the database
/// (without a shutdown). Returns every attempt; none if the open failed.
fn run_workload(fs: &CrashFileSystem, seed: u64, mode: Mode) -> Vec<Attempt> {
    let Ok(db) = open(fs, mode) else {
        return Vec::new();
    };
    let attempts = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|thread| {
                let db = &db;
                scope.spawn(move || worker(db, thread, seed))
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a workload thread panicked"))
            .collect()
    });
    // Dropping joins the WAL's maintenance thread, so nothing of this
    // "boot" touches the disk after the power cut below.
    drop(db);
    attempts
}

fn archived_anywhere(attempts: &[Attempt], id: GrainId) -> bool {
    attempts.iter().any(|a| a.archives.contains(&id))
}

/// Everything that must hold after reopening; returns the first violation.
fn check(db: &Database, attempts: &[Attempt]) -> Result<(), String> {
    let any_checkpoint = attempts.iter().any(|a| a.checkpoint_to.is_some());
    let archived: HashSet<GrainId> = attempts
        .iter()
        .flat_map(|a| a.archives.iter().copied())
        .collect();
    let mut contents_at: HashMap<GrainId, Vec<&[u8]>> = HashMap::new();
    for attempt in attempts {
        for (id, data) in &attempt.writes {
            contents_at.entry(*id).or_default().push(data);
        }
    }
    let read = |id: GrainId| -> Result<Option<(Vec<u8>, u64)>, String> {
        let Some(mut reader) = db.read(id).map_err(|e| format!("read({id}): {e}"))? else {
            return Ok(None);
        };
        let sequence = reader.sequence().0;
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut reader, &mut bytes)
            .map_err(|e| format!("reading {id}: {e}"))?;
        Ok(Some((bytes, sequence)))
    };

    // Acknowledged blobs.
    let mut max_acked = 0;
    for attempt in attempts {
        let Some(sequence) = attempt.acked() else {
            continue;
        };
        max_acked = max_acked.max(sequence);
        for (id, data) in &attempt.writes {
            let may_be_freed = any_checkpoint && archived.contains(id);
            match read(*id)? {
                Some((bytes, stored_sequence)) if bytes == *data => {
                    if stored_sequence != sequence {
                        return Err(format!(
                            "{id} of sequence {sequence} is stored with sequence {stored_sequence}"
                        ));
                    }
                }
                Some((bytes, _)) => {
                    let known = contents_at[id].contains(&bytes.as_slice());
                    if !(may_be_freed && known) {
                        return Err(format!(
                            "{id} of acknowledged sequence {sequence} (thread {} #{}) has other \
                             bytes ({} instead of {})",
                            attempt.thread,
                            attempt.index,
                            bytes.len(),
                            data.len()
                        ));
                    }
                }
                None if may_be_freed => {}
                None => {
                    return Err(format!(
                        "{id} of acknowledged sequence {sequence} (thread {} #{}) is missing",
                        attempt.thread, attempt.index
                    ))
                }
            }
        }
    }
    if db.last_committed().0 < max_acked {
        return Err(format!(
            "last_committed {} is below the acknowledged {max_acked}",
            db.last_committed()
        ));
    }

    // Unacknowledged transactions: all or nothing.
    let mut present_unacked = Vec::new();
    for attempt in attempts.iter().filter(|a| a.acked().is_none()) {
        let mut present = 0;
        for (id, data) in &attempt.writes {
            if let Some((bytes, sequence)) = read(*id)? {
                if bytes == *data {
                    present += 1;
                    present_unacked.push((attempt, sequence));
                }
            }
        }
        if present > 0 && !attempt.commit_called {
            return Err(format!(
                "thread {} #{} never committed but {present} of its blobs are visible",
                attempt.thread, attempt.index
            ));
        }
        if present != 0 && present != attempt.writes.len() {
            return Err(format!(
                "unacknowledged thread {} #{} is partly visible: {present} of {} blobs",
                attempt.thread,
                attempt.index,
                attempt.writes.len()
            ));
        }
    }

    // The commit log: acknowledged records after the checkpoint are there,
    // exactly; every record belongs to an attempted transaction.
    let checkpointed_to = db.checkpointed_to().0;
    let log: BTreeMap<u64, CommitRecord> = db
        .commit_log(SequenceId(0))
        .map_err(|e| format!("commit_log: {e}"))?
        .map(|r| (r.sequence.0, r))
        .collect();
    let matches = |attempt: &Attempt, record: &CommitRecord| {
        let s = record.sequence.0;
        record.new_grains.len() == attempt.writes.len()
            && record
                .new_grains
                .iter()
                .zip(&attempt.writes)
                .all(|(g, (id, data))| {
                    g.id == *id && g.length as usize == data.len() && g.crc == grain_crc(s, data)
                })
            && record.archived == attempt.archives
            // A checkpoint stops short of grains that a concurrent one
            // was freeing.
            && match (record.checkpointed_to, attempt.checkpoint_to) {
                (Some(recorded), Some(requested)) => recorded.0 <= requested,
                (None, None) => true,
                _ => false,
            }
            && record.embedded_header == attempt.header.map(Some)
    };
    for attempt in attempts {
        if let Some(sequence) = attempt.acked() {
            if sequence > checkpointed_to {
                match log.get(&sequence) {
                    Some(record) if matches(attempt, record) => {}
                    Some(record) => {
                        return Err(format!(
                            "commit record {sequence} does not match its transaction: {record:?}"
                        ))
                    }
                    None => {
                        return Err(format!(
                            "acknowledged sequence {sequence} is missing from the commit log \
                             (checkpointed to {checkpointed_to})"
                        ))
                    }
                }
            }
        }
    }
    for record in log.values() {
        if record.sequence.0 <= checkpointed_to {
            return Err(format!(
                "record {} is listed although checkpointed to {checkpointed_to}",
                record.sequence
            ));
        }
        if !attempts.iter().any(|a| matches(a, record)) {
            return Err(format!(
                "commit record {} matches no attempted transaction: {record:?}",
                record.sequence
            ));
        }
    }
    let max_target = attempts
        .iter()
        .filter_map(|a| a.checkpoint_to)
        .max()
        .unwrap_or(0);
    if checkpointed_to > max_target {
        return Err(format!(
            "checkpointed_to {checkpointed_to} is above every requested one ({max_target})"
        ));
    }

    // The embedded header: from the last acknowledged header change or a
    // later attempt, and pointing at that attempt's blob.
    let header_attempts: Vec<&Attempt> = attempts.iter().filter(|a| a.header.is_some()).collect();
    let last_acked = header_attempts
        .iter()
        .filter(|a| a.acked().is_some())
        .map(|a| a.index)
        .max();
    match (db.embedded_header(), last_acked) {
        (None, None) => {}
        (None, Some(index)) => {
            return Err(format!("the embedded header of #{index} was lost"));
        }
        (Some(header), last) => {
            let Some(setter) = header_attempts.iter().find(|a| a.header == Some(header)) else {
                return Err(format!("embedded header {header} was never set"));
            };
            if last.is_some_and(|last| setter.index < last) {
                return Err(format!(
                    "embedded header {header} of #{} is older than the acknowledged #{}",
                    setter.index,
                    last.unwrap_or(0)
                ));
            }
            let data = &setter.writes[0].1;
            if read(header)?.map(|(bytes, _)| bytes).as_ref() != Some(data) {
                return Err(format!(
                    "embedded header {header} does not point at its blob"
                ));
            }
        }
    }

    // New transactions get sequences above everything before the cut.
    let mut highest = max_acked.max(db.last_committed().0);
    highest = highest.max(log.keys().next_back().copied().unwrap_or(0));
    for (_, sequence) in &present_unacked {
        highest = highest.max(*sequence);
    }
    let mut tx = db.begin_transaction().map_err(|e| e.to_string())?;
    let id = tx.write(b"after the crash").map_err(|e| e.to_string())?;
    let sequence = tx
        .commit()
        .map_err(|e| format!("commit after recovery: {e}"))?
        .0;
    if sequence <= highest {
        return Err(format!(
            "the first sequence after recovery is {sequence}, not above {highest}"
        ));
    }
    match db.get(id) {
        Ok(Some(bytes)) if bytes == b"after the crash" => {}
        other => return Err(format!("the blob written after recovery: {other:?}")),
    }

    // Nothing leaks: once everything is checkpointed, the grains in use
    // are exactly those of the blobs that read back.
    let mut tx = db.begin_transaction().map_err(|e| e.to_string())?;
    tx.checkpoint_to(db.last_committed())
        .map_err(|e| e.to_string())?;
    tx.commit()
        .map_err(|e| format!("checkpoint after recovery: {e}"))?;
    let mut readable = HashSet::from([id]);
    for (written, data) in attempts.iter().flat_map(|a| a.writes.iter()) {
        if read(*written)?.is_some_and(|(bytes, _)| bytes == *data) {
            readable.insert(*written);
        }
    }
    let stats = db.stats().map_err(|e| format!("stats: {e}"))?;
    let archived_left: u64 = stats.basins.iter().map(|b| b.grains_archived).sum();
    let used: u64 = stats.basins.iter().map(|b| b.grains_used).sum();
    let held: u64 = readable.iter().map(|id| u64::from(id.count())).sum();
    if archived_left != 0 || used != held {
        return Err(format!(
            "after a checkpoint of everything, {archived_left} grains are still archived and \
             {used} are in use where the {} readable blobs hold {held}",
            readable.len()
        ));
    }

    // Last, so that the checks above run even when only this one fails.
    if let Err(e) = db.verify() {
        return Err(format!(
            "{}: verify: {e}{}",
            classify_verify(db, &e),
            explain(db, attempts, &e)
        ));
    }
    Ok(())
}

const TORN_HEADER: &str = "VERIFY-TORN-HEADER";
const FREED_GRAIN: &str = "VERIFY-FREED-GRAIN";

/// Sorts a verify failure after recovery into the kinds seen so far:
/// only invalid copies of doubly stored headers (the copy being written
/// when the power went); grains that no longer hold a blob (`get` is
/// `None`) but are still listed by the stratum header a crashed checkpoint
/// wrote; or anything else.
fn classify_verify(db: &Database, error: &Error) -> &'static str {
    let Error::Verification(report) = error else {
        return "VERIFY-OTHER";
    };
    let mut freed = false;
    for problem in &report.problems {
        match problem.grain {
            None if problem.location.contains("header copy")
                || problem.location.contains("index (copy") => {}
            Some(grain) if matches!(db.get(grain), Ok(None)) => freed = true,
            _ => return "VERIFY-OTHER",
        }
    }
    if freed {
        FREED_GRAIN
    } else {
        TORN_HEADER
    }
}

/// What the workload did with each grain a verify failure names.
fn explain(db: &Database, attempts: &[Attempt], error: &Error) -> String {
    let Error::Verification(report) = error else {
        return String::new();
    };
    let mut out = String::new();
    if let Ok(stats) = db.stats() {
        out += &format!(
            "\n  [state: last committed {}, WAL checkpointed through {}, checkpointed_to {}]",
            stats.last_committed, stats.wal_checkpointed_entry, stats.checkpointed_to
        );
    }
    for grain in report.problems.iter().filter_map(|p| p.grain) {
        out += &format!(
            "\n  [{grain}: get -> {:?}",
            db.get(grain).map(|d| d.map(|d| d.len()))
        );
        for attempt in attempts {
            let wrote = attempt.writes.iter().any(|(id, _)| *id == grain);
            let archived = attempt.archives.contains(&grain);
            if wrote || archived {
                out += &format!(
                    "; thread {} #{} {} it (outcome {:?}, checkpoint_to {:?})",
                    attempt.thread,
                    attempt.index,
                    if wrote { "wrote" } else { "archived" },
                    attempt.outcome,
                    attempt.checkpoint_to
                );
            }
        }
        out += "]";
    }
    out
}

/// Runs the workload on a store of `mode` with a power cut at `point`,
/// reboots and checks. Returns whether the fault fired, or what went
/// wrong. With `jitter`, the disk delays operations at random (seeded by
/// it) during the workload.
fn crash_at(
    (point, mode): (CrashPoint, Mode),
    workload_seed: u64,
    jitter: Option<u64>,
) -> Result<bool, String> {
    let fs = CrashFileSystem::new();
    if let Some(jitter) = jitter {
        fs.jitter(jitter, Duration::from_micros(150));
    }
    fs.inject(point.operation, point.nth, FaultKind::PowerOff);
    let attempts = run_workload(&fs, workload_seed, mode);
    let fired = fs.is_powered_off();
    fs.jitter(0, Duration::ZERO);
    fs.power_loss(point.policy);
    let db = open(&fs, mode).map_err(|e| format!("reopening failed: {e}"))?;
    let checked = checked(|| check(&db, &attempts));
    let acked = attempts.iter().filter(|a| a.acked().is_some()).count();
    checked.map_err(|e| {
        format!(
            "{e} [{acked} of {} transactions acknowledged]",
            attempts.len()
        )
    })?;
    drop(db);
    // A second, clean reopen still sees a healthy database.
    let db = open(&fs, mode).map_err(|e| format!("second reopen failed: {e}"))?;
    if let Err(e) = db.verify() {
        return Err(format!(
            "{}: verify after the second reopen: {e}",
            classify_verify(&db, &e)
        ));
    }
    Ok(fired)
}

/// `SEDIMENT_CRASH_POINT=op:nth:policy[:seed][:encrypted],...` (op: sync,
/// write, syncdir, create, rename, remove, setlen; policy: clean, torn,
/// hole, random) replays only the listed crash points.
fn only_points() -> Option<Vec<(CrashPoint, Mode)>> {
    let text = std::env::var("SEDIMENT_CRASH_POINT").ok()?;
    Some(
        text.split(',')
            .map(|point| {
                let mut parts: Vec<&str> = point.trim().split(':').collect();
                let mode = if parts.last() == Some(&"encrypted") {
                    parts.pop();
                    Mode::Encrypted
                } else {
                    Mode::Plain
                };
                let operation = match parts[0].to_ascii_lowercase().as_str() {
                    "sync" => Operation::Sync,
                    "write" => Operation::Write,
                    "syncdir" => Operation::SyncDir,
                    "create" => Operation::Create,
                    "rename" => Operation::Rename,
                    "remove" => Operation::Remove,
                    "setlen" => Operation::SetLen,
                    other => panic!("unknown operation {other}"),
                };
                let nth = parts[1].parse().expect("nth");
                let policy = match parts[2].to_ascii_lowercase().as_str() {
                    "clean" => PowerLoss::Clean,
                    "torn" | "tornprefix" => PowerLoss::TornPrefix,
                    "hole" | "sectorhole" => PowerLoss::SectorHole,
                    "random" => PowerLoss::Random(parts[3].parse().expect("seed")),
                    other => panic!("unknown policy {other}"),
                };
                (
                    CrashPoint {
                        operation,
                        nth,
                        policy,
                    },
                    mode,
                )
            })
            .collect(),
    )
}

/// `crash_at` on its own thread: a run that does not finish in time is
/// reported (and its thread abandoned) instead of hanging the test.
fn crash_at_with_timeout(
    point: (CrashPoint, Mode),
    workload_seed: u64,
    jitter: Option<u64>,
) -> Result<bool, String> {
    with_timeout(10, move || crash_at(point, workload_seed, jitter))
}

#[test]
fn power_cut_at_every_sync_and_write() {
    let seed = seed("power_cut_at_every_sync_and_write");
    let _watchdog = Watchdog::new("the crash test", Duration::from_secs(600));
    let mut rng = Rng::new(seed);
    let workload_seed = rng.next_u64();
    let started = Instant::now();

    // A run without faults: how many operations of each kind it makes, and
    // a check that the workload itself behaves.
    let fs = CrashFileSystem::new();
    let attempts = run_workload(&fs, workload_seed, Mode::Plain);
    assert_eq!(attempts.len() as u64, THREADS * TRANSACTIONS);
    assert!(attempts.iter().all(|a| a.acked().is_some()), "{attempts:?}");
    let syncs = fs.operation_count(Operation::Sync);
    let writes = fs.operation_count(Operation::Write);
    let fs_counts: BTreeMap<Operation, u64> = [
        Operation::SyncDir,
        Operation::Create,
        Operation::Rename,
        Operation::Remove,
        Operation::SetLen,
    ]
    .into_iter()
    .map(|op| (op, fs.operation_count(op)))
    .collect();
    fs.power_loss(PowerLoss::Clean);
    let db = open(&fs, Mode::Plain).unwrap();
    // The checker is not vacuous: wrong expectations are caught.
    let mut wrong_bytes = attempts.clone();
    let acked = wrong_bytes
        .iter_mut()
        .find(|a| a.acked().is_some() && a.archives.is_empty())
        .unwrap();
    acked.writes[0].1[0] ^= 1;
    let found = check(&db, &wrong_bytes).unwrap_err();
    assert!(found.contains("other bytes"), "{found}");
    let mut partial = attempts.clone();
    let multi = partial
        .iter_mut()
        .find(|a| {
            a.writes.len() > 1
                && !a
                    .writes
                    .iter()
                    .any(|(id, _)| archived_anywhere(&attempts, *id))
        })
        .unwrap();
    multi.outcome = Some(Err("pretend it failed".into()));
    multi.writes[1].1[0] ^= 1;
    let found = check(&db, &partial).unwrap_err();
    assert!(found.contains("partly visible"), "{found}");
    check(&db, &attempts).unwrap();
    // (WAL checkpoints run in the background: usually several happen
    // during the workload, but their number varies.)
    let wal_checkpointed = db.stats().unwrap().wal_checkpointed_entry;
    drop(db);
    println!(
        "fault-free run: {syncs} syncs, {writes} writes, others {fs_counts:?}; WAL \
         checkpointed through entry {wal_checkpointed}"
    );

    let mut points = Vec::new();
    // Every third point (from a random start) on an encrypted store too.
    let encrypted_from = rng.below(3);
    let mut made = 0_u64;
    let mut point = |operation, nth, policy| {
        for mode in Mode::BOTH {
            if mode == Mode::Encrypted && made % 3 != encrypted_from {
                continue;
            }
            let point = CrashPoint {
                operation,
                nth,
                policy,
            };
            points.push((point, mode));
        }
        made += 1;
    };
    // Every sync with every policy (counts vary a little between runs of a
    // multi-threaded workload: go a bit past the fault-free count).
    for nth in 0..syncs + 3 {
        point(Operation::Sync, nth, PowerLoss::Clean);
        point(Operation::Sync, nth, PowerLoss::TornPrefix);
        point(Operation::Sync, nth, PowerLoss::SectorHole);
        point(Operation::Sync, nth, PowerLoss::Random(rng.next_u64()));
    }
    // Every write, torn, and clean or random.
    for nth in 0..writes + 3 {
        point(Operation::Write, nth, PowerLoss::TornPrefix);
        let other = if nth % 2 == 0 {
            PowerLoss::Clean
        } else {
            PowerLoss::Random(rng.next_u64())
        };
        point(Operation::Write, nth, other);
    }
    // Directory syncs, creations, renames, removals, resizes.
    for (operation, count) in &fs_counts {
        for nth in 0..count + 1 {
            point(*operation, nth, PowerLoss::TornPrefix);
            point(*operation, nth, PowerLoss::Random(rng.next_u64()));
        }
    }

    let filtered = only_points();
    if let Some(only) = &filtered {
        println!("SEDIMENT_CRASH_POINT: running only {only:?}");
        points.clone_from(only);
    }

    let mut fired = 0;
    let mut failures = Vec::new();
    let mut hung = 0;
    for point in &points {
        if hung >= 2 {
            failures.push((*point, format!("{HUNG}: skipped after 2 hung crash points")));
            continue;
        }
        match crash_at_with_timeout(*point, workload_seed, None) {
            Ok(true) => fired += 1,
            Ok(false) => {}
            Err(e) => {
                if e.starts_with(HUNG) {
                    hung += 1;
                    eprintln!("crash point {point:?} hung; continuing with the next ones");
                }
                failures.push((*point, e));
            }
        }
    }
    let of_kind = |kind: Option<&str>| -> Vec<String> {
        failures
            .iter()
            .filter(|(_, e)| match kind {
                Some(kind) => e.starts_with(kind),
                None => ![HUNG, TORN_HEADER, FREED_GRAIN]
                    .iter()
                    .any(|k| e.starts_with(k)),
            })
            .map(|(point, e)| format!("{point:?}: {e}"))
            .collect()
    };
    let hung = of_kind(Some(HUNG));
    let torn = of_kind(Some(TORN_HEADER));
    let freed = of_kind(Some(FREED_GRAIN));
    let other = of_kind(None);
    println!(
        "crash points exercised: {} ({fired} power cuts fired mid-run, the rest after the \
         workload) in {:.1?}; {} failed: {} lost or damaged data, {} hung, {} only because \
         verify reports a torn header copy, {} only because verify reports freed grains \
         listed by a crashed checkpoint's stratum header",
        points.len(),
        started.elapsed(),
        failures.len(),
        other.len(),
        hung.len(),
        torn.len(),
        freed.len()
    );
    for failure in other
        .iter()
        .chain(hung.iter().take(3))
        .chain(freed.iter().take(3))
        .chain(torn.iter().take(3))
        .take(25)
    {
        println!("FAILED {failure}");
    }
    if filtered.is_none() {
        assert!(
            fired * 2 > points.len(),
            "most power cuts should fire mid-run"
        );
    }
    let first = |list: &[String]| list.first().cloned().unwrap_or_default();
    assert!(
        other.is_empty(),
        "{} of {} crash points lost or damaged data (workload from test seed {seed}); first: {}",
        other.len(),
        points.len(),
        first(&other)
    );
    assert!(
        hung.is_empty(),
        "{} crash points hung (the workload or the checks after recovery never finished; \
         concurrency.rs reproduces the deadlocks found so far on their own); first: {}",
        hung.len(),
        first(&hung)
    );
    assert!(
        freed.is_empty() && torn.is_empty(),
        "after {} crash points the database recovered with all data intact, but verify() \
         reports problems: {} times a torn copy of a doubly stored header (the copy being \
         written when the power went; the database opened from the other one), {} times \
         freed grains that a crashed checkpoint's stratum header still lists; first: {}",
        freed.len() + torn.len(),
        torn.len(),
        freed.len(),
        if freed.is_empty() {
            first(&torn)
        } else {
            first(&freed)
        }
    );
}

/// Power cuts at random syncs and writes of random workloads while the
/// disk delays every operation at random (and a sync covers only the
/// writes made before it began): interleavings of committers, direct
/// writes, checkpoints and the WAL's threads that the scheduler alone
/// rarely produces. Runs for a fixed time; the printed seed replays it.
#[test]
fn power_cut_with_jittered_io() {
    let seed = seed("power_cut_with_jittered_io");
    let _watchdog = Watchdog::new("the jittered crash test", Duration::from_secs(300));
    let mut rng = Rng::new(seed);
    let started = Instant::now();
    let (mut runs, mut fired) = (0_usize, 0_usize);
    let mut failures = Vec::new();
    // `JITTER_SECONDS` lengthens the run for a hunt.
    let budget = Duration::from_secs(
        std::env::var("JITTER_SECONDS")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(20),
    );
    while started.elapsed() < budget || runs < 10 {
        let workload_seed = rng.next_u64();
        let jitter = rng.next_u64();
        // A fault-free run makes about 60 syncs and 70 writes.
        let point = (CrashPoint::random(&mut rng, 64, 76), Mode::BOTH[runs % 2]);
        runs += 1;
        match crash_at_with_timeout(point, workload_seed, Some(jitter)) {
            Ok(true) => fired += 1,
            Ok(false) => {}
            Err(e) => failures.push(format!(
                "{point:?}, workload seed {workload_seed}, jitter seed {jitter}: {e}"
            )),
        }
        if failures.iter().any(|f| f.contains(HUNG)) {
            break;
        }
    }
    println!(
        "{runs} jittered crash runs ({fired} power cuts fired mid-run) in {:.1?}; {} failed",
        started.elapsed(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {runs} jittered crash runs failed (test seed {seed}); first ones:\n{}",
        failures.len(),
        failures[..failures.len().min(5)].join("\n")
    );
    assert!(
        fired * 2 > runs,
        "only {fired} of {runs} power cuts fired mid-run"
    );
}
