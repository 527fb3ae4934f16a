//! The `/cluster/...` endpoints take their JSON body whatever the request's
//! `Content-Type` says: `curl -d '{...}'` labels it
//! `application/x-www-form-urlencoded`, and a client that sends a string
//! body labels it nothing. Bad JSON still gets a 4xx, and so do wrong
//! methods and paths, each with a JSON error message.

mod common;

use std::time::Duration;

use common::Cluster;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_endpoints_accept_json_without_a_json_content_type() {
    let cluster = Cluster::start(&[1], &["--heartbeat-ms", "100"]);
    cluster.wait_up(&[1]).await;
    let node = &cluster.nodes[&1];
    let post = |path: &str, body: String, content_type: Option<&str>| {
        let mut request = cluster.client.post(node.url(path)).body(body);
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        request.send()
    };

    // No Content-Type at all.
    let init = post(
        "/cluster/init",
        format!(r#"{{"members": {{"1": "{}"}}}}"#, node.addr),
        None,
    )
    .await
    .unwrap();
    let status = init.status();
    assert_eq!(status, 200, "{}", init.text().await.unwrap());
    cluster.wait_for_leader(None, Duration::from_secs(15)).await;

    // What `curl -d` sends.
    let form = Some("application/x-www-form-urlencoded");
    let change = post(
        "/cluster/change-membership",
        r#"{"members": [1]}"#.into(),
        form,
    )
    .await
    .unwrap();
    let status = change.status();
    assert_eq!(status, 200, "{}", change.text().await.unwrap());
    let bad_addr = post(
        "/cluster/add-learner",
        r#"{"id": 2, "addr": "not an address"}"#.into(),
        form,
    )
    .await
    .unwrap();
    assert_eq!(bad_addr.status(), 400);
    let body: Value = bad_addr.json().await.unwrap();
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("not a node address")),
        "{body}"
    );

    // Malformed JSON and JSON of the wrong shape are still refused.
    for (path, body, expected) in [
        ("/cluster/init", "{bad json", 400),
        ("/cluster/init", r#"{"members": 3}"#, 422),
        ("/cluster/add-learner", r#"{"idx": 4}"#, 422),
        ("/cluster/change-membership", "", 400),
    ] {
        let response = post(path, body.into(), None).await.unwrap();
        assert_eq!(response.status(), expected, "{path} {body:?}");
        let body: Value = response.json().await.unwrap();
        assert!(body["error"].as_str().is_some(), "{path}: {body}");
    }

    // The node still serves.
    let put = cluster
        .client
        .put(node.url("/kv/after"))
        .body("ok")
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_methods_and_paths_get_a_json_error() {
    let cluster = Cluster::start(&[1], &["--heartbeat-ms", "100"]);
    cluster.wait_up(&[1]).await;
    let node = &cluster.nodes[&1];
    let client = &cluster.client;
    for (request, expected) in [
        (client.post(node.url("/kv/a")).body("x"), 405),
        (client.put(node.url("/cluster/init")).body("{}"), 405),
        (client.get(node.url("/cluster/add-learner")), 405),
        (client.delete(node.url("/cluster/metrics")), 405),
        (client.get(node.url("/nothing/here")), 404),
        (client.get(node.url("/")), 404),
    ] {
        let response = request.send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        assert_eq!(status, expected, "{text}");
        let body: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{status}: not JSON ({e}): {text:?}"));
        assert!(
            body["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{body}"
        );
    }
    // The Raft RPC paths still answer the peers' POSTs.
    let rpc = client
        .post(node.url("/raft/vote"))
        .body(vec![0_u8; 3])
        .send()
        .await
        .unwrap();
    assert_eq!(rpc.status(), 400, "an undecodable vote is refused, not 404");
}

/// `add-learner` and `change-membership` also take the shapes openraft's
/// examples send (`[id, "addr"]`, `[1, 2]`), `node_id` for `id`, and a
/// members map as `/cluster/init` takes; anything else is a 422 that says
/// what is expected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_bodies_in_other_common_shapes() {
    let cluster = Cluster::start(&[1, 2], &["--heartbeat-ms", "100"]);
    cluster.wait_up(&[1, 2]).await;
    let (one, two) = (&cluster.nodes[&1], &cluster.nodes[&2]);
    let post = |path: &str, body: Value| cluster.client.post(one.url(path)).json(&body).send();
    let voters = || async {
        let m = cluster.metrics(1).await.unwrap();
        m["membership"]["voters"].clone()
    };

    let init = post(
        "/cluster/init",
        serde_json::json!({ "members": { "1": one.addr } }),
    )
    .await
    .unwrap();
    assert_eq!(init.status(), 200);
    cluster.wait_for_leader(None, Duration::from_secs(15)).await;

    for (path, body, expect_voters) in [
        (
            "/cluster/add-learner",
            serde_json::json!([2, two.addr]),
            None,
        ),
        (
            "/cluster/change-membership",
            serde_json::json!([1, 2]),
            Some(serde_json::json!([1, 2])),
        ),
        (
            "/cluster/change-membership",
            serde_json::json!({ "members": { "1": one.addr } }),
            Some(serde_json::json!([1])),
        ),
        (
            "/cluster/add-learner",
            serde_json::json!({ "node_id": 2, "addr": two.addr }),
            None,
        ),
        (
            "/cluster/change-membership",
            serde_json::json!({ "members": [1, 2] }),
            Some(serde_json::json!([1, 2])),
        ),
    ] {
        let response = post(path, body.clone()).await.unwrap();
        let status = response.status();
        assert_eq!(
            status,
            200,
            "{path} {body}: {}",
            response.text().await.unwrap()
        );
        if let Some(expected) = expect_voters {
            assert_eq!(voters().await, expected, "after {path} {body}");
        }
    }

    for (path, body) in [
        ("/cluster/add-learner", serde_json::json!({ "idx": 4 })),
        ("/cluster/add-learner", serde_json::json!([4])),
        (
            "/cluster/change-membership",
            serde_json::json!({ "members": 3 }),
        ),
        (
            "/cluster/change-membership",
            serde_json::json!({ "members": { "x": "127.0.0.1:1" } }),
        ),
    ] {
        let response = post(path, body.clone()).await.unwrap();
        assert_eq!(response.status(), 422, "{path} {body}");
        let error: Value = response.json().await.unwrap();
        assert!(
            error["error"]
                .as_str()
                .is_some_and(|e| e.contains("expected")),
            "{path} {body}: {error}"
        );
    }
}
