//! Encryption at rest (`Config::encryption`): no payload byte reaches a
//! file in plaintext; changed, swapped or replayed grains read as damage,
//! never as data; a missing or wrong key (or a key for a plain store, or
//! none for an encrypted one) is refused with a key error and changes
//! nothing; after a key rotation `rekey` seals everything under the new
//! key, survives a power cut at any sync or write, and lets the old key go.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::{blob, free, power_cut, seed, Rng};
use okaywal::encryption::{Key, KeyError, KeyId, Keyring, StaticKey};
use okaywal::fs::{CrashFileSystem, FaultKind, FileSystem, OpenMode, Operation, PowerLoss};
use sediment::format::{grain_size, Layout};
use sediment::{Config, Database, Error, GrainId};

fn key(byte: u8) -> Key {
    Key::from_bytes([byte; 32])
}

/// A ring holding key 1, current.
fn ring() -> Arc<Keyring> {
    Arc::new(Keyring::new(KeyId::new(1), key(1)))
}

fn open(dir: &Path, provider: impl okaywal::encryption::KeyProvider) -> sediment::Result<Database> {
    Config::for_directory(dir)
        .wal(|wal| {
            wal.checkpoint_after_bytes(256 << 10)
                .preallocate_bytes(256 << 10)
        })
        .encryption(provider)
        .open()
}

fn commit(db: &Database, blobs: &[Vec<u8>]) -> Vec<GrainId> {
    let mut tx = db.begin_transaction().unwrap();
    let ids = blobs.iter().map(|b| tx.write(b).unwrap()).collect();
    tx.commit().unwrap();
    ids
}

fn check(db: &Database, stored: &BTreeMap<GrainId, Vec<u8>>, context: &str) {
    for (id, data) in stored {
        common::assert_blob(db, *id, data, context);
    }
}

/// Where grain `id`'s bytes are: the documented offset, the same in an
/// encrypted store as in a plain one.
fn grain_at(dir: &Path, id: GrainId) -> (PathBuf, u64) {
    let offset = sediment::format::grain_offset(id.basin(), id.index());
    assert_eq!(offset, Layout::Sealed.grain_offset(id.basin(), id.index()));
    (
        dir.join(format!("stratum-{}-{}", id.basin(), id.stratum())),
        offset,
    )
}

fn read_grain(dir: &Path, id: GrainId) -> Vec<u8> {
    let (path, offset) = grain_at(dir, id);
    let bytes = std::fs::read(path).unwrap();
    let len = (u64::from(id.count()) * grain_size(id.basin())) as usize;
    bytes[offset as usize..offset as usize + len].to_vec()
}

fn write_grain(dir: &Path, id: GrainId, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let (path, offset) = grain_at(dir, id);
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.write_all_at(bytes, offset).unwrap();
}

/// A blob read back must be an error, never bytes; `verify` names it.
fn assert_damaged(db: &Database, id: GrainId, what: &str) {
    match db.get(id) {
        Err(Error::ChecksumMismatch { grain, path, .. }) => {
            assert_eq!(grain, id, "{what}");
            assert!(
                path.to_string_lossy().contains("stratum-"),
                "{what}: {path:?}"
            );
        }
        other => panic!("{what}: get({id}) returned {other:?}, not a checksum mismatch"),
    }
    let report = db.verify_report(|_, _| {}).unwrap();
    assert!(
        report.problems.iter().any(|p| p.grain == Some(id)),
        "{what}: verify does not name {id}: {report}"
    );
}

#[test]
fn no_payload_or_sixteen_byte_window_of_one_reaches_any_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng::new(seed(
        "no_payload_or_sixteen_byte_window_of_one_reaches_any_file",
    ));
    let db = open(dir.path(), ring()).unwrap();
    let mut payloads: Vec<Vec<u8>> = Vec::new();
    let mut stored = BTreeMap::new();
    let make = |rng: &mut Rng, len: usize| -> Vec<u8> { rng.bytes(len) };
    // Small blobs (through the WAL), large ones (written straight into
    // their grains), across checkpoints, and freed grains reused.
    for round in 0..4 {
        let blobs: Vec<Vec<u8>> = [16, 40, 100, 3000, 70_000, 150_000]
            .iter()
            .map(|&len| make(&mut rng, len + round))
            .collect();
        let ids = commit(&db, &blobs);
        for (id, data) in ids.iter().zip(&blobs) {
            stored.insert(*id, data.clone());
        }
        payloads.extend(blobs);
        if round % 2 == 1 {
            db.checkpoint_wal().unwrap();
        }
        let first = ids[0];
        free(&db, first);
        stored.remove(&first);
    }
    let mut tx = db.begin_transaction().unwrap();
    let header = tx.write(&make(&mut rng, 64)).unwrap();
    tx.set_embedded_header(Some(header)).unwrap();
    tx.commit().unwrap();
    check(&db, &stored, "before the scan");
    // Some blobs still only in the WAL, the rest in the strata.
    let blobs: Vec<Vec<u8>> = (0..5).map(|_| make(&mut rng, 500)).collect();
    commit(&db, &blobs);
    payloads.extend(blobs);
    db.sync().unwrap();

    // Every 16-byte window of every payload, looked up at every offset of
    // every file.
    let windows: HashSet<[u8; 16]> = payloads
        .iter()
        .flat_map(|payload| payload.windows(16))
        .map(|w| w.try_into().unwrap())
        .collect();
    let mut scanned = BTreeMap::new();
    for (name, bytes) in common::files(dir.path()) {
        if let Some(at) = bytes
            .windows(16)
            .position(|w| windows.contains(<&[u8; 16]>::try_from(w).unwrap()))
        {
            panic!("{name} holds 16 bytes of a payload in plaintext at offset {at}");
        }
        scanned.insert(name, bytes.len());
    }
    assert!(
        scanned.keys().any(|n| n.starts_with("stratum-")),
        "{scanned:?}"
    );
    assert!(
        scanned.keys().any(|n| n.starts_with("commits-")),
        "{scanned:?}"
    );
    assert!(scanned.keys().any(|n| n.starts_with("wal-")), "{scanned:?}");
    drop(db);
    let db = open(dir.path(), ring()).unwrap();
    check(&db, &stored, "after reopening");
    db.verify().unwrap();
}

