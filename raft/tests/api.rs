//! The client API of in-process nodes: statuses for good and bad input,
//! and followers naming the leader.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use sediment_raft::node::{self, NodeConfig, RunningNode};
use sediment_raft::types::{MAX_KEY_BYTES, MAX_VALUE_BYTES};
use serde_json::Value;

async fn start_cluster(dir: &std::path::Path, n: u64) -> Vec<RunningNode> {
    let mut nodes = Vec::new();
    for id in 1..=n {
        let config = NodeConfig {
            heartbeat_ms: 1000,
            ..NodeConfig::new(id, "127.0.0.1:0".parse().unwrap(), dir.join(id.to_string()))
        };
        nodes.push(node::start(config).await.unwrap());
    }
    nodes
}

fn client() -> reqwest::Client {
    common::plain_client(Duration::from_secs(60))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn client_api_statuses() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = start_cluster(dir.path(), 3).await;
    let client = client();
    let members: BTreeMap<String, String> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| ((i + 1).to_string(), n.addr.to_string()))
        .collect();
    let url = |i: usize, path: &str| format!("http://{}{path}", nodes[i].addr);
    let init = client
        .post(url(0, "/cluster/init"))
        .json(&serde_json::json!({ "members": members }))
        .send()
        .await
        .unwrap();
    assert_eq!(init.status(), 200);
    let bad_init = client
        .post(url(0, "/cluster/init"))
        .header("content-type", "application/json")
        .body("{\"members\": 3}")
        .send()
        .await
        .unwrap();
    assert!(bad_init.status().is_client_error(), "{}", bad_init.status());
    // Addresses that no node can be reached at are refused, not stored in
    // the membership for good.
    for (path, body) in [
        (
            "/cluster/init",
            serde_json::json!({ "members": { "9": "not an address" } }),
        ),
        (
            "/cluster/add-learner",
            serde_json::json!({ "id": 77, "addr": "not an address" }),
        ),
        (
            "/cluster/add-learner",
            serde_json::json!({ "id": 77, "addr": "127.0.0.1:99999" }),
        ),
        (
            "/cluster/add-learner",
            serde_json::json!({ "id": 77, "addr": "127.0.0.1:0" }),
        ),
    ] {
        let response = client.post(url(0, path)).json(&body).send().await.unwrap();
        assert_eq!(response.status(), 400, "{path} {body}");
        let text = response.text().await.unwrap();
        assert!(text.contains("not a node address"), "{path}: {text}");
    }

    let deadline = Instant::now() + Duration::from_secs(10);
    let leader = loop {
        let m: Value = client
            .get(url(0, "/cluster/metrics"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if let Some(leader) = m["current_leader"].as_u64() {
            assert_eq!(m["id"], 1);
            assert!(
                m["membership"]["voters"].as_array().unwrap().len() == 3,
                "{m}"
            );
            break leader as usize - 1;
        }
        assert!(Instant::now() < deadline, "no leader: {m}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let follower = (leader + 1) % 3;

    // The basic cycle through the leader.
    let put = client
        .put(url(leader, "/kv/caf%C3%A9%20key"))
        .body("hello")
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let got = client
        .get(url(leader, "/kv/caf%C3%A9%20key"))
        .send()
        .await
        .unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(got.bytes().await.unwrap(), "hello");
    let missing = client.get(url(leader, "/kv/nothing")).send().await.unwrap();
    assert_eq!(missing.status(), 404);
    let deleted = client
        .delete(url(leader, "/kv/caf%C3%A9%20key"))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 200);
    let gone = client
        .get(url(leader, "/kv/caf%C3%A9%20key"))
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 404);

    // Followers name the leader.
    for request in [
        client.put(url(follower, "/kv/k")).body("v"),
        client.get(url(follower, "/kv/k")),
        client.delete(url(follower, "/kv/k")),
    ] {
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 307);
        let location = response.headers()["location"].to_str().unwrap().to_string();
        assert_eq!(location, format!("http://{}/kv/k", nodes[leader].addr));
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["leader_id"], leader as u64 + 1, "{body}");
    }
    // A read's redirect keeps its query.
    let response = client
        .get(url(follower, "/kv/k?consistency=linearizable"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 307);
    assert_eq!(
        response.headers()["location"].to_str().unwrap(),
        format!(
            "http://{}/kv/k?consistency=linearizable",
            nodes[leader].addr
        )
    );

    // Bad input: clear statuses, and the node keeps serving.
    let long_key = "k".repeat(MAX_KEY_BYTES + 1);
    for path in ["/kv/", "/kv", "/kv/%FF%FE", &format!("/kv/{long_key}")] {
        let response = client
            .put(url(leader, path))
            .body("v")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{path}");
        let body: Value = response.json().await.unwrap();
        assert!(body["error"].as_str().is_some(), "{path}: {body}");
    }
    let bad_query = client
        .get(url(leader, "/kv/k?consistency=sometimes"))
        .send()
        .await
        .unwrap();
    assert_eq!(bad_query.status(), 400);
    let too_big = client
        .put(url(leader, "/kv/big"))
        .body(vec![7_u8; MAX_VALUE_BYTES + 1])
        .send()
        .await;
    // The server may answer 413 before reading the body and close the
    // connection while the client still sends.
    if let Ok(response) = too_big {
        assert_eq!(response.status(), 413);
    }
    // The largest value goes through and comes back. Shipping 64 MiB can
    // outlast an election timeout, so follow a change of leader.
    let biggest = vec![9_u8; MAX_VALUE_BYTES];
    let mut target = url(leader, "/kv/big");
    let mut put_status = 0;
    for _ in 0..5 {
        let put = client
            .put(&target)
            .body(biggest.clone())
            .send()
            .await
            .unwrap();
        put_status = put.status().as_u16();
        match put.headers().get("location") {
            Some(location) if put_status == 307 => target = location.to_str().unwrap().into(),
            _ if put_status == 503 => tokio::time::sleep(Duration::from_millis(200)).await,
            _ => break,
        }
    }
    assert_eq!(put_status, 200);
    let got = client
        .get(format!("{target}?consistency=local"))
        .send()
        .await
        .unwrap();
    assert_eq!(got.status(), 200);
    assert!(got.bytes().await.unwrap() == biggest);
    let max_key = "m".repeat(MAX_KEY_BYTES);
    let put = client
        .put(target.replace("/kv/big", &format!("/kv/{max_key}")))
        .body("v")
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);

    for node in nodes {
        node.shutdown().await.unwrap();
    }
}

