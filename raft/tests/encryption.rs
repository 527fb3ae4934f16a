//! Encryption at rest of a node's files (`--key-file`): node processes
//! on loopback whose directories hold no plaintext of the values written
//! to them, after snapshots, purges, a snapshot sent to a follower with a
//! key of its own, and restarts; a wrong or missing key refuses to start
//! without changing a byte; and the log store's and state machine's
//! sealed files refuse damage, moved records and an older snapshot put in
//! place of the current one, naming the file.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{put, run_node_to_exit, Cluster, Rng};
use okaywal::encryption::{KeyError, StaticKey};
use openraft::{CommittedLeaderId, EntryPayload};
use sediment_raft::types::{Entry, LogId, Request};
use sediment_raft::{Error, LogStore, LogStoreConfig, StateMachine, StateMachineConfig};

/// A value no file of an encrypted node may show: random lowercase
/// letters, so that any 16 bytes of it are distinctive.
fn value(rng: &mut Rng, i: u64) -> Vec<u8> {
    let mut value = format!("secret-{i:05}-").into_bytes();
    let len = rng.range(200, 700);
    value.extend((0..len).map(|_| b'a' + rng.below(26) as u8));
    value
}

fn write_key(path: &Path, byte: u8) {
    std::fs::write(path, format!("{:02x}", byte).repeat(32)).unwrap();
}

/// Every file under `dir`, path → bytes.
fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(bytes) = std::fs::read(&path) {
                out.insert(path, bytes);
            }
        }
    }
    out
}

/// Fails if any 16-byte window of any of `values` is in a file under
/// `dir`; returns how many files were scanned.
fn assert_no_plaintext(dir: &Path, values: &[Vec<u8>]) -> usize {
    let windows: HashSet<&[u8]> = values.iter().flat_map(|v| v.windows(16)).collect();
    let files = files(dir);
    for (path, bytes) in &files {
        if let Some(at) = bytes.windows(16).position(|w| windows.contains(w)) {
            panic!(
                "{} holds plaintext of a value at offset {at}: {:?}",
                path.display(),
                String::from_utf8_lossy(&bytes[at..at + 16])
            );
        }
    }
    files.len()
}

fn magic(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()[..8].to_vec()
}