#[test]
fn a_plain_store_stays_version_one_and_an_encrypted_one_is_version_two() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::recover(dir.path()).unwrap();
    let ids = commit(&db, &[b"plain".to_vec()]);
    db.checkpoint_wal().unwrap();
    assert!(db.verify().unwrap().key_ids_in_use.is_empty());
    db.shutdown().unwrap();
    let index = std::fs::read(dir.path().join("index")).unwrap();
    assert_eq!(index[8], 1, "a plain store stays format version 1");
    let db = Database::recover(dir.path()).unwrap();
    assert_eq!(db.get(ids[0]).unwrap().as_deref(), Some(&b"plain"[..]));

    let sealed = tempfile::tempdir().unwrap();
    let db = open(sealed.path(), ring()).unwrap();
    db.shutdown().unwrap();
    let index = std::fs::read(sealed.path().join("index")).unwrap();
    assert_eq!(index[8], 2, "an encrypted store is format version 2");
}

/// A store with two blobs of one size in neighbouring grains, all in the
/// strata; returns them.
fn two_blobs(dir: &Path) -> [(GrainId, Vec<u8>); 2] {
    let db = open(dir, ring()).unwrap();
    let a = blob(1, 300);
    let b = blob(2, 300);
    let ids = commit(&db, &[a.clone(), b.clone()]);
    db.shutdown().unwrap();
    [(ids[0], a), (ids[1], b)]
}

#[test]
fn a_flipped_byte_anywhere_in_a_grain_is_damage_never_data() {
    let dir = tempfile::tempdir().unwrap();
    let [(id, data), _] = two_blobs(dir.path());
    let original = read_grain(dir.path(), id);
    let image = 60 + data.len() + 44;
    // The grain header's seal and ciphertext, the chunk's seal, the data.
    for at in [0, 10, 30, 50, 59, 60, 80, 103, 104, 200, image - 1] {
        let mut damaged = original.clone();
        damaged[at] ^= 0x20;
        write_grain(dir.path(), id, &damaged);
        let db = open(dir.path(), ring()).unwrap();
        assert_damaged(&db, id, &format!("flip at {at}"));
        drop(db);
    }
    write_grain(dir.path(), id, &original);
    let db = open(dir.path(), ring()).unwrap();
    assert_eq!(db.get(id).unwrap(), Some(data));
    db.verify().unwrap();
}

#[test]
fn swapped_grains_are_damage_never_each_others_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let [(a, _), (b, _)] = two_blobs(dir.path());
    let (bytes_a, bytes_b) = (read_grain(dir.path(), a), read_grain(dir.path(), b));
    write_grain(dir.path(), a, &bytes_b);
    write_grain(dir.path(), b, &bytes_a);
    let db = open(dir.path(), ring()).unwrap();
    assert_damaged(&db, a, "a holds b's grain");
    assert_damaged(&db, b, "b holds a's grain");
}

#[test]
fn an_old_copy_of_a_reused_grain_is_damage_never_the_old_blob() {
    let dir = tempfile::tempdir().unwrap();
    let [(old, old_data), _] = two_blobs(dir.path());
    let old_bytes = read_grain(dir.path(), old);
    let db = open(dir.path(), ring()).unwrap();
    free(&db, old);
    let newer = blob(3, old_data.len());
    let reused = commit(&db, std::slice::from_ref(&newer))[0];
    assert_eq!(reused, old, "the freed grain is reused");
    db.shutdown().unwrap();
    assert_ne!(read_grain(dir.path(), old), old_bytes);

    // The old image is authentic for this grain: only its sequence tells
    // it apart, and the stratum's stamp records the newer one.
    write_grain(dir.path(), old, &old_bytes);
    let db = open(dir.path(), ring()).unwrap();
    assert_damaged(&db, old, "the old copy put back");
    let listed: Vec<_> = db.grains().unwrap().collect();
    assert!(
        listed.iter().any(|item| item.is_err()),
        "the listing reports the old copy: {listed:?}"
    );
    drop(db);
    // Also while the newer blob is still only in the WAL, before any
    // checkpoint: the old copy in the grain is never read.
    let db = open(dir.path(), ring()).unwrap();
    assert!(db.get(old).is_err());
}

/// SHA-like fingerprint of every file: name and bytes.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    common::files(dir)
}

