//! A node whose disk fills up stops, naming the error, and loses nothing
//! it acknowledged; the others go on while they are a quorum, and once it
//! has room again and is started, it catches up with every acknowledged
//! write. Node 3's directory is on a small tmpfs mounted by the test
//! (which needs root, as CI has; elsewhere the test says it skips).
//! Real node processes on 127.0.0.1.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use common::{free_port, plain_client, put, Cluster, NodeProcess};
use testkit::disk::Tmpfs;

const ARGS: &[&str] = &["--heartbeat-ms", "50"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_disk_fills_stops_and_catches_up_with_every_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let small = match Tmpfs::mount(&dir.path().join("small-disk"), "16m") {
        Ok(mounted) => mounted,
        Err(why) => {
            eprintln!("skipped: cannot mount a tmpfs here ({})", why.trim());
            return;
        }
    };
    let mut nodes = BTreeMap::new();
    for id in [1_u64, 2, 3] {
        let parent = if id == 3 {
            small.path().to_path_buf()
        } else {
            dir.path().to_path_buf()
        };
        let mut node = NodeProcess {
            id,
            addr: format!("127.0.0.1:{}", free_port()),
            dir: parent.join(format!("node-{id}")),
            child: None,
            extra_args: ARGS.iter().map(|s| s.to_string()).collect(),
            scheme: "http",
        };
        node.start();
        nodes.insert(id, node);
    }
    let mut cluster = Cluster {
        nodes,
        client: plain_client(Duration::from_secs(10)),
        dir,
        security_args: Vec::new(),
        scheme: "http",
    };
    cluster.wait_up(&[1, 2, 3]).await;
    cluster.init().await;
    cluster.wait_for_leader(None, Duration::from_secs(20)).await;

    // 64 KiB values until node 3's 16 MiB are full, and some more.
    let value: Vec<u8> = (0..64 << 10).map(|i| (i % 251) as u8).collect();
    let bases = cluster.bases();
    let hint = AtomicU64::new(1);
    let mut acknowledged = Vec::new();
    let mut after_the_stop = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    for k in 0..1000 {
        let key = format!("k{k}");
        let give_up = || Instant::now() > deadline;
        if put(&cluster.client, &bases, &key, &value, &hint, give_up).await {
            acknowledged.push(key);
        }
        if !cluster.nodes.get_mut(&3).unwrap().is_running() {
            after_the_stop += 1;
            if after_the_stop > 20 {
                break;
            }
        }
    }
    assert!(
        after_the_stop > 20,
        "node 3 still runs after {} writes: {}",
        acknowledged.len(),
        cluster.nodes[&3].log()
    );
    assert!(
        cluster.nodes[&3].log().contains("No space left on device"),
        "{}",
        cluster.nodes[&3].log()
    );
    for id in [1, 2] {
        assert!(
            cluster.nodes.get_mut(&id).unwrap().is_running(),
            "node {id}"
        );
    }

    // With room again, node 3 starts and holds every acknowledged write.
    eprintln!(
        "{} writes acknowledged, {after_the_stop} after node 3 stopped",
        acknowledged.len()
    );
    small.grow("512m");
    let node = cluster.nodes.get_mut(&3).unwrap();
    node.kill(); // reaps the exited process
    node.start();
    cluster.wait_up(&[3]).await;
    let last = acknowledged
        .last()
        .expect("writes were acknowledged")
        .clone();
    cluster
        .wait_for_value(&[1, 2, 3], &last, &value, Duration::from_secs(60))
        .await;
    for id in [1, 2, 3] {
        for key in &acknowledged {
            assert_eq!(
                cluster.local_get(id, key).await.as_deref(),
                Some(&value[..]),
                "node {id}, {key}"
            );
        }
    }
    for node in cluster.nodes.values_mut() {
        node.stop();
    }
    drop(small);
}
