//! Pre-staging between node processes (`FORMAT.md`, "Pre-staged
//! entries"): a hostile client's stage requests (other votes, a `prev`
//! that is not the log's end, malformed bodies, entries forged under the
//! leader's next log id) change no node's data, and in a one-client run
//! the followers find most of openraft's appends already staged.

mod common;

use std::time::Duration;

use common::Cluster;
use openraft::{CommittedLeaderId, EntryPayload};
use sediment_raft::stage::{StageRequest, StageResponse, STAGE_PATH};
use sediment_raft::types::{Entry, LogId, Request, Vote};
use serde_json::Value;

const ARGS: &[&str] = &["--heartbeat-ms", "100"];

fn log_id(term: u64, node: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, node), index)
}

fn put_entry(log_id: LogId, key: &str, value: &[u8]) -> Entry {
    Entry {
        log_id,
        payload: EntryPayload::Normal(Request::Put {
            key: key.into(),
            value: value.to_vec(),
        }),
    }
}

fn stage_body(vote: Vote, prev: Option<LogId>, entries: Vec<Entry>) -> Vec<u8> {
    bincode::serialize(&StageRequest {
        vote,
        prev,
        entries,
    })
    .unwrap()
}

async fn send(cluster: &Cluster, id: u64, body: Vec<u8>) -> (u16, String) {
    let response = cluster
        .client
        .post(cluster.nodes[&id].url(STAGE_PATH))
        .body(body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{STAGE_PATH} to node {id} got no answer: {e}"));
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

/// Sends a stage request that must be answered 200 without staging.
async fn ignored(cluster: &Cluster, id: u64, what: &str, body: Vec<u8>) {
    let (status, text) = send(cluster, id, body).await;
    assert_eq!(status, 200, "{what}: {text}");
    let answer: StageResponse = serde_json::from_str(&text).unwrap();
    assert_eq!(answer.staged, 0, "{what}: {text}");
    assert!(answer.ignored.is_some(), "{what}: {text}");
}

/// Sends a stage request that must be refused with 400.
async fn refused(cluster: &Cluster, id: u64, what: &str, body: Vec<u8>) {
    let (status, text) = send(cluster, id, body).await;
    assert_eq!(status, 400, "{what}: {text}");
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

/// The node's `/metrics` text.
async fn prometheus(cluster: &Cluster, id: u64) -> String {
    cluster
        .client
        .get(cluster.nodes[&id].url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The value of the sample `name` (with its labels) in `text`.
fn sample(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

fn assert_no_panics(cluster: &mut Cluster) {
    for (id, node) in &mut cluster.nodes {
        let child = node.child.as_mut().expect("started");
        assert!(
            child.try_wait().unwrap().is_none(),
            "node {id} exited: {}",
            node.log()
        );
        assert!(!node.log().contains("panicked"), "node {id} panicked");
    }
}

/// Every node holds the real values and none of the forged keys.
async fn check_data(cluster: &Cluster) {
    for id in [1, 2, 3] {
        assert_eq!(
            cluster.local_get(id, "before").await.as_deref(),
            Some(&b"kept"[..]),
            "node {id}"
        );
        assert_eq!(
            cluster.local_get(id, "after").await.as_deref(),
            Some(&b"real"[..]),
            "node {id}"
        );
        for key in [
            "forged-term",
            "forged-other",
            "forged-gap",
            "forged-prev",
            "forged-inside",
            "forged-own",
            "forged-next",
        ] {
            assert_eq!(cluster.local_get(id, key).await, None, "{key} on {id}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_clients_stage_requests_leave_the_data_alone() {
    let mut cluster = Cluster::start(&[1, 2, 3], ARGS);
    cluster.wait_up(&[1, 2, 3]).await;
    cluster.init().await;
    let leader = cluster.wait_for_leader(None, Duration::from_secs(20)).await;
    write(&cluster, "before", b"kept").await;
    cluster.wait_caught_up(Duration::from_secs(20)).await;
    let follower = *cluster.nodes.keys().find(|&&id| id != leader).unwrap();
    let other = *cluster
        .nodes
        .keys()
        .find(|&&id| id != leader && id != follower)
        .unwrap();
    let m = cluster.metrics(follower).await.unwrap();
    let term = m["current_term"].as_u64().unwrap();
    let last: LogId = serde_json::from_value(m["last_applied_log_id"].clone()).unwrap();
    assert_eq!(m["last_log_index"].as_u64(), Some(last.index));
    let vote = Vote::new_committed(term, leader);
    let next = |key: &str| vec![put_entry(log_id(term, leader, last.index + 1), key, b"bad")];

    // Well formed, but not extending the follower's log under its leader:
    // answered, nothing written.
    ignored(
        &cluster,
        follower,
        "a later term's vote",
        stage_body(
            Vote::new_committed(term + 1, leader),
            Some(last),
            vec![put_entry(
                log_id(term + 1, leader, last.index + 1),
                "forged-term",
                b"bad",
            )],
        ),
    )
    .await;
    ignored(
        &cluster,
        follower,
        "another node's vote",
        stage_body(
            Vote::new_committed(term, other),
            Some(last),
            vec![put_entry(
                log_id(term, other, last.index + 1),
                "forged-other",
                b"bad",
            )],
        ),
    )
    .await;
    ignored(
        &cluster,
        follower,
        "a gap after the log",
        stage_body(
            vote,
            Some(log_id(
                last.leader_id.term,
                last.leader_id.node_id,
                last.index + 1,
            )),
            vec![put_entry(
                log_id(term, leader, last.index + 2),
                "forged-gap",
                b"bad",
            )],
        ),
    )
    .await;
    ignored(
        &cluster,
        follower,
        "a prev of another leader at the log's end",
        stage_body(
            vote,
            Some(log_id(term, other, last.index)),
            next("forged-prev"),
        ),
    )
    .await;
    ignored(
        &cluster,
        follower,
        "a prev inside the log",
        stage_body(
            vote,
            Some(log_id(
                last.leader_id.term,
                last.leader_id.node_id,
                last.index - 1,
            )),
            vec![put_entry(
                log_id(term, leader, last.index),
                "forged-inside",
                b"bad",
            )],
        ),
    )
    .await;
    ignored(
        &cluster,
        leader,
        "the leader's own vote, to the leader",
        stage_body(vote, Some(last), next("forged-own")),
    )
    .await;

    // What no leader sends: 400.
    refused(
        &cluster,
        follower,
        "a vote that is not committed",
        stage_body(Vote::new(term, leader), Some(last), next("forged-open")),
    )
    .await;
    refused(
        &cluster,
        follower,
        "entries of another leader than the vote's",
        stage_body(
            vote,
            Some(last),
            vec![put_entry(
                log_id(term, other, last.index + 1),
                "forged-mixed",
                b"bad",
            )],
        ),
    )
    .await;
    refused(
        &cluster,
        follower,
        "no entries",
        stage_body(vote, Some(last), Vec::new()),
    )
    .await;
    refused(
        &cluster,
        follower,
        "an empty key",
        stage_body(vote, Some(last), next("")),
    )
    .await;
    refused(
        &cluster,
        follower,
        "a vote of term u64::MAX",
        stage_body(
            Vote::new_committed(u64::MAX, leader),
            Some(last),
            next("forged-max"),
        ),
    )
    .await;
    refused(
        &cluster,
        follower,
        "garbage",
        b"not a stage request".to_vec(),
    )
    .await;

    // With the leader's vote and next log id, forged bytes are staged (the
    // sender is trusted as a peer is), and the leader's own entry with that
    // log id replaces them when openraft appends it.
    let (status, text) = send(
        &cluster,
        follower,
        stage_body(vote, Some(last), next("forged-next")),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let answer: StageResponse = serde_json::from_str(&text).unwrap();
    assert_eq!(answer.staged, 1, "{text}");
    let wasted = "sediment_raft_staged_entries_total{outcome=\"wasted\"}";
    let before = sample(&prometheus(&cluster, follower).await, wasted);
    write(&cluster, "after", b"real").await;
    cluster.wait_caught_up(Duration::from_secs(20)).await;
    let m = cluster.metrics(leader).await.unwrap();
    assert_eq!(
        m["current_term"].as_u64(),
        Some(term),
        "no election meanwhile"
    );
    assert_eq!(
        sample(&prometheus(&cluster, follower).await, wasted),
        before + 1,
        "the forged entry was replaced"
    );

    check_data(&cluster).await;
    assert_no_panics(&mut cluster);

    // The logs read back the same after every node restarts.
    for node in cluster.nodes.values_mut() {
        node.kill();
        node.start();
    }
    cluster.wait_up(&[1, 2, 3]).await;
    cluster.wait_for_leader(None, Duration::from_secs(20)).await;
    write(&cluster, "after-restart", b"yes").await;
    cluster.wait_caught_up(Duration::from_secs(20)).await;
    check_data(&cluster).await;
    assert_no_panics(&mut cluster);
    let m: Value = cluster.metrics(follower).await.unwrap();
    assert_eq!(m["keys"].as_u64(), Some(3), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_one_client_followers_find_most_appends_staged() {
    let mut cluster = Cluster::start(&[1, 2, 3], ARGS);
    cluster.wait_up(&[1, 2, 3]).await;
    cluster.init().await;
    let leader = cluster.wait_for_leader(None, Duration::from_secs(20)).await;
    write(&cluster, "warm-up", b"x").await;
    cluster.wait_caught_up(Duration::from_secs(20)).await;
    let followers: Vec<u64> = [1, 2, 3].into_iter().filter(|&id| id != leader).collect();
    let counts = |text: &str| {
        (
            sample(text, "sediment_raft_log_appends_total"),
            sample(text, "sediment_raft_log_appends_prestaged_total"),
        )
    };
    let mut before = Vec::new();
    for &id in &followers {
        before.push(counts(&prometheus(&cluster, id).await));
    }

    // One client, one write at a time, straight to the leader.
    let url = |n: usize| cluster.nodes[&leader].url(&format!("/kv/one-client-{n}"));
    for n in 0..200 {
        let response = cluster
            .client
            .put(url(n))
            .body(vec![b'v'; 256])
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "write {n}");
    }
    cluster.wait_caught_up(Duration::from_secs(20)).await;

    let (mut appends, mut prestaged) = (0, 0);
    for (&id, (appends_before, prestaged_before)) in followers.iter().zip(&before) {
        let (a, p) = counts(&prometheus(&cluster, id).await);
        println!(
            "node {id}: {} appends, {} found staged",
            a - appends_before,
            p - prestaged_before
        );
        appends += a - appends_before;
        prestaged += p - prestaged_before;
    }
    assert!(
        appends >= 200,
        "the followers appended the writes: {appends}"
    );
    assert!(
        prestaged * 2 > appends,
        "only {prestaged} of {appends} follower appends found their entries staged"
    );
    let leader_metrics = prometheus(&cluster, leader).await;
    assert!(
        sample(
            &leader_metrics,
            "sediment_raft_stage_requests_total{result=\"staged\"}"
        ) >= prestaged,
        "{leader_metrics}"
    );
    for id in [1, 2, 3] {
        assert_eq!(
            cluster.local_get(id, "one-client-199").await.as_deref(),
            Some(&[b'v'; 256][..])
        );
    }
    assert_no_panics(&mut cluster);
}