fn refused(dir: &Path, config: Config) -> Error {
    let before = snapshot(dir);
    let error = config.open().expect_err("the open must fail");
    assert_eq!(
        snapshot(dir),
        before,
        "the open changed the directory ({error})"
    );
    error
}

#[test]
fn wrong_or_missing_keys_are_refused_by_name_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path(), StaticKey::with_id(KeyId::new(7), key(7))).unwrap();
    let ids = commit(&db, &[blob(1, 100), blob(2, 100_000)]);
    db.checkpoint_wal().unwrap();
    commit(&db, &[blob(3, 50)]);
    // Dropped without a shutdown: the WAL holds a transaction too.
    drop(db);
    let config = || Config::for_directory(dir.path());

    let wrong = refused(
        dir.path(),
        config().encryption(StaticKey::with_id(KeyId::new(7), key(8))),
    );
    assert!(matches!(wrong, Error::Key { .. }), "{wrong:?}");
    assert_eq!(wrong.key_error(), Some(&KeyError::Wrong(KeyId::new(7))));
    let text = wrong.to_string();
    assert!(
        text.contains("key id 7") && text.contains("index"),
        "{text}"
    );

    let missing = refused(
        dir.path(),
        config().encryption(StaticKey::with_id(KeyId::new(8), key(7))),
    );
    assert_eq!(missing.key_error(), Some(&KeyError::Missing(KeyId::new(7))));
    assert!(missing.to_string().contains("key id 7"), "{missing}");
    let source = std::error::Error::source(&missing).expect("the io::Error");
    let io = source
        .downcast_ref::<std::io::Error>()
        .expect("an io::Error");
    assert_eq!(io.kind(), std::io::ErrorKind::PermissionDenied);
    assert_eq!(KeyError::of(io), Some(&KeyError::Missing(KeyId::new(7))));

    let none = refused(dir.path(), config());
    assert_eq!(none.key_error(), Some(&KeyError::NotConfigured));
    assert!(none.to_string().contains("key id 7"), "{none}");
    let none = refused(dir.path(), config().read_only(true));
    assert_eq!(none.key_error(), Some(&KeyError::NotConfigured));
    assert!(none.to_string().contains("key id 7"), "{none}");

    let db = open(dir.path(), StaticKey::with_id(KeyId::new(7), key(7))).unwrap();
    assert_eq!(db.get(ids[1]).unwrap(), Some(blob(2, 100_000)));
    db.shutdown().unwrap();

    let plain = tempfile::tempdir().unwrap();
    let db = Database::recover(plain.path()).unwrap();
    commit(&db, &[blob(4, 10)]);
    drop(db);
    let keyed = refused(
        plain.path(),
        Config::for_directory(plain.path()).encryption(StaticKey::new([1; 32])),
    );
    assert_eq!(keyed.key_error(), Some(&KeyError::NotEncrypted));
    assert!(keyed.to_string().contains("not encrypted"), "{keyed}");
}

#[test]
fn rotation_then_rekey_lets_the_old_key_go() {
    let dir = tempfile::tempdir().unwrap();
    let ring = ring();
    let db = open(dir.path(), ring.clone()).unwrap();
    let mut stored = BTreeMap::new();
    let mut tag = 0;
    // Blobs of 2 MB only before the rotation: their stratum's headers are
    // not written again until the rekey.
    let mut write = |db: &Database, stored: &mut BTreeMap<GrainId, Vec<u8>>, before: bool| {
        let blobs: Vec<Vec<u8>> = [20, 700, 5000, 80_000, 300_000]
            .iter()
            .chain(before.then_some(&2_000_000))
            .map(|&len| {
                tag += 1;
                blob(tag, len)
            })
            .collect();
        for (id, data) in commit(db, &blobs).into_iter().zip(blobs) {
            stored.insert(id, data);
        }
    };
    write(&db, &mut stored, true);
    db.checkpoint_wal().unwrap();
    write(&db, &mut stored, true);
    db.shutdown().unwrap();

    // Rotate across a reopen: new writes use key 2, old data reads.
    let db = open(dir.path(), ring.clone()).unwrap();
    ring.rotate(KeyId::new(2), key(2));
    write(&db, &mut stored, false);
    db.checkpoint_wal().unwrap();
    write(&db, &mut stored, false);
    check(&db, &stored, "after the rotation");
    let before = db.verify().unwrap();
    assert_eq!(before.key_ids_in_use, vec![KeyId::new(1), KeyId::new(2)]);

    let report = db.rekey().unwrap();
    assert!(report.blobs_resealed > 0, "{report:?}");
    assert!(report.strata_resealed > 0, "{report:?}");
    assert!(report.commit_log_files_resealed > 0, "{report:?}");
    assert!(report.problems.is_empty(), "{report:?}");
    assert_eq!(report.key_ids_in_use, vec![KeyId::new(2)]);
    check(&db, &stored, "after the rekey");
    assert_eq!(db.verify().unwrap().key_ids_in_use, vec![KeyId::new(2)]);
    // A second rekey has nothing left to do.
    let again = db.rekey().unwrap();
    assert_eq!(
        (
            again.blobs_resealed,
            again.strata_resealed,
            again.commit_log_files_resealed
        ),
        (0, 0, 0)
    );
    db.shutdown().unwrap();

    // With key 1 retired, only key 2 is needed.
    assert!(ring.retire(KeyId::new(1)));
    let only_new = StaticKey::with_id(KeyId::new(2), key(2));
    let db = open(dir.path(), only_new).unwrap();
    check(&db, &stored, "with the old key retired");
    assert_eq!(db.verify().unwrap().key_ids_in_use, vec![KeyId::new(2)]);
    write(&db, &mut stored, false);
    db.shutdown().unwrap();
}

