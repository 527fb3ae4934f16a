//! Encryption at rest: no byte the log writes shows what was written;
//! flipped, swapped, moved and replayed bytes are an error or a cut, never
//! wrong bytes; a wrong or missing key is a key error that changes
//! nothing; rotated keys keep older segments readable; every reader works
//! on an encrypted log.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::io::{self, Write};
use std::path::Path;
use std::sync::Arc;

use common::encryption::Encryption;
use common::{Recorder, Rng};
use okaywal::encryption::{Key, KeyError, KeyId, Keyring, StaticKey};
use okaywal::fs::{CrashFileSystem, FileSystem, OpenMode};
use okaywal::{Configuration, LogPosition, LogVoid, RecordType, RecoveryMode, WriteAheadLog};

/// A log directory's files: (name, bytes).
type Files = Vec<(String, Vec<u8>)>;
/// Entries: (id, chunks).
type Entries = Vec<(u64, Vec<Vec<u8>>)>;
/// Chunks and where they were written.
type Positions = Vec<(LogPosition, Vec<u8>)>;

/// Every file of a real directory, by name.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            (name, std::fs::read(entry.path()).unwrap())
        })
        .collect()
}

/// A payload that nothing else in the test contains: a marker naming the
/// entry and chunk, repeated, then random bytes.
fn payload(rng: &mut Rng, id: u64, chunk: usize, len: usize) -> Vec<u8> {
    let marker = format!("<secret entry {id} chunk {chunk}> ");
    let mut bytes: Vec<u8> = marker.bytes().cycle().take(len / 2).collect();
    bytes.extend(rng.bytes(len - bytes.len()));
    bytes
}

/// Writes entries of small, large (written whole by the writer) and
/// streamed chunks, some rolled back, across segment switches and a
/// checkpoint whose segment is recycled and reused. Returns every payload
/// written (rolled back ones too) and where each committed chunk is.
fn varied_workload(log: &WriteAheadLog, seed: u64) -> (Vec<Vec<u8>>, Positions) {
    let mut rng = Rng::new(seed);
    let mut payloads = Vec::new();
    let mut positions = Vec::new();
    for round in 0..36 {
        if round == 18 {
            // Checkpointed and recycled: later segments reuse the file
            // (a refusing manager keeps it).
            let _ = log.checkpoint_active();
        }
        let mut entry = log.begin_entry().unwrap();
        let id = entry.id().0;
        let chunks = 1 + round % 3;
        let mut records = Vec::new();
        for chunk in 0..chunks {
            let len = match (round + chunk) % 7 {
                0 => 90_000 + rng.range(0, 40_000),
                1 => 0,
                _ => rng.range(1, 3_000),
            };
            let data = payload(&mut rng, id, chunk, len);
            let record = if round % 5 == 2 && chunk == 0 {
                let mut writer = entry.begin_chunk(len as u32).unwrap();
                for piece in data.chunks(7_000) {
                    writer.write_all(piece).unwrap();
                }
                writer.finish().unwrap()
            } else {
                entry.write_chunk(&data).unwrap()
            };
            assert_eq!(record.crc, crc32fast::hash(&data));
            records.push((record.position, data.clone()));
            payloads.push(data);
        }
        if round % 9 == 4 {
            entry.rollback().unwrap();
        } else {
            if round % 2 == 0 {
                entry.commit().unwrap();
            } else {
                entry.commit_buffered().unwrap();
            }
            positions.extend(records);
        }
    }
    log.sync().unwrap();
    (payloads, positions)
}

/// The 16-byte windows of `payloads` found in `files`: (file, offset).
fn leaked_windows(payloads: &[Vec<u8>], files: &BTreeMap<String, Vec<u8>>) -> Vec<(String, usize)> {
    let windows: HashSet<&[u8]> = payloads
        .iter()
        .flat_map(|payload| payload.windows(16))
        .collect();
    let mut found = Vec::new();
    for (name, bytes) in files {
        for (at, window) in bytes.windows(16).enumerate() {
            if windows.contains(window) {
                found.push((name.clone(), at));
                break;
            }
        }
    }
    found
}

const VERSION_INFO: &[u8] = b"version information the disk must not show";

fn small_segments(dir: &Path, encryption: Encryption) -> Configuration {
    encryption.configure(
        Configuration::default_for(dir)
            .preallocate_bytes(128 * 1024)
            .checkpoint_after_bytes(128 * 1024)
            .version_info(VERSION_INFO),
    )
}

#[test]
fn no_file_of_an_encrypted_log_holds_a_payload_or_any_16_byte_window_of_one() {
    for encryption in Encryption::BOTH {
        let dir = tempfile::tempdir().unwrap();
        let log = small_segments(dir.path(), encryption)
            .open(LogVoid)
            .unwrap();
        let (mut payloads, _) = varied_workload(&log, 5);
        let stats = log.stats();
        log.shutdown().unwrap();
        drop(log);
        assert!(stats.checkpoints > 1, "{stats:?}");
        let files = snapshot(dir.path());
        assert!(
            files.keys().filter(|name| name.starts_with("wal-")).count() >= 2,
            "{:?}",
            files.keys()
        );
        payloads.push(VERSION_INFO.to_vec());
        let leaks = leaked_windows(&payloads, &files);
        if encryption.on() {
            assert!(leaks.is_empty(), "plaintext on disk: {leaks:?}");
        } else {
            // The check finds plaintext where there is some.
            assert!(leaks.len() >= 2, "{leaks:?}");
        }
    }
}

