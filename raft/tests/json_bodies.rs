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