#[test]
fn retiring_a_key_before_the_rekey_is_refused_at_open_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let ring = ring();
    let db = open(dir.path(), ring.clone()).unwrap();
    commit(&db, &[blob(1, 100)]);
    ring.rotate(KeyId::new(2), key(2));
    commit(&db, &[blob(2, 100)]);
    db.shutdown().unwrap();
    let error = refused(
        dir.path(),
        Config::for_directory(dir.path()).encryption(StaticKey::with_id(KeyId::new(2), key(2))),
    );
    assert_eq!(error.key_error(), Some(&KeyError::Missing(KeyId::new(1))));
}

#[test]
fn rekey_on_a_plain_or_read_only_store_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::recover(dir.path()).unwrap();
    let error = db.rekey().unwrap_err();
    assert_eq!(error.key_error(), Some(&KeyError::NotEncrypted));
    db.shutdown().unwrap();
    let sealed = tempfile::tempdir().unwrap();
    open(sealed.path(), ring()).unwrap().shutdown().unwrap();
    let db = Config::for_directory(sealed.path())
        .encryption(ring())
        .read_only(true)
        .open()
        .unwrap();
    assert!(matches!(db.rekey(), Err(Error::ReadOnly)));
}

// --- Power cuts during a rekey -----------------------------------------

const DIR: &str = "/rekey-db";

fn open_on(
    fs: &CrashFileSystem,
    provider: impl okaywal::encryption::KeyProvider,
) -> sediment::Result<Database> {
    Config::for_directory(DIR)
        .file_system(fs.clone())
        .wal(|wal| {
            wal.checkpoint_after_bytes(64 << 10)
                .preallocate_bytes(64 << 10)
        })
        .encryption(provider)
        .open()
}

/// Both keys, key 2 current.
fn rotated() -> Arc<Keyring> {
    let ring = ring();
    ring.rotate(KeyId::new(2), key(2));
    ring
}

/// A store sealed under key 1 with blobs in several basins (one large
/// enough to span batches of the rekey), archived and freed ones, and a
/// few commit log files; returns its durable files and its blobs.
fn store_under_key_one() -> (BTreeMap<PathBuf, Vec<u8>>, BTreeMap<GrainId, Vec<u8>>) {
    let fs = CrashFileSystem::new();
    let db = open_on(&fs, ring()).unwrap();
    let mut stored = BTreeMap::new();
    for round in 0..6_u64 {
        let blobs: Vec<Vec<u8>> = [30, 900, 9000, 70_000]
            .iter()
            .map(|&len| blob(round << 8 | len as u64, len))
            .chain((round == 0).then(|| blob(99, 1_500_000)))
            .collect();
        let ids = commit(&db, &blobs);
        for (id, data) in ids.iter().zip(blobs) {
            stored.insert(*id, data);
        }
        if round % 2 == 0 {
            free(&db, ids[0]);
            stored.remove(&ids[0]);
        }
    }
    db.shutdown().unwrap();
    fs.power_loss(PowerLoss::Clean);
    let mut files = BTreeMap::new();
    for name in fs.list_files(Path::new(DIR)).unwrap() {
        let path = Path::new(DIR).join(name);
        files.insert(path.clone(), fs.contents(&path).unwrap());
    }
    (files, stored)
}

fn disk_with(files: &BTreeMap<PathBuf, Vec<u8>>) -> CrashFileSystem {
    let fs = CrashFileSystem::new();
    fs.create_dir_all(Path::new(DIR)).unwrap();
    for (path, bytes) in files {
        let file = fs.open(path, OpenMode::Create).unwrap();
        file.write_all_at(bytes, 0).unwrap();
        file.sync_data().unwrap();
    }
    fs.sync_dir(Path::new(DIR)).unwrap();
    fs
}

fn check_store(
    db: &Database,
    stored: &BTreeMap<GrainId, Vec<u8>>,
    context: &str,
) -> Result<(), String> {
    for (id, data) in stored {
        match db.get(*id) {
            Ok(Some(bytes)) if bytes == *data => {}
            other => {
                return Err(format!(
                    "{context}: {id} reads {:?}",
                    other.map(|b| b.map(|b| b.len()))
                ))
            }
        }
    }
    db.verify().map_err(|e| format!("{context}: verify: {e}"))?;
    Ok(())
}

