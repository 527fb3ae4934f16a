//! Grain ids that do not name a committed blob — never allocated, freed,
//! rolled back, random bits, past the end of a stratum, the wrong count, the
//! middle of a blob — are answered with `Ok(None)` or an error by `get`,
//! `read`, `archive` and `set_embedded_header`: never a panic and never
//! another blob's bytes. Parsing garbage text fails cleanly.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::io::Read;
use std::panic::{catch_unwind, AssertUnwindSafe};

use common::{blob, open_small_wal, seed, Rng};
use sediment::format::{stratum_capacity, BASINS, MAX_GRAINS_PER_BLOB, STRATUM_INDEX_BITS};
use sediment::{Database, Error, GrainId, MAX_STRATA};

/// Bits of a valid id: count (5) + index (18) + stratum (24) + basin (5).
const USED_BITS: u32 = 52;

struct Fixture {
    _dir: tempfile::TempDir,
    db: Database,
    /// Committed, not freed: id → contents.
    live: HashMap<GrainId, Vec<u8>>,
    archived: BTreeSet<GrainId>,
    freed: Vec<GrainId>,
    rolled_back: Vec<GrainId>,
}

/// Blobs in many basins, some checkpointed into the strata and some still
/// in the WAL, some archived, some freed, some rolled back.
fn fixture(rng: &mut Rng) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let db = open_small_wal(dir.path(), 128 << 10);
    let mut live = HashMap::new();
    let write_some = |db: &Database, rng: &mut Rng, tag: u64, n: u64| {
        let mut tx = db.begin_transaction().unwrap();
        let mut ids = Vec::new();
        for i in 0..n {
            let size = match rng.below(4) {
                0 => rng.below(40),
                1 => rng.below(600),
                2 => rng.below(9000),
                _ => rng.between(60_000, 300_000),
            } as usize;
            let data = blob(tag << 16 | i, size);
            let id = tx.write(&data).unwrap();
            ids.push((id, data));
        }
        tx.commit().unwrap();
        ids
    };
    for (id, data) in write_some(&db, rng, 1, 60) {
        live.insert(id, data);
    }
    // Archive and free a third of them.
    let mut tx = db.begin_transaction().unwrap();
    let doomed: Vec<GrainId> = live.keys().copied().step_by(3).collect();
    for id in &doomed {
        tx.archive(*id).unwrap();
    }
    let archived_at = tx.commit().unwrap();
    let mut tx = db.begin_transaction().unwrap();
    tx.checkpoint_to(archived_at).unwrap();
    tx.commit().unwrap();
    for id in &doomed {
        live.remove(id);
    }
    db.checkpoint_wal().unwrap();
    // Archived but not freed.
    let mut tx = db.begin_transaction().unwrap();
    let archived: BTreeSet<GrainId> = live.keys().copied().step_by(5).collect();
    for id in &archived {
        tx.archive(*id).unwrap();
    }
    tx.commit().unwrap();
    // Rolled back.
    let mut tx = db.begin_transaction().unwrap();
    let rolled_back: Vec<GrainId> = (0..10)
        .map(|i| {
            tx.write(&blob(9 << 16 | i, 100 + 900 * i as usize))
                .unwrap()
        })
        .collect();
    tx.rollback();
    // More blobs, some of which reuse freed grains, left in the WAL.
    for (id, data) in write_some(&db, rng, 2, 40) {
        live.insert(id, data);
    }
    let freed = doomed
        .into_iter()
        .filter(|id| !live.contains_key(id))
        .collect();
    let rolled_back = rolled_back
        .into_iter()
        .filter(|id| !live.contains_key(id))
        .collect();
    Fixture {
        _dir: dir,
        db,
        live,
        archived,
        freed,
        rolled_back,
    }
}

