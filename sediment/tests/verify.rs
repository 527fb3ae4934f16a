//! `verify` passes on healthy databases and pinpoints damage; damaged
//! grains give `ChecksumMismatch`, never wrong bytes; a damaged copy of a
//! doubly stored header falls back to the other copy. The tests of grains
//! run on a plain store and on an encrypted one.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};

use common::{assert_blob, blob, Mode};
use sediment::format::{
    grain_crc, grain_offset, grain_size, stratum_slot_size, GrainHeader, IndexHeader,
    StratumHeader, ENVELOPE_HEAD, GRAIN_HEADER_SIZE, INDEX_SLOT_SIZE, SEALED_INDEX_BODY,
};
use sediment::{Config, Database, Error, GrainId, VerifyReport};

/// The stratum file and byte offset of a grain, from the documented layout
/// (the same in a plain store and an encrypted one).
fn grain_location(dir: &Path, id: GrainId) -> (PathBuf, u64) {
    let path = dir.join(format!("stratum-{}-{}", id.basin(), id.stratum()));
    let offset = 2 * stratum_slot_size(id.basin()) + u64::from(id.index()) * grain_size(id.basin());
    assert_eq!(offset, grain_offset(id.basin(), id.index()));
    (path, offset)
}

/// A byte of a stored blob: of its grain header (sequence 0..8, length
/// 8..12, CRC 12..16), of its data, or (encrypted) of its header's seal.
#[derive(Debug, Clone, Copy)]
enum Spot {
    Header(u64),
    Data(u64),
    Seal(u64),
}

/// Where `spot` is stored, from the start of the blob's first grain: after
/// the 16-byte header in a plain store; in an encrypted one the header's
/// ciphertext follows its 44-byte seal, and each 64 KiB chunk of data its
/// own seal.
fn stored_at(mode: Mode, spot: Spot) -> u64 {
    match (mode, spot) {
        (Mode::Plain, Spot::Header(at)) => at,
        (Mode::Plain, Spot::Data(at)) => GRAIN_HEADER_SIZE as u64 + at,
        (Mode::Encrypted, Spot::Header(at)) => 44 + at,
        (Mode::Encrypted, Spot::Data(at)) => 60 + 44 * (at / 65_536 + 1) + at,
        (_, Spot::Seal(at)) => at,
    }
}

fn recover(mode: Mode, dir: &Path) -> Database {
    mode.apply(Config::for_directory(dir)).open().unwrap()
}

fn flip_byte(path: &Path, offset: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[offset as usize] ^= 0x5A;
    std::fs::write(path, bytes).unwrap();
}

fn write_blobs(db: &Database, sizes: &[usize], tag: u64) -> Vec<(GrainId, Vec<u8>)> {
    let mut tx = db.begin_transaction().unwrap();
    let blobs: Vec<(GrainId, Vec<u8>)> = sizes
        .iter()
        .enumerate()
        .map(|(i, size)| {
            let data = blob(tag + i as u64, *size);
            (tx.write(&data).unwrap(), data)
        })
        .collect();
    tx.commit().unwrap();
    blobs
}

fn report_of(result: sediment::Result<VerifyReport>) -> VerifyReport {
    match result {
        Err(Error::Verification(report)) => report,
        other => panic!("verify should have found problems, gave {other:?}"),
    }
}

#[test]
fn healthy_databases_verify_clean() {
    for mode in Mode::BOTH {
        healthy_databases_verify_clean_in(mode);
    }
}

fn healthy_databases_verify_clean_in(mode: Mode) {
    let dir = tempfile::tempdir().unwrap();
    let db = recover(mode, dir.path());
    let report = db.verify().unwrap();
    assert!(report.is_ok());
    assert_eq!(
        (report.grains_checked, report.strata_checked),
        (0, 0),
        "a fresh database has nothing to check"
    );

    let mut blobs = write_blobs(&db, &[0, 1, 100, 5000, 70_000, 1 << 20], 1);
    // Blobs still in the WAL are checked too.
    let report = db.verify().unwrap();
    assert_eq!(report.grains_checked, blobs.len() as u64);
    db.checkpoint_wal().unwrap();
    let report = db.verify().unwrap();
    assert_eq!(report.grains_checked, blobs.len() as u64);
    assert!(report.strata_checked >= 3);

    // Archive and free some, checkpoint, reopen.
    let mut tx = db.begin_transaction().unwrap();
    tx.archive(blobs[2].0).unwrap();
    tx.archive(blobs[4].0).unwrap();
    let archived = tx.commit().unwrap();
    let mut tx = db.begin_transaction().unwrap();
    tx.checkpoint_to(archived).unwrap();
    tx.commit().unwrap();
    blobs.remove(4);
    blobs.remove(2);
    db.verify().unwrap();
    drop(db);
    let db = recover(mode, dir.path());
    let report = db.verify().unwrap();
    // Freed grains stay in the durable (checkpointed) bitmaps until the
    // next WAL checkpoint.
    assert!(report.grains_checked >= blobs.len() as u64);
    db.checkpoint_wal().unwrap();
    let progress = std::cell::Cell::new((0, 0));
    let report = db
        .verify_report(|done, total| progress.set((done, total)))
        .unwrap();
    assert!(report.is_ok(), "{report}");
    assert_eq!(progress.get(), (blobs.len() as u64, blobs.len() as u64));
    for (id, data) in &blobs {
        assert_blob(&db, *id, data, "healthy after reopen");
    }
    db.shutdown().unwrap();
    let db = recover(mode, dir.path());
    db.verify().unwrap();
    db.shutdown().unwrap();
}