/// A power cut at the `nth` `operation` of a rekey, then: every blob
/// reads (with both keys), a second rekey finishes, and the store opens
/// and reads with key 2 alone.
fn cut_during_rekey(
    files: &BTreeMap<PathBuf, Vec<u8>>,
    stored: &BTreeMap<GrainId, Vec<u8>>,
    operation: Operation,
    nth: u64,
    policy: PowerLoss,
) -> Result<bool, String> {
    let fs = disk_with(files);
    let db = open_on(&fs, rotated()).map_err(|e| format!("open: {e}"))?;
    fs.inject(
        operation,
        fs.operation_count(operation) + nth,
        FaultKind::PowerOff,
    );
    let finished = db.rekey().is_ok();
    drop(db);
    let fired = fs.is_powered_off();
    fs.power_loss(policy);
    let db = open_on(&fs, rotated()).map_err(|e| format!("reopen: {e}"))?;
    check_store(&db, stored, "after the cut")?;
    let report = db.rekey().map_err(|e| format!("second rekey: {e}"))?;
    if report.key_ids_in_use != vec![KeyId::new(2)] || !report.problems.is_empty() {
        return Err(format!("second rekey left {report:?}"));
    }
    check_store(&db, stored, "after the second rekey")?;
    drop(db);
    let db = open_on(&fs, StaticKey::with_id(KeyId::new(2), key(2)))
        .map_err(|e| format!("open with key 2 alone: {e}"))?;
    check_store(&db, stored, "with key 2 alone")?;
    if fired && finished {
        return Err("the rekey returned Ok although the power went".into());
    }
    Ok(fired)
}

#[test]
fn a_power_cut_at_any_sync_or_write_of_a_rekey_loses_nothing() {
    let mut rng = Rng::new(seed(
        "a_power_cut_at_any_sync_or_write_of_a_rekey_loses_nothing",
    ));
    let (files, stored) = store_under_key_one();
    // A fault-free rekey: how many syncs and writes it makes.
    let fs = disk_with(&files);
    let db = open_on(&fs, rotated()).unwrap();
    let (syncs, writes) = (
        fs.operation_count(Operation::Sync),
        fs.operation_count(Operation::Write),
    );
    let report = db.rekey().unwrap();
    assert_eq!(report.key_ids_in_use, vec![KeyId::new(2)]);
    assert!(
        report.blobs_resealed as usize >= stored.len() / 2,
        "{report:?}"
    );
    let syncs = fs.operation_count(Operation::Sync) - syncs;
    let writes = fs.operation_count(Operation::Write) - writes;
    drop(db);

    let mut failures = Vec::new();
    let mut fired = 0;
    let mut points = Vec::new();
    for nth in 0..syncs + 1 {
        points.push((Operation::Sync, nth, PowerLoss::Clean));
        points.push((Operation::Sync, nth, PowerLoss::Random(rng.next_u64())));
    }
    // Writes sampled (a third of them torn, some with a sector hole), from
    // a random start so that runs cover them all over time.
    let start = rng.below(3);
    for nth in (start..writes + 1).step_by(3) {
        points.push((Operation::Write, nth, PowerLoss::TornPrefix));
        if nth % 2 == 0 {
            points.push((Operation::Write, nth, PowerLoss::SectorHole));
        }
    }
    for (operation, nth, policy) in &points {
        match cut_during_rekey(&files, &stored, *operation, *nth, *policy) {
            Ok(true) => fired += 1,
            Ok(false) => {}
            Err(e) => failures.push(format!("{operation:?} #{nth} {policy:?}: {e}")),
        }
    }
    println!(
        "{} power cuts during a rekey of {syncs} syncs and {writes} writes ({fired} fired)",
        points.len()
    );
    assert!(
        failures.is_empty(),
        "{} failed; first: {}",
        failures.len(),
        failures[0]
    );
    assert!(
        fired * 2 > points.len(),
        "only {fired} of {} cuts fired",
        points.len()
    );
}

#[test]
fn readers_and_writers_running_through_a_rekey_see_only_their_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let ring = ring();
    let db = open(dir.path(), ring.clone()).unwrap();
    let mut kept = BTreeMap::new();
    for round in 0..8_u64 {
        let blobs: Vec<Vec<u8>> = [50, 2000, 30_000, 90_000, 400_000]
            .iter()
            .map(|&len| blob(round << 20 | len, len as usize))
            .collect();
        for (id, data) in commit(&db, &blobs).into_iter().zip(blobs) {
            kept.insert(id, data);
        }
    }
    db.checkpoint_wal().unwrap();
    ring.rotate(KeyId::new(2), key(2));
    let kept: Vec<(GrainId, Vec<u8>)> = kept.into_iter().collect();
    let done = std::sync::atomic::AtomicBool::new(false);
    let written = std::thread::scope(|scope| {
        let readers: Vec<_> = (0..2_u64)
            .map(|reader| {
                let (db, kept, done) = (&db, &kept, &done);
                scope.spawn(move || {
                    let mut rng = Rng::new(reader);
                    let mut reads = 0;
                    while !done.load(std::sync::atomic::Ordering::Acquire) || reads < 50 {
                        let (id, data) = &kept[rng.below(kept.len() as u64) as usize];
                        let read = db.read(*id).unwrap().expect("a kept blob");
                        let mut bytes = Vec::new();
                        std::io::Read::read_to_end(&mut { read }, &mut bytes)
                            .unwrap_or_else(|e| panic!("reading {id}: {e}"));
                        assert!(bytes == *data, "{id} read other bytes");
                        reads += 1;
                    }
                    reads
                })
            })
            .collect();
        let writer = {
            let (db, done) = (&db, &done);
            scope.spawn(move || {
                let mut own = Vec::new();
                let mut tag = 1 << 40;
                while !done.load(std::sync::atomic::Ordering::Acquire) || own.len() < 20 {
                    tag += 1;
                    let data = blob(tag, (tag % 7) as usize * 20_000 + 10);
                    let id = commit(db, std::slice::from_ref(&data))[0];
                    own.push((id, data));
                    if tag % 3 == 0 {
                        let (id, _) = own.remove(0);
                        free(db, id);
                    }
                }
                own
            })
        };
        let report = db.rekey().unwrap();
        done.store(true, std::sync::atomic::Ordering::Release);
        assert!(report.problems.is_empty(), "{report:?}");
        assert_eq!(report.key_ids_in_use, vec![KeyId::new(2)]);
        for reader in readers {
            assert!(reader.join().unwrap() >= 50);
        }
        writer.join().unwrap()
    });
    db.shutdown().unwrap();
    assert!(ring.retire(KeyId::new(1)));
    let db = open(dir.path(), StaticKey::with_id(KeyId::new(2), key(2))).unwrap();
    for (id, data) in kept.iter().chain(&written) {
        common::assert_blob(&db, *id, data, "after the rekey, with key 2 alone");
    }
    assert_eq!(db.verify().unwrap().key_ids_in_use, vec![KeyId::new(2)]);
}

