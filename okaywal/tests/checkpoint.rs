//! Checkpointing: what `checkpoint_to` is handed and in which order (in a
//! plain and in an encrypted log), recycling of segment files, and
//! managers whose checkpoints fail.

mod common;

use std::collections::BTreeSet;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use common::encryption::Encryption;
use common::{
    checkpoint_until_ok, files_in, occurrences, run_workload, Checkpoint, Mix, Model, Recorder,
    Rng, Workload, REFUSAL,
};
use okaywal::fs::{FileHandle, FileSystem, MemoryFileSystem, OpenMode};
use okaywal::Configuration;

const SEGMENT: u64 = 64 * 1024;

fn small_segments(dir: &Path) -> Configuration {
    Configuration::default_for(dir)
        .preallocate_bytes(SEGMENT)
        .checkpoint_after_bytes(SEGMENT)
}

/// Checks the order and contents of successful checkpoints: ids ascending
/// inside a call, never above the call's `last_checkpointed_id`, always
/// above every earlier call's; each commit of `model` exactly once with its
/// bytes, and nothing else.
fn check_checkpoints(model: &Model, checkpoints: &[Checkpoint]) -> Result<(), String> {
    let mut previous_last: Option<u64> = None;
    let mut previous_segment: Option<u64> = None;
    for (n, checkpoint) in checkpoints.iter().enumerate() {
        if let Some(last) = previous_last {
            if checkpoint.last_id <= last {
                return Err(format!(
                    "checkpoint {n}: last id {} not above the previous {last}",
                    checkpoint.last_id
                ));
            }
        }
        if let Some(segment) = previous_segment {
            if checkpoint.segment_id <= segment {
                return Err(format!(
                    "checkpoint {n}: segment {} after segment {segment}",
                    checkpoint.segment_id
                ));
            }
        }
        let mut previous_id = None;
        for (id, chunks) in &checkpoint.entries {
            model.check(*id, chunks, &format!("checkpoint {n}"))?;
            if *id > checkpoint.last_id {
                return Err(format!(
                    "checkpoint {n}: entry {id} above last_checkpointed_id {}",
                    checkpoint.last_id
                ));
            }
            if *id < checkpoint.segment_id {
                return Err(format!(
                    "checkpoint {n}: entry {id} below its segment's first id {}",
                    checkpoint.segment_id
                ));
            }
            if previous_last.is_some_and(|last| *id <= last) {
                return Err(format!(
                    "checkpoint {n}: entry {id} at or below an earlier checkpoint's last id {}",
                    previous_last.unwrap_or_default()
                ));
            }
            if previous_id.is_some_and(|previous| *id <= previous) {
                return Err(format!("checkpoint {n}: entry {id} out of order"));
            }
            previous_id = Some(*id);
        }
        previous_last = Some(checkpoint.last_id);
        previous_segment = Some(checkpoint.segment_id);
    }
    let counts = occurrences(
        checkpoints
            .iter()
            .flat_map(|c| c.entries.iter().map(|(id, _)| *id)),
    );
    if let Some((id, n)) = counts.iter().find(|(_, n)| **n > 1) {
        return Err(format!("entry {id} checkpointed {n} times"));
    }
    let missing = model.committed_not_in(&counts);
    if !missing.is_empty() {
        return Err(format!(
            "{} committed entries never checkpointed, e.g. {:?}",
            missing.len(),
            &missing[..missing.len().min(10)]
        ));
    }
    Ok(())
}

#[test]
fn checkpoints_hand_over_every_entry_once_in_order() {
    for encryption in Encryption::BOTH {
        checkpoints_hand_over_every_entry_once_in_order_in(encryption);
    }
}

