//! Tests of reading okaywal 0.2/0.3 logs.

use std::sync::Arc;

use super::format::*;
use super::*;
use crate::format::MAGIC;
use crate::fs::FileHandle;
use crate::fs::MemoryFileSystem;
use crate::position::LogPosition;

/// Builds 0.3 segment images.
struct Image {
    bytes: Vec<u8>,
}

impl Image {
    fn new(version_info: &[u8]) -> Self {
        let mut bytes = LEGACY_MAGIC.to_vec();
        bytes.push(version_info.len() as u8);
        bytes.extend_from_slice(version_info);
        Self { bytes }
    }

    fn begin(&mut self, id: u64) -> &mut Self {
        self.bytes.push(NEW_ENTRY);
        self.bytes.extend_from_slice(&id.to_le_bytes());
        self
    }

    fn chunk(&mut self, data: &[u8]) -> &mut Self {
        self.bytes.push(CHUNK);
        self.bytes
            .extend_from_slice(&(data.len() as u32).to_le_bytes());
        self.bytes.extend_from_slice(data);
        self.bytes
            .extend_from_slice(&crc32c_append(0, data).to_le_bytes());
        self
    }

    fn end(&mut self) -> &mut Self {
        self.bytes.push(END_OF_ENTRY);
        self
    }

    /// An entry of `chunks`, committed.
    fn entry(&mut self, id: u64, chunks: &[&[u8]]) -> &mut Self {
        self.begin(id);
        for chunk in chunks {
            self.chunk(chunk);
        }
        self.end()
    }
}

fn file_with(bytes: &[u8]) -> Arc<dyn FileHandle> {
    let fs = MemoryFileSystem::new();
    fs.create_dir_all(Path::new("/d")).unwrap();
    let file = fs.open(Path::new("/d/wal-1"), OpenMode::Create).unwrap();
    file.write_all_at(bytes, 0).unwrap();
    file
}

fn header_of(bytes: &[u8]) -> LegacyHeader {
    match classify(&bytes[..bytes.len().min(512)]) {
        HeaderKind::Legacy(header) => header,
        other => panic!("not a 0.3 header: {other:?}"),
    }
}

fn scan_bytes(bytes: &[u8], segment_id: u64, upper: Option<u64>) -> LegacyScan {
    let file = file_with(bytes);
    scan(&*file, segment_id, &header_of(bytes), upper, 4096).unwrap()
}

/// The committed entries of a scan, read back through the reader the
/// manager gets.
fn read_back(bytes: &[u8], segment_id: u64) -> Vec<(u64, Vec<Vec<u8>>)> {
    let file = file_with(bytes);
    let header = header_of(bytes);
    let scan = scan(&*file, segment_id, &header, None, 4096).unwrap();
    let mut reader = SegmentReader::legacy(
        segment_id,
        &header.version_info,
        file,
        scan.entries,
        scan.end,
    );
    let mut out = Vec::new();
    while let Some(mut entry) = reader.read_entry().unwrap() {
        assert_eq!(entry.segment().version_info(), header.version_info);
        let chunks = entry.read_all_chunks().unwrap().expect("complete");
        out.push((entry.id().0, chunks));
    }
    out
}

#[test]
fn crc32c_matches_the_castagnoli_check_value_in_any_split() {
    assert_eq!(crc32c_append(0, b"123456789"), 0xE306_9283);
    assert_eq!(crc32c_append(0, b""), 0);
    let data: Vec<u8> = (0..1000_u32).map(|i| (i * 31 + 7) as u8).collect();
    let whole = crc32c_append(0, &data);
    for split in [0, 1, 7, 8, 9, 500, 999, 1000] {
        let (a, b) = data.split_at(split);
        assert_eq!(
            crc32c_append(crc32c_append(0, a), b),
            whole,
            "split {split}"
        );
    }
    // 32 bytes of zeros, a published CRC-32C test vector (RFC 3720).
    assert_eq!(crc32c_append(0, &[0; 32]), 0x8A91_36AA);
}

