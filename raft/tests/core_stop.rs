//! A node whose Raft core stops cannot serve anything any more: its
//! `RunningNode::wait` returns the error (so the binary exits non-zero and
//! a supervisor restarts it) instead of serving 503s forever.

use std::time::Duration;

use sediment_raft::node::{self, NodeConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_returns_an_error_when_the_raft_core_stops() {
    let dir = tempfile::tempdir().unwrap();
    let config = NodeConfig {
        heartbeat_ms: 100,
        ..NodeConfig::new(1, "127.0.0.1:0".parse().unwrap(), dir.path())
    };
    let running = node::start(config).await.unwrap();
    let raft = running.raft.clone();
    let addr = running.addr;
    let waiting = tokio::spawn(running.wait());

    // Serving until the core stops.
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/cluster/metrics");
    assert_eq!(client.get(&url).send().await.unwrap().status(), 200);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "wait returned while Raft ran");

    raft.shutdown().await.unwrap();
    let result = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("wait returned after the core stopped")
        .unwrap();
    let message = result.expect_err("a stopped core is an error").to_string();
    assert!(message.contains("Raft core stopped"), "{message}");
    // And the server is gone with it.
    assert!(client.get(&url).send().await.is_err());
}
