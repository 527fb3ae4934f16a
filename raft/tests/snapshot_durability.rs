//! A snapshot never claims applies that its store has not made durable.
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
