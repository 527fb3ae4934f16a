//! The public API used from the outside, call by call as its
//! documentation describes it, and the edges a user may run into (garbage
//! positions, empty entries and chunks, misdeclared streamed chunks, a
//! manager failing recovery, exact stats of a scripted workload, extreme
//! settings).

use std::io::{self, Read, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use okaywal::{
    ChunkRecord, Configuration, Durability, Entry, EntryId, LogManager, LogPosition, LogVoid,
    ReadChunkResult, RecoveredSegment, Recovery, RecoveryMode, SegmentReader, WriteAheadLog,
};
use testkit::recorder::{read_entry_streaming, Recorder};

/// Records recovered and checkpointed entries, reading chunks through
/// `read_chunk` and `Read` as the documentation describes.
fn collect() -> Recorder {
    Recorder {
        read_with: Some(read_entry_streaming),
        ..Recorder::new()
    }
}

/// An entry's id and chunks.
type EntryRead = (u64, Vec<Vec<u8>>);

/// Every checkpoint was handed only entries at or below its last id.
fn assert_checkpoints_stay_below_their_last_id(recorder: &Recorder) {
    for checkpoint in &recorder.seen().checkpoints {
        for (id, _) in &checkpoint.entries {
            assert!(*id <= checkpoint.last_id, "{checkpoint:?}");
        }
    }
}

fn read_back(log: &WriteAheadLog, record: &ChunkRecord) -> io::Result<Vec<u8>> {
    let mut reader = log.read_at(record.position)?;
    let mut data = Vec::new();
    reader.read_to_end(&mut data)?;
    assert!(reader.crc_is_valid()?);
    assert_eq!(data.len() as u32, record.length);
    assert_eq!(crc32fast::hash(&data), record.crc);
    Ok(data)
}

#[test]
fn the_public_api_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let config = || {
        Configuration::default_for(dir.path())
            .preallocate_bytes(64 * 1024)
            .checkpoint_after_bytes(64 * 1024)
            .buffer_bytes(4096)
            .version_info(b"api v1".to_vec())
            .recovery_mode(RecoveryMode::ErrorOnCorruption)
            .max_unsynced(Duration::from_millis(20))
    };
    let first_run = collect();
    let log = config().open(first_run.clone()).unwrap();

    // write_chunk, begin_chunk in pieces, commit, id.
    let mut entry = log.begin_entry().unwrap();
    let id = entry.id();
    let first = entry.write_chunk(b"first chunk").unwrap();
    let streamed_data: Vec<u8> = (0..10_000_u32).map(|i| (i % 251) as u8).collect();
    let mut writer = entry.begin_chunk(streamed_data.len() as u32).unwrap();
    for piece in streamed_data.chunks(777) {
        writer.write_all(piece).unwrap();
    }
    assert_eq!(writer.bytes_remaining(), 0);
    let streamed = writer.finish().unwrap();
    let empty = entry.write_chunk(b"").unwrap();
    assert_eq!(entry.commit().unwrap(), id);

    assert_eq!(read_back(&log, &first).unwrap(), b"first chunk");
    assert_eq!(read_back(&log, &streamed).unwrap(), streamed_data);
    assert_eq!(read_back(&log, &empty).unwrap(), b"");

    // LogPosition to and from bytes.
    let bytes = first.position.to_bytes();
    assert_eq!(LogPosition::from_bytes(&bytes), first.position);
    let mut serialized = Vec::new();
    first.position.serialize_to(&mut serialized).unwrap();
    assert_eq!(
        LogPosition::deserialize_from(&serialized[..]).unwrap(),
        first.position
    );

    // A rolled-back entry and a dropped one.
    let mut rolled = log.begin_entry().unwrap();
    rolled.write_chunk(b"rolled back").unwrap();
    let rolled_id = rolled.id();
    rolled.rollback().unwrap();
    let mut dropped = log.begin_entry().unwrap();
    dropped.write_chunk(b"dropped").unwrap();
    let dropped_id = dropped.id();
    drop(dropped);

    // A buffered commit followed by sync().
    let mut buffered = log.begin_entry().unwrap();
    buffered.write_chunk(b"buffered").unwrap();
    let buffered_id = buffered.commit_with(Durability::Buffered).unwrap();
    assert!(log.sync().unwrap() >= buffered_id);

    // An entry with no chunks at all.
    let empty_id = log.begin_entry().unwrap().commit().unwrap();

    // The live log, then a checkpoint.
    let live: Vec<_> = log
        .entries_from(id)
        .map(|entry| entry.map(|e| (e.id().0, e.into_chunks())))
        .collect::<io::Result<_>>()
        .unwrap();
    let expected = vec![
        (
            id.0,
            vec![b"first chunk".to_vec(), streamed_data.clone(), Vec::new()],
        ),
        (buffered_id.0, vec![b"buffered".to_vec()]),
        (empty_id.0, Vec::new()),
    ];
    assert_eq!(live, expected);
    assert!(!live
        .iter()
        .any(|(i, _)| *i == rolled_id.0 || *i == dropped_id.0));

    let stats = log.stats();
    assert_eq!(stats.durable_commits, 2, "{stats:?}");
    assert_eq!(stats.buffered_commits, 1, "{stats:?}");
    assert_eq!(stats.rollbacks, 2, "{stats:?}");
    assert!(stats.syncs >= 1, "{stats:?}");

    log.shutdown().unwrap();
    drop(log);
    assert_checkpoints_stay_below_their_last_id(&first_run);

    // Reopening replays exactly the committed entries.
    let manager = collect();
    let log = WriteAheadLog::recover(dir.path(), manager.clone()).unwrap();
    assert_eq!(manager.seen().recovered, expected);
    assert!(manager
        .seen()
        .segments
        .iter()
        .all(|(_, version_info)| version_info == b"api v1"));
    log.checkpoint_active().unwrap();
    assert_eq!(manager.seen().checkpointed(), expected);
    assert_checkpoints_stay_below_their_last_id(&manager);
    // The recycled positions are gone.
    let err = log.read_at(first.position).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
    log.shutdown().unwrap();
}

