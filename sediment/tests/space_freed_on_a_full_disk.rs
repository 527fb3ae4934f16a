//! A store on a disk that it filled to the last byte, written the way the
//! `sediment` command writes (open, one transaction, shut down), still
//! opens for writing, so that archiving and checkpointing can free space;
//! then new blobs go into the freed grains, and every blob acknowledged
//! before is intact, also across the opens that follow. The store lives
//! on a small tmpfs mounted by the test (which needs root, as CI has;
//! elsewhere the test says it skips).

use std::io::ErrorKind;
use std::path::Path;

use testkit::disk::Tmpfs;

use sediment::{Database, Error, GrainId};

fn full(err: &Error) -> bool {
    std::error::Error::source(err)
        .and_then(|source| source.downcast_ref::<std::io::Error>())
        .is_some_and(|io| io.kind() == ErrorKind::StorageFull)
        || err.to_string().contains("No space left")
}

/// Opens, writes one blob of `len` bytes of `fill`, commits, shuts down.
fn put(store: &Path, len: usize, fill: u8) -> Result<GrainId, Error> {
    let db = Database::recover(store)?;
    let written: Result<GrainId, Error> = (|| {
        let mut tx = db.begin_transaction()?;
        let id = tx.write(&vec![fill; len])?;
        tx.commit()?;
        Ok(id)
    })();
    let shutdown = db.shutdown();
    let id = written?;
    // The blob is committed (durable) whatever the shutdown said.
    let _ = shutdown;
    Ok(id)
}

#[test]
fn a_store_that_filled_its_disk_opens_to_free_space() {
    let dir = tempfile::tempdir().unwrap();
    let disk = match Tmpfs::mount(&dir.path().join("disk"), "16m") {
        Ok(mounted) => mounted,
        Err(why) => {
            eprintln!("skipped: cannot mount a tmpfs here ({})", why.trim());
            return;
        }
    };
    let store = disk.path().join("store");
    let mut acknowledged = Vec::new();
    // Large blobs until one fails, then small ones until one fails: the
    // disk is then full to its last blocks.
    for (len, tries) in [(300_000, 200), (3_000, 5_000)] {
        for n in 0..tries {
            let fill = (acknowledged.len() % 250) as u8 + 1;
            match put(&store, len, fill) {
                Ok(id) => acknowledged.push((id, len, fill)),
                Err(err) => {
                    assert!(full(&err), "put {n} of {len} bytes: {err}");
                    break;
                }
            }
        }
    }
    assert!(acknowledged.len() > 20, "{} blobs fit", acknowledged.len());
    // Another program takes whatever space is left, to the last byte.
    {
        use std::io::Write;
        let mut filler = std::fs::File::create(disk.path().join("filler")).unwrap();
        for size in [1 << 20, 4096, 1] {
            while filler.write_all(&vec![0; size]).is_ok() {}
        }
    }

    // The store opens for writing on the full disk, and archiving and a
    // checkpoint free the first large blobs.
    let db = Database::recover(&store).expect("opening the store on its full disk");
    let freed: Vec<_> = acknowledged
        .iter()
        .filter(|(_, len, _)| *len == 300_000)
        .take(5)
        .copied()
        .collect();
    let mut tx = db.begin_transaction().unwrap();
    for (id, ..) in &freed {
        tx.archive(*id).unwrap();
    }
    let archived = tx.commit().expect("archiving on the full disk");
    let mut tx = db.begin_transaction().unwrap();
    tx.checkpoint_to(archived).unwrap();
    tx.commit().expect("checkpointing on the full disk");
    // New blobs go into the freed grains.
    let mut tx = db.begin_transaction().unwrap();
    let again = tx.write(&vec![0xEE; 300_000]).unwrap();
    tx.commit().expect("a blob in the freed grains");
    // Small blobs still only in the WAL may find no room in their own
    // strata (the grains freed are large ones): the shutdown's checkpoint
    // then says so, and they stay in the WAL, safe.
    if let Err(err) = db.shutdown() {
        assert!(full(&err), "{err}");
    }

    // Still full: every blob reads back.
    let db = Database::recover(&store).unwrap();
    let check = |db: &Database| {
        for (id, len, fill) in &acknowledged {
            if freed.iter().any(|(freed, ..)| freed == id) {
                continue;
            }
            let blob = db
                .get(*id)
                .unwrap()
                .unwrap_or_else(|| panic!("{id} is gone"));
            assert_eq!(blob.len(), *len, "{id}");
            assert!(blob.iter().all(|b| b == fill), "{id}");
        }
        assert_eq!(db.get(again).unwrap().unwrap(), vec![0xEE; 300_000]);
    };
    check(&db);
    if let Err(err) = db.shutdown() {
        assert!(full(&err), "{err}");
    }
    // Given room again, the store finishes what the full disk held up
    // (header copies, checkpoints) and verifies.
    disk.grow("64m");
    let db = Database::recover(&store).unwrap();
    check(&db);
    let report = db.verify().unwrap();
    assert!(report.is_ok(), "{report:?}");
    db.shutdown().unwrap();
}
