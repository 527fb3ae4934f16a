//! How large segments get: `checkpoint_after_bytes` for ordinary entries;
//! for entries so large that a segment holds only a few of them, later
//! segments are sized up to hold about 128 (at most 8 ×
//! `checkpoint_after_bytes`), and an idle log goes back to the configured
//! size. Observed through the public API: the ids each `checkpoint_to`
//! hands over (one call per segment), the files in the directory, and what
//! a reopen replays.

use std::collections::BTreeSet;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use okaywal::{Configuration, Entry, EntryId, LogManager, SegmentReader, WriteAheadLog};
use parking_lot::Mutex;

/// The configured segment size of these tests.
const SEGMENT: u64 = 1 << 20;
/// The most a segment is sized up to.
const GROWN_LIMIT: u64 = 8 * SEGMENT;

fn config(dir: &Path) -> Configuration {
    Configuration::default_for(dir)
        .preallocate_bytes(SEGMENT)
        .checkpoint_after_bytes(SEGMENT)
}

/// Records the `last_checkpointed_id` of every checkpoint (one per
/// segment) and the ids replayed at open.
#[derive(Debug, Clone, Default)]
struct Ledger {
    checkpoints: Arc<Mutex<Vec<u64>>>,
    recovered: Arc<Mutex<Vec<(u64, usize)>>>,
}

impl Ledger {
    /// How many entries each checkpointed segment held, in order, counting
    /// from entry `first`.
    fn entries_per_segment(&self, first: u64) -> Vec<u64> {
        let mut before = first - 1;
        self.checkpoints
            .lock()
            .iter()
            .map(|&last| {
                let held = last - before;
                before = last;
                held
            })
            .collect()
    }
}

impl LogManager for Ledger {
    fn recover(&mut self, entry: &mut Entry<'_>) -> io::Result<()> {
        self.recovered
            .lock()
            .push((entry.id().0, entry.chunk_count()));
        Ok(())
    }

    fn checkpoint_to(
        &mut self,
        last_checkpointed_id: EntryId,
        _checkpointed_entries: &mut SegmentReader,
        _wal: &WriteAheadLog,
    ) -> io::Result<()> {
        self.checkpoints.lock().push(last_checkpointed_id.0);
        Ok(())
    }
}

/// Commits `count` entries of one chunk of `size` bytes; returns their ids.
fn write_entries(log: &WriteAheadLog, count: usize, size: usize) -> Vec<u64> {
    (0..count)
        .map(|i| {
            let mut entry = log.begin_entry().unwrap();
            entry.write_chunk(&vec![i as u8; size]).unwrap();
            entry.commit().unwrap().0
        })
        .collect()
}

/// The lengths of the log's segment files (live, spare and recycled).
fn segment_file_lengths(dir: &Path) -> Vec<(String, u64)> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|file| {
            let file = file.unwrap();
            let name = file.file_name().to_string_lossy().into_owned();
            if !name.starts_with("wal-") {
                return None;
            }
            // The background thread renames and deletes files meanwhile.
            let len = std::fs::metadata(file.path()).ok()?.len();
            Some((name, len))
        })
        .collect()
}

/// The length of the log's largest segment file.
fn largest_segment_file(dir: &Path) -> u64 {
    segment_file_lengths(dir)
        .into_iter()
        .map(|(_, len)| len)
        .max()
        .unwrap()
}

/// Waits (up to 20 s) until the log has spare files (`wal-spare-*`,
/// `wal-recycled-*`; with `any_spare`, at least one) and none is larger
/// than the configured segment.
fn wait_for_spares_cut_back(dir: &Path, any_spare: bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let spares: Vec<(String, u64)> = segment_file_lengths(dir)
            .into_iter()
            .filter(|(name, _)| name.starts_with("wal-spare-") || name.starts_with("wal-recycled-"))
            .collect();
        if (!any_spare || !spares.is_empty()) && spares.iter().all(|(_, len)| *len <= SEGMENT) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "spares kept a burst's size: {spares:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Entries of 64 KiB fill a 1 MiB segment in 16 commits. After two such
/// segments the log sizes its segments up to the limit (8 MiB, about 127 of
/// these entries), its files stay within that limit, and a reopen replays
/// every entry that was not checkpointed.
#[test]
fn a_log_of_large_entries_sizes_its_segments_up() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::default();
    let log = config(dir.path()).open(ledger.clone()).unwrap();
    let ids = write_entries(&log, 700, 64 << 10);
    let largest = largest_segment_file(dir.path());
    log.shutdown().unwrap();
    drop(log);

    let held = ledger.entries_per_segment(ids[0]);
    assert!(held.len() >= 4, "too few checkpoints to judge: {held:?}");
    // Counts can run over a segment's size by a few entries: writers keep
    // filling a full segment while its successor's file is being made, and
    // a pause of the disk long enough to look idle starts the sizing over.
    assert!(
        held[0] <= 40,
        "the first segment holds 1 MiB of entries: {held:?}"
    );
    assert!(
        held.iter().filter(|&&n| n >= 100).count() >= 3,
        "later segments should hold about 127 entries: {held:?}"
    );
    // Without sizing up, 700 entries would have taken about 43 segments.
    assert!(held.len() <= 16, "{} segments: {held:?}", held.len());
    assert!(
        largest <= 2 * GROWN_LIMIT,
        "a segment file grew far past the limit: {largest}"
    );
    assert!(
        largest > 4 * SEGMENT,
        "no segment file was sized up: {largest}"
    );

    // Every entry after the last checkpoint comes back, each once.
    let last_checkpointed = ledger.checkpoints.lock().last().copied().unwrap();
    let reopened = Ledger::default();
    let log = config(dir.path()).open(reopened.clone()).unwrap();
    let recovered = reopened.recovered.lock().clone();
    let expected: BTreeSet<u64> = ids
        .iter()
        .copied()
        .filter(|&id| id > last_checkpointed)
        .collect();
    let found: BTreeSet<u64> = recovered.iter().map(|&(id, _)| id).collect();
    assert!(
        expected.is_subset(&found),
        "entries lost across sized-up segments: {:?}",
        expected.difference(&found).collect::<Vec<_>>()
    );
    assert_eq!(found.len(), recovered.len(), "an entry was replayed twice");
    assert!(recovered.iter().all(|&(_, chunks)| chunks == 1));
    log.shutdown().unwrap();
}

