//! Logs written by the published okaywal 0.3.1 (entries it never
//! checkpointed, in several segments, some reused), opened by this crate:
//! every entry 0.3.1's own recovery recovers is replayed, checkpointed
//! and never replayed again, and ids go on above the old log's. A `wal-`
//! file of neither format makes the open fail and stays as it was.
#![cfg(feature = "okaywal-0.3")]

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::Path;
use std::sync::{mpsc, Arc};

use okaywal::{
    Configuration, Entry, EntryId, LogManager, LogPosition, ReadChunkResult, RecoveredSegment,
    Recovery, RecoveryMode, SegmentReader, WriteAheadLog,
};
use parking_lot::Mutex;

/// An entry id and its chunks.
type Entries = Vec<(u64, Vec<Vec<u8>>)>;

/// A small deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The okaywal 0.3.1 side: writing a log, and recovering one.
mod v03 {
    use super::*;
    use okaywal03 as old;

    /// A 0.3.1 manager that lets `allow` checkpoints succeed, then holds
    /// the next one until the gate's sender is dropped and fails it, so the
    /// segments from there on are never checkpointed (0.3.1 keeps a segment
    /// whose checkpoint failed as it is).
    #[derive(Debug)]
    struct Holding {
        allow: usize,
        gate: std::sync::Mutex<mpsc::Receiver<()>>,
    }

    impl old::LogManager for Holding {
        fn recover(&mut self, _entry: &mut old::Entry<'_>) -> io::Result<()> {
            Ok(())
        }

        fn checkpoint_to(
            &mut self,
            _last_checkpointed_id: old::EntryId,
            _entries: &mut old::SegmentReader,
            _wal: &old::WriteAheadLog,
        ) -> io::Result<()> {
            if self.allow > 0 {
                self.allow -= 1;
                return Ok(());
            }
            let _ = self.gate.lock().unwrap().recv();
            Err(io::Error::other(
                "this test never lets 0.3.1 checkpoint this segment",
            ))
        }
    }

    /// What a test asks 0.3.1 to write.
    pub struct Plan {
        pub entries: usize,
        pub seed: u64,
        /// Checkpoints 0.3.1 may finish (its files are then reused).
        pub allow_checkpoints: usize,
        /// Every this many entries, one is rolled back after writing a
        /// chunk larger than 0.3.1's write buffer (so it reaches the file).
        pub rollback_every: usize,
        /// End with such a rolled-back entry.
        pub final_rollback: bool,
        pub version_info: Vec<u8>,
    }

    /// What 0.3.1 wrote.
    #[derive(Debug, Default)]
    pub struct Written {
        /// Committed entries, in id order.
        pub entries: Entries,
        /// Each committed entry's chunks: (segment id, offset, length).
        pub chunks: BTreeMap<u64, Vec<(u64, u64, usize)>>,
        pub rolled_back: Vec<u64>,
    }

    fn position(record: &old::ChunkRecord) -> (u64, u64) {
        let mut bytes = Vec::new();
        record.position.serialize_to(&mut bytes).unwrap();
        (
            u64::from_le_bytes(bytes[..8].try_into().unwrap()),
            u64::from_le_bytes(bytes[8..].try_into().unwrap()),
        )
    }

