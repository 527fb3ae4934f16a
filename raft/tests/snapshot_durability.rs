//! Snapshot files: a snapshot never claims applies that its store has not
//! made durable, and the snapshot directory's files that the node did not
//! write are left alone.
//!
//! openraft builds snapshots beside its applies and then purges the log up
//! to the snapshot (less the entries it keeps). A snapshot whose last
//! applied id is ahead of what the store made durable would, after a power
//! cut, leave the store behind a log that no longer holds the entries to
//! apply again. Here applies run on another thread while snapshots are
//! built, on a crash-simulating disk whose operations wait at random (a
//! sync also between choosing the writes it covers and making them
//! durable, which is where an apply could slip in); the power goes out as
//! soon as a snapshot is built, and the reopened store must have applied at
//! least what the snapshot claims, with the store encrypted and not.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use okaywal::encryption::StaticKey;
use okaywal::fs::{CrashFileSystem, PowerLoss};
use openraft::{CommittedLeaderId, EntryPayload};
use sediment_raft::types::{Entry, LogId, Request};
use sediment_raft::{StateMachine, StateMachineConfig};

fn put(index: u64) -> Entry {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(Request::Put {
            key: format!("key-{}", index % 8),
            value: format!("value {index}").into_bytes(),
        }),
    }
}

#[test]
fn a_snapshot_never_claims_applies_its_store_has_not_made_durable() {
    snapshots_claim_only_durable_applies(false);
}

#[test]
fn an_encrypted_snapshot_never_claims_applies_its_store_has_not_made_durable() {
    snapshots_claim_only_durable_applies(true);
}

fn snapshots_claim_only_durable_applies(encrypted: bool) {
    let snapshots = tempfile::tempdir().unwrap();
    for seed in 0..24_u64 {
        let fs = CrashFileSystem::new();
        let config = || {
            let config = StateMachineConfig {
                snapshot_directory: snapshots.path().join(seed.to_string()),
                ..StateMachineConfig::new("/node/state").file_system(Arc::new(fs.clone()))
            };
            if encrypted {
                config.encryption(StaticKey::new([5; 32]))
            } else {
                config
            }
        };
        let sm = StateMachine::open_with(config()).unwrap();
        sm.apply_entries(vec![put(1)]).unwrap();
        sm.sync().unwrap();
        fs.jitter(seed, Duration::from_micros(800));
        let stop = AtomicBool::new(false);
        let claimed = std::thread::scope(|scope| {
            let applier = scope.spawn(|| {
                let mut index = 2;
                while !stop.load(Ordering::SeqCst) {
                    if sm.apply_entries(vec![put(index)]).is_err() {
                        break;
                    }
                    index += 1;
                }
                index - 1
            });
            // Let applies land before and while the snapshot is built.
            std::thread::sleep(Duration::from_millis(3 + seed % 5));
            let (meta, _) = sm.build_snapshot_file().unwrap();
            // Nothing may make more of the store durable before the cut:
            // the applier stops at once, and the cut comes right after.
            stop.store(true, Ordering::SeqCst);
            let applied = applier.join().unwrap();
            fs.power_loss(PowerLoss::Clean);
            assert!(
                meta.last_log_id.map_or(0, |id| id.index) <= applied,
                "the snapshot claims an entry that was never applied"
            );
            meta.last_log_id
        });
        drop(sm);
        fs.jitter(0, Duration::ZERO);
        let sm = StateMachine::open_with(config()).unwrap();
        let durable = sm.applied().0;
        assert!(
            durable >= claimed,
            "seed {seed}: the snapshot claims applies through {claimed:?}, but after a \
             power cut the store had applied only through {durable:?}"
        );
        // Every key the durable state holds reads back.
        for key in sm.keys() {
            assert!(sm.get(&key).unwrap().is_some(), "seed {seed}: {key} lost");
        }
    }
}

/// A snapshot directory may be one the user chose (`NodeConfig::
/// snapshot_directory`) and hold files the node did not write: opening,
/// building and replacing snapshots leave them alone, while the node's
/// own leftovers (a snapshot half built or half received when it stopped)
/// are removed.
#[test]
fn files_the_node_did_not_write_in_its_snapshot_directory_are_left_alone() {
    let root = tempfile::tempdir().unwrap();
    let snapshots = root.path().join("snapshots");
    std::fs::create_dir_all(snapshots.join("backups")).unwrap();
    let foreign = [
        ("notes.txt", &b"my notes"[..]),
        ("backups/snapshot-copy", b"a copy"),
        ("snapshot.tar", b"an archive"),
        ("snapshot-backup-copy", b"not a snapshot"),
    ];
    for (name, bytes) in foreign {
        std::fs::write(snapshots.join(name), bytes).unwrap();
    }
    let leftovers = ["building-1-1-7-0", "incoming-4242-3", "snapshot-1-1-5-9"];
    for name in leftovers {
        std::fs::write(snapshots.join(name), b"half written").unwrap();
    }
    let config = || StateMachineConfig {
        snapshot_directory: snapshots.clone(),
        ..StateMachineConfig::new(root.path().join("state"))
    };
    let sm = StateMachine::open_with(config()).unwrap();
    for name in leftovers {
        assert!(!snapshots.join(name).exists(), "{name} is a leftover");
    }
    for index in 1..=3 {
        sm.apply_entries(vec![put(index)]).unwrap();
        sm.build_snapshot_file().unwrap();
    }
    sm.shutdown().unwrap();
    let sm = StateMachine::open_with(config()).unwrap();
    let (meta, _) = sm.current_snapshot().expect("the last snapshot");
    assert_eq!(meta.last_log_id.map(|id| id.index), Some(3));
    for (name, bytes) in foreign {
        assert_eq!(
            std::fs::read(snapshots.join(name)).unwrap(),
            bytes,
            "{name} was not the node's"
        );
    }
    let own: Vec<String> = std::fs::read_dir(&snapshots)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("snapshot-") && *n != "snapshot-backup-copy")
        .collect();
    assert_eq!(own.len(), 1, "older snapshots are replaced: {own:?}");
}
