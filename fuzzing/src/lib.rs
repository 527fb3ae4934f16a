//! The logic of every fuzz target in `../fuzz`, as plain functions.
//!
//! Each takes arbitrary bytes and panics only when it finds a real bug
//! (a panic inside the crates, wrong bytes returned, a lost acknowledged
//! write). `tests/corpus.rs` runs each over its committed seed corpus in
//! `../fuzz/corpus/<target>/`, so CI exercises them on the stable toolchain.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::sync::OnceLock;

use okaywal::format::{RecordHeader, RecordKind, SegmentHeader};
use okaywal::fs::{
    CrashFileSystem, FaultKind, FileSystem, MemoryFileSystem, OpenMode, Operation, PowerLoss,
};
use okaywal::Configuration;
use sediment::format::{GrainHeader, IndexHeader, StratumHeader, BASINS};
use sediment::{CommitRecord, Config, Database, GrainId, SequenceId};
use testkit::recorder::Recorder;

/// The names of the targets, matching `../fuzz/fuzz_targets/*.rs`.
pub const TARGETS: [&str; 5] = [
    "wal_segment",
    "headers",
    "operations",
    "store_files",
    "sealed_store_files",
];

/// Runs target `name` on `data`.
pub fn run(name: &str, data: &[u8]) {
    match name {
        "wal_segment" => wal_segment(data),
        "headers" => headers(data),
        "operations" => operations(data),
        "store_files" => store_files(data),
        "sealed_store_files" => sealed_store_files(data),
        other => panic!("unknown fuzz target {other}"),
    }
}

/// What recovery handed over: each recovered entry's id and chunks, and
/// no aborted entry (recovery only presents complete entries whose chunks
/// verified).
fn recovered(recorder: &Recorder) -> Vec<(u64, Vec<Vec<u8>>)> {
    let seen = recorder.seen();
    assert!(
        seen.aborted.is_empty(),
        "recovery presented aborted entries {:?}",
        seen.aborted
    );
    seen.recovered.clone()
}

/// Segment parsing: the input becomes the contents of a segment file
/// (after a valid header when the first byte is even, so the records are
/// reached); opening the log must not panic, every recovered entry must
/// read back with valid CRCs, and the log must keep working after it.
pub fn wal_segment(data: &[u8]) {
    let fs = MemoryFileSystem::new();
    let dir = Path::new("/log");
    fs.create_dir_all(dir).unwrap();
    let mut contents = Vec::new();
    if data.first().is_some_and(|b| b % 2 == 0) {
        contents.extend(
            SegmentHeader {
                first_entry_id: 1,
                previous: None,
                version_info: Vec::new(),
            }
            .encode(),
        );
        contents.extend_from_slice(&data[1..]);
    } else {
        contents.extend_from_slice(data);
    }
    let file = fs.open(&dir.join("wal-1"), OpenMode::Create).unwrap();
    file.write_all_at(&contents, 0).unwrap();
    let config = || {
        Configuration::default_for(dir)
            .file_system(fs.clone())
            .preallocate_bytes(64 * 1024)
            .checkpoint_after_bytes(64 * 1024)
    };
    let recorder = Recorder::new();
    let Ok(log) = config().open(recorder.clone()) else {
        return; // A clear error is an acceptable answer to garbage.
    };
    let before = recovered(&recorder);
    let mut ids: Vec<u64> = before.iter().map(|(id, _)| *id).collect();
    let sorted = {
        let mut s = ids.clone();
        s.sort_unstable();
        s.dedup();
        s
    };
    assert_eq!(
        ids, sorted,
        "entries were not recovered once each in id order"
    );
    // The log continues after whatever it found.
    let mut entry = log.begin_entry().unwrap();
    let new_id = entry.id().0;
    assert!(
        ids.iter().all(|id| *id < new_id),
        "entry ids went backwards"
    );
    entry.write_chunk(b"after the fuzzed segment").unwrap();
    entry.commit().unwrap();
    log.shutdown().unwrap();
    drop(log);
    let again = Recorder::new();
    let log = config().open(again.clone()).unwrap();
    let recovered = recovered(&again);
    ids.push(new_id);
    assert!(
        recovered
            .iter()
            .any(|(id, chunks)| *id == new_id
                && chunks == &vec![b"after the fuzzed segment".to_vec()])
            || log
                .read_at(okaywal::LogPosition {
                    file_id: new_id,
                    offset: 512
                })
                .is_err(),
        "the entry committed after recovery was lost"
    );
    log.shutdown().unwrap();
}

