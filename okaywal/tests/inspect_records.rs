//! `Configuration::inspect_segment`: the per-record listing tools use.

use std::fs::OpenOptions;

use okaywal::{Configuration, HeaderStatus, LogFileName, LogVoid, RecordType, TornRecord};

#[test]
fn a_segment_s_records_are_listed_up_to_its_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let log = Configuration::default_for(dir.path())
        .open(LogVoid)
        .unwrap();
    let mut first = log.begin_entry().unwrap();
    first.write_chunk(b"one").unwrap();
    first.write_chunk(b"two").unwrap();
    let first = first.commit().unwrap();
    let mut rolled_back = log.begin_entry().unwrap();
    rolled_back.write_chunk(b"gone").unwrap();
    drop(rolled_back);
    let mut last = log.begin_entry().unwrap();
    last.write_chunk(&[7; 100]).unwrap();
    last.commit().unwrap();
    log.shutdown().unwrap();
    drop(log);

    let config = Configuration::default_for(dir.path());
    let listing = config.inspect_segment(first.0).unwrap();
    assert!(matches!(
        listing.header,
        HeaderStatus::Valid { first_entry_id, format_version: 1, .. } if first_entry_id == first.0
    ));
    let kinds: Vec<RecordType> = listing.records.iter().map(|r| r.kind).collect();
    assert_eq!(
        kinds,
        [
            RecordType::Chunk,
            RecordType::Chunk,
            RecordType::Commit,
            RecordType::Chunk,
            RecordType::Rollback,
            RecordType::Chunk,
            RecordType::Commit,
            // The end mark the shutdown left.
            RecordType::Padding,
        ]
    );
    assert!(listing.records.iter().all(|r| r.crc_ok != Some(false)));
    let end = listing.end.unwrap();
    // The rest of the preallocated file is zeros.
    assert_eq!(end.torn, Some(TornRecord::Unwritten));
    assert!(listing.damage.is_none());

    // Cut the file inside the last chunk: the walk stops at its header.
    let last_chunk = listing.records[5];
    let file = OpenOptions::new().write(true).open(&listing.path).unwrap();
    file.set_len(last_chunk.offset + 40).unwrap();
    drop(file);
    let cut = config.inspect_segment(first.0).unwrap();
    assert_eq!(cut.records.len(), 5);
    let end = cut.end.unwrap();
    assert_eq!(end.offset, last_chunk.offset);
    assert!(matches!(end.torn, Some(TornRecord::PastEnd { .. })));

    let name = listing.path.file_name().unwrap().to_str().unwrap();
    assert_eq!(
        LogFileName::parse(name),
        Some(LogFileName::Segment(first.0))
    );
    assert_eq!(
        LogFileName::parse("wal-spare-3"),
        Some(LogFileName::Spare(3))
    );
    assert_eq!(LogFileName::parse("wal-x"), None);
}

/// A `wal-{id}` file that is no segment of this format says what it is:
/// an okaywal 0.2/0.3 segment (an open converts it), another program's
/// file, or an intact header of a format version this crate does not read
/// (both of which an open refuses), never a header that "never became
/// durable".
#[test]
fn files_of_other_formats_are_named_for_what_they_are() {
    let dir = tempfile::tempdir().unwrap();
    let config = Configuration::default_for(dir.path());
    let mut older = b"okw\0\x03abc".to_vec();
    older.resize(4096, 0);
    std::fs::write(dir.path().join("wal-1"), &older).unwrap();
    assert_eq!(
        config.inspect_segment(1).unwrap().header,
        HeaderStatus::OlderFormat {
            version_info: b"abc".to_vec()
        }
    );

    std::fs::write(dir.path().join("wal-2"), b"a file of mine\n").unwrap();
    match config.inspect_segment(2).unwrap().header {
        HeaderStatus::Foreign { reason } => assert!(reason.contains("a file of mine"), "{reason}"),
        other => panic!("{other:?}"),
    }

    // This crate's header with another format version, magic and checksum
    // intact: written whole by another version of okaywal.
    let mut newer = vec![0_u8; 512];
    newer[..7].copy_from_slice(b"OKAYWAL");
    newer[7] = 9;
    newer[8..16].copy_from_slice(&3_u64.to_le_bytes());
    let crc = crc32fast::hash(&newer[..508]);
    newer[508..].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(dir.path().join("wal-3"), &newer).unwrap();
    match config.inspect_segment(3).unwrap().header {
        HeaderStatus::Foreign { reason } => {
            assert!(reason.contains("format version 9"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}
