//! A committed entry is never dropped while a later one is kept.
//!
//! A log is built across several runs on the simulated disk, each ended by
//! a crash of the process or of the power, so that segments get their
//! successors both from segment switches and from the opens that follow a
//! crash (whose new segment records where the recovered one ended). Then
//! every byte of every segment but the last is flipped, one at a time, and
//! the log is opened in each recovery mode: an open either fails with
//! `InvalidData` or hands over entries that are exactly what was
//! committed, and never an entry committed after one it lost. The same
//! holds for an encrypted log (every fifth byte flipped: its records are
//! longer, and each open decrypts them all).

mod common;

use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::time::Duration;

use common::encryption::Encryption;
use common::follow::ChunkRecorder;
use common::Rng;
use okaywal::fs::{CrashFileSystem, FileSystem, MemoryFileSystem, OpenMode, PowerLoss};
use okaywal::{Configuration, HeaderStatus, RecoveryMode, WriteAheadLog};
use testkit::recorder::Recorder;

const DIR: &str = "/log";

type Files = Vec<(String, Vec<u8>)>;
type Entries = BTreeMap<u64, Vec<Vec<u8>>>;

/// Acknowledged entries, and their ids in the order their commits
/// returned (an entry held open commits after entries begun later), and
/// in the order of their commit records in the log (by segment, then
/// commit order: an entry held open across a switch commits in the
/// segment it began in).
#[derive(Debug, Default)]
struct Committed {
    entries: Entries,
    order: Vec<u64>,
    segments: BTreeMap<u64, u64>,
}

impl Committed {
    fn insert(&mut self, id: u64, segment: u64, chunks: Vec<Vec<u8>>) {
        self.entries.insert(id, chunks);
        self.order.push(id);
        self.segments.insert(id, segment);
    }

    fn log_order(&self) -> Vec<u64> {
        let mut order: Vec<(u64, usize, u64)> = self
            .order
            .iter()
            .enumerate()
            .map(|(i, id)| (self.segments[id], i, *id))
            .collect();
        order.sort_unstable();
        order.into_iter().map(|(_, _, id)| id).collect()
    }
}

fn config<F: FileSystem>(fs: F, encryption: Encryption) -> Configuration {
    encryption.configure(
        Configuration::default_for(DIR)
            .file_system(fs)
            .preallocate_bytes(4096)
            .checkpoint_after_bytes(1200),
    )
}

fn commit(log: &WriteAheadLog, chunks: &[Vec<u8>], committed: &mut Committed) {
    let mut entry = log.begin_entry().expect("begin");
    let mut segment = 0;
    for chunk in chunks {
        segment = entry.write_chunk(chunk).expect("write").position.file_id;
    }
    let id = entry.commit().expect("commit").0;
    committed.insert(id, segment, chunks.to_vec());
}

fn chunks(rng: &mut Rng, round: usize) -> Vec<Vec<u8>> {
    (0..rng.range(1, 3))
        .map(|_| {
            let mut bytes = format!("round {round}: ").into_bytes();
            let len = rng.range(8, 120);
            bytes.extend(rng.bytes(len));
            bytes
        })
        .collect()
}

/// Writes a log over several runs, each ended by a crash; returns the
/// files left and every acknowledged entry.
fn build(seed: u64, encryption: Encryption) -> (Files, Committed) {
    let mut rng = Rng::new(seed);
    let fs = CrashFileSystem::new();
    let mut committed = Committed::default();
    for round in 0..6 {
        let log = config(fs.clone(), encryption)
            .open(ChunkRecorder::default())
            .expect("open between crashes");
        for _ in 0..rng.range(2, 5) {
            let chunks = chunks(&mut rng, round);
            commit(&log, &chunks, &mut committed);
        }
        if round == 2 {
            // An entry held open across a segment switch: the next segment
            // starts without recording where this one ends.
            let mut held = log.begin_entry().expect("begin");
            let segment = held
                .write_chunk(b"held open across a switch")
                .expect("write")
                .position
                .file_id;
            let live = log.stats().live_segments;
            while log.stats().live_segments == live {
                let chunks = chunks(&mut rng, round);
                commit(&log, &chunks, &mut committed);
            }
            std::thread::sleep(Duration::from_millis(10));
            let id = held.commit().expect("commit").0;
            committed.insert(id, segment, vec![b"held open across a switch".to_vec()]);
            for _ in 0..2 {
                let chunks = chunks(&mut rng, round);
                commit(&log, &chunks, &mut committed);
            }
        }
        // A rolled-back entry, never recovered.
        let mut abandoned = log.begin_entry().expect("begin");
        abandoned.write_chunk(b"rolled back").expect("write");
        abandoned.rollback().expect("rollback");
        let chunks = chunks(&mut rng, round);
        commit(&log, &chunks, &mut committed);
        if round % 2 == 0 {
            // The process dies: what it wrote stays in the page cache.
            drop(log);
        } else {
            common::cut_power(&fs);
            drop(log);
            fs.power_loss(PowerLoss::Clean);
        }
    }
    let mut files = Files::new();
    for name in fs.list_files(Path::new(DIR)).expect("list") {
        let bytes = fs
            .contents(&Path::new(DIR).join(&name))
            .expect("file contents");
        files.push((name, bytes));
    }
    files.sort();
    (files, committed)
}