/// Entries of 4 KiB fill a 1 MiB segment with about 250 of them: the log
/// keeps the configured size.
#[test]
fn small_entries_keep_the_configured_segment_size() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::default();
    let log = config(dir.path()).open(ledger.clone()).unwrap();
    let ids = write_entries(&log, 1500, 4 << 10);
    let largest = largest_segment_file(dir.path());
    log.shutdown().unwrap();

    let held = ledger.entries_per_segment(ids[0]);
    assert!(held.len() >= 4, "too few checkpoints to judge: {held:?}");
    // About 250 each; sized up, they would hold up to 2,000.
    assert!(
        held.iter().all(|&n| n <= 600),
        "a segment held far more than 1 MiB of entries: {held:?}"
    );
    assert!(largest < 4 * SEGMENT, "a segment file grew: {largest}");
}

/// One entry larger than a segment, among small ones, sizes nothing up:
/// the segments after it hold 1 MiB of small entries again.
#[test]
fn one_huge_entry_does_not_size_up_later_segments() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::default();
    let log = config(dir.path()).open(ledger.clone()).unwrap();
    let first = write_entries(&log, 300, 4 << 10)[0];
    let huge = write_entries(&log, 1, 3 << 20)[0];
    write_entries(&log, 1500, 4 << 10);
    log.shutdown().unwrap();

    let held = ledger.entries_per_segment(first);
    let lasts = ledger.checkpoints.lock().clone();
    let holding_huge = lasts.iter().position(|&last| last >= huge).unwrap();
    assert!(
        held.len() > holding_huge + 3,
        "too few segments after the huge entry: {held:?}"
    );
    // About 250 each; sized up, they would hold up to 2,000.
    for &n in &held[holding_huge + 1..] {
        assert!(n <= 600, "a later segment was sized up: {held:?}");
    }
}

/// After a burst of large entries, an idle log cuts its spare files back
/// to the configured size, and its next segments start from that size.
#[test]
fn an_idle_log_goes_back_to_the_configured_segment_size() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::default();
    let log = config(dir.path()).open(ledger.clone()).unwrap();
    write_entries(&log, 400, 64 << 10);
    log.checkpoint_active().unwrap();
    wait_for_spares_cut_back(dir.path(), true);

    let before = ledger.checkpoints.lock().len();
    let first = write_entries(&log, 60, 64 << 10)[0];
    log.shutdown().unwrap();
    let checkpoints = ledger.checkpoints.lock().clone();
    let after: Vec<u64> = checkpoints[before..].to_vec();
    // The first segment after the pause fills at 1 MiB again.
    assert!(
        after.len() >= 2,
        "no segment filled after the pause: {after:?}"
    );
    let held = after[0] - first + 1;
    // About 16; sized as before the pause, about 127.
    assert!(
        held <= 40,
        "the first segment after the pause held {held} entries: {after:?}"
    );
}

/// Spare files an earlier run left sized up (its writers stopped in a
/// burst of large entries) go back to the configured size once the
/// reopened log is idle.
#[test]
fn a_reopened_log_cuts_spares_an_earlier_run_left_large() {
    let dir = tempfile::tempdir().unwrap();
    let log = config(dir.path()).open(Ledger::default()).unwrap();
    write_entries(&log, 40, 64 << 10);
    log.shutdown().unwrap();
    drop(log);
    // What a run stopped in a burst leaves: zero-filled spares of the
    // grown size (which spares the background thread had made by then
    // depends on timing, so they are laid out here).
    for number in [100, 101] {
        std::fs::write(
            dir.path().join(format!("wal-spare-{number}")),
            vec![0_u8; GROWN_LIMIT as usize],
        )
        .unwrap();
    }

    let log = config(dir.path()).open(Ledger::default()).unwrap();
    // The active segment keeps a spare's name until its first sync: one
    // small entry gives it its own.
    write_entries(&log, 1, 100);
    wait_for_spares_cut_back(dir.path(), false);
    log.shutdown().unwrap();
}

/// Segments configured under 1 MiB keep their size whatever the entries:
/// such a log asked to checkpoint that often (64 KiB segments of 20 KiB
/// entries hold 3 each).
#[test]
fn segments_configured_small_keep_their_size() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::default();
    let log = Configuration::default_for(dir.path())
        .preallocate_bytes(64 << 10)
        .checkpoint_after_bytes(64 << 10)
        .open(ledger.clone())
        .unwrap();
    let ids = write_entries(&log, 60, 20 << 10);
    log.shutdown().unwrap();
    let held = ledger.entries_per_segment(ids[0]);
    assert!(held.len() >= 10, "too few checkpoints to judge: {held:?}");
    // 3 or 4 each, a few more while a spare is being made; sized up,
    // they would hold about 25.
    assert!(
        held.iter().all(|&n| n <= 10),
        "a 64 KiB segment was sized up: {held:?}"
    );
}
