//! Real-process crash test with buffered commits: a child process (this
//! test binary, re-run with an environment variable) runs transactions
//! from several threads, two in three committed with `commit_buffered`,
//! the rest with `commit`, now and then a `Database::sync`, and prints each
//! acknowledged one; the parent SIGKILLs it at seeded random moments,
//! reopens the database and checks every acknowledged blob. A killed
//! process leaves the page cache behind, so no acknowledged commit may be
//! lost, buffered or not.
//!
//! Replay a failing run with `SEDIMENT_KILL_SEED=<seed>`.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sediment::{Config, Database, GrainId, SequenceId};

const CHILD_ENV: &str = "SEDIMENT_BUFFERED_KILL_CHILD_DIR";
const RUN_ENV: &str = "SEDIMENT_BUFFERED_KILL_RUN";
const KILLS: usize = 30;

fn payload(key: u64) -> Vec<u8> {
    let len = match key % 9 {
        0 => 0,
        1..=5 => (key % 2000) as usize,
        6 | 7 => 8000 + (key % 9000) as usize,
        _ => 70_000 + (key % 60_000) as usize,
    };
    let mut state = key.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

fn open(dir: &Path) -> sediment::Result<Database> {
    Config::for_directory(dir)
        .wal(|wal| {
            wal.preallocate_bytes(512 * 1024)
                .checkpoint_after_bytes(512 * 1024)
        })
        .open()
}

/// Runs only inside the child process.
#[test]
fn buffered_child_process() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let run: u64 = std::env::var(RUN_ENV).unwrap().parse().unwrap();
    let db = open(Path::new(&dir)).expect("child opens the database");
    let stdout = Arc::new(Mutex::new(io::stdout()));
    std::thread::scope(|scope| {
        for thread in 0..3_u64 {
            let (db, stdout) = (&db, stdout.clone());
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
                        {
                            let mut out = stdout.lock().unwrap();
                            writeln!(out, "ARCH {victim}").unwrap();
                            out.flush().unwrap();
                        }
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
                    let sequence = if counter % 3 == 0 {
                        tx.commit().expect("commit")
                    } else {
                        tx.commit_buffered().expect("commit_buffered")
                    };
                    if counter % 11 == 10 {
                        db.sync().expect("sync");
                    }
                    if counter % 5 == 4 {
                        last_archive = Some(sequence);
                    }
                    let mut out = stdout.lock().unwrap();
                    for (grain, key) in &written {
                        writeln!(out, "ACK {} {grain} {key}", sequence.0).unwrap();
                        mine.push(*grain);
                    }
                    out.flush().unwrap();
                }
            });
        }
    });
}

fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn sigkill_loses_no_acknowledged_buffered_or_durable_commit() {
    let seed: u64 = std::env::var("SEDIMENT_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    println!("seed {seed} (replay with SEDIMENT_KILL_SEED={seed})");
    let mut rng = seed;
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("db");
    // Blobs acknowledged and never offered for archiving: must stay intact.
    let mut kept: BTreeMap<GrainId, u64> = BTreeMap::new();
    let mut archived: BTreeSet<GrainId> = BTreeSet::new();
    let mut acknowledged_transactions = 0;
    let mut highest_sequence = 0;
    for kill in 0..KILLS {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "buffered_child_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, &dir)
            .env(RUN_ENV, kill.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn child");
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut acks = Vec::new();
            let mut archives = Vec::new();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let fields: Vec<&str> = line.split_whitespace().collect();
                match fields.as_slice() {
                    ["ACK", sequence, grain, key] => acks.push((
                        sequence.parse::<u64>().unwrap(),
                        grain.parse::<GrainId>().unwrap(),
                        key.parse::<u64>().unwrap(),
                    )),
                    ["ARCH", grain] => archives.push(grain.parse::<GrainId>().unwrap()),
                    _ => {}
                }
            }
            (acks, archives)
        });
        std::thread::sleep(Duration::from_millis(30 + next(&mut rng) % 200));
        child.kill().expect("SIGKILL the child");
        child.wait().unwrap();
        let (acks, archives) = reader.join().unwrap();
        acknowledged_transactions += acks.iter().map(|a| a.0).collect::<BTreeSet<_>>().len();
        archived.extend(archives);
        for (sequence, grain, key) in acks {
            highest_sequence = highest_sequence.max(sequence);
            kept.insert(grain, key);
        }
        kept.retain(|grain, _| !archived.contains(grain));

        let db =
            open(&dir).unwrap_or_else(|e| panic!("seed {seed}, kill {kill}: reopen failed: {e}"));
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
    }
    println!(
        "{KILLS} kills, {acknowledged_transactions} acknowledged transactions, {} blobs checked",
        kept.len()
    );
    assert!(acknowledged_transactions > 0);
}