/// Positions made of garbage bytes, or pointing anywhere in a live
/// segment, give an error or the chunk that starts there: never a panic,
/// never another chunk's bytes.
#[test]
fn garbage_positions_never_panic_or_return_wrong_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let log = Configuration::default_for(dir.path())
        .preallocate_bytes(256 * 1024)
        .checkpoint_after_bytes(256 * 1024)
        .open(LogVoid)
        .unwrap();
    let mut records = Vec::new();
    for i in 0..20_u32 {
        let mut entry = log.begin_entry().unwrap();
        let data: Vec<u8> = (0..(i * 37 % 300)).map(|b| (b ^ i) as u8).collect();
        let record = entry.write_chunk(&data).unwrap();
        records.push((record, data));
        entry.commit().unwrap();
    }
    let file_id = records[0].0.position.file_id;
    let last = records.last().unwrap().0;
    let end = last.position.offset + 64 + u64::from(last.length);
    for offset in 0..end + 64 {
        let position = LogPosition { file_id, offset };
        match log.read_at(position) {
            Ok(mut reader) => {
                let (record, data) = records
                    .iter()
                    .find(|(r, _)| r.position == position)
                    .unwrap_or_else(|| panic!("a chunk was read at {position}"));
                let mut read = Vec::new();
                reader.read_to_end(&mut read).unwrap();
                assert_eq!(&read, data);
                assert!(reader.crc_is_valid().unwrap());
                assert_eq!(record.length as usize, data.len());
            }
            Err(err) => assert!(
                !records.iter().any(|(r, _)| r.position == position),
                "{position}: {err}"
            ),
        }
    }
    for garbage in [[0_u8; 16], [0xff; 16], {
        let mut b = [0xA5_u8; 16];
        b[..8].copy_from_slice(&file_id.to_le_bytes());
        b
    }] {
        let position = LogPosition::from_bytes(&garbage);
        assert!(log.read_at(position).is_err(), "{position}");
    }
    assert!(LogPosition::read_from(&[1_u8; 7][..]).is_err());
    log.shutdown().unwrap();
}