/// Header and record parsers: decoding arbitrary bytes must not panic, and
/// whatever decodes must encode back to something that decodes the same.
pub fn headers(data: &[u8]) {
    if let Ok(header) = SegmentHeader::decode(data) {
        assert_eq!(SegmentHeader::decode(&header.encode()).unwrap(), header);
    }
    let salt = data
        .get(..8)
        .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()));
    for start in 0..data.len().min(64) {
        if let Ok(header) = RecordHeader::decode(&data[start..], salt) {
            assert_eq!(
                RecordHeader::decode(&header.encode(salt), salt).unwrap(),
                header
            );
            assert!(matches!(
                header.kind,
                RecordKind::Chunk | RecordKind::Commit | RecordKind::Rollback | RecordKind::Padding
            ));
        }
    }
    if let Ok(header) = IndexHeader::decode(data) {
        assert_eq!(IndexHeader::decode(&header.encode()).unwrap(), header);
    }
    let basin = data.first().map_or(0, |b| b % BASINS as u8);
    if let Ok(header) = StratumHeader::decode(data, basin, 0) {
        assert_eq!(
            StratumHeader::decode(&header.encode(), basin, 0).unwrap(),
            header
        );
    }
    let _ = GrainHeader::decode(data);
    if let Ok(record) = CommitRecord::decode(data) {
        let mut bytes = Vec::new();
        record.encode(&mut bytes);
        assert_eq!(CommitRecord::decode(&bytes).unwrap(), record);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(id) = text.parse::<GrainId>() {
            assert_eq!(id.to_string().parse::<GrainId>().unwrap(), id);
        }
    }
}

/// Reads bytes as a little program of database operations.
struct Program<'a> {
    data: &'a [u8],
}

impl Program<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (first, rest) = self.data.split_first()?;
        self.data = rest;
        Some(*first)
    }
}

