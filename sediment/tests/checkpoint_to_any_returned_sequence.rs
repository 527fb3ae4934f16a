//! A sequence that a commit returned is committed, for every thread at
//! once: `checkpoint_to` accepts it even while transactions with lower
//! sequences are still running on other threads. The checkpoint's commit
//! waits for those and frees exactly the grains archived at or below the
//! sequence: none archived above it.
//!
//! The workload runs in this process and, once more, in a child process
//! (this test binary, re-run with an environment variable) on a real
//! directory that the parent reopens after the child has exited without a
//! shutdown.
//!
//! Replay a failing run with `SEDIMENT_TEST_SEED=<seed>`.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::Duration;

use common::{blob, Rng, Watchdog};
use sediment::{Config, Database, Error, GrainId, SequenceId};

const CHILD_ENV: &str = "SEDIMENT_CHECKPOINT_CHILD_DIR";
const SEED_ENV: &str = "SEDIMENT_CHECKPOINT_CHILD_SEED";

/// A committed blob: its id and how to make its bytes again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Blob {
    id: GrainId,
    tag: u64,
    len: usize,
}

impl Blob {
    fn bytes(&self) -> Vec<u8> {
        blob(self.tag, self.len)
    }
}

/// What the threads did, as far as their commits returned.
#[derive(Debug, Default)]
struct Shared {
    /// Blobs archived by committed transactions, with the sequence that
    /// archived them (recorded once the archiving commit returned).
    archived: Mutex<Vec<(u64, Blob)>>,
    /// The highest sequence any commit has returned.
    highest_returned: AtomicU64,
}

/// One committed checkpoint: the sequence it was given and the sequence
/// its commit returned.
#[derive(Debug, Clone, Copy)]
struct Checkpoint {
    requested: u64,
    committed_at: u64,
}

/// Checks, right after the checkpoint to `requested` committed, every
/// archive recorded so far: at or below `requested` it is freed (its
/// grains hold nothing or a newer blob), above it the blob is intact.
/// Archives whose commits returned but are not recorded yet are checked by
/// later calls.
fn check_frees(db: &Database, shared: &Shared, requested: u64, what: &str) {
    let archived = shared.archived.lock().unwrap().clone();
    for (archived_by, blob) in archived {
        let now = db.get(blob.id).unwrap();
        if archived_by <= requested {
            assert_ne!(
                now.as_deref(),
                Some(&blob.bytes()[..]),
                "{what}: {} archived by sequence {archived_by} survived the checkpoint to \
                 {requested}",
                blob.id
            );
        } else {
            assert_eq!(
                now.as_deref(),
                Some(&blob.bytes()[..]),
                "{what}: {} archived by sequence {archived_by}, above the checkpoint to \
                 {requested}, was freed",
                blob.id
            );
        }
    }
}