/// A chunk declared with `begin_chunk` that is written short, long, or
/// not finished at all is a clear error, never a corrupt log.
#[test]
fn misdeclared_streamed_chunks_are_clear_errors_not_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let log = WriteAheadLog::recover(dir.path(), LogVoid).unwrap();
    let mut good = log.begin_entry().unwrap();
    good.write_chunk(b"good before").unwrap();
    let good_before = good.commit().unwrap();

    // More bytes than declared, in one write: refused.
    let mut entry = log.begin_entry().unwrap();
    let mut writer = entry.begin_chunk(100).unwrap();
    let err = writer.write_all(&[1; 101]).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    // Fewer bytes than declared: `finish` fails and the entry cannot commit.
    assert!(writer.finish().is_err());
    assert!(entry.commit().is_err());

    // Not finished at all: the entry cannot commit; rollback is fine.
    let mut entry = log.begin_entry().unwrap();
    let mut writer = entry.begin_chunk(1000).unwrap();
    writer.write_all(&[2; 10]).unwrap();
    drop(writer);
    assert!(entry.write_chunk(b"more").is_err());
    entry.rollback().unwrap();

    // A zero-length streamed chunk is fine.
    let mut entry = log.begin_entry().unwrap();
    let zero = entry.begin_chunk(0).unwrap().finish().unwrap();
    let zero_id = entry.commit().unwrap();
    assert_eq!(read_back(&log, &zero).unwrap(), b"");

    let mut good = log.begin_entry().unwrap();
    good.write_chunk(b"good after").unwrap();
    let good_after = good.commit().unwrap();
    log.shutdown().unwrap();
    drop(log);

    let manager = collect();
    let log = WriteAheadLog::recover(dir.path(), manager.clone()).unwrap();
    assert_eq!(
        manager.seen().recovered,
        vec![
            (good_before.0, vec![b"good before".to_vec()]),
            (zero_id.0, vec![Vec::new()]),
            (good_after.0, vec![b"good after".to_vec()]),
        ]
    );
    log.shutdown().unwrap();
}

/// A manager whose `recover` (or `should_recover_segment`) fails makes the
/// open fail with its error, without damaging anything: a later open with
/// a working manager recovers every entry, and files that are not the
/// log's are left alone.
#[test]
fn a_failing_recovery_leaves_the_log_intact_for_the_next_open() {
    #[derive(Debug)]
    struct Failing {
        in_should_recover: bool,
    }
    impl LogManager for Failing {
        fn should_recover_segment(&mut self, _: &RecoveredSegment) -> io::Result<Recovery> {
            if self.in_should_recover {
                Err(io::Error::other("refusing the segment"))
            } else {
                Ok(Recovery::Recover)
            }
        }
        fn recover(&mut self, _: &mut Entry<'_>) -> io::Result<()> {
            Err(io::Error::other("refusing the entry"))
        }
        fn checkpoint_to(
            &mut self,
            _: EntryId,
            _: &mut SegmentReader,
            _: &WriteAheadLog,
        ) -> io::Result<()> {
            Ok(())
        }
    }

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), b"mine").unwrap();
    std::fs::write(dir.path().join("wal-notes"), b"also mine").unwrap();
    let log = WriteAheadLog::recover(dir.path(), LogVoid).unwrap();
    let mut expected = Vec::new();
    for i in 0..5_u8 {
        let mut entry = log.begin_entry().unwrap();
        entry.write_chunk(&[i; 100]).unwrap();
        expected.push((entry.commit().unwrap().0, vec![vec![i; 100]]));
    }
    log.shutdown().unwrap();
    drop(log);

    for in_should_recover in [true, false] {
        let err = WriteAheadLog::recover(dir.path(), Failing { in_should_recover }).unwrap_err();
        assert!(err.to_string().contains("refusing"), "{err}");
    }
    let manager = collect();
    let log = WriteAheadLog::recover(dir.path(), manager.clone()).unwrap();
    assert_eq!(manager.seen().recovered, expected);
    log.checkpoint_active().unwrap();
    assert_checkpoints_stay_below_their_last_id(&manager);
    log.shutdown().unwrap();
    assert_eq!(
        std::fs::read(dir.path().join("notes.txt")).unwrap(),
        b"mine"
    );
    assert_eq!(
        std::fs::read(dir.path().join("wal-notes")).unwrap(),
        b"also mine"
    );
}