/// One damaged byte in each of several grains (data, length, sequence,
/// CRC; small blobs and a large one far past its first read): each is
/// reported by verify under its id, `get` fails for exactly those, and the
/// undamaged blobs still read back.
#[test]
fn flipped_bytes_in_grains_are_found_and_never_returned() {
    for mode in Mode::BOTH {
        flipped_bytes_in_grains_are_found_and_never_returned_in(mode);
    }
}

fn flipped_bytes_in_grains_are_found_and_never_returned_in(mode: Mode) {
    let dir = tempfile::tempdir().unwrap();
    let db = recover(mode, dir.path());
    let sizes = [0, 1, 100, 1000, 5000, 40_000, 200_000, 3000, 17];
    let blobs = write_blobs(&db, &sizes, 100);
    db.checkpoint_wal().unwrap();
    db.shutdown().unwrap();

    // Check the documented layout against the file before damaging it
    // (an encrypted store's bytes are checked by the damage below).
    for (id, data) in blobs.iter().filter(|_| mode == Mode::Plain) {
        let (path, offset) = grain_location(dir.path(), *id);
        let bytes = std::fs::read(&path).unwrap();
        let start = offset as usize;
        let header = GrainHeader::decode(&bytes[start..start + GRAIN_HEADER_SIZE]).unwrap();
        assert_eq!(header.length as usize, data.len(), "{id}: stored length");
        assert_eq!(
            header.crc,
            grain_crc(header.sequence, data),
            "{id}: stored CRC"
        );
        assert!(
            bytes[start + GRAIN_HEADER_SIZE..start + GRAIN_HEADER_SIZE + data.len()] == data[..],
            "{id}: stored bytes"
        );
    }

    // (blob index, byte within the grain) to damage.
    // (The empty blob at index 0 has its own test below.)
    let mut damage = vec![
        (1, Spot::Data(0)),       // the only data byte
        (2, Spot::Data(50)),      // data
        (3, Spot::Header(3)),     // sequence
        (4, Spot::Header(9)),     // length
        (5, Spot::Header(13)),    // CRC
        (6, Spot::Data(150_000)), // large blob, far in
        (7, Spot::Data(2999)),    // last data byte
    ];
    if mode == Mode::Encrypted {
        damage.push((8, Spot::Seal(1))); // the key id of the header's seal
    }
    let damage: Vec<(usize, u64)> = damage
        .into_iter()
        .map(|(which, spot)| (which, stored_at(mode, spot)))
        .collect();
    let mut damaged = Vec::new();
    for &(which, at) in &damage {
        let (id, _) = &blobs[which];
        let (path, offset) = grain_location(dir.path(), *id);
        flip_byte(&path, offset + at);
        damaged.push((*id, path, offset));
    }

    let db = recover(mode, dir.path());
    for (id, path, offset) in &damaged {
        match db.get(*id) {
            Err(Error::ChecksumMismatch {
                grain,
                path: reported_path,
                offset: reported_offset,
            }) => {
                assert_eq!(grain, *id);
                assert_eq!(&reported_path, path);
                assert_eq!(reported_offset, *offset);
            }
            other => panic!(
                "get of damaged {id} gave {:?}",
                other.map(|d| d.map(|d| d.len()))
            ),
        }
        // Streaming fails too, at the latest at the end.
        match db.read(*id) {
            Err(Error::ChecksumMismatch { grain, .. }) => assert_eq!(grain, *id),
            Ok(Some(mut reader)) => {
                let mut sink = Vec::new();
                let err = reader.read_to_end(&mut sink).unwrap_err();
                assert_eq!(err.kind(), std::io::ErrorKind::InvalidData, "{id}: {err}");
            }
            other => panic!("read of damaged {id} gave {other:?}"),
        }
    }
    for (i, (id, data)) in blobs.iter().enumerate() {
        if !damage.iter().any(|(which, _)| *which == i) {
            assert_blob(&db, *id, data, "undamaged neighbour");
        }
    }

    let result = db.verify();
    let text = match &result {
        Err(e) => e.to_string(),
        Ok(_) => String::new(),
    };
    let report = report_of(result);
    for (id, path, offset) in &damaged {
        assert!(
            text.contains(&id.to_string()),
            "the verify error does not name {id}:\n{text}"
        );
        let problem = report
            .problems
            .iter()
            .find(|p| p.grain == Some(*id))
            .unwrap_or_else(|| panic!("no problem names {id}:\n{report}"));
        let file = path.file_name().unwrap().to_str().unwrap();
        assert!(
            problem.location.contains(file) && problem.location.contains(&offset.to_string()),
            "{id}: location {:?} should name {file} and offset {offset}",
            problem.location
        );
    }
    assert_eq!(
        report.problems.len(),
        damaged.len(),
        "exactly the damaged grains are reported:\n{report}"
    );
    assert_eq!(report.grains_checked, blobs.len() as u64);
    // verify_report gives the same report without failing.
    let again = db.verify_report(|_, _| {}).unwrap();
    assert_eq!(again.problems, report.problems);
    db.shutdown().unwrap();
}

