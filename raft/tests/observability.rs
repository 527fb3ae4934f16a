//! What an operator sees of a running cluster: `GET /metrics` in the
//! Prometheus text format and the node's log on stderr; a leader that a
//! membership change removed stops reporting that it leads.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::Cluster;

/// The value of an unlabelled sample (or of one exact labelled series).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == series).then(|| value.parse().ok())?
        })
}

async fn scrape(cluster: &Cluster, id: u64) -> String {
    let response = cluster
        .client
        .get(cluster.nodes[&id].url("/metrics"))
        .send()
        .await
        .expect("/metrics answered");
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    response.text().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_and_logs_report_what_the_cluster_did() {
    let cluster = Cluster::start(&[1, 2, 3], &["--heartbeat-ms", "100"]);
    cluster.wait_up(&[1, 2, 3]).await;
    cluster.init().await;
    let leader = cluster.wait_for_leader(None, Duration::from_secs(15)).await;
    let leader_url = |path: &str| cluster.nodes[&leader].url(path);
    for i in 0..25 {
        let response = cluster
            .client
            .put(leader_url(&format!("/kv/key-{i}")))
            .body(format!("value {i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }
    let response = cluster
        .client
        .delete(leader_url("/kv/key-0"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let found = cluster
        .client
        .get(leader_url("/kv/key-1"))
        .send()
        .await
        .unwrap();
    assert_eq!(found.status(), 200);
    let missing = cluster
        .client
        .get(leader_url("/kv/key-0"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    let refused = cluster
        .client
        .put(leader_url(&format!("/kv/{}", "k".repeat(2000))))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);

    let text = scrape(&cluster, leader).await;
    assert_eq!(
        sample(&text, "sediment_raft_writes_total"),
        Some(26.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "sediment_raft_reads_total"),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "sediment_raft_errors_total{status=\"400\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "sediment_raft_http_requests_total{endpoint=\"kv_put\",status=\"200\"}"
        ),
        Some(25.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "sediment_raft_is_leader"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(sample(&text, "sediment_raft_keys"), Some(24.0), "{text}");
    assert!(
        sample(&text, "sediment_raft_term").unwrap() >= 1.0,
        "{text}"
    );
    assert!(sample(&text, "sediment_raft_log_syncs_total").unwrap() >= 1.0);
    assert_eq!(
        sample(&text, "sediment_raft_log_syncs_total"),
        sample(&text, "sediment_raft_log_sync_seconds_count"),
        "{text}"
    );
    assert!(
        sample(&text, "sediment_raft_log_bytes").unwrap() > 0.0,
        "{text}"
    );
    // Every write is an entry: 26 writes (some batched) plus the leader's
    // blank entry and the initial membership.
    assert!(sample(&text, "sediment_raft_last_log_index").unwrap() >= 3.0);

    // A follower knows the leader and, once caught up, applied as much.
    let applied = cluster.wait_caught_up(Duration::from_secs(10)).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let text = scrape(&cluster, follower).await;
    assert_eq!(
        sample(&text, "sediment_raft_is_leader"),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "sediment_raft_leader_id"),
        Some(leader as f64),
        "{text}"
    );
    assert_eq!(
        sample(&text, "sediment_raft_last_applied_index"),
        Some(applied as f64),
        "{text}"
    );
    assert_eq!(sample(&text, "sediment_raft_keys"), Some(24.0), "{text}");
    assert!(
        sample(
            &text,
            "sediment_raft_http_requests_total{endpoint=\"raft_append\",status=\"200\"}"
        )
        .unwrap()
            > 0.0,
        "{text}"
    );

    // The nodes' logs tell of the election and the membership, and never
    // hold the values written.
    let deadline = Instant::now() + Duration::from_secs(10);
    let logs: BTreeMap<u64, String> = loop {
        let logs: BTreeMap<u64, String> = cluster
            .nodes
            .iter()
            .map(|(id, node)| {
                let text = std::fs::read_to_string(node.dir.with_extension("log")).unwrap();
                (*id, text)
            })
            .collect();
        if logs.values().all(|log| log.contains("leader elected")) || Instant::now() > deadline {
            break logs;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for (id, log) in &logs {
        assert!(log.contains("leader elected"), "node {id}: {log}");
        assert!(log.contains("membership changed"), "node {id}: {log}");
        assert!(!log.contains("value 7"), "node {id} logged a value: {log}");
    }
    assert!(
        logs[&leader].contains("request refused"),
        "{}",
        logs[&leader]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_leader_no_longer_reports_that_it_leads() {
    let cluster = Cluster::start(&[1, 2, 3], &["--heartbeat-ms", "100"]);
    cluster.wait_up(&[1, 2, 3]).await;
    cluster.init().await;
    let leader = cluster.wait_for_leader(None, Duration::from_secs(15)).await;
    let text = scrape(&cluster, leader).await;
    assert_eq!(
        sample(&text, "sediment_raft_is_leader"),
        Some(1.0),
        "{text}"
    );
    let (status, body) = common::post_json(
        cluster.nodes[&leader].url("/cluster/change-membership"),
        serde_json::json!({ "members": cluster.followers(leader) }),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    // It steps down within a few heartbeats, and says so.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = scrape(&cluster, leader).await;
        let metrics = cluster.metrics(leader).await.expect("metrics");
        let is_leader = sample(&text, "sediment_raft_is_leader");
        if is_leader == Some(0.0) && metrics["state"] != "Leader" {
            // Nor does it name itself as the leader it knows of.
            assert_ne!(
                sample(&text, "sediment_raft_leader_id"),
                Some(leader as f64),
                "{text}"
            );
            assert_ne!(metrics["current_leader"], leader, "{metrics}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node {leader} still reports that it leads after its removal: is_leader \
             {is_leader:?}, {metrics}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The nodes left elect their own leader, which reports it.
    let new_leader = cluster
        .wait_for_leader(Some(leader), Duration::from_secs(15))
        .await;
    let text = scrape(&cluster, new_leader).await;
    assert_eq!(
        sample(&text, "sediment_raft_is_leader"),
        Some(1.0),
        "{text}"
    );
}

#[test]
fn a_bad_log_level_is_refused_before_the_node_starts() {
    // Directives tracing cannot read, and a word that is neither a level
    // nor a target.
    for level in ["info,=[", "bogus!!"] {
        let dir = tempfile::tempdir().unwrap();
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_sediment-raft"))
            .args(["--log-level", level, "node", "--id", "1", "--listen"])
            .arg(format!("127.0.0.1:{}", common::free_port()))
            .arg("--dir")
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(!output.status.success(), "{level}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("--log-level"), "{level}: {stderr}");
        assert!(
            std::fs::read_dir(dir.path()).unwrap().next().is_none(),
            "{level}: the node wrote to its directory"
        );
    }
}
