//! Power cuts (on okaywal's `CrashFileSystem`) at every sync and write of
//! a concurrent workload that mixes `commit` and `commit_buffered`, small
//! blobs and large ones written straight into their grains, archives,
//! `checkpoint_to` and `Database::sync`. After each cut the database is
//! reopened and checked against what the workload was told:
//!
//! - every durable commit that returned survives, and so does every
//!   commit (buffered or not) that returned before a durable commit or a
//!   sync began that then returned;
//! - buffered commits are lost only as a suffix: a commit that began after
//!   a lost one returned is lost too;
//! - no blob reads back other bytes: a blob of a surviving transaction is
//!   intact unless a surviving checkpoint may have freed it (then it is
//!   absent or holds the bytes of a surviving later blob in its grains);
//!   a lost free leaves the archived blob intact, so grains freed by a
//!   buffered commit were not reused before it was durable;
//! - a transaction is wholly present or wholly absent; the commit log
//!   lists exactly the surviving transactions after the checkpoint;
//! - new sequences are above every surviving one; nothing leaks; verify is
//!   clean, also after a second reopen.
//!
//! Every transaction writes a small "marker" blob that is never archived:
//! whether it reads back tells whether the transaction survived.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::crash::{checked, with_timeout, CrashPoint, HUNG};
use common::{blob, seed, Mode, Rng, Watchdog};
use okaywal::fs::{CrashFileSystem, FaultKind, Operation, PowerLoss};
use sediment::{CommitRecord, Config, Database, Error, GrainId, SequenceId};

const THREADS: u64 = 3;
const TRANSACTIONS: u64 = 14;
const DIR: &str = "/buffered-crash-db";

/// How a run opens the store: the sweep runs without background syncs,
/// so that its operation counts repeat; jittered runs may add them. Every
/// other workload of the sweep, and every other jittered run, is on an
/// encrypted store.
#[derive(Debug, Clone, Copy, Default)]
struct Bounds {
    max_unsynced: Option<Duration>,
    max_unsynced_bytes: Option<u64>,
    mode: Mode,
}

impl Bounds {
    /// The store as reopened after the cut: the same mode, no background
    /// syncs.
    fn reopened(self) -> Self {
        Self {
            mode: self.mode,
            ..Self::default()
        }
    }
}

fn open(fs: &CrashFileSystem, bounds: Bounds) -> sediment::Result<Database> {
    let mut config = bounds
        .mode
        .apply(Config::for_directory(DIR))
        .file_system(fs.clone())
        .wal(|wal| {
            wal.checkpoint_after_bytes(24 << 10)
                .preallocate_bytes(32 << 10)
        });
    if let Some(interval) = bounds.max_unsynced {
        config = config.max_unsynced(interval);
    }
    if let Some(bytes) = bounds.max_unsynced_bytes {
        config = config.max_unsynced_bytes(bytes);
    }
    config.open()
}

/// One transaction of the workload and what became of it.
#[derive(Debug, Clone, Default)]
struct Attempt {
    thread: u64,
    index: u64,
    /// The first is the marker.
    writes: Vec<(GrainId, Vec<u8>)>,
    archives: Vec<GrainId>,
    checkpoint_to: Option<u64>,
    buffered: bool,
    /// Ticket taken just before `commit`/`commit_buffered` was called.
    began: Option<u64>,
    /// Ticket taken just after it returned `Ok`.
    returned: Option<u64>,
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

    fn name(&self) -> String {
        format!(
            "thread {} #{} ({}, {:?})",
            self.thread,
            self.index,
            if self.buffered { "buffered" } else { "durable" },
            self.outcome
        )
    }
}

/// A `Database::sync` call and whether it returned `Ok`.
#[derive(Debug, Clone, Copy)]
struct Sync {
    began: u64,
    ok: bool,
}

#[derive(Debug, Default)]
struct Outcome {
    attempts: Vec<Attempt>,
    syncs: Vec<Sync>,
}

