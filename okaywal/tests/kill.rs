//! Real-process crash test: a child process (this test binary, re-run with
//! an environment variable) commits entries from several threads and prints
//! each acknowledged id; the parent SIGKILLs it at seeded random moments,
//! reopens the log and checks every acknowledged entry. The log is
//! encrypted when its directory is named [`ENCRYPTED_DIR`].
//!
//! Replay a failing run with `OKAYWAL_KILL_SEED=<seed>`.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use okaywal::encryption::StaticKey;
use okaywal::Configuration;
use testkit::kill::{child_dir, pattern, KillRuns, Report};
use testkit::recorder::{Checkpoint, Recorder};

const CHILD_ENV: &str = "OKAYWAL_KILL_CHILD_DIR";
/// The last word of every whole line of the checkpointed-entries file.
const LINE_END: &str = "end";
const KILLS: usize = 50;
/// Kills of the encrypted log: fewer, the plain runs cover the timing.
const ENCRYPTED_KILLS: usize = 20;
/// The name of a log directory whose log (in the child and the parent)
/// is encrypted.
const ENCRYPTED_DIR: &str = "encrypted-log";

/// The payload of entry `id`: its length and bytes follow from the id, so
/// the parent can check any recovered entry, acknowledged or not.
fn payload(id: u64) -> Vec<u8> {
    let len = match id % 7 {
        0 => 0,
        1..=4 => (id % 300) as usize,
        5 => 4096 + (id % 5000) as usize,
        // Past 256 KiB an entry's writer runs a sync pass of its own,
        // which overlaps the others' (and may join one already running).
        6 if id % 2 == 0 => 300_000 + (id % 50_000) as usize,
        _ => 100_000 + (id % 50_000) as usize,
    };
    pattern(id, len)
}
fn config(dir: &Path) -> Configuration {
    let config = Configuration::default_for(dir)
        .preallocate_bytes(256 * 1024)
        .checkpoint_after_bytes(256 * 1024);
    if dir.file_name() == Some(ENCRYPTED_DIR.as_ref()) {
        config.encryption(StaticKey::new(*b"the kill test's key, not secret."))
    } else {
        config
    }
}

/// Records recovered entries; every accepted checkpoint appends its
/// entries' ids, each with whether its bytes are right, to a synced file
/// (the "primary store"), so the parent knows which entries left the log
/// legitimately.
///
/// A SIGKILL can cut that append short (a write stops between pages when
/// the process is killed), and the next process appends after the cut:
/// so every batch starts on a line of its own, every line ends with
/// [`LINE_END`], and the parent reads only whole lines. A cut batch is a
/// checkpoint that never returned, whose segment was not recycled: its
/// entries are still in the log.
fn recorder(dir: &Path) -> Recorder {
    let checkpointed_file = dir.with_extension("checkpointed");
    Recorder {
        on_checkpoint: Some(Arc::new(move |checkpoint: &Checkpoint| {
            let mut lines = String::from("\n");
            for (id, chunks) in &checkpoint.entries {
                let ok = chunks.concat() == payload(*id);
                lines.push_str(&format!("{id} {ok} {LINE_END}\n"));
            }
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&checkpointed_file)?;
            file.write_all(lines.as_bytes())?;
            file.sync_all()
        })),
        ..Recorder::new()
    }
}

/// Runs only inside the child process.
#[test]
fn child_process() {
    let Some(dir) = child_dir(CHILD_ENV) else {
        return;
    };
    let dir = dir.as_path();
    let log = config(dir)
        .open(recorder(dir))
        .expect("child opens the log");
    let report = Report::new();
    std::thread::scope(|scope| {
        for thread in 0..4 {
            let (log, report) = (&log, report.clone());
            scope.spawn(move || loop {
                let mut entry = log.begin_entry().expect("begin");
                let id = entry.id().0;
                let bytes = payload(id);
                if id % 11 == 3 {
                    entry.write_chunk(&bytes).expect("write");
                    entry.rollback().expect("rollback");
                    continue;
                }
                let (first, second) = bytes.split_at(bytes.len() / 2);
                entry.write_chunk(first).expect("write");
                if thread % 2 == 0 {
                    entry.write_chunk(second).expect("write");
                } else {
                    let mut chunk = entry.begin_chunk(second.len() as u32).expect("begin chunk");
                    chunk.write_all(second).expect("stream");
                    chunk.finish().expect("finish");
                }
                entry.commit().expect("commit");
                report.line(format_args!("ACK {id}"));
            });
        }
    });
}

