//! Files in a log directory that the log did not write are never reused
//! or overwritten: a segment of another format version, written whole,
//! and a spare or recycled file holding another program's bytes make the
//! open fail with an error naming the file, which is left as it was.

use std::io;
use std::path::Path;

use okaywal::format::{SegmentHeader, ENCRYPTED_FORMAT_VERSION, HEADER_SIZE};
use okaywal::{Configuration, LogVoid};

fn commit_one(dir: &Path) {
    let log = Configuration::default_for(dir).open(LogVoid).unwrap();
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(b"one entry").unwrap();
    entry.commit().unwrap();
    log.shutdown().unwrap();
}

/// A header of this crate's layout, intact, with another format version.
fn newer_version_header(first_entry_id: u64) -> Vec<u8> {
    let mut bytes = SegmentHeader {
        first_entry_id,
        previous: None,
        version_info: Vec::new(),
    }
    .encode();
    // Versions 1 (plain), 2 and 3 (encrypted) are this crate's.
    bytes[7] = ENCRYPTED_FORMAT_VERSION + 1;
    let crc_at = HEADER_SIZE as usize - 4;
    let crc = crc32fast::hash(&bytes[..crc_at]);
    bytes[crc_at..].copy_from_slice(&crc.to_le_bytes());
    bytes
}

fn assert_refused_and_untouched(dir: &Path, name: &str, contents: &[u8]) {
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    for _ in 0..2 {
        let err = Configuration::default_for(dir).open(LogVoid).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{name}: {err}");
        assert!(err.to_string().contains(name), "{name}: {err}");
        let read_only = Configuration::default_for(dir).open_read_only(LogVoid);
        let inspection = Configuration::default_for(dir).inspect().unwrap();
        if name.starts_with("wal-spare") || name.starts_with("wal-recycled") {
            // Not a segment: a read-only open and an inspection read
            // segments only, and reuse nothing.
            read_only.unwrap();
        } else {
            let err = read_only.map(drop).unwrap_err();
            assert!(err.to_string().contains(name), "{name}: {err}");
            assert!(
                inspection.problems.iter().any(|p| p.path == path),
                "{name}: {:?}",
                inspection.problems
            );
        }
        assert_eq!(
            std::fs::read(&path).unwrap(),
            contents,
            "{name} was changed"
        );
    }
    std::fs::remove_file(&path).unwrap();
    // Without it the log opens again.
    Configuration::default_for(dir)
        .open(LogVoid)
        .unwrap()
        .shutdown()
        .unwrap();
}

#[test]
fn a_segment_of_another_format_version_is_refused_and_left_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    commit_one(dir.path());
    let mut contents = newer_version_header(1000);
    contents.extend(vec![0x77; 4096]);
    assert_refused_and_untouched(dir.path(), "wal-1000", &contents);
}

#[test]
fn a_spare_or_recycled_file_with_foreign_bytes_is_refused_and_left_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    commit_one(dir.path());
    let mut foreign = b"SQLite format 3\0".to_vec();
    foreign.resize(8192, 0x42);
    assert_refused_and_untouched(dir.path(), "wal-spare-77", &foreign);
    assert_refused_and_untouched(dir.path(), "wal-recycled-5", &foreign);
    let mut newer = newer_version_header(5);
    newer.resize(8192, 0);
    assert_refused_and_untouched(dir.path(), "wal-recycled-6", &newer);
}

/// A file shorter than a segment header is no exception: a few bytes of
/// text named like a spare or a recycled file used to be taken for a
/// spare cut short and reused (or removed as a surplus spare).
#[test]
fn a_short_spare_or_recycled_file_with_foreign_bytes_is_refused_and_left_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    commit_one(dir.path());
    let note = b"user data named like a spare\n";
    assert_refused_and_untouched(dir.path(), "wal-spare-7", note);
    assert_refused_and_untouched(dir.path(), "wal-recycled-2", note);
    assert_refused_and_untouched(dir.path(), "wal-spare-8", b"x");
}

/// What a crash can leave of a spare the log was zero-filling, an empty
/// or a short all-zero file, is still the log's to reuse.
#[test]
fn a_short_spare_of_zeros_is_reused() {
    let dir = tempfile::tempdir().unwrap();
    commit_one(dir.path());
    std::fs::write(dir.path().join("wal-spare-40"), b"").unwrap();
    std::fs::write(dir.path().join("wal-spare-41"), [0_u8; 100]).unwrap();
    let log = Configuration::default_for(dir.path())
        .open(LogVoid)
        .unwrap();
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(b"after the short spares").unwrap();
    entry.commit().unwrap();
    log.shutdown().unwrap();
    drop(log);
    // Reopened, the log replays the entry written after them.
    let entries = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = Configuration::default_for(dir.path())
        .open(Recorder(entries.clone()))
        .unwrap();
    log.shutdown().unwrap();
    let entries = entries.lock().unwrap();
    assert!(
        entries.iter().any(|e| e == b"after the short spares"),
        "{entries:?}"
    );
}