/// A thread's transactions: a marker blob and 0-2 more (a quarter large
/// enough to bypass the WAL), archives of its own acknowledged non-marker
/// blobs, a `checkpoint_to` of its last archiving sequence every fourth
/// transaction, 60% committed buffered; now and then a `Database::sync`.
/// Stops at the first error.
fn worker(db: &Database, thread: u64, seed: u64, tickets: &AtomicU64) -> Outcome {
    let mut rng = Rng::new(seed ^ (thread + 1).wrapping_mul(0xA24B_AED4_963E_E407));
    let mut out = Outcome::default();
    let mut archivable: Vec<GrainId> = Vec::new();
    let mut last_archiving = None;
    let ticket = || tickets.fetch_add(1, Ordering::SeqCst);
    for index in 0..TRANSACTIONS {
        if rng.percent(15) {
            let began = ticket();
            let ok = db.sync().is_ok();
            out.syncs.push(Sync { began, ok });
            if !ok {
                break;
            }
        }
        let mut attempt = Attempt {
            thread,
            index,
            buffered: rng.percent(60),
            ..Attempt::default()
        };
        let result = (|| -> sediment::Result<u64> {
            let mut tx = db.begin_transaction()?;
            // Before the first write (see crash.rs).
            if index % 4 == 3 {
                if let Some(sequence) = last_archiving {
                    match tx.checkpoint_to(SequenceId(sequence)) {
                        Ok(()) => attempt.checkpoint_to = Some(sequence),
                        Err(Error::FutureSequence { .. }) => {}
                        Err(e) => return Err(e),
                    }
                }
            }
            let marker = blob(
                thread << 40 | index << 8 | 0xFF,
                rng.between(16, 600) as usize,
            );
            let id = tx.write(&marker)?;
            attempt.writes.push((id, marker));
            for j in 0..rng.between(0, 2) {
                let size = if rng.percent(25) {
                    rng.between(65_536, 90_000)
                } else {
                    rng.between(16, 6000)
                } as usize;
                let data = blob(thread << 40 | index << 8 | j, size);
                let id = tx.write(&data)?;
                attempt.writes.push((id, data));
            }
            if rng.percent(50) {
                for _ in 0..rng.between(1, 2) {
                    if archivable.is_empty() {
                        break;
                    }
                    let id = archivable.swap_remove(rng.below(archivable.len() as u64) as usize);
                    tx.archive(id)?;
                    attempt.archives.push(id);
                }
            }
            attempt.began = Some(ticket());
            let sequence = if attempt.buffered {
                tx.commit_buffered()?
            } else {
                tx.commit()?
            };
            attempt.returned = Some(ticket());
            Ok(sequence.0)
        })();
        match result {
            Ok(sequence) => {
                attempt.outcome = Some(Ok(sequence));
                archivable.extend(attempt.writes.iter().skip(1).map(|(id, _)| *id));
                if !attempt.archives.is_empty() {
                    last_archiving = Some(sequence);
                }
                out.attempts.push(attempt);
            }
            Err(e) => {
                attempt.outcome = Some(Err(e.to_string()));
                out.attempts.push(attempt);
                break;
            }
        }
    }
    out
}

/// Opens the database on `fs`, runs the workload and drops the database
/// (without a shutdown, so nothing more is synced).
fn run_workload(fs: &CrashFileSystem, seed: u64, bounds: Bounds) -> Outcome {
    let Ok(db) = open(fs, bounds) else {
        return Outcome::default();
    };
    let tickets = AtomicU64::new(0);
    let outcomes: Vec<Outcome> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|thread| {
                let (db, tickets) = (&db, &tickets);
                scope.spawn(move || worker(db, thread, seed, tickets))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a workload thread panicked"))
            .collect()
    });
    drop(db);
    let mut all = Outcome::default();
    for outcome in outcomes {
        all.attempts.extend(outcome.attempts);
        all.syncs.extend(outcome.syncs);
    }
    all
}

