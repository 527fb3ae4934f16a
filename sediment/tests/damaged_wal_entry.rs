//! A damaged byte in a committed WAL entry never makes a transaction
//! vanish while the store opens and serves a later one.
//!
//! Two runs of the store each commit one transaction and then crash
//! before any checkpoint (the second run's commit written through okaywal
//! directly, see `common::second_run_without_a_checkpoint`): the first
//! transaction's entry sits in the WAL segment the first run wrote, the
//! second's in the segment the second run's open started. Every byte of
//! the first segment is flipped in turn: the store either refuses to open
//! with an error naming the damaged WAL file, or serves the first
//! transaction's blobs exactly and knows the second.

mod common;

use std::path::Path;

use common::blob;
use okaywal::fs::{CrashFileSystem, FileSystem, MemoryFileSystem, OpenMode};
use sediment::{Config, Database, GrainId};

const DIR: &str = "/store";

fn config<F: FileSystem>(fs: F) -> Config {
    // Segments large enough that nothing is checkpointed.
    Config::for_directory(DIR).file_system(fs).wal(|wal| {
        wal.checkpoint_after_bytes(1 << 20)
            .preallocate_bytes(64 << 10)
    })
}

type Blobs = Vec<(GrainId, Vec<u8>)>;

fn commit(db: &Database, tag: u64, sizes: &[usize]) -> Blobs {
    let mut tx = db.begin_transaction().expect("begin");
    let blobs: Blobs = sizes
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let data = blob(tag * 100 + i as u64, len);
            (tx.write(&data).expect("write"), data)
        })
        .collect();
    tx.commit().expect("commit");
    blobs
}

fn files(fs: &dyn FileSystem) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    for name in fs.list_files(Path::new(DIR)).expect("list") {
        let file = fs
            .open(&Path::new(DIR).join(&name), OpenMode::Read)
            .expect("open");
        let mut bytes = vec![0; file.len().expect("len") as usize];
        file.read_exact_at(&mut bytes, 0).expect("read");
        files.push((name, bytes));
    }
    files.sort();
    files
}

fn open_copy(files: &[(String, Vec<u8>)]) -> sediment::Result<Database> {
    let fs = MemoryFileSystem::new();
    fs.create_dir_all(Path::new(DIR)).expect("mkdir");
    for (name, bytes) in files {
        let file = fs
            .open(&Path::new(DIR).join(name), OpenMode::CreateNew)
            .expect("create");
        file.write_all_at(bytes, 0).expect("write");
    }
    config(fs).open()
}

/// Files by name, with their bytes.
type Files = Vec<(String, Vec<u8>)>;

/// The two runs: the files they leave, the indexes of the WAL segments
/// among them, the first run's blobs and the second run's sequence.
fn two_runs() -> (Files, Vec<usize>, Blobs, sediment::SequenceId) {
    let fs = CrashFileSystem::new();
    // A transaction of eight blobs, one of them large enough to go
    // straight into its grains; then the process dies.
    let db = config(fs.clone()).open().expect("create");
    let first = commit(&db, 1, &[40, 300, 1000, 17, 70_290, 5, 64, 2000]);
    drop(db);
    // The next run commits a transaction and dies before any checkpoint.
    let second = common::second_run_without_a_checkpoint(
        okaywal::Configuration::default_for(DIR)
            .file_system(fs.clone())
            .preallocate_bytes(64 << 10),
    );
    let files = files(&fs);
    let segments: Vec<usize> = files
        .iter()
        .enumerate()
        .filter(|(_, (name, _))| {
            name.strip_prefix("wal-")
                .is_some_and(|id| id.parse::<u64>().is_ok())
        })
        .map(|(i, _)| i)
        .collect();
    assert_eq!(
        segments.len(),
        2,
        "{:?}",
        files.iter().map(|f| &f.0).collect::<Vec<_>>()
    );
    (files, segments, first, second)
}

#[test]
fn a_flipped_byte_in_an_earlier_wal_segment_is_an_error_not_a_lost_transaction() {
    let (files, segments, first, second) = two_runs();
    let earlier = *segments
        .iter()
        .min_by_key(|&&i| files[i].0[4..].parse::<u64>().unwrap())
        .unwrap();
    let name = files[earlier].0.clone();
    let written = files[earlier]
        .1
        .iter()
        .rposition(|b| *b != 0)
        .map_or(0, |last| last + 1);

    // Undamaged, both transactions are there.
    let db = open_copy(&files).expect("the undamaged store opens");
    for (id, data) in &first {
        assert_eq!(db.get(*id).expect("get").as_deref(), Some(&data[..]));
    }
    assert_eq!(db.last_committed(), second);
    drop(db);

    let (mut refused, mut served) = (0, 0);
    for offset in 512..written {
        let mut damaged = files.clone();
        damaged[earlier].1[offset] ^= 0x5a;
        match open_copy(&damaged) {
            Err(err) => {
                let message = err.to_string();
                assert!(
                    message.contains(&name),
                    "byte {offset} of {name}: the error names the file: {message}"
                );
                refused += 1;
            }
            Ok(db) => {
                assert_eq!(
                    db.last_committed(),
                    second,
                    "byte {offset} of {name} flipped"
                );
                for (id, data) in &first {
                    let got = db.get(*id).unwrap_or_else(|e| {
                        panic!("byte {offset} of {name} flipped: get {id} failed: {e}")
                    });
                    assert_eq!(
                        got.as_deref(),
                        Some(&data[..]),
                        "byte {offset} of {name} flipped: blob {id} lost or changed \
                         while the store opened"
                    );
                }
                served += 1;
            }
        }
    }
    println!("{name}: {refused} flips refused, {served} served everything");
    assert!(refused > 0, "no flip was noticed");
}