/// An empty blob still has a stored header (sequence, length 0, CRC).
/// Damage to it must be reported by `get` as it is by `verify`.
#[test]
fn a_damaged_header_of_an_empty_blob_is_detected_by_get() {
    for mode in Mode::BOTH {
        a_damaged_header_of_an_empty_blob_is_detected_by_get_in(mode);
    }
}

fn a_damaged_header_of_an_empty_blob_is_detected_by_get_in(mode: Mode) {
    let dir = tempfile::tempdir().unwrap();
    let db = recover(mode, dir.path());
    let blobs = write_blobs(&db, &[0, 0, 10], 50);
    db.checkpoint_wal().unwrap();
    db.shutdown().unwrap();
    // Damage the CRC of the first empty blob and the sequence of the second.
    let (crc_damaged, sequence_damaged) = (blobs[0].0, blobs[1].0);
    let (path, offset) = grain_location(dir.path(), crc_damaged);
    flip_byte(&path, offset + stored_at(mode, Spot::Header(12)));
    let (path, offset) = grain_location(dir.path(), sequence_damaged);
    flip_byte(&path, offset + stored_at(mode, Spot::Header(2)));

    let db = recover(mode, dir.path());
    let report = report_of(db.verify());
    assert!(report.problems.iter().any(|p| p.grain == Some(crc_damaged)));
    assert!(report
        .problems
        .iter()
        .any(|p| p.grain == Some(sequence_damaged)));
    assert_blob(&db, blobs[2].0, &blobs[2].1, "undamaged neighbour");
    let results: Vec<String> = [crc_damaged, sequence_damaged]
        .iter()
        .map(|id| format!("{id}: {:?}", db.get(*id)))
        .collect();
    for id in [crc_damaged, sequence_damaged] {
        assert!(
            matches!(db.get(id), Err(Error::ChecksumMismatch { grain, .. }) if grain == id),
            "verify reports {id} as damaged but get does not fail: {results:?}"
        );
    }
}

#[test]
fn a_truncated_stratum_gives_errors_not_data() {
    for mode in Mode::BOTH {
        a_truncated_stratum_gives_errors_not_data_in(mode);
    }
}

fn a_truncated_stratum_gives_errors_not_data_in(mode: Mode) {
    let dir = tempfile::tempdir().unwrap();
    let db = recover(mode, dir.path());
    let blobs = write_blobs(&db, &[3000, 3000, 3000], 7);
    db.checkpoint_wal().unwrap();
    db.shutdown().unwrap();
    let last = blobs
        .iter()
        .max_by_key(|(id, _)| id.index())
        .map(|(id, _)| *id)
        .unwrap();
    let (path, offset) = grain_location(dir.path(), last);
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(offset + 1000).unwrap();
    drop(file);

    let db = recover(mode, dir.path());
    assert!(
        db.get(last).is_err(),
        "a blob cut short must not be returned"
    );
    let report = report_of(db.verify());
    assert!(
        report.problems.iter().any(|p| p.grain == Some(last)),
        "{report}"
    );
    for (id, data) in &blobs {
        if *id != last {
            assert_blob(&db, *id, data, "blobs before the cut");
        }
    }
}

/// Decodes both copies of the index header; returns (slot, header) of each
/// valid one.
fn index_copies(dir: &Path) -> Vec<(u64, IndexHeader)> {
    let bytes = std::fs::read(dir.join("index")).unwrap();
    (0..2)
        .filter_map(|slot| {
            let start = (slot * INDEX_SLOT_SIZE) as usize;
            let end = (start + INDEX_SLOT_SIZE as usize).min(bytes.len());
            IndexHeader::decode(bytes.get(start..end)?)
                .ok()
                .map(|h| (slot, h))
        })
        .collect()
}

/// A stored blob and its contents.
type Blob = (GrainId, Vec<u8>);