fn checkpoints_hand_over_every_entry_once_in_order_in(encryption: Encryption) {
    let small_segments = |dir: &Path| encryption.configure(small_segments(dir));
    let dir = tempfile::tempdir().unwrap();
    let recorder = Recorder::new();
    let log = small_segments(dir.path()).open(recorder.clone()).unwrap();
    let model = run_workload(
        &log,
        &Workload {
            threads: 4,
            entries_per_thread: 400,
            seed: 11,
            mix: Mix {
                max_chunk: 2500,
                ..Mix::default()
            },
        },
    );
    assert!(model.errors.is_empty(), "errors: {:?}", model.errors);
    log.checkpoint_active().unwrap();
    {
        let seen = recorder.seen();
        assert!(seen.checkpoints.len() >= 5, "{}", seen.checkpoints.len());
        check_checkpoints(&model, &seen.checkpoints).unwrap();
    }
    log.shutdown().unwrap();
    drop(log);

    let reopened = Recorder::new();
    let log = small_segments(dir.path()).open(reopened.clone()).unwrap();
    assert!(reopened.seen().recovered.is_empty());
    log.shutdown().unwrap();
}

#[test]
fn recovered_segments_are_checkpointed_in_order_after_reopen() {
    for encryption in Encryption::BOTH {
        recovered_segments_are_checkpointed_in_order_after_reopen_in(encryption);
    }
}

fn recovered_segments_are_checkpointed_in_order_after_reopen_in(encryption: Encryption) {
    let small_segments = |dir: &Path| encryption.configure(small_segments(dir));
    let dir = tempfile::tempdir().unwrap();
    let first = Recorder::refusing();
    let log = small_segments(dir.path()).open(first.clone()).unwrap();
    let mut rng = Rng::new(12);
    let mut model = Model::default();
    for i in 0..200 {
        let mut entry = log.begin_entry().unwrap();
        let len = rng.range(0, 3000);
        let data = rng.bytes(len);
        entry.write_chunk(&data).unwrap();
        model
            .committed
            .insert(entry.commit().unwrap().0, vec![data]);
        if i % 40 == 39 {
            assert!(log.checkpoint_active().is_err());
        }
    }
    log.shutdown().unwrap();
    drop(log);
    assert!(first.seen().checkpoints.is_empty());

    let second = Recorder::new();
    let log = small_segments(dir.path()).open(second.clone()).unwrap();
    log.checkpoint_active().unwrap();
    let seen = second.seen();
    let recovered: BTreeSet<u64> = seen.recovered_ids().into_iter().collect();
    assert_eq!(recovered.len(), model.committed.len());
    assert!(seen.checkpoints.len() >= 5, "{}", seen.checkpoints.len());
    check_checkpoints(&model, &seen.checkpoints).unwrap();
    drop(seen);
    log.shutdown().unwrap();
}

/// Samples the files in the log directory while `body` runs; returns the
/// largest listing seen.
fn max_files_during<T>(
    list: impl Fn() -> Vec<String> + Send + 'static,
    body: impl FnOnce() -> T,
) -> (T, Vec<String>) {
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut largest = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let mut files = list();
                if files.len() > largest.len() {
                    files.sort();
                    largest = files;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            largest
        })
    };
    let result = body();
    stop.store(true, Ordering::SeqCst);
    (result, sampler.join().unwrap())
}

#[test]
fn segment_files_are_recycled_in_a_long_run() {
    let fs = MemoryFileSystem::new();
    let recorder = Recorder::new();
    let log = Configuration::default_for("/long")
        .file_system(fs.clone())
        .preallocate_bytes(SEGMENT)
        .checkpoint_after_bytes(SEGMENT)
        .open(recorder.clone())
        .unwrap();
    let lister = fs.clone();
    let (model, max_files) = max_files_during(
        move || lister.list_files(Path::new("/long")).unwrap(),
        || {
            run_workload(
                &log,
                &Workload {
                    threads: 4,
                    entries_per_thread: 5000,
                    seed: 13,
                    mix: Mix {
                        max_chunk: 1100,
                        multi_chunk: 10,
                        streamed: 10,
                        rollback: 2,
                        drop: 2,
                        ..Mix::default()
                    },
                },
            )
        },
    );
    assert!(model.errors.is_empty(), "errors: {:?}", model.errors);
    log.checkpoint_active().unwrap();
    let seen = recorder.seen();
    // (Segments grow past 64 KiB while no spare file is ready, so there are
    // fewer checkpoints than 64 KiB pieces of data.)
    assert!(seen.checkpoints.len() > 3, "{}", seen.checkpoints.len());
    check_checkpoints(&model, &seen.checkpoints).unwrap();
    drop(seen);
    // At most 5 live segments (writers stall beyond that), 2 spares, one
    // spare being made and one checkpointed file waiting for its readers.
    assert!(
        max_files.len() <= 10,
        "{} files in the log directory at once: {max_files:?}",
        max_files.len()
    );
    log.shutdown().unwrap();
}

