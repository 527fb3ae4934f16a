//! Three nodes in one process share one crash-simulating disk (each in its
//! own directory) under concurrent client writes; the power goes out for
//! all three at once at a chosen sync or rename, the disk keeps what was
//! synced (or a torn or random part of the rest), and the restarted
//! cluster still holds every write a client was told succeeded, on every
//! node.
//!
//! With pre-staging (`FORMAT.md`, "Pre-staged entries") the followers
//! write and sync each entry while the leader syncs its own, so at the cut
//! their logs may hold staged entries openraft never acknowledged, synced
//! or not, and a node that voted on its shorter view restarts with them
//! as part of its log; a follower may also hold, synced, an entry its
//! leader lost. The restarted nodes must then agree on every entry: each
//! node's whole state is compared, not only the acknowledged writes. (Had
//! the old leader resumed its term after the restart, it would have
//! written other entries under the log ids of the ones it lost, and a
//! follower holding those would have kept them: this test caught that.)

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use okaywal::fs::{CrashFileSystem, FaultKind, Operation, PowerLoss};
use openraft::{BasicNode, ServerState};
use parking_lot::Mutex;
use sediment_raft::metrics::StageCounters;
use sediment_raft::node::{self, NodeConfig, RunningNode};

const IDS: [u64; 3] = [1, 2, 3];

fn config(id: u64, listen: SocketAddr, fs: &CrashFileSystem, snapshots: &Path) -> NodeConfig {
    NodeConfig {
        heartbeat_ms: 50,
        // Small segments and frequent snapshots: checkpoints, archive
        // files, snapshot builds and purges all happen under the load.
        log_segment_bytes: 64 << 10,
        snapshot_logs: 150,
        keep_logs: 20,
        file_system: Arc::new(fs.clone()),
        snapshot_directory: Some(snapshots.join(format!("node-{id}"))),
        ..NodeConfig::new(id, listen, format!("/node-{id}"))
    }
}

/// Starts the nodes `ids` of `addrs` into `nodes`.
async fn start_nodes(
    nodes: &mut BTreeMap<u64, RunningNode>,
    ids: impl IntoIterator<Item = u64>,
    addrs: &BTreeMap<u64, SocketAddr>,
    fs: &CrashFileSystem,
    snapshots: &Path,
) {
    for id in ids {
        let running = node::start(config(id, addrs[&id], fs, snapshots))
            .await
            .unwrap_or_else(|e| panic!("node {id} starts: {e}"));
        nodes.insert(id, running);
    }
}

/// The node that leads, once one does.
async fn leader(nodes: &BTreeMap<u64, RunningNode>) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for (&id, running) in nodes {
            if running.raft.metrics().borrow().state == ServerState::Leader {
                return id;
            }
        }
        assert!(Instant::now() < deadline, "no leader within 30 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn value_of(writer: usize, n: usize) -> Vec<u8> {
    format!("writer {writer} write {n} ")
        .into_bytes()
        .repeat(1 + n % 9)
}