#[test]
fn every_reader_reads_an_encrypted_log_with_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = || small_segments(dir.path(), Encryption::On);
    let recorder = Recorder::refusing();
    let log = config().open(recorder.clone()).unwrap();
    let mut follower = log.entries_from(okaywal::EntryId(1));
    let (_, positions) = varied_workload(&log, 6);
    // The live log: by position, and followed.
    for (position, data) in &positions {
        assert_eq!(&log.read_at(*position).unwrap().read_all().unwrap(), data);
        let mut reader = log.read_at(*position).unwrap();
        assert!(reader.crc_is_valid().unwrap(), "{position}");
    }
    let followed: Vec<Vec<u8>> = follower
        .by_ref()
        .flat_map(|entry| entry.unwrap().into_chunks())
        .collect();
    let written: Vec<Vec<u8>> = positions.iter().map(|(_, data)| data.clone()).collect();
    assert_eq!(followed, written, "the live reader's chunks");
    drop(follower);
    log.shutdown().unwrap();
    drop(log);

    // Recovery hands over every committed entry with its bytes.
    let again = Recorder::refusing();
    let log = config().open(again.clone()).unwrap();
    let recovered: Vec<Vec<u8>> = again
        .seen()
        .recovered
        .iter()
        .flat_map(|(_, chunks)| chunks.clone())
        .collect();
    assert_eq!(recovered, written, "recovered chunks");
    log.shutdown().unwrap();
    drop(log);

    // Read-only, by position; inspection; the listing of one segment.
    let read_only = config().open_read_only(LogVoid).unwrap();
    for (position, data) in &positions {
        assert_eq!(
            &read_only.read_at(*position).unwrap().read_all().unwrap(),
            data
        );
    }
    drop(read_only);
    let inspection = config().inspect().unwrap();
    assert!(inspection.is_ok(), "{:?}", inspection.problems);
    let listed: usize = inspection.segments.iter().map(|s| s.entries.len()).sum();
    assert!(listed > 0);
    assert!(inspection
        .segments
        .iter()
        .all(|segment| segment.version_info == VERSION_INFO));
    let first = inspection.segments[0].id;
    let records = config().inspect_segment(first).unwrap();
    assert!(matches!(
        records.header,
        okaywal::HeaderStatus::Valid {
            format_version: 3,
            ..
        }
    ));
    assert!(records
        .records
        .iter()
        .filter(|record| record.kind == RecordType::Chunk)
        .all(|record| record.crc_ok == Some(true)));
    assert!(records
        .records
        .iter()
        .any(|record| record.kind == RecordType::Commit));
}