#[test]
fn segment_files_are_recycled_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let recorder = Recorder::new();
    let log = small_segments(dir.path()).open(recorder.clone()).unwrap();
    let path = dir.path().to_path_buf();
    let (model, max_files) = max_files_during(
        move || files_in(&path),
        || {
            run_workload(
                &log,
                &Workload {
                    threads: 8,
                    entries_per_thread: 400,
                    seed: 14,
                    mix: Mix {
                        max_chunk: 2000,
                        ..Mix::default()
                    },
                },
            )
        },
    );
    assert!(model.errors.is_empty(), "errors: {:?}", model.errors);
    log.checkpoint_active().unwrap();
    check_checkpoints(&model, &recorder.seen().checkpoints).unwrap();
    assert!(
        max_files.len() <= 10,
        "{} files in the log directory at once: {max_files:?}",
        max_files.len()
    );
    log.shutdown().unwrap();
    let left = files_in(dir.path());
    assert!(left.len() <= 4, "{left:?}");
}

#[test]
fn failing_checkpoints_are_retried_and_lose_nothing() {
    let fs = MemoryFileSystem::new();
    let recorder = Recorder::refusing();
    let config = || {
        Configuration::default_for("/failing")
            .file_system(fs.clone())
            .preallocate_bytes(16 * 1024)
            .checkpoint_after_bytes(16 * 1024)
    };
    let log = config().open(recorder.clone()).unwrap();
    let mut rng = Rng::new(15);
    let mut model = Model::default();
    for i in 0..120 {
        let mut entry = log.begin_entry().unwrap();
        let len = rng.range(100, 1500);
        let data = rng.bytes(len);
        entry.write_chunk(&data).unwrap();
        model
            .committed
            .insert(entry.commit().unwrap().0, vec![data]);
        if i % 30 == 29 {
            // While the manager fails, checkpoint_active reports it.
            let err = log.checkpoint_active().expect_err("the manager refuses");
            assert!(err.to_string().contains(REFUSAL), "{err}");
        }
    }
    let err = log
        .checkpoint_active()
        .expect_err("the manager still refuses");
    assert!(err.to_string().contains(REFUSAL), "{err}");
    assert!(recorder.seen().checkpoints.is_empty());
    let refused_before = recorder.seen().refused.len();
    assert!(refused_before >= 5, "{refused_before}");

    // The manager recovers but fails a few more times after reading every
    // entry; then everything is checkpointed, once.
    recorder.fail_next.store(3, Ordering::SeqCst);
    recorder.allow_checkpoints();
    checkpoint_until_ok(&log).unwrap();
    assert_eq!(recorder.fail_next.load(Ordering::SeqCst), 0);
    {
        let seen = recorder.seen();
        assert!(seen.refused.len() >= refused_before + 3);
        check_checkpoints(&model, &seen.checkpoints).unwrap();
    }
    // More entries after the failures are checkpointed normally.
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(b"after").unwrap();
    model
        .committed
        .insert(entry.commit().unwrap().0, vec![b"after".to_vec()]);
    log.checkpoint_active().unwrap();
    check_checkpoints(&model, &recorder.seen().checkpoints).unwrap();
    log.shutdown().unwrap();
    drop(log);

    let reopened = Recorder::new();
    let log = config().open(reopened.clone()).unwrap();
    assert!(reopened.seen().recovered.is_empty());
    log.shutdown().unwrap();
}

