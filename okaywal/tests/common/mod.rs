//! Shared helpers for the integration tests: a seedable generator, a
//! recording `LogManager`, a workload driver and the model of what was
//! committed, against which recovered entries are checked.
//!
//! Every test binary compiles this module on its own and uses a different
//! part of it.
#![allow(dead_code)]

pub mod encryption;
pub mod follow;
#[allow(unused_imports)]
pub use testkit::hooks;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use okaywal::fs::{CrashFileSystem, FaultKind};
use okaywal::{ChunkRecord, Configuration, WriteAheadLog};

/// A log at `/log` on the simulated disk, with 16 KiB segments so that
/// a few entries fill one.
pub fn small_log_on(fs: &CrashFileSystem) -> Configuration {
    Configuration::default_for("/log")
        .file_system(fs.clone())
        .preallocate_bytes(16 * 1024)
        .checkpoint_after_bytes(16 * 1024)
}

/// A seed for a randomized test: `OKAYWAL_TEST_SEED` when set, otherwise
/// the clock; printed so that a failure can be replayed.
pub fn test_seed(test: &str) -> u64 {
    testkit::rng::seed("OKAYWAL_TEST_SEED", test)
}

/// How long a jittered test runs: `JITTER_SECONDS` when set (a longer
/// hunt), otherwise `default_seconds`.
pub fn jitter_budget(default_seconds: u64) -> Duration {
    Duration::from_secs(
        std::env::var("JITTER_SECONDS")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(default_seconds),
    )
}

#[allow(unused_imports)]
pub use testkit::disk::ALL_OPERATIONS;
#[allow(unused_imports)]
pub use testkit::recorder::{lock, read_entry_streaming, Checkpoint, Recorder, Seen, REFUSAL};
#[allow(unused_imports)]
pub use testkit::rng::Rng;

/// How an entry ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Commit,
    Rollback,
    /// Dropped without commit or rollback.
    Drop,
    /// A `begin_chunk` is left unfinished; the commit must then fail.
    UnfinishedChunk,
}

/// One chunk: its bytes and whether it is streamed through `begin_chunk`
/// or written with `write_presealed_chunk` (stored as given in an
/// encrypted log).
#[derive(Debug, Clone)]
pub struct PlannedChunk {
    pub data: Vec<u8>,
    pub streamed: bool,
    pub presealed: bool,
}

#[derive(Debug, Clone)]
pub struct Plan {
    pub chunks: Vec<PlannedChunk>,
    pub end: End,
}

impl Plan {
    pub fn data(&self) -> Vec<Vec<u8>> {
        self.chunks.iter().map(|c| c.data.clone()).collect()
    }
}

/// Shape of a random workload.
#[derive(Debug, Clone, Copy)]
pub struct Mix {
    /// Chunk sizes are drawn from `0..max_chunk`.
    pub max_chunk: usize,
    /// Percent of entries with several chunks.
    pub multi_chunk: u64,
    /// Percent of chunks written with `begin_chunk`.
    pub streamed: u64,
    /// Percent of the other chunks written with `write_presealed_chunk`.
    pub presealed: u64,
    pub rollback: u64,
    pub drop: u64,
    pub unfinished: u64,
    /// Percent of entries with one chunk of 64..320 KiB (written header
    /// first by the log; from 256 KiB on, committed with a sync pass of
    /// the writer's own).
    pub large: u64,
}

impl Default for Mix {
    fn default() -> Self {
        Self {
            max_chunk: 8 * 1024,
            multi_chunk: 25,
            streamed: 25,
            presealed: 30,
            rollback: 6,
            drop: 6,
            unfinished: 0,
            large: 0,
        }
    }
}

pub fn random_plan(rng: &mut Rng, mix: &Mix) -> Plan {
    let roll = rng.below(100);
    let end = if roll < mix.rollback {
        End::Rollback
    } else if roll < mix.rollback + mix.drop {
        End::Drop
    } else if roll < mix.rollback + mix.drop + mix.unfinished {
        End::UnfinishedChunk
    } else {
        End::Commit
    };
    let count = if rng.percent(3) {
        0
    } else if rng.percent(mix.multi_chunk) {
        rng.range(2, 5)
    } else {
        1
    };
    let large = mix.large > 0 && rng.percent(mix.large);
    let chunks = (0..count)
        .map(|i| {
            let len = if large && i == 0 {
                rng.range(64 * 1024, 320 * 1024)
            } else if count > 1 {
                rng.below((mix.max_chunk / 2) as u64 + 1) as usize
            } else {
                rng.below(mix.max_chunk as u64 + 1) as usize
            };
            let data = rng.bytes(len);
            let streamed = rng.percent(mix.streamed);
            let presealed = !streamed && mix.presealed > 0 && rng.percent(mix.presealed);
            PlannedChunk {
                data,
                streamed,
                presealed,
            }
        })
        .collect();
    Plan { chunks, end }
}

/// What happened to one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// `commit` returned `Ok`.
    Committed,
    /// `commit` was called and failed: not acknowledged, but the entry
    /// may be present after recovery (whole).
    Failed,
    /// A chunk write failed before the commit: the entry can never be
    /// committed.
    Aborted,
    /// Rolled back, dropped, or refused because of an unfinished chunk.
    RolledBack,
    /// `begin_entry` failed.
    NotBegun,
}

#[derive(Debug)]
pub struct Done {
    pub id: Option<u64>,
    pub outcome: Outcome,
    pub records: Vec<ChunkRecord>,
    pub error: Option<io::Error>,
}

fn write_streamed(
    entry: &mut okaywal::EntryWriter<'_>,
    data: &[u8],
    rng: &mut Rng,
) -> io::Result<ChunkRecord> {
    let mut writer = entry.begin_chunk(data.len() as u32)?;
    let mut at = 0;
    while at < data.len() {
        let piece = rng.range(1, (data.len() - at).min(3000) + 1);
        writer.write_all(&data[at..at + piece])?;
        at += piece;
    }
    assert_eq!(writer.bytes_remaining(), 0);
    writer.flush()?;
    writer.finish()
}

/// Writes one entry as `plan` says.
pub fn execute(log: &WriteAheadLog, plan: &Plan, rng: &mut Rng) -> Done {
    let mut entry = match log.begin_entry() {
        Ok(entry) => entry,
        Err(error) => {
            return Done {
                id: None,
                outcome: Outcome::NotBegun,
                records: Vec::new(),
                error: Some(error),
            }
        }
    };
    let id = entry.id().0;
    let mut records = Vec::new();
    let fail = |records: Vec<ChunkRecord>, error: io::Error| Done {
        id: Some(id),
        outcome: Outcome::Aborted,
        records,
        error: Some(error),
    };
    for chunk in &plan.chunks {
        let result = if chunk.streamed {
            write_streamed(&mut entry, &chunk.data, rng)
        } else if chunk.presealed {
            entry.write_presealed_chunk(&chunk.data)
        } else {
            entry.write_chunk(&chunk.data)
        };
        match result {
            Ok(record) => {
                assert_eq!(record.length as usize, chunk.data.len());
                assert_eq!(record.crc, crc32fast::hash(&chunk.data), "entry {id}");
                records.push(record);
            }
            Err(error) => {
                drop(entry);
                return fail(records, error);
            }
        }
    }
    match plan.end {
        End::Commit => match entry.commit() {
            Ok(committed) => {
                assert_eq!(committed.0, id);
                Done {
                    id: Some(id),
                    outcome: Outcome::Committed,
                    records,
                    error: None,
                }
            }
            Err(error) => Done {
                id: Some(id),
                outcome: Outcome::Failed,
                records,
                error: Some(error),
            },
        },
        End::Rollback => {
            // A failed rollback still leaves the entry uncommitted.
            let error = entry.rollback().err();
            Done {
                id: Some(id),
                outcome: Outcome::RolledBack,
                records,
                error,
            }
        }
        End::Drop => {
            drop(entry);
            Done {
                id: Some(id),
                outcome: Outcome::RolledBack,
                records,
                error: None,
            }
        }
        End::UnfinishedChunk => {
            let len = rng.range(2, 5000);
            let half = rng.bytes(len / 2);
            let started = match entry.begin_chunk(len as u32) {
                Ok(mut writer) => {
                    let written = writer.write_all(&half);
                    assert!(written.is_err() || writer.bytes_remaining() > 0);
                    written
                }
                Err(error) => Err(error),
            };
            if let Err(error) = started {
                drop(entry);
                return fail(records, error);
            }
            let result = entry.commit();
            assert!(
                result.is_err(),
                "entry {id} committed although one of its chunks was never finished"
            );
            Done {
                id: Some(id),
                outcome: Outcome::RolledBack,
                records,
                error: None,
            }
        }
    }
}

