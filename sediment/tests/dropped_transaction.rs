//! A WAL checkpoint writes the stratum headers before the index, so a
//! crash in between leaves blobs of WAL entries past the index's
//! checkpointed entry in the strata; the replay of those entries makes
//! that right. When such an entry is damaged and an open told to drop
//! damaged entries drops it, its blobs must go too: a dropped transaction
//! never comes back, not as readable blobs, nor as live ones once later
//! transactions commit.

mod common;

use std::path::Path;

use common::{blob, Mode};
use okaywal::RecoveryMode;
use sediment::{Config, Database, GrainId};

/// A committed blob and its bytes.
type Blob = (GrainId, Vec<u8>);

fn config(mode: Mode, dir: &Path) -> Config {
    mode.apply(Config::for_directory(dir))
}

/// Copies every file of `from` into `to`, whose names match `keep`.
fn copy_files(from: &Path, to: &Path, keep: impl Fn(&str) -> bool) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type().unwrap().is_file() && keep(&name) {
            std::fs::copy(entry.path(), to.join(&name)).unwrap();
        }
    }
}

/// Flips a byte in the record header of the first chunk of WAL entry
/// `entry` in `dir`.
fn damage_wal_entry(mode: Mode, dir: &Path, entry: u64) {
    let wal = match mode {
        Mode::Plain => okaywal::Configuration::default_for(dir),
        Mode::Encrypted => okaywal::Configuration::default_for(dir).encryption(common::test_key()),
    };
    for file in std::fs::read_dir(dir).unwrap() {
        let name = file.unwrap().file_name().to_string_lossy().into_owned();
        let Some(id) = name
            .strip_prefix("wal-")
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        let listing = wal.inspect_segment(id).unwrap();
        if let Some(record) = listing
            .records
            .iter()
            .find(|r| r.kind == okaywal::RecordType::Chunk && r.entry_id == entry)
        {
            let path = dir.join(&name);
            let mut bytes = std::fs::read(&path).unwrap();
            bytes[usize::try_from(record.offset).unwrap() + 3] ^= 0x5A;
            std::fs::write(&path, bytes).unwrap();
            return;
        }
    }
    panic!("no chunk of entry {entry} in the WAL");
}

/// The directory a crash leaves when the WAL checkpoint of two
/// transactions wrote its stratum headers and not yet the index, with the
/// first one's WAL entry damaged since (the second one's records, synced
/// after it, prove it is damage). Returns the blob committed before them,
/// the blobs the damaged transaction wrote and the later one's blob.
fn interrupted_checkpoint(mode: Mode, dir: &Path) -> (Blob, Vec<Blob>, Blob) {
    let live = tempfile::tempdir().unwrap();
    let db = config(mode, live.path()).open().unwrap();
    let kept_bytes = blob(1, 300);
    let mut tx = db.begin_transaction().unwrap();
    let kept = tx.write(&kept_bytes).unwrap();
    tx.commit().unwrap();
    db.checkpoint_wal().unwrap();

    // Small blobs (through the WAL) and a large one (straight into its
    // grains).
    let mut tx = db.begin_transaction().unwrap();
    let mut written = Vec::new();
    for (i, len) in [(2, 500), (3, 2000), (4, 100_000)] {
        let bytes = blob(i, len);
        written.push((tx.write(&bytes).unwrap(), bytes));
    }
    tx.commit().unwrap();
    let later_bytes = blob(5, 400);
    let mut tx = db.begin_transaction().unwrap();
    let later = tx.write(&later_bytes).unwrap();
    tx.commit().unwrap();
    // The files before the checkpoint: the index and the WAL as a crash
    // during it leaves them.
    copy_files(live.path(), dir, |_| true);
    db.checkpoint_wal().unwrap();
    // ...and the strata (with their stamp files, encrypted) as it left
    // them.
    copy_files(live.path(), dir, |name| {
        name.starts_with("stratum-") || name.starts_with("stamps-")
    });
    drop(db);
    damage_wal_entry(mode, dir, 2);
    ((kept, kept_bytes), written, (later, later_bytes))
}

#[test]
fn a_transaction_recovery_drops_after_an_interrupted_checkpoint_does_not_come_back() {
    for mode in Mode::BOTH {
        for recovery in [RecoveryMode::SkipCorrupted, RecoveryMode::PointInTime] {
            let what = format!("{mode:?}, {recovery:?}");
            let dir = tempfile::tempdir().unwrap();
            let ((kept, kept_bytes), dropped, (later, later_bytes)) =
                interrupted_checkpoint(mode, dir.path());

            // By default the damage stops the open.
            assert!(
                config(mode, dir.path()).open().is_err(),
                "{what}: the damaged WAL opened"
            );

            let db = config(mode, dir.path())
                .wal(|wal| wal.recovery_mode(recovery))
                .open()
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            // Skipping keeps the later transaction; a point-in-time cut
            // drops it with the damaged one.
            let skipped = recovery == RecoveryMode::SkipCorrupted;
            assert_eq!(db.last_committed().0, if skipped { 3 } else { 1 }, "{what}");
            assert_eq!(db.get(kept).unwrap().as_deref(), Some(&kept_bytes[..]));
            assert_eq!(
                db.get(later).unwrap().as_deref(),
                skipped.then_some(&later_bytes[..]),
                "{what}"
            );
            for (id, _) in &dropped {
                assert!(
                    matches!(db.get(*id), Ok(None)),
                    "{what}: blob {id} of the dropped transaction reads {:?}",
                    db.get(*id).map(|b| b.map(|b| b.len()))
                );
            }
            // A later transaction commits, and the dropped one's blobs are
            // still gone: not listed, not live, and the store verifies.
            let mut tx = db.begin_transaction().unwrap();
            let after_bytes = blob(9, 700);
            let after = tx.write(&after_bytes).unwrap();
            let sequence = tx.commit().unwrap();
            // (A point-in-time cut forgets the ids past it, so it may hand
            // out the dropped sequence again; skipping keeps them.)
            if skipped {
                assert!(sequence.0 > 3, "{what}: a dropped sequence was reused");
            }
            let listed: Vec<GrainId> = db.grains().unwrap().map(|g| g.unwrap().id).collect();
            let mut expected = vec![kept, after];
            if skipped {
                expected.push(later);
            }
            expected.sort();
            assert_eq!(listed, expected, "{what}");
            db.verify().unwrap_or_else(|e| panic!("{what}: {e}"));
            db.shutdown().unwrap();

            // And so after reopening as usual.
            let db = Database::open_read_only(dir.path());
            let db = match mode {
                Mode::Plain => db.unwrap(),
                Mode::Encrypted => config(mode, dir.path()).read_only(true).open().unwrap(),
            };
            let listed: Vec<GrainId> = db.grains().unwrap().map(|g| g.unwrap().id).collect();
            assert_eq!(listed, expected, "{what}: reopened");
            assert_eq!(db.get(after).unwrap().as_deref(), Some(&after_bytes[..]));
            db.verify()
                .unwrap_or_else(|e| panic!("{what}: reopened: {e}"));
        }
    }
}