    /// Writes a log with okaywal 0.3.1 and stops it without letting it
    /// checkpoint more than `plan.allow_checkpoints` segments.
    pub fn write(dir: &Path, plan: &Plan) -> Written {
        let (release, gate) = mpsc::channel();
        let mut config = old::Configuration::default_for(dir)
            .preallocate_bytes(16 * 1024)
            .checkpoint_after_bytes(4 * 1024);
        config.version_info = Arc::new(plan.version_info.clone());
        let log = config
            .open(Holding {
                allow: plan.allow_checkpoints,
                gate: std::sync::Mutex::new(gate),
            })
            .unwrap();
        let mut rng = Rng(plan.seed);
        let mut written = Written::default();
        for i in 0..plan.entries {
            if plan.rollback_every > 0 && i % plan.rollback_every == plan.rollback_every / 2 {
                let mut entry = log.begin_entry().unwrap();
                entry.write_chunk(&[0xEE; 20_000]).unwrap();
                written.rolled_back.push(entry.id().0);
                entry.rollback().unwrap();
            }
            let mut entry = log.begin_entry().unwrap();
            let id = entry.id().0;
            let mut chunks = Vec::new();
            let mut places = Vec::new();
            for c in 0..rng.below(3) + 1 {
                let len = match rng.below(10) {
                    0 => 0,
                    1 => 17_000 + rng.below(3000) as usize,
                    _ => rng.below(1500) as usize,
                };
                let data: Vec<u8> = (0..len)
                    .map(|b| (b as u64 * 7 + id * 13 + c) as u8)
                    .collect();
                let record = entry.write_chunk(&data).unwrap();
                let (segment, offset) = position(&record);
                places.push((segment, offset, len));
                chunks.push(data);
            }
            assert_eq!(entry.commit().unwrap().0, id);
            written.entries.push((id, chunks));
            written.chunks.insert(id, places);
        }
        if plan.final_rollback {
            let mut entry = log.begin_entry().unwrap();
            entry.write_chunk(&[0xDD; 20_000]).unwrap();
            written.rolled_back.push(entry.id().0);
            entry.rollback().unwrap();
        }
        // Let the held checkpoint fail, and wait for 0.3.1's checkpoint
        // thread to end: nothing in the directory changes after this.
        drop(release);
        let _ = log.shutdown();
        written
    }

    #[derive(Debug, Default, Clone)]
    struct Collect(Arc<Mutex<Entries>>);

    impl old::LogManager for Collect {
        fn recover(&mut self, entry: &mut old::Entry<'_>) -> io::Result<()> {
            // What a 0.3 manager can use: the entries read back whole. An
            // unfinished entry gives `None`, a torn or damaged one an error;
            // neither is recovered.
            if let Ok(Some(chunks)) = entry.read_all_chunks() {
                self.0.lock().push((entry.id().0, chunks));
            }
            Ok(())
        }

        fn checkpoint_to(
            &mut self,
            _last_checkpointed_id: old::EntryId,
            _entries: &mut old::SegmentReader,
            _wal: &old::WriteAheadLog,
        ) -> io::Result<()> {
            Ok(())
        }
    }

    /// The entries okaywal 0.3.1's own recovery recovers from `dir` (which
    /// it changes: pass a copy).
    pub fn recover(dir: &Path) -> Entries {
        let collect = Collect::default();
        let log = old::WriteAheadLog::recover(dir, collect.clone()).unwrap();
        log.shutdown().unwrap();
        let entries = collect.0.lock().clone();
        entries
    }
}

/// What this crate's manager saw.
#[derive(Debug, Default)]
struct Seen {
    segments: Vec<RecoveredSegment>,
    recovered: Entries,
    /// (last checkpointed id, entries) per checkpoint.
    checkpoints: Vec<(u64, Entries)>,
    /// Chunks read again through `read_at` during a checkpoint: whether
    /// each read gave the same bytes.
    read_at_matches: Vec<bool>,
}

/// This crate's manager: records everything, and can abandon a segment,
/// fail checkpoints, or read chunks back by position while checkpointing.
#[derive(Debug, Default, Clone)]
struct Collect {
    seen: Arc<Mutex<Seen>>,
    abandon: Option<u64>,
    failing_checkpoints: Arc<Mutex<usize>>,
    read_back_below: Option<u64>,
}

impl Collect {
    fn recovered_ids(&self) -> Vec<u64> {
        self.seen.lock().recovered.iter().map(|e| e.0).collect()
    }

    fn checkpointed(&self) -> Entries {
        let seen = self.seen.lock();
        seen.checkpoints
            .iter()
            .flat_map(|(_, entries)| entries.clone())
            .collect()
    }
}

