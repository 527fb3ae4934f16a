//! `Database::grains`: every live blob, in id order, wherever its bytes
//! are (strata, WAL only, written directly), archived ones flagged and
//! freed ones left out; with writers committing meanwhile it never
//! describes a blob that was not there.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use common::{blob, Rng};
use sediment::{Config, Database, Error, GrainId, GrainInfo, SequenceId};

/// What a test expects of one blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Expected {
    length: u64,
    sequence: SequenceId,
    archived: bool,
}

fn listing(db: &Database) -> Vec<GrainInfo> {
    db.grains()
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .expect("every header reads")
}

/// Checks the listing against `expected` exactly, its order, and that each
/// listed blob reads back with the listed length.
fn assert_listing(db: &Database, expected: &BTreeMap<GrainId, Expected>, what: &str) {
    let listed = listing(db);
    for pair in listed.windows(2) {
        assert!(pair[0].id < pair[1].id, "{what}: not in id order: {pair:?}");
    }
    let got: BTreeMap<GrainId, Expected> = listed
        .iter()
        .map(|info| {
            (
                info.id,
                Expected {
                    length: info.length,
                    sequence: info.sequence,
                    archived: info.archived,
                },
            )
        })
        .collect();
    assert_eq!(&got, expected, "{what}");
    for info in &listed {
        let data = db.get(info.id).unwrap().expect("a listed blob reads");
        assert_eq!(data.len() as u64, info.length, "{what}: {}", info.id);
    }
}

#[test]
fn lists_blobs_in_the_strata_in_the_wal_direct_written_and_archived_but_not_freed() {
    let dir = tempfile::tempdir().unwrap();
    let mut expected = BTreeMap::new();
    let mut contents = HashMap::new();
    let mut freed = Vec::new();

    let db = Database::recover(dir.path()).unwrap();
    assert!(listing(&db).is_empty(), "a new store lists nothing");
    // Small blobs (through the WAL), an empty one and large ones written
    // straight into their grains (64 KiB and more), in several basins.
    let lengths = [0_usize, 1, 17, 500, 4000, 70_000, 300_000, 3 << 20];
    let mut tx = db.begin_transaction().unwrap();
    let mut first = Vec::new();
    for (i, &len) in lengths.iter().enumerate() {
        let data = blob(i as u64, len);
        first.push(tx.write(&data).unwrap());
        contents.insert(first[i], data);
    }
    let sequence = tx.commit().unwrap();
    for (id, &len) in first.iter().zip(&lengths) {
        let record = Expected {
            length: len as u64,
            sequence,
            archived: false,
        };
        expected.insert(*id, record);
    }
    assert_listing(&db, &expected, "just committed, small blobs in the WAL");
    assert!(db.stats().unwrap().blobs_in_wal > 0);
    db.shutdown().unwrap();

    // After a reopen the WAL was checkpointed: everything is in the strata.
    let db = Database::recover(dir.path()).unwrap();
    assert_eq!(db.stats().unwrap().blobs_in_wal, 0);
    assert_listing(&db, &expected, "reopened, all in the strata");

    // New small blobs stay in the WAL only.
    let mut tx = db.begin_transaction().unwrap();
    let mut second = Vec::new();
    for i in 0..5_u64 {
        let data = blob(100 + i, 30 + 200 * i as usize);
        second.push(tx.write(&data).unwrap());
        contents.insert(second[i as usize], data);
    }
    let sequence = tx.commit().unwrap();
    for id in &second {
        let length = contents[id].len() as u64;
        expected.insert(
            *id,
            Expected {
                length,
                sequence,
                archived: false,
            },
        );
    }
    assert_eq!(db.stats().unwrap().blobs_in_wal, 5);

    // Archived: one in the strata, one in the WAL, one large.
    let mut tx = db.begin_transaction().unwrap();
    for id in [first[2], second[1], first[6]] {
        tx.archive(id).unwrap();
        expected.get_mut(&id).unwrap().archived = true;
    }
    tx.commit().unwrap();
    // Freed: one of each kind, archived later than those and checkpointed.
    let mut tx = db.begin_transaction().unwrap();
    for id in [first[3], second[3], first[7]] {
        tx.archive(id).unwrap();
        expected.remove(&id);
        freed.push(id);
    }
    let archived = tx.commit().unwrap();
    let mut tx = db.begin_transaction().unwrap();
    tx.checkpoint_to(archived).unwrap();
    tx.commit().unwrap();
    for id in &freed {
        assert_eq!(db.get(*id).unwrap(), None, "{id} is freed");
    }
    // A checkpoint frees everything archived up to it: the first archives
    // were freed too.
    for id in [first[2], second[1], first[6]] {
        expected.remove(&id);
    }
    // Archive three more and leave them archived.
    let mut tx = db.begin_transaction().unwrap();
    for id in [first[1], second[0], first[5]] {
        tx.archive(id).unwrap();
        expected.get_mut(&id).unwrap().archived = true;
    }
    tx.commit().unwrap();
    assert_listing(&db, &expected, "archived and freed, some in the WAL");

    // A freed grain's space written again: the new blob is listed.
    let data = blob(999, 500);
    let mut tx = db.begin_transaction().unwrap();
    let reused = tx.write(&data).unwrap();
    let sequence = tx.commit().unwrap();
    assert_eq!(reused, first[3], "the freed grains are reused");
    expected.insert(
        reused,
        Expected {
            length: 500,
            sequence,
            archived: false,
        },
    );
    contents.insert(reused, data);
    assert_listing(&db, &expected, "a freed grain reused");
    db.shutdown().unwrap();

    let db = Database::recover(dir.path()).unwrap();
    assert_listing(&db, &expected, "reopened after archives and frees");
    // The listing is enough to find every blob again.
    for info in listing(&db) {
        assert_eq!(
            db.get(info.id).unwrap().as_ref(),
            Some(&contents[&info.id]),
            "{}",
            info.id
        );
    }
    db.shutdown().unwrap();
}