#[test]
fn headers_are_told_apart() {
    assert_eq!(classify(&[]), HeaderKind::Unwritten);
    assert_eq!(classify(&[0; 512]), HeaderKind::Unwritten);
    let mut ours = MAGIC.to_vec();
    ours.resize(512, 0xAB);
    assert_eq!(classify(&ours), HeaderKind::Ours);
    assert_eq!(classify(b"OKAY"), HeaderKind::Ours, "cut inside the magic");
    assert_eq!(
        classify(b"okw\0\x03abcrest"),
        HeaderKind::Legacy(LegacyHeader {
            version_info: b"abc".to_vec(),
            records_start: Some(8),
        })
    );
    // Cut inside the header: a 0.3 file that holds nothing.
    for short in [&b"o"[..], b"ok", b"okw", b"okw\0", b"okw\0\x05ab"] {
        assert_eq!(
            classify(short),
            HeaderKind::Legacy(LegacyHeader {
                version_info: Vec::new(),
                records_start: None,
            }),
            "{short:?}"
        );
    }
    match classify(b"okw\x01\0") {
        HeaderKind::Foreign(what) => assert!(what.contains("version 1"), "{what}"),
        other => panic!("{other:?}"),
    }
    for foreign in [
        &b"SQLite format 3\0"[..],
        b"\x01",
        b"OKAYWA-",
        b"\0\0\0\0\0\0\0\x01",
    ] {
        match classify(foreign) {
            HeaderKind::Foreign(what) => assert!(what.contains("begins with"), "{what}"),
            other => panic!("{foreign:?}: {other:?}"),
        }
    }
    let err = foreign_file_error(Path::new("/d/wal-5"), "something");
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    assert!(err.to_string().contains("/d/wal-5"), "{err}");
}

#[test]
fn checkpointed_names_are_parsed() {
    assert_eq!(checkpointed_name("wal-17-cp"), Some(17));
    for other in [
        "wal-17",
        "wal--cp",
        "wal-x-cp",
        "wal-1-cp-cp",
        "wal-+1-cp",
        "x-1-cp",
    ] {
        assert_eq!(checkpointed_name(other), None, "{other}");
    }
}

#[test]
fn committed_entries_are_read_back_and_unfinished_ones_are_not() {
    let mut image = Image::new(b"v1");
    image
        .entry(10, &[b"first", b""])
        .entry(11, &[])
        // Never finished: the next entry header follows at once (0.3
        // reads on from there).
        .begin(12)
        .chunk(b"abandoned")
        .entry(13, &[&[7; 70_000], b"tail"]);
    // A rolled-back entry left at the end.
    image.begin(14).chunk(b"rolled back");
    let scan = scan_bytes(&image.bytes, 10, None);
    assert_eq!(
        scan.entries.keys().copied().collect::<Vec<_>>(),
        [10, 11, 13]
    );
    assert_eq!(scan.max_entry_id, Some(14));
    assert_eq!(scan.discarded, 2);
    assert_eq!(scan.damage, None);
    let entries = read_back(&image.bytes, 10);
    assert_eq!(
        entries,
        vec![
            (10, vec![b"first".to_vec(), Vec::new()]),
            (11, vec![]),
            (13, vec![vec![7; 70_000], b"tail".to_vec()]),
        ]
    );
}

#[test]
fn the_walk_stops_at_stale_ids_and_at_the_next_segment_s_ids() {
    let mut image = Image::new(b"");
    image.entry(20, &[b"a"]).entry(21, &[b"b"]);
    let good = image.bytes.len();
    // An entry of the file's earlier use.
    image.entry(5, &[b"stale"]).entry(22, &[b"after stale"]);
    let scan = scan_bytes(&image.bytes, 20, None);
    assert_eq!(scan.entries.len(), 2);
    assert_eq!(scan.end, good as u64);

    let mut image = Image::new(b"");
    image.entry(20, &[b"a"]).entry(20, &[b"again"]);
    assert_eq!(scan_bytes(&image.bytes, 20, None).entries.len(), 1);

    let mut image = Image::new(b"");
    image.entry(20, &[b"a"]).entry(30, &[b"b"]);
    assert_eq!(scan_bytes(&image.bytes, 20, Some(30)).entries.len(), 1);
    assert_eq!(scan_bytes(&image.bytes, 20, None).entries.len(), 2);
}

#[test]
fn chunk_lookalikes_after_an_entry_s_end_are_stepped_over() {
    let mut image = Image::new(b"");
    image.entry(1, &[b"one"]);
    // What a longer rolled-back entry leaves after a shorter one
    // written over it: a chunk of it, then the next entry.
    image.chunk(b"left over");
    image.entry(2, &[b"two"]);
    let entries = read_back(&image.bytes, 1);
    assert_eq!(
        entries,
        vec![(1, vec![b"one".to_vec()]), (2, vec![b"two".to_vec()])]
    );
}

