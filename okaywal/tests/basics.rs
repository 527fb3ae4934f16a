//! End-to-end behaviour of the log on a real directory: concurrent commits,
//! rollbacks, reading chunks back, very large entries, version information
//! and entry ids across reopens.

mod common;

use std::collections::BTreeSet;
use std::io::{self, Read, Write};
use std::path::Path;

use common::{
    check_exactly_once, checkpoint_until_ok, occurrences, run_workload, with_sealer, Mix, Recorder,
    Rng, Workload,
};
use okaywal::fs::{CrashFileSystem, MemoryFileSystem, PowerLoss};
use okaywal::{Configuration, LogPosition, WriteAheadLog};

const SEGMENT: u64 = 64 * 1024;

fn small_segments(dir: &Path) -> Configuration {
    Configuration::default_for(dir)
        .preallocate_bytes(SEGMENT)
        .checkpoint_after_bytes(SEGMENT)
}

#[test]
fn concurrent_commits_are_recovered_or_checkpointed_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let first = Recorder::new();
    let log = small_segments(dir.path()).open(first.clone()).unwrap();
    let model = run_workload(
        &log,
        &Workload {
            threads: 16,
            entries_per_thread: 60,
            seed: 1,
            mix: Mix::default(),
        },
    );
    assert!(model.errors.is_empty(), "errors: {:?}", model.errors);
    assert!(model.unacked.is_empty());
    assert!(model.committed.len() > 700, "{}", model.committed.len());
    assert!(!model.rolled_back.is_empty());
    let segments: BTreeSet<u64> = model
        .positions
        .iter()
        .map(|(r, _)| r.position.file_id)
        .collect();
    assert!(segments.len() >= 5, "only {} segments used", segments.len());
    log.shutdown().unwrap();
    drop(log);
    assert!(first.seen().recovered.is_empty());

    let second = Recorder::new();
    let log = small_segments(dir.path()).open(second.clone()).unwrap();
    check_exactly_once(&model, &first.seen(), &second.seen()).unwrap();

    // The recovered entries are still only in the log: checkpointing hands
    // each of them over once more, and nothing else.
    log.checkpoint_active().unwrap();
    {
        let seen = second.seen();
        let recovered: BTreeSet<u64> = seen.recovered_ids().into_iter().collect();
        let checkpointed = occurrences(seen.checkpointed_ids());
        assert!(checkpointed.values().all(|n| *n == 1), "{checkpointed:?}");
        let checkpointed: BTreeSet<u64> = checkpointed.into_keys().collect();
        assert_eq!(checkpointed, recovered);
    }
    log.shutdown().unwrap();
    drop(log);

    // Everything was checkpointed: nothing is replayed any more.
    let third = Recorder::new();
    let log = small_segments(dir.path()).open(third.clone()).unwrap();
    assert!(third.seen().recovered.is_empty());
    log.shutdown().unwrap();
}

#[test]
fn rolled_back_entries_never_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let first = Recorder::new();
    let log = small_segments(dir.path()).open(first.clone()).unwrap();
    let model = run_workload(
        &log,
        &Workload {
            threads: 8,
            entries_per_thread: 50,
            seed: 2,
            mix: Mix {
                max_chunk: 6000,
                rollback: 20,
                drop: 15,
                unfinished: 15,
                large: 5,
                ..Mix::default()
            },
        },
    );
    assert!(model.errors.is_empty(), "errors: {:?}", model.errors);
    assert!(model.rolled_back.len() > 100, "{}", model.rolled_back.len());
    assert!(model.committed.len() > 100, "{}", model.committed.len());

    // Refused commits (unfinished chunks) do not poison the log.
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(b"after the rollbacks").unwrap();
    let last = entry.commit().unwrap();
    let mut model = model;
    model
        .committed
        .insert(last.0, vec![b"after the rollbacks".to_vec()]);
    log.shutdown().unwrap();
    drop(log);

    let second = Recorder::new();
    let log = small_segments(dir.path()).open(second.clone()).unwrap();
    check_exactly_once(&model, &first.seen(), &second.seen()).unwrap();
    log.shutdown().unwrap();
}