type Read = Option<(Vec<u8>, u64)>;

fn read(db: &Database, id: GrainId) -> Result<Read, String> {
    let Some(mut reader) = db.read(id).map_err(|e| format!("read({id}): {e}"))? else {
        return Ok(None);
    };
    let sequence = reader.sequence().0;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut reader, &mut bytes)
        .map_err(|e| format!("reading {id}: {e}"))?;
    Ok(Some((bytes, sequence)))
}

/// Everything that must hold after reopening; returns the first violation.
fn check(db: &Database, outcome: &Outcome) -> Result<(), String> {
    let attempts = &outcome.attempts;
    // Which transactions survived: their marker reads back, with the
    // sequence they were acknowledged with if they were.
    let mut survived = vec![false; attempts.len()];
    let mut sequence_of: Vec<Option<u64>> = vec![None; attempts.len()];
    for (i, attempt) in attempts.iter().enumerate() {
        let Some((marker, data)) = attempt.writes.first() else {
            continue;
        };
        match read(db, *marker)? {
            None => {}
            Some((bytes, sequence)) if bytes == *data => {
                if attempt.began.is_none() {
                    return Err(format!("{} never committed but is visible", attempt.name()));
                }
                if attempt.acked().is_some_and(|acked| acked != sequence) {
                    return Err(format!(
                        "{} is stored with sequence {sequence}",
                        attempt.name()
                    ));
                }
                survived[i] = true;
                sequence_of[i] = Some(sequence);
            }
            Some((bytes, _)) => {
                return Err(format!(
                    "the marker {marker} of {} holds other bytes ({} instead of {})",
                    attempt.name(),
                    bytes.len(),
                    data.len()
                ))
            }
        }
    }

    // What must have survived: every durable commit that returned, and
    // every commit that returned before a durable commit or a sync that
    // returned began.
    let mut durable_points: Vec<u64> = attempts
        .iter()
        .filter(|a| !a.buffered && a.acked().is_some())
        .filter_map(|a| a.began)
        .collect();
    durable_points.extend(outcome.syncs.iter().filter(|s| s.ok).map(|s| s.began));
    let latest_durable_point = durable_points.iter().copied().max();
    for (i, attempt) in attempts.iter().enumerate() {
        let Some(returned) = attempt.returned else {
            continue;
        };
        let must = !attempt.buffered || latest_durable_point.is_some_and(|p| returned < p);
        if must && !survived[i] {
            return Err(format!(
                "{} was lost although it returned before a durable commit or sync began \
                 (ticket {returned}, latest durable point {latest_durable_point:?})",
                attempt.name()
            ));
        }
    }
    // Lost only as a suffix: nothing that began after a lost commit
    // returned survives.
    for (i, lost) in attempts.iter().enumerate() {
        let Some(returned) = lost.returned else {
            continue;
        };
        if survived[i] {
            continue;
        }
        for (j, later) in attempts.iter().enumerate() {
            if survived[j] && later.began.is_some_and(|began| began > returned) {
                return Err(format!(
                    "{} was lost, but {} which began after it returned survived",
                    lost.name(),
                    later.name()
                ));
            }
        }
    }

    // Blobs. A blob may have been freed only if a surviving transaction
    // archived it and a surviving one asked for a checkpoint at or past
    // that archive.
    let survivors: Vec<(&Attempt, u64)> = attempts
        .iter()
        .zip(&sequence_of)
        .filter_map(|(a, s)| s.map(|s| (a, s)))
        .collect();
    let highest_checkpoint = survivors.iter().filter_map(|(a, _)| a.checkpoint_to).max();
    // A grain id may name several blobs in turn (freed grains are
    // reused): each archive is matched with blobs written before it.
    let mut archived_by: HashMap<GrainId, Vec<u64>> = HashMap::new();
    for (attempt, sequence) in &survivors {
        for id in &attempt.archives {
            archived_by.entry(*id).or_default().push(*sequence);
        }
    }
    let may_be_freed = |id: &GrainId, written: u64| {
        archived_by.get(id).is_some_and(|by| {
            by.iter()
                .any(|&by| by > written && highest_checkpoint.is_some_and(|to| to >= by))
        })
    };
    let mut surviving_contents: HashMap<GrainId, Vec<&[u8]>> = HashMap::new();
    for (attempt, _) in &survivors {
        for (id, data) in &attempt.writes {
            surviving_contents.entry(*id).or_default().push(data);
        }
    }
    for (i, attempt) in attempts.iter().enumerate() {
        for (id, data) in attempt.writes.iter().skip(1) {
            let found = read(db, *id)?;
            if let Some(written) = sequence_of[i] {
                let may_be_freed = may_be_freed(id, written);
                match found {
                    Some((bytes, _)) if bytes == *data => {}
                    None if may_be_freed => {}
                    Some((bytes, _))
                        if may_be_freed && surviving_contents[id].contains(&bytes.as_slice()) => {}
                    other => {
                        return Err(format!(
                            "{id} of surviving {} reads back {} (archived by {:?}, highest \
                             surviving checkpoint_to {highest_checkpoint:?})",
                            attempt.name(),
                            match other {
                                None => "nothing".to_string(),
                                Some((bytes, s)) => format!("{} other bytes of {s}", bytes.len()),
                            },
                            archived_by.get(id)
                        ))
                    }
                }
            } else if let Some((bytes, _)) = found {
                // Partly visible, or another blob in grains a lost
                // transaction held: only a surviving blob may be there.
                let known = surviving_contents
                    .get(id)
                    .is_some_and(|c| c.contains(&bytes.as_slice()));
                if !known {
                    return Err(format!(
                        "{id} of lost {} reads back {} bytes no surviving transaction wrote",
                        attempt.name(),
                        bytes.len()
                    ));
                }
            }
        }
    }
    let max_survived = sequence_of.iter().flatten().copied().max().unwrap_or(0);
    if db.last_committed().0 < max_survived {
        return Err(format!(
            "last_committed {} is below the surviving {max_survived}",
            db.last_committed()
        ));
    }

    // The commit log lists exactly the surviving transactions after the
    // checkpoint (and checkpoint-only records, which write nothing).
    let checkpointed_to = db.checkpointed_to().0;
    let log: BTreeMap<u64, CommitRecord> = db
        .commit_log(SequenceId(0))
        .map_err(|e| format!("commit_log: {e}"))?
        .map(|r| (r.sequence.0, r))
        .collect();
    for (attempt, sequence) in &survivors {
        if *sequence <= checkpointed_to {
            continue;
        }
        let Some(record) = log.get(sequence) else {
            return Err(format!(
                "surviving {} (sequence {sequence}) is missing from the commit log",
                attempt.name()
            ));
        };
        let ids: Vec<GrainId> = record.new_grains.iter().map(|g| g.id).collect();
        let written: Vec<GrainId> = attempt.writes.iter().map(|(id, _)| *id).collect();
        if ids != written || record.archived != attempt.archives {
            return Err(format!(
                "commit record {sequence} does not match {}: {record:?}",
                attempt.name()
            ));
        }
    }
    for record in log.values() {
        let surviving = survivors.iter().any(|(_, s)| *s == record.sequence.0);
        let checkpoint_only = record.new_grains.is_empty() && record.archived.is_empty();
        if !surviving && !checkpoint_only {
            return Err(format!(
                "commit record {} belongs to no surviving transaction",
                record.sequence
            ));
        }
    }

    // New transactions get sequences above everything that survived.
    let highest = max_survived
        .max(db.last_committed().0)
        .max(log.keys().next_back().copied().unwrap_or(0));
    let mut tx = db.begin_transaction().map_err(|e| e.to_string())?;
    let id = tx.write(b"after the cut").map_err(|e| e.to_string())?;
    let sequence = tx
        .commit_buffered()
        .map_err(|e| format!("commit after recovery: {e}"))?
        .0;
    if sequence <= highest {
        return Err(format!(
            "the first sequence after recovery is {sequence}, not above {highest}"
        ));
    }

    // Nothing leaks: once everything is checkpointed and synced, the
    // grains in use are exactly those of the blobs that read back.
    let mut tx = db.begin_transaction().map_err(|e| e.to_string())?;
    tx.checkpoint_to(db.last_committed())
        .map_err(|e| e.to_string())?;
    tx.commit_buffered()
        .map_err(|e| format!("checkpoint after recovery: {e}"))?;
    db.sync().map_err(|e| format!("sync after recovery: {e}"))?;
    let mut readable = HashSet::from([id]);
    for (written, data) in attempts.iter().flat_map(|a| a.writes.iter()) {
        if read(db, *written)?.is_some_and(|(bytes, _)| bytes == *data) {
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
    db.verify().map_err(|e| format!("verify: {e}"))?;
    Ok(())
}

/// Runs the workload with a power cut at `point`, reboots and checks;
/// returns whether the cut came mid-run, or what went wrong.
fn crash_at(
    point: CrashPoint,
    workload_seed: u64,
    jitter: Option<u64>,
    bounds: Bounds,
) -> Result<bool, String> {
    let fs = CrashFileSystem::new();
    if let Some(jitter) = jitter {
        fs.jitter(jitter, Duration::from_micros(150));
    }
    fs.inject(point.operation, point.nth, FaultKind::PowerOff);
    let outcome = run_workload(&fs, workload_seed, bounds);
    let fired = fs.is_powered_off();
    fs.jitter(0, Duration::ZERO);
    fs.power_loss(point.policy);
    let db = open(&fs, bounds.reopened()).map_err(|e| format!("reopening failed: {e}"))?;
    let checked = checked(|| check(&db, &outcome));
    let acked = outcome
        .attempts
        .iter()
        .filter(|a| a.acked().is_some())
        .count();
    checked.map_err(|e| {
        format!(
            "{e} [{acked} of {} transactions acknowledged]",
            outcome.attempts.len()
        )
    })?;
    drop(db);
    let db = open(&fs, bounds.reopened()).map_err(|e| format!("second reopen failed: {e}"))?;
    db.verify()
        .map_err(|e| format!("verify after the second reopen: {e}"))?;
    Ok(fired)
}

/// `crash_at` on its own thread: a run that does not finish in time is
/// reported instead of hanging the test.
fn crash_at_with_timeout(
    point: CrashPoint,
    workload_seed: u64,
    jitter: Option<u64>,
    bounds: Bounds,
) -> Result<bool, String> {
    with_timeout(15, move || crash_at(point, workload_seed, jitter, bounds))
}

fn report(failures: &[String], runs: usize, seed: u64) {
    assert!(
        failures.is_empty(),
        "{} of {runs} crash runs failed (test seed {seed}); first ones:\n{}",
        failures.len(),
        failures[..failures.len().min(5)].join("\n")
    );
}

/// Workloads swept per run (`SWEEP_WORKLOADS` changes it).
const WORKLOADS: u64 = 3;

#[test]
fn power_cut_at_every_sync_and_write_of_mixed_buffered_and_durable_commits() {
    let seed = seed("power_cut_at_every_sync_and_write_of_mixed_buffered_and_durable_commits");
    let _watchdog = Watchdog::new("the buffered crash test", Duration::from_secs(900));
    let mut rng = Rng::new(seed);
    let workloads = std::env::var("SWEEP_WORKLOADS")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(WORKLOADS);
    let started = Instant::now();
    let (mut total, mut fired) = (0, 0);
    let mut failures = Vec::new();
    for workload in 0..workloads {
        let workload_seed = rng.next_u64();
        let bounds = Bounds {
            mode: Mode::BOTH[workload as usize % 2],
            ..Bounds::default()
        };
        let points = crash_points(workload_seed, &mut rng, bounds);
        total += points.len();
        for point in &points {
            match crash_at_with_timeout(*point, workload_seed, None, bounds) {
                Ok(true) => fired += 1,
                Ok(false) => {}
                Err(e) => failures.push(format!(
                    "{point:?}, {:?}, workload seed {workload_seed}: {e}",
                    bounds.mode
                )),
            }
            if failures.iter().any(|f| f.contains(HUNG)) {
                break;
            }
        }
    }
    println!(
        "{total} crash points over {workloads} workloads ({fired} cuts fired mid-run) in \
         {:.1?}; {} failed",
        started.elapsed(),
        failures.len()
    );
    report(&failures, total, seed);
    assert!(fired * 2 > total, "most power cuts should fire mid-run");
}

/// Runs the workload without faults (checking that it does what the
/// sweep needs, and that the checker accepts it after a clean cut at the
/// end and rejects wrong expectations), and returns a crash point for
/// every sync and every write it made, with several power-loss policies.
fn crash_points(workload_seed: u64, rng: &mut Rng, bounds: Bounds) -> Vec<CrashPoint> {
    let fs = CrashFileSystem::new();
    let outcome = run_workload(&fs, workload_seed, bounds);
    assert_eq!(outcome.attempts.len() as u64, THREADS * TRANSACTIONS);
    assert!(outcome.attempts.iter().all(|a| a.acked().is_some()));
    let buffered = outcome.attempts.iter().filter(|a| a.buffered).count();
    let large = outcome
        .attempts
        .iter()
        .flat_map(|a| a.writes.iter())
        .filter(|(_, data)| data.len() >= 65_536)
        .count();
    let checkpoints = outcome
        .attempts
        .iter()
        .filter(|a| a.checkpoint_to.is_some())
        .count();
    assert!(buffered > 0 && buffered < outcome.attempts.len());
    assert!(large > 0 && checkpoints > 0, "{large} large, {checkpoints}");
    let syncs = fs.operation_count(Operation::Sync);
    let writes = fs.operation_count(Operation::Write);
    fs.power_loss(PowerLoss::Clean);
    let db = open(&fs, bounds.reopened()).unwrap();
    let problems = non_vacuous(&db, &outcome);
    assert!(problems.is_empty(), "{problems:?}");
    check(&db, &outcome).unwrap();
    drop(db);
    println!(
        "fault-free run of workload {workload_seed}: {} transactions ({buffered} buffered, \
         {large} large blobs, {checkpoints} checkpoints, {} syncs called), {syncs} file \
         syncs, {writes} writes",
        outcome.attempts.len(),
        outcome.syncs.len()
    );

    let mut points = Vec::new();
    // Counts vary a little between runs of a multi-threaded workload: go
    // a bit past the fault-free ones.
    for nth in 0..syncs + 3 {
        for policy in [
            PowerLoss::Clean,
            PowerLoss::TornPrefix,
            PowerLoss::SectorHole,
            PowerLoss::Random(rng.next_u64()),
        ] {
            points.push(CrashPoint {
                operation: Operation::Sync,
                nth,
                policy,
            });
        }
    }
    for nth in 0..writes + 3 {
        let other = if nth % 2 == 0 {
            PowerLoss::Clean
        } else {
            PowerLoss::Random(rng.next_u64())
        };
        for policy in [PowerLoss::TornPrefix, PowerLoss::SectorHole, other] {
            points.push(CrashPoint {
                operation: Operation::Write,
                nth,
                policy,
            });
        }
    }
    points
}

/// Feeds the checker outcomes it must reject (each is found before the
/// checker writes anything); returns what it did not reject as expected.
fn non_vacuous(db: &Database, outcome: &Outcome) -> Vec<String> {
    let mut problems = Vec::new();
    // A grain no blob holds: a marker there reads as a lost transaction.
    let nowhere = GrainId::new(0, 0, 200_000, 1).unwrap();
    let archived: HashSet<GrainId> = outcome
        .attempts
        .iter()
        .flat_map(|a| a.archives.iter().copied())
        .collect();
    let never_archived = |a: &Attempt| a.writes.len() > 1 && !archived.contains(&a.writes[1].0);
    type Pick<'a> = &'a dyn Fn(&Attempt) -> bool;
    let cases: [(&str, Pick, &str); 3] = [
        (
            "other bytes in a surviving blob",
            &|a| a.acked().is_some() && never_archived(a),
            "reads back",
        ),
        (
            "a lost durable commit",
            &|a| !a.buffered && a.acked().is_some(),
            "was lost although",
        ),
        (
            "a lost buffered commit with later ones surviving",
            &|a| a.buffered && a.acked().is_some(),
            "was lost",
        ),
    ];
    for (what, pick, expected) in cases {
        let mut changed = Outcome {
            attempts: outcome.attempts.clone(),
            syncs: outcome.syncs.clone(),
        };
        // The earliest such attempt, so that later ones survived.
        let Some(i) = (0..changed.attempts.len())
            .filter(|&i| pick(&changed.attempts[i]))
            .min_by_key(|&i| changed.attempts[i].returned)
        else {
            problems.push(format!("{what}: the workload has no such transaction"));
            continue;
        };
        if what == "other bytes in a surviving blob" {
            changed.attempts[i].writes[1].1[0] ^= 1;
        } else {
            changed.attempts[i].writes[0].0 = nowhere;
        }
        match check(db, &changed) {
            Err(e) if e.contains(expected) => {}
            other => problems.push(format!("{what}: {other:?}")),
        }
    }
    problems
}

/// Power cuts at random syncs and writes of random workloads while the
/// disk delays every operation at random, with the WAL's `max_unsynced`
/// and `max_unsynced_bytes` bounds on in some runs. Runs for a fixed time
/// (`JITTER_SECONDS`, 15 by default); the printed seed replays it.
#[test]
fn power_cut_with_jittered_io_and_background_syncs() {
    let seed = seed("power_cut_with_jittered_io_and_background_syncs");
    let _watchdog = Watchdog::new("the jittered buffered crash test", Duration::from_secs(300));
    let mut rng = Rng::new(seed);
    let started = Instant::now();
    let budget = Duration::from_secs(
        std::env::var("JITTER_SECONDS")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(15),
    );
    let (mut runs, mut fired) = (0_usize, 0_usize);
    let mut failures = Vec::new();
    while started.elapsed() < budget || runs < 10 {
        let workload_seed = rng.next_u64();
        let jitter = rng.next_u64();
        let bounds = Bounds {
            max_unsynced: rng
                .percent(50)
                .then(|| Duration::from_millis(rng.between(1, 5))),
            max_unsynced_bytes: rng.percent(30).then(|| rng.between(2_000, 20_000)),
            mode: Mode::BOTH[runs % 2],
        };
        let point = CrashPoint::random(&mut rng, 50, 90);
        runs += 1;
        match crash_at_with_timeout(point, workload_seed, Some(jitter), bounds) {
            Ok(true) => fired += 1,
            Ok(false) => {}
            Err(e) => {
                let hung = e.starts_with(HUNG);
                failures.push(format!(
                    "{point:?}, {bounds:?}, workload seed {workload_seed}, jitter seed \
                     {jitter}: {e}"
                ));
                if hung {
                    break;
                }
            }
        }
    }
    println!(
        "{runs} jittered crash runs ({fired} power cuts fired mid-run) in {:.1?}; {} failed",
        started.elapsed(),
        failures.len()
    );
    report(&failures, runs, seed);
    assert!(
        fired * 2 > runs,
        "only {fired} of {runs} power cuts fired mid-run"
    );
}
