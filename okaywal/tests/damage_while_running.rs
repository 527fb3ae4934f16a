//! Media damage that appears while the log runs (after open verified
//! the segment): a checkpoint and a follower must report it, as open
//! does, instead of passing over the damaged entry.

mod common;

use common::follow::ChunkRecorder as Recorder;
use okaywal::fs::{CrashFileSystem, FileSystem};
use okaywal::{Configuration, LogVoid, RecoveryMode, WriteAheadLog};

const DIR: &str = "/log";

fn config(fs: &CrashFileSystem) -> Configuration {
    common::small_log_on(fs)
}

/// Flips one data byte of a durable chunk (media damage after the commit
/// was acknowledged and synced).
fn damage_data(fs: &CrashFileSystem, segment: u64, offset: u64) {
    let path = std::path::PathBuf::from(format!("{DIR}/wal-{segment}"));
    let mut bytes = fs.contents(&path).expect("segment file");
    bytes[offset as usize + 25] ^= 0xFF;
    assert!(fs.set_contents(&path, bytes));
}

/// Commits entries 1..=5 durably, one after another; returns entry 3's
/// chunk position.
fn five_entries(log: &WriteAheadLog) -> okaywal::LogPosition {
    let mut third = None;
    for i in 1..=5_u64 {
        let mut entry = log.begin_entry().unwrap();
        assert_eq!(entry.id().0, i);
        let record = entry.write_chunk(format!("entry {i}").as_bytes()).unwrap();
        entry.commit().unwrap();
        if i == 3 {
            third = Some(record.position);
        }
    }
    third.unwrap()
}

fn config_in(fs: &CrashFileSystem, mode: RecoveryMode) -> Configuration {
    config(fs).recovery_mode(mode)
}

#[test]
fn a_checkpoint_refuses_a_damaged_committed_entry_and_keeps_its_segment() {
    let fs = CrashFileSystem::new();
    let manager = common::Recorder::new();
    let log = config(&fs).open(manager.clone()).unwrap();
    let third = five_entries(&log);
    damage_data(&fs, third.file_id, third.offset);
    let err = log.checkpoint_active().unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains(&format!("wal-{}", third.file_id))
            && message.contains(&format!("offset {}", third.offset))
            && message.contains("entry 3"),
        "{message}"
    );
    // Nothing was recycled: the segment is still there under its name, and
    // the manager was not told the segment is done with.
    let files = fs.list_files(std::path::Path::new(DIR)).unwrap();
    assert!(
        files.contains(&format!("wal-{}", third.file_id)),
        "{files:?}"
    );
    assert!(manager.seen().checkpointed_ids().is_empty());
    // The log keeps working; a later checkpoint meets the same damage.
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(b"after the damage").unwrap();
    entry.commit().unwrap();
    assert!(log.checkpoint_active().is_err());
    drop(log);
    // Open names the same damage.
    let err = config(&fs).open(LogVoid).unwrap_err().to_string();
    assert!(err.contains(&format!("offset {}", third.offset)), "{err}");
}

#[test]
fn a_checkpoint_in_skip_corrupted_mode_passes_over_the_damaged_entry_only() {
    let fs = CrashFileSystem::new();
    let manager = common::Recorder::new();
    let log = config_in(&fs, RecoveryMode::SkipCorrupted)
        .open(manager.clone())
        .unwrap();
    let third = five_entries(&log);
    damage_data(&fs, third.file_id, third.offset);
    log.checkpoint_active().unwrap();
    assert_eq!(manager.seen().checkpointed_ids(), vec![1, 2, 4, 5]);
}

fn follow_until_error(log: &WriteAheadLog) -> (Vec<u64>, Option<String>) {
    let mut ids = Vec::new();
    let mut entries = log.entries_from(okaywal::EntryId(1));
    while ids.len() < 5 {
        match entries.next_timeout(std::time::Duration::from_secs(5)) {
            Ok(Some(entry)) => ids.push(entry.id().0),
            Ok(None) => break,
            Err(err) => return (ids, Some(err.to_string())),
        }
    }
    (ids, None)
}

#[test]
fn a_follower_stops_at_a_damaged_committed_entry_with_an_error() {
    let fs = CrashFileSystem::new();
    let log = config(&fs).open(Recorder::default()).unwrap();
    let third = five_entries(&log);
    damage_data(&fs, third.file_id, third.offset);
    // The error comes as soon as the follower's walk meets the damage,
    // which may be before it hands out the entries just before it; never
    // an entry after it.
    let (ids, err) = follow_until_error(&log);
    assert!(ids.iter().all(|id| *id < 3), "{ids:?}");
    let err = err.expect("an error at the damaged entry");
    assert!(
        err.contains(&format!("wal-{}", third.file_id))
            && err.contains(&format!("offset {}", third.offset)),
        "{err}"
    );
    // A second follower meets the same error; none skips ahead.
    let (again, err_again) = follow_until_error(&log);
    assert_eq!(again, ids);
    assert_eq!(err_again.as_deref(), Some(err.as_str()));
}

#[test]
fn a_follower_in_skip_corrupted_mode_passes_over_the_damaged_entry_only() {
    let fs = CrashFileSystem::new();
    let log = config_in(&fs, RecoveryMode::SkipCorrupted)
        .open(Recorder::default())
        .unwrap();
    let third = five_entries(&log);
    damage_data(&fs, third.file_id, third.offset);
    let mut ids = Vec::new();
    let mut entries = log.entries_from(okaywal::EntryId(1));
    while ids.len() < 4 {
        let entry = entries
            .next_timeout(std::time::Duration::from_secs(5))
            .unwrap()
            .expect("an entry");
        ids.push(entry.id().0);
    }
    assert_eq!(ids, vec![1, 2, 4, 5]);
}