/// Ids that are not blobs, or only almost: derived from real ones and from
/// random bits.
fn candidates(f: &Fixture, rng: &mut Rng) -> Vec<GrainId> {
    let mut ids = Vec::new();
    let mut push = |id: Option<GrainId>| {
        if let Some(id) = id {
            ids.push(id);
        }
    };
    for id in f.live.keys().chain(&f.freed).chain(&f.rolled_back) {
        let (b, s, i, c) = (id.basin(), id.stratum(), id.index(), id.count());
        push(Some(*id));
        for (di, dc) in [
            (-2_i64, 0_i64),
            (-1, 0),
            (1, 0),
            (2, 0),
            (0, -1),
            (0, 1),
            (0, 2),
        ] {
            let index = i64::from(i) + di;
            let count = i64::from(c) + dc;
            if index >= 0 && count >= 1 {
                push(GrainId::new(b, s, index as u32, count as u32));
            }
        }
        // The middle and the last grain of the blob, alone or to its end.
        if c > 1 {
            push(GrainId::new(b, s, i + 1, c - 1));
            push(GrainId::new(b, s, i + c / 2, 1));
            push(GrainId::new(b, s, i + c - 1, 1));
            push(GrainId::new(b, s, i, 1));
        }
        // Same place, other stratum or basin.
        push(GrainId::new(b, s + 1, i, c));
        push(GrainId::new((b + 1) % BASINS as u8, s, i, c));
        push(GrainId::new(b.saturating_sub(1), s, i, c));
        // Spanning into the next blob.
        push(GrainId::new(b, s, i, (c + 5).min(MAX_GRAINS_PER_BLOB)));
    }
    // Past the end of a stratum, in every basin.
    for basin in 0..BASINS as u8 {
        let capacity = stratum_capacity(basin);
        push(GrainId::new(basin, 0, capacity - 1, 2));
        push(GrainId::new(basin, 0, capacity - 1, 1));
        push(GrainId::new(basin, 0, capacity, 1));
        push(GrainId::new(basin, 0, (1 << STRATUM_INDEX_BITS) - 1, 32));
        push(GrainId::new(basin, 0, capacity - 32, 32));
        push(GrainId::new(basin, MAX_STRATA - 1, 0, 1));
    }
    // Random bits in range, biased towards the strata that exist.
    for _ in 0..10_000 {
        let raw = rng.next_u64() & ((1 << USED_BITS) - 1);
        push(GrainId::from_u64(raw).ok());
        let basin = rng.below(BASINS as u64) as u8;
        let capacity = stratum_capacity(basin);
        push(GrainId::new(
            basin,
            rng.below(2) as u32,
            rng.below(u64::from(capacity) + 40) as u32,
            rng.between(1, 32) as u32,
        ));
    }
    ids
}

/// `get` and `read` of `id`: no panic, and bytes only for a live blob and
/// only its own.
fn check_read(f: &Fixture, id: GrainId) {
    let got = catch_unwind(AssertUnwindSafe(|| f.db.get(id)))
        .unwrap_or_else(|_| panic!("get({id}) panicked"));
    match (got, f.live.get(&id)) {
        (Ok(Some(bytes)), Some(expected)) => assert!(bytes == *expected, "get({id}): other bytes"),
        (Ok(Some(bytes)), None) => panic!(
            "get({id}) of a grain id that is not a blob returned {} bytes",
            bytes.len()
        ),
        (Ok(None) | Err(_), Some(_)) => panic!("get({id}) of a live blob failed"),
        (Ok(None), None) => {}
        (Err(e), None) => assert!(
            matches!(e, Error::InvalidGrainId(_)),
            "get({id}) gave an unexpected error: {e}"
        ),
    }
    let read = catch_unwind(AssertUnwindSafe(|| {
        f.db.read(id).map(|reader| {
            reader.map(|mut reader| {
                let mut bytes = Vec::new();
                reader.read_to_end(&mut bytes).map(|_| bytes)
            })
        })
    }))
    .unwrap_or_else(|_| panic!("read({id}) panicked"));
    match (read, f.live.get(&id)) {
        (Ok(Some(Ok(bytes))), Some(expected)) => assert!(bytes == *expected, "read({id})"),
        (Ok(Some(_)), None) => panic!("read({id}) of a grain id that is not a blob succeeded"),
        (Ok(None) | Err(_), None) => {}
        (other, Some(_)) => panic!("read({id}) of a live blob gave {:?}", other.map(|_| ())),
    }
}