/// One thread's share: transactions of a few blobs that archive some of
/// the thread's own earlier blobs; with `checkpoints`, every few
/// transactions also call `checkpoint_to` with the highest sequence any
/// thread's commit has returned so far, before or after writing.
fn worker(
    db: &Database,
    shared: &Shared,
    thread: u64,
    seed: u64,
    transactions: u64,
    checkpoints: bool,
) -> Vec<Checkpoint> {
    let mut rng = Rng::new(seed ^ (thread + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut archivable: Vec<Blob> = Vec::new();
    let mut made = Vec::new();
    for i in 0..transactions {
        let checkpointing = checkpoints && i % 4 == 3;
        let mut tx = db.begin_transaction().unwrap();
        let mut requested = None;
        let mut checkpoint = |tx: &mut sediment::Transaction<'_>| {
            let highest = shared.highest_returned.load(Ordering::SeqCst);
            match tx.checkpoint_to(SequenceId(highest)) {
                Ok(()) => requested = Some(highest),
                Err(err) => panic!(
                    "thread {thread}: checkpoint_to({highest}), a sequence a commit returned, \
                     failed: {err}"
                ),
            }
        };
        let early = rng.percent(50);
        if checkpointing && early {
            checkpoint(&mut tx);
        }
        let mut written = Vec::new();
        // This transaction's sequence is fixed by its first write and is at
        // most this.
        let mut own_at_most = 0;
        for j in 0..rng.between(1, 3) {
            let len = if rng.percent(5) {
                rng.between(65 << 10, 80 << 10)
            } else {
                rng.between(8, 3000)
            } as usize;
            let tag = thread << 48 | i << 8 | j;
            let id = tx.write(&blob(tag, len)).unwrap();
            if j == 0 {
                own_at_most = tx.sequence().expect("known after a write").0;
            }
            written.push(Blob { id, tag, len });
        }
        let mut archiving = Vec::new();
        if !archivable.is_empty() && rng.percent(50) {
            for _ in 0..rng.between(1, 2) {
                if archivable.is_empty() {
                    break;
                }
                let at = rng.below(archivable.len() as u64) as usize;
                let blob = archivable.swap_remove(at);
                tx.archive(blob.id).unwrap();
                archiving.push(blob);
            }
        }
        if checkpointing && !early {
            // Mostly a sequence above this transaction's own: the case of a
            // record that cannot free grains archived after it. The other
            // threads usually get there within a few commits.
            for _ in 0..100 {
                if shared.highest_returned.load(Ordering::SeqCst) > own_at_most {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            checkpoint(&mut tx);
        }
        if !checkpointing && rng.percent(10) {
            tx.rollback();
            archivable.extend(archiving);
            continue;
        }
        let sequence = tx.commit().unwrap().0;
        shared
            .highest_returned
            .fetch_max(sequence, Ordering::SeqCst);
        if !archiving.is_empty() {
            let mut archived = shared.archived.lock().unwrap();
            archived.extend(archiving.iter().map(|blob| (sequence, *blob)));
        }
        archivable.extend(written);
        if let Some(requested) = requested {
            let what = format!("thread {thread}, transaction {i}");
            assert!(
                db.checkpointed_to().0 >= requested,
                "{what}: checkpointed to {} after committing a checkpoint to {requested}",
                db.checkpointed_to()
            );
            check_frees(db, shared, requested, &what);
            made.push(Checkpoint {
                requested,
                committed_at: sequence,
            });
        }
    }
    made
}

/// Four threads; thread 0 also checkpoints. Returns the checkpoints made
/// and every archive.
fn run(db: &Database, seed: u64, transactions: u64) -> (Vec<Checkpoint>, Vec<(u64, Blob)>) {
    let shared = Shared::default();
    let checkpoints = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..4_u64)
            .map(|thread| {
                let shared = &shared;
                scope.spawn(move || worker(db, shared, thread, seed, transactions, thread == 0))
            })
            .collect();
        let mut all = Vec::new();
        for thread in threads {
            all.extend(thread.join().unwrap());
        }
        all
    });
    assert!(!checkpoints.is_empty());
    let archived = shared.archived.into_inner().unwrap();
    (checkpoints, archived)
}

/// With every thread done and every archive recorded: what the last
/// checkpoint freed and what it left.
fn check_after_run(db: &Database, checkpoints: &[Checkpoint], archived: &[(u64, Blob)]) {
    let last = checkpoints
        .iter()
        .map(|checkpoint| checkpoint.requested)
        .max()
        .expect("checkpoints were made");
    let shared = Shared {
        archived: Mutex::new(archived.to_vec()),
        highest_returned: AtomicU64::new(0),
    };
    check_frees(db, &shared, last, "after the run");
    assert_eq!(db.checkpointed_to().0, last);
    db.verify().unwrap();
}

#[test]
fn four_threads_checkpoint_to_the_highest_returned_sequence() {
    let seed = common::seed("four_threads_checkpoint_to_the_highest_returned_sequence");
    let _watchdog = Watchdog::new("the checkpointing workload", Duration::from_secs(300));
    let db = Config::for_directory("/db")
        .file_system(okaywal::fs::MemoryFileSystem::new())
        .wal(|wal| {
            wal.preallocate_bytes(256 << 10)
                .checkpoint_after_bytes(256 << 10)
        })
        .open()
        .unwrap();
    let (checkpoints, archived) = run(&db, seed, 200);
    println!(
        "{} checkpoints, {} archived blobs",
        checkpoints.len(),
        archived.len()
    );
    check_after_run(&db, &checkpoints, &archived);
    db.shutdown().unwrap();
}

/// Runs only inside the child process: the workload on a real directory,
/// then one line per checkpoint and per archive on stdout, and an exit
/// without a shutdown.
#[test]
fn child_process() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let seed: u64 = std::env::var(SEED_ENV).unwrap().parse().unwrap();
    let db = Config::for_directory(&dir)
        .wal(|wal| {
            wal.preallocate_bytes(256 << 10)
                .checkpoint_after_bytes(256 << 10)
        })
        .open()
        .unwrap();
    let (checkpoints, archived) = run(&db, seed, 120);
    let mut out = std::io::stdout().lock();
    // The test harness may have started a line ("test child_process ...").
    writeln!(out).unwrap();
    for checkpoint in checkpoints {
        writeln!(
            out,
            "CHECKPOINT {} {}",
            checkpoint.requested, checkpoint.committed_at
        )
        .unwrap();
    }
    for (sequence, blob) in archived {
        writeln!(
            out,
            "ARCHIVED {sequence} {} {} {}",
            blob.id.as_u64(),
            blob.tag,
            blob.len
        )
        .unwrap();
    }
    writeln!(out, "DONE").unwrap();
    out.flush().unwrap();
    // No shutdown: the next open replays the WAL.
    std::process::exit(0);
}

