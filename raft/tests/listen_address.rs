//! A node restarted with a `--listen` other than the address its cluster
//! knows it by starts (a port mapping can make both right), but warns on
//! stderr: peers and redirected clients still go to the old address.

mod common;

use std::time::{Duration, Instant};

use common::{free_port, put_v, Cluster};

const ARGS: &[&str] = &["--heartbeat-ms", "50"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_on_another_address_warns_that_the_cluster_knows_the_old_one() {
    let mut cluster = Cluster::start(&[1, 2, 3], ARGS);
    cluster.wait_up(&[1, 2, 3]).await;
    cluster.init().await;
    let leader = cluster.wait_for_leader(None, Duration::from_secs(20)).await;
    assert_eq!(put_v(cluster.nodes[&leader].url("/kv/before")).await, 200);
    cluster.wait_caught_up(Duration::from_secs(20)).await;
    let moved = cluster.followers(leader)[0];
    let same = cluster.followers(leader)[1];

    // Restarted where it was: no warning.
    let node = cluster.nodes.get_mut(&same).unwrap();
    node.stop();
    node.start();
    cluster.wait_up(&[same]).await;

    // Restarted on another port.
    let node = cluster.nodes.get_mut(&moved).unwrap();
    node.stop();
    let old = node.addr.clone();
    node.addr = format!("127.0.0.1:{}", free_port());
    node.start();
    let new = cluster.nodes[&moved].addr.clone();
    cluster.wait_up(&[moved]).await;
    let expected = format!(
        "the cluster knows node {moved} as {old} but it listens on {new}: peers and redirected \
         clients go to {old}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cluster.nodes[&moved].log().contains(&expected) {
        assert!(
            Instant::now() < deadline,
            "no warning in node {moved}'s log: {}",
            cluster.nodes[&moved].log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !cluster.nodes[&same]
            .log()
            .contains("the cluster knows node"),
        "{}",
        cluster.nodes[&same].log()
    );
    // A fresh node knows no membership yet: nothing to compare.
    assert!(!cluster.nodes[&leader]
        .log()
        .contains("the cluster knows node"));
}