fn blob(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn open_db(fs: &CrashFileSystem) -> sediment::Result<Database> {
    Config::for_directory("/db")
        .file_system(fs.clone())
        .wal(|wal| {
            wal.preallocate_bytes(32 * 1024)
                .checkpoint_after_bytes(32 * 1024)
        })
        .direct_write_bytes(2048)
        .open()
}

/// Random operation sequences with crashes, against a model: every
/// acknowledged blob that was never archived must read back exactly after
/// any crash, and `verify` must stay clean.
pub fn operations(data: &[u8]) {
    let fs = CrashFileSystem::new();
    let mut program = Program { data };
    let mut db = Some(open_db(&fs).expect("a fresh database opens"));
    // Acknowledged, never archived: grain → bytes.
    let mut model: BTreeMap<GrainId, Vec<u8>> = BTreeMap::new();
    let mut last_archive = None;
    let mut steps = 0;
    while let Some(op) = program.byte() {
        steps += 1;
        if steps > 64 {
            break;
        }
        let current = db.as_ref().expect("open");
        match op % 8 {
            0..=2 => {
                // A transaction: some writes, maybe an archive, commit or not.
                let Ok(mut tx) = current.begin_transaction() else {
                    continue;
                };
                let mut written = Vec::new();
                let count = program.byte().unwrap_or(1) % 4;
                let mut failed = false;
                for _ in 0..count {
                    let size = match program.byte().unwrap_or(0) {
                        s @ 0..=200 => usize::from(s) * 7,
                        s => usize::from(s) * 40,
                    };
                    let bytes = blob(op, size);
                    match tx.write(&bytes) {
                        Ok(grain) => written.push((grain, bytes)),
                        Err(_) => failed = true,
                    }
                }
                let mut archived = None;
                if op % 3 == 1 {
                    if let Some(victim) = model.keys().next().copied() {
                        if tx.archive(victim).is_ok() {
                            archived = Some(victim);
                        }
                    }
                }
                if op % 3 == 2 {
                    if let Some(sequence) = last_archive {
                        let _ = tx.checkpoint_to(sequence);
                    }
                }
                if let Some(victim) = archived {
                    // Once offered for archiving, a blob may vanish.
                    model.remove(&victim);
                }
                let commit = !failed && program.byte().unwrap_or(1) % 5 != 0;
                if commit {
                    if let Ok(sequence) = tx.commit() {
                        for (grain, bytes) in written {
                            model.insert(grain, bytes);
                        }
                        if archived.is_some() {
                            last_archive = Some(sequence);
                        }
                    }
                } else {
                    tx.rollback();
                }
            }
            3 => {
                let _ = current.checkpoint_wal();
            }
            4 => {
                let nth = u64::from(program.byte().unwrap_or(0) % 8);
                let at = fs.operation_count(Operation::Sync) + nth;
                fs.inject(Operation::Sync, at, FaultKind::PowerOff);
            }
            _ => {
                // Power loss now (or after an injected fault fired).
                let policy = match program.byte().unwrap_or(0) % 4 {
                    0 => PowerLoss::Clean,
                    1 => PowerLoss::TornPrefix,
                    2 => PowerLoss::SectorHole,
                    n => PowerLoss::Random(u64::from(n) * 7919 + steps),
                };
                drop(db.take());
                fs.power_loss(policy);
                let reopened =
                    open_db(&fs).unwrap_or_else(|e| panic!("reopen after power loss failed: {e}"));
                check(&reopened, &model);
                db = Some(reopened);
            }
        }
    }
    // A planned power cut may still be pending (or fire while checking,
    // when the background checkpointer syncs): cancel it, and if the power
    // already went out, recover first.
    fs.clear_faults();
    let mut current = db.take().expect("open");
    if fs.is_powered_off() {
        drop(current);
        fs.power_loss(PowerLoss::Clean);
        current = open_db(&fs).unwrap_or_else(|e| panic!("reopen after power loss failed: {e}"));
    }
    check(&current, &model);
}

fn check(db: &Database, model: &BTreeMap<GrainId, Vec<u8>>) {
    for (grain, bytes) in model {
        let stored = db
            .get(*grain)
            .unwrap_or_else(|e| panic!("get {grain}: {e}"));
        assert_eq!(
            stored.as_deref(),
            Some(&bytes[..]),
            "acknowledged blob {grain} is wrong or missing"
        );
    }
    if let Err(err) = db.verify() {
        panic!("verify failed: {err}");
    }
}

/// A small database as it lies on disk after its last transaction, with
/// what it holds: the base that `store_files` damages.
struct Image {
    /// Every file of the database directory, sorted by name.
    files: Vec<(String, Vec<u8>)>,
    /// Blobs the database holds: grain → bytes.
    live: BTreeMap<GrainId, Vec<u8>>,
    /// Blobs archived (some freed, some not yet) whose grains were not
    /// reused: they may read back, but only with exactly these bytes.
    archived: BTreeMap<GrainId, Vec<u8>>,
    /// The embedded header, set before the checkpoint.
    embedded: Option<GrainId>,
}

/// The key of the encrypted image.
fn image_key() -> okaywal::encryption::StaticKey {
    okaywal::encryption::StaticKey::new([0xA5; 32])
}

/// The image's configuration: `sealed` opens it encrypted (format
/// version 2, its WAL encrypted too) with [`image_key`].
fn image_config(fs: &MemoryFileSystem, sealed: bool) -> Config {
    let config = image_config_plain(fs);
    if sealed {
        config.encryption(image_key())
    } else {
        config
    }
}

fn image_config_plain(fs: &MemoryFileSystem) -> Config {
    Config::for_directory("/db")
        .file_system(fs.clone())
        .wal(|wal| {
            // No automatic checkpoint: what sits in the WAL and what in the
            // strata is decided below, the same in every run.
            wal.preallocate_bytes(32 * 1024)
                .checkpoint_after_bytes(16 * 1024 * 1024)
        })
        .direct_write_bytes(2048)
}

fn build_image(sealed: bool) -> Image {
    let fs = MemoryFileSystem::new();
    let db = image_config(&fs, sealed)
        .open()
        .expect("a fresh database opens");
    let mut live = BTreeMap::new();
    let mut archived = BTreeMap::new();
    let write = |sizes: &[usize], seed: u8, archive: &[GrainId], checkpoint: Option<u64>| {
        let mut tx = db.begin_transaction().unwrap();
        let mut written = Vec::new();
        for (i, size) in sizes.iter().enumerate() {
            let bytes = blob(seed.wrapping_add(i as u8), *size);
            written.push((tx.write(&bytes).unwrap(), bytes));
        }
        for grain in archive {
            tx.archive(*grain).unwrap();
        }
        if let Some(sequence) = checkpoint {
            tx.checkpoint_to(SequenceId(sequence)).unwrap();
        }
        let sequence = tx.commit().unwrap();
        (written, sequence)
    };
    // Blobs of several size classes, one written straight into a stratum.
    let (first, _) = write(&[0, 10, 100, 700, 3000, 5000], 1, &[], None);
    live.extend(first.iter().cloned());
    let (second, archived_at) = write(&[40, 2500], 2, &[first[1].0, first[4].0], None);
    live.extend(second);
    let (third, _) = write(&[16, 1200], 3, &[], Some(archived_at.0));
    live.extend(third);
    for (grain, _) in [&first[1], &first[4]] {
        let bytes = live.remove(grain).unwrap();
        archived.insert(*grain, bytes);
    }
    let embedded = Some(first[0].0);
    let mut tx = db.begin_transaction().unwrap();
    tx.set_embedded_header(embedded).unwrap();
    tx.commit().unwrap();
    // Into the strata and the commit log; what follows stays in the WAL.
    db.checkpoint_wal().unwrap();
    let (fourth, _) = write(&[1, 300, 4096], 4, &[first[2].0], None);
    live.extend(fourth);
    archived.insert(first[2].0, live.remove(&first[2].0).unwrap());
    let (fifth, _) = write(&[64, 64, 9000], 5, &[], None);
    live.extend(fifth);
    // An archived grain that was reused holds another blob now.
    archived.retain(|grain, _| !live.contains_key(grain));
    drop(db);
    let dir = Path::new("/db");
    let mut names = fs.list_files(dir).unwrap();
    names.sort();
    let files = names
        .into_iter()
        .map(|name| {
            let file = fs.open(&dir.join(&name), OpenMode::Read).unwrap();
            let mut bytes = vec![0; usize::try_from(file.len().unwrap()).unwrap()];
            file.read_exact_at(&mut bytes, 0).unwrap();
            (name, bytes)
        })
        .collect();
    Image {
        files,
        live,
        archived,
        embedded,
    }
}

fn image(sealed: bool) -> &'static Image {
    static PLAIN: OnceLock<Image> = OnceLock::new();
    static SEALED: OnceLock<Image> = OnceLock::new();
    match sealed {
        false => PLAIN.get_or_init(|| build_image(false)),
        true => SEALED.get_or_init(|| build_image(true)),
    }
}