/// `stats()` counts a scripted single-threaded workload exactly.
#[test]
fn stats_count_a_scripted_workload_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let log = WriteAheadLog::recover(dir.path(), LogVoid).unwrap();
    let zero = log.stats();
    assert_eq!(
        (zero.durable_commits, zero.buffered_commits, zero.rollbacks),
        (0, 0, 0)
    );
    assert_eq!((zero.checkpoints, zero.recycled_segments), (0, 0));
    let record = |len: u64| 25 + len + 4;
    let mut bytes = 0;
    for round in 0..3 {
        for i in 0..4 {
            let mut entry = log.begin_entry().unwrap();
            entry.write_chunk(&[round; 100]).unwrap();
            bytes += record(100) + 25;
            if i % 2 == 0 {
                entry.commit().unwrap();
            } else {
                entry.commit_buffered().unwrap();
            }
        }
        let mut rolled = log.begin_entry().unwrap();
        rolled.write_chunk(&[9; 10]).unwrap();
        bytes += record(10) + 25;
        rolled.rollback().unwrap();
        drop(log.begin_entry().unwrap());
        log.sync().unwrap();
        log.checkpoint_active().unwrap();
    }
    let stats = log.stats();
    assert_eq!(stats.durable_commits, 6, "{stats:?}");
    assert_eq!(stats.buffered_commits, 6, "{stats:?}");
    assert_eq!(stats.rollbacks, 6, "{stats:?}");
    assert_eq!(stats.synced_commits, 12, "{stats:?}");
    assert!((1..=12).contains(&stats.syncs), "{stats:?}");
    assert_eq!(stats.bytes_written, bytes, "{stats:?}");
    assert_eq!(stats.checkpoints, 3, "{stats:?}");
    assert_eq!(stats.recycled_segments, 3, "{stats:?}");
    assert_eq!(stats.checkpoint_failures, 0, "{stats:?}");
    assert_eq!(stats.live_segments, 1, "{stats:?}");
    assert!(stats.checkpoint_time >= stats.last_checkpoint_time);
    log.shutdown().unwrap();
}