#[test]
fn a_damaged_grain_header_is_an_error_item_and_the_listing_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::recover(dir.path()).unwrap();
    let mut tx = db.begin_transaction().unwrap();
    let needle = b"THE GRAIN HEADER BEFORE THIS WILL BE DAMAGED";
    let before = tx.write(b"before").unwrap();
    let damaged = tx.write(needle).unwrap();
    let after = tx.write(b"after").unwrap();
    tx.commit().unwrap();
    db.shutdown().unwrap();

    let path = dir
        .path()
        .join(format!("stratum-{}-{}", damaged.basin(), damaged.stratum()));
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("the blob is in its stratum");
    // The length field of the header: a length this grain cannot hold.
    bytes[at - 8..at - 4].copy_from_slice(&u32::MAX.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();

    let db = Database::recover(dir.path()).unwrap();
    let items: Vec<_> = db.grains().unwrap().collect();
    assert_eq!(items.len(), 3, "{items:?}");
    assert_eq!(items[0].as_ref().unwrap().id, before);
    match &items[1] {
        Err(Error::ChecksumMismatch { grain, .. }) => assert_eq!(*grain, damaged),
        other => panic!("expected a checksum mismatch, got {other:?}"),
    }
    assert_eq!(items[2].as_ref().unwrap().id, after);
    db.shutdown().unwrap();
}

#[test]
fn a_store_shut_down_meanwhile_ends_the_listing_with_an_error() {
    let db = Database::in_memory();
    let mut tx = db.begin_transaction().unwrap();
    for i in 0..3_u64 {
        tx.write(&blob(i, 10)).unwrap();
    }
    tx.commit().unwrap();
    let mut grains = db.grains().unwrap();
    assert!(grains.next().unwrap().is_ok());
    db.clone().shutdown().unwrap();
    assert!(matches!(grains.next(), Some(Err(Error::ShutDown))));
    assert!(grains.next().is_none());
    assert!(matches!(db.grains(), Err(Error::ShutDown)));
}