/// The operation byte of a `store_files` edit that removes the file (any
/// other value picks a bit flip, a set byte, a lost sector or a truncation
/// by its value mod 4).
const REMOVE_FILE: u8 = 0x7F;

/// Damaged store files: the input is a list of edits (6 bytes each: file,
/// operation, offset) to the files of a small database whose blobs lie in
/// strata, in the commit log and in the WAL. Opening it must not panic;
/// if it opens, no blob may read back with other bytes than it was written
/// with. An error is a fine answer to damage; `None` only when the WAL or
/// the commit log was damaged or removed, because damage to the strata or
/// the index, or their removal, must never make the store forget a blob
/// silently. `verify`, `stats`, `commit_log` and a new transaction must not
/// panic, and the new blob must not take the grains of a live one.
pub fn store_files(data: &[u8]) {
    damaged_store(data, false);
}

/// [`store_files`] on an encrypted store (format version 2: sealed
/// blobs, stratum headers, index and commit log, and an encrypted WAL),
/// opened with its key: the same edits must never make a blob read back
/// with other bytes, so a changed, cut or zeroed sealed unit is an error
/// or (in the logs) a torn tail, never data.
pub fn sealed_store_files(data: &[u8]) {
    damaged_store(data, true);
}

fn damaged_store(data: &[u8], sealed: bool) {
    let image = image(sealed);
    let fs = MemoryFileSystem::new();
    let dir = Path::new("/db");
    fs.create_dir_all(dir).unwrap();
    let mut files: Vec<(String, Vec<u8>)> = image.files.clone();
    // Damage to the logs may look like a torn tail, which legitimately
    // drops the entries it cut; damage to strata and the index may not.
    let mut logs_touched = false;
    let mut removed = vec![false; files.len()];
    for edit in data.chunks_exact(6).take(8) {
        let which = usize::from(edit[0]) % image.files.len();
        let (name, bytes) = &mut files[which];
        logs_touched |= name.starts_with("wal") || name.starts_with("commits");
        let offset = u32::from_le_bytes(edit[2..6].try_into().unwrap()) as usize;
        let op = edit[1];
        if op == REMOVE_FILE {
            removed[which] = true;
            continue;
        }
        if bytes.is_empty() {
            continue;
        }
        let at = offset % bytes.len();
        match op % 4 {
            0 => bytes[at] ^= 1 << (op >> 5),
            1 => bytes[at] = op,
            2 => {
                // A lost sector: 512 aligned bytes read back as zeros.
                let start = at / 512 * 512;
                let end = (start + 512).min(bytes.len());
                bytes[start..end].fill(0);
            }
            _ => bytes.truncate(at),
        }
    }
    for (name, bytes) in files
        .iter()
        .zip(&removed)
        .filter(|(_, gone)| !**gone)
        .map(|(f, _)| f)
    {
        let file = fs.open(&dir.join(name), OpenMode::Create).unwrap();
        file.write_all_at(bytes, 0).unwrap();
    }
    let db = match image_config(&fs, sealed).open() {
        Ok(db) => db,
        Err(err) => {
            // Refusing to open is a fine answer to damage, if it says why.
            assert!(!err.to_string().is_empty(), "an empty error message");
            return;
        }
    };
    // An error is fine: the damage may have taken the blob.
    let expect = |grain: &GrainId, bytes: &[u8]| match db.get(*grain) {
        Ok(Some(stored)) => assert_eq!(
            stored, bytes,
            "blob {grain} read back with other bytes after damage"
        ),
        Ok(None) => assert!(
            logs_touched,
            "blob {grain} was forgotten without an error after damage to strata or the index"
        ),
        Err(_) => {}
    };
    if !logs_touched {
        // It lives in the index: losing it silently loses the root of
        // whatever the application built on the store.
        assert_eq!(
            db.embedded_header(),
            image.embedded,
            "the embedded header changed after damage to strata or the index"
        );
    }
    for (grain, bytes) in &image.live {
        expect(grain, bytes);
        if let Ok(Some(mut reader)) = db.read(*grain) {
            let mut stored = Vec::new();
            if io::Read::read_to_end(&mut reader, &mut stored).is_ok() {
                assert_eq!(&stored, bytes, "blob {grain} streamed other bytes");
            }
        }
    }
    for (grain, bytes) in &image.archived {
        // An archived blob may be freed by now: `None` is fine.
        if let Ok(Some(stored)) = db.get(*grain) {
            assert_eq!(&stored, bytes, "archived blob {grain} read back wrong");
        }
    }
    // Ids nobody wrote: answers, not panics.
    for word in data.chunks_exact(8).take(4) {
        if let Ok(grain) = GrainId::from_u64(u64::from_le_bytes(word.try_into().unwrap())) {
            let _ = db.get(grain);
        }
    }
    let _ = db.verify();
    let _ = db.stats();
    if let Ok(log) = db.commit_log(SequenceId(0)) {
        let _ = log.count();
    }
    // The database keeps working, or refuses to with an error.
    if let Ok(mut tx) = db.begin_transaction() {
        let bytes = blob(9, 777);
        if let Ok(grain) = tx.write(&bytes) {
            if tx.commit().is_ok() {
                if let Ok(stored) = db.get(grain) {
                    assert_eq!(
                        stored.as_deref(),
                        Some(&bytes[..]),
                        "a blob committed after the damage read back wrong"
                    );
                }
            }
        }
    }
    // The new blob's grains must not have been taken from a blob that the
    // damage made the store forget: its id would then read another blob.
    for (grain, bytes) in &image.live {
        expect(grain, bytes);
    }
    let _ = db.shutdown();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The undamaged image must hold what `store_files` checks against,
    /// spread over every kind of file, or the target tests nothing.
    #[test]
    fn the_store_image_reads_back_whole_and_spans_every_kind_of_file() {
        image_reads_back_whole(false);
    }

    /// The same for the encrypted image of `sealed_store_files`, which
    /// must really be encrypted: it does not open without its key.
    #[test]
    fn the_sealed_store_image_reads_back_whole_and_needs_its_key() {
        image_reads_back_whole(true);
        let fs = MemoryFileSystem::new();
        let dir = Path::new("/db");
        fs.create_dir_all(dir).unwrap();
        for (name, bytes) in &image(true).files {
            let file = fs.open(&dir.join(name), OpenMode::Create).unwrap();
            file.write_all_at(bytes, 0).unwrap();
        }
        assert!(image_config(&fs, false).open().is_err());
    }

    fn image_reads_back_whole(sealed: bool) {
        let image = image(sealed);
        for (name, bytes) in &image.files {
            println!("{name}: {} bytes", bytes.len());
        }
        let has = |prefix: &str| image.files.iter().any(|(n, _)| n.starts_with(prefix));
        assert!(has("index") && has("stratum-") && has("commits-") && has("wal-"));
        assert!(image.live.len() >= 12 && !image.archived.is_empty());
        let fs = MemoryFileSystem::new();
        let dir = Path::new("/db");
        fs.create_dir_all(dir).unwrap();
        for (name, bytes) in &image.files {
            let file = fs.open(&dir.join(name), OpenMode::Create).unwrap();
            file.write_all_at(bytes, 0).unwrap();
        }
        let db = image_config(&fs, sealed).open().unwrap();
        for (grain, bytes) in &image.live {
            assert_eq!(db.get(*grain).unwrap().as_deref(), Some(&bytes[..]));
        }
        // Archived blobs stay readable until a `checkpoint_to` frees them.
        let mut freed = 0;
        for (grain, bytes) in &image.archived {
            match db.get(*grain).unwrap() {
                None => freed += 1,
                Some(stored) => assert_eq!(&stored, bytes),
            }
        }
        assert!(freed >= 1 && freed < image.archived.len());
        // Some of the blobs are still only in the WAL.
        assert!(db.checkpointed_to() < db.last_committed());
        db.verify().unwrap();
    }
}

// The Rust examples in the workspace's README.md run as doctests here (this
// crate depends on both libraries and is not published), so they stay in
// step with the API.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct WorkspaceReadmeDoctests;
