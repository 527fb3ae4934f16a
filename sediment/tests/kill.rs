//! Real-process crash tests: a child process (this test binary, re-run
//! with an environment variable) runs transactions from several threads
//! and prints each acknowledged one; the parent SIGKILLs it at seeded
//! random moments, reopens the database and checks every acknowledged
//! blob. One child commits every transaction with `commit`; the other
//! commits two in three with `commit_buffered`, the rest with `commit`,
//! and now and then calls `Database::sync`; a third does the same on an
//! encrypted store. A killed process leaves the page cache behind, so no
//! acknowledged commit may be lost, buffered or not, encrypted or not.
//!
//! Replay a failing run with `SEDIMENT_KILL_SEED=<seed>`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use sediment::{Config, Database, GrainId, SequenceId};
use testkit::kill::{child_dir, child_run, pattern, KillRuns, Report};

mod common;
use common::Mode;

const DURABLE_CHILD_ENV: &str = "SEDIMENT_KILL_CHILD_DIR";
const BUFFERED_CHILD_ENV: &str = "SEDIMENT_BUFFERED_KILL_CHILD_DIR";
const ENCRYPTED_CHILD_ENV: &str = "SEDIMENT_ENCRYPTED_KILL_CHILD_DIR";

fn payload(key: u64) -> Vec<u8> {
    let len = match key % 9 {
        0 => 0,
        1..=5 => (key % 2000) as usize,
        6 | 7 => 8000 + (key % 9000) as usize,
        _ => 70_000 + (key % 60_000) as usize,
    };
    pattern(key, len)
}

fn open(dir: &Path, mode: Mode) -> sediment::Result<Database> {
    mode.apply(Config::for_directory(dir).wal(|wal| {
        wal.preallocate_bytes(512 * 1024)
            .checkpoint_after_bytes(512 * 1024)
    }))
    .open()
}

/// How the child commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Commits {
    /// Every transaction with `commit`.
    Durable,
    /// Two in three with `commit_buffered`, a `Database::sync` now and then.
    Buffered,
}

/// The child's work: transactions of 1–3 blobs, archiving an older blob of
/// its own every fifth, `checkpoint_to` past an archive every seventh, a
/// rollback every thirteenth. `ARCH grain` is printed before an archive
/// is committed, `ACK sequence grain key` after each acknowledged commit.
fn child(env: &str, commits: Commits, mode: Mode) {
    let Some(dir) = child_dir(env) else {
        return;
    };
    let run = child_run();
    let db = open(&dir, mode).expect("child opens the database");
    let report = Report::new();
    std::thread::scope(|scope| {
        for thread in 0..3_u64 {
            let (db, report) = (&db, report.clone());
            scope.spawn(move || {
                let mut mine: Vec<GrainId> = Vec::new();
                let mut last_archive: Option<SequenceId> = None;
                for counter in 0.. {
                    let key = run << 32 | thread << 24 | counter;
                    let mut tx = db.begin_transaction().expect("begin");
                    let mut written = Vec::new();
                    for blob in 0..1 + key % 3 {
                        let key = key << 2 | blob;
                        written.push((tx.write(&payload(key)).expect("write"), key));
                    }
                    if counter % 5 == 4 && mine.len() > 2 {
                        let victim = mine.remove(0);
                        report.line(format_args!("ARCH {victim}"));
                        tx.archive(victim).expect("archive");
                    }
                    if counter % 7 == 6 {
                        if let Some(sequence) = last_archive {
                            tx.checkpoint_to(sequence).expect("checkpoint_to");
                        }
                    }
                    if counter % 13 == 12 {
                        tx.rollback();
                        continue;
                    }
                    let sequence = if commits == Commits::Buffered && counter % 3 != 0 {
                        tx.commit_buffered().expect("commit_buffered")
                    } else {
                        tx.commit().expect("commit")
                    };
                    if commits == Commits::Buffered && counter % 11 == 10 {
                        db.sync().expect("sync");
                    }
                    if counter % 5 == 4 {
                        last_archive = Some(sequence);
                    }
                    for (grain, key) in &written {
                        report.line(format_args!("ACK {} {grain} {key}", sequence.0));
                        mine.push(*grain);
                    }
                }
            });
        }
    });
}

