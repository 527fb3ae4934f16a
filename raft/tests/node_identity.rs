//! A node keeps to its own cluster and its own id: a follower whose data
//! was wiped is refused (the leader keeps leading, the cluster keeps
//! writing) until it is removed and added again; a node started on
//! another cluster's directory at a member's address gets none of the
//! cluster's traffic and none of its writes; a node that holds another
//! cluster's data is not added as a learner; a directory refuses a
//! `--id` other than its own; `init` sent to every member at once makes
//! one cluster; an `init` that a member missed is sent again once it runs.
//! Real node processes on 127.0.0.1.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::{files_under, free_port, post_json, put_v, run_to_exit, Cluster};
use serde_json::json;

// 50 ms heartbeats: a 3 s write timeout bounds every answer below.
const ARGS: &[&str] = &["--heartbeat-ms", "50"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_follower_is_refused_until_it_is_removed_and_added_again() {
    let mut cluster = Cluster::start(&[1, 2, 3], ARGS);
    cluster.wait_up(&[1, 2, 3]).await;
    cluster.init().await;
    let leader = cluster.wait_for_leader(None, Duration::from_secs(20)).await;
    let url = |cluster: &Cluster, path: &str| cluster.nodes[&leader].url(path);
    for i in 0..20 {
        assert_eq!(put_v(url(&cluster, &format!("/kv/before-{i}"))).await, 200);
    }
    cluster.wait_caught_up(Duration::from_secs(20)).await;

    // The disk of a follower is replaced: its directory is gone.
    let wiped = cluster.followers(leader)[0];
    let node = cluster.nodes.get_mut(&wiped).unwrap();
    node.kill();
    std::fs::remove_dir_all(&node.dir).unwrap();
    node.start();
    cluster.wait_up(&[wiped]).await;

    // Writes go on with the other two; the leader, which remembers how
    // far the follower's log reached, does not see it go back (openraft
    // panics on that), because the follower refuses every RPC.
    let until = Instant::now() + Duration::from_secs(3);
    let mut i = 0;
    while Instant::now() < until {
        assert_eq!(put_v(url(&cluster, &format!("/kv/during-{i}"))).await, 200);
        i += 1;
    }
    assert!(
        cluster.nodes.get_mut(&leader).unwrap().is_running(),
        "the leader exited"
    );
    assert_eq!(
        cluster.wait_for_leader(None, Duration::from_secs(5)).await,
        leader
    );
    assert!(
        cluster.nodes[&wiped].log().contains("never joined"),
        "{}",
        cluster.nodes[&wiped].log()
    );
    assert_eq!(cluster.local_get_or_none(wiped, "before-0").await, None);

    // Removed and added again, it is joined afresh and catches up.
    let added = cluster.remove_and_add_again(leader, wiped).await;
    assert_eq!(added["caught_up"], true, "{added}");
    assert_eq!(cluster.voters(leader).await, BTreeSet::from([1, 2, 3]));
    assert_eq!(put_v(url(&cluster, "/kv/after")).await, 200);
    cluster.wait_caught_up(Duration::from_secs(20)).await;
    for key in ["before-0", "before-19", "during-0", "after"] {
        assert_eq!(
            cluster.local_get(wiped, key).await.as_deref(),
            Some(&b"v"[..]),
            "{key}"
        );
    }
    assert!(
        cluster.nodes.get_mut(&leader).unwrap().is_running(),
        "the leader exited"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_on_another_clusters_directory_gets_none_of_the_clusters_writes() {
    // Another cluster: one node, initialised, holding a key.
    let mut other = Cluster::start(&[1], ARGS);
    other.wait_up(&[1]).await;
    other.init().await;
    other.wait_for_leader(None, Duration::from_secs(20)).await;
    assert_eq!(put_v(other.nodes[&1].url("/kv/theirs")).await, 200);
    other.nodes.get_mut(&1).unwrap().kill();

    let mut cluster = Cluster::start(&[1, 2, 3], ARGS);
    cluster.wait_up(&[1, 2, 3]).await;
    cluster.init().await;
    cluster.wait_for_leader(None, Duration::from_secs(20)).await;
    // Node 1 is restarted on the other cluster's directory, at its own
    // address: it leads its old one-node cluster there.
    let node = cluster.nodes.get_mut(&1).unwrap();
    node.kill();
    node.dir = other.nodes[&1].dir.clone();
    node.start();
    cluster.wait_up(&[1]).await;

    let leader = cluster
        .wait_for_leader(Some(1), Duration::from_secs(20))
        .await;
    let until = Instant::now() + Duration::from_secs(3);
    let mut i = 0;
    while Instant::now() < until {
        assert_eq!(
            put_v(cluster.nodes[&leader].url(&format!("/kv/ours-{i}"))).await,
            200
        );
        i += 1;
    }
    for id in [2, 3] {
        let m = cluster.metrics(id).await.expect("metrics");
        assert_ne!(m["current_leader"], json!(1), "node {id}: {m}");
    }
    assert_eq!(cluster.local_get_or_none(1, "ours-0").await, None);
    assert_eq!(
        cluster.local_get(1, "theirs").await.as_deref(),
        Some(&b"v"[..])
    );
    assert!(
        cluster.nodes[&1].log().contains("belongs to cluster"),
        "{}",
        cluster.nodes[&1].log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_holding_another_clusters_data_is_not_added_as_a_learner() {
    let mut cluster = Cluster::start(&[1, 2], ARGS);
    cluster.wait_up(&[1, 2]).await;
    // Each initialised as a cluster of its own.
    for id in [1, 2] {
        let addr = cluster.nodes[&id].addr.clone();
        let (status, body) = post_json(
            cluster.nodes[&id].url("/cluster/init"),
            json!({ "members": { id.to_string(): addr } }),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    let until = Instant::now() + Duration::from_secs(20);
    while put_v(cluster.nodes[&2].url("/kv/second")).await != 200 {
        assert!(Instant::now() < until, "node 2 never took a write");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster
        .wait_for_leader(Some(2), Duration::from_secs(20))
        .await;

    let (status, body) = post_json(
        cluster.nodes[&1].url("/cluster/add-learner"),
        json!({"id": 2, "addr": cluster.nodes[&2].addr}),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    let message = body["error"].as_str().unwrap_or_default();
    assert!(message.contains("empty directory"), "{body}");
    assert_eq!(cluster.voters(1).await, BTreeSet::from([1]));
    let m = cluster.metrics(1).await.expect("metrics");
    assert_eq!(m["membership"]["learners"], json!([]), "{m}");

    // Both go on as they were.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        cluster.nodes.get_mut(&2).unwrap().is_running(),
        "{}",
        cluster.nodes[&2].log()
    );
    assert_eq!(put_v(cluster.nodes[&1].url("/kv/first")).await, 200);
    assert_eq!(
        cluster.local_get(2, "second").await.as_deref(),
        Some(&b"v"[..])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_refuses_an_id_other_than_its_own() {
    let mut cluster = Cluster::start(&[1], ARGS);
    cluster.wait_up(&[1]).await;
    cluster.init().await;
    cluster.wait_for_leader(None, Duration::from_secs(20)).await;
    assert_eq!(put_v(cluster.nodes[&1].url("/kv/k")).await, 200);
    let node = cluster.nodes.get_mut(&1).unwrap();
    node.kill();
    let dir = node.dir.clone();
    let before = files_under(&dir);

    let listen = format!("127.0.0.1:{}", free_port());
    let args = [
        "node",
        "--id",
        "2",
        "--listen",
        &listen,
        "--dir",
        dir.to_str().unwrap(),
    ];
    let (status, log) = run_to_exit(&args, &dir.with_extension("refused.log"));
    assert_eq!(status, Some(false), "{log}");
    assert!(log.contains("belongs to node 1"), "{log}");
    assert!(log.contains("--id 1"), "{log}");
    assert_eq!(
        files_under(&dir),
        before,
        "the refused start changed the directory"
    );
}

/// The body of an `init` that names every node of `cluster`.
fn init_body(cluster: &Cluster) -> serde_json::Value {
    let members: serde_json::Map<String, serde_json::Value> = cluster
        .nodes
        .values()
        .map(|n| (n.id.to_string(), json!(n.addr)))
        .collect();
    json!({ "members": members })
}

/// An operator who sends `init` to every member at once gets one cluster:
/// the inits all run on the member with the lowest id, one at a time, so
/// one initialises the cluster and the others answer 409. (Each used to
/// draw its own cluster id and join the others to it: every call answered
/// 200, and one member was left in another cluster for good.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_sent_to_every_member_at_once_makes_one_cluster() {
    let cluster = Cluster::start(&[1, 2, 3], ARGS);
    cluster.wait_up(&[1, 2, 3]).await;
    let body = init_body(&cluster);
    let (a, b, c) = tokio::join!(
        post_json(cluster.nodes[&1].url("/cluster/init"), body.clone()),
        post_json(cluster.nodes[&2].url("/cluster/init"), body.clone()),
        post_json(cluster.nodes[&3].url("/cluster/init"), body.clone()),
    );
    let mut statuses: Vec<u16> = [&a, &b, &c].iter().map(|(status, _)| *status).collect();
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 409, 409], "{a:?} {b:?} {c:?}");
    // The 409s say what happened in words, not in openraft's terms.
    for (status, body) in [&a, &b, &c] {
        if *status == 409 {
            assert!(body.to_string().contains("initialised already"), "{body}");
            assert!(!body.to_string().contains("LogId"), "{body}");
        }
    }

    let leader = cluster.wait_for_leader(None, Duration::from_secs(20)).await;
    assert_eq!(put_v(cluster.nodes[&leader].url("/kv/everyone")).await, 200);
    cluster
        .wait_for_value(&[1, 2, 3], "everyone", b"v", Duration::from_secs(20))
        .await;
}

/// An `init` while a member is down answers 503 and says to send it again;
/// members joined before the failure keep the cluster's id, so the same
/// `init` once every member runs makes one cluster of all three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_with_a_member_down_is_sent_again_once_it_runs() {
    let mut cluster = Cluster::start(&[1, 2, 3], ARGS);
    cluster.wait_up(&[1, 2, 3]).await;
    cluster.nodes.get_mut(&3).expect("node 3").stop();
    let body = init_body(&cluster);
    let (status, answer) = post_json(cluster.nodes[&1].url("/cluster/init"), body.clone()).await;
    assert_eq!(status, 503, "{answer}");
    let message = answer["error"].as_str().unwrap_or_default();
    assert!(
        message.contains("node 3") && message.contains("send the same init again"),
        "{message}"
    );
    assert!(!message.contains("nothing was changed"), "{message}");
    assert_eq!(
        cluster.leader(None).await,
        None,
        "no cluster was initialised"
    );

    cluster.nodes.get_mut(&3).expect("node 3").start();
    cluster.wait_up(&[3]).await;
    let (status, answer) = post_json(cluster.nodes[&2].url("/cluster/init"), body).await;
    assert_eq!(status, 200, "{answer}");
    let leader = cluster.wait_for_leader(None, Duration::from_secs(20)).await;
    assert_eq!(
        put_v(cluster.nodes[&leader].url("/kv/after-retry")).await,
        200
    );
    cluster
        .wait_for_value(&[1, 2, 3], "after-retry", b"v", Duration::from_secs(20))
        .await;
    assert_eq!(cluster.voters(leader).await, BTreeSet::from([1, 2, 3]));
}