fn read_chunk(log: &WriteAheadLog, position: LogPosition) -> io::Result<(Vec<u8>, bool)> {
    let mut reader = log.read_at(position)?;
    assert_eq!(reader.position(), position);
    let mut data = Vec::new();
    reader.read_to_end(&mut data)?;
    assert_eq!(data.len(), reader.chunk_length() as usize);
    assert_eq!(reader.bytes_remaining(), 0);
    let valid = reader.crc_is_valid()?;
    Ok((data, valid))
}

#[test]
fn read_at_round_trips_across_segments_until_recycled() {
    let dir = tempfile::tempdir().unwrap();
    // Refusing checkpoints keeps every segment live.
    let recorder = Recorder::refusing();
    let log = small_segments(dir.path()).open(recorder.clone()).unwrap();
    // Refused checkpoints slow down the background thread's making of spare
    // segment files; sealing the active segment now and then guarantees
    // many segments whatever the timing.
    let model = with_sealer(&log, || {
        run_workload(
            &log,
            &Workload {
                threads: 4,
                entries_per_thread: 120,
                seed: 3,
                mix: Mix {
                    large: 3,
                    ..Mix::default()
                },
            },
        )
    });
    assert!(model.errors.is_empty(), "errors: {:?}", model.errors);
    let segments: BTreeSet<u64> = model
        .positions
        .iter()
        .map(|(r, _)| r.position.file_id)
        .collect();
    assert!(
        segments.len() >= 10,
        "only {} segments used",
        segments.len()
    );

    for (record, expected) in &model.positions {
        let (data, valid) = read_chunk(&log, record.position)
            .unwrap_or_else(|e| panic!("reading {}: {e}", record.position));
        assert!(valid, "CRC of chunk at {}", record.position);
        assert!(data == *expected, "bytes of chunk at {}", record.position);
        assert_eq!(record.crc, crc32fast::hash(&data));
        let all = log.read_at(record.position).unwrap().read_all().unwrap();
        assert!(all == *expected);
    }

    // A position that is not the start of a chunk record is refused, not
    // read as something else.
    let (record, _) = model
        .positions
        .iter()
        .find(|(record, data)| data.len() > 100 && record.position.offset > 512)
        .expect("a chunk of more than 100 bytes");
    for offset in [record.position.offset + 1, record.position.offset + 40] {
        let bogus = LogPosition {
            offset,
            ..record.position
        };
        let err = log.read_at(bogus).expect_err("a position inside a chunk");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    }
    let err = log
        .read_at(LogPosition {
            file_id: u64::MAX,
            offset: 512,
        })
        .expect_err("a segment that never existed");
    assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");

    // A reader opened before its segment is checkpointed keeps reading the
    // right bytes even as the log moves on.
    let (held_record, held_bytes) = model.positions[0].clone();
    let mut held = log.read_at(held_record.position).unwrap();

    recorder.allow_checkpoints();
    checkpoint_until_ok(&log).unwrap();
    for (record, _) in &model.positions {
        let err = log
            .read_at(record.position)
            .expect_err("the segment was checkpointed");
        assert_eq!(
            err.kind(),
            io::ErrorKind::NotFound,
            "{}: {err}",
            record.position
        );
    }
    // Enough new data to reuse every spare segment file several times.
    let mut rng = Rng::new(33);
    for _ in 0..60 {
        let mut entry = log.begin_entry().unwrap();
        entry.write_chunk(&rng.bytes(8000)).unwrap();
        entry.commit().unwrap();
    }
    log.checkpoint_active().unwrap();
    let mut data = Vec::new();
    held.read_to_end(&mut data).unwrap();
    assert!(data == held_bytes, "a held reader saw its segment recycled");
    assert!(held.crc_is_valid().unwrap());
    drop(held);
    log.shutdown().unwrap();
}

/// Deterministic, cheap bytes for the very large entry.
fn big_data(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    rng.bytes(len)
}