#[test]
fn every_truncation_keeps_a_prefix_of_the_entries() {
    let mut image = Image::new(b"info");
    for id in 1..=6_u64 {
        let data = vec![id as u8; (id * 50) as usize];
        image.entry(id, &[&data, b"x"]);
    }
    let full = scan_bytes(&image.bytes, 1, None);
    assert_eq!(full.entries.len(), 6);
    for len in 0..=image.bytes.len() {
        let bytes = &image.bytes[..len];
        let ids: Vec<u64> = match classify(&bytes[..len.min(512)]) {
            HeaderKind::Legacy(_) => read_back(bytes, 1).into_iter().map(|e| e.0).collect(),
            HeaderKind::Unwritten => Vec::new(),
            other => panic!("{len}: {other:?}"),
        };
        let expected = (1..=6_u64)
            .filter(|id| {
                let committed_end = full.entries[id].last().map_or(0, |c| {
                    c.offset + CHUNK_OVERHEAD as u64 + u64::from(c.length)
                }) + 1;
                committed_end <= len as u64
            })
            .collect::<Vec<_>>();
        assert_eq!(ids, expected, "cut to {len} bytes");
    }
}

#[test]
fn a_bad_checksum_is_a_torn_tail_at_the_end_and_damage_before_committed_entries() {
    let mut image = Image::new(b"");
    image
        .entry(1, &[b"one"])
        .entry(2, &[b"two"])
        .entry(3, &[b"three"]);
    let second_data = image
        .bytes
        .windows(3)
        .position(|w| w == b"two")
        .expect("data");
    let third_data = image.bytes.len() - 1 - 4 - 5;

    let mut torn = image.bytes.clone();
    torn[third_data] ^= 0xff;
    let scan = scan_bytes(&torn, 1, None);
    assert_eq!(scan.entries.keys().copied().collect::<Vec<_>>(), [1, 2]);
    assert_eq!(scan.damage, None);
    assert_eq!(scan.discarded, 1);

    let mut damaged = image.bytes.clone();
    damaged[second_data] ^= 0xff;
    let scan = scan_bytes(&damaged, 1, None);
    assert_eq!(scan.entries.keys().copied().collect::<Vec<_>>(), [1, 3]);
    assert_eq!(
        scan.damage,
        Some(Damage {
            entry_id: 2,
            offset: second_data as u64 - CHUNK_HEADER,
        })
    );
}

#[test]
fn garbage_never_panics_nor_allocates_past_the_file() {
    // A chunk whose length field claims 4 GiB.
    let mut image = Image::new(b"");
    image.begin(1);
    image.bytes.push(CHUNK);
    image.bytes.extend_from_slice(&u32::MAX.to_le_bytes());
    image.bytes.extend_from_slice(&[0; 100]);
    let scan = scan_bytes(&image.bytes, 1, None);
    assert!(scan.entries.is_empty());
    assert_eq!(scan.max_entry_id, Some(1));

    // Lookalikes with huge lengths after an entry's end.
    let mut image = Image::new(b"");
    image.entry(1, &[b"ok"]);
    image.bytes.push(CHUNK);
    image.bytes.extend_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(scan_bytes(&image.bytes, 1, None).entries.len(), 1);

    // Pseudo-random bytes after a valid header, with the kind bytes
    // made common.
    let mut state = 0x1234_5678_9abc_def0_u64;
    for round in 0..300 {
        let mut bytes = Image::new(b"r").bytes;
        let len = 1 + round * 7;
        for _ in 0..len {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let byte = match state % 5 {
                0 => NEW_ENTRY,
                1 => CHUNK,
                2 => END_OF_ENTRY,
                3 => 0,
                _ => (state >> 32) as u8,
            };
            bytes.push(byte);
        }
        let entries = read_back(&bytes, 0);
        let ids: Vec<u64> = entries.iter().map(|e| e.0).collect();
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(ids, sorted, "round {round}");
    }
}

#[test]
fn read_at_checks_the_record_and_its_checksum() {
    let mut image = Image::new(b"");
    image.entry(1, &[b"hello"]);
    let chunk_at = 5 + ENTRY_HEADER;
    let open = OpenLegacyFile {
        file: file_with(&image.bytes),
        records_start: 5,
    };
    let position = |offset| LogPosition { file_id: 1, offset };
    assert_eq!(
        read_at(&open, position(chunk_at))
            .unwrap()
            .read_all()
            .unwrap(),
        b"hello"
    );
    for wrong in [0, 4, chunk_at + 1, image.bytes.len() as u64, u64::MAX] {
        let err = read_at(&open, position(wrong)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{wrong}: {err}");
    }
    let mut bad = image.bytes.clone();
    bad[chunk_at as usize + 6] ^= 1;
    let open = OpenLegacyFile {
        file: file_with(&bad),
        records_start: 5,
    };
    let mut reader = read_at(&open, position(chunk_at)).unwrap();
    let mut data = Vec::new();
    io::Read::read_to_end(&mut reader, &mut data).unwrap();
    assert!(!reader.crc_is_valid().unwrap());
}