/// Builds a database whose last two checkpoints recorded embedded header
/// `a`, then `b`; returns `a`, `b` and the index file's bytes after the
/// first checkpoint (only `a` recorded).
fn two_checkpoints(dir: &Path) -> (Blob, Blob, Vec<u8>) {
    let db = Database::recover(dir).unwrap();
    let a = write_blobs(&db, &[700], 1).remove(0);
    let mut tx = db.begin_transaction().unwrap();
    tx.set_embedded_header(Some(a.0)).unwrap();
    tx.commit().unwrap();
    db.checkpoint_wal().unwrap();
    let after_first = std::fs::read(dir.join("index")).unwrap();
    let b = write_blobs(&db, &[700], 2).remove(0);
    let mut tx = db.begin_transaction().unwrap();
    tx.set_embedded_header(Some(b.0)).unwrap();
    tx.commit().unwrap();
    db.checkpoint_wal().unwrap();
    db.shutdown().unwrap();
    (a, b, after_first)
}

/// Both index copies are valid and record the same state.
fn assert_index_copies_alike(dir: &Path, embedded: GrainId) {
    let copies = index_copies(dir);
    assert_eq!(copies.len(), 2, "both index copies are valid");
    assert_eq!(copies[0].1, copies[1].1, "the index copies differ");
    assert_eq!(copies[0].1.embedded_header, Some(embedded));
}

/// A checkpoint leaves both index copies alike, so damage to either one,
/// however long after it was written, loses nothing; opening rewrites the
/// damaged copy, so the other one may decay later too.
#[test]
fn a_damaged_index_copy_loses_nothing_and_is_rewritten_at_open() {
    for damaged in 0..2 {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, _) = two_checkpoints(dir.path());
        assert_index_copies_alike(dir.path(), b.0);
        let index = dir.path().join("index");
        flip_byte(&index, damaged * INDEX_SLOT_SIZE + 100);
        assert_eq!(index_copies(dir.path()).len(), 1);

        let db = Database::recover(dir.path()).unwrap();
        assert_eq!(db.embedded_header(), Some(b.0), "damaged copy {damaged}");
        assert_blob(&db, a.0, &a.1, "a");
        assert_blob(&db, b.0, &b.1, "b");
        db.verify().unwrap();
        assert_index_copies_alike(dir.path(), b.0);
        db.shutdown().unwrap();

        // Now the copy that stayed good decays: the rewritten one holds.
        flip_byte(&index, (1 - damaged) * INDEX_SLOT_SIZE + 100);
        let db = Database::recover(dir.path()).unwrap();
        assert_eq!(db.embedded_header(), Some(b.0), "other copy of {damaged}");
        assert_blob(&db, b.0, &b.1, "b");
        db.verify().unwrap();
        db.shutdown().unwrap();
    }
}

/// A crash between a checkpoint's two index writes leaves one copy a
/// checkpoint behind: the newer one counts, and opening catches the other
/// one up, so that damage to the newer one later loses nothing.
#[test]
fn an_index_copy_left_a_checkpoint_behind_is_caught_up_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, after_first) = two_checkpoints(dir.path());
    let index = dir.path().join("index");
    let mut bytes = std::fs::read(&index).unwrap();
    let stale = 0..INDEX_SLOT_SIZE as usize;
    bytes[stale.clone()].copy_from_slice(&after_first[stale]);
    std::fs::write(&index, &bytes).unwrap();
    let copies = index_copies(dir.path());
    assert_eq!(copies[0].1.embedded_header, Some(a.0));
    assert_eq!(copies[1].1.embedded_header, Some(b.0));

    let db = Database::recover(dir.path()).unwrap();
    assert_eq!(db.embedded_header(), Some(b.0));
    db.shutdown().unwrap();
    assert_index_copies_alike(dir.path(), b.0);
    flip_byte(&index, INDEX_SLOT_SIZE + 100);
    let db = Database::recover(dir.path()).unwrap();
    assert_eq!(db.embedded_header(), Some(b.0));
    assert_blob(&db, a.0, &a.1, "a");
    assert_blob(&db, b.0, &b.1, "b");
    db.verify().unwrap();
    db.shutdown().unwrap();
}

/// A new store writes index copy 0 alone; every checkpoint writes both.
/// So a missing copy 1 (the file cut to one slot, or the slot zeroed)
/// beside a copy of a later generation is damage: a read-only `verify`
/// reports it, an open for writing rewrites it and loses nothing. Beside a
/// copy of the first generation it is a store no checkpoint has touched
/// yet, and no problem.
#[test]
fn a_missing_second_index_copy_is_reported_unless_the_store_is_new() {
    let missing = |report: &VerifyReport| {
        report
            .problems
            .iter()
            .filter(|p| {
                p.location.ends_with("index (header copy 1)") && p.description.contains("missing")
            })
            .count()
    };
    for cut in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, _) = two_checkpoints(dir.path());
        let index = dir.path().join("index");
        let mut bytes = std::fs::read(&index).unwrap();
        if cut {
            bytes.truncate(INDEX_SLOT_SIZE as usize);
        } else {
            bytes[INDEX_SLOT_SIZE as usize..].fill(0);
        }
        std::fs::write(&index, &bytes).unwrap();

        let db = Database::open_read_only(dir.path()).unwrap();
        let report = report_of(db.verify());
        assert_eq!(missing(&report), 1, "cut {cut}: {report:?}");
        assert_eq!(report.problems.len(), 1, "cut {cut}: {report:?}");
        db.shutdown().unwrap();
        assert_eq!(std::fs::read(&index).unwrap(), bytes, "verify wrote");

        let db = Database::recover(dir.path()).unwrap();
        assert_blob(&db, a.0, &a.1, "a");
        assert_blob(&db, b.0, &b.1, "b");
        db.verify().unwrap();
        db.shutdown().unwrap();
        assert_index_copies_alike(dir.path(), b.0);
    }

    // A store whose index holds one copy of the first generation, as
    // creating one leaves it until its first checkpoint.
    let dir = tempfile::tempdir().unwrap();
    Database::recover(dir.path()).unwrap().shutdown().unwrap();
    let first = IndexHeader {
        generation: 1,
        ..IndexHeader::default()
    };
    let mut bytes = first.encode();
    bytes.resize(INDEX_SLOT_SIZE as usize, 0);
    std::fs::write(dir.path().join("index"), &bytes).unwrap();
    let db = Database::open_read_only(dir.path()).unwrap();
    db.verify().unwrap();
    db.shutdown().unwrap();
}

