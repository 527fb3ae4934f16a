//! Tests of the segment scan.

use super::*;
use crate::format::{CHUNK_TRAILER_SIZE, RECORD_HEADER_SIZE};
use crate::fs::{CrashFileSystem, FileSystem, OpenMode};
use std::path::Path;

/// A segment image: a blank header, then records of entries with one
/// to three chunks (one over the scan buffer), rollbacks, padding and
/// an entry whose chunk fails its CRC. Returns the bytes and the
/// offset where each record ends.
fn segment_image(salt: u64) -> (Vec<u8>, Vec<u64>) {
    use crate::format::encode_chunk;
    let mut out = vec![0_u8; HEADER_SIZE as usize];
    let mut ends = Vec::new();
    let record = |kind, entry_id, length| RecordHeader {
        kind,
        entry_id,
        length,
        durable_mark: 0,
    };
    for i in 0..60_u64 {
        let id = salt + i;
        let chunks = 1 + (i % 3) as u32;
        for c in 0..chunks {
            let len = if i == 17 && c == 0 {
                70_000
            } else {
                (i * 37 + u64::from(c) * 5) % 600
            };
            let data: Vec<u8> = (0..len).map(|b| (b as u8) ^ (i as u8)).collect();
            let mut crc = crc32fast::hash(&data);
            if i == 29 {
                crc ^= 1;
            }
            encode_chunk(
                &mut out,
                &record(RecordKind::Chunk, id, len as u32),
                salt,
                &data,
                crc,
            );
            ends.push(out.len() as u64);
        }
        let kind = if i % 11 == 5 {
            RecordKind::Rollback
        } else {
            RecordKind::Commit
        };
        let length = if kind == RecordKind::Commit {
            chunks
        } else {
            0
        };
        out.extend_from_slice(&record(kind, id, length).encode(salt));
        ends.push(out.len() as u64);
        if i % 13 == 0 {
            out.extend_from_slice(&record(RecordKind::Padding, id, 40).encode(salt));
            out.extend_from_slice(&[0; 40]);
            ends.push(out.len() as u64);
        }
    }
    (out, ends)
}

#[test]
fn a_scan_advanced_in_steps_finds_what_one_walk_finds() {
    let salt = 1_000;
    let (image, ends) = segment_image(salt);
    let fs = CrashFileSystem::new();
    fs.create_dir_all(Path::new("/d")).unwrap();
    let file = fs.open(Path::new("/d/f"), OpenMode::Create).unwrap();
    file.write_all_at(&image, 0).unwrap();
    let len = image.len() as u64;
    // A buffer smaller than the large chunk, so that chunk is read in
    // pieces across the buffer's refills.
    let buffer_bytes = 8 * 1024;
    let whole = scan_segment(&*file, &Layout::Plain, salt, len, buffer_bytes, false).unwrap();
    assert!(whole.stopped.is_none() && whole.damage.is_none());
    assert_eq!(whole.end, len);
    // 60 entries: 5 rolled back (i % 11 == 5) and one with a bad chunk.
    assert_eq!(whole.committed.len(), 54);
    assert_eq!(whole.discarded, 6);

    // Advanced to every record boundary, as the live-log reader does,
    // and separately to limits inside records, which the walk must
    // retry: the same entries, the same counts, the same end.
    let inside: Vec<u64> = (HEADER_SIZE..len).step_by(997).chain([len]).collect();
    for limits in [ends.clone(), inside] {
        let mut scanner = SegmentScanner::new(salt, buffer_bytes);
        for &limit in &limits {
            scanner
                .advance(&*file, limit, false, &mut Vec::new())
                .unwrap();
            let scan = scanner.scan_mut();
            assert!(scan.end <= limit);
            if ends.contains(&limit) {
                assert_eq!(scan.end, limit, "a walk to a record boundary reaches it");
                assert!(scan.stopped.is_none());
            }
        }
        let stepped = scanner.finish();
        assert_eq!(stepped.committed, whole.committed);
        assert_eq!(stepped.discarded, whole.discarded);
        assert_eq!(stepped.end, whole.end);
        assert_eq!(stepped.max_entry_id, whole.max_entry_id);
        assert!(stepped.stopped.is_none() && stepped.damage.is_none());
    }

    // In a live segment a large chunk's header and trailer are synced
    // before its writer has copied the data in: an advance that walks
    // the chunk then sees it fail its CRC. Once the data and the commit
    // are there, the next advance must still find the entry whole.
    let large = ends
        .windows(2)
        .find(|w| w[1] - w[0] > 60_000)
        .map(|w| (w[0], w[1]))
        .expect("the image has a large chunk");
    let live = fs.open(Path::new("/d/live"), OpenMode::Create).unwrap();
    let data_start = large.0 + RECORD_HEADER_SIZE as u64;
    let data_end = large.1 - CHUNK_TRAILER_SIZE as u64;
    live.write_all_at(&image[..data_start as usize], 0).unwrap();
    live.write_all_at(&image[data_end as usize..large.1 as usize], data_end)
        .unwrap();
    let mut scanner = SegmentScanner::new(salt, buffer_bytes);
    scanner
        .advance(&*live, large.1, false, &mut Vec::new())
        .unwrap();
    live.write_all_at(&image[data_start as usize..], data_start)
        .unwrap();
    scanner
        .advance(&*live, len, false, &mut Vec::new())
        .unwrap();
    let resumed = scanner.finish();
    assert_eq!(resumed.committed, whole.committed);
    assert_eq!(resumed.discarded, whole.discarded);
    assert!(resumed.damage.is_none());

    // Entries taken out of the scan are not found again by later
    // advances.
    let mut scanner = SegmentScanner::new(salt, buffer_bytes);
    let half = ends[ends.len() / 2];
    scanner
        .advance(&*file, half, false, &mut Vec::new())
        .unwrap();
    let first: Vec<u64> = std::mem::take(&mut scanner.scan_mut().committed)
        .into_keys()
        .collect();
    scanner
        .advance(&*file, len, false, &mut Vec::new())
        .unwrap();
    let second: Vec<u64> = scanner.scan_mut().committed.keys().copied().collect();
    assert!(!first.is_empty() && !second.is_empty());
    assert!(first.iter().max() < second.iter().min());
    let mut all = first;
    all.extend(second);
    assert_eq!(all, whole.committed.keys().copied().collect::<Vec<_>>());
}
