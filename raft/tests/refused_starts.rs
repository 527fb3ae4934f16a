//! Starts a node refuses with a message that says why, changing nothing
//! in its directory: a log directory deleted beside a state machine that
//! applied it (openraft would otherwise stop at its first vote check, on
//! every start), a port another process holds (the directory is not even
//! created) and a heartbeat interval of 0. Real node processes.

mod common;

use std::net::TcpListener;
use std::time::Duration;

use common::{files_under, run_node_to_exit, run_to_exit, Cluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_log_was_deleted_refuses_to_start_and_says_so() {
    let mut cluster = Cluster::start(&[1], &["--heartbeat-ms", "50"]);
    cluster.wait_up(&[1]).await;
    cluster.init().await;
    cluster.wait_for_leader(None, Duration::from_secs(20)).await;
    let response = cluster
        .client
        .put(cluster.nodes[&1].url("/kv/k"))
        .body("v")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    // A clean stop, so that the state machine has applied the write.
    let node = cluster.nodes.get_mut(&1).unwrap();
    node.stop();
    let dir = node.dir.clone();
    std::fs::remove_dir_all(dir.join("log")).unwrap();
    let state_before = files_under(&dir.join("state"));

    for _ in 0..2 {
        let (status, log) = run_node_to_exit(&dir, &[]);
        assert_eq!(status, Some(false), "{log}");
        assert!(log.contains("log/ was deleted or replaced"), "{log}");
        assert!(!log.contains("panicked"), "{log}");
    }
    assert_eq!(files_under(&dir.join("state")), state_before);
}

#[test]
fn a_node_whose_port_is_taken_creates_nothing() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("node");
    let (status, log) = run_to_exit(
        &[
            "node",
            "--id",
            "1",
            "--listen",
            &addr,
            "--dir",
            dir.to_str().unwrap(),
        ],
        &temp.path().join("node.log"),
    );
    assert_eq!(status, Some(false), "{log}");
    assert!(log.contains(&format!("listening on {addr}")), "{log}");
    assert!(!dir.exists(), "the refused start created {}", dir.display());
}

#[test]
fn a_heartbeat_of_zero_is_refused_clearly() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("node");
    let (status, log) = run_to_exit(
        &[
            "node",
            "--id",
            "1",
            "--heartbeat-ms",
            "0",
            "--listen",
            "127.0.0.1:0",
            "--dir",
            dir.to_str().unwrap(),
        ],
        &temp.path().join("node.log"),
    );
    assert_eq!(status, Some(false), "{log}");
    assert!(
        log.contains("heartbeat interval must be at least 1 ms"),
        "{log}"
    );
}