#[test]
fn a_64_mib_entry_round_trips_with_the_default_configuration() {
    const LEN: usize = 64 * 1024 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let data = big_data(LEN, 64);

    let first = Recorder::refusing();
    let log = WriteAheadLog::recover(dir.path(), first.clone()).unwrap();
    // One entry streamed through begin_chunk in uneven pieces...
    let mut entry = log.begin_entry().unwrap();
    let mut writer = entry.begin_chunk(LEN as u32).unwrap();
    let mut at = 0;
    let mut piece = 1;
    while at < LEN {
        let n = piece.min(LEN - at);
        writer.write_all(&data[at..at + n]).unwrap();
        at += n;
        piece = piece * 7 % 3_000_017 + 1;
    }
    let streamed = writer.finish().unwrap();
    let streamed_id = entry.commit().unwrap();
    // ...and one written with write_chunk, plus a small chunk after it.
    let mut entry = log.begin_entry().unwrap();
    let whole = entry.write_chunk(&data).unwrap();
    entry.write_chunk(b"tail").unwrap();
    let whole_id = entry.commit().unwrap();
    assert_eq!(streamed.crc, whole.crc);
    assert_eq!(streamed.length as usize, LEN);

    for position in [streamed.position, whole.position] {
        let (read, valid) = read_chunk(&log, position).unwrap();
        assert!(valid);
        assert!(read == data, "chunk at {position} read back wrong");
    }
    log.shutdown().unwrap();
    drop(log);
    assert!(first.seen().checkpoints.is_empty());

    let second = Recorder::new();
    let log = WriteAheadLog::recover(dir.path(), second.clone()).unwrap();
    {
        let seen = second.seen();
        let ids: Vec<u64> = seen.recovered_ids();
        assert_eq!(ids, vec![streamed_id.0, whole_id.0]);
        assert_eq!(seen.recovered[0].1.len(), 1);
        assert!(seen.recovered[0].1[0] == data);
        assert_eq!(seen.recovered[1].1.len(), 2);
        assert!(seen.recovered[1].1[0] == data);
        assert_eq!(seen.recovered[1].1[1], b"tail");
    }
    log.shutdown().unwrap();
}

#[test]
fn large_chunks_start_their_data_on_a_page_and_padding_is_skipped_on_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let first = Recorder::refusing();
    let log = WriteAheadLog::recover(dir.path(), first.clone()).unwrap();
    // Odd sizes put the free space at every kind of distance from a page
    // boundary, including closer than a record header.
    let sizes = [
        (70_000, 10),
        (100_001, 0),
        (65_537, 4_040),
        (1 << 20, 4_071),
        (200_000, 4_045),
        (90_000, 1),
    ];
    let mut expected = Vec::new();
    for (i, (large, small)) in sizes.into_iter().enumerate() {
        let big = big_data(large, i as u64);
        let little = big_data(small, 100 + i as u64);
        let mut entry = log.begin_entry().unwrap();
        let record = entry.write_chunk(&big).unwrap();
        if small > 0 {
            entry.write_chunk(&little).unwrap();
        }
        let id = entry.commit().unwrap();
        // The record header is 25 bytes; the data follows it.
        assert_eq!(
            (record.position.offset + 25) % 4096,
            0,
            "chunk of {large} bytes at {}",
            record.position
        );
        let (read, valid) = read_chunk(&log, record.position).unwrap();
        assert!(valid && read == big);
        let mut chunks = vec![big];
        if small > 0 {
            chunks.push(little);
        }
        expected.push((id.0, chunks));
    }
    log.shutdown().unwrap();
    drop(log);

    let second = Recorder::new();
    let log = WriteAheadLog::recover(dir.path(), second.clone()).unwrap();
    {
        let seen = second.seen();
        assert_eq!(seen.recovered.len(), expected.len());
        for ((id, chunks), (want_id, want)) in seen.recovered.iter().zip(&expected) {
            assert_eq!(id, want_id);
            assert!(chunks == want, "entry {id} recovered different chunks");
        }
        assert!(seen.aborted.is_empty());
    }
    log.shutdown().unwrap();
}