/// Large chunks are sealed and written by their writers, 16 frames of
/// 64 KiB at a time: chunks of one frame to more than five batches,
/// written by several threads at once, read back by position, live and
/// after a reopen, and leave no plaintext on disk.
#[test]
fn large_encrypted_chunks_of_every_size_read_back_and_leave_no_plaintext() {
    let dir = tempfile::tempdir().unwrap();
    let config = || Encryption::On.configure(Configuration::default_for(dir.path()));
    let log = config().open(LogVoid).unwrap();
    let sizes = [70_000usize, 1 << 20, (4 << 20) + 1, (5 << 20) + 70_000];
    let written: Vec<Positions> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..3u64)
            .map(|thread| {
                let log = &log;
                scope.spawn(move || {
                    let mut rng = Rng::new(40 + thread);
                    let mut positions = Vec::new();
                    for (i, &len) in sizes.iter().enumerate() {
                        let mut entry = log.begin_entry().unwrap();
                        let data = payload(&mut rng, entry.id().0, i, len);
                        let record = entry.write_chunk(&data).unwrap();
                        entry.commit().unwrap();
                        positions.push((record.position, data));
                    }
                    positions
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let positions: Positions = written.into_iter().flatten().collect();
    for (position, data) in &positions {
        assert_eq!(&log.read_at(*position).unwrap().read_all().unwrap(), data);
    }
    log.shutdown().unwrap();
    drop(log);
    let read_only = config().open_read_only(LogVoid).unwrap();
    for (position, data) in &positions {
        let read = read_only.read_at(*position).unwrap().read_all().unwrap();
        assert!(&read == data, "{} bytes at {position}", data.len());
    }
    drop(read_only);
    // Each payload's first and last 4 KiB: its marker and its random tail.
    let samples: Vec<Vec<u8>> = positions
        .iter()
        .flat_map(|(_, data)| [data[..4096].to_vec(), data[data.len() - 4096..].to_vec()])
        .collect();
    let leaks = leaked_windows(&samples, &snapshot(dir.path()));
    assert!(leaks.is_empty(), "plaintext on disk: {leaks:?}");
}

/// A small encrypted log on the simulated disk: entries of one to three
/// chunks, each committed durably, so that every record carries a durable
/// mark past the entries before it. Returns the files and the entries.
fn small_encrypted_log(fs: &CrashFileSystem, shapes: &[&[usize]]) -> (Files, Entries) {
    small_encrypted_log_with(fs, shapes, false)
}

/// As [`small_encrypted_log`]; with `presealed`, every chunk is written
/// with `write_presealed_chunk` (stored as given, with a CRC32).
fn small_encrypted_log_with(
    fs: &CrashFileSystem,
    shapes: &[&[usize]],
    presealed: bool,
) -> (Files, Entries) {
    let log = one_segment(fs).open(LogVoid).unwrap();
    let mut rng = Rng::new(77);
    let mut entries = Vec::new();
    for shape in shapes {
        let mut entry = log.begin_entry().unwrap();
        let id = entry.id().0;
        let chunks: Vec<Vec<u8>> = shape
            .iter()
            .enumerate()
            .map(|(i, len)| payload(&mut rng, id, i, *len))
            .collect();
        for chunk in &chunks {
            if presealed {
                entry.write_presealed_chunk(chunk).unwrap();
            } else {
                entry.write_chunk(chunk).unwrap();
            }
        }
        entry.commit().unwrap();
        entries.push((id, chunks));
    }
    log.shutdown().unwrap();
    drop(log);
    let mut files = Vec::new();
    for name in fs.list_files(Path::new(DIR)).unwrap() {
        files.push((
            name.clone(),
            fs.contents(&Path::new(DIR).join(name)).unwrap(),
        ));
    }
    files.sort();
    (files, entries)
}

const DIR: &str = "/sealed";

fn one_segment(fs: &CrashFileSystem) -> Configuration {
    Encryption::On.configure(
        Configuration::default_for(DIR)
            .file_system(fs.clone())
            .preallocate_bytes(64 * 1024)
            .checkpoint_after_bytes(1 << 20),
    )
}

fn fresh_fs(files: &[(String, Vec<u8>)]) -> CrashFileSystem {
    let fs = CrashFileSystem::new();
    fs.create_dir_all(Path::new(DIR)).unwrap();
    for (name, bytes) in files {
        let path = Path::new(DIR).join(name);
        fs.open(&path, OpenMode::CreateNew).unwrap();
        assert!(fs.set_contents(&path, bytes.clone()));
    }
    fs
}

/// Opens `files` in `mode`: the ids recovered, each checked to be one of
/// `entries` with exactly its bytes, or the open's error.
fn recover(
    files: &[(String, Vec<u8>)],
    entries: &[(u64, Vec<Vec<u8>>)],
    mode: RecoveryMode,
    what: &str,
) -> io::Result<Vec<u64>> {
    let fs = fresh_fs(files);
    let recorder = Recorder::new();
    let log = one_segment(&fs)
        .recovery_mode(mode)
        .open(recorder.clone())?;
    let seen = std::mem::take(&mut *recorder.seen());
    log.shutdown().unwrap();
    let mut ids = Vec::new();
    for (id, chunks) in &seen.recovered {
        let expected = entries
            .iter()
            .find(|(written, _)| written == id)
            .unwrap_or_else(|| panic!("{what}: entry {id} was never written"));
        assert_eq!(&expected.1, chunks, "{what}: entry {id} has wrong bytes");
        ids.push(*id);
    }
    assert!(seen.aborted.is_empty(), "{what}: {:?}", seen.aborted);
    Ok(ids)
}

/// Where each record of the log's one segment starts and ends.
fn record_spans(files: &[(String, Vec<u8>)]) -> (String, Vec<(RecordType, u64, u64)>) {
    let fs = fresh_fs(files);
    let (name, _) = files
        .iter()
        .find(|(name, _)| {
            okaywal::LogFileName::parse(name)
                .is_some_and(|n| matches!(n, okaywal::LogFileName::Segment(_)))
        })
        .unwrap();
    let okaywal::LogFileName::Segment(id) = okaywal::LogFileName::parse(name).unwrap() else {
        unreachable!()
    };
    let listing = one_segment(&fs).inspect_segment(id).unwrap();
    let mut spans = Vec::new();
    for (i, record) in listing.records.iter().enumerate() {
        let end = listing
            .records
            .get(i + 1)
            .map_or_else(|| listing.end.as_ref().unwrap().offset, |next| next.offset);
        spans.push((record.kind, record.offset, end));
    }
    (name.clone(), spans)
}

fn with_segment(files: &[(String, Vec<u8>)], name: &str, bytes: Vec<u8>) -> Vec<(String, Vec<u8>)> {
    files
        .iter()
        .map(|(file, old)| {
            if file == name {
                (file.clone(), bytes.clone())
            } else {
                (file.clone(), old.clone())
            }
        })
        .collect()
}

#[test]
fn a_flipped_bit_anywhere_in_an_encrypted_segment_is_an_error_or_a_cut_never_wrong_bytes() {
    flip_every_bit(false);
}

#[test]
fn a_flipped_bit_anywhere_in_presealed_chunks_is_an_error_or_a_cut_never_wrong_bytes() {
    flip_every_bit(true);
}

/// Flips one bit at a time in the header and in every byte of every
/// record of a small encrypted log (every chunk pre-sealed, or none).
fn flip_every_bit(presealed: bool) {
    let fs = CrashFileSystem::new();
    let (files, entries) =
        small_encrypted_log_with(&fs, &[&[300], &[40, 0], &[30, 70, 1]], presealed);
    let (name, spans) = record_spans(&files);
    let original = files.iter().find(|(n, _)| *n == name).unwrap().1.clone();
    let ids: Vec<u64> = entries.iter().map(|(id, _)| *id).collect();
    // Records: 1 + 1 for the first entry, 2 + 1, 3 + 1, and the
    // shutdown's end mark.
    assert_eq!(spans.len(), 10, "{spans:?}");
    assert_eq!(spans[9].0, RecordType::Padding, "{spans:?}");
    let first_end = spans[1].2;
    let mark_start = spans[9].1;
    let end = spans[9].2;
    let (mut errors, mut cuts) = (0, 0);
    // The header and every byte of every record.
    for offset in (0..512).step_by(7).chain(512..end) {
        let mut flipped = original.clone();
        flipped[offset as usize] ^= 1 << (offset % 8);
        let what = format!("bit {} flipped at {offset}", offset % 8);
        match recover(
            &with_segment(&files, &name, flipped),
            &entries,
            RecoveryMode::default(),
            &what,
        ) {
            Ok(recovered) => {
                cuts += 1;
                if offset >= mark_start {
                    // The end mark: a torn tail past every entry.
                    assert_eq!(recovered, ids, "{what}");
                } else if offset >= 512 {
                    panic!("{what}: damage before later synced records opened: {recovered:?}");
                } else {
                    assert!(recovered.is_empty(), "{what}: {recovered:?}");
                }
            }
            Err(error) => {
                errors += 1;
                assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{what}: {error}");
                assert!(error.to_string().contains(&name), "{what}: {error}");
                if (512..first_end).contains(&offset) {
                    // Skipping loses the damaged entry only.
                    let kept = recover(
                        &with_segment(&files, &name, {
                            let mut flipped = original.clone();
                            flipped[offset as usize] ^= 1 << (offset % 8);
                            flipped
                        }),
                        &entries,
                        RecoveryMode::SkipCorrupted,
                        &what,
                    )
                    .unwrap();
                    assert_eq!(kept, ids[1..], "{what} (SkipCorrupted)");
                }
            }
        }
    }
    println!("{errors} errors, {cuts} cuts");
}

#[test]
fn swapped_or_moved_encrypted_records_are_an_error_or_a_cut_never_wrong_bytes() {
    let fs = CrashFileSystem::new();
    // Entries of the same shape: their records have the same lengths.
    let (files, entries) = small_encrypted_log(&fs, &[&[64], &[64], &[64], &[64]]);
    let (name, spans) = record_spans(&files);
    let original = files.iter().find(|(n, _)| *n == name).unwrap().1.clone();
    let chunk = |entry: usize| spans[entry * 2];
    let commit = |entry: usize| spans[entry * 2 + 1];
    let swap = |a: (RecordType, u64, u64), b: (RecordType, u64, u64)| {
        let mut bytes = original.clone();
        let len = (a.2 - a.1) as usize;
        assert_eq!(len as u64, b.2 - b.1);
        let (a, b) = (a.1 as usize, b.1 as usize);
        let first = original[a..a + len].to_vec();
        bytes.copy_within(b..b + len, a);
        bytes[b..b + len].copy_from_slice(&first);
        bytes
    };
    let mut cases = vec![
        (
            "chunks of entries 1 and 2 swapped",
            swap(chunk(1), chunk(2)),
        ),
        (
            "commits of entries 1 and 2 swapped",
            swap(commit(1), commit(2)),
        ),
        (
            "chunks of entries 2 and 3 swapped",
            swap(chunk(2), chunk(3)),
        ),
    ];
    // A chunk record copied over the one after it: a record moved.
    let mut moved = original.clone();
    let (a, b) = (chunk(1), chunk(2));
    moved.copy_within(a.1 as usize..a.2 as usize, b.1 as usize);
    cases.push(("entry 1's chunk copied over entry 2's", moved));
    // The frames (data) of two chunks swapped, their headers kept.
    let header = 69;
    let mut frames = original.clone();
    let (a, b) = (
        (chunk(1).1 + header) as usize,
        (chunk(2).1 + header) as usize,
    );
    let len = (chunk(1).2 - chunk(1).1 - header) as usize;
    let first = original[a..a + len].to_vec();
    frames.copy_within(b..b + len, a);
    frames[b..b + len].copy_from_slice(&first);
    cases.push(("the data of entries 1 and 2 swapped", frames));
    for (what, bytes) in cases {
        let files = with_segment(&files, &name, bytes);
        for mode in [
            RecoveryMode::ErrorOnCorruption,
            RecoveryMode::PointInTime,
            RecoveryMode::SkipCorrupted,
        ] {
            let what = format!("{what} ({mode:?})");
            match recover(&files, &entries, mode, &what) {
                Ok(ids) => assert!(
                    mode != RecoveryMode::ErrorOnCorruption,
                    "{what}: opened with {ids:?}"
                ),
                Err(error) => {
                    assert_eq!(mode, RecoveryMode::ErrorOnCorruption, "{what}: {error}");
                    assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{what}: {error}");
                }
            }
        }
    }

    // A record of another segment file copied in at the same offset.
    let fs = CrashFileSystem::new();
    let (other, _) = small_encrypted_log(&fs, &[&[64], &[64], &[64], &[64]]);
    let other = other.iter().find(|(n, _)| *n == name).unwrap().1.clone();
    let mut moved = original.clone();
    let (start, end) = (chunk(1).1 as usize, commit(1).2 as usize);
    moved[start..end].copy_from_slice(&other[start..end]);
    let what = "entry 1 of another log's segment copied in";
    let error = recover(
        &with_segment(&files, &name, moved),
        &entries,
        RecoveryMode::default(),
        what,
    )
    .unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{what}: {error}");
}

/// The same segment id, another generation: a log whose first segment
/// (id 1) holds six entries, and another one, under the same key, whose
/// first segment (also id 1) holds two. The first one's records past the
/// second one's end verify in everything but their generation (with
/// `presealed`, their data's CRCs verify too).
fn records_of_another_generation_past_the_tail(presealed: bool) {
    let fs = CrashFileSystem::new();
    let (long, _) = small_encrypted_log_with(&fs, &[&[64_usize][..]; 6], presealed);
    let fs = CrashFileSystem::new();
    let (short, entries) = small_encrypted_log_with(&fs, &[&[64_usize][..]; 2], presealed);
    let (name, spans) = record_spans(&short);
    let tail = spans.last().unwrap().2 as usize;
    let long_bytes = long.iter().find(|(n, _)| *n == name).unwrap().1.clone();
    let mut spliced = short.iter().find(|(n, _)| *n == name).unwrap().1.clone();
    let (_, long_spans) = record_spans(&long);
    let long_end = long_spans.last().unwrap().2 as usize;
    spliced[tail..long_end].copy_from_slice(&long_bytes[tail..long_end]);
    let what = "another generation's records past the tail";
    let ids = recover(
        &with_segment(&short, &name, spliced),
        &entries,
        RecoveryMode::default(),
        what,
    )
    .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(
        ids,
        entries.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        "{what}"
    );
}

#[test]
fn bytes_of_an_earlier_generation_of_a_segment_file_are_never_read_back() {
    records_of_another_generation_past_the_tail(false);
    records_of_another_generation_past_the_tail(true);

    // A recycled file: its old records copied back over the new ones.
    let fs = CrashFileSystem::new();
    let log = config_on(&fs).open(LogVoid).unwrap();
    let mut rng = Rng::new(3);
    let commit = |log: &WriteAheadLog, rng: &mut Rng, len: usize| {
        let mut entry = log.begin_entry().unwrap();
        let id = entry.id().0;
        let data = payload(rng, id, 0, len);
        entry.write_chunk(&data).unwrap();
        entry.commit().unwrap();
        (id, vec![data])
    };
    // The first segment long, then short ones (each checkpointed and
    // recycled) until one reuses the first one's file: its old records
    // are still there past the new ones.
    let mut written: Vec<_> = (0..10).map(|_| commit(&log, &mut rng, 1_000)).collect();
    let old_ids: Vec<u64> = written.iter().map(|(id, _)| *id).collect();
    let old = fs
        .contents(&Path::new(DIR).join(format!("wal-{}", old_ids[0])))
        .unwrap();
    let stale = 9_000..10_000;
    let mut reused = None;
    // Which spare a new segment takes depends on when the background
    // checkpoints recycled the files: keep going until the first one's
    // file comes back (usually within a few segments).
    for _ in 0..200 {
        log.checkpoint_active().unwrap();
        let first = commit(&log, &mut rng, 500);
        let name = format!("wal-{}", first.0);
        written.push(first);
        written.extend((0..2).map(|_| commit(&log, &mut rng, 500)));
        let bytes = fs.contents(&Path::new(DIR).join(&name)).unwrap();
        if bytes.get(stale.clone()) == Some(&old[stale.clone()]) {
            reused = Some(name);
            break;
        }
    }
    let reused = reused.expect("the first segment's file is reused");
    log.shutdown().unwrap();
    drop(log);
    let names = fs.list_files(Path::new(DIR)).unwrap();
    let mut files = Vec::new();
    for name in &names {
        files.push((
            name.clone(),
            fs.contents(&Path::new(DIR).join(name)).unwrap(),
        ));
    }
    let new_bytes = files
        .iter()
        .find(|(name, _)| *name == reused)
        .unwrap()
        .1
        .clone();
    let check = |files: &[(String, Vec<u8>)], what: &str| {
        let fs = fresh_fs(files);
        let recorder = Recorder::new();
        match config_on(&fs).open(recorder.clone()) {
            Ok(log) => {
                for (id, chunks) in &recorder.seen().recovered {
                    let expected = written.iter().find(|(w, _)| w == id).unwrap();
                    assert_eq!(&expected.1, chunks, "{what}: entry {id}");
                    assert!(
                        !old_ids.contains(id),
                        "{what}: entry {id} of the file's earlier use came back"
                    );
                }
                log.shutdown().unwrap();
            }
            Err(error) => assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{what}: {error}"),
        }
    };
    let fs_check = fresh_fs(&files);
    let recorder = Recorder::new();
    config_on(&fs_check)
        .open(recorder.clone())
        .unwrap()
        .shutdown()
        .unwrap();
    assert_eq!(
        recorder.seen().recovered.len(),
        3,
        "the reused file's entries"
    );
    check(&files, "as written");
    // The old records over the new ones, the new header kept.
    let mut replayed = new_bytes.clone();
    let end = old.len().min(new_bytes.len());
    replayed[512..end].copy_from_slice(&old[512..end]);
    check(
        &with_segment(&files, &reused, replayed),
        "old records copied back",
    );
    // The whole old file copied back under the new name.
    check(
        &with_segment(&files, &reused, old.clone()),
        "old file copied back",
    );
}

fn config_on(fs: &CrashFileSystem) -> Configuration {
    Encryption::On.configure(
        Configuration::default_for(DIR)
            .file_system(fs.clone())
            .preallocate_bytes(16 * 1024)
            .checkpoint_after_bytes(16 * 1024),
    )
}

/// Every way of opening or looking at `dir` with `config` fails with
/// `expected`, and no file changes.
fn assert_key_error(dir: &Path, config: impl Fn() -> Configuration, expected: KeyError) {
    let before = snapshot(dir);
    let segment = before
        .keys()
        .find_map(|name| match okaywal::LogFileName::parse(name) {
            Some(okaywal::LogFileName::Segment(id)) => Some(id),
            _ => None,
        })
        .expect("a segment");
    let errors = [
        ("open", config().open(LogVoid).map(drop).unwrap_err()),
        (
            "open_read_only",
            config().open_read_only(LogVoid).map(drop).unwrap_err(),
        ),
        ("inspect", config().inspect().map(drop).unwrap_err()),
        (
            "inspect_segment",
            config().inspect_segment(segment).map(drop).unwrap_err(),
        ),
    ];
    for (what, error) in errors {
        assert_eq!(
            error.kind(),
            io::ErrorKind::PermissionDenied,
            "{what}: {error}"
        );
        assert_eq!(KeyError::of(&error), Some(&expected), "{what}: {error}");
        assert!(error.to_string().contains("wal-"), "{what}: {error}");
        if expected != KeyError::NotEncrypted {
            // Missing, wrong or no key at all: the error names the key id
            // the files want.
            assert!(error.to_string().contains("key id 1"), "{what}: {error}");
        }
    }
    assert_eq!(snapshot(dir), before, "the directory changed");
}

#[test]
fn a_wrong_or_missing_key_fails_every_open_with_a_key_error_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let log = small_segments(dir.path(), Encryption::On)
        .open(Recorder::refusing())
        .unwrap();
    varied_workload(&log, 8);
    log.shutdown().unwrap();
    drop(log);
    let plain = || small_segments(dir.path(), Encryption::Off);
    let wrong = StaticKey::with_id(KeyId::new(1), Key::from_bytes([9; 32]));
    assert_key_error(
        dir.path(),
        || plain().encryption(wrong.clone()),
        KeyError::Wrong(KeyId::new(1)),
    );
    let other = StaticKey::with_id(KeyId::new(2), Key::from_bytes([9; 32]));
    assert_key_error(
        dir.path(),
        || plain().encryption(other.clone()),
        KeyError::Missing(KeyId::new(1)),
    );
    assert_key_error(dir.path(), plain, KeyError::NotConfigured);
    // With the key it opens (and recovers every entry).
    small_segments(dir.path(), Encryption::On)
        .open(Recorder::refusing())
        .unwrap()
        .shutdown()
        .unwrap();

    // A plain log with a key.
    let dir = tempfile::tempdir().unwrap();
    let log = small_segments(dir.path(), Encryption::Off)
        .open(LogVoid)
        .unwrap();
    varied_workload(&log, 9);
    log.shutdown().unwrap();
    drop(log);
    assert_key_error(
        dir.path(),
        || small_segments(dir.path(), Encryption::On),
        KeyError::NotEncrypted,
    );
    small_segments(dir.path(), Encryption::Off)
        .open(LogVoid)
        .unwrap()
        .shutdown()
        .unwrap();
}

#[test]
fn after_a_rotation_new_segments_use_the_new_key_and_older_ones_need_the_old() {
    let dir = tempfile::tempdir().unwrap();
    let (k1, k2) = (Key::from_bytes([1; 32]), Key::from_bytes([2; 32]));
    let ring = Arc::new(Keyring::new(KeyId::new(1), k1.clone()));
    let config = |provider: Arc<Keyring>| {
        Configuration::default_for(dir.path())
            .preallocate_bytes(64 * 1024)
            .checkpoint_after_bytes(1 << 20)
            .encryption(provider)
    };
    // Checkpoints are refused: every segment stays in the log.
    let log = config(ring.clone()).open(Recorder::refusing()).unwrap();
    let mut written = BTreeMap::new();
    let mut rng = Rng::new(11);
    let mut commit = |log: &WriteAheadLog| {
        let mut entry = log.begin_entry().unwrap();
        let data = payload(&mut rng, entry.id().0, 0, 2_000);
        entry.write_chunk(&data).unwrap();
        written.insert(entry.commit().unwrap().0, vec![data]);
    };
    for _ in 0..5 {
        commit(&log);
    }
    ring.rotate(KeyId::new(2), k2.clone());
    // The next segment starts now, under key 2.
    let _ = log.checkpoint_active();
    for _ in 0..5 {
        commit(&log);
    }
    log.shutdown().unwrap();
    drop(log);

    let both = Arc::new(Keyring::new(KeyId::new(2), k2.clone()));
    both.add(KeyId::new(1), k1.clone());
    let recorder = Recorder::refusing();
    let log = config(both).open(recorder.clone()).unwrap();
    let recovered: BTreeMap<u64, Vec<Vec<u8>>> =
        recorder.seen().recovered.iter().cloned().collect();
    assert_eq!(recovered, written);
    log.shutdown().unwrap();
    drop(log);

    let only_new = || config(Arc::new(Keyring::new(KeyId::new(2), k2.clone())));
    assert_key_error(dir.path(), only_new, KeyError::Missing(KeyId::new(1)));
    // And the newer segment needs key 2.
    let only_old = || config(Arc::new(Keyring::new(KeyId::new(1), k1.clone())));
    let error = only_old().open(LogVoid).map(drop).unwrap_err();
    assert_eq!(
        KeyError::of(&error),
        Some(&KeyError::Missing(KeyId::new(2))),
        "{error}"
    );
}

/// An entry's id and its chunks: whether each was pre-sealed, its bytes.
type FlaggedEntry = (u64, Vec<(bool, Vec<u8>)>);

/// Every entry recovery hands over, with each chunk's bytes and whether
/// it was pre-sealed; refuses checkpoints, so entries stay in the log.
#[derive(Debug, Clone, Default)]
struct ChunkKinds(Arc<parking_lot::Mutex<Vec<FlaggedEntry>>>);

impl okaywal::LogManager for ChunkKinds {
    fn recover(&mut self, entry: &mut okaywal::Entry<'_>) -> io::Result<()> {
        let mut chunks = Vec::new();
        loop {
            match entry.read_chunk()? {
                okaywal::ReadChunkResult::Chunk(mut chunk) => {
                    let presealed = chunk.is_presealed();
                    chunks.push((presealed, chunk.read_all()?));
                }
                okaywal::ReadChunkResult::EndOfEntry => break,
                okaywal::ReadChunkResult::AbortedEntry => return Ok(()),
            }
        }
        self.0.lock().push((entry.id().0, chunks));
        Ok(())
    }

    fn checkpoint_to(
        &mut self,
        _: okaywal::EntryId,
        _: &mut okaywal::SegmentReader,
        _: &WriteAheadLog,
    ) -> io::Result<()> {
        Err(io::Error::other("this test keeps every entry in the log"))
    }
}

#[test]
fn presealed_chunks_are_stored_as_given_and_flagged_to_every_reader() {
    for encryption in Encryption::BOTH {
        let dir = tempfile::tempdir().unwrap();
        let config = || {
            encryption
                .configure(Configuration::default_for(dir.path()).checkpoint_after_bytes(1 << 30))
        };
        let log = config().open(ChunkKinds::default()).unwrap();
        let mut rng = Rng::new(11);
        let mut written = Vec::new();
        let mut ordinary = Vec::new();
        let mut presealed = Vec::new();
        for i in 0..6_usize {
            let mut entry = log.begin_entry().unwrap();
            let id = entry.id().0;
            let plain = payload(&mut rng, id, 0, 300);
            // Small, empty, and large (written whole by the writer).
            let sealed_len = [500, 0, 200, 100 * 1024, 1, 70_000][i];
            // Random bytes, as a sealed chunk's would be (no marker that
            // the ordinary chunk's windows could share).
            let sealed = rng.bytes(sealed_len);
            let plain_at = entry.write_chunk(&plain).unwrap().position;
            let sealed_at = entry.write_presealed_chunk(&sealed).unwrap().position;
            entry.commit().unwrap();
            ordinary.push((plain_at, plain.clone()));
            presealed.push((sealed_at, sealed.clone()));
            written.push((id, vec![(false, plain), (encryption.on(), sealed)]));
        }
        // A follower of the live log sees the same flags.
        let followed: Vec<_> = log
            .entries_from(okaywal::EntryId(0))
            .map(|entry| {
                let entry = entry.unwrap();
                let flags = (0..3).map(|i| entry.is_presealed(i)).collect::<Vec<_>>();
                (entry.id().0, entry.into_chunks(), flags)
            })
            .collect();
        assert_eq!(followed.len(), written.len());
        for ((id, chunks, flags), (written_id, written_chunks)) in followed.iter().zip(&written) {
            assert_eq!(id, written_id);
            let expected: Vec<Vec<u8>> = written_chunks.iter().map(|(_, d)| d.clone()).collect();
            assert_eq!(chunks, &expected, "{encryption:?}: followed entry {id}");
            assert_eq!(
                flags,
                &[false, encryption.on(), false],
                "{encryption:?}: entry {id}"
            );
        }
        for (positions, flag) in [(&ordinary, false), (&presealed, encryption.on())] {
            for (position, data) in positions {
                let mut chunk = log.read_at(*position).unwrap();
                assert_eq!(chunk.is_presealed(), flag, "{encryption:?} at {position}");
                let mut bytes = Vec::new();
                io::Read::read_to_end(&mut chunk, &mut bytes).unwrap();
                assert_eq!(&bytes, data, "{encryption:?} at {position}");
                assert!(chunk.crc_is_valid().unwrap());
            }
        }
        log.shutdown().unwrap();
        drop(log);

        let files = snapshot(dir.path());
        if encryption.on() {
            // The log sealed the ordinary chunks; the pre-sealed ones are
            // stored as their writer gave them.
            let ordinary: Vec<Vec<u8>> = ordinary.into_iter().map(|(_, d)| d).collect();
            let leaks = leaked_windows(&ordinary, &files);
            assert!(leaks.is_empty(), "plaintext on disk: {leaks:?}");
            for (_, data) in presealed.iter().filter(|(_, d)| d.len() >= 16) {
                assert!(
                    files
                        .values()
                        .any(|file| file.windows(data.len()).any(|w| w == data)),
                    "a pre-sealed chunk of {} bytes is stored as given",
                    data.len()
                );
            }
        }

        let kinds = ChunkKinds::default();
        let log = config().open(kinds.clone()).unwrap();
        assert_eq!(*kinds.0.lock(), written, "{encryption:?}: recovered");
        log.shutdown().unwrap();
    }
}

#[test]
fn a_changed_presealed_chunk_whose_crc_is_fixed_reads_back_changed_and_flagged() {
    // The log's CRC catches torn and damaged bytes of a pre-sealed
    // chunk, not a deliberate change: the chunk reads back with the
    // flag that tells its reader to authenticate it with its own seal.
    let fs = CrashFileSystem::new();
    let (files, entries) = small_encrypted_log_with(&fs, &[&[64], &[64]], true);
    let (name, spans) = record_spans(&files);
    let mut bytes = files.iter().find(|(n, _)| *n == name).unwrap().1.clone();
    // The first entry's chunk: header (69 bytes), data, CRC.
    let (kind, start, end) = spans[0];
    assert_eq!(kind, RecordType::Chunk);
    let data = (start + 69) as usize..(end - 4) as usize;
    assert_eq!(&bytes[data.clone()], &entries[0].1[0][..]);
    bytes[data.start] ^= 0xFF;
    let crc = crc32fast::hash(&bytes[data.clone()]);
    bytes[data.end..data.end + 4].copy_from_slice(&crc.to_le_bytes());
    let fs = fresh_fs(&with_segment(&files, &name, bytes));
    let kinds = ChunkKinds::default();
    let log = one_segment(&fs).open(kinds.clone()).unwrap();
    let seen = kinds.0.lock().clone();
    log.shutdown().unwrap();
    assert_eq!(seen.len(), 2);
    let (presealed, changed) = &seen[0].1[0];
    assert!(*presealed);
    assert_ne!(changed, &entries[0].1[0]);
    assert_eq!(changed[1..], entries[0].1[0][1..]);
}

/// Byte `k` of chunk `c` of the fixture's entry `i + 1`.
fn fixture_chunk(i: u64, c: u64, len: usize) -> Vec<u8> {
    let seed = i * 10 + c;
    (0..len as u64)
        .map(|k| ((seed * 31 + k * 7 + k / 256) % 251) as u8)
        .collect()
}

fn fixture_entries() -> Vec<FlaggedEntry> {
    (0..12_u64)
        .map(|i| {
            let sizes = match i {
                5 => vec![70 * 1024],
                7 => vec![0, 10, 3000],
                _ => vec![(i as usize * 377) % 3000 + 1, 64],
            };
            let chunks = sizes
                .iter()
                .enumerate()
                .map(|(c, len)| (false, fixture_chunk(i, c as u64, *len)))
                .collect();
            (i + 1, chunks)
        })
        .collect()
}

#[test]
fn a_log_written_in_encrypted_format_version_2_opens_reads_and_goes_on_in_version_3() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/encrypted-format-2");
    std::fs::copy(fixture.join("wal-1"), dir.path().join("wal-1")).unwrap();
    let config = || {
        Configuration::default_for(dir.path())
            .encryption(StaticKey::new([0x42; 32]))
            .checkpoint_after_bytes(1 << 30)
    };
    let before = config().inspect_segment(1).unwrap();
    assert!(
        matches!(
            before.header,
            okaywal::HeaderStatus::Valid {
                format_version: 2,
                ..
            }
        ),
        "{:?}",
        before.header
    );
    // A wrong key is a key error, as for any encrypted log.
    let error = Configuration::default_for(dir.path())
        .encryption(StaticKey::new([0x43; 32]))
        .open(ChunkKinds::default())
        .unwrap_err();
    assert!(KeyError::of(&error).is_some(), "{error}");

    let kinds = ChunkKinds::default();
    let log = config().open(kinds.clone()).unwrap();
    let mut expected = fixture_entries();
    assert_eq!(*kinds.0.lock(), expected, "the version 2 entries");
    let mut entry = log.begin_entry().unwrap();
    let id = entry.id().0;
    assert_eq!(id, 13);
    let plain = fixture_chunk(99, 0, 700);
    let sealed = fixture_chunk(99, 1, 900);
    entry.write_chunk(&plain).unwrap();
    let at = entry.write_presealed_chunk(&sealed).unwrap().position;
    entry.commit().unwrap();
    log.shutdown().unwrap();
    drop(log);

    // The new entry went into a new segment, of version 3.
    assert_ne!(at.file_id, 1);
    let after = config().inspect_segment(at.file_id).unwrap();
    assert!(
        matches!(
            after.header,
            okaywal::HeaderStatus::Valid {
                format_version: 3,
                ..
            }
        ),
        "{:?}",
        after.header
    );
    let kinds = ChunkKinds::default();
    let log = config().open(kinds.clone()).unwrap();
    expected.push((id, vec![(false, plain), (true, sealed)]));
    assert_eq!(*kinds.0.lock(), expected, "both versions' entries");
    log.shutdown().unwrap();
}