#[test]
fn a_child_process_checkpoints_to_returned_sequences_and_the_frees_survive_reopening() {
    let seed = common::seed(
        "a_child_process_checkpoints_to_returned_sequences_and_the_frees_survive_reopening",
    );
    let _watchdog = Watchdog::new("the child process workload", Duration::from_secs(300));
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, dir.path())
        .env(SEED_ENV, seed.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "the child failed: {output:?}");
    let mut checkpoints = Vec::new();
    let mut archived = Vec::new();
    let mut done = false;
    for line in BufReader::new(&output.stdout[..]).lines() {
        let line = line.unwrap();
        let fields: Vec<&str> = line.split_whitespace().collect();
        let number = |at: usize| -> u64 { fields[at].parse().unwrap() };
        match fields.first() {
            Some(&"CHECKPOINT") => checkpoints.push(Checkpoint {
                requested: number(1),
                committed_at: number(2),
            }),
            Some(&"ARCHIVED") => archived.push((
                number(1),
                Blob {
                    id: GrainId::from_u64(number(2)).unwrap(),
                    tag: number(3),
                    len: number(4) as usize,
                },
            )),
            Some(&"DONE") => done = true,
            _ => {}
        }
    }
    assert!(done, "the child did not finish its report: {output:?}");
    for checkpoint in &checkpoints {
        assert!(checkpoint.committed_at > 0);
    }

    let db = Database::recover(dir.path()).unwrap();
    check_after_run(&db, &checkpoints, &archived);
    // What stayed archived is freed by a checkpoint after the reopen.
    let mut tx = db.begin_transaction().unwrap();
    tx.checkpoint_to(db.last_committed()).unwrap();
    tx.commit().unwrap();
    for (_, blob) in &archived {
        assert_ne!(
            db.get(blob.id).unwrap().as_deref(),
            Some(&blob.bytes()[..]),
            "{} survived a checkpoint past everything",
            blob.id
        );
    }
    db.verify().unwrap();
    db.shutdown().unwrap();
}

/// Transaction A (a lower sequence) is still running on another thread
/// when B's commit returns; a checkpoint to B's sequence is accepted at
/// once, and its commit frees what A archives as well as what B archived,
/// but nothing a transaction after B archived.
#[test]
fn a_checkpoint_to_a_returned_sequence_frees_what_earlier_running_transactions_archive() {
    let _watchdog = Watchdog::new("the checkpoint waiting for A", Duration::from_secs(120));
    let db = Database::in_memory();
    let blobs: Vec<GrainId> = {
        let mut tx = db.begin_transaction().unwrap();
        let ids = (0..3).map(|i| tx.write(&blob(i, 100)).unwrap()).collect();
        tx.commit().unwrap();
        ids
    };
    let (by_a, by_b, after_b) = (blobs[0], blobs[1], blobs[2]);

    let (a_ready, a_is_ready) = mpsc::channel();
    let (go_a, a_may_go) = mpsc::channel::<()>();
    let (checkpointed, checkpoint_done) = mpsc::channel();
    let b = std::thread::scope(|scope| {
        // Owned here, so that a failure below drops it and A stops waiting.
        let go_a = go_a;
        let db = &db;
        let a = scope.spawn(move || {
            let mut a = db.begin_transaction().unwrap();
            a.write(b"A holds its sequence").unwrap();
            a.archive(by_a).unwrap();
            a_ready.send(()).unwrap();
            a_may_go.recv().unwrap();
            a.commit().unwrap()
        });
        a_is_ready.recv().unwrap();

        let mut b = db.begin_transaction().unwrap();
        b.write(b"B").unwrap();
        b.archive(by_b).unwrap();
        let b = b.commit().unwrap();
        let mut c = db.begin_transaction().unwrap();
        c.archive(after_b).unwrap();
        let c = c.commit().unwrap();
        assert!(c > b);

        scope.spawn(move || {
            let mut tx = db.begin_transaction().unwrap();
            let accepted = tx.checkpoint_to(b);
            let committed = accepted.and_then(|()| tx.commit());
            checkpointed.send(committed).unwrap();
        });
        // Give the checkpoint time to reach its commit before A commits
        // (it must then wait for A; if it got here later, it has nothing
        // to wait for, and the outcome must be the same).
        let early = checkpoint_done.recv_timeout(Duration::from_millis(300));
        assert!(
            early.is_err(),
            "the checkpoint did not wait for A: {early:?}"
        );
        go_a.send(()).unwrap();
        let a = a.join().unwrap();
        assert!(a < b, "A's sequence {a} is below B's {b}");
        checkpoint_done.recv().unwrap().unwrap();
        b
    });
    assert_eq!(db.checkpointed_to(), b);
    assert_eq!(db.get(by_a).unwrap(), None, "archived by A, below B");
    assert_eq!(db.get(by_b).unwrap(), None, "archived by B");
    assert_eq!(
        db.get(after_b).unwrap().as_deref(),
        Some(&blob(2, 100)[..]),
        "archived after B: stays"
    );
    db.verify().unwrap();
}

