//! A node checks every Raft RPC before openraft sees it. Requests that no
//! honest leader or candidate sends, built here with the crate's own types
//! and sent over HTTP to node processes, get 400, and the cluster goes on:
//! a batch nested 20,000 deep (which would overflow the decoder's stack if
//! batches could nest), votes and entries of term `u64::MAX` (openraft's
//! `term + 1` would overflow once one was saved), and entries holding
//! commands the client API refuses. Afterwards every node still runs,
//! serves writes, holds none of the refused keys and restarts cleanly.

mod common;

use std::time::Duration;

use common::Cluster;
use openraft::raft::{AppendEntriesRequest, VoteRequest};
use openraft::{CommittedLeaderId, EntryPayload};
use sediment_raft::network::{APPEND_PATH, VOTE_PATH};
use sediment_raft::types::{Change, Entry, LogId, Request, TypeConfig, Vote};
use sediment_raft::validate::MAX_TERM;
use serde_json::Value;

const ARGS: &[&str] = &["--heartbeat-ms", "100"];

fn client() -> reqwest::Client {
    common::plain_client(Duration::from_secs(60))
}

async fn send(addr: &str, path: &str, body: Vec<u8>) -> (u16, String) {
    let response = client()
        .post(format!("http://{addr}{path}"))
        .body(body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{path} to {addr} got no answer: {e}"));
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

/// A started, initialized 3-node cluster with one key written.
async fn cluster() -> (Cluster, u64) {
    let cluster = Cluster::start(&[1, 2, 3], ARGS);
    cluster.wait_up(&[1, 2, 3]).await;
    cluster.init().await;
    let leader = cluster.wait_for_leader(None, Duration::from_secs(20)).await;
    write(&cluster, "before", b"1").await;
    cluster.wait_caught_up(Duration::from_secs(20)).await;
    (cluster, leader)
}

/// A PUT through the leader, retried across elections for 20 s.
async fn write(cluster: &Cluster, key: &str, value: &[u8]) {
    let hint = std::sync::atomic::AtomicU64::new(1);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    assert!(
        common::put(&cluster.client, &cluster.bases(), key, value, &hint, || {
            std::time::Instant::now() > deadline
        })
        .await,
        "PUT {key} was not acknowledged"
    );
}

/// Checks that no node process has died or panicked.
fn assert_all_running(cluster: &mut Cluster) {
    for (id, node) in &mut cluster.nodes {
        let child = node.child.as_mut().expect("started");
        assert!(
            child.try_wait().unwrap().is_none(),
            "node {id} exited: {}",
            node_log(&node.dir)
        );
        let log = node_log(&node.dir);
        assert!(!log.contains("panicked"), "node {id} panicked: {log}");
    }
}

fn node_log(dir: &std::path::Path) -> String {
    std::fs::read_to_string(dir.with_extension("log")).unwrap_or_default()
}

fn log_id(term: u64, node: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, node), index)
}

fn append(vote: Vote, prev: Option<LogId>, entries: Vec<Entry>) -> Vec<u8> {
    let request = AppendEntriesRequest::<TypeConfig> {
        vote,
        prev_log_id: prev,
        entries,
        leader_commit: None,
    };
    bincode::serialize(&request).unwrap()
}

/// Every node still serves: a leader, a write, and all nodes applying it.
async fn assert_serving(cluster: &mut Cluster, key: &str) {
    cluster.wait_for_leader(None, Duration::from_secs(20)).await;
    write(cluster, key, b"after").await;
    cluster.wait_caught_up(Duration::from_secs(20)).await;
    for id in [1, 2, 3] {
        assert_eq!(
            cluster.local_get(id, key).await.as_deref(),
            Some(&b"after"[..]),
            "node {id}"
        );
    }
    assert_all_running(cluster);
}