#[test]
fn entries_survive_a_reopen_while_checkpoints_fail() {
    let fs = MemoryFileSystem::new();
    let config = || {
        Configuration::default_for("/refused")
            .file_system(fs.clone())
            .preallocate_bytes(16 * 1024)
            .checkpoint_after_bytes(16 * 1024)
    };
    let first = Recorder::refusing();
    let log = config().open(first.clone()).unwrap();
    let mut rng = Rng::new(16);
    let mut model = Model::default();
    for i in 0..60 {
        let mut entry = log.begin_entry().unwrap();
        let data = rng.bytes(1000);
        entry.write_chunk(&data).unwrap();
        model
            .committed
            .insert(entry.commit().unwrap().0, vec![data]);
        if i % 20 == 19 {
            assert!(log.checkpoint_active().is_err());
        }
    }
    log.shutdown().unwrap();
    drop(log);
    let second = Recorder::new();
    let log = config().open(second.clone()).unwrap();
    common::check_exactly_once(&model, &first.seen(), &second.seen()).unwrap();
    log.shutdown().unwrap();
}

/// A file system whose `sync_data` takes 300 ms on the thread named
/// `slow-leader`, to hold a group-commit sync open at a chosen moment.
#[derive(Debug, Clone)]
struct SlowLeaderFs(MemoryFileSystem);

#[derive(Debug)]
struct SlowLeaderFile(Arc<dyn FileHandle>);

const SLOW_THREAD: &str = "slow-leader";

impl FileHandle for SlowLeaderFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.0.read_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        if std::thread::current().name() == Some(SLOW_THREAD) {
            std::thread::sleep(Duration::from_millis(300));
        }
        self.0.sync_data()
    }
    fn sync_all(&self) -> io::Result<()> {
        self.sync_data()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn len(&self) -> io::Result<u64> {
        self.0.len()
    }
}

impl FileSystem for SlowLeaderFs {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.0.create_dir_all(path)
    }
    fn list_files(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.0.list_files(dir)
    }
    fn exists(&self, path: &Path) -> io::Result<bool> {
        self.0.exists(path)
    }
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn FileHandle>> {
        Ok(Arc::new(SlowLeaderFile(self.0.open(path, mode)?)))
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.0.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.0.remove_file(path)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.0.sync_dir(dir)
    }
}

/// A commit whose segment is checkpointed (by the background thread, which
/// syncs it) while the commit waits behind another thread's sync must still
/// return.
#[test]
fn a_commit_returns_when_its_segment_is_checkpointed_while_it_waits() {
    let fs = SlowLeaderFs(MemoryFileSystem::new());
    let recorder = Recorder::new();
    let log = Configuration::default_for("/race")
        .file_system(fs.clone())
        .preallocate_bytes(SEGMENT)
        .checkpoint_after_bytes(1 << 30)
        .open(recorder.clone())
        .unwrap();

    // Thread B begins an entry in the first segment and waits.
    let (ready_tx, ready_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (done_tx, done_rx) = mpsc::channel();
    let writer = log.clone();
    std::thread::spawn(move || {
        let mut entry = writer.begin_entry().unwrap();
        entry.write_chunk(b"waits behind a slow sync").unwrap();
        ready_tx.send(entry.id()).unwrap();
        go_rx.recv().unwrap();
        done_tx
            .send(entry.commit().map_err(|e| e.to_string()))
            .unwrap();
    });
    let waiting_id = ready_rx.recv().unwrap();

    // Thread C seals that segment: its checkpoint waits for B's entry.
    let sealer = log.clone();
    let sealed = std::thread::spawn(move || sealer.checkpoint_active());
    // A new segment is named only at its first sync, so there is no file
    // to watch for: give the sealer time to switch segments.
    std::thread::sleep(Duration::from_millis(300));

    // Thread A commits in the new segment and leads a slow sync.
    let leader = log.clone();
    let slow = std::thread::Builder::new()
        .name(SLOW_THREAD.into())
        .spawn(move || {
            let mut entry = leader.begin_entry().unwrap();
            entry.write_chunk(b"slow leader").unwrap();
            entry.commit().map_err(|e| e.to_string())
        })
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));

    // B commits now: its segment becomes checkpointable at once and is
    // checkpointed while B waits for A's sync to end.
    go_tx.send(()).unwrap();
    let committed = done_rx.recv_timeout(Duration::from_secs(10));
    let committed = committed.unwrap_or_else(|_| {
        panic!(
            "the commit of entry {waiting_id} never returned (its segment was \
             checkpointed while it waited: {} checkpoints so far)",
            recorder.seen().checkpoints.len()
        )
    });
    assert_eq!(committed.unwrap(), waiting_id);
    slow.join().unwrap().unwrap();
    sealed.join().unwrap().unwrap();
    let seen = recorder.seen();
    assert_eq!(seen.checkpoints.len(), 1);
    assert_eq!(seen.checkpoints[0].entries.len(), 1);
    assert_eq!(seen.checkpoints[0].entries[0].0, waiting_id.0);
    drop(seen);
    log.shutdown().unwrap();
}

/// A segment that grew past its preallocated size (one entry larger than
/// a segment) is cut back to that size when it becomes a spare, so a burst
/// does not keep its disk space.
#[test]
fn recycled_segments_shrink_back_to_their_preallocated_size() {
    segment_grown_by_one_entry_shrinks_when_recycled(16 * SEGMENT);
}

/// The same for a segment that overshot by half its size: an idle log
/// takes the same space whatever it went through.
#[test]
fn a_segment_that_overshot_a_little_shrinks_too() {
    segment_grown_by_one_entry_shrinks_when_recycled(SEGMENT + SEGMENT / 2);
}

fn segment_grown_by_one_entry_shrinks_when_recycled(entry_bytes: u64) {
    let dir = tempfile::tempdir().unwrap();
    let recorder = Recorder::new();
    let log = small_segments(dir.path()).open(recorder.clone()).unwrap();
    let big = vec![7_u8; entry_bytes as usize];
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(&big).unwrap();
    // Measured while the entry is open: once it commits, the idle log may
    // seal, checkpoint and shrink the segment on its own.
    let grown: u64 = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|f| present_len(&f.unwrap().path()))
        .max()
        .unwrap();
    assert!(
        grown > entry_bytes,
        "the segment should have grown: {grown}"
    );
    entry.commit().unwrap();
    log.checkpoint_active().unwrap();
    // Recycling (and so the shrinking) happens on the background thread.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let sizes: Vec<(String, u64)> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|f| {
                let f = f.unwrap();
                let len = present_len(&f.path())?;
                Some((f.file_name().to_string_lossy().into_owned(), len))
            })
            .collect();
        if sizes.iter().all(|(_, len)| *len <= SEGMENT) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a file kept the size of the burst: {sizes:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    log.shutdown().unwrap();
}

/// A new log writes no spare segment file until its active segment is half
/// full (so its first commits have the disk to themselves); from then on
/// one is made ahead of the switch.
#[test]
fn the_next_spare_is_made_once_the_active_segment_is_half_full() {
    let dir = tempfile::tempdir().unwrap();
    let log = small_segments(dir.path()).open(okaywal::LogVoid).unwrap();
    let write = |bytes: usize| {
        let mut entry = log.begin_entry().unwrap();
        entry.write_chunk(&vec![7; bytes]).unwrap();
        entry.commit().unwrap();
    };
    write(100);
    // Long enough for the maintenance thread to have made a spare if it
    // were going to.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(log.stats().spare_segments, 0, "a spare was made at once");
    write(SEGMENT as usize / 2);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while log.stats().spare_segments == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no spare was made for a half-full segment"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(log.stats().live_segments, 1, "no switch happened yet");
    log.shutdown().unwrap();
}

/// Length of the file at `path`, or `None` if it vanished: the log's
/// background thread renames and deletes segments while tests list them.
fn present_len(path: &std::path::Path) -> Option<u64> {
    match std::fs::metadata(path) {
        Ok(meta) => Some(meta.len()),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => None,
        Err(err) => panic!("metadata of {}: {err}", path.display()),
    }
}

#[test]
fn checkpoint_active_retries_a_failed_checkpoint_without_waiting_out_the_backoff() {
    let dir = tempfile::tempdir().unwrap();
    let recorder = Recorder::refusing();
    let log = small_segments(dir.path()).open(recorder.clone()).unwrap();
    let mut rng = Rng::new(21);
    for _ in 0..40 {
        let mut entry = log.begin_entry().unwrap();
        entry.write_chunk(&rng.bytes(3000)).unwrap();
        entry.commit().unwrap();
    }
    // The background thread retries the sealed segments with a growing
    // delay: 0.1, 0.2, 0.4 and 0.8 s, then 1.6 s after the fifth failure.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while recorder.seen().refused.len() < 5 {
        assert!(std::time::Instant::now() < deadline, "no retries");
        std::thread::sleep(Duration::from_millis(5));
    }
    recorder.allow_checkpoints();
    // A caller waiting for a checkpoint gets a new attempt at once.
    let started = std::time::Instant::now();
    log.checkpoint_active().unwrap();
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(1),
        "checkpoint_active waited {waited:?}, as long as the backoff"
    );
    assert!(!recorder.seen().checkpoints.is_empty());
    log.shutdown().unwrap();
}

#[test]
fn checkpoint_active_returns_once_the_segment_is_renamed_as_recycled() {
    // Until the checkpointed segment is renamed, a crash would replay it:
    // the rename is part of the checkpoint. It is made slower than the
    // waiter's idle wake-up, which the waiter must not take for the end.
    let disk = okaywal::fs::CrashFileSystem::new();
    let fs = common::hooks::Hooked::renames(&disk, |to: &Path| {
        let name = to.file_name().unwrap().to_string_lossy();
        if name.starts_with("wal-recycled") {
            std::thread::sleep(Duration::from_millis(400));
        }
    });
    let log = Configuration::default_for("/log")
        .file_system(fs)
        .open(okaywal::LogVoid)
        .unwrap();
    let mut entry = log.begin_entry().unwrap();
    let id = entry.id().0;
    entry.write_chunk(b"checkpointed").unwrap();
    entry.commit().unwrap();
    log.checkpoint_active().unwrap();
    let stats = log.stats();
    assert_eq!(stats.recycled_segments, 1, "{stats:?}");
    let files = disk.list_files(Path::new("/log")).unwrap();
    assert!(
        !files.contains(&format!("wal-{id}")),
        "the checkpointed segment still has its live name: {files:?}"
    );
    log.shutdown().unwrap();
}

/// A manager whose `checkpoint_to` panics fails that checkpoint as if it
/// had returned an error: `checkpoint_active` reports the panic instead of
/// waiting for good, commits go on, and once the manager behaves again
/// every entry is checkpointed and `shutdown` succeeds. (The panic used to
/// end the checkpoint thread: no checkpoint or spare was made again, and
/// `checkpoint_active` never returned.)
#[test]
fn a_panicking_checkpoint_to_fails_the_checkpoint_and_the_log_goes_on() {
    #[derive(Debug, Clone)]
    struct Panicky {
        panic: Arc<AtomicBool>,
        checkpointed: Arc<std::sync::Mutex<BTreeSet<u64>>>,
    }
    impl okaywal::LogManager for Panicky {
        fn recover(&mut self, _: &mut okaywal::Entry<'_>) -> io::Result<()> {
            Ok(())
        }
        fn checkpoint_to(
            &mut self,
            _last: okaywal::EntryId,
            entries: &mut okaywal::SegmentReader,
            _wal: &okaywal::WriteAheadLog,
        ) -> io::Result<()> {
            assert!(!self.panic.load(Ordering::SeqCst), "a bug in the manager");
            while let Some(entry) = entries.read_entry()? {
                self.checkpointed.lock().unwrap().insert(entry.id().0);
            }
            Ok(())
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let manager = Panicky {
        panic: Arc::new(AtomicBool::new(true)),
        checkpointed: Arc::default(),
    };
    let log = small_segments(dir.path()).open(manager.clone()).unwrap();
    let mut rng = Rng::new(7);
    let mut ids = BTreeSet::new();
    for _ in 0..40 {
        let mut entry = log.begin_entry().unwrap();
        entry.write_chunk(&rng.bytes(3000)).unwrap();
        ids.insert(entry.commit().unwrap().0);
    }
    // Asked from another thread, so that a hang fails the test instead.
    let (answer, answered) = mpsc::channel();
    let asking = log.clone();
    std::thread::spawn(move || answer.send(asking.checkpoint_active()).unwrap());
    let err = answered
        .recv_timeout(Duration::from_secs(60))
        .expect("checkpoint_active answers")
        .unwrap_err();
    assert!(err.to_string().contains("panicked"), "{err}");
    // The log takes commits all the while.
    for _ in 0..40 {
        let mut entry = log.begin_entry().unwrap();
        entry.write_chunk(&rng.bytes(3000)).unwrap();
        ids.insert(entry.commit().unwrap().0);
    }
    manager.panic.store(false, Ordering::SeqCst);
    log.checkpoint_active().unwrap();
    assert_eq!(*manager.checkpointed.lock().unwrap(), ids);
    log.shutdown().unwrap();
}

/// A manager that commits an entry into the log from `checkpoint_to` (a
/// marker of how far its store got) while writers of large entries fill
/// segments faster than checkpoints recycle them: nothing stalls, every
/// checkpoint writes its marker, and the markers are in the log after a
/// reopen.
#[test]
fn a_checkpoint_to_that_commits_into_the_log_stalls_nothing() {
    struct Marks(Arc<std::sync::atomic::AtomicU64>);
    impl okaywal::LogManager for Marks {
        fn recover(&mut self, _entry: &mut okaywal::Entry<'_>) -> io::Result<()> {
            Ok(())
        }
        fn checkpoint_to(
            &mut self,
            last: okaywal::EntryId,
            entries: &mut okaywal::SegmentReader,
            wal: &okaywal::WriteAheadLog,
        ) -> io::Result<()> {
            while let Some(mut entry) = entries.read_entry()? {
                entry.read_all_chunks()?;
            }
            let mut marker = wal.begin_entry()?;
            marker.write_chunk(format!("store holds through {}", last.0).as_bytes())?;
            marker.commit()?;
            self.0.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let marks = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let log = small_segments(dir.path())
        .open(Marks(marks.clone()))
        .unwrap();
    let (done, finished) = mpsc::channel();
    let writer_log = log.clone();
    std::thread::spawn(move || {
        std::thread::scope(|scope| {
            for thread in 0..8_u8 {
                let log = &writer_log;
                scope.spawn(move || {
                    for i in 0..100 {
                        let mut entry = log.begin_entry().unwrap();
                        entry.write_chunk(&vec![thread; 200_000]).unwrap();
                        if i % 2 == 0 {
                            entry.commit().unwrap();
                        } else {
                            entry.commit_buffered().unwrap();
                        }
                    }
                });
            }
        });
        writer_log.checkpoint_active().unwrap();
        done.send(()).unwrap();
    });
    finished
        .recv_timeout(Duration::from_secs(120))
        .expect("the writers and the checkpoint did not finish within 120 s");
    let written = marks.load(Ordering::Relaxed);
    assert!(written > 10, "only {written} checkpoints");
    log.shutdown().unwrap();
    drop(log);

    // Reopened, the markers written by the last checkpoints are still in
    // the log: replayed, or handed to the next checkpoint.
    let recorder = Recorder::new();
    let log = small_segments(dir.path()).open(recorder.clone()).unwrap();
    log.checkpoint_active().unwrap();
    let seen = recorder.seen();
    let texts: Vec<String> = seen
        .recovered
        .iter()
        .cloned()
        .chain(seen.checkpointed())
        .map(|(_, chunks)| String::from_utf8_lossy(&chunks.concat()).into_owned())
        .collect();
    drop(seen);
    assert!(
        texts.iter().any(|t| t.starts_with("store holds through ")),
        "{} entries after the reopen, no marker",
        texts.len()
    );
    log.shutdown().unwrap();
}
