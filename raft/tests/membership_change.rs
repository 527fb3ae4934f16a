//! Membership changes answer within a bounded time and never leave the
//! cluster stuck: a learner at an address where nothing listens is added
//! (202, not caught up), a change that would make it a voter is refused
//! with 409 before any joint config is proposed, the way back to the old
//! voters succeeds, and writes go on. The address form of
//! change-membership refuses invalid addresses (400) and addresses other
//! than the ones the cluster knows (409) without changing anything. A
//! leader that a change removed refuses the next change (503) instead of
//! stopping, and the nodes left go on. A learner is removed with
//! remove-learner.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::{free_port, post_json, put_v, Cluster};
use serde_json::json;

// 50 ms heartbeats: a 3 s write timeout bounds every answer below.
const ARGS: &[&str] = &["--heartbeat-ms", "50"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_learner_cannot_become_a_voter_and_the_way_back_works() {
    let mut cluster = Cluster::start(&[1, 2, 3], ARGS);
    cluster.wait_up(&[1, 2, 3]).await;
    cluster.init().await;
    let leader = cluster.wait_for_leader(None, Duration::from_secs(20)).await;
    assert_eq!(put_v(cluster.nodes[&leader].url("/kv/before")).await, 200);
    let url = |path: &str| cluster.nodes[&leader].url(path);

    // Nothing listens there.
    let dead = format!("127.0.0.1:{}", free_port());
    let started = Instant::now();
    let (status, body) =
        post_json(url("/cluster/add-learner"), json!({"id": 4, "addr": dead})).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["caught_up"], false, "{body}");
    println!("add-learner answered in {:?}", started.elapsed());

    // Replacing two voters with the unreachable node: the joint config
    // would need node 4's vote to commit.
    let started = Instant::now();
    let (status, body) = post_json(
        url("/cluster/change-membership"),
        json!({"members": [leader, 4]}),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    let message = body["error"].as_str().unwrap_or_default();
    assert!(message.contains("node 4"), "{body}");
    println!("change-membership answered in {:?}", started.elapsed());
    // Adding it next to the three voters is refused the same way.
    let (status, body) = post_json(
        url("/cluster/change-membership"),
        json!({"members": [1, 2, 3, 4]}),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(cluster.voters(leader).await, BTreeSet::from([1, 2, 3]));

    // The way back.
    let (status, body) = post_json(
        url("/cluster/change-membership"),
        json!({"members": [1, 2, 3]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(put_v(cluster.nodes[&leader].url("/kv/after")).await, 200);
    cluster.wait_caught_up(Duration::from_secs(20)).await;
    for id in [1, 2, 3] {
        assert_eq!(
            cluster.local_get(id, "after").await.as_deref(),
            Some(&b"v"[..])
        );
    }

    // A node that answers is still added and made a voter.
    cluster.add_node(5, ARGS);
    cluster.wait_up(&[5]).await;
    let url = |path: &str| cluster.nodes[&leader].url(path);
    let (status, body) = post_json(
        url("/cluster/add-learner"),
        json!({"id": 5, "addr": cluster.nodes[&5].addr}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["caught_up"], true, "{body}");
    let (status, body) = post_json(
        url("/cluster/change-membership"),
        json!({"members": [1, 2, 3, 5]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(cluster.voters(leader).await, BTreeSet::from([1, 2, 3, 5]));
    assert_eq!(put_v(cluster.nodes[&leader].url("/kv/last")).await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_membership_checks_the_addresses_it_is_given() {
    let cluster = Cluster::start(&[1, 2], ARGS);
    cluster.wait_up(&[1, 2]).await;
    cluster.init().await;
    let leader = cluster.wait_for_leader(None, Duration::from_secs(20)).await;
    let url = cluster.nodes[&leader].url("/cluster/change-membership");
    let addrs = cluster.addrs();

    let (status, body) = post_json(url.clone(), json!({"members": {"1": "not-an-addr"}})).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("not a node address")),
        "{body}"
    );
    let elsewhere = format!("127.0.0.1:{}", free_port());
    let (status, body) = post_json(
        url.clone(),
        json!({"members": {"1": elsewhere, "2": addrs[&2]}}),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    let (status, body) = post_json(
        url.clone(),
        json!({"members": {"1": addrs[&1], "7": addrs[&2]}}),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("add-learner")),
        "{body}"
    );
    assert_eq!(cluster.voters(leader).await, BTreeSet::from([1, 2]));

    // The known addresses are accepted.
    let (status, body) = post_json(url, json!({"members": {"1": addrs[&1], "2": addrs[&2]}})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(cluster.voters(leader).await, BTreeSet::from([1, 2]));
    assert_eq!(put_v(cluster.nodes[&leader].url("/kv/still")).await, 200);
}

/// Sends `first` and then, as soon as it answers, `second` as the voters
/// to the leader of a fresh three-node cluster: the first change removes
/// the leader. The second must be refused (the leader is no voter of its
/// latest membership) without stopping the node, and the nodes left must
/// still take writes.
async fn change_twice_from_the_leader(
    first: fn(&[u64]) -> Vec<u64>,
    second: fn(&[u64]) -> Vec<u64>,
) {
    let mut cluster = Cluster::start(&[1, 2, 3], ARGS);
    cluster.wait_up(&[1, 2, 3]).await;
    cluster.init().await;
    let leader = cluster.wait_for_leader(None, Duration::from_secs(20)).await;
    let others = cluster.followers(leader);
    let url = cluster.nodes[&leader].url("/cluster/change-membership");

    let (status, body) = post_json(url.clone(), json!({ "members": first(&others) })).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = post_json(url.clone(), json!({ "members": second(&others) })).await;
    let message = body["error"].as_str().unwrap_or_default().to_string();
    assert_eq!(status, 503, "{body}");
    assert!(message.contains("not a voter"), "{body}");
    // A second call after the node stepped down is refused the same way.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, body) = post_json(url, json!({ "members": second(&others) })).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        cluster.nodes.get_mut(&leader).unwrap().is_running(),
        "node {leader} exited: {}",
        cluster.nodes[&leader].log()
    );
    assert!(
        !cluster.nodes[&leader].log().contains("panicked"),
        "{}",
        cluster.nodes[&leader].log()
    );

    // The nodes left elect a leader among themselves and take writes.
    let new_leader = cluster
        .wait_for_leader(Some(leader), Duration::from_secs(20))
        .await;
    assert_ne!(new_leader, leader);
    assert_eq!(
        put_v(cluster.nodes[&new_leader].url("/kv/after")).await,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_leader_refuses_the_next_change_and_keeps_running() {
    // [2, 3] then [2], with node 1 leading.
    change_twice_from_the_leader(|others| others.to_vec(), |others| vec![others[0]]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_leader_refuses_the_same_change_again_and_keeps_running() {
    // [2] then [2], with node 1 leading.
    change_twice_from_the_leader(|others| vec![others[0]], |others| vec![others[0]]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_is_removed_with_remove_learner() {
    let cluster = Cluster::start(&[1, 2, 3], ARGS);
    cluster.wait_up(&[1, 2, 3]).await;
    cluster.init().await;
    let leader = cluster.wait_for_leader(None, Duration::from_secs(20)).await;
    let url = |path: &str| cluster.nodes[&leader].url(path);
    let learners = |metrics: &serde_json::Value| -> BTreeSet<u64> {
        serde_json::from_value(metrics["membership"]["learners"].clone()).unwrap()
    };

    // Nothing listens there.
    let dead = format!("127.0.0.1:{}", free_port());
    let (status, body) =
        post_json(url("/cluster/add-learner"), json!({"id": 4, "addr": dead})).await;
    assert_eq!(status, 202, "{body}");
    let metrics = cluster.metrics(leader).await.unwrap();
    assert_eq!(learners(&metrics), BTreeSet::from([4]), "{metrics}");

    // A voter is not a learner; an unknown id is no member.
    let (status, body) = post_json(url("/cluster/remove-learner"), json!({"id": leader})).await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("change-membership")),
        "{body}"
    );
    let (status, body) = post_json(url("/cluster/remove-learner"), json!({"id": 9})).await;
    assert_eq!(status, 404, "{body}");
    assert!(body["error"].is_string(), "{body}");
    // A follower sends it to the leader.
    let follower = cluster.followers(leader)[0];
    let (status, body) = post_json(
        cluster.nodes[&follower].url("/cluster/remove-learner"),
        json!({"id": 4}),
    )
    .await;
    assert_eq!(status, 307, "{body}");
    assert_eq!(body["leader_id"], leader, "{body}");

    let (status, body) = post_json(url("/cluster/remove-learner"), json!({"id": 4})).await;
    assert_eq!(status, 200, "{body}");
    let metrics = cluster.metrics(leader).await.unwrap();
    assert_eq!(learners(&metrics), BTreeSet::new(), "{metrics}");
    assert!(
        metrics["membership"]["nodes"].get("4").is_none(),
        "{metrics}"
    );
    assert_eq!(cluster.voters(leader).await, BTreeSet::from([1, 2, 3]));
    // Gone from every node's membership, and the cluster goes on.
    assert_eq!(put_v(url("/kv/after")).await, 200);
    cluster.wait_caught_up(Duration::from_secs(20)).await;
    for id in [1, 2, 3] {
        let metrics = cluster.metrics(id).await.unwrap();
        assert_eq!(learners(&metrics), BTreeSet::new(), "{metrics}");
    }
    // Removed again: no member any more.
    let (status, body) = post_json(url("/cluster/remove-learner"), json!({"id": 4})).await;
    assert_eq!(status, 404, "{body}");
    // Its id can be added again, at another address.
    let elsewhere = format!("127.0.0.1:{}", free_port());
    let (status, body) = post_json(
        url("/cluster/add-learner"),
        json!({"id": 4, "addr": elsewhere}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let metrics = cluster.metrics(leader).await.unwrap();
    assert_eq!(metrics["membership"]["nodes"]["4"], elsewhere, "{metrics}");
}