async fn restart_all(cluster: &mut Cluster) {
    for node in cluster.nodes.values_mut() {
        node.kill();
        node.start();
    }
    cluster.wait_up(&[1, 2, 3]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deeply_nested_batch_is_refused_and_the_node_keeps_serving() {
    let (mut cluster, leader) = cluster().await;
    let follower = if leader == 1 { 2 } else { 1 };

    // An entry whose command is 20,000 batches each holding the next: the
    // bytes the old `Batch(Vec<Request>)` would decode recursively.
    let marker = Request::Delete {
        key: "nested-marker".into(),
    };
    let entry = Entry {
        log_id: log_id(1, leader, 1_000),
        payload: EntryPayload::Normal(marker.clone()),
    };
    let plain = append(Vote::new_committed(1, leader), None, vec![entry]);
    let marker_bytes = bincode::serialize(&marker).unwrap();
    let at = plain
        .windows(marker_bytes.len())
        .position(|w| w == &marker_bytes[..])
        .expect("the command's bytes are in the body");
    let mut nested = Vec::new();
    for _ in 0..20_000 {
        nested.extend_from_slice(&2_u32.to_le_bytes());
        nested.extend_from_slice(&1_u64.to_le_bytes());
    }
    nested.extend_from_slice(&marker_bytes);
    let mut body = plain[..at].to_vec();
    body.extend_from_slice(&nested);
    body.extend_from_slice(&plain[at + marker_bytes.len()..]);

    let addr = cluster.nodes[&follower].addr.clone();
    let (status, text) = send(&addr, APPEND_PATH, body).await;
    assert_eq!(status, 400, "{text}");
    // A JSON `error`, like every other endpoint's.
    let body: serde_json::Value = serde_json::from_str(&text).expect(&text);
    assert!(
        body["error"].as_str().unwrap().contains("undecodable"),
        "{text}"
    );
    assert_serving(&mut cluster, "after-nested").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn votes_of_an_impossible_term_are_refused_by_every_node() {
    let (mut cluster, _) = cluster().await;
    for (id, addr) in cluster.addrs() {
        let heartbeat = append(Vote::new_committed(u64::MAX, id % 3 + 1), None, Vec::new());
        let (status, text) = send(&addr, APPEND_PATH, heartbeat).await;
        assert_eq!(status, 400, "append to node {id}: {text}");
        assert!(text.contains("term"), "{text}");

        let vote = VoteRequest::new(Vote::new(u64::MAX, id % 3 + 1), None);
        let (status, text) = send(&addr, VOTE_PATH, bincode::serialize(&vote).unwrap()).await;
        assert_eq!(status, 400, "vote to node {id}: {text}");

        // One above the bound is refused as well.
        let at_bound = VoteRequest::new(Vote::new(MAX_TERM + 1, 1), None);
        let (status, _) = send(&addr, VOTE_PATH, bincode::serialize(&at_bound).unwrap()).await;
        assert_eq!(status, 400, "vote of term MAX_TERM + 1 to node {id}");
    }
    assert_serving(&mut cluster, "after-term").await;
    for id in [1, 2, 3] {
        let m = cluster.metrics(id).await.unwrap();
        let term = m["current_term"].as_u64().unwrap();
        assert!(term < 1_000, "node {id} moved to term {term}");
    }
    restart_all(&mut cluster).await;
    assert_serving(&mut cluster, "after-restart").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_the_api_would_refuse_are_refused_from_a_peer() {
    let (mut cluster, leader) = cluster().await;
    let follower = if leader == 3 { 2 } else { 3 };
    let m = cluster.metrics(follower).await.unwrap();
    let term = m["current_term"].as_u64().unwrap();
    let last: LogId = serde_json::from_value(m["last_applied_log_id"].clone()).unwrap();
    assert_eq!(m["last_log_index"].as_u64(), Some(last.index));
    let vote = Vote::new_committed(term, leader);
    let next = |payload: Request| Entry {
        log_id: log_id(term, leader, last.index + 1),
        payload: EntryPayload::Normal(payload),
    };
    let put = |key: String, len: usize| Request::Put {
        key,
        value: vec![7; len],
    };
    let change = |key: String| Change::Put {
        key,
        value: b"v".to_vec(),
    };
    let too_many: Vec<Change> = (0..1025).map(|i| change(format!("many-{i}"))).collect();
    let cases: Vec<(&str, Vec<Entry>)> = vec![
        ("an empty key", vec![next(put(String::new(), 1))]),
        ("a 100 KiB key", vec![next(put("k".repeat(100 << 10), 1))]),
        (
            "a 70 MiB value",
            vec![next(put("forged-large".into(), 70 << 20))],
        ),
        ("an empty batch", vec![next(Request::Batch(Vec::new()))]),
        (
            "a batch of 1025 changes",
            vec![next(Request::Batch(too_many))],
        ),
        (
            "a batch holding an empty key",
            vec![next(Request::Batch(vec![
                change("forged-in-batch".into()),
                change(String::new()),
            ]))],
        ),
        (
            "an entry that skips an index",
            vec![Entry {
                log_id: log_id(term, leader, last.index + 2),
                payload: EntryPayload::Normal(put("forged-gap".into(), 1)),
            }],
        ),
        (
            "an entry of a later term than the vote",
            vec![Entry {
                log_id: log_id(term + 1, leader, last.index + 1),
                payload: EntryPayload::Normal(put("forged-term".into(), 1)),
            }],
        ),
        (
            "a valid entry followed by an invalid one",
            vec![next(put("forged-first".into(), 1)), {
                let mut second = next(put(String::new(), 1));
                second.log_id.index += 1;
                second
            }],
        ),
    ];
    let addr = cluster.nodes[&follower].addr.clone();
    for (what, entries) in cases {
        let (status, text) = send(&addr, APPEND_PATH, append(vote, Some(last), entries)).await;
        // 400 from the checks; 413 when the body alone is over what
        // /raft/append takes (the 70 MiB value), refused before decoding.
        assert!(status == 400 || status == 413, "{what}: {status} {text}");
        let m = cluster.metrics(follower).await.unwrap();
        assert_eq!(
            m["last_log_index"].as_u64(),
            Some(last.index),
            "{what}: the follower's log changed"
        );
    }
    // The checks do not refuse what a leader sends: the follower still
    // follows, and a restart reads its log back.
    assert_serving(&mut cluster, "after-forged").await;
    cluster.nodes.get_mut(&follower).unwrap().kill();
    cluster.nodes.get_mut(&follower).unwrap().start();
    cluster.wait_up(&[follower]).await;
    assert_serving(&mut cluster, "after-follower-restart").await;
    for key in [
        "forged-large",
        "forged-in-batch",
        "forged-gap",
        "forged-first",
    ] {
        for id in [1, 2, 3] {
            assert_eq!(cluster.local_get(id, key).await, None, "{key} on node {id}");
        }
    }
    let m: Value = cluster.metrics(follower).await.unwrap();
    assert_eq!(m["keys"].as_u64(), Some(3), "{m}");
}