/// The `snapshot-*` files under `dir`.
fn snapshot_files(dir: &Path) -> Vec<PathBuf> {
    files(&dir.join("state/snapshots"))
        .into_keys()
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("snapshot-"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_encrypted_cluster_serves_catches_up_and_leaves_no_plaintext() {
    let args = [
        "--heartbeat-ms",
        "100",
        "--snapshot-logs",
        "60",
        "--keep-logs",
        "10",
        "--log-segment-bytes",
        "65536",
    ];
    let mut cluster = Cluster::start(&[], &[]);
    // Each node has a key of its own: a snapshot sent to a follower goes
    // over the connection as the plain stream and is sealed again there.
    for id in 1..=3 {
        let key = cluster.dir.path().join(format!("node-{id}.key"));
        write_key(&key, 0x10 + id as u8);
        let mut node_args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        node_args.extend(["--key-file".into(), key.to_str().unwrap().to_string()]);
        let node_args: Vec<&str> = node_args.iter().map(String::as_str).collect();
        cluster.add_node(id, &node_args);
    }
    cluster.wait_up(&[1, 2, 3]).await;
    cluster.init().await;
    let leader = cluster.wait_for_leader(None, Duration::from_secs(15)).await;
    let bases = cluster.bases();
    let hint = AtomicU64::new(leader);
    let mut rng = Rng::new(0x5eed_e4c7);
    let mut values = Vec::new();
    let client = cluster.client.clone();
    for i in 0..120 {
        let v = value(&mut rng, i);
        assert!(put(&client, &bases, &format!("key-{i}"), &v, &hint, || false).await);
        values.push(v);
    }

    // A follower misses entries the others purge after their snapshots:
    // it can only catch up from a snapshot.
    let behind = *cluster.nodes.keys().find(|&&id| id != leader).unwrap();
    cluster.nodes.get_mut(&behind).unwrap().kill();
    for i in 120..300 {
        let v = value(&mut rng, i);
        assert!(put(&client, &bases, &format!("key-{i}"), &v, &hint, || false).await);
        values.push(v);
    }
    let response = client
        .post(cluster.nodes[&leader].url("/cluster/snapshot"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let metrics = cluster.metrics(leader).await.unwrap();
    let purged = metrics["purged"]
        .as_u64()
        .expect("the leader purged its log");
    cluster.nodes.get_mut(&behind).unwrap().start();
    cluster.wait_caught_up(Duration::from_secs(30)).await;
    let m = cluster.metrics(behind).await.unwrap();
    assert!(
        m["snapshot"].as_u64().is_some_and(|s| s >= purged),
        "node {behind} caught up from a snapshot: {m}"
    );
    for i in [0, 77, 150, 299] {
        assert_eq!(
            cluster
                .local_get(behind, &format!("key-{i}"))
                .await
                .as_deref(),
            Some(&values[i][..]),
            "key-{i} on node {behind}"
        );
    }

    // The leader restarts; the cluster keeps serving, and it catches up.
    cluster.nodes.get_mut(&leader).unwrap().kill();
    let new_leader = cluster
        .wait_for_leader(Some(leader), Duration::from_secs(15))
        .await;
    hint.store(new_leader, std::sync::atomic::Ordering::Relaxed);
    for i in 300..320 {
        let v = value(&mut rng, i);
        assert!(put(&client, &bases, &format!("key-{i}"), &v, &hint, || false).await);
        values.push(v);
    }
    cluster.nodes.get_mut(&leader).unwrap().start();
    cluster.wait_caught_up(Duration::from_secs(30)).await;
    for (id, i) in [(leader, 310), (leader, 5), (behind, 319)] {
        assert_eq!(
            cluster.local_get(id, &format!("key-{i}")).await.as_deref(),
            Some(&values[i][..]),
            "key-{i} on node {id}"
        );
    }

    for node in cluster.nodes.values_mut() {
        node.kill();
    }
    let mut scanned = 0;
    let mut archives = 0;
    for node in cluster.nodes.values() {
        let dir = &node.dir;
        assert_eq!(magic(&dir.join("key-check")), b"SRKEYCK1");
        assert_eq!(magic(&dir.join("log/meta")), b"SRLOGME1");
        for path in files(&dir.join("log")).into_keys() {
            if path
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("archive-")
            {
                assert_eq!(magic(&path), b"SRARCHX1", "{}", path.display());
                archives += 1;
            }
        }
        let snapshots = snapshot_files(dir);
        assert!(!snapshots.is_empty(), "node {} kept a snapshot", node.id);
        for path in snapshots {
            assert_eq!(magic(&path), b"SRSNAPX1", "{}", path.display());
        }
        scanned += assert_no_plaintext(dir, &values);
    }
    assert!(archives > 0, "the logs were archived");
    println!(
        "{scanned} files of 3 encrypted nodes hold no plaintext of {} values",
        values.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_or_missing_key_refuses_to_start_and_changes_nothing() {
    let mut cluster = Cluster::start(&[], &[]);
    let key = cluster.dir.path().join("right.key");
    let wrong = cluster.dir.path().join("wrong.key");
    write_key(&key, 0x42);
    write_key(&wrong, 0x43);
    let key_arg = key.to_str().unwrap().to_string();
    let wrong_arg = wrong.to_str().unwrap().to_string();
    let args = [
        "--heartbeat-ms",
        "100",
        "--snapshot-logs",
        "40",
        "--keep-logs",
        "5",
        "--log-segment-bytes",
        "65536",
        "--key-file",
        &key_arg,
    ];
    cluster.add_node(1, &args);
    cluster.wait_up(&[1]).await;
    cluster.init().await;
    cluster.wait_for_leader(None, Duration::from_secs(15)).await;
    let (bases, hint) = (cluster.bases(), AtomicU64::new(1));
    let mut rng = Rng::new(0xbad_4e7);
    let mut values = Vec::new();
    for i in 0..100 {
        let v = value(&mut rng, i);
        assert!(
            put(&cluster.client, &bases, &format!("k{i}"), &v, &hint, || {
                false
            })
            .await
        );
        values.push(v);
    }
    // The last check below needs a log purged behind a snapshot: wait for
    // the purge (durable once the metrics show it) before the node goes.
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster
        .metrics(1)
        .await
        .and_then(|m| m["purged"].as_u64())
        .is_none()
    {
        assert!(Instant::now() < deadline, "node 1 never purged its log");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let node = cluster.nodes.get_mut(&1).unwrap();
    node.kill();
    let dir = node.dir.clone();
    let before = files(&dir);
    assert!(!snapshot_files(&dir).is_empty());

    let cases: [(&str, Vec<&str>, &str); 2] = [
        (
            "a wrong key",
            vec!["--key-file", &wrong_arg],
            "not the key the data was encrypted with",
        ),
        ("no key", vec![], "no key was given"),
    ];
    for (what, args, says) in cases {
        let (status, log) = run_node_to_exit(&dir, &args);
        println!("{what}: {}", log.trim());
        assert_eq!(
            status,
            Some(false),
            "{what}: the node did not refuse: {log}"
        );
        assert!(log.contains(says), "{what}: {log}");
        assert!(
            log.contains("key id 1"),
            "{what}: the key id is named: {log}"
        );
        assert!(
            log.contains("key-check"),
            "{what}: the file is named: {log}"
        );
        assert!(!log.to_lowercase().contains("corrupt"), "{what}: {log}");
        assert!(!log.contains("panicked"), "{what}: {log}");
        assert!(files(&dir) == before, "{what}: the node directory changed");
    }

    // A key for a node directory written without one.
    let plain = cluster.dir.path().join("plain");
    LogStore::open(plain.join("log"))
        .and_then(|log| {
            append(&log, vec![put_entry(1, b"plain".to_vec())]);
            log.shutdown()
        })
        .unwrap();
    let plain_before = files(&plain);
    let (status, log) = run_node_to_exit(&plain, &["--key-file", &key_arg]);
    assert_eq!(status, Some(false), "{log}");
    assert!(log.contains("not encrypted"), "{log}");
    assert!(
        files(&plain) == plain_before,
        "the plain node directory changed"
    );

    // The right key still opens everything.
    let node = cluster.nodes.get_mut(&1).unwrap();
    node.start();
    cluster.wait_up(&[1]).await;
    cluster.wait_for_leader(None, Duration::from_secs(15)).await;
    for i in [0, 50, 99] {
        assert_eq!(
            cluster
                .local_get_or_none(1, &format!("k{i}"))
                .await
                .as_deref(),
            Some(&values[i][..])
        );
    }

    // The snapshots taken away from a log purged behind them.
    let node = cluster.nodes.get_mut(&1).unwrap();
    node.kill();
    let aside = cluster.dir.path().join("aside");
    std::fs::rename(dir.join("state/snapshots"), &aside).unwrap();
    std::fs::create_dir(dir.join("state/snapshots")).unwrap();
    let (status, log) = run_node_to_exit(&dir, &["--key-file", &key_arg]);
    assert_eq!(status, Some(false), "{log}");
    assert!(log.contains("holds no snapshot"), "{log}");
    assert!(log.contains("purged through"), "{log}");
}

fn put_entry(index: u64, value: Vec<u8>) -> Entry {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(Request::Put {
            key: format!("key-{index}"),
            value,
        }),
    }
}

fn append(log: &LogStore, entries: Vec<Entry>) {
    let (done, durable) = mpsc::channel();
    log.append_entries(entries, Box::new(move |r| done.send(r).unwrap()))
        .unwrap();
    durable.recv().unwrap().unwrap();
}

fn archives(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("archive-")
        })
        .collect();
    out.sort();
    out
}

#[test]
fn sealed_log_files_refuse_damage_moves_and_the_wrong_key_naming_the_file() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let key = || StaticKey::new([7; 32]);
    let config = || {
        LogStoreConfig::new(&dir)
            .segment_bytes(64 << 10)
            .encryption(key())
    };
    let mut rng = Rng::new(11);
    let mut values = Vec::new();
    let mut old_meta = Vec::new();
    {
        let log = LogStore::open_with(config()).unwrap();
        for batch in 0..6 {
            if batch == 3 {
                old_meta = std::fs::read(dir.join("meta")).unwrap();
            }
            let entries: Vec<Entry> = (batch * 50 + 1..=batch * 50 + 50)
                .map(|i| {
                    let v = value(&mut rng, i);
                    values.push(v.clone());
                    put_entry(i, v)
                })
                .collect();
            append(&log, entries);
            log.checkpoint().unwrap();
        }
        assert_eq!(log.read_entries(..).unwrap().len(), 300);
        log.shutdown().unwrap();
    }
    assert!(archives(&dir).len() >= 2);
    assert_no_plaintext(root.path(), &values);
    let pristine = files(root.path());
    // Back to the pristine directory exactly: a log opened on damaged
    // files may have written (a new segment, a recycled one) before its
    // reads failed, and such files would not match the restored ones.
    let restore = || {
        for path in files(root.path()).into_keys() {
            if !pristine.contains_key(&path) {
                std::fs::remove_file(&path).unwrap();
            }
        }
        for (path, bytes) in &pristine {
            std::fs::write(path, bytes).unwrap();
        }
    };
    // Opens, reads every entry and shuts the log down (its threads
    // stopped before the next step looks at the files).
    let read_all = || {
        LogStore::open_with(config()).and_then(|log| {
            let read = log.read_entries(..);
            let closed = log.shutdown();
            let entries = read?;
            closed?;
            Ok(entries)
        })
    };

    // A flipped byte in a sealed entry.
    let first = archives(&dir)[0].clone();
    let mut bytes = pristine[&first].clone();
    let at = bytes.len() - 5;
    bytes[at] ^= 1;
    std::fs::write(&first, &bytes).unwrap();
    let error = read_all().unwrap_err();
    assert!(matches!(error, Error::Corrupt { .. }), "{error}");
    assert!(
        error
            .to_string()
            .contains(first.file_name().unwrap().to_str().unwrap()),
        "{error}"
    );
    restore();

    // One archive in place of another (same key, a valid file): its
    // records are bound to the other file.
    let [a, b, ..] = &archives(&dir)[..] else {
        panic!("two archives")
    };
    std::fs::write(a, &pristine[b]).unwrap();
    let error = read_all().unwrap_err();
    println!("an archive in another's place: {error}");
    assert!(matches!(error, Error::Corrupt { .. }), "{error}");
    restore();

    // The metadata file of three checkpoints ago, sealed with the same
    // key: the WAL records what the current one covers.
    std::fs::write(dir.join("meta"), &old_meta).unwrap();
    let error = read_all().unwrap_err();
    println!("an older metadata file: {error}");
    assert!(error.to_string().contains("older than the log"), "{error}");
    assert!(error.to_string().contains("meta"), "{error}");
    restore();

    // Plain metadata in a sealed log, and the wrong key.
    let plain = root.path().join("plain");
    LogStore::open_with(LogStoreConfig::new(&plain).segment_bytes(64 << 10))
        .and_then(|log| {
            append(&log, vec![put_entry(1, b"x".to_vec())]);
            log.checkpoint()?;
            log.shutdown()
        })
        .unwrap();
    std::fs::copy(plain.join("meta"), dir.join("meta")).unwrap();
    let error = read_all().unwrap_err();
    assert_eq!(error.key_error(), Some(&KeyError::NotEncrypted), "{error}");
    restore();
    let before = files(root.path());
    let error = LogStore::open_with(
        LogStoreConfig::new(&dir)
            .segment_bytes(64 << 10)
            .encryption(StaticKey::new([8; 32])),
    )
    .unwrap_err();
    assert!(error.to_string().contains("key id 1"), "{error}");
    assert!(error.to_string().contains("meta"), "{error}");
    assert!(files(root.path()) == before, "a wrong key changed the log");
    assert_eq!(read_all().unwrap().len(), 300);
}

#[test]
fn an_older_sealed_snapshot_in_place_of_the_current_one_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let config = || StateMachineConfig::new(root.path()).encryption(StaticKey::new([9; 32]));
    let snapshots = root.path().join("snapshots");
    let (old, current) = {
        let sm = StateMachine::open_with(config()).unwrap();
        sm.apply_entries(vec![put_entry(1, b"first value".to_vec())])
            .unwrap();
        let (_, old) = sm.build_snapshot_file().unwrap();
        let old_bytes = std::fs::read(&old).unwrap();
        sm.apply_entries(vec![put_entry(2, b"second value".to_vec())])
            .unwrap();
        let (_, current) = sm.build_snapshot_file().unwrap();
        assert!(!old.exists());
        sm.shutdown().unwrap();
        (old_bytes, current)
    };
    let current_bytes = std::fs::read(&current).unwrap();
    assert_eq!(&current_bytes[..8], b"SRSNAPX1");
    std::fs::write(&current, &old).unwrap();
    let error = StateMachine::open_with(config()).unwrap_err();
    println!("an older snapshot in place: {error}");
    assert!(error.to_string().contains("holds snapshot"), "{error}");
    assert!(error.to_string().contains("snapshot-"), "{error}");

    let mut damaged = current_bytes.clone();
    let at = damaged.len() - 3;
    damaged[at] ^= 0x20;
    std::fs::write(&current, &damaged).unwrap();
    let error = StateMachine::open_with(config()).unwrap_err();
    println!("a damaged snapshot: {error}");
    assert!(matches!(error, Error::Corrupt { .. }), "{error}");
    assert!(error.to_string().contains("snapshot-"), "{error}");
    std::fs::write(&current, &current_bytes).unwrap();

    let error = StateMachine::open_with(StateMachineConfig::new(root.path())).unwrap_err();
    assert_eq!(error.key_error(), Some(&KeyError::NotConfigured), "{error}");
    assert!(snapshots.join(current.file_name().unwrap()).exists());
    let sm = StateMachine::open_with(config()).unwrap();
    assert_eq!(
        sm.get("key-2").unwrap().as_deref(),
        Some(&b"second value"[..])
    );
}