/// What the test knows it wrote.
#[derive(Debug, Default, Clone)]
pub struct Model {
    /// Acknowledged commits.
    pub committed: BTreeMap<u64, Vec<Vec<u8>>>,
    /// Begun, meant to commit, not acknowledged: may be present only whole.
    pub unacked: BTreeMap<u64, Vec<Vec<u8>>>,
    /// Rolled back: must never come back.
    pub rolled_back: BTreeSet<u64>,
    /// Chunk positions of acknowledged commits, with their bytes.
    pub positions: Vec<(ChunkRecord, Vec<u8>)>,
    /// First error seen by any writer.
    pub errors: Vec<String>,
}

impl Model {
    /// The committed ids that `counts` does not list.
    pub fn committed_not_in(&self, counts: &BTreeMap<u64, usize>) -> Vec<u64> {
        self.committed
            .keys()
            .copied()
            .filter(|id| !counts.contains_key(id))
            .collect()
    }

    pub fn record(&mut self, plan: &Plan, done: &Done) {
        if let Some(error) = &done.error {
            self.errors.push(error.to_string());
        }
        let Some(id) = done.id else { return };
        match done.outcome {
            Outcome::Committed => {
                for (record, chunk) in done.records.iter().zip(&plan.chunks) {
                    self.positions.push((*record, chunk.data.clone()));
                }
                self.committed.insert(id, plan.data());
            }
            Outcome::Failed => {
                self.unacked.insert(id, plan.data());
            }
            Outcome::RolledBack | Outcome::Aborted => {
                self.rolled_back.insert(id);
            }
            Outcome::NotBegun => {}
        }
    }

    pub fn merge(&mut self, other: Model) {
        let before = self.committed.len() + other.committed.len();
        self.committed.extend(other.committed);
        assert_eq!(self.committed.len(), before, "two entries share an id");
        self.unacked.extend(other.unacked);
        self.rolled_back.extend(other.rolled_back);
        self.positions.extend(other.positions);
        self.errors.extend(other.errors);
    }

    pub fn max_committed(&self) -> u64 {
        self.committed.keys().next_back().copied().unwrap_or(0)
    }

    /// Checks one entry handed to the manager: it must be a commit (or an
    /// unacknowledged attempt) with exactly the bytes written.
    pub fn check(&self, id: u64, chunks: &[Vec<u8>], what: &str) -> Result<(), String> {
        let expected = if let Some(expected) = self.committed.get(&id) {
            expected
        } else if let Some(expected) = self.unacked.get(&id) {
            expected
        } else if self.rolled_back.contains(&id) {
            return Err(format!("{what}: rolled-back entry {id} came back"));
        } else {
            return Err(format!("{what}: entry {id} was never written"));
        };
        if expected.as_slice() != chunks {
            return Err(format!(
                "{what}: entry {id} has the wrong bytes: expected chunk lengths {:?}, got {:?}",
                expected.iter().map(Vec::len).collect::<Vec<_>>(),
                chunks.iter().map(Vec::len).collect::<Vec<_>>(),
            ));
        }
        Ok(())
    }
}

/// A multi-threaded workload of random entries.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    pub threads: usize,
    pub entries_per_thread: usize,
    pub seed: u64,
    pub mix: Mix,
}

/// How long a workload may take before the test declares it hung.
pub const WORKLOAD_DEADLINE: Duration = Duration::from_secs(30);

/// Runs `workload` on `log`; each thread stops once `begin_entry` fails.
///
/// The writers run on detached threads so that a commit that never returns
/// fails the test (after [`WORKLOAD_DEADLINE`]) instead of hanging it.
pub fn run_workload(log: &WriteAheadLog, workload: &Workload) -> Model {
    try_run_workload(log, workload, WORKLOAD_DEADLINE).unwrap_or_else(|stuck| panic!("{stuck}"))
}