fn segment_id(name: &str) -> Option<u64> {
    name.strip_prefix("wal-")?.parse().ok()
}

/// Opens a copy of `files` in `mode`; the entries recovery handed over.
fn recover(files: &Files, mode: RecoveryMode, encryption: Encryption) -> io::Result<Entries> {
    let fs = MemoryFileSystem::new();
    fs.create_dir_all(Path::new(DIR))?;
    for (name, bytes) in files {
        let file = fs.open(&Path::new(DIR).join(name), OpenMode::CreateNew)?;
        file.write_all_at(bytes, 0)?;
    }
    let recorder = ChunkRecorder::default();
    let log = config(fs, encryption)
        .recovery_mode(mode)
        .open(recorder.clone())?;
    drop(log);
    let recovered = recorder.recovered.lock().unwrap().clone();
    Ok(recovered)
}

/// What an open handed over is what was committed, and a prefix of it in
/// `order`: every entry up to the first one lost, none after.
fn check_prefix(
    recovered: &Entries,
    committed: &Committed,
    order: &[u64],
    what: &str,
) -> Result<(), String> {
    let mut lost = None;
    for id in order {
        let chunks = &committed.entries[id];
        match recovered.get(id) {
            Some(got) if got == chunks => {
                if let Some(lost) = lost {
                    return Err(format!(
                        "{what}: entry {id} was recovered although entry {lost}, committed \
                         before it, was lost"
                    ));
                }
            }
            Some(_) => return Err(format!("{what}: entry {id} came back with other bytes")),
            None => {
                lost.get_or_insert(*id);
            }
        }
    }
    if let Some(extra) = recovered
        .keys()
        .find(|id| !committed.entries.contains_key(id))
    {
        return Err(format!("{what}: entry {extra} was never committed"));
    }
    Ok(())
}

fn check_exact(recovered: &Entries, committed: &Committed, what: &str) -> Result<(), String> {
    for (id, chunks) in recovered {
        if committed.entries.get(id) != Some(chunks) {
            return Err(format!(
                "{what}: entry {id} was not committed with these bytes"
            ));
        }
    }
    Ok(())
}

/// The end of a segment's written bytes: its records, then zeros.
fn written_len(bytes: &[u8]) -> usize {
    bytes
        .iter()
        .rposition(|b| *b != 0)
        .map_or(0, |last| last + 1)
}