/// A torn write can leave the file ending inside copy 1 after all of the
/// copy's header reached the disk (the rest of a copy is zeros): the copy
/// is whole, as an open reads it, and `verify` agrees, in a plain store
/// and an encrypted one.
#[test]
fn a_whole_second_index_copy_in_a_short_file_verifies() {
    for mode in Mode::BOTH {
        let dir = tempfile::tempdir().unwrap();
        let db = recover(mode, dir.path());
        let blob = write_blobs(&db, &[700], 1).remove(0);
        db.checkpoint_wal().unwrap();
        db.shutdown().unwrap();
        let index = dir.path().join("index");
        let mut bytes = std::fs::read(&index).unwrap();
        let slot = INDEX_SLOT_SIZE as usize;
        // Copy 1 ends where its header ends: a plain header fills its
        // slot, a sealed one is an envelope followed by zeros. (Cutting at
        // the last non-zero byte instead would cut into the header
        // whenever its checksum happens to end in a zero byte.)
        let header_len = match mode {
            Mode::Plain => slot,
            Mode::Encrypted => ENVELOPE_HEAD + SEALED_INDEX_BODY + 4,
        };
        assert!(
            bytes[slot + header_len..].iter().all(|b| *b == 0),
            "{mode:?}: copy 1 holds only zeros after its header"
        );
        bytes.truncate(slot + header_len);
        std::fs::write(&index, &bytes).unwrap();

        let db = mode
            .apply(Config::for_directory(dir.path()))
            .read_only(true)
            .open()
            .unwrap();
        db.verify().unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        assert_blob(&db, blob.0, &blob.1, "blob");
        db.shutdown().unwrap();
        let db = recover(mode, dir.path());
        db.verify().unwrap();
        db.shutdown().unwrap();
    }
}

#[test]
fn both_index_copies_damaged_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    two_checkpoints(dir.path());
    let index = dir.path().join("index");
    flip_byte(&index, 20);
    flip_byte(&index, INDEX_SLOT_SIZE + 20);
    match Database::recover(dir.path()) {
        Err(Error::Corrupt { path, .. }) => assert_eq!(path, index),
        other => panic!("opening with no valid index copy gave {other:?}"),
    }
}

/// The stratum of `id`'s header copies: (slot, header) of each valid copy.
fn stratum_copies(dir: &Path, id: GrainId) -> Vec<(u64, StratumHeader)> {
    let (path, _) = grain_location(dir, id);
    let bytes = std::fs::read(path).unwrap();
    let slot = stratum_slot_size(id.basin()) as usize;
    (0..2_u64)
        .filter_map(|copy| {
            let start = copy as usize * slot;
            StratumHeader::decode(&bytes[start..start + slot], id.basin(), id.stratum())
                .ok()
                .map(|h| (copy, h))
        })
        .collect()
}

/// Both header copies of `id`'s stratum are valid and alike.
fn assert_stratum_copies_alike(dir: &Path, id: GrainId) {
    let copies = stratum_copies(dir, id);
    assert_eq!(copies.len(), 2, "both stratum header copies are valid");
    assert_eq!(copies[0].1, copies[1].1, "the stratum header copies differ");
}

/// Two blobs in one stratum, made durable by two checkpoints; returns them
/// and the stratum's header slots (both copies) after the first one, when
/// they held only `a`.
fn stratum_with_two_checkpoints(dir: &Path) -> (Blob, Blob, Vec<u8>) {
    let db = Database::recover(dir).unwrap();
    let a = write_blobs(&db, &[2000], 1).remove(0);
    db.checkpoint_wal().unwrap();
    let (path, _) = grain_location(dir, a.0);
    let headers = 2 * stratum_slot_size(a.0.basin()) as usize;
    let after_first = std::fs::read(&path).unwrap()[..headers].to_vec();
    let b = write_blobs(&db, &[2000], 2).remove(0);
    assert_eq!((a.0.basin(), a.0.stratum()), (b.0.basin(), b.0.stratum()));
    db.checkpoint_wal().unwrap();
    db.shutdown().unwrap();
    (a, b, after_first)
}