#[test]
fn sigkill_at_random_moments_loses_no_acknowledged_entry() {
    sigkill_at_random_moments("log", KILLS);
}

#[test]
fn sigkill_at_random_moments_loses_no_acknowledged_entry_of_an_encrypted_log() {
    sigkill_at_random_moments(ENCRYPTED_DIR, ENCRYPTED_KILLS);
}

/// Kills the child `kills` times, its log in a directory named `name`.
fn sigkill_at_random_moments(name: &str, kills: usize) {
    let seed = testkit::rng::seed(
        "OKAYWAL_KILL_SEED",
        "sigkill_at_random_moments_loses_no_acknowledged_entry",
    );
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join(name);
    let checkpointed_file = dir.with_extension("checkpointed");
    let mut acknowledged_total = 0;
    let mut highest_id = 0;
    let runs = KillRuns {
        child_test: "child_process",
        child_env: CHILD_ENV,
        dir: dir.clone(),
        kills,
        delay_ms: 20..170,
    };
    runs.run(seed, |kill, lines| {
        let acked: BTreeSet<u64> = lines
            .iter()
            .filter_map(|line| line.strip_prefix("ACK "))
            .map(|id| id.trim().parse::<u64>().unwrap())
            .collect();
        acknowledged_total += acked.len();

        let manager = recorder(&dir);
        let log = config(&dir)
            .open(manager.clone())
            .unwrap_or_else(|e| panic!("seed {seed}, kill {kill}: reopening failed: {e}"));
        let recovered: BTreeMap<u64, Vec<u8>> = manager
            .seen()
            .recovered
            .iter()
            .map(|(id, chunks)| (*id, chunks.concat()))
            .collect();
        let checkpointed = read_checkpointed(&checkpointed_file);
        for id in &acked {
            let found = recovered.contains_key(id) || checkpointed.contains_key(id);
            assert!(
                found,
                "seed {seed}, kill {kill}: acknowledged entry {id} is missing"
            );
        }
        for (id, bytes) in &recovered {
            assert_eq!(
                *bytes,
                payload(*id),
                "seed {seed}, kill {kill}: entry {id} has wrong bytes"
            );
            assert!(
                id % 11 != 3,
                "seed {seed}, kill {kill}: rolled-back entry {id} was recovered"
            );
            highest_id = highest_id.max(*id);
        }
        for (id, ok) in &checkpointed {
            assert!(*ok, "seed {seed}: checkpointed entry {id} had wrong bytes");
            assert!(
                id % 11 != 3,
                "seed {seed}: rolled-back entry {id} was checkpointed"
            );
        }
        // New entries continue after everything seen so far. (This entry
        // writes a chunk: an id that left nothing at all on disk may be
        // handed out again after a reopen.)
        let mut entry = log.begin_entry().unwrap();
        assert!(
            entry.id().0 > highest_id,
            "seed {seed}, kill {kill}: entry ids went backwards: new id {} after {highest_id}",
            entry.id().0
        );
        highest_id = entry.id().0;
        entry.write_chunk(b"next").unwrap();
        entry.rollback().unwrap();
        log.shutdown().unwrap();
    });
    println!("{name}: {kills} kills, {acknowledged_total} acknowledged commits checked");
    assert!(
        acknowledged_total > 0,
        "the child never acknowledged anything"
    );
}

/// The entries the checkpointed-entries file records, each with whether
/// its bytes were right, from whole lines only (see [`recorder`]).
fn read_checkpointed(path: &Path) -> BTreeMap<u64, bool> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| match line.split(' ').collect::<Vec<_>>()[..] {
            [id, ok, LINE_END] => Some((id.parse().ok()?, ok == "true")),
            _ => None,
        })
        .collect()
}

/// A line cut by a kill and the line appended after it read as nothing,
/// not as a made-up entry: "3976" cut short and "3958 true end" after it
/// once read as entry 39763958.
#[test]
fn a_cut_line_of_the_checkpointed_file_is_not_read_as_an_entry() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.checkpointed");
    std::fs::write(
        &path,
        "\n12 true end\n3976\n3958 true end\n45 tr\n77 false end\n",
    )
    .unwrap();
    let read = read_checkpointed(&path);
    assert_eq!(
        read,
        BTreeMap::from([(12, true), (3958, true), (77, false)])
    );
}