/// Extreme but accepted settings and arguments (tiny segments and
/// buffers, checkpoints after every byte, the last entry ids, the largest
/// ids and timeouts) work or fail with an error: no panic, nothing lost.
#[test]
fn extreme_settings_and_arguments_work_or_fail_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let config = || {
        Configuration::default_for(dir.path())
            .preallocate_bytes(1)
            .checkpoint_after_bytes(0)
            .buffer_bytes(1)
    };
    let log = config().open(LogVoid).unwrap();
    let mut expected = Vec::new();
    for i in 0..20_u32 {
        let mut entry = log.begin_entry().unwrap();
        let data = vec![i as u8; (i as usize * 7919) % 100_000];
        entry.write_chunk(&data).unwrap();
        let id = entry.commit().unwrap();
        expected.push((id.0, vec![data]));
    }
    assert!(log.entries_from(EntryId(u64::MAX)).next().is_none());
    assert!(log
        .entries_from(EntryId(u64::MAX))
        .next_timeout(Duration::ZERO)
        .unwrap()
        .is_none());
    // Everything is checkpointed at once; what the reader finds is in order.
    let mut previous = 0;
    for entry in log.entries_from(EntryId(0)) {
        match entry {
            Ok(entry) => {
                assert!(entry.id().0 > previous);
                previous = entry.id().0;
            }
            Err(err) => {
                assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
                break;
            }
        }
    }
    log.shutdown().unwrap();
    drop(log);
    let manager = collect();
    let log = config()
        .checkpoint_after_bytes(u64::MAX)
        .open(manager.clone())
        .unwrap();
    // Whatever was not checkpointed comes back whole.
    for (id, chunks) in &manager.seen().recovered {
        assert!(expected.contains(&(*id, chunks.clone())), "entry {id}");
    }
    log.shutdown().unwrap();
    assert_checkpoints_stay_below_their_last_id(&manager);
    drop(log);

    // The last entry ids.
    let dir = tempfile::tempdir().unwrap();
    let log = Configuration::default_for(dir.path())
        .minimum_next_entry_id(u64::MAX - 1)
        .open(LogVoid)
        .unwrap();
    let id = log.begin_entry().unwrap().commit().unwrap();
    assert_eq!(id, EntryId(u64::MAX - 1));
    assert!(log.begin_entry().is_err());
    log.shutdown().unwrap();
    drop(log);
    // A stray empty file named with the largest id leaves no id for a new
    // entry; the error says where to look.
    let stray = tempfile::tempdir().unwrap();
    std::fs::write(stray.path().join(format!("wal-{}", u64::MAX)), b"").unwrap();
    let log = Configuration::default_for(stray.path())
        .open(LogVoid)
        .unwrap();
    let err = log.begin_entry().map(drop).unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("u64::MAX") && message.contains(&stray.path().display().to_string()),
        "{message}"
    );
    log.shutdown().unwrap();
    drop(log);

    // Sizes no open can honour are refused by every open, writable or
    // not, before anything is read or written: a buffer of `usize::MAX`
    // used to panic at the first scan, a preallocation of `u64::MAX`
    // filled the disk again and again.
    for config in [
        Configuration::default_for(dir.path()).buffer_bytes(usize::MAX),
        Configuration::default_for(dir.path()).buffer_bytes(0),
        Configuration::default_for(dir.path()).preallocate_bytes(u64::MAX),
        Configuration::default_for(dir.path()).preallocate_bytes((4 << 30) + 1),
        // No entry can have id u64::MAX: nothing could be written, and a
        // segment named for it would leave no id after a crash.
        Configuration::default_for(dir.path()).minimum_next_entry_id(u64::MAX),
    ] {
        let before = std::fs::read_dir(dir.path()).unwrap().count();
        let err = config.clone().open(LogVoid).expect_err("refused");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
        let err = config.clone().open_read_only(LogVoid).expect_err("refused");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
        assert_eq!(
            config.inspect().unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), before);
    }
    // The largest accepted values open a log that holds entries.
    let log = Configuration::default_for(dir.path())
        .buffer_bytes(256 << 20)
        .open(LogVoid)
        .unwrap();
    log.shutdown().unwrap();
    drop(log);
    let last = tempfile::tempdir().unwrap();
    let log = Configuration::default_for(last.path())
        .minimum_next_entry_id(u64::MAX - 1)
        .open(LogVoid)
        .unwrap();
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(b"the last id").unwrap();
    assert_eq!(entry.commit().unwrap(), EntryId(u64::MAX - 1));
    log.shutdown().unwrap();
}