#[test]
fn damaged_commit_log_bytes_cost_records_never_blobs_or_a_key_error() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path(), ring()).unwrap();
    let mut stored = BTreeMap::new();
    for round in 0..20_u64 {
        let blobs = vec![blob(round, 100), blob(round + 100, 3000)];
        for (id, data) in commit(&db, &blobs).into_iter().zip(blobs) {
            stored.insert(id, data);
        }
    }
    db.shutdown().unwrap();
    let name = common::files(dir.path())
        .into_keys()
        .find(|n| n.starts_with("commits-"))
        .unwrap();
    let path = dir.path().join(&name);
    let original = std::fs::read(&path).unwrap();
    // The first frame's sealed length, its record's seal, its record, and
    // a byte further on.
    for at in [0, 46, 60, 100, original.len() / 2, original.len() - 1] {
        let mut damaged = original.clone();
        damaged[at] ^= 0x08;
        std::fs::write(&path, &damaged).unwrap();
        let db = open(dir.path(), ring()).unwrap();
        check(&db, &stored, &format!("flip at {at} of {name}"));
        match db.commit_log(sediment::SequenceId(0)) {
            Err(Error::CommitLogDamaged(damage)) => {
                assert_eq!(damage.path, path, "flip at {at}");
                assert!(damage.what.contains("authentication"), "{damage}");
            }
            other => panic!("flip at {at}: commit_log gave {other:?}"),
        }
        let report = db.verify_report(|_, _| {}).unwrap();
        assert_eq!(report.commit_log_damage.len(), 1, "flip at {at}: {report}");
        drop(db);
    }
    std::fs::write(&path, &original).unwrap();
    let db = open(dir.path(), ring()).unwrap();
    db.verify().unwrap();
}

#[test]
fn a_damaged_index_copy_is_damage_not_a_key_error() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path(), ring()).unwrap();
    let ids = commit(&db, &[blob(1, 100)]);
    db.shutdown().unwrap();
    let path = dir.path().join("index");
    let original = std::fs::read(&path).unwrap();
    // Each part of copy 0: version, key check (key id, nonce, tag), body
    // seal, body.
    for at in [8, 16, 20, 50, 62, 90, 110, 500] {
        let mut damaged = std::fs::read(&path).unwrap();
        damaged[at] ^= 0x40;
        std::fs::write(&path, &damaged).unwrap();
        let db = open(dir.path(), ring()).unwrap();
        assert_eq!(db.get(ids[0]).unwrap(), Some(blob(1, 100)), "flip at {at}");
        drop(db);
        // Copy 0 was sealed again (with a new nonce) from copy 1; now copy 1
        // alone is damaged, and copy 0 serves.
        let mut damaged = std::fs::read(&path).unwrap();
        assert!(
            damaged[..4096] != original[..4096],
            "flip at {at}: copy 0 rewritten"
        );
        damaged[4096 + at] ^= 0x40;
        std::fs::write(&path, &damaged).unwrap();
        let db = open(dir.path(), ring()).unwrap();
        assert_eq!(
            db.get(ids[0]).unwrap(),
            Some(blob(1, 100)),
            "flip at {at} of copy 1"
        );
        db.verify().unwrap();
    }
    let mut both = original.clone();
    both[110] ^= 1;
    both[4096 + 110] ^= 1;
    std::fs::write(&path, &both).unwrap();
    match open(dir.path(), ring()) {
        Err(Error::Corrupt {
            path: reported,
            what,
        }) => {
            assert_eq!(reported, path);
            assert!(what.contains("both index header copies"), "{what}");
        }
        other => panic!("both copies damaged: {:?}", other.map(|_| ())),
    }
}

const WAL_DIR: &str = "/wal-images";

/// An encrypted store on the simulated disk whose WAL keeps what it holds
/// (no checkpoint until it is 1 GiB).
fn open_keeping_the_wal(fs: &CrashFileSystem) -> sediment::Result<Database> {
    Config::for_directory(WAL_DIR)
        .file_system(fs.clone())
        .wal(|wal| {
            wal.checkpoint_after_bytes(1 << 30)
                .preallocate_bytes(64 << 10)
        })
        .encryption(ring())
        .open()
}