fn read_chunks(entry: &mut Entry<'_>) -> io::Result<(Vec<Vec<u8>>, Vec<LogPosition>)> {
    let mut chunks = Vec::new();
    let mut positions = Vec::new();
    loop {
        match entry.read_chunk()? {
            ReadChunkResult::Chunk(mut chunk) => {
                positions.push(chunk.position());
                chunks.push(chunk.read_all()?);
            }
            ReadChunkResult::EndOfEntry => return Ok((chunks, positions)),
            ReadChunkResult::AbortedEntry => panic!("entry {} aborted", entry.id()),
        }
    }
}

impl LogManager for Collect {
    fn should_recover_segment(&mut self, segment: &RecoveredSegment) -> io::Result<Recovery> {
        self.seen.lock().segments.push(segment.clone());
        Ok(if self.abandon == Some(segment.id) {
            Recovery::Abandon
        } else {
            Recovery::Recover
        })
    }

    fn recover(&mut self, entry: &mut Entry<'_>) -> io::Result<()> {
        let (chunks, _) = read_chunks(entry)?;
        self.seen.lock().recovered.push((entry.id().0, chunks));
        Ok(())
    }

    fn checkpoint_to(
        &mut self,
        last_checkpointed_id: EntryId,
        entries: &mut SegmentReader,
        wal: &WriteAheadLog,
    ) -> io::Result<()> {
        {
            let mut failing = self.failing_checkpoints.lock();
            if *failing > 0 {
                *failing -= 1;
                return Err(io::Error::other("the store is not writable right now"));
            }
        }
        let mut done = Vec::new();
        while let Some(mut entry) = entries.read_entry()? {
            let (chunks, positions) = read_chunks(&mut entry)?;
            if self
                .read_back_below
                .is_some_and(|below| entry.id().0 < below)
            {
                for (position, data) in positions.iter().zip(&chunks) {
                    let again = wal.read_at(*position)?.read_all()?;
                    self.seen.lock().read_at_matches.push(&again == data);
                }
            }
            done.push((entry.id().0, chunks));
        }
        self.seen
            .lock()
            .checkpoints
            .push((last_checkpointed_id.0, done));
        Ok(())
    }
}