#[test]
fn version_info_reaches_the_manager_and_abandon_discards_segments() {
    let fs = MemoryFileSystem::new();
    let config = |version: &[u8]| {
        Configuration::default_for("/log")
            .file_system(fs.clone())
            .preallocate_bytes(16 * 1024)
            .checkpoint_after_bytes(16 * 1024)
            .version_info(version.to_vec())
    };
    let mut rng = Rng::new(5);

    // Version 1 writes entries over several segments, none checkpointed.
    let first = Recorder::refusing();
    let log = config(b"version one").open(first.clone()).unwrap();
    let mut old_ids = BTreeSet::new();
    for i in 0..40 {
        let mut entry = log.begin_entry().unwrap();
        entry.write_chunk(&rng.bytes(1500)).unwrap();
        old_ids.insert(entry.commit().unwrap().0);
        if i % 10 == 9 {
            // Seals the segment; the checkpoint itself is refused.
            let err = log
                .checkpoint_active()
                .expect_err("checkpoints are refused");
            assert!(err.to_string().contains(common::REFUSAL), "{err}");
        }
    }
    log.shutdown().unwrap();
    drop(log);

    // Version 2 abandons them: not recovered, never checkpointed.
    let second = Recorder {
        abandon: Some(b"version one".to_vec()),
        ..Recorder::refusing()
    };
    let log = config(b"version two").open(second.clone()).unwrap();
    {
        let seen = second.seen();
        assert!(seen.segments.len() >= 4, "{:?}", seen.segments);
        for (id, version) in &seen.segments {
            assert_eq!(version, b"version one", "segment {id}");
        }
        assert!(seen.recovered.is_empty());
    }
    // Nothing was written yet, so this only waits for the abandoned
    // segments to be disposed of (which needs nothing from the manager).
    log.checkpoint_active().unwrap();
    let mut new = Vec::new();
    for _ in 0..20 {
        let mut entry = log.begin_entry().unwrap();
        let data = rng.bytes(1500);
        entry.write_chunk(&data).unwrap();
        let id = entry.commit().unwrap().0;
        assert!(id > *old_ids.last().unwrap());
        new.push((id, vec![data]));
    }
    log.shutdown().unwrap();
    drop(log);
    {
        let seen = second.seen();
        for checkpoint in seen.checkpoints.iter().chain(&seen.refused) {
            for (id, _) in &checkpoint.entries {
                assert!(!old_ids.contains(id), "abandoned entry {id} checkpointed");
            }
        }
    }

    // Version 2 again: only its own segments and entries are left.
    let third = Recorder::new();
    let log = config(b"version two").open(third.clone()).unwrap();
    {
        let seen = third.seen();
        assert!(!seen.segments.is_empty());
        for (id, version) in &seen.segments {
            assert_eq!(version, b"version two", "segment {id}");
        }
        assert!(
            seen.recovered == new,
            "recovered {:?}",
            seen.recovered_ids()
        );
    }
    log.shutdown().unwrap();
}

/// `Abandon` is final as soon as open returns: a shutdown (or a power
/// loss) right after it must not bring the abandoned entries back for a
/// manager that recovers everything.
#[test]
fn an_abandoned_segment_stays_discarded_when_the_log_stops_right_after_open() {
    for power_loss in [false, true] {
        let fs = CrashFileSystem::new();
        let config = |version: &[u8]| {
            Configuration::default_for("/log")
                .file_system(fs.clone())
                .version_info(version.to_vec())
        };
        let log = config(b"old").open(Recorder::refusing()).unwrap();
        for _ in 0..5 {
            let mut entry = log.begin_entry().unwrap();
            entry.write_chunk(b"written by the old version").unwrap();
            entry.commit().unwrap();
        }
        log.shutdown().unwrap();
        drop(log);

        let abandoning = Recorder {
            abandon: Some(b"old".to_vec()),
            ..Recorder::refusing()
        };
        let log = config(b"new").open(abandoning.clone()).unwrap();
        assert_eq!(abandoning.seen().segments.len(), 1);
        if power_loss {
            fs.power_loss(PowerLoss::Clean);
        } else {
            log.shutdown().unwrap();
        }
        drop(log);

        let everything = Recorder::new();
        let log = config(b"new").open(everything.clone()).unwrap();
        let seen = everything.seen();
        assert!(
            seen.recovered.is_empty() && seen.segments.iter().all(|(_, v)| v != b"old"),
            "power loss {power_loss}: abandoned entries came back: {:?} in {:?}",
            seen.recovered_ids(),
            seen.segments
        );
        drop(seen);
        log.shutdown().unwrap();
    }
}