/// `archive` and `set_embedded_header` of `id`: no panic, success only for
/// a live (and, for archive, not yet archived) blob.
fn check_write_side(f: &Fixture, id: GrainId) {
    let mut tx = f.db.begin_transaction().unwrap();
    let archived = catch_unwind(AssertUnwindSafe(|| tx.archive(id)))
        .unwrap_or_else(|_| panic!("archive({id}) panicked"));
    let may_archive = f.live.contains_key(&id) && !f.archived.contains(&id);
    match archived {
        Ok(()) => assert!(may_archive, "archive({id}) of a non-blob succeeded"),
        Err(Error::NotAllocated(reported)) => {
            assert!(
                !f.live.contains_key(&id),
                "archive of live {id}: NotAllocated"
            );
            assert_eq!(reported, id);
        }
        Err(Error::AlreadyArchived(reported)) => {
            assert!(f.archived.contains(&id), "{id} is not archived");
            assert_eq!(reported, id);
        }
        Err(Error::InvalidGrainId(_)) => assert!(!f.live.contains_key(&id)),
        Err(e) => panic!("archive({id}) gave an unexpected error: {e}"),
    }
    let header = catch_unwind(AssertUnwindSafe(|| tx.set_embedded_header(Some(id))))
        .unwrap_or_else(|_| panic!("set_embedded_header({id}) panicked"));
    match header {
        Ok(()) => assert!(
            f.live.contains_key(&id),
            "set_embedded_header({id}) of a non-blob succeeded"
        ),
        Err(Error::NotAllocated(_) | Error::InvalidGrainId(_)) => {
            assert!(
                !f.live.contains_key(&id),
                "set_embedded_header of live {id}"
            );
        }
        Err(e) => panic!("set_embedded_header({id}) gave an unexpected error: {e}"),
    }
    tx.rollback();
}

#[test]
fn bad_ids_are_answered_cleanly() {
    let seed = seed("bad_ids_are_answered_cleanly");
    let mut rng = Rng::new(seed);
    let f = fixture(&mut rng);
    let ids = candidates(&f, &mut rng);
    let not_live = ids.iter().filter(|id| !f.live.contains_key(id)).count();
    println!(
        "{} candidate ids ({not_live} not blobs) against {} live, {} freed, {} rolled-back blobs",
        ids.len(),
        f.live.len(),
        f.freed.len(),
        f.rolled_back.len()
    );
    assert!(!f.freed.is_empty() && !f.rolled_back.is_empty());
    for id in &ids {
        check_read(&f, *id);
        check_write_side(&f, *id);
    }
    // Nothing above changed anything: a commit works, the header is
    // unset, verify is clean, and everything reads back after a reopen.
    assert_eq!(f.db.embedded_header(), None);
    let mut tx = f.db.begin_transaction().unwrap();
    let fresh = tx.write(b"after the bad ids").unwrap();
    tx.set_embedded_header(Some(fresh)).unwrap();
    tx.commit().unwrap();
    f.db.verify().unwrap();
    // Freed and rolled-back grains are reusable at once: the fresh blob
    // may have taken one of their ids.
    assert_eq!(
        f.db.get(fresh).unwrap().as_deref(),
        Some(&b"after the bad ids"[..])
    );
    for id in f
        .freed
        .iter()
        .chain(&f.rolled_back)
        .filter(|id| **id != fresh)
    {
        assert_eq!(f.db.get(*id).unwrap(), None, "{id}");
    }
    f.db.checkpoint_wal().unwrap();
    for id in ids.iter().step_by(7).filter(|id| **id != fresh) {
        check_read(&f, *id);
    }
}