/// The case that two copies one state apart would lose: the newest copy
/// decays after its checkpoint, and falling back to the other copy would
/// forget `b` and hand its grains to the next blob of its size.
#[test]
fn a_damaged_stratum_header_copy_loses_nothing_and_is_rewritten_at_open() {
    for damaged in 0..2 {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, _) = stratum_with_two_checkpoints(dir.path());
        assert_stratum_copies_alike(dir.path(), a.0);
        let (path, _) = grain_location(dir.path(), a.0);
        let slot = stratum_slot_size(a.0.basin());
        flip_byte(&path, damaged * slot + 40);
        assert_eq!(stratum_copies(dir.path(), a.0).len(), 1);

        let db = Database::recover(dir.path()).unwrap();
        assert_blob(&db, a.0, &a.1, "a");
        assert_blob(&db, b.0, &b.1, "b");
        db.verify().unwrap();
        assert_stratum_copies_alike(dir.path(), a.0);
        // New blobs of the same size get grains of their own.
        let c = write_blobs(&db, &[2000, 2000], 3);
        for (id, data) in &c {
            assert!(*id != a.0 && *id != b.0, "{id} was handed out twice");
            assert_blob(&db, *id, data, "c");
        }
        assert_blob(&db, b.0, &b.1, "b after new writes");
        db.shutdown().unwrap();

        flip_byte(&path, (1 - damaged) * slot + 40);
        let db = Database::recover(dir.path()).unwrap();
        assert_blob(&db, a.0, &a.1, "a");
        assert_blob(&db, b.0, &b.1, "b");
        for (id, data) in &c {
            assert_blob(&db, *id, data, "c");
        }
        db.verify().unwrap();
        db.shutdown().unwrap();
    }
}

/// A crash between a checkpoint's two header writes leaves one copy a
/// checkpoint behind: the newer one counts, and opening catches the other
/// one up.
#[test]
fn a_stratum_header_copy_left_a_checkpoint_behind_is_caught_up_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, after_first) = stratum_with_two_checkpoints(dir.path());
    let (path, _) = grain_location(dir.path(), a.0);
    let slot = stratum_slot_size(a.0.basin()) as usize;
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[..slot].copy_from_slice(&after_first[..slot]);
    std::fs::write(&path, &bytes).unwrap();
    let copies = stratum_copies(dir.path(), a.0);
    assert!(copies[0].1.generation < copies[1].1.generation);

    let db = Database::recover(dir.path()).unwrap();
    assert_blob(&db, b.0, &b.1, "b");
    db.shutdown().unwrap();
    assert_stratum_copies_alike(dir.path(), a.0);
    flip_byte(&path, slot as u64 + 40);
    let db = Database::recover(dir.path()).unwrap();
    assert_blob(&db, a.0, &a.1, "a");
    assert_blob(&db, b.0, &b.1, "b");
    db.verify().unwrap();
    db.shutdown().unwrap();
}

#[test]
fn a_stratum_with_both_headers_damaged_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _, _) = stratum_with_two_checkpoints(dir.path());
    let (path, _) = grain_location(dir.path(), a.0);
    let slot = stratum_slot_size(a.0.basin());
    flip_byte(&path, 40);
    flip_byte(&path, slot + 40);
    match Database::recover(dir.path()) {
        Err(Error::Corrupt { path: reported, .. }) => assert_eq!(reported, path),
        other => panic!("opening with no valid stratum header gave {other:?}"),
    }
}

/// Opens `dir`, which must fail with `Error::Corrupt` naming `path` and
/// saying `what`; returns the message.
fn open_must_fail_corrupt(dir: &Path, path: &Path, what: &str, case: &str) -> String {
    match Database::recover(dir) {
        Err(err @ Error::Corrupt { .. }) => {
            let message = err.to_string();
            assert!(message.contains(what), "{case}: {message}");
            assert!(
                message.contains(&path.display().to_string()),
                "{case}: {message}"
            );
            message
        }
        Ok(_) => panic!("{case}: the database opened"),
        Err(other) => panic!("{case}: {other}"),
    }
}

/// A stratum file cut back to (part of) its headers looks like one whose
/// creation a crash interrupted; the index's strata count tells them apart,
/// so the store refuses to open instead of starting the stratum afresh and
/// handing out the grains of blobs it forgot.
#[test]
fn a_stratum_cut_back_to_its_headers_is_an_error_not_a_fresh_stratum() {
    for keep in [0, 100, 40_000] {
        let dir = tempfile::tempdir().unwrap();
        let (a, _, _) = stratum_with_two_checkpoints(dir.path());
        let (path, _) = grain_location(dir.path(), a.0);
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(keep.min(2 * stratum_slot_size(a.0.basin())))
            .unwrap();
        drop(file);
        let case = format!("a stratum cut to {keep} bytes");
        open_must_fail_corrupt(dir.path(), &path, "header copies are invalid", &case);
    }
}

