//! A whole node (Raft, its log and its state machine) on the
//! crash-simulating file system, under concurrent client writes: the power
//! goes out at a chosen sync, the disk keeps only what was synced (or a
//! torn or random part of the rest), and the restarted node still holds
//! every write a client was told succeeded. The state machine applies
//! without syncing, so after the cut it is usually behind the log; the
//! restarted node applies the missing entries again from its log. The
//! same runs are made with a node that encrypts its directory.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use okaywal::encryption::StaticKey;
use okaywal::fs::{CrashFileSystem, FaultKind, Operation, PowerLoss};
use parking_lot::Mutex;
use sediment_raft::node::{self, NodeConfig, RunningNode};
use sediment_raft::{LogStore, LogStoreConfig, StateMachine, StateMachineConfig};

const ROOT: &str = "/node";

/// The key of the encrypted runs.
fn key() -> StaticKey {
    StaticKey::new([0x42; 32])
}

fn config(fs: &CrashFileSystem, snapshots: &std::path::Path, encrypted: bool) -> NodeConfig {
    let config = NodeConfig {
        heartbeat_ms: 50,
        // Small segments and frequent snapshots: checkpoints, archive
        // files, snapshot builds and purges all happen under the load.
        log_segment_bytes: 64 << 10,
        snapshot_logs: 150,
        keep_logs: 20,
        file_system: Arc::new(fs.clone()),
        snapshot_directory: Some(snapshots.to_path_buf()),
        ..NodeConfig::new(1, "127.0.0.1:0".parse().unwrap(), ROOT)
    };
    if encrypted {
        config.with_key_provider(key())
    } else {
        config
    }
}

async fn start_leader(config: NodeConfig, initialize: bool) -> RunningNode {
    let running = node::start(config).await.expect("the node starts");
    if initialize {
        let members = BTreeMap::from([(1, openraft::BasicNode::new(running.addr.to_string()))]);
        running.raft.initialize(members).await.unwrap();
    }
    running
        .raft
        .wait(Some(Duration::from_secs(30)))
        .current_leader(1, "the node leads")
        .await
        .expect("the node becomes leader");
    running
}

fn value_of(writer: usize, n: usize) -> Vec<u8> {
    format!("writer {writer} write {n} ")
        .into_bytes()
        .repeat(1 + n % 9)
}