#[test]
fn raw_values_that_are_not_ids_are_rejected() {
    let seed = seed("raw_values_that_are_not_ids_are_rejected");
    let mut rng = Rng::new(seed);
    let mut accepted = 0;
    for _ in 0..100_000 {
        let raw = match rng.below(3) {
            0 => rng.next_u64(),
            1 => rng.next_u64() & ((1 << USED_BITS) - 1),
            _ => rng.next_u64() >> rng.below(64),
        };
        let parsed = catch_unwind(|| GrainId::from_u64(raw))
            .unwrap_or_else(|_| panic!("from_u64({raw:#x}) panicked"));
        let basin = (raw >> 47) & 31;
        let valid = raw >> USED_BITS == 0 && basin < BASINS as u64;
        match parsed {
            Ok(id) => {
                assert!(valid, "from_u64({raw:#x}) accepted an invalid value");
                accepted += 1;
                assert_eq!(id.as_u64(), raw);
                assert_eq!(GrainId::from_bytes(id.to_bytes()), Ok(id));
                // The text form round-trips, as does the raw one.
                assert_eq!(id.to_string().parse::<GrainId>(), Ok(id));
                assert_eq!(raw.to_string().parse::<GrainId>(), Ok(id));
                assert_eq!(format!("{raw:#x}").parse::<GrainId>(), Ok(id));
                assert_eq!(
                    GrainId::new(id.basin(), id.stratum(), id.index(), id.count()),
                    Some(id)
                );
            }
            Err(e) => {
                assert!(!valid, "from_u64({raw:#x}) rejected a valid id: {e}");
                assert!(GrainId::from_bytes(raw.to_le_bytes()).is_err());
                assert!(raw.to_string().parse::<GrainId>().is_err());
            }
        }
    }
    assert!(accepted > 1000, "too few valid values drawn ({accepted})");
}

#[test]
fn parsing_garbage_strings_fails_cleanly() {
    let must_fail = [
        "",
        " ",
        "-",
        "---",
        "0x",
        "0x-1",
        "0X10",
        "x10",
        "1-2-3",
        "1-2-3-4-5",
        "1--3-4",
        "-1-2-3-4",
        "1-2-3-0",
        "1-2-3-33",
        "22-0-0-1",
        "255-0-0-1",
        "256-0-0-1",
        "0-16777216-0-1",
        "0-0-262144-1",
        "0-0-0-4294967296",
        "18446744073709551616",
        "0x10000000000000000",
        "0xfff0000000000000",
        "4503599627370496",
        "1.5",
        "1e3",
        "one-two-three-four",
        "1-2-3-4\n5",
        "０-0-0-1",
        "1-2-3-4 x",
        "\u{0}",
        "0-0-0-1-",
        "0x1-2",
    ];
    for text in must_fail {
        let parsed = catch_unwind(|| text.parse::<GrainId>())
            .unwrap_or_else(|_| panic!("parsing {text:?} panicked"));
        assert!(parsed.is_err(), "{text:?} parsed as {parsed:?}");
        let message = parsed.unwrap_err().to_string();
        assert!(!message.is_empty());
    }
    for (text, parts) in [
        ("0-0-0-1", (0, 0, 0, 1)),
        (" 3-0-17-20 ", (3, 0, 17, 20)),
        ("21-16777215-262143-32", (21, 16_777_215, 262_143, 32)),
    ] {
        let id: GrainId = text.parse().unwrap();
        assert_eq!((id.basin(), id.stratum(), id.index(), id.count()), parts);
    }

    // Random strings over an alphabet that makes near-misses likely.
    let seed = seed("parsing_garbage_strings_fails_cleanly");
    let mut rng = Rng::new(seed);
    let alphabet: Vec<char> = "0123456789-xX+ abcdefé\u{0}".chars().collect();
    let mut parsed_ok = 0;
    for _ in 0..50_000 {
        let len = rng.below(26) as usize;
        let text: String = (0..len).map(|_| *rng.pick(&alphabet)).collect();
        let parsed = catch_unwind(|| text.parse::<GrainId>())
            .unwrap_or_else(|_| panic!("parsing {text:?} panicked"));
        if let Ok(id) = parsed {
            parsed_ok += 1;
            // Whatever is accepted is a valid id that prints and parses
            // back to itself.
            assert_eq!(GrainId::from_u64(id.as_u64()), Ok(id), "{text:?}");
            assert_eq!(id.to_string().parse::<GrainId>(), Ok(id), "{text:?}");
        }
    }
    println!("{parsed_ok} of 50000 random strings were valid ids");
}
