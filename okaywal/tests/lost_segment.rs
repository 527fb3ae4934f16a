//! A segment in the middle of the log that is gone (its file deleted, cut
//! inside its header, emptied or zeroed) while a later segment's header
//! records that it held records: the later segment got its name only after
//! the lost one was synced whole, so its acknowledged entries were lost to
//! damage, not to a crash. Recovery must not hand over the later entries
//! as if nothing were missing: by default the open fails naming the lost
//! file, inspection reports it, and the recovery modes say what they keep.

use std::fs::OpenOptions;
use std::io;
use std::path::Path;

use okaywal::{Configuration, RecoveryMode};
use testkit::recorder::Recorder;

/// Three segments of ten committed entries each, `wal-1`, `wal-11` and
/// `wal-21`, kept live by a manager that refuses every checkpoint; then a
/// shutdown.
fn three_segments(dir: &Path) {
    let log = Configuration::default_for(dir)
        .open(Recorder::refusing())
        .unwrap();
    for i in 1..=30_u64 {
        let mut entry = log.begin_entry().unwrap();
        entry.write_chunk(format!("entry {i}").as_bytes()).unwrap();
        assert_eq!(entry.commit().unwrap().0, i);
        if i % 10 == 0 {
            // Starts the next segment; the checkpoint itself is refused.
            let _ = log.checkpoint_active();
        }
    }
    log.shutdown().unwrap();
    for id in [1, 11, 21] {
        assert!(dir.join(format!("wal-{id}")).exists(), "wal-{id}");
    }
}

/// The ids recovered by an open with `mode`, or its error.
fn recovered(dir: &Path, mode: RecoveryMode) -> io::Result<Vec<u64>> {
    let recorder = Recorder::refusing();
    let log = Configuration::default_for(dir)
        .recovery_mode(mode)
        .open(recorder.clone())?;
    log.shutdown()?;
    let ids = recorder.seen().recovered_ids();
    Ok(ids)
}

fn damage(dir: &Path, how: &str) {
    let path = dir.join("wal-11");
    match how {
        "deleted" => std::fs::remove_file(&path).unwrap(),
        "emptied" => std::fs::write(&path, b"").unwrap(),
        "cut inside its header" => OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(100)
            .unwrap(),
        "zeroed" => {
            let len = std::fs::metadata(&path).unwrap().len();
            std::fs::write(&path, vec![0; usize::try_from(len).unwrap()]).unwrap();
        }
        _ => unreachable!(),
    }
}

#[test]
fn a_lost_middle_segment_is_an_error_not_a_silent_loss() {
    for how in ["deleted", "emptied", "cut inside its header", "zeroed"] {
        let dir = tempfile::tempdir().unwrap();
        three_segments(dir.path());
        assert_eq!(
            recovered(dir.path(), RecoveryMode::ErrorOnCorruption).unwrap(),
            (1..=30).collect::<Vec<_>>(),
            "{how}: the undamaged log"
        );
        damage(dir.path(), how);

        // Inspection reports it, naming the file.
        let inspection = Configuration::default_for(dir.path()).inspect().unwrap();
        assert!(
            !inspection.is_ok(),
            "{how}: inspection calls the log healthy"
        );
        assert!(
            inspection
                .problems
                .iter()
                .any(|p| p.path.ends_with("wal-11") && p.description.contains("segment 21")),
            "{how}: {:?}",
            inspection.problems
        );

        // A read-only open refuses it too, and writes nothing.
        let read_only = Configuration::default_for(dir.path())
            .open_read_only(okaywal::LogVoid)
            .err()
            .unwrap_or_else(|| panic!("{how}: the read-only open succeeded"));
        assert_eq!(read_only.kind(), io::ErrorKind::InvalidData, "{how}");

        // The default open fails, naming the lost file, and changes
        // nothing: the same open fails again.
        for _ in 0..2 {
            let error = recovered(dir.path(), RecoveryMode::ErrorOnCorruption)
                .expect_err(&format!("{how}: the open dropped entries 11-20 silently"));
            assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{how}: {error}");
            assert!(error.to_string().contains("wal-11"), "{how}: {error}");
        }
    }
}

#[test]
fn the_recovery_modes_say_what_they_keep_of_a_log_with_a_lost_segment() {
    let dir = tempfile::tempdir().unwrap();
    three_segments(dir.path());
    damage(dir.path(), "emptied");
    let copy = tempfile::tempdir().unwrap();
    for name in ["wal-1", "wal-11", "wal-21"] {
        std::fs::copy(dir.path().join(name), copy.path().join(name)).unwrap();
    }

    // Skipping keeps everything but the lost entries.
    let mut kept: Vec<u64> = (1..=10).collect();
    kept.extend(21..=30);
    assert_eq!(
        recovered(copy.path(), RecoveryMode::SkipCorrupted).unwrap(),
        kept
    );

    // Point in time keeps only what precedes the loss, for good.
    let before: Vec<u64> = (1..=10).collect();
    assert_eq!(
        recovered(dir.path(), RecoveryMode::PointInTime).unwrap(),
        before
    );
    assert_eq!(
        recovered(dir.path(), RecoveryMode::ErrorOnCorruption).unwrap(),
        before
    );
}

/// The oldest segment's file missing is what a checkpoint leaves (it
/// renames the segments it finishes, oldest first): no problem.
#[test]
fn a_missing_oldest_segment_is_no_loss() {
    let dir = tempfile::tempdir().unwrap();
    three_segments(dir.path());
    std::fs::remove_file(dir.path().join("wal-1")).unwrap();
    assert!(Configuration::default_for(dir.path())
        .inspect()
        .unwrap()
        .is_ok());
    assert_eq!(
        recovered(dir.path(), RecoveryMode::ErrorOnCorruption).unwrap(),
        (11..=30).collect::<Vec<_>>()
    );
}