/// [`run_workload`], returning a description of the stuck writers instead
/// of panicking when the deadline passes.
pub fn try_run_workload(
    log: &WriteAheadLog,
    workload: &Workload,
    deadline: Duration,
) -> Result<Model, String> {
    let (sender, receiver) = std::sync::mpsc::channel();
    let progress = Arc::new(AtomicUsize::new(0));
    for thread in 0..workload.threads {
        let log = log.clone();
        let sender = sender.clone();
        let progress = progress.clone();
        let workload = *workload;
        std::thread::Builder::new()
            .name(format!("writer-{thread}"))
            .spawn(move || {
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let mut model = Model::default();
                    let mut rng = Rng::new(workload.seed.wrapping_mul(1_000_003) ^ thread as u64);
                    for _ in 0..workload.entries_per_thread {
                        let plan = random_plan(&mut rng, &workload.mix);
                        let done = execute(&log, &plan, &mut rng);
                        model.record(&plan, &done);
                        progress.fetch_add(1, Ordering::Relaxed);
                        if done.outcome == Outcome::NotBegun {
                            break;
                        }
                    }
                    model
                }));
                let _ = sender.send(result);
            })
            .expect("spawning a writer");
    }
    drop(sender);
    let start = Instant::now();
    let mut model = Model::default();
    for finished in 0..workload.threads {
        let left = deadline.saturating_sub(start.elapsed());
        match receiver.recv_timeout(left) {
            Ok(Ok(part)) => model.merge(part),
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            Err(_) => {
                return Err(format!(
                    "the workload hung: after {deadline:?}, {} of {} writer threads had not \
                     finished ({} of {} entries done); a commit or write never returned",
                    workload.threads - finished,
                    workload.threads,
                    progress.load(Ordering::Relaxed),
                    workload.threads * workload.entries_per_thread,
                ))
            }
        }
    }
    Ok(model)
}

/// Runs `body` while another thread keeps sealing the active segment with
/// `checkpoint_active` (whose result is ignored: the manager may refuse).
pub fn with_sealer<T>(log: &WriteAheadLog, body: impl FnOnce() -> T) -> T {
    let stop = Arc::new(AtomicBool::new(false));
    let sealer = {
        let log = log.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let _ = log.checkpoint_active();
                std::thread::sleep(Duration::from_millis(15));
            }
        })
    };
    let result = body();
    stop.store(true, Ordering::SeqCst);
    sealer.join().expect("the sealing thread panicked");
    result
}

/// Counts how often each id occurs.
pub fn occurrences(ids: impl IntoIterator<Item = u64>) -> BTreeMap<u64, usize> {
    let mut counts = BTreeMap::new();
    for id in ids {
        *counts.entry(id).or_insert(0) += 1;
    }
    counts
}

/// Checks that the entries a first run checkpointed plus the entries a
/// second run recovered are exactly the commits of `model`, each once and
/// with its bytes.
pub fn check_exactly_once(model: &Model, first: &Seen, second: &Seen) -> Result<(), String> {
    let mut handed = Vec::new();
    for checkpoint in &first.checkpoints {
        for (id, chunks) in &checkpoint.entries {
            model.check(*id, chunks, "checkpoint before reopen")?;
            handed.push(*id);
        }
    }
    for (id, chunks) in &first.recovered {
        model.check(*id, chunks, "recovery of first run")?;
        handed.push(*id);
    }
    for (id, chunks) in &second.recovered {
        model.check(*id, chunks, "recovery after reopen")?;
        handed.push(*id);
    }
    if !second.aborted.is_empty() {
        return Err(format!("aborted entries in recovery: {:?}", second.aborted));
    }
    let counts = occurrences(handed);
    let duplicated: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    if !duplicated.is_empty() {
        return Err(format!(
            "entries handed over more than once (id, times): {:?}",
            &duplicated[..duplicated.len().min(10)]
        ));
    }
    let missing = model.committed_not_in(&counts);
    if !missing.is_empty() {
        return Err(format!(
            "{} of {} committed entries were neither checkpointed nor recovered, e.g. {:?}",
            missing.len(),
            model.committed.len(),
            &missing[..missing.len().min(10)]
        ));
    }
    Ok(())
}

/// Polls `condition` until it holds or `timeout` passes.
pub fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if condition() {
            return true;
        }
        if start.elapsed() > timeout {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Calls `checkpoint_active` until it succeeds (checkpoints that began
/// while the manager was refusing may still fail once).
pub fn checkpoint_until_ok(log: &WriteAheadLog) -> io::Result<()> {
    let mut last = None;
    for _ in 0..50 {
        match log.checkpoint_active() {
            Ok(()) => return Ok(()),
            Err(err) => last = Some(err),
        }
    }
    Err(last.expect("at least one attempt"))
}

/// Cuts the power now: the next few operations of every kind are planned
/// to fail as a power cut, so whatever the log's background thread does
/// next cannot reach the disk.
pub fn cut_power(fs: &CrashFileSystem) {
    for op in ALL_OPERATIONS {
        let now = fs.operation_count(op);
        for n in now..now + 16 {
            fs.inject(op, n, FaultKind::PowerOff);
        }
    }
}

/// The names of the files in a real directory.
pub fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("listing the log directory")
        .map(|entry| {
            entry
                .expect("directory entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}