/// A manager may use the log it is handed in `checkpoint_to`: read the
/// checkpointed chunks back with `read_at`, sync, write an entry of its
/// own and follow the live log, without hanging the checkpoint.
#[test]
fn a_manager_may_use_the_log_inside_checkpoint_to() {
    #[derive(Debug, Clone, Default)]
    struct UsesTheLog {
        read_back: Arc<Mutex<Vec<EntryRead>>>,
        markers: Arc<Mutex<Vec<u64>>>,
    }
    impl LogManager for UsesTheLog {
        fn recover(&mut self, _: &mut Entry<'_>) -> io::Result<()> {
            Ok(())
        }
        fn checkpoint_to(
            &mut self,
            _last: EntryId,
            entries: &mut SegmentReader,
            wal: &WriteAheadLog,
        ) -> io::Result<()> {
            while let Some(mut entry) = entries.read_entry()? {
                let mut chunks = Vec::new();
                while let ReadChunkResult::Chunk(chunk) = entry.read_chunk()? {
                    let mut reader = wal.read_at(chunk.position())?;
                    let mut data = Vec::new();
                    reader.read_to_end(&mut data)?;
                    assert!(reader.crc_is_valid()?);
                    chunks.push(data);
                }
                self.read_back.lock().unwrap().push((entry.id().0, chunks));
            }
            wal.sync()?;
            let _ = wal.entries_from(EntryId(0)).next_timeout(Duration::ZERO);
            let mut marker = wal.begin_entry()?;
            marker.write_chunk(b"marker")?;
            self.markers.lock().unwrap().push(marker.commit()?.0);
            Ok(())
        }
    }

    let (done, finished) = std::sync::mpsc::channel();
    let manager = UsesTheLog::default();
    let seen = manager.clone();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    std::thread::spawn(move || {
        let log = Configuration::default_for(&path)
            .preallocate_bytes(16 * 1024)
            .checkpoint_after_bytes(16 * 1024)
            .open(manager)
            .unwrap();
        let mut committed = Vec::new();
        for i in 0..40_u32 {
            let mut entry = log.begin_entry().unwrap();
            let data = vec![i as u8; 1000 + i as usize];
            entry.write_chunk(&data).unwrap();
            committed.push((entry.commit().unwrap().0, vec![data]));
        }
        log.checkpoint_active().unwrap();
        log.shutdown().unwrap();
        done.send(committed).unwrap();
    });
    let committed = finished
        .recv_timeout(Duration::from_secs(60))
        .expect("a checkpoint that used the log hung");
    let read_back = seen.read_back.lock().unwrap();
    let markers = seen.markers.lock().unwrap();
    for entry in &committed {
        assert!(read_back.contains(entry), "entry {} not read back", entry.0);
    }
    for (id, chunks) in read_back.iter() {
        assert!(
            committed.iter().any(|(c, _)| c == id) || markers.contains(id),
            "unknown entry {id}"
        );
        if markers.contains(id) {
            assert_eq!(chunks, &vec![b"marker".to_vec()]);
        }
    }
}

/// An empty directory path is refused before anything is made (it used to
/// leave `okaywal.lock` in the current directory and then fail to list
/// ""), and a directory that cannot be made is named in the error.
#[test]
fn unusable_directory_paths_are_refused_with_the_path_named() {
    let lock_in_cwd = std::path::Path::new("okaywal.lock");
    let existed = lock_in_cwd.exists();
    let err = WriteAheadLog::recover("", LogVoid).map(drop).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
    assert!(err.to_string().contains("empty path"), "{err}");
    let err = Configuration::default_for("")
        .open_read_only(LogVoid)
        .map(drop)
        .unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
    assert_eq!(lock_in_cwd.exists(), existed);

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let under_file = file.join("log");
    let err = WriteAheadLog::recover(&under_file, LogVoid)
        .map(drop)
        .unwrap_err();
    assert!(
        err.to_string().contains(&under_file.display().to_string()),
        "{err}"
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"not a directory");
}