/// A transaction that began writing before the sequence it checkpoints to
/// was handed out: its commit returns its own sequence, with its changes
/// and the checkpoint both committed.
#[test]
fn a_checkpoint_past_the_transactions_own_sequence_frees_what_later_ones_archived() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::recover(dir.path()).unwrap();
    let (early, late) = {
        let mut tx = db.begin_transaction().unwrap();
        let early = tx.write(b"archived before").unwrap();
        let late = tx.write(b"archived after").unwrap();
        tx.commit().unwrap();
        (early, late)
    };
    let mut tx = db.begin_transaction().unwrap();
    tx.archive(early).unwrap();
    tx.commit().unwrap();

    let mut checkpointing = db.begin_transaction().unwrap();
    let written = checkpointing
        .write(b"written by the checkpointing one")
        .unwrap();
    let mut other = db.begin_transaction().unwrap();
    other.archive(late).unwrap();
    other.write(b"a later sequence").unwrap();
    let later = other.commit().unwrap();
    checkpointing.checkpoint_to(later).unwrap();
    let own = checkpointing.commit().unwrap();
    assert!(own < later, "{own} {later}");
    assert_eq!(db.checkpointed_to(), later);
    assert_eq!(db.get(early).unwrap(), None);
    assert_eq!(
        db.get(late).unwrap(),
        None,
        "archived above the own sequence"
    );
    assert_eq!(
        db.get(written).unwrap().as_deref(),
        Some(&b"written by the checkpointing one"[..])
    );
    db.verify().unwrap();
    db.shutdown().unwrap();

    let db = Database::recover(dir.path()).unwrap();
    assert_eq!(db.checkpointed_to(), later);
    assert_eq!(db.get(early).unwrap(), None);
    assert_eq!(db.get(late).unwrap(), None);
    assert_eq!(
        db.get(written).unwrap().as_deref(),
        Some(&b"written by the checkpointing one"[..])
    );
    db.verify().unwrap();
    db.shutdown().unwrap();
}

/// A commit that would wait for a transaction its own thread holds open
/// fails instead of hanging; once that transaction commits, the same
/// checkpoint goes through.
#[test]
fn a_checkpoint_that_would_wait_for_the_own_threads_transaction_fails() {
    let _watchdog = Watchdog::new(
        "a checkpoint held by its own thread",
        Duration::from_secs(60),
    );
    let db = Database::in_memory();
    let id = {
        let mut tx = db.begin_transaction().unwrap();
        let id = tx.write(b"archived while the other runs").unwrap();
        tx.commit().unwrap();
        id
    };
    let mut held = db.begin_transaction().unwrap();
    held.write(b"held open").unwrap();
    let mut tx = db.begin_transaction().unwrap();
    tx.archive(id).unwrap();
    let archived = tx.commit().unwrap();

    let mut tx = db.begin_transaction().unwrap();
    tx.checkpoint_to(archived).unwrap();
    match tx.commit() {
        Err(Error::CheckpointBlockedByOwnTransaction { requested, open }) => {
            assert_eq!(requested, archived.0);
            assert!(open < requested);
        }
        other => panic!("{other:?}"),
    }
    assert!(db.get(id).unwrap().is_some(), "nothing was freed");
    held.commit().unwrap();
    let mut tx = db.begin_transaction().unwrap();
    tx.checkpoint_to(archived).unwrap();
    tx.commit().unwrap();
    assert_eq!(db.get(id).unwrap(), None);
    db.verify().unwrap();
}

