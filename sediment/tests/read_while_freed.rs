//! A blob read by one thread while another archives it and checkpoints
//! past it, so that its grains are freed and reused by the next blob at
//! once. The reader gets the blob, `None`, or the blob committed there
//! since: never an error that calls a healthy store damaged. Blobs of
//! 64 KiB and more are written straight into their grains before their
//! transaction commits, so a read that overlaps their reuse sees another
//! blob's bytes under the first one's checksum.

mod common;

use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sediment::{Config, Database, Error, GrainId};

/// Blob `n`: `len` bytes of `n % 251`, so any read shows whose it is.
fn blob(n: u64, len: usize) -> Vec<u8> {
    vec![(n % 251) as u8; len]
}

/// Checks that `data` is some whole blob written by the loop.
fn assert_some_blob(data: &[u8], len: usize, context: &str) {
    assert_eq!(data.len(), len, "{context}: length");
    assert!(
        data.iter().all(|b| *b == data[0]),
        "{context}: bytes of two blobs"
    );
}

/// One thread writes a blob, archives it and checkpoints past it, over
/// and over, so the same grains are reused each time; the other reads
/// the id it was just given, through `get` and through `read`.
fn reads_while_freed(db: &Database, len: usize, run_for: Duration) -> (u64, u64) {
    let latest = AtomicU64::new(u64::MAX);
    let stop = AtomicBool::new(false);
    let (mut gets, mut freed_streams) = (0, 0);
    std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            let deadline = Instant::now() + run_for;
            let mut n = 0;
            while Instant::now() < deadline {
                let mut tx = db.begin_transaction().unwrap();
                let id = tx.write(&blob(n, len)).unwrap();
                tx.commit().unwrap();
                latest.store(id.as_u64(), Ordering::Release);
                common::free(db, id);
                n += 1;
            }
            stop.store(true, Ordering::Release);
            n
        });
        while !stop.load(Ordering::Acquire) {
            let raw = latest.load(Ordering::Acquire);
            if raw == u64::MAX {
                std::thread::yield_now();
                continue;
            }
            let id = GrainId::from_u64(raw).unwrap();
            match db.get(id) {
                Ok(Some(data)) => assert_some_blob(&data, len, "get"),
                Ok(None) => {}
                Err(err) => panic!("get({id}) of a healthy store: {err}"),
            }
            gets += 1;
            if let Some(mut reader) = db.read(id).unwrap() {
                let mut data = Vec::new();
                match reader.read_to_end(&mut data) {
                    Ok(_) => assert_some_blob(&data, len, "read"),
                    Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                        assert!(err.to_string().contains("freed"), "{err}");
                        freed_streams += 1;
                    }
                    Err(err) => panic!("read({id}) of a healthy store: {err}"),
                }
            }
        }
        assert!(writer.join().unwrap() > 10, "the writer hardly ran");
    });
    (gets, freed_streams)
}

#[test]
fn a_blob_freed_and_reused_while_it_is_read_is_never_reported_as_damage() {
    for len in [70_000, 200_000] {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::recover(dir.path()).unwrap();
        let (gets, freed) = reads_while_freed(&db, len, Duration::from_secs(2));
        assert!(gets > 10, "{len}: only {gets} gets");
        println!("{len} bytes: {gets} gets, {freed} streams freed while read");
        let report = db.verify().unwrap();
        assert!(report.is_ok(), "{report:?}");
        db.shutdown().unwrap();
    }
}

#[test]
fn the_same_holds_in_an_encrypted_store() {
    let dir = tempfile::tempdir().unwrap();
    let db = Config::for_directory(dir.path())
        .encryption(common::test_key())
        .open()
        .unwrap();
    let (gets, _) = reads_while_freed(&db, 200_000, Duration::from_secs(2));
    assert!(gets > 10, "only {gets} gets");
    db.shutdown().unwrap();
}

#[test]
fn damage_is_still_damage_when_nothing_is_freed() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::recover(dir.path()).unwrap();
    let mut tx = db.begin_transaction().unwrap();
    let id = tx.write(&blob(7, 200_000)).unwrap();
    tx.commit().unwrap();
    db.shutdown().unwrap();
    // Flip a byte in the blob's data, past the first 64 KiB.
    let stratum = common::files_with_prefix(dir.path(), "stratum-")
        .into_iter()
        .map(|name| dir.path().join(name))
        .find(|path| {
            std::fs::read(path)
                .unwrap()
                .windows(64)
                .any(|w| w.iter().all(|b| *b == 7))
        })
        .expect("the blob's stratum");
    let mut bytes = std::fs::read(&stratum).unwrap();
    let at = bytes
        .windows(64)
        .position(|w| w.iter().all(|b| *b == 7))
        .unwrap()
        + 100_000;
    bytes[at] ^= 0xFF;
    std::fs::write(&stratum, bytes).unwrap();
    let db = Database::recover(dir.path()).unwrap();
    match db.get(id) {
        Err(Error::ChecksumMismatch { grain, .. }) => assert_eq!(grain, id),
        other => panic!("{other:?}"),
    }
}
