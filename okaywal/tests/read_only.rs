//! Opening a log read-only and inspecting it: the entries recovery would
//! hand over, with not one byte, name or modification time changed; the
//! shared lock against writers; what inspection reports about damage.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

mod common;

// Records every recovered entry's chunks and refuses checkpoints, so
// that segments stay live.
use common::follow::ChunkRecorder as Recorder;
use okaywal::{Configuration, EntryId, LogVoid, RecoveryMode};
use testkit::disk::snapshot;

fn config(dir: &Path) -> Configuration {
    Configuration::default_for(dir)
        .preallocate_bytes(16 << 10)
        .checkpoint_after_bytes(4 << 10)
}

/// A log left by a process that died after committing: several
/// segments, never checkpointed. Returns what was committed, with the
/// position of each entry's first chunk.
fn crashed_log(dir: &Path) -> BTreeMap<u64, (Vec<Vec<u8>>, okaywal::LogPosition)> {
    let log = config(dir).open(Recorder::default()).unwrap();
    let mut committed = BTreeMap::new();
    for i in 0..40_u32 {
        let chunks = vec![format!("entry {i}").into_bytes(), vec![i as u8; 300]];
        let mut entry = log.begin_entry().unwrap();
        let first = entry.write_chunk(&chunks[0]).unwrap().position;
        entry.write_chunk(&chunks[1]).unwrap();
        let id = entry.commit().unwrap();
        committed.insert(id.0, (chunks, first));
    }
    // The process dies: no shutdown, no checkpoint.
    drop(log);
    committed
}

#[test]
fn a_read_only_open_recovers_every_entry_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let committed = crashed_log(dir.path());
    let before = snapshot(dir.path());
    // File times have a coarse grain on some file systems.
    std::thread::sleep(std::time::Duration::from_millis(20));

    let recorder = Recorder::default();
    let log = config(dir.path()).open_read_only(recorder.clone()).unwrap();
    let recovered = recorder.recovered.lock().unwrap().clone();
    assert_eq!(
        recovered,
        committed
            .iter()
            .map(|(id, (chunks, _))| (*id, chunks.clone()))
            .collect::<BTreeMap<_, _>>()
    );
    assert!(log.segment_count() > 1, "the log spans several segments");
    assert_eq!(
        log.last_entry_id(),
        committed.keys().next_back().map(|id| EntryId(*id))
    );
    for (chunks, position) in committed.values() {
        let reader = log.read_at(*position).unwrap();
        assert_eq!(reader.read_all().unwrap(), chunks[0]);
    }
    drop(log);
    assert_eq!(
        snapshot(dir.path()),
        before,
        "a read-only open wrote to the log"
    );

    // Opening for writing afterwards still recovers everything.
    let recorder = Recorder::default();
    config(dir.path()).open(recorder.clone()).unwrap();
    assert_eq!(recorder.recovered.lock().unwrap().len(), committed.len());
}

#[test]
fn read_only_opens_share_the_lock_and_keep_writers_out() {
    let dir = tempfile::tempdir().unwrap();
    crashed_log(dir.path());
    let first = config(dir.path()).open_read_only(LogVoid).unwrap();
    let second = config(dir.path()).open_read_only(LogVoid).unwrap();
    let err = config(dir.path()).open(LogVoid).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::WouldBlock, "{err}");
    assert!(err.to_string().contains("okaywal.lock"), "{err}");
    drop((first, second));

    let writer = config(dir.path()).open(LogVoid).unwrap();
    let err = config(dir.path()).open_read_only(LogVoid).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::WouldBlock, "{err}");
    writer.shutdown().unwrap();
    drop(writer);
    config(dir.path()).open_read_only(LogVoid).unwrap();
}

#[test]
fn a_second_open_in_the_same_process_is_refused_and_other_descriptors_do_not_release_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let log = config(dir.path()).open(LogVoid).unwrap();
    let err = config(dir.path()).open(LogVoid).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::WouldBlock, "{err}");
    // Another descriptor of the lock file, opened and closed: a POSIX
    // record lock would be dropped with it.
    drop(std::fs::File::open(dir.path().join("okaywal.lock")).unwrap());
    let err = config(dir.path()).open(LogVoid).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::WouldBlock, "{err}");
    log.shutdown().unwrap();
    drop(log);
    config(dir.path()).open(LogVoid).unwrap();
}

#[test]
fn a_read_only_open_of_a_directory_that_was_never_a_log_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let log = config(dir.path()).open_read_only(LogVoid).unwrap();
    assert_eq!(log.last_entry_id(), None);
    drop(log);
    assert!(snapshot(dir.path()).is_empty());
}

/// Flips a byte of a committed entry's chunk data in the first segment.
fn damage_first_segment(dir: &Path) -> (PathBuf, u64) {
    let inspection = config(dir).inspect().unwrap();
    assert!(inspection.is_ok(), "{:?}", inspection.problems);
    let first = &inspection.segments[0];
    assert!(inspection.segments.len() > 1);
    let path = first.path.clone();
    let mut bytes = std::fs::read(&path).unwrap();
    // The second record: the first entry's second chunk (300 bytes).
    let at = 512 + 25 + 7 + 4 + 25 + 100;
    bytes[at] ^= 0x40;
    std::fs::write(&path, bytes).unwrap();
    (path, at as u64)
}

#[test]
fn inspection_reports_a_damaged_committed_entry_with_its_chunks_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let committed = crashed_log(dir.path());
    let (path, _) = damage_first_segment(dir.path());
    let before = snapshot(dir.path());
    std::thread::sleep(std::time::Duration::from_millis(20));

    let inspection = config(dir.path()).inspect().unwrap();
    assert_eq!(inspection.problems.len(), 1, "{:?}", inspection.problems);
    let problem = &inspection.problems[0];
    assert_eq!(problem.path, path);
    assert!(problem.to_string().contains("failed its CRC"), "{problem}");
    let first = &inspection.segments[0];
    let (lost_id, (chunks, _)) = committed.iter().next().unwrap();
    assert_eq!(first.incomplete.len(), 1);
    let incomplete = &first.incomplete[0];
    assert_eq!(incomplete.id, EntryId(*lost_id));
    assert_eq!(incomplete.chunks_committed, 2);
    assert_eq!(incomplete.chunks.len(), 2);
    assert!(incomplete.chunks[0].crc_ok);
    assert_eq!(incomplete.chunks[0].data, chunks[0]);
    assert!(!incomplete.chunks[1].crc_ok);
    assert!(!first.entries.contains(&EntryId(*lost_id)));
    assert_eq!(snapshot(dir.path()), before, "inspection wrote to the log");

    // The opens agree: refused by default, the entry dropped and nothing
    // else when skipping, and still nothing written read-only.
    let err = config(dir.path()).open_read_only(LogVoid).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    assert!(err.to_string().contains(&*path.to_string_lossy()), "{err}");
    let recorder = Recorder::default();
    config(dir.path())
        .recovery_mode(RecoveryMode::SkipCorrupted)
        .open_read_only(recorder.clone())
        .unwrap();
    let recovered = recorder.recovered.lock().unwrap().clone();
    assert_eq!(recovered.len(), committed.len() - 1);
    assert!(!recovered.contains_key(lost_id));
    let recorder = Recorder::default();
    config(dir.path())
        .recovery_mode(RecoveryMode::PointInTime)
        .open_read_only(recorder.clone())
        .unwrap();
    assert!(recorder.recovered.lock().unwrap().is_empty());
    assert_eq!(
        snapshot(dir.path()),
        before,
        "a read-only open wrote to the log"
    );
}