#[test]
fn oversized_version_info_is_rejected() {
    let fs = MemoryFileSystem::new();
    let err = Configuration::default_for("/log")
        .file_system(fs)
        .version_info(vec![1; 256])
        .open(Recorder::new())
        .expect_err("256 bytes of version info");
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
}

#[test]
fn entry_ids_keep_increasing_across_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let mut highest = 0;
    let mut expected_recovery = Vec::new();
    for round in 0..6_u64 {
        let recorder = Recorder::new();
        let log = small_segments(dir.path()).open(recorder.clone()).unwrap();
        let mut recovered = recorder.seen().recovered_ids();
        recovered.sort_unstable();
        assert_eq!(recovered, expected_recovery, "round {round}");
        expected_recovery.clear();

        let entries = match round {
            2 => 0,
            _ => 30 + round as usize * 10,
        };
        for i in 0..entries {
            let mut entry = log.begin_entry().unwrap();
            let id = entry.id().0;
            assert!(id > highest, "round {round}: id {id} after {highest}");
            highest = id;
            entry.write_chunk(&vec![round as u8; 700]).unwrap();
            if i % 5 == 4 {
                entry.rollback().unwrap();
            } else {
                entry.commit().unwrap();
                expected_recovery.push(id);
            }
        }
        // Every other round ends with everything checkpointed, so no
        // segment that names the last ids is left.
        if round % 2 == 1 {
            log.checkpoint_active().unwrap();
            expected_recovery.clear();
        } else {
            // The background thread may still checkpoint; whatever it did
            // was handed over once, and is not recovered again.
            log.shutdown().unwrap();
            let checkpointed: BTreeSet<u64> =
                recorder.seen().checkpointed_ids().into_iter().collect();
            expected_recovery.retain(|id| !checkpointed.contains(id));
        }
        log.shutdown().ok();
        drop(log);
    }
    // And one last entry after a final reopen.
    let log = small_segments(dir.path()).open(Recorder::new()).unwrap();
    let entry = log.begin_entry().unwrap();
    assert!(entry.id().0 > highest);
    entry.rollback().unwrap();
    log.shutdown().unwrap();
}

#[test]
fn a_chunk_writer_enforces_its_declared_length() {
    let fs = MemoryFileSystem::new();
    let config = || Configuration::default_for("/lengths").file_system(fs.clone());
    let recorder = Recorder::new();
    let log = config().open(recorder.clone()).unwrap();

    // Writing past the declared length is refused, and the bytes that fit
    // can still be finished.
    let mut entry = log.begin_entry().unwrap();
    let mut writer = entry.begin_chunk(10).unwrap();
    writer.write_all(b"0123456").unwrap();
    let err = writer.write(b"789ab").expect_err("5 bytes where 3 fit");
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    writer.write_all(b"789").unwrap();
    let record = writer.finish().unwrap();
    let good = entry.commit().unwrap();
    let (data, valid) = read_chunk(&log, record.position).unwrap();
    assert_eq!(data, b"0123456789");
    assert!(valid);

    // Finishing short is refused, and the entry can then not be committed.
    let mut entry = log.begin_entry().unwrap();
    let short = entry.id();
    let mut writer = entry.begin_chunk(10).unwrap();
    writer.write_all(b"01234").unwrap();
    let err = writer.finish().expect_err("5 of 10 bytes");
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    assert!(entry.commit().is_err());

    // Neither refusal poisons the log.
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(b"still fine").unwrap();
    let last = entry.commit().unwrap();
    log.shutdown().unwrap();
    drop(log);

    let reopened = Recorder::new();
    let log = config().open(reopened.clone()).unwrap();
    let seen = reopened.seen();
    assert_eq!(
        seen.recovered_ids(),
        vec![good.0, last.0],
        "{short} must be absent"
    );
    assert_eq!(seen.recovered[0].1, vec![b"0123456789".to_vec()]);
    drop(seen);
    log.shutdown().unwrap();
}