/// Writes through the HTTP API from several clients until the power goes
/// out; returns every acknowledged write.
async fn write_until_power_off(
    running: &RunningNode,
    fs: &CrashFileSystem,
) -> BTreeMap<String, Vec<u8>> {
    let acknowledged = Arc::new(Mutex::new(BTreeMap::new()));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut tasks = Vec::new();
    for writer in 0..6 {
        let (client, acknowledged, fs) = (client.clone(), acknowledged.clone(), fs.clone());
        let base = format!("http://{}", running.addr);
        tasks.push(tokio::spawn(async move {
            for n in 0..20_000 {
                if fs.is_powered_off() {
                    break;
                }
                let key = format!("w{writer}-{n}");
                let value = value_of(writer, n);
                let sent = client
                    .put(format!("{base}/kv/{key}"))
                    .body(value.clone())
                    .send()
                    .await;
                match sent {
                    Ok(response) if response.status() == 200 => {
                        acknowledged.lock().insert(key, value);
                    }
                    _ => break,
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let acknowledged = acknowledged.lock().clone();
    acknowledged
}

async fn power_cut_at(seed: u64, encrypted: bool) -> (usize, bool) {
    let fs = CrashFileSystem::new();
    let snapshots = tempfile::tempdir().unwrap();
    let running = start_leader(config(&fs, snapshots.path(), encrypted), true).await;
    // Mostly syncs, spread over the run; every fourth cut at a rename (a
    // log checkpoint's metadata, a snapshot, a store's checkpoint).
    let (operation, nth) = if seed % 4 == 3 {
        (Operation::Rename, 1 + seed / 4)
    } else {
        (Operation::Sync, 1 + seed * 14)
    };
    fs.inject(
        operation,
        fs.operation_count(operation) + nth,
        FaultKind::PowerOff,
    );
    let acknowledged = write_until_power_off(&running, &fs).await;
    assert!(fs.is_powered_off(), "seed {seed}: the power went out");
    // The node's stores failed with the disk: its shutdown reports that.
    let _ = running.shutdown().await;
    fs.power_loss(match seed % 3 {
        0 => PowerLoss::Clean,
        1 => PowerLoss::TornPrefix,
        _ => PowerLoss::Random(seed),
    });

    // What the disk kept, before Raft sees it: the log's last entry and
    // the state machine's last applied entry.
    let (log_last, applied) = tokio::task::spawn_blocking({
        let fs = fs.clone();
        let snapshots = snapshots.path().to_path_buf();
        move || {
            let mut log_config =
                LogStoreConfig::new(format!("{ROOT}/log")).file_system(Arc::new(fs.clone()));
            let mut sm_config = StateMachineConfig {
                snapshot_directory: snapshots,
                ..StateMachineConfig::new(format!("{ROOT}/state")).file_system(Arc::new(fs))
            };
            if encrypted {
                log_config = log_config.encryption(key());
                sm_config = sm_config.encryption(key());
            }
            let log = LogStore::open_with(log_config).unwrap();
            let sm = StateMachine::open_with(sm_config).unwrap();
            let last = log.log_state().last_log_id.map(|id| id.index);
            let applied = sm.applied().0.map(|id| id.index);
            log.shutdown().unwrap();
            sm.shutdown().unwrap();
            (last, applied)
        }
    })
    .await
    .unwrap();
    let behind = applied < log_last;

    let running = start_leader(config(&fs, snapshots.path(), encrypted), false).await;
    // A write of this term commits only once every earlier entry is
    // committed and applied.
    let client = reqwest::Client::new();
    let response = client
        .put(format!("http://{}/kv/after-the-cut", running.addr))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "seed {seed}: a write after restart");
    for (key, value) in &acknowledged {
        let found = running.state_machine.get(key).unwrap();
        assert_eq!(
            found.as_deref(),
            Some(&value[..]),
            "seed {seed}: acknowledged write {key} after a power cut at {operation:?} #{nth} \
             (log ended at {log_last:?}, state machine had applied {applied:?})"
        );
    }
    println!(
        "seed {seed}: power off at {operation:?} #{nth}: {} writes acknowledged, log ended at \
         {log_last:?}, state machine had applied {applied:?}",
        acknowledged.len()
    );
    running.shutdown().await.unwrap();
    (acknowledged.len(), behind)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_writes_survive_power_cuts_at_every_sync_point() {
    power_cuts(0..24, false).await;
}

/// The same with a node that encrypts its log, its store, its metadata
/// and its snapshots (other cut points than the plain runs').
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_writes_of_an_encrypted_node_survive_power_cuts() {
    power_cuts(100..112, true).await;
}

async fn power_cuts(seeds: std::ops::Range<u64>, encrypted: bool) {
    let started = Instant::now();
    let mut acknowledged = 0;
    let mut behind = 0;
    let cuts = seeds.end - seeds.start;
    for seed in seeds {
        let (n, was_behind) = power_cut_at(seed, encrypted).await;
        acknowledged += n;
        behind += usize::from(was_behind);
    }
    assert!(acknowledged > 0, "some writes were acknowledged");
    // The state machine does not sync its applies: a cut leaves it behind
    // the log, and the restarted node re-applied from there.
    assert!(
        behind > 0,
        "no cut left the state machine behind its log: applies were synced"
    );
    println!(
        "{acknowledged} acknowledged writes checked, {behind} of {cuts} restarts re-applied from the log, in {:?}",
        started.elapsed()
    );
}