/// Records the chunks of every entry replayed at open; checkpoints keep
/// nothing, so entries stay in the log.
#[derive(Debug, Clone)]
struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>);

impl okaywal::LogManager for Recorder {
    fn recover(&mut self, entry: &mut okaywal::Entry<'_>) -> io::Result<()> {
        if let Some(chunks) = entry.read_all_chunks()? {
            self.0.lock().unwrap().extend(chunks);
        }
        Ok(())
    }

    fn checkpoint_to(
        &mut self,
        _last: okaywal::EntryId,
        _entries: &mut okaywal::SegmentReader,
        _wal: &okaywal::WriteAheadLog,
    ) -> io::Result<()> {
        Ok(())
    }
}

/// A file named as okaywal 0.3 names a checkpointed segment (`wal-N-cp`)
/// whose bytes are of neither format: every open refuses it with the same
/// error (a read-only open used to call it a 0.3 log to convert, which an
/// open for writing then refused), and it is left as it was.
#[test]
fn a_foreign_file_named_like_a_checkpointed_0_3_segment_is_refused_alike() {
    let dir = tempfile::tempdir().unwrap();
    commit_one(dir.path());
    let path = dir.path().join("wal-7-cp");
    std::fs::write(&path, b"junk").unwrap();
    let writable = Configuration::default_for(dir.path())
        .open(LogVoid)
        .unwrap_err();
    let read_only = Configuration::default_for(dir.path())
        .open_read_only(LogVoid)
        .map(drop)
        .unwrap_err();
    for err in [&writable, &read_only] {
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        assert!(
            err.to_string().contains("wal-7-cp")
                && err.to_string().contains("not a segment of this log"),
            "{err}"
        );
    }
    assert_eq!(std::fs::read(&path).unwrap(), b"junk");
}

/// Counts the entries recovery hands over; never checkpoints.
#[derive(Debug, Clone, Default)]
struct Counting(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl okaywal::LogManager for Counting {
    fn recover(&mut self, _entry: &mut okaywal::Entry<'_>) -> io::Result<()> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    fn checkpoint_to(
        &mut self,
        _last_checkpointed_id: okaywal::EntryId,
        _entries: &mut okaywal::SegmentReader,
        _wal: &okaywal::WriteAheadLog,
    ) -> io::Result<()> {
        Err(io::Error::other("this manager keeps every entry"))
    }
}

#[test]
fn zero_padded_names_are_other_files_not_second_names_of_a_segment() {
    let dir = tempfile::tempdir().unwrap();
    let log = Configuration::default_for(dir.path())
        .open(Counting::default())
        .unwrap();
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(b"one entry").unwrap();
    let id = entry.commit().unwrap();
    log.shutdown().unwrap();
    drop(log);
    let segment = dir.path().join(format!("wal-{}", id.0));
    let copy = std::fs::read(&segment).unwrap();
    let padded = [
        format!("wal-0{}", id.0),
        "wal-spare-01".to_string(),
        "wal-recycled-0100".to_string(),
    ];
    for name in &padded {
        std::fs::write(dir.path().join(name), &copy).unwrap();
    }
    // Twice: the entry is handed over once per open, and the padded files
    // are neither read, reused nor touched.
    for _ in 0..2 {
        let manager = Counting::default();
        let log = Configuration::default_for(dir.path())
            .open(manager.clone())
            .unwrap();
        assert_eq!(manager.0.load(std::sync::atomic::Ordering::Relaxed), 1);
        log.shutdown().unwrap();
        drop(log);
        for name in &padded {
            assert_eq!(
                std::fs::read(dir.path().join(name)).unwrap(),
                copy,
                "{name}"
            );
        }
    }
}

#[test]
fn a_segment_linked_from_elsewhere_is_read_and_its_ids_are_not_used_again() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let log = Configuration::default_for(dir.path())
        .open(Counting::default())
        .unwrap();
    let mut last = None;
    for n in 0..3_u8 {
        let mut entry = log.begin_entry().unwrap();
        entry.write_chunk(&[n; 10]).unwrap();
        last = Some(entry.commit().unwrap());
    }
    log.shutdown().unwrap();
    drop(log);
    let segment = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .find(|name| {
            okaywal::LogFileName::parse(name)
                .is_some_and(|n| matches!(n, okaywal::LogFileName::Segment(_)))
        })
        .unwrap();
    let moved = elsewhere.path().join(&segment);
    std::fs::rename(dir.path().join(&segment), &moved).unwrap();
    std::os::unix::fs::symlink(&moved, dir.path().join(&segment)).unwrap();

    let manager = Counting::default();
    let log = Configuration::default_for(dir.path())
        .open(manager.clone())
        .unwrap();
    assert_eq!(manager.0.load(std::sync::atomic::Ordering::Relaxed), 3);
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(b"next").unwrap();
    let next = entry.commit().unwrap();
    assert!(next > last.unwrap(), "{next:?} after {last:?}");
    log.shutdown().unwrap();
}
