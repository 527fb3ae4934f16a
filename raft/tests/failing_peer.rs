//! A peer that accepts connections and closes them at once, without an
//! answer (something else on its port, or a node at its connection cap),
//! is backed off from like one that refuses them: the leader neither
//! reconnects in a tight loop nor floods its log.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{free_port, post_json, put_v, Cluster};
use serde_json::json;

const ARGS: &[&str] = &["--heartbeat-ms", "50"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_that_drops_every_connection_is_backed_off_from() {
    let cluster = Cluster::start(&[1], ARGS);
    cluster.wait_up(&[1]).await;
    cluster.init().await;
    let leader = cluster.wait_for_leader(None, Duration::from_secs(20)).await;

    // Accepts every connection and drops it before reading anything.
    let addr = format!("127.0.0.1:{}", free_port());
    let listener = tokio::net::TcpListener::bind(&addr).await.unwrap();
    let accepted = Arc::new(AtomicU64::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::Relaxed);
            drop(stream);
        }
    });

    let (status, body) = post_json(
        cluster.nodes[&leader].url("/cluster/add-learner"),
        json!({"id": 2, "addr": addr}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["caught_up"], false, "{body}");

    // Measured once the learner has been failing for a while.
    let log_before = cluster.nodes[&leader].log().len();
    let before = accepted.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let connections = accepted.load(Ordering::Relaxed) - before;
    let log = cluster.nodes[&leader].log();
    let logged = log.len() - log_before;
    println!("{connections} connections and {logged} bytes of log in 3 s");
    assert!(
        connections < 100,
        "{connections} connections in 3 s to a peer that drops them"
    );
    assert!(
        logged < 4_000,
        "{logged} bytes of log in 3 s: {}",
        &log[log_before..(log_before + 4_000).min(log.len())]
    );
    // The failures are logged, at most once per peer every 5 s.
    let about_the_peer = |text: &str| {
        text.lines()
            .filter(|line| line.contains(&format!("node 2 at {addr}")))
            .count()
    };
    assert!(about_the_peer(&log) >= 1, "{log}");
    assert!(about_the_peer(&log[log_before..]) <= 1, "{log}");

    // The cluster goes on.
    assert_eq!(put_v(cluster.nodes[&leader].url("/kv/after")).await, 200);
}