#[test]
fn a_missing_stratum_file_is_an_error_not_a_fresh_stratum() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _, _) = stratum_with_two_checkpoints(dir.path());
    let (path, _) = grain_location(dir.path(), a.0);
    std::fs::remove_file(&path).unwrap();
    open_must_fail_corrupt(dir.path(), &path, "missing", "no stratum file");
}

/// A fresh index would forget the embedded header and what the strata
/// hold; with strata and commit logs present, its absence is damage.
#[test]
fn a_missing_index_is_an_error_not_a_fresh_database() {
    let dir = tempfile::tempdir().unwrap();
    stratum_with_two_checkpoints(dir.path());
    let index = dir.path().join("index");
    std::fs::remove_file(&index).unwrap();
    open_must_fail_corrupt(dir.path(), &index, "index file is missing", "no index");
    assert!(!index.exists(), "a failed open must not create a new index");
}

/// The WAL file holding `needle`, and where it is.
fn find_in_wal(dir: &Path, needle: &[u8]) -> (PathBuf, u64) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !name.starts_with("wal-") {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        if let Some(at) = bytes.windows(needle.len()).position(|w| w == needle) {
            return (path, at as u64);
        }
    }
    panic!("the blob is in no WAL file");
}

/// Twenty transactions of one blob each, committed one after another and
/// still only in the WAL; then one byte of the eleventh blob's data in the
/// WAL file flips. The transactions after it were synced after it, so
/// this is damage, not a torn tail: opening must refuse (naming the WAL
/// file), not quietly forget a committed blob while keeping later ones.
/// Point-in-time recovery keeps the ten before it; skipping keeps all but
/// it.
#[test]
fn a_flipped_byte_of_a_committed_blob_in_the_wal_is_an_error_not_a_lost_blob() {
    for mode in [
        None,
        Some(okaywal::RecoveryMode::PointInTime),
        Some(okaywal::RecoveryMode::SkipCorrupted),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::recover(dir.path()).unwrap();
        let blobs: Vec<(GrainId, Vec<u8>)> = (0..20)
            .map(|i| write_blobs(&db, &[200], 7_000 + i * 10).remove(0))
            .collect();
        drop(db); // no shutdown: the blobs stay in the WAL only
        let (wal, at) = find_in_wal(dir.path(), &blobs[10].1);
        flip_byte(&wal, at + 100);
        let open = || {
            let mut config = sediment::Config::for_directory(dir.path());
            if let Some(mode) = mode {
                config = config.wal(|wal| wal.recovery_mode(mode));
            }
            config.open()
        };
        match mode {
            None => {
                let Err(err) = open() else {
                    panic!("a damaged WAL opened silently");
                };
                let message = err.to_string();
                let name = wal.file_name().unwrap().to_string_lossy().to_string();
                assert!(message.contains(&name), "{message}");
            }
            Some(mode) => {
                let db = open().unwrap_or_else(|e| panic!("{mode:?}: {e}"));
                for (i, (id, data)) in blobs.iter().enumerate() {
                    let kept = match mode {
                        okaywal::RecoveryMode::PointInTime => i < 10,
                        _ => i != 10,
                    };
                    let got = db
                        .get(*id)
                        .unwrap_or_else(|e| panic!("{mode:?} blob {i}: {e}"));
                    if kept {
                        assert_eq!(got.as_deref(), Some(&data[..]), "{mode:?}: blob {i}");
                    } else {
                        assert!(got.is_none(), "{mode:?}: blob {i} should be gone");
                    }
                }
                db.shutdown().unwrap();
            }
        }
    }
}

/// A stratum file put back as it was before a checkpoint (a lost write, or
/// a restore from an old copy): its headers are valid, so it opens, but it
/// no longer holds a blob that a commit record lists as written. Only the
/// commit records can tell; `verify` compares them with the strata.
#[test]
fn verify_reports_a_blob_a_commit_record_lists_that_the_strata_lost() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::recover(dir.path()).unwrap();
    let kept = write_blobs(&db, &[100], 1).remove(0);
    db.shutdown().unwrap();
    let (stratum, _) = grain_location(dir.path(), kept.0);
    let before = std::fs::read(&stratum).unwrap();

    let db = Database::recover(dir.path()).unwrap();
    let lost = write_blobs(&db, &[100], 2).remove(0);
    assert_eq!(grain_location(dir.path(), lost.0).0, stratum);
    db.shutdown().unwrap();
    std::fs::write(&stratum, &before).unwrap();

    let db = Database::recover(dir.path()).unwrap();
    assert_blob(&db, kept.0, &kept.1, "the older blob");
    assert_eq!(db.get(lost.0).unwrap(), None);
    let report = report_of(db.verify());
    assert_eq!(report.problems.len(), 1, "{report}");
    let problem = &report.problems[0];
    assert_eq!(problem.grain, Some(lost.0), "{report}");
    assert!(problem.description.contains("not allocated"), "{report}");
    assert!(report.commit_log_damage.is_empty());
    db.shutdown().unwrap();
}