/// Runs only inside a child process.
#[test]
fn child_process() {
    child(DURABLE_CHILD_ENV, Commits::Durable, Mode::Plain);
}

/// Runs only inside a child process.
#[test]
fn buffered_child_process() {
    child(BUFFERED_CHILD_ENV, Commits::Buffered, Mode::Plain);
}

/// Runs only inside a child process.
#[test]
fn encrypted_child_process() {
    child(ENCRYPTED_CHILD_ENV, Commits::Buffered, Mode::Encrypted);
}

/// Kills `child_test` `kills` times and checks, after each kill, that every
/// acknowledged blob not offered for archiving is intact, that the store
/// verifies, and that no acknowledged sequence is beyond the recovered one.
/// `mode` is the child's: the store is reopened with the same key.
fn kill_and_check(
    test: &str,
    child_test: &'static str,
    child_env: &'static str,
    kills: usize,
    mode: Mode,
) {
    let seed = testkit::rng::seed("SEDIMENT_KILL_SEED", test);
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("db");
    // Blobs acknowledged and never offered for archiving: must stay intact.
    let mut kept: BTreeMap<GrainId, u64> = BTreeMap::new();
    let mut archived: BTreeSet<GrainId> = BTreeSet::new();
    let mut acknowledged_transactions = 0;
    let mut highest_sequence = 0;
    let runs = KillRuns {
        child_test,
        child_env,
        dir: dir.clone(),
        kills,
        delay_ms: 30..230,
    };
    runs.run(seed, |kill, lines| {
        let mut sequences = BTreeSet::new();
        for line in &lines {
            let fields: Vec<&str> = line.split_whitespace().collect();
            match fields.as_slice() {
                ["ACK", sequence, grain, key] => {
                    let sequence = sequence.parse::<u64>().unwrap();
                    sequences.insert(sequence);
                    highest_sequence = highest_sequence.max(sequence);
                    kept.insert(
                        grain.parse::<GrainId>().unwrap(),
                        key.parse::<u64>().unwrap(),
                    );
                }
                ["ARCH", grain] => {
                    archived.insert(grain.parse::<GrainId>().unwrap());
                }
                _ => {}
            }
        }
        acknowledged_transactions += sequences.len();
        kept.retain(|grain, _| !archived.contains(grain));

        let db = open(&dir, mode)
            .unwrap_or_else(|e| panic!("seed {seed}, kill {kill}: reopen failed: {e}"));
        for (grain, key) in &kept {
            let stored = db
                .get(*grain)
                .unwrap_or_else(|e| panic!("seed {seed}, kill {kill}: get {grain}: {e}"));
            assert_eq!(
                stored.as_deref(),
                Some(&payload(*key)[..]),
                "seed {seed}, kill {kill}: acknowledged blob {grain} (key {key}) is wrong or missing"
            );
        }
        if let Err(err) = db.verify() {
            panic!("seed {seed}, kill {kill}: verify failed: {err}");
        }
        assert!(
            db.last_committed().0 >= highest_sequence,
            "seed {seed}, kill {kill}: acknowledged sequence {highest_sequence} is beyond the recovered {}",
            db.last_committed()
        );
        db.shutdown().unwrap();
    });
    println!(
        "{kills} kills, {acknowledged_transactions} acknowledged transactions, {} blobs checked",
        kept.len()
    );
    assert!(acknowledged_transactions > 0);
}

#[test]
fn sigkill_at_random_moments_loses_no_acknowledged_transaction() {
    kill_and_check(
        "sigkill_at_random_moments_loses_no_acknowledged_transaction",
        "child_process",
        DURABLE_CHILD_ENV,
        50,
        Mode::Plain,
    );
}

#[test]
fn sigkill_loses_no_acknowledged_buffered_or_durable_commit() {
    kill_and_check(
        "sigkill_loses_no_acknowledged_buffered_or_durable_commit",
        "buffered_child_process",
        BUFFERED_CHILD_ENV,
        30,
        Mode::Plain,
    );
}

#[test]
fn sigkill_of_an_encrypted_store_loses_no_acknowledged_commit() {
    kill_and_check(
        "sigkill_of_an_encrypted_store_loses_no_acknowledged_commit",
        "encrypted_child_process",
        ENCRYPTED_CHILD_ENV,
        30,
        Mode::Encrypted,
    );
}
