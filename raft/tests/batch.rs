//! Writes that arrive together share a Raft entry (`Request::Batch`): the
//! state machine applies a batch's commands in order, a reopened store
//! has the same result, and concurrent `PUT`s through the HTTP API are
//! all acknowledged, read back, and see each other in order.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use openraft::{CommittedLeaderId, EntryPayload};
use sediment_raft::node::{self, NodeConfig};
use sediment_raft::types::{Change, Entry, LogId, Request};
use sediment_raft::StateMachine;
use serde_json::Value;

fn log_id(index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(1, 1), index)
}

fn put(key: &str, value: &str) -> Request {
    Request::Put {
        key: key.into(),
        value: value.as_bytes().to_vec(),
    }
}

fn change(key: &str, value: &str) -> Change {
    Change::Put {
        key: key.into(),
        value: value.as_bytes().to_vec(),
    }
}

fn entry(index: u64, request: Request) -> Entry {
    Entry {
        log_id: log_id(index),
        payload: EntryPayload::Normal(request),
    }
}

#[test]
fn a_batch_applies_its_commands_in_order_and_survives_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let sm = StateMachine::open(dir.path()).unwrap();
    let responses = sm
        .apply_entries(vec![
            entry(1, put("kept", "before")),
            entry(
                2,
                Request::Batch(vec![
                    change("a", "1"),
                    change("b", "1"),
                    Change::Delete { key: "a".into() },
                    change("a", "2"),
                    change("kept", "after"),
                    Change::Delete {
                        key: "never".into(),
                    },
                ]),
            ),
            entry(3, Request::Delete { key: "b".into() }),
        ])
        .unwrap();
    assert_eq!(responses.len(), 3);
    assert!(!responses[0].existed);
    assert!(responses[0].each.is_empty(), "a single command has no list");
    assert_eq!(
        responses[1].each,
        [false, false, true, false, true, false],
        "each command sees the ones before it"
    );
    assert!(!responses[1].existed, "the batch's first command");
    assert!(responses[2].existed, "the batch put b");

    let check = |sm: &StateMachine| {
        assert_eq!(sm.get("a").unwrap().as_deref(), Some(&b"2"[..]));
        assert_eq!(sm.get("b").unwrap(), None);
        assert_eq!(sm.get("kept").unwrap().as_deref(), Some(&b"after"[..]));
        assert_eq!(sm.get("never").unwrap(), None);
        assert_eq!(sm.applied().0, Some(log_id(3)));
    };
    check(&sm);
    sm.shutdown().unwrap();
    let sm = StateMachine::open(dir.path()).unwrap();
    check(&sm);
    sm.shutdown().unwrap();
}