/// A blob overwritten by another whole, checksummed blob of the same length
/// (a misdirected write) passes its own checksum; the CRC its commit record
/// lists does not match.
#[test]
fn verify_reports_a_blob_whose_header_differs_from_its_commit_record() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::recover(dir.path()).unwrap();
    let (id, data) = write_blobs(&db, &[300], 3).remove(0);
    db.shutdown().unwrap();

    let (path, offset) = grain_location(dir.path(), id);
    let mut other = data.clone();
    other[0] ^= 1;
    let header = std::fs::read(&path).unwrap()[offset as usize..][..GRAIN_HEADER_SIZE].to_vec();
    let sequence = GrainHeader::decode(&header).unwrap().sequence;
    let replacement = GrainHeader {
        sequence,
        length: other.len() as u32,
        crc: grain_crc(sequence, &other),
    };
    let mut bytes = std::fs::read(&path).unwrap();
    let at = offset as usize;
    bytes[at..at + GRAIN_HEADER_SIZE].copy_from_slice(&replacement.encode());
    bytes[at + GRAIN_HEADER_SIZE..at + GRAIN_HEADER_SIZE + other.len()].copy_from_slice(&other);
    std::fs::write(&path, bytes).unwrap();

    let db = Database::recover(dir.path()).unwrap();
    let report = report_of(db.verify());
    assert_eq!(report.problems.len(), 1, "{report}");
    let problem = &report.problems[0];
    assert_eq!(problem.grain, Some(id), "{report}");
    assert_eq!(
        problem.location,
        format!("{} offset {offset}", path.display())
    );
    assert!(problem.description.contains("commit record"), "{report}");
    db.shutdown().unwrap();
}

/// A stratum file whose creation was cut short (a crash, or a full disk
/// under the write that made it: an empty file the index does not list)
/// holds no grains. A read-only `verify` reports nothing there, and the
/// next open for writing finishes it.
#[test]
fn a_stratum_whose_creation_was_cut_short_is_no_problem() {
    for mode in Mode::BOTH {
        a_stratum_whose_creation_was_cut_short_is_no_problem_in(mode);
    }
}

fn a_stratum_whose_creation_was_cut_short_is_no_problem_in(mode: Mode) {
    let dir = tempfile::tempdir().unwrap();
    let db = recover(mode, dir.path());
    let blobs = write_blobs(&db, &[100, 5000], 3);
    db.shutdown().unwrap();
    let unfinished = dir.path().join("stratum-12-0");
    assert!(!unfinished.exists());
    std::fs::write(&unfinished, b"").unwrap();

    let read_only = mode
        .apply(Config::for_directory(dir.path()))
        .read_only(true)
        .open()
        .unwrap();
    let report = read_only.verify().unwrap();
    assert!(report.problems.is_empty(), "{report}");
    for (id, data) in &blobs {
        assert_blob(&read_only, *id, data, "beside an unfinished stratum");
    }
    read_only.shutdown().unwrap();
    assert_eq!(std::fs::metadata(&unfinished).unwrap().len(), 0);

    let db = recover(mode, dir.path());
    let report = db.verify().unwrap();
    assert!(report.problems.is_empty(), "{report}");
    db.shutdown().unwrap();
    assert!(std::fs::metadata(&unfinished).unwrap().len() > 0);
}

/// A copy of a store whose files come from different moments (one taken
/// while the store was written, without its lock): a stratum file newer
/// than the index holds blobs of transactions the copy never committed.
/// `verify` names them; it must not call such a copy healthy.
#[test]
fn blobs_of_transactions_the_store_never_committed_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::recover(dir.path()).unwrap();
    let mut tx = db.begin_transaction().unwrap();
    tx.write(&vec![1_u8; 100_000]).unwrap();
    tx.commit().unwrap();
    db.shutdown().unwrap();
    let old = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), old.path().join(entry.file_name())).unwrap();
    }
    // Later transactions, into the same stratum.
    let db = Database::recover(dir.path()).unwrap();
    for n in 2..5_u8 {
        let mut tx = db.begin_transaction().unwrap();
        tx.write(&vec![n; 100_000]).unwrap();
        tx.commit().unwrap();
    }
    db.shutdown().unwrap();
    // The old copy gets the newer stratum files.
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        if name.starts_with("stratum-") || name.starts_with("stamps-") {
            std::fs::copy(entry.path(), old.path().join(&name)).unwrap();
        }
    }
    match sediment::Config::for_directory(old.path())
        .read_only(true)
        .open()
    {
        // Refusing such a copy is right too.
        Err(err) => println!("refused: {err}"),
        Ok(db) => {
            let report = match db.verify() {
                Ok(report) => report,
                Err(Error::Verification(report)) => report,
                Err(other) => panic!("{other}"),
            };
            assert!(
                report
                    .problems
                    .iter()
                    .any(|p| p.description.contains("never committed")),
                "{report:?}"
            );
        }
    }
}