/// Writes through the leader from several clients until the power goes
/// out; returns every acknowledged write.
async fn write_until_power_off(base: String, fs: &CrashFileSystem) -> BTreeMap<String, Vec<u8>> {
    let acknowledged = Arc::new(Mutex::new(BTreeMap::new()));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let mut tasks = Vec::new();
    for writer in 0..4 {
        let (client, acknowledged, fs, base) = (
            client.clone(),
            acknowledged.clone(),
            fs.clone(),
            base.clone(),
        );
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

/// One run: returns the writes acknowledged and the follower appends that
/// found their entries staged.
async fn cluster_power_cut_at(seed: u64) -> (usize, u64) {
    let fs = CrashFileSystem::new();
    let snapshots = tempfile::tempdir().unwrap();
    // Each node's address, from a first start on port 0.
    let mut addrs = BTreeMap::new();
    let mut nodes = BTreeMap::new();
    for id in IDS {
        let running = node::start(config(
            id,
            "127.0.0.1:0".parse().unwrap(),
            &fs,
            snapshots.path(),
        ))
        .await
        .unwrap();
        addrs.insert(id, running.addr);
        nodes.insert(id, running);
    }
    let members: BTreeMap<u64, BasicNode> = addrs
        .iter()
        .map(|(&id, addr)| (id, BasicNode::new(addr.to_string())))
        .collect();
    nodes[&1].raft.initialize(members).await.unwrap();
    let first = leader(&nodes).await;

    // Mostly syncs, spread over the run; every fourth cut at a rename (a
    // log checkpoint's metadata, a snapshot, a store's checkpoint).
    let (operation, nth) = if seed % 4 == 3 {
        (Operation::Rename, 1 + seed / 4)
    } else {
        (Operation::Sync, 1 + seed * 41)
    };
    fs.inject(
        operation,
        fs.operation_count(operation) + nth,
        FaultKind::PowerOff,
    );
    let acknowledged = write_until_power_off(format!("http://{}", addrs[&first]), &fs).await;
    assert!(fs.is_powered_off(), "seed {seed}: the power went out");
    let prestaged: u64 = nodes
        .values()
        .map(|n| StageCounters::get(&n.log_store.stage_counters().appends_prestaged))
        .sum();
    // The nodes' stores failed with the disk: their shutdowns report that.
    for (_, running) in std::mem::take(&mut nodes) {
        let _ = running.shutdown().await;
    }
    fs.power_loss(match seed % 3 {
        0 => PowerLoss::Clean,
        1 => PowerLoss::TornPrefix,
        _ => PowerLoss::Random(seed),
    });

    // Every other run restarts the two followers first: one of them leads
    // from a log that may hold staged entries nobody acknowledged, and
    // commits with the other before the old leader is back.
    let mut nodes = BTreeMap::new();
    let (early, late): (Vec<u64>, Vec<u64>) = if seed % 2 == 1 {
        IDS.iter().partition(|&&id| id != first)
    } else {
        (IDS.to_vec(), Vec::new())
    };
    start_nodes(&mut nodes, early, &addrs, &fs, snapshots.path()).await;
    let new_leader = leader(&nodes).await;
    // A write of the new term commits only with every entry before it.
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let index = loop {
        let target = leader(&nodes).await;
        let response = client
            .put(format!("http://{}/kv/after-the-cut", addrs[&target]))
            .body("x")
            .send()
            .await;
        if let Ok(response) = response {
            if response.status() == 200 {
                let body: serde_json::Value = response.json().await.unwrap();
                break body["log_index"].as_u64().unwrap();
            }
        }
        assert!(
            Instant::now() < deadline,
            "seed {seed}: no write after the restart"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    start_nodes(&mut nodes, late, &addrs, &fs, snapshots.path()).await;
    let mut states = Vec::new();
    for (&id, running) in &nodes {
        running
            .raft
            .wait(Some(Duration::from_secs(30)))
            .applied_index_at_least(Some(index), "caught up after the cut")
            .await
            .unwrap_or_else(|e| panic!("seed {seed}: node {id} did not catch up: {e}"));
        // Every node applied the same entries: the same keys and values.
        let state: BTreeMap<String, Option<Vec<u8>>> = running
            .state_machine
            .keys()
            .into_iter()
            .map(|key| {
                let value = running.state_machine.get(&key).unwrap();
                (key, value)
            })
            .collect();
        assert_eq!(
            state.get("after-the-cut"),
            Some(&Some(b"x".to_vec())),
            "seed {seed}: node {id}"
        );
        states.push((id, state));
        for (key, value) in &acknowledged {
            let found = running.state_machine.get(key).unwrap();
            assert_eq!(
                found.as_deref(),
                Some(&value[..]),
                "seed {seed}: acknowledged write {key} on node {id} after a power cut at \
                 {operation:?} #{nth} (leader {first}, then {new_leader})"
            );
        }
    }
    for (id, state) in &states[1..] {
        let (first_id, first_state) = &states[0];
        if state != first_state {
            let differ: Vec<&String> = first_state
                .keys()
                .chain(state.keys())
                .filter(|key| first_state.get(*key) != state.get(*key))
                .collect();
            panic!("seed {seed}: nodes {first_id} and {id} differ at {differ:?}");
        }
    }
    println!(
        "seed {seed}: power off at {operation:?} #{nth}: {} writes acknowledged, {prestaged} \
         follower appends found staged, leader {first} then {new_leader}",
        acknowledged.len()
    );
    for (_, running) in nodes {
        running.shutdown().await.unwrap();
    }
    (acknowledged.len(), prestaged)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_writes_survive_a_power_cut_of_the_whole_cluster() {
    let started = Instant::now();
    let (mut acknowledged, mut prestaged) = (0, 0);
    const CUTS: u64 = 16;
    for seed in 0..CUTS {
        let (n, p) = cluster_power_cut_at(seed).await;
        acknowledged += n;
        prestaged += p;
    }
    assert!(acknowledged > 0, "some writes were acknowledged");
    assert!(
        prestaged > 0,
        "followers found entries staged before the cuts"
    );
    println!(
        "{acknowledged} acknowledged writes checked on three nodes, {prestaged} staged appends, \
         in {:?}",
        started.elapsed()
    );
}
