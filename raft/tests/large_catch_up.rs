//! A follower that missed more large values than one AppendEntries body
//! may carry (65 MiB) catches up: the leader sends them a few at a time
//! (see `sediment_raft::limits`), where a single RPC with all of them
//! would be refused with 413 and replication to it would stall.

mod common;

use std::time::{Duration, Instant};

use common::Cluster;
use sediment_raft::limits::MAX_APPEND_BODY_BYTES;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_catches_up_on_more_than_one_body_of_large_values() {
    const VALUES: usize = 5;
    const LEN: usize = 15 << 20;
    const { assert!(VALUES * LEN > MAX_APPEND_BODY_BYTES) };
    let mut cluster = Cluster::start(&[1, 2, 3], &[]);
    cluster.wait_up(&[1, 2, 3]).await;
    cluster.init().await;
    let leader = cluster.wait_for_leader(None, Duration::from_secs(30)).await;
    let behind = *cluster.nodes.keys().find(|&&id| id != leader).unwrap();
    cluster.nodes.get_mut(&behind).unwrap().kill();

    let value = |i: usize| vec![b'a' + i as u8; LEN];
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    for i in 0..VALUES {
        let r = client
            .put(cluster.nodes[&leader].url(&format!("/kv/large-{i}")))
            .body(value(i))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    }

    cluster.nodes.get_mut(&behind).unwrap().start();
    let deadline = Instant::now() + Duration::from_secs(90);
    let last = format!("large-{}", VALUES - 1);
    while cluster.local_get_or_none(behind, &last).await.is_none() {
        assert!(
            Instant::now() < deadline,
            "node {behind} did not catch up; its log:\n{}",
            cluster.nodes[&behind].log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for i in 0..VALUES {
        let got = cluster
            .local_get_or_none(behind, &format!("large-{i}"))
            .await
            .expect("caught up");
        assert!(got == value(i), "large-{i} differs on node {behind}");
    }
}