fn config(dir: &Path) -> Configuration {
    Configuration::default_for(dir)
        .preallocate_bytes(64 * 1024)
        .checkpoint_after_bytes(32 * 1024)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// Every file in `dir` with its contents.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_file())
        .map(|e| {
            (
                e.file_name().into_string().unwrap(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

/// Fails naming the files that differ (not printing their bytes).
fn assert_same_files(after: &BTreeMap<String, Vec<u8>>, before: &BTreeMap<String, Vec<u8>>) {
    let names: BTreeSet<&String> = after.keys().chain(before.keys()).collect();
    let changed: Vec<&String> = names
        .into_iter()
        .filter(|name| after.get(*name) != before.get(*name))
        .collect();
    assert!(changed.is_empty(), "files changed: {changed:?}");
}

fn without_lock(mut files: BTreeMap<String, Vec<u8>>) -> BTreeMap<String, Vec<u8>> {
    files.remove("okaywal.lock");
    files
}

/// No file left that 0.3 wrote, except at most one recycled file (which
/// keeps the old log's highest id).
fn assert_converted(dir: &Path) {
    let mut leftovers = Vec::new();
    for (name, bytes) in snapshot(dir) {
        assert!(!name.ends_with("-cp"), "{name} is still there");
        if bytes.starts_with(b"okw\0") {
            assert!(
                name.starts_with("wal-recycled-"),
                "{name} still has a 0.3 header"
            );
            leftovers.push(name);
        }
    }
    assert!(leftovers.len() <= 1, "{leftovers:?}");
}

/// Opens the 0.3 log in `dir` with this crate, checks what the manager
/// got against `expected`, commits more entries (with a checkpoint between
/// them), shuts down, reopens, and checks that nothing was lost or
/// replayed twice and that ids keep rising above `old_max_id`.
fn open_continue_and_reopen(dir: &Path, expected: &Entries, old_max_id: u64) {
    let first = Collect::default();
    let log = config(dir).open(first.clone()).unwrap();
    assert_eq!(
        first.seen.lock().recovered,
        *expected,
        "replayed entries differ from what okaywal 0.3.1 recovers"
    );
    // Checkpointed before the open returned, in id order, and the files
    // recycled.
    assert_eq!(first.checkpointed(), *expected);
    let lasts: Vec<u64> = first.seen.lock().checkpoints.iter().map(|c| c.0).collect();
    assert!(lasts.windows(2).all(|w| w[0] < w[1]), "{lasts:?}");
    assert_converted(dir);

    let mut new_entries = Vec::new();
    for round in 0..2 {
        for i in 0..40_u64 {
            let mut entry = log.begin_entry().unwrap();
            let id = entry.id().0;
            let data = vec![(i + round) as u8; 300 + i as usize * 50];
            entry.write_chunk(&data).unwrap();
            entry.commit().unwrap();
            new_entries.push((id, vec![data]));
        }
        if round == 0 {
            log.checkpoint_active().unwrap();
        }
    }
    let new_ids: Vec<u64> = new_entries.iter().map(|e| e.0).collect();
    assert!(
        new_ids[0] > old_max_id,
        "new id {} is not above the old log's {old_max_id}",
        new_ids[0]
    );
    assert!(new_ids.windows(2).all(|w| w[0] < w[1]));
    log.shutdown().unwrap();
    drop(log);
    assert_converted(dir);

    let second = Collect::default();
    let log = config(dir).open(second.clone()).unwrap();
    let replayed = second.seen.lock().recovered.clone();
    let old_ids: BTreeSet<u64> = expected.iter().map(|e| e.0).collect();
    assert!(
        replayed.iter().all(|(id, _)| !old_ids.contains(id)),
        "0.3 entries replayed again"
    );
    // Every entry reached the manager exactly once: checkpointed in the
    // first run, or replayed now.
    let mut all = first.checkpointed();
    all.extend(replayed);
    all.sort();
    let mut want = expected.clone();
    want.extend(new_entries);
    want.sort();
    assert_eq!(all.len(), want.len(), "entries lost or duplicated");
    assert_eq!(all, want);
    let mut entry = log.begin_entry().unwrap();
    assert!(entry.id().0 > *new_ids.last().unwrap());
    entry.write_chunk(b"after the reopen").unwrap();
    entry.commit().unwrap();
    log.shutdown().unwrap();
}

#[test]
fn entries_okaywal_0_3_never_checkpointed_are_replayed_checkpointed_and_not_replayed_again() {
    let tmp = tempfile::tempdir().unwrap();
    let original = tmp.path().join("written-by-0.3.1");
    let written = v03::write(
        &original,
        &v03::Plan {
            entries: 200,
            seed: 1,
            allow_checkpoints: 0,
            rollback_every: 25,
            final_rollback: true,
            version_info: b"app format 2".to_vec(),
        },
    );
    let segments = snapshot(&original)
        .keys()
        .filter(|name| name.starts_with("wal-"))
        .count();
    assert!(segments > 5, "0.3.1 wrote only {segments} segments");

    let reference = tmp.path().join("recovered-by-0.3.1");
    copy_dir(&original, &reference);
    let expected = v03::recover(&reference);
    assert_eq!(expected, written.entries, "0.3.1 recovers every commit");

    let ours = tmp.path().join("opened-by-this-crate");
    copy_dir(&original, &ours);
    let rolled_back = *written.rolled_back.last().unwrap();
    open_continue_and_reopen(&ours, &expected, rolled_back);

    // The manager saw every 0.3 segment with its version info.
    let watcher = Collect::default();
    let dir = tmp.path().join("segments");
    copy_dir(&original, &dir);
    let log = config(&dir).open(watcher.clone()).unwrap();
    let seen = watcher.seen.lock();
    assert_eq!(seen.segments.len(), segments);
    assert!(seen
        .segments
        .iter()
        .all(|s| s.version_info == b"app format 2"));
    drop(seen);
    log.shutdown().unwrap();
}

#[test]
fn a_torn_tail_loses_only_the_entry_0_3_loses_too() {
    let tmp = tempfile::tempdir().unwrap();
    let original = tmp.path().join("written-by-0.3.1");
    let written = v03::write(
        &original,
        &v03::Plan {
            entries: 120,
            seed: 2,
            allow_checkpoints: 0,
            rollback_every: 0,
            final_rollback: false,
            version_info: Vec::new(),
        },
    );
    let (last_id, _) = written.entries.last().unwrap();
    let places = &written.chunks[last_id];
    let (segment, offset, len) = *places.last().unwrap();

    // Cut inside the last entry's last chunk, then, in another copy,
    // inside its chunk header, and right after its entry header.
    let cuts = [
        offset + 5 + len as u64 / 2,
        offset + 3,
        places[0].1 - 9 + 4,
        places[0].1,
    ];
    for (i, cut) in cuts.into_iter().enumerate() {
        let torn = tmp.path().join(format!("torn-{i}"));
        copy_dir(&original, &torn);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(torn.join(format!("wal-{segment}")))
            .unwrap();
        file.set_len(cut).unwrap();
        drop(file);

        let reference = tmp.path().join(format!("reference-{i}"));
        copy_dir(&torn, &reference);
        let expected = v03::recover(&reference);
        assert_eq!(
            expected[..],
            written.entries[..written.entries.len() - 1],
            "cut at {cut}: 0.3.1 recovers all but the torn entry"
        );
        open_continue_and_reopen(&torn, &expected, *last_id - 1);
    }
}

#[test]
fn a_garbled_last_entry_and_rolled_back_entries_are_left_out_as_0_3_leaves_them_out() {
    let tmp = tempfile::tempdir().unwrap();
    let original = tmp.path().join("written-by-0.3.1");
    let written = v03::write(
        &original,
        &v03::Plan {
            entries: 80,
            seed: 3,
            allow_checkpoints: 0,
            rollback_every: 10,
            final_rollback: true,
            version_info: Vec::new(),
        },
    );
    let (last_id, _) = written.entries.last().unwrap();
    let (segment, offset, len) = *written.chunks[last_id].last().unwrap();
    let path = original.join(format!("wal-{segment}"));
    let mut bytes = std::fs::read(&path).unwrap();
    let end_of_entry = (offset + 9 + len as u64) as usize;
    assert_eq!(bytes[end_of_entry], 3, "the last entry's end marker");

    // Garbage over the last entry's data (its CRC fails), and, in another
    // copy, over its end marker.
    let mut garbled_data = bytes.clone();
    for byte in &mut garbled_data[offset as usize + 5..end_of_entry - 4] {
        *byte = !*byte;
    }
    if len == 0 {
        garbled_data[end_of_entry - 1] ^= 0x55;
    }
    bytes[end_of_entry] = 0x7F;
    // After garbled data the walk goes on to the final rolled-back entry
    // (its header is in the file): ids go on above it. A garbled end
    // marker ends the walk there, as it ends 0.3.1's.
    let rolled_back = *written.rolled_back.last().unwrap();
    for (name, contents, old_max_id) in [
        ("garbled-data", garbled_data, rolled_back),
        ("garbled-end", bytes, *last_id),
    ] {
        let dir = tmp.path().join(name);
        copy_dir(&original, &dir);
        std::fs::write(dir.join(format!("wal-{segment}")), &contents).unwrap();
        let reference = tmp.path().join(format!("{name}-reference"));
        copy_dir(&dir, &reference);
        let expected = v03::recover(&reference);
        assert_eq!(
            expected[..],
            written.entries[..written.entries.len() - 1],
            "{name}"
        );
        open_continue_and_reopen(&dir, &expected, old_max_id);
    }
}

#[test]
fn segments_0_3_checkpointed_and_reused_hold_nothing_to_replay_but_their_ids_count() {
    let tmp = tempfile::tempdir().unwrap();
    // 0.3.1 checkpoints a dozen segments and reuses their files (stale
    // entries of their earlier use follow the new ones), then checkpoints
    // nothing more; or it checkpoints every segment but the active one,
    // leaving `wal-{id}-cp` files.
    for (case, allow_checkpoints) in [(0, 12), (1, usize::MAX)] {
        let original = tmp.path().join(format!("written-by-0.3.1-{case}"));
        let written = v03::write(
            &original,
            &v03::Plan {
                entries: 150,
                seed: 4,
                allow_checkpoints,
                rollback_every: 30,
                final_rollback: false,
                version_info: b"v".to_vec(),
            },
        );
        let names: Vec<String> = snapshot(&original).into_keys().collect();
        // The first file was checkpointed, and reused under a new name
        // (or, if 0.3.1's checkpoint thread lagged, is still `wal-1-cp`).
        assert!(!names.contains(&"wal-1".to_string()), "{names:?}");
        if case == 1 {
            // The segment checkpointed last is never reused.
            assert!(names.iter().any(|n| n.ends_with("-cp")), "{names:?}");
        }
        let reference = tmp.path().join(format!("reference-{case}"));
        copy_dir(&original, &reference);
        let expected = v03::recover(&reference);
        // 0.3.1 recovers only what it had not checkpointed: a suffix.
        assert!(!expected.is_empty() && expected.len() < written.entries.len());
        assert_eq!(
            expected[..],
            written.entries[written.entries.len() - expected.len()..]
        );
        let ours = tmp.path().join(format!("ours-{case}"));
        copy_dir(&original, &ours);
        open_continue_and_reopen(&ours, &expected, written.entries.last().unwrap().0);
    }
}

#[test]
fn a_damaged_entry_before_committed_ones_fails_the_open_unless_a_recovery_mode_says_what_to_drop() {
    let tmp = tempfile::tempdir().unwrap();
    let original = tmp.path().join("written-by-0.3.1");
    let written = v03::write(
        &original,
        &v03::Plan {
            entries: 60,
            seed: 5,
            allow_checkpoints: 0,
            rollback_every: 0,
            final_rollback: false,
            version_info: Vec::new(),
        },
    );
    // An entry in the middle with a chunk of data, followed by another
    // entry in the same segment.
    let (victim, segment, offset) = written
        .entries
        .windows(2)
        .find_map(|pair| {
            let (id, chunks) = &pair[0];
            let (segment, offset, len) = written.chunks[id][0];
            let next_segment = written.chunks[&pair[1].0][0].0;
            (chunks[0].len() > 10 && len > 10 && next_segment == segment)
                .then_some((*id, segment, offset))
        })
        .expect("an entry followed by another in its segment");
    let damaged = tmp.path().join("damaged");
    copy_dir(&original, &damaged);
    let path = damaged.join(format!("wal-{segment}"));
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[offset as usize + 5 + 3] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let before = without_lock(snapshot(&damaged));

    let err = config(&damaged).open(Collect::default()).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    let message = err.to_string();
    assert!(message.contains(&format!("wal-{segment}")), "{message}");
    assert!(message.contains("okaywal 0.3 format"), "{message}");
    assert!(message.contains("RecoveryMode::PointInTime"), "{message}");
    assert_same_files(&without_lock(snapshot(&damaged)), &before);

    // 0.3.1 (with a manager that skips what it cannot read) recovers
    // everything but the damaged entry: so does SkipCorrupted.
    let reference = tmp.path().join("reference");
    copy_dir(&damaged, &reference);
    let expected = v03::recover(&reference);
    let without: Entries = written
        .entries
        .iter()
        .filter(|e| e.0 != victim)
        .cloned()
        .collect();
    assert_eq!(expected, without);
    let skip = tmp.path().join("skip");
    copy_dir(&damaged, &skip);
    let collect = Collect::default();
    let log = config(&skip)
        .recovery_mode(RecoveryMode::SkipCorrupted)
        .open(collect.clone())
        .unwrap();
    assert_eq!(collect.seen.lock().recovered, expected);
    log.shutdown().unwrap();

    // PointInTime keeps only what precedes the damaged entry.
    let point = tmp.path().join("point");
    copy_dir(&damaged, &point);
    let collect = Collect::default();
    let log = config(&point)
        .recovery_mode(RecoveryMode::PointInTime)
        .open(collect.clone())
        .unwrap();
    let before_victim: Vec<u64> = written
        .entries
        .iter()
        .map(|e| e.0)
        .filter(|&id| id < victim)
        .collect();
    assert_eq!(collect.recovered_ids(), before_victim);
    assert!(log.next_entry_id().0 > written.entries.last().unwrap().0);
    log.shutdown().unwrap();
}

#[test]
fn a_failed_checkpoint_of_a_0_3_segment_fails_the_open_and_keeps_the_segment_for_the_next() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    let written = v03::write(
        &dir,
        &v03::Plan {
            entries: 40,
            seed: 6,
            allow_checkpoints: 0,
            rollback_every: 0,
            final_rollback: false,
            version_info: Vec::new(),
        },
    );
    let segments_before: BTreeMap<String, Vec<u8>> = snapshot(&dir)
        .into_iter()
        .filter(|(name, _)| name.starts_with("wal-"))
        .collect();
    let failing = Collect {
        failing_checkpoints: Arc::new(Mutex::new(1)),
        ..Collect::default()
    };
    let err = config(&dir).open(failing.clone()).unwrap_err();
    let message = err.to_string();
    assert!(message.contains("not writable right now"), "{message}");
    assert!(message.contains("okaywal 0.3 format"), "{message}");
    // The first segment was not checkpointed: it and every later one are
    // still there, unchanged.
    let after = snapshot(&dir);
    for (name, bytes) in &segments_before {
        assert!(after.get(name) == Some(bytes), "{name} changed");
    }
    let collect = Collect::default();
    let log = config(&dir).open(collect.clone()).unwrap();
    assert_eq!(collect.seen.lock().recovered, written.entries);
    assert_eq!(collect.checkpointed(), written.entries);
    log.shutdown().unwrap();
    assert_converted(&dir);
}

#[test]
fn chunks_of_0_3_segments_can_be_read_by_position_while_they_are_checkpointed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    let written = v03::write(
        &dir,
        &v03::Plan {
            entries: 50,
            seed: 7,
            allow_checkpoints: 0,
            rollback_every: 0,
            final_rollback: false,
            version_info: Vec::new(),
        },
    );
    let collect = Collect {
        read_back_below: Some(u64::MAX),
        ..Collect::default()
    };
    let log = config(&dir).open(collect.clone()).unwrap();
    let matches = collect.seen.lock().read_at_matches.clone();
    let chunks: usize = written.entries.iter().map(|e| e.1.len()).sum();
    assert_eq!(matches.len(), chunks);
    assert!(matches.iter().all(|&m| m));
    // Once the open returned, the 0.3 segments are gone, as 0.3 positions
    // are after their checkpoint.
    let (id, _) = written.entries[0];
    let (segment, offset, _) = written.chunks[&id][0];
    let err = log
        .read_at(LogPosition {
            file_id: segment,
            offset,
        })
        .unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
    log.shutdown().unwrap();
}

#[test]
fn an_abandoned_0_3_segment_is_neither_replayed_nor_checkpointed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    let written = v03::write(
        &dir,
        &v03::Plan {
            entries: 50,
            seed: 8,
            allow_checkpoints: 0,
            rollback_every: 0,
            final_rollback: false,
            version_info: Vec::new(),
        },
    );
    let first_segment = written.chunks[&written.entries[0].0][0].0;
    let collect = Collect {
        abandon: Some(first_segment),
        ..Collect::default()
    };
    let log = config(&dir).open(collect.clone()).unwrap();
    let kept: Entries = written
        .entries
        .iter()
        .filter(|e| written.chunks[&e.0][0].0 != first_segment)
        .cloned()
        .collect();
    assert!(kept.len() < written.entries.len());
    assert_eq!(collect.seen.lock().recovered, kept);
    assert_eq!(collect.checkpointed(), kept);
    assert!(log.next_entry_id().0 > written.entries.last().unwrap().0);
    log.shutdown().unwrap();
    drop(log);
    assert_converted(&dir);
    let again = Collect::default();
    let log = config(&dir).open(again.clone()).unwrap();
    assert!(again.seen.lock().recovered.is_empty());
    log.shutdown().unwrap();
}

/// Commits a few entries with this crate and checkpoints some of them.
fn a_log_of_ours(dir: &Path) {
    let log = config(dir).open(Collect::default()).unwrap();
    for i in 0..30_u8 {
        let mut entry = log.begin_entry().unwrap();
        entry.write_chunk(&[i; 2000]).unwrap();
        entry.commit().unwrap();
        if i == 20 {
            log.checkpoint_active().unwrap();
        }
    }
    log.shutdown().unwrap();
}

#[test]
fn a_wal_file_with_a_foreign_header_is_refused_and_left_as_it_was() {
    let mut rng = Rng(99);
    let mut random = vec![0_u8; 70_000];
    for byte in &mut random {
        *byte = rng.next() as u8;
    }
    let mut sqlite = b"SQLite format 3\0".to_vec();
    sqlite.resize(8192, 0x11);
    let newer_okaywal = b"okw\x01\x00 a later 0.x format".to_vec();
    let tmp = tempfile::tempdir().unwrap();
    for (i, (name, contents)) in [
        ("wal-5", &random),
        ("wal-5", &sqlite),
        ("wal-5", &newer_okaywal),
        ("wal-7-cp", &random),
    ]
    .into_iter()
    .enumerate()
    {
        for existing_log in [false, true] {
            let dir = tmp.path().join(format!("case-{i}-{existing_log}"));
            std::fs::create_dir_all(&dir).unwrap();
            if existing_log {
                a_log_of_ours(&dir);
            }
            assert!(!dir.join(name).exists());
            std::fs::write(dir.join(name), contents).unwrap();
            let before = without_lock(snapshot(&dir));
            let collect = Collect::default();
            let err = config(&dir).open(collect.clone()).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
            let message = err.to_string();
            assert!(
                message.contains(&dir.join(name).display().to_string()),
                "{message}"
            );
            assert!(message.contains("not a segment of this log"), "{message}");
            assert!(message.contains("move it out"), "{message}");
            assert!(collect.seen.lock().recovered.is_empty());
            assert!(collect.seen.lock().checkpoints.is_empty());
            // Nothing in the directory changed (the lock file aside).
            assert_same_files(&without_lock(snapshot(&dir)), &before);

            // Without it, the log opens and what it held is all there.
            std::fs::rename(
                dir.join(name),
                tmp.path().join(format!("moved-{i}-{existing_log}")),
            )
            .unwrap();
            let collect = Collect::default();
            let log = config(&dir).open(collect.clone()).unwrap();
            log.shutdown().unwrap();
            if existing_log {
                assert!(!collect.seen.lock().recovered.is_empty());
            }
        }
    }
}

#[test]
fn wal_files_of_this_format_that_never_got_a_header_are_still_reused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    std::fs::create_dir_all(&dir).unwrap();
    a_log_of_ours(&dir);
    // A file renamed into place whose header never became durable: zeros,
    // or a header of this format naming another segment.
    std::fs::write(dir.join("wal-1000"), vec![0; 64 * 1024]).unwrap();
    let other = snapshot(&dir)
        .into_iter()
        .find(|(name, bytes)| name.starts_with("wal-recycled-") && bytes.starts_with(b"OKAYWAL"))
        .map(|(_, bytes)| bytes);
    if let Some(bytes) = other {
        std::fs::write(dir.join("wal-1001"), bytes).unwrap();
    }
    let collect = Collect::default();
    let log = config(&dir).open(collect.clone()).unwrap();
    log.shutdown().unwrap();
}