/// Writers commit, archive and free (so grains are reused, blobs move from
/// the WAL into the strata, and direct writes land) while another thread
/// lists again and again. Every listed item must be a blob that was really
/// committed at that id with that length and sequence, in id order, and
/// blobs that stayed live the whole time must always be listed.
#[test]
fn writers_committing_meanwhile_never_make_it_list_wrong_blobs() {
    let seed = common::seed("grains_while_writing");
    let dir = tempfile::tempdir().unwrap();
    let db = Config::for_directory(dir.path())
        .wal(|wal| {
            wal.checkpoint_after_bytes(128 << 10)
                .preallocate_bytes(128 << 10)
        })
        .direct_write_bytes(6000)
        .open()
        .unwrap();
    // Blobs that stay live and unarchived throughout.
    let mut steady = BTreeMap::new();
    let mut tx = db.begin_transaction().unwrap();
    for i in 0..40_u64 {
        let len = (i as usize * 733) % 9000;
        steady.insert(tx.write(&blob(1_000_000 + i, len)).unwrap(), len as u64);
    }
    let steady_sequence = tx.commit().unwrap();

    // Every (id, length, sequence) ever committed, filled in by the writers.
    let history: Mutex<HashSet<(GrainId, u64, SequenceId)>> = Mutex::new(
        steady
            .iter()
            .map(|(id, len)| (*id, *len, steady_sequence))
            .collect(),
    );
    let writers_done = AtomicBool::new(false);
    let seen: Vec<Vec<GrainInfo>> = std::thread::scope(|scope| {
        let writers: Vec<_> = (0..2_u64)
            .map(|t| {
                let (db, history) = (&db, &history);
                scope.spawn(move || {
                    let mut rng = Rng::new(seed ^ t);
                    let mut previous = Vec::new();
                    for round in 0..120_u64 {
                        let mut tx = db.begin_transaction().unwrap();
                        let mut written = Vec::new();
                        for _ in 0..rng.between(1, 5) {
                            let len = if rng.percent(10) {
                                rng.between(6000, 40_000)
                            } else {
                                rng.below(3000)
                            };
                            let id = tx.write(&blob(t << 32 | round, len as usize)).unwrap();
                            written.push((id, len));
                        }
                        for id in previous.drain(..) {
                            tx.archive(id).unwrap();
                        }
                        let sequence = tx.commit().unwrap();
                        {
                            let mut history = history.lock().unwrap();
                            for (id, len) in &written {
                                history.insert((*id, *len, sequence));
                            }
                        }
                        previous = written.into_iter().map(|(id, _)| id).collect();
                        if round % 3 == 2 {
                            let mut tx = db.begin_transaction().unwrap();
                            if tx.checkpoint_to(sequence).is_ok() {
                                tx.commit().unwrap();
                            }
                        }
                    }
                })
            })
            .collect();
        let lister = {
            let (db, writers_done) = (&db, &writers_done);
            scope.spawn(move || {
                let mut seen = Vec::new();
                // At least one listing after the writers are done.
                loop {
                    let last = writers_done.load(Ordering::Acquire);
                    seen.push(listing(db));
                    if last {
                        return seen;
                    }
                }
            })
        };
        for writer in writers {
            writer.join().unwrap();
        }
        writers_done.store(true, Ordering::Release);
        lister.join().unwrap()
    });

    let history = history.into_inner().unwrap();
    assert!(seen.len() >= 2, "{} listings", seen.len());
    for (n, listed) in seen.iter().enumerate() {
        for pair in listed.windows(2) {
            assert!(pair[0].id < pair[1].id, "listing {n}: {pair:?}");
        }
        for info in listed {
            assert!(
                history.contains(&(info.id, info.length, info.sequence)),
                "listing {n}: {info:?} was never committed"
            );
        }
        let ids: BTreeMap<GrainId, &GrainInfo> = listed.iter().map(|i| (i.id, i)).collect();
        for (id, len) in &steady {
            let info = ids
                .get(id)
                .unwrap_or_else(|| panic!("listing {n}: steady blob {id} missing"));
            assert_eq!(
                (info.length, info.sequence, info.archived),
                (*len, steady_sequence, false),
                "listing {n}"
            );
        }
    }
    // Once quiet, the listing is exactly the live blobs: the ids among
    // everything ever committed that `get` still finds.
    let last = listing(&db);
    assert_eq!(&last, seen.last().unwrap());
    let live: std::collections::BTreeSet<GrainId> = history
        .iter()
        .map(|(id, _, _)| *id)
        .filter(|id| db.get(*id).unwrap().is_some())
        .collect();
    let listed: std::collections::BTreeSet<GrainId> = last.iter().map(|info| info.id).collect();
    assert_eq!(listed, live);
    for info in &last {
        let data = db.get(info.id).unwrap().expect("listed blobs are live");
        assert_eq!(data.len() as u64, info.length, "{}", info.id);
    }
    db.shutdown().unwrap();
}