/// A transaction is held by the thread that last used it. Moved to
/// another thread and used there, it is that thread's: a checkpoint there
/// that would wait for it fails instead of waiting forever, and a
/// checkpoint on the thread it came from waits for it to commit.
#[test]
fn a_transaction_moved_to_another_thread_is_held_by_the_thread_that_uses_it() {
    let _watchdog = Watchdog::new(
        "a checkpoint and a moved transaction",
        Duration::from_secs(60),
    );
    let db = Database::in_memory();
    let id = {
        let mut tx = db.begin_transaction().unwrap();
        let id = tx.write(b"archived while the moved one runs").unwrap();
        tx.commit().unwrap();
        id
    };
    let mut moved = db.begin_transaction().unwrap();
    let open = moved.write(b"begun on the first thread").unwrap();
    let open_sequence = moved.sequence().unwrap();
    let mut tx = db.begin_transaction().unwrap();
    tx.archive(id).unwrap();
    let archived = tx.commit().unwrap();

    // Used on the second thread, it is the second thread's.
    let moved = std::thread::scope(|s| {
        s.spawn(|| {
            let mut moved = moved;
            moved.write(b"written on the second thread").unwrap();
            let mut tx = db.begin_transaction().unwrap();
            tx.checkpoint_to(archived).unwrap();
            match tx.commit() {
                Err(Error::CheckpointBlockedByOwnTransaction { requested, open }) => {
                    assert_eq!((requested, open), (archived.0, open_sequence.0));
                }
                other => panic!("the second thread's checkpoint: {other:?}"),
            }
            moved
        })
        .join()
        .unwrap()
    });
    assert!(db.get(id).unwrap().is_some(), "nothing was freed");

    // Moved on and used there, it no longer blocks this thread: this
    // checkpoint waits for its commit, then frees the archived blob.
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut moved = moved;
            moved.write(b"and on a third").unwrap();
            std::thread::sleep(Duration::from_millis(200));
            moved.commit().unwrap();
        });
        std::thread::sleep(Duration::from_millis(50));
        let mut tx = db.begin_transaction().unwrap();
        tx.checkpoint_to(archived).unwrap();
        tx.commit().unwrap();
    });
    assert_eq!(db.get(id).unwrap(), None);
    assert!(db.get(open).unwrap().is_some());
    db.verify().unwrap();
}

/// Sequences above every returned one are still refused.
#[test]
fn a_sequence_no_commit_has_returned_is_refused() {
    let db = Database::in_memory();
    let mut tx = db.begin_transaction().unwrap();
    tx.write(b"x").unwrap();
    let committed = tx.commit().unwrap();
    // Begun and written, so it holds the next sequence, not returned yet.
    let mut running = db.begin_transaction().unwrap();
    running.write(b"y").unwrap();
    let mut tx = db.begin_transaction().unwrap();
    match tx.checkpoint_to(SequenceId(committed.0 + 1)) {
        Err(Error::FutureSequence {
            requested,
            committed: last,
        }) => {
            assert_eq!(requested, committed.0 + 1);
            assert_eq!(last, committed.0);
            assert_eq!(db.last_committed(), committed);
        }
        other => panic!("{other:?}"),
    }
    running.rollback();
}

/// The same refusal when the checkpoint is past the transaction's own
/// sequence: it comes before anything is committed, so the transaction's
/// own changes are rolled back with it.
#[test]
fn a_checkpoint_past_the_own_sequence_held_up_by_the_own_thread_commits_nothing() {
    let _watchdog = Watchdog::new(
        "a checkpoint held by its own thread",
        Duration::from_secs(60),
    );
    let db = Database::in_memory();
    let mut held = db.begin_transaction().unwrap();
    held.write(b"held open").unwrap();
    let mut checkpointing = db.begin_transaction().unwrap();
    let written = checkpointing.write(b"never committed").unwrap();
    let mut later = db.begin_transaction().unwrap();
    later.write(b"a later sequence").unwrap();
    let later = later.commit().unwrap();
    checkpointing.checkpoint_to(later).unwrap();
    match checkpointing.commit() {
        Err(Error::CheckpointBlockedByOwnTransaction { requested, open }) => {
            assert_eq!(requested, later.0);
            assert!(open < requested);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(db.get(written).unwrap(), None, "rolled back");
    held.commit().unwrap();
    assert_eq!(db.checkpointed_to().0, 0);
    db.verify().unwrap();
}