#[test]
fn a_batch_of_one_key_keeps_its_last_value() {
    let dir = tempfile::tempdir().unwrap();
    let sm = StateMachine::open(dir.path()).unwrap();
    let batch = (0..100).map(|i| change("k", &i.to_string())).collect();
    let responses = sm
        .apply_entries(vec![entry(1, Request::Batch(batch))])
        .unwrap();
    let mut expected = vec![true; 100];
    expected[0] = false;
    assert_eq!(responses[0].each, expected);
    assert_eq!(sm.get("k").unwrap().as_deref(), Some(&b"99"[..]));
    assert_eq!(sm.keys(), ["k"]);
    sm.shutdown().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_puts_share_entries_and_are_all_applied() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = Vec::new();
    for id in 1..=3 {
        let config = NodeConfig {
            heartbeat_ms: 1000,
            ..NodeConfig::new(
                id,
                "127.0.0.1:0".parse().unwrap(),
                dir.path().join(id.to_string()),
            )
        };
        nodes.push(node::start(config).await.unwrap());
    }
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let members: BTreeMap<String, String> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| ((i + 1).to_string(), n.addr.to_string()))
        .collect();
    let init = client
        .post(format!("http://{}/cluster/init", nodes[0].addr))
        .json(&serde_json::json!({ "members": members }))
        .send()
        .await
        .unwrap();
    assert_eq!(init.status(), 200);
    let deadline = Instant::now() + Duration::from_secs(20);
    let leader = loop {
        if let Some(leader) = nodes[0].raft.metrics().borrow().current_leader {
            break nodes[leader as usize - 1].addr;
        }
        assert!(Instant::now() < deadline, "no leader elected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    // 64 writers at once: half to keys of their own, half to one shared key.
    const WRITERS: usize = 64;
    let mut tasks = Vec::new();
    for i in 0..WRITERS {
        let client = client.clone();
        let key = if i % 2 == 0 {
            format!("own-{i}")
        } else {
            "shared".to_string()
        };
        tasks.push(tokio::spawn(async move {
            let response = client
                .put(format!("http://{leader}/kv/{key}"))
                .body(format!("value {i}"))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200, "PUT {key}");
            let body: Value = response.json().await.unwrap();
            (
                i,
                body["log_index"].as_u64().unwrap(),
                body["replaced"].as_bool().unwrap(),
            )
        }));
    }
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    let entries: BTreeSet<u64> = results.iter().map(|r| r.1).collect();
    println!(
        "{WRITERS} concurrent PUTs went into {} entries",
        entries.len()
    );
    assert!(
        entries.len() < WRITERS,
        "{WRITERS} concurrent writes took {} entries: none were batched",
        entries.len()
    );
    for (i, _, replaced) in &results {
        if i % 2 == 0 {
            assert!(!replaced, "own-{i} was written once");
        }
    }
    let first_writes = results
        .iter()
        .filter(|(i, _, replaced)| i % 2 == 1 && !replaced)
        .count();
    assert_eq!(first_writes, 1, "exactly one PUT found `shared` absent");
    // The shared key holds the value of the write ordered last: one in the
    // highest entry.
    let last_entry = results
        .iter()
        .filter(|r| r.0 % 2 == 1)
        .map(|r| r.1)
        .max()
        .unwrap();
    let shared: Vec<u8> = client
        .get(format!("http://{leader}/kv/shared"))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .to_vec();
    let writer: usize = String::from_utf8(shared).unwrap()["value ".len()..]
        .parse()
        .unwrap();
    assert!(
        results
            .iter()
            .any(|r| r.0 == writer && r.1 == last_entry && writer % 2 == 1),
        "`shared` holds value {writer}, not one from entry {last_entry}"
    );
    for i in (0..WRITERS).step_by(2) {
        let response = client
            .get(format!("http://{leader}/kv/own-{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.text().await.unwrap(), format!("value {i}"));
    }
    // Every node applies the same batches.
    let deadline = Instant::now() + Duration::from_secs(20);
    for node in &nodes {
        loop {
            let value = node.state_machine.get("own-62").unwrap();
            if value.as_deref() == Some(&b"value 62"[..]) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {} never applied",
                node.addr
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    for node in nodes {
        node.shutdown().await.unwrap();
    }
}

/// The command type as it was when a batch held commands: a batch written
/// then (puts and deletes only) must read back the same now.
#[derive(serde::Serialize)]
enum EarlierRequest {
    Put {
        key: String,
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
    },
    Delete {
        key: String,
    },
    Batch(Vec<EarlierRequest>),
}

#[test]
fn batches_written_before_changes_were_flat_decode_the_same() {
    let earlier = EarlierRequest::Batch(vec![
        EarlierRequest::Put {
            key: "a".into(),
            value: vec![1, 2, 3],
        },
        EarlierRequest::Delete { key: "b".into() },
        EarlierRequest::Put {
            key: "ü".into(),
            value: Vec::new(),
        },
    ]);
    let now = Request::Batch(vec![
        change("a", "\u{1}\u{2}\u{3}"),
        Change::Delete { key: "b".into() },
        change("ü", ""),
    ]);
    let bytes = bincode::serialize(&earlier).unwrap();
    assert_eq!(bincode::serialize(&now).unwrap(), bytes);
    assert_eq!(
        sediment_raft::validate::decode_all::<Request>(&bytes).unwrap(),
        now
    );
    for single in [
        (
            EarlierRequest::Put {
                key: "k".into(),
                value: b"v".to_vec(),
            },
            put("k", "v"),
        ),
        (
            EarlierRequest::Delete { key: "k".into() },
            Request::Delete { key: "k".into() },
        ),
    ] {
        let bytes = bincode::serialize(&single.0).unwrap();
        assert_eq!(bincode::serialize(&single.1).unwrap(), bytes);
    }

    // A log written with the earlier encoding opens and applies: the entry
    // bytes are the entry's header, then the command's.
    let dir = tempfile::tempdir().unwrap();
    let store = sediment_raft::LogStore::open(dir.path().join("log")).unwrap();
    let written = entry(1, now.clone());
    let entry_bytes = bincode::serialize(&written).unwrap();
    assert!(entry_bytes.ends_with(&bytes), "the command ends the entry");
    let (done, durable) = std::sync::mpsc::channel();
    store
        .append_entries(
            vec![written],
            Box::new(move |r| {
                let _ = done.send(r.is_ok());
            }),
        )
        .unwrap();
    assert!(durable.recv().unwrap());
    store.shutdown().unwrap();
    drop(store);
    let store = sediment_raft::LogStore::open(dir.path().join("log")).unwrap();
    let read = store.read_entries(1..=1).unwrap();
    assert_eq!(bincode::serialize(&read[0]).unwrap(), entry_bytes);
    let sm = StateMachine::open(dir.path().join("state")).unwrap();
    sm.apply_entries(read).unwrap();
    assert_eq!(sm.get("a").unwrap().as_deref(), Some(&[1, 2, 3][..]));
    assert_eq!(sm.get("ü").unwrap().as_deref(), Some(&[][..]));
    sm.shutdown().unwrap();
    store.shutdown().unwrap();
}

#[test]
fn a_batch_holding_a_batch_does_not_decode() {
    // Tag 2 inside a batch was never written; it is an error now, not a
    // recursion.
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&2_u32.to_le_bytes());
    bytes.extend_from_slice(&1_u64.to_le_bytes());
    bytes.extend_from_slice(&2_u32.to_le_bytes());
    bytes.extend_from_slice(&0_u64.to_le_bytes());
    assert!(sediment_raft::validate::decode_all::<Request>(&bytes).is_err());
}
