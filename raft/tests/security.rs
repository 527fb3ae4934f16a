//! Node processes with TLS, a bearer token and connection limits: requests
//! without the right credentials are refused and change nothing, a node
//! does not serve beyond loopback unprotected, oversized bodies are
//! refused before they are read, slow and idle connections are closed,
//! and a flood of idle connections does not stop the cluster.

mod common;

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use common::{free_port, open_descriptors, put, Cluster, Credentials};
use openraft::raft::{AppendEntriesRequest, VoteRequest};
use openraft::{CommittedLeaderId, EntryPayload, Vote};
use sediment_raft::limits::{MAX_APPEND_BODY_BYTES, MAX_STAGE_BODY_BYTES, MAX_VOTE_BODY_BYTES};
use sediment_raft::stage::StageRequest;
use sediment_raft::types::{Entry, LogId, Request, TypeConfig};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const BIN: &str = env!("CARGO_BIN_EXE_sediment-raft");

/// Every client and cluster endpoint and every Raft RPC, with a body
/// that would change something if it were accepted: a vote, an
/// AppendEntries and a stage request from a node 1,000 terms ahead.
fn requests(term: u64) -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let vote = bincode::serialize(&VoteRequest::<u64>::new(Vote::new(term + 1000, 3), None))
        .expect("a vote request");
    let append = bincode::serialize(&AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(term + 1000, 3),
        prev_log_id: None,
        leader_commit: None,
        entries: Vec::new(),
    })
    .expect("an append request");
    let stage = bincode::serialize(&StageRequest {
        vote: Vote::new_committed(term + 1000, 3),
        prev: None,
        entries: vec![Entry {
            log_id: LogId::new(CommittedLeaderId::new(term + 1000, 3), 0),
            payload: EntryPayload::Normal(Request::Put {
                key: "new".into(),
                value: b"new".to_vec(),
            }),
        }],
    })
    .expect("a stage request");
    vec![
        ("GET", "/kv/kept", Vec::new()),
        ("PUT", "/kv/kept", b"changed".to_vec()),
        ("PUT", "/kv/new", b"new".to_vec()),
        ("DELETE", "/kv/kept", Vec::new()),
        ("GET", "/cluster/metrics", Vec::new()),
        (
            "POST",
            "/cluster/init",
            json!({"members": {"9": "127.0.0.1:1"}})
                .to_string()
                .into_bytes(),
        ),
        (
            "POST",
            "/cluster/add-learner",
            json!({"id": 9, "addr": "127.0.0.1:1"})
                .to_string()
                .into_bytes(),
        ),
        (
            "POST",
            "/cluster/change-membership",
            json!({"members": [1]}).to_string().into_bytes(),
        ),
        ("POST", "/cluster/snapshot", Vec::new()),
        ("POST", "/raft/vote", vote),
        ("POST", "/raft/append", append),
        ("POST", "/raft/stage", stage),
        // Refused before the body is looked at.
        ("POST", "/raft/snapshot", b"not a snapshot chunk".to_vec()),
        ("GET", "/no/such/endpoint", Vec::new()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_the_token_get_401_and_change_nothing() {
    let credentials = Credentials::generate();
    // 300 ms heartbeats: elections only after 1.2 s of silence.
    let cluster = Cluster::start_with(&[1, 2, 3], &["--heartbeat-ms", "300"], Some(&credentials));
    cluster.wait_up(&[1, 2, 3]).await;
    cluster.init().await;
    let leader = cluster.wait_for_leader(None, Duration::from_secs(20)).await;
    let follower = *cluster.nodes.keys().find(|&&id| id != leader).unwrap();
    let r = cluster
        .client
        .put(cluster.nodes[&leader].url("/kv/kept"))
        .body("original")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    cluster.wait_caught_up(Duration::from_secs(20)).await;

    // A follower redirects to the leader's https URL.
    let r = cluster
        .client
        .get(cluster.nodes[&follower].url("/kv/kept"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 307);
    let location = r.headers()["location"].to_str().unwrap().to_string();
    assert_eq!(
        location,
        format!("https://{}/kv/kept", cluster.nodes[&leader].addr)
    );

    let before: BTreeMap<u64, Value> = {
        let mut m = BTreeMap::new();
        for &id in cluster.nodes.keys() {
            m.insert(id, cluster.metrics(id).await.unwrap());
        }
        m
    };
    let term = before[&leader]["current_term"].as_u64().unwrap();

    let no_token = credentials.client_builder(true).build().unwrap();
    let token = &credentials.token;
    let wrong = format!("{}{}", &token[..token.len() - 1], "z");
    let clients = [
        ("no token", no_token),
        ("a wrong token", credentials.client_with_token(&wrong)),
        ("a token prefix", credentials.client_with_token(&token[..4])),
    ];
    for node in cluster.nodes.values() {
        for (what, client) in &clients {
            for (method, path, body) in requests(term) {
                let r = client
                    .request(method.parse().unwrap(), node.url(path))
                    .body(body)
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("{method} {path} with {what}: {e}"));
                assert_eq!(r.status(), 401, "{method} {path} with {what}");
                assert_eq!(r.headers()["www-authenticate"], "Bearer");
                let body: Value = r.json().await.unwrap();
                assert!(body["error"].is_string(), "{method} {path}: {body}");
            }
        }
    }

    // Nothing changed: the key, the membership, the term (a forged vote
    // or AppendEntries would have moved it 1,000 ahead), no snapshot.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for &id in cluster.nodes.keys() {
        let now = cluster.metrics(id).await.unwrap();
        assert_eq!(now["membership"], before[&id]["membership"], "node {id}");
        assert_eq!(now["keys"], 1, "node {id}");
        assert!(now["snapshot"].is_null(), "node {id}: {now}");
        assert!(
            now["current_term"].as_u64().unwrap() < term + 1000,
            "node {id}: {now}"
        );
        assert_eq!(
            cluster.local_get(id, "kept").await.as_deref(),
            Some(&b"original"[..])
        );
        assert_eq!(cluster.local_get(id, "new").await, None);
    }

    // Neither the token nor the key shows in the metrics or the logs.
    let key_pem = std::fs::read_to_string(credentials.path("node-key.pem")).unwrap();
    let key_line = key_pem.lines().nth(1).unwrap();
    for (&id, node) in &cluster.nodes {
        let metrics = cluster.metrics(id).await.unwrap().to_string();
        let log = node.log();
        for text in [&metrics, &log] {
            assert!(!text.contains(token.as_str()), "node {id}");
            assert!(!text.contains(key_line), "node {id}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_alone_authenticates_clients() {
    let credentials = Credentials::generate();
    let args = credentials.tls_args(true);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cluster = Cluster::start(&[], &[]);
    cluster.scheme = "https";
    cluster.client = credentials.client_builder(true).build().unwrap();
    cluster.add_node(1, &args);
    cluster.wait_up(&[1]).await;
    cluster.init().await;
    cluster.wait_for_leader(None, Duration::from_secs(20)).await;
    let url = cluster.nodes[&1].url("/kv/a");
    let r = cluster.client.put(&url).body("1").send().await.unwrap();
    assert_eq!(r.status(), 200);

    // Without a client certificate the TLS handshake fails; plain HTTP
    // gets no answer either.
    let anonymous = credentials.client_builder(false).build().unwrap();
    assert!(anonymous.put(&url).body("2").send().await.is_err());
    let plain = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let plain_url = format!("http://{}/kv/a", cluster.nodes[&1].addr);
    let answered = plain.put(&plain_url).body("3").send().await;
    assert!(
        answered.as_ref().map_or(true, |r| !r.status().is_success()),
        "{answered:?}"
    );
    assert_eq!(cluster.local_get(1, "a").await.as_deref(), Some(&b"1"[..]));
}

/// Runs a node to its exit (at most 30 s); returns its exit code and
/// stderr.
fn run_to_exit(args: &[&str]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let err = dir.path().join("stderr");
    let mut child = Command::new(BIN)
        .args(["node", "--id", "1", "--dir"])
        .arg(dir.path().join("data"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the node did not exit; stderr: {}",
                std::fs::read_to_string(&err).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (status.code(), std::fs::read_to_string(&err).unwrap())
}

/// Starts a node, waits until `url` answers 200 through `client`, and
/// stops it; returns its stderr.
async fn starts_and_serves(args: &[&str], url: &str, client: &reqwest::Client) -> String {
    let dir = tempfile::tempdir().unwrap();
    let err = dir.path().join("stderr");
    let mut child: Child = Command::new(BIN)
        .args(["node", "--id", "1", "--dir"])
        .arg(dir.path().join("data"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "the node exited ({status}): {}",
                std::fs::read_to_string(&err).unwrap_or_default()
            );
        }
        if let Ok(r) = client.get(url).send().await {
            if r.status() == 200 {
                break;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the node did not serve {url}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    std::fs::read_to_string(&err).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_beyond_loopback_needs_tls_and_credentials() {
    let credentials = Credentials::generate();
    let (code, err) = run_to_exit(&["--listen", "0.0.0.0:0"]);
    assert_eq!(code, Some(1), "{err}");
    for flag in [
        "--tls-cert",
        "--tls-key",
        "--token-file",
        "--tls-ca",
        "--allow-insecure-network",
    ] {
        assert!(err.contains(flag), "{flag} missing from: {err}");
    }
    assert!(err.contains("0.0.0.0:0"), "{err}");

    // TLS alone is not enough; the error asks only for what is missing.
    let tls = credentials.tls_args(false);
    let mut args = vec!["--listen", "0.0.0.0:0"];
    args.extend(tls.iter().map(String::as_str));
    let (code, err) = run_to_exit(&args);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("--token-file") && !err.contains("--tls-cert"),
        "{err}"
    );

    // An empty or missing token file is refused, naming the file.
    let empty = credentials.path("empty-token");
    std::fs::write(&empty, "\n").unwrap();
    let (code, err) = run_to_exit(&[
        "--listen",
        "127.0.0.1:0",
        "--token-file",
        empty.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("empty") && err.contains("empty-token"),
        "{err}"
    );
    let missing = credentials.path("no-such-token");
    let (code, err) = run_to_exit(&[
        "--listen",
        "127.0.0.1:0",
        "--token-file",
        missing.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no-such-token"), "{err}");

    // --allow-insecure-network starts it, with a warning.
    let port = free_port();
    let listen = format!("0.0.0.0:{port}");
    let plain = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let err = starts_and_serves(
        &["--listen", &listen, "--allow-insecure-network"],
        &format!("http://127.0.0.1:{port}/cluster/metrics"),
        &plain,
    )
    .await;
    assert!(err.contains("warning"), "{err}");

    // TLS and a token start it without one.
    let port = free_port();
    let listen = format!("0.0.0.0:{port}");
    let mut args = vec!["--listen", listen.as_str()];
    let secure = credentials.node_args();
    args.extend(secure.iter().map(String::as_str));
    let err = starts_and_serves(
        &args,
        &format!("https://127.0.0.1:{port}/cluster/metrics"),
        &credentials.client_with_token(&credentials.token),
    )
    .await;
    assert!(!err.contains("warning"), "{err}");
}

/// Reads until the server closes the connection or `bound` passes;
/// returns what arrived and whether it was closed.
async fn read_until_closed(stream: &mut TcpStream, bound: Duration) -> (String, bool) {
    let deadline = tokio::time::Instant::now() + bound;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&got).into_owned(), true),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => return (String::from_utf8_lossy(&got).into_owned(), false),
        }
    }
}

/// Reads until `needle` has arrived (at most 10 s).
async fn read_until(stream: &mut TcpStream, needle: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains(needle) {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
            other => panic!(
                "no {needle:?} ({other:?}) after: {}",
                String::from_utf8_lossy(&got)
            ),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_bodies_are_refused_before_they_are_read() {
    // The body timeout is long: a 413 that comes sooner was not waiting
    // for the body.
    let cluster = Cluster::start(
        &[1],
        &["--heartbeat-ms", "10", "--body-timeout-ms", "600000"],
    );
    cluster.wait_up(&[1]).await;
    let addr = cluster.nodes[&1].addr.clone();

    // A Content-Length over the AppendEntries limit, with no body sent.
    let mut stream = TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /raft/append HTTP/1.1\r\nhost: node\r\ncontent-length: {}\r\n\r\n",
        MAX_APPEND_BODY_BYTES + 1
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let answer = read_until(&mut stream, "}").await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");

    // The same over the stage request's limit.
    let mut stream = TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /raft/stage HTTP/1.1\r\nhost: node\r\ncontent-length: {}\r\n\r\n",
        MAX_STAGE_BODY_BYTES + 1
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let answer = read_until(&mut stream, "}").await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");

    // A chunked vote body that passes its limit by one byte and never
    // ends (nothing is left unread when the server answers).
    let mut stream = TcpStream::connect(&addr).await.unwrap();
    stream
        .write_all(b"POST /raft/vote HTTP/1.1\r\nhost: node\r\ntransfer-encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    let quarter = MAX_VOTE_BODY_BYTES / 4;
    for len in [quarter, quarter, quarter, quarter, 1] {
        stream
            .write_all(format!("{len:x}\r\n").as_bytes())
            .await
            .unwrap();
        stream.write_all(&vec![b'v'; len]).await.unwrap();
        stream.write_all(b"\r\n").await.unwrap();
    }
    let answer = read_until(&mut stream, "}").await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");

    // A value over this node's limit (10 ms heartbeats: 1.6 MB), by its
    // Content-Length: the answer names the limit's reason.
    let mut stream = TcpStream::connect(&addr).await.unwrap();
    stream
        .write_all(b"PUT /kv/big HTTP/1.1\r\nhost: node\r\ncontent-length: 2000000\r\n\r\n")
        .await
        .unwrap();
    let answer = read_until(&mut stream, "}").await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("--heartbeat-ms"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_idle_connections_are_closed() {
    let cluster = Cluster::start(
        &[1],
        &[
            "--header-timeout-ms",
            "300",
            "--body-timeout-ms",
            "500",
            "--idle-timeout-ms",
            "500",
        ],
    );
    cluster.wait_up(&[1]).await;
    cluster.init().await;
    cluster.wait_for_leader(None, Duration::from_secs(20)).await;
    let addr = cluster.nodes[&1].addr.clone();
    let bound = Duration::from_secs(15);

    // Connected, silent.
    let mut silent = TcpStream::connect(&addr).await.unwrap();
    // Headers that never end.
    let mut slow = TcpStream::connect(&addr).await.unwrap();
    slow.write_all(b"GET /cluster/metrics HTTP/1.1\r\nhost: node\r\nx-slow: ")
        .await
        .unwrap();
    // A body shorter than its Content-Length.
    let mut short = TcpStream::connect(&addr).await.unwrap();
    short
        .write_all(b"PUT /kv/short HTTP/1.1\r\nhost: node\r\ncontent-length: 1000\r\n\r\nabc")
        .await
        .unwrap();
    // A request answered, then nothing.
    let mut idle = TcpStream::connect(&addr).await.unwrap();
    idle.write_all(b"GET /cluster/metrics HTTP/1.1\r\nhost: node\r\n\r\n")
        .await
        .unwrap();

    let (got, closed) = read_until_closed(&mut silent, bound).await;
    assert!(closed && got.is_empty(), "silent: {got:?}");
    let (got, closed) = read_until_closed(&mut slow, bound).await;
    assert!(closed && got.is_empty(), "slow headers: {got:?}");
    let (got, closed) = read_until_closed(&mut short, bound).await;
    assert!(closed, "short body: {got:?}");
    assert!(got.starts_with("HTTP/1.1 408"), "short body: {got:?}");
    let (got, closed) = read_until_closed(&mut idle, bound).await;
    assert!(closed, "idle: {got:?}");
    assert!(got.starts_with("HTTP/1.1 200"), "idle: {got:?}");

    // The short PUT wrote nothing.
    assert_eq!(cluster.local_get(1, "short").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_succeed_through_a_flood_of_idle_connections() {
    const FLOOD: usize = 1003;
    const CAP: usize = 64;
    // This process holds the flood's sockets.
    rlimit::increase_nofile_limit(u64::MAX).unwrap();
    let cluster = Cluster::start(
        &[1, 2, 3],
        &[
            "--heartbeat-ms",
            "100",
            "--max-connections",
            &CAP.to_string(),
        ],
    );
    cluster.wait_up(&[1, 2, 3]).await;
    cluster.init().await;
    let leader = cluster.wait_for_leader(None, Duration::from_secs(20)).await;
    let pid = cluster.nodes[&leader].pid().unwrap();
    let before = open_descriptors(pid);

    let mut flood = Vec::with_capacity(FLOOD);
    for _ in 0..FLOOD {
        flood.push(
            TcpStream::connect(&cluster.nodes[&leader].addr)
                .await
                .unwrap(),
        );
    }

    let bases = cluster.bases();
    let hint = AtomicU64::new(leader);
    let deadline = Instant::now() + Duration::from_secs(60);
    for i in 0..20 {
        let written = put(
            &cluster.client,
            &bases,
            &format!("during-flood-{i}"),
            b"value",
            &hint,
            || Instant::now() > deadline,
        )
        .await;
        assert!(written, "write {i} during the flood");
    }
    let during = open_descriptors(pid);
    assert!(
        during <= before + CAP + 16,
        "the leader holds {during} descriptors (had {before} before the flood, cap {CAP})"
    );

    // The server closed all but the cap of the flood's connections.
    let mut readers = tokio::task::JoinSet::new();
    for mut stream in flood {
        readers.spawn(async move {
            read_until_closed(&mut stream, Duration::from_secs(5))
                .await
                .1
        });
    }
    let mut closed = 0;
    while let Some(was_closed) = readers.join_next().await {
        closed += usize::from(was_closed.unwrap());
    }
    assert!(closed >= FLOOD - CAP, "only {closed} of {FLOOD} closed");

    cluster.wait_caught_up(Duration::from_secs(20)).await;
    for &id in cluster.nodes.keys() {
        assert_eq!(
            cluster.local_get(id, "during-flood-19").await.as_deref(),
            Some(&b"value"[..])
        );
    }
}