/// With a short heartbeat a node accepts only values that can reach the
/// followers within one interval (openraft cancels a longer AppendEntries
/// and resends it forever), and its 413 says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_short_heartbeat_lowers_the_value_limit_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let config = NodeConfig {
        heartbeat_ms: 100,
        ..NodeConfig::new(1, "127.0.0.1:0".parse().unwrap(), dir.path().join("1"))
    };
    let limit = config.max_value_bytes();
    assert_eq!(limit, 100 * (160 << 10));
    assert!(limit < MAX_VALUE_BYTES);
    let default = NodeConfig::new(1, "127.0.0.1:0".parse().unwrap(), dir.path().join("x"));
    assert_eq!(
        default.max_value_bytes(),
        MAX_VALUE_BYTES,
        "500 ms carries 64 MiB"
    );

    let node = node::start(config).await.unwrap();
    let client = client();
    let url = |path: &str| format!("http://{}{path}", node.addr);
    let members = serde_json::json!({ "members": { "1": node.addr.to_string() } });
    let init = client
        .post(url("/cluster/init"))
        .json(&members)
        .send()
        .await
        .unwrap();
    assert_eq!(init.status(), 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m: Value = client
            .get(url("/cluster/metrics"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if m["current_leader"] == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "no leader: {m}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let over = client
        .put(url("/kv/over"))
        .body(vec![1_u8; limit + 1])
        .send()
        .await
        .unwrap();
    assert_eq!(over.status(), 413);
    let text = over.text().await.unwrap();
    assert!(
        text.contains(&limit.to_string()) && text.contains("--heartbeat-ms"),
        "{text}"
    );
    let at = client
        .put(url("/kv/at"))
        .body(vec![2_u8; limit])
        .send()
        .await
        .unwrap();
    assert_eq!(at.status(), 200);
    let got = client
        .get(url("/kv/at"))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(got.len(), limit);
    let missing = client.get(url("/kv/over")).send().await.unwrap();
    assert_eq!(missing.status(), 404);
    node.shutdown().await.unwrap();
}