/// Reads every chunk with `EntryChunk::read_all`, the odd ones after
/// reading their first bytes through `Read`.
fn read_all_after_a_partial_read(
    entry: &mut okaywal::Entry<'_>,
) -> io::Result<Option<Vec<Vec<u8>>>> {
    let id = entry.id().0;
    let mut chunks = Vec::new();
    loop {
        match entry.read_chunk()? {
            okaywal::ReadChunkResult::Chunk(mut chunk) => {
                let mut data = Vec::new();
                if chunks.len() % 2 == 1 {
                    let head = (chunk.len() as usize).min(3);
                    data.resize(head, 0);
                    chunk.read_exact(&mut data)?;
                }
                data.extend(chunk.read_all()?);
                chunks.push(data);
            }
            okaywal::ReadChunkResult::EndOfEntry => return Ok(Some(chunks)),
            okaywal::ReadChunkResult::AbortedEntry => {
                return Err(io::Error::other(format!("entry {id} aborted")))
            }
        }
    }
}

#[test]
fn interleaved_entries_of_every_size_read_back_in_recovery_and_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    // One segment holds everything, so readers walk several megabytes of
    // interleaved records: later entries' chunks sit before earlier ones'.
    let config = || {
        Configuration::default_for(dir.path())
            .preallocate_bytes(8 << 20)
            .checkpoint_after_bytes(8 << 20)
    };
    let sizes = [
        0, 1, 3, 24, 25, 100, 4095, 4096, 65_535, 65_536, 65_537, 200_000, 7, 30_000,
    ];
    let log = config().open(Recorder::refusing()).unwrap();
    let mut expected = Vec::new();
    let mut rng = Rng::new(7);
    for round in 0..6 {
        let mut writers: Vec<_> = (0..3).map(|_| log.begin_entry().unwrap()).collect();
        let mut chunks: Vec<Vec<Vec<u8>>> = vec![Vec::new(); writers.len()];
        for step in 0..12 {
            for (w, writer) in writers.iter_mut().enumerate() {
                let len = sizes[(step * 3 + w + round) % sizes.len()];
                let data = rng.bytes(len);
                writer.write_chunk(&data).unwrap();
                chunks[w].push(data);
            }
        }
        // Commit out of order; ids were given at `begin_entry`.
        let mut ids = Vec::new();
        for (w, writer) in writers.into_iter().enumerate().rev() {
            ids.push((writer.id().0, w));
            writer.commit().unwrap();
        }
        for (id, w) in ids {
            expected.push((id, std::mem::take(&mut chunks[w])));
        }
    }
    expected.sort_by_key(|(id, _)| *id);
    log.shutdown().unwrap();
    drop(log);

    // Recovery through `Read` (the recorder) and through `read_all`.
    let streaming = Recorder::refusing();
    let log = config().open(streaming.clone()).unwrap();
    assert!(streaming.seen().recovered == expected);
    log.shutdown().unwrap();
    drop(log);
    let reading_all = Recorder {
        read_with: Some(read_all_after_a_partial_read),
        ..Recorder::new()
    };
    let log = config().open(reading_all.clone()).unwrap();
    assert!(reading_all.seen().recovered == expected);

    // A checkpoint hands the same entries over again.
    log.checkpoint_active().unwrap();
    assert!(reading_all.seen().checkpointed() == expected);
    log.shutdown().unwrap();
}
