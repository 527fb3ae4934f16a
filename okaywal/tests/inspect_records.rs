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