/// A checkpoint switches to a new, empty segment; the process ends before
/// anything is written into it, with the segment before it still live.
/// The next open replaces the empty segment under the same name; the new
/// header must still record where the earlier segment ended, so that a
/// flipped byte there is damage (an error), not a torn tail that drops
/// its entries while later ones are kept.
#[test]
fn an_empty_last_segment_replaced_at_open_keeps_the_earlier_segments_end_recorded() {
    for encryption in Encryption::BOTH {
        let fs = MemoryFileSystem::new();
        let path = |id: u64| Path::new(DIR).join(format!("wal-{id}"));
        // Checkpoints are refused: the first segment stays live.
        let log = config(fs.clone(), encryption)
            .open(Recorder::refusing())
            .expect("open");
        let mut committed = Committed::default();
        for n in 0..3_u8 {
            commit(&log, &[vec![n; 100]], &mut committed);
        }
        // The checkpoint is refused, but the switch is made: segment 4 is
        // the new, empty active segment.
        let _ = log.checkpoint_active();
        let empty = 4;
        drop(log);
        assert!(
            fs.open(&path(empty), OpenMode::Read).is_ok(),
            "{encryption:?}: no empty segment {empty}"
        );
        let first_end = config(fs.clone(), encryption)
            .inspect_segment(1)
            .expect("inspect")
            .end
            .expect("records")
            .offset;

        let log = config(fs.clone(), encryption)
            .open(Recorder::refusing())
            .expect("reopen");
        commit(&log, &[b"after the reopen".to_vec()], &mut committed);
        drop(log);
        let header = config(fs.clone(), encryption)
            .inspect_segment(empty)
            .expect("inspect")
            .header;
        assert!(
            matches!(header, HeaderStatus::Valid { previous: Some((1, end)), .. } if end == first_end),
            "{encryption:?}: segment {empty} must record where segment 1 ended ({first_end}): {header:?}"
        );

        // A flipped byte in the second entry's data is damage.
        let file = fs.open(&path(1), OpenMode::ReadWrite).expect("wal-1");
        let mut bytes = vec![0; usize::try_from(file.len().unwrap()).unwrap()];
        file.read_exact_at(&mut bytes, 0).unwrap();
        let at = bytes
            .windows(100)
            .position(|w| w == [1_u8; 100])
            .map_or(first_end as usize / 2, |p| p + 50);
        file.write_all_at(&[bytes[at] ^ 0xff], at as u64).unwrap();
        drop(file);
        let err = config(fs.clone(), encryption)
            .open(Recorder::refusing())
            .err()
            .unwrap_or_else(|| panic!("{encryption:?}: damage before later commits opened"));
        assert_eq!(
            err.kind(),
            io::ErrorKind::InvalidData,
            "{encryption:?}: {err}"
        );
    }
}

#[test]
fn one_flipped_byte_in_an_earlier_segment_never_drops_a_commit_while_keeping_a_later_one() {
    let seed = common::test_seed("damage_before_later_commits");
    for encryption in Encryption::BOTH {
        flip_every_byte(seed, encryption);
    }
}

fn flip_every_byte(seed: u64, encryption: Encryption) {
    let (files, committed) = build(seed, encryption);
    let recover = |files: &Files, mode| recover(files, mode, encryption);
    assert_eq!(
        recover(&files, RecoveryMode::ErrorOnCorruption).expect("the undamaged log opens"),
        committed.entries,
        "the undamaged log recovers exactly what was acknowledged"
    );
    let segments: Vec<(usize, u64)> = files
        .iter()
        .enumerate()
        .filter_map(|(i, (name, _))| segment_id(name).map(|id| (i, id)))
        .collect();
    assert!(
        segments.len() >= 5,
        "several segments, got {:?}",
        files.iter().map(|(name, _)| name).collect::<Vec<_>>()
    );
    let last = segments.iter().map(|(_, id)| *id).max().expect("segments");
    let log_order = committed.log_order();
    let (mut refused, mut whole, mut flips) = (0, 0, 0);
    for &(index, id) in &segments {
        if id == last {
            continue;
        }
        let original = &files[index].1;
        let step = if encryption.on() { 5 } else { 1 };
        for offset in (0..written_len(original)).step_by(step) {
            let mut damaged = files.clone();
            damaged[index].1[offset] ^= 0xff;
            flips += 1;
            let what = format!("seed {seed}, {encryption:?}: byte {offset} of wal-{id} flipped");
            match recover(&damaged, RecoveryMode::ErrorOnCorruption) {
                Ok(recovered) => {
                    check_prefix(&recovered, &committed, &committed.order, &what).unwrap();
                    whole += usize::from(recovered == committed.entries);
                }
                Err(err) => {
                    assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{what}: {err}");
                    assert!(
                        err.to_string().contains(&format!("wal-{id}")),
                        "{what}: the error names the damaged file: {err}"
                    );
                    refused += 1;
                }
            }
            // Point-in-time recovery keeps what precedes the damage in the
            // log, where an entry held open across a switch commits in its
            // first segment.
            match recover(&damaged, RecoveryMode::PointInTime) {
                Ok(recovered) => check_prefix(&recovered, &committed, &log_order, &what).unwrap(),
                Err(err) => assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{what}: {err}"),
            }
            match recover(&damaged, RecoveryMode::SkipCorrupted) {
                Ok(recovered) => check_exact(&recovered, &committed, &what).unwrap(),
                Err(err) => assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{what}: {err}"),
            }
        }
    }
    println!("{encryption:?}: {flips} flips: {refused} refused, {whole} recovered everything");
    // A flip in a record of a committed entry loses that entry, so most
    // flips must be refused; only bytes no entry depends on (a rolled-back
    // entry's, a stale tail's) may leave everything in place.
    assert!(refused * 2 > flips, "{refused} of {flips} flips refused");
}