/// Committed transactions: each one's blobs, in order.
type Transactions = Vec<Vec<(GrainId, Vec<u8>)>>;

/// Three committed transactions of three blobs each (the first two of
/// the same length), still in the WAL when the power goes out.
fn blobs_left_in_the_wal() -> (CrashFileSystem, Transactions) {
    let fs = CrashFileSystem::new();
    let db = open_keeping_the_wal(&fs).unwrap();
    let mut transactions = Vec::new();
    for round in 0..3_u64 {
        let blobs: Vec<Vec<u8>> = [900, 900, 3000]
            .iter()
            .enumerate()
            .map(|(i, &len)| blob(round << 16 | (i as u64) << 12 | len as u64, len))
            .collect();
        let ids = commit(&db, &blobs);
        transactions.push(ids.into_iter().zip(blobs).collect());
    }
    power_cut(&fs, db);
    (fs, transactions)
}

/// Every WAL entry's chunks, read with okaywal itself: whether each was
/// pre-sealed, and its bytes.
#[derive(Debug, Clone, Default)]
struct WalChunks(Arc<parking_lot::Mutex<Vec<WalEntryChunks>>>);

/// One WAL entry's chunks: whether each was pre-sealed, its bytes.
type WalEntryChunks = Vec<(bool, Vec<u8>)>;

impl okaywal::LogManager for WalChunks {
    fn recover(&mut self, entry: &mut okaywal::Entry<'_>) -> std::io::Result<()> {
        let mut chunks = Vec::new();
        while let okaywal::ReadChunkResult::Chunk(mut chunk) = entry.read_chunk()? {
            chunks.push((chunk.is_presealed(), chunk.read_all()?));
        }
        self.0.lock().push(chunks);
        Ok(())
    }

    fn checkpoint_to(
        &mut self,
        _: okaywal::EntryId,
        _: &mut okaywal::SegmentReader,
        _: &okaywal::WriteAheadLog,
    ) -> std::io::Result<()> {
        Ok(())
    }
}

fn wal_config(fs: &CrashFileSystem) -> okaywal::Configuration {
    okaywal::Configuration::default_for(WAL_DIR)
        .file_system(fs.clone())
        .encryption(ring())
}

#[test]
fn blobs_enter_an_encrypted_wal_as_images_sealed_once_and_replay_from_it() {
    let (fs, transactions) = blobs_left_in_the_wal();
    let chunks = WalChunks::default();
    let log = wal_config(&fs).open_read_only(chunks.clone()).unwrap();
    drop(log);
    let entries = chunks.0.lock().clone();
    assert_eq!(entries.len(), 3);
    for (entry, written) in entries.iter().zip(&transactions) {
        let (record, images) = entry.split_last().unwrap();
        // The commit record is sealed by the log; each blob's image by
        // the store, and the log stores it as it is.
        assert!(!record.0);
        assert_eq!(record.1[0], 2);
        assert_eq!(images.len(), written.len());
        for (n, ((presealed, bytes), (_, data))) in images.iter().zip(written).enumerate() {
            assert!(*presealed);
            assert_eq!(bytes[0], 3, "an image chunk");
            assert_eq!(
                bytes[1..5],
                (n as u32).to_le_bytes(),
                "its place in the record"
            );
            assert!(bytes.len() > 5 + data.len(), "the image carries its seals");
            if data.len() >= 16 {
                assert!(!bytes.windows(16).any(|w| w == &data[..16]));
            }
        }
    }
    // Replayed from the WAL, then checkpointed into the strata.
    let stored: BTreeMap<GrainId, Vec<u8>> = transactions.into_iter().flatten().collect();
    let db = open_keeping_the_wal(&fs).unwrap();
    check(&db, &stored, "replayed from the WAL");
    db.verify().unwrap();
    db.shutdown().unwrap();
    let db = open_keeping_the_wal(&fs).unwrap();
    check(&db, &stored, "after the checkpoint");
    db.verify().unwrap();
    db.shutdown().unwrap();
}

/// The WAL file and the (offset, length) of the data of every image
/// chunk in it, in order.
fn image_chunks(fs: &CrashFileSystem) -> (PathBuf, Vec<(usize, usize)>) {
    let inspection = wal_config(fs).inspect().unwrap();
    assert_eq!(inspection.segments.len(), 1);
    let listing = wal_config(fs)
        .inspect_segment(inspection.segments[0].id)
        .unwrap();
    let bytes = fs.contents(&listing.path).unwrap();
    // Image chunks are the pre-sealed ones: record kind 5, in the clear in
    // the record header's first byte. (The first byte of a chunk the log
    // sealed is its first frame's random nonce, which is 3, an image
    // chunk's tag, one time in 256.)
    let images: Vec<(usize, usize)> = listing
        .records
        .iter()
        .filter(|record| record.kind == okaywal::RecordType::Chunk)
        .filter(|record| bytes[record.offset as usize] == 5)
        .map(|record| (record.offset as usize + 69, record.length as usize))
        .collect();
    assert!(images.iter().all(|(at, _)| bytes[*at] == 3), "image tags");
    (listing.path, images)
}

