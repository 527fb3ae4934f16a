//! A write that no majority can commit: the leader of a 3-node cluster
//! whose two followers are down answers a `PUT` with a 503 that says so
//! within its write timeout (60 heartbeats), instead of keeping the client
//! waiting for as long as the outage lasts. Once the followers are back,
//! writes succeed again.

mod common;

use std::time::Duration;

use common::Cluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_without_a_quorum_gets_a_503_instead_of_hanging() {
    // 50 ms heartbeats: a 3 s write timeout, under the test client's 5 s.
    let mut cluster = Cluster::start(&[1, 2, 3], &["--heartbeat-ms", "50"]);
    cluster.wait_up(&[1, 2, 3]).await;
    cluster.init().await;
    let leader = cluster.wait_for_leader(None, Duration::from_secs(15)).await;
    let url = cluster.nodes[&leader].url("/kv/before");
    let r = cluster.client.put(&url).body("1").send().await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());

    let followers = cluster.followers(leader);
    for id in &followers {
        cluster.nodes.get_mut(id).unwrap().kill();
    }

    let url = cluster.nodes[&leader].url("/kv/during");
    let r = cluster
        .client
        .put(&url)
        .body("2")
        .send()
        .await
        .expect("the leader answers within the client's timeout");
    let status = r.status();
    let body = r.text().await.unwrap_or_default();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("not committed within 3000 ms"), "{body}");

    for id in &followers {
        cluster.nodes.get_mut(id).unwrap().start();
    }
    cluster.wait_up(&followers).await;
    let leader = cluster.wait_for_leader(None, Duration::from_secs(15)).await;
    let url = cluster.nodes[&leader].url("/kv/after");
    let mut acknowledged = false;
    for _ in 0..50 {
        let sent = cluster.client.put(&url).body("3").send().await;
        if matches!(&sent, Ok(r) if r.status() == 200) {
            acknowledged = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(acknowledged, "writes succeed again once a quorum is back");
}