/// Changes the data at `at..at + len` of the WAL file with `edit`, and
/// writes the CRC that follows it again, as someone who meant it would.
fn edit_image_chunk(
    fs: &CrashFileSystem,
    path: &Path,
    at: usize,
    len: usize,
    edit: impl FnOnce(&mut [u8]),
) {
    let mut bytes = fs.contents(path).unwrap();
    edit(&mut bytes[at..at + len]);
    let crc = crc32fast::hash(&bytes[at..at + len]);
    bytes[at + len..at + len + 4].copy_from_slice(&crc.to_le_bytes());
    assert!(fs.set_contents(path, bytes));
}

/// Every blob reads back as written, except `damaged`, which must fail
/// (in the WAL and, after a checkpoint, in the strata), never read back.
fn only_these_are_damaged(
    fs: &CrashFileSystem,
    transactions: &[Vec<(GrainId, Vec<u8>)>],
    damaged: &[GrainId],
    what: &str,
) {
    for pass in ["replayed from the WAL", "after the checkpoint"] {
        let db = open_keeping_the_wal(fs).unwrap_or_else(|e| panic!("{what}: {e}"));
        for (id, data) in transactions.iter().flatten() {
            match db.get(*id) {
                Ok(Some(bytes)) if bytes == *data && !damaged.contains(id) => {}
                Err(_) if damaged.contains(id) => {}
                other => panic!(
                    "{what}, {pass}: {id} gave {:?}",
                    other.map(|b| b.map(|b| b.len()))
                ),
            }
        }
        let report = db.verify_report(|_, _| {}).unwrap();
        for id in damaged {
            assert!(
                report.problems.iter().any(|p| p.grain == Some(*id)),
                "{what}, {pass}: verify does not name {id}: {report}"
            );
        }
        db.shutdown().unwrap();
    }
}

#[test]
fn a_changed_image_in_the_wal_with_its_crc_fixed_is_damage_never_data() {
    let (fs, transactions) = blobs_left_in_the_wal();
    let (path, images) = image_chunks(&fs);
    assert_eq!(images.len(), 9);
    // The second blob of the second transaction: one byte of its image.
    let (at, len) = images[4];
    edit_image_chunk(&fs, &path, at, len, |data| data[len / 2] ^= 1);
    only_these_are_damaged(
        &fs,
        &transactions,
        &[transactions[1][1].0],
        "a changed image",
    );
}

#[test]
fn images_renumbered_in_the_wal_are_damage_never_each_others_bytes() {
    let (fs, transactions) = blobs_left_in_the_wal();
    let (path, images) = image_chunks(&fs);
    // The first two blobs of the last transaction (of the same length, so
    // each image fits the other's grains) swap their grains.
    let (first, second) = (images[6], images[7]);
    edit_image_chunk(&fs, &path, first.0, first.1, |data| {
        data[1..5].copy_from_slice(&1_u32.to_le_bytes())
    });
    edit_image_chunk(&fs, &path, second.0, second.1, |data| {
        data[1..5].copy_from_slice(&0_u32.to_le_bytes())
    });
    only_these_are_damaged(
        &fs,
        &transactions,
        &[transactions[2][0].0, transactions[2][1].0],
        "two images renumbered",
    );
}

#[test]
fn a_presealed_wal_chunk_made_into_a_commit_record_is_refused() {
    let (fs, _) = blobs_left_in_the_wal();
    let (path, images) = image_chunks(&fs);
    let (at, len) = images[0];
    edit_image_chunk(&fs, &path, at, len, |data| data[0] = 2);
    let error = open_keeping_the_wal(&fs).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("a chunk the log did not seal has tag 2"),
        "{error}"
    );
    // A renumbering past the record's new grains is refused too.
    let (fs, _) = blobs_left_in_the_wal();
    let (path, images) = image_chunks(&fs);
    let (at, len) = images[0];
    edit_image_chunk(&fs, &path, at, len, |data| {
        data[1..5].copy_from_slice(&7_u32.to_le_bytes())
    });
    let error = open_keeping_the_wal(&fs).unwrap_err();
    assert!(
        error.to_string().contains("names new grain 7 of 3"),
        "{error}"
    );
}

#[test]
fn a_store_whose_wal_predates_image_chunks_opens_reads_and_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let (mut stored, ids) = common::copy_fixture("encrypted-wal-format-2", dir.path());
    assert_eq!(stored.len(), 80);
    let wal =
        || okaywal::Configuration::default_for(dir.path()).encryption(StaticKey::new([0x42; 32]));
    let listing = wal().inspect_segment(9).unwrap();
    assert!(
        matches!(
            listing.header,
            okaywal::HeaderStatus::Valid {
                format_version: 2,
                ..
            }
        ),
        "{:?}",
        listing.header
    );
    let open = || {
        Config::for_directory(dir.path())
            .encryption(StaticKey::new([0x42; 32]))
            .open()
            .unwrap()
    };
    // Transactions 9 to 16 replay from the version 2 WAL.
    let db = open();
    check(&db, &stored, "replayed from a version 2 WAL");
    assert_eq!(db.embedded_header(), Some(ids[3]));
    assert_eq!(db.last_committed().0, 16);
    db.verify().unwrap();
    let new = vec![blob(1, 500), blob(2, 2000)];
    let new_ids = commit(&db, &new);
    for (id, data) in new_ids.into_iter().zip(new) {
        stored.insert(id, data);
    }
    db.shutdown().unwrap();
    let db = open();
    check(&db, &stored, "reopened");
    db.verify().unwrap();
    db.shutdown().unwrap();
}
