//! Snapshots and purges: the log's files shrink and stay bounded, and a
//! learner added after the log was purged catches up from a snapshot.

mod common;

use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{put, Cluster};
use openraft::{CommittedLeaderId, EntryPayload};
use sediment_raft::types::{Entry, LogId, Request};
use sediment_raft::{LogStore, LogStoreConfig};

/// Bytes in the files under `dir`; files deleted while walking are skipped.
fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    for entry in entries.flatten() {
        let Ok(meta) = entry.metadata() else {
            continue;
        };
        total += if meta.is_dir() {
            dir_bytes(&entry.path())
        } else {
            meta.len()
        };
    }
    total
}

fn put_entry(index: u64) -> Entry {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(Request::Put {
            key: format!("k{}", index % 100),
            value: vec![index as u8; 2000],
        }),
    }
}

/// A steady stream of appends with a purge behind them (as snapshots do):
/// the files stop growing once purged entries' archives are deleted.
#[test]
fn log_files_stay_bounded_under_writes_and_purges() {
    let dir = tempfile::tempdir().unwrap();
    let log =
        LogStore::open_with(LogStoreConfig::new(dir.path()).segment_bytes(256 << 10)).unwrap();
    let mut sizes = Vec::new();
    let mut index = 0;
    for round in 1..=60 {
        let (tx, rx) = mpsc::channel();
        for _ in 0..10 {
            let entries: Vec<Entry> = (index + 1..=index + 20).map(put_entry).collect();
            index += 20;
            let tx = tx.clone();
            log.append_entries(entries, Box::new(move |r| tx.send(r).unwrap()))
                .unwrap();
        }
        for _ in 0..10 {
            rx.recv().unwrap().unwrap();
        }
        // Keep the last 300 entries, as a snapshot policy would.
        if index > 300 {
            let purge_to = index - 300;
            log.purge_blocking(LogId::new(CommittedLeaderId::new(1, 1), purge_to))
                .unwrap();
        }
        if round % 10 == 0 {
            // Checkpoints run in the background and may lag behind a
            // machine under load; once they catch up, purged space is gone.
            log.checkpoint().unwrap();
            let archives: u64 = std::fs::read_dir(dir.path())
                .unwrap()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("archive-"))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum();
            // The 300 live entries (~600 KB), at most one archive shared
            // with purged ones, and nothing of the purged rest.
            assert!(archives < 1_500_000, "archives hold {archives} bytes");
            sizes.push(dir_bytes(dir.path()));
        }
    }
    let state = log.log_state();
    assert_eq!(state.last_log_id.unwrap().index, index);
    assert_eq!(log.read_entries(..).unwrap().len(), 300);
    println!("log directory after every 2000 entries of 2 KB: {sizes:?} bytes");
    // 12,000 entries of 2 KB went through (24 MB); what stays is the live
    // entries' archives and a few WAL segments (which overfill past their
    // nominal 256 KiB while a checkpoint runs).
    for size in sizes {
        assert!(size < 8 << 20, "the log directory holds {size} bytes");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn purged_log_shrinks_and_a_new_learner_catches_up_from_a_snapshot() {
    let args = [
        "--heartbeat-ms",
        "100",
        "--snapshot-logs",
        "300",
        "--keep-logs",
        "20",
        "--log-segment-bytes",
        "262144",
    ];
    let mut cluster = Cluster::start(&[1, 2, 3], &args);
    cluster.wait_up(&[1, 2, 3]).await;
    cluster.init().await;
    let leader = cluster.wait_for_leader(None, Duration::from_secs(15)).await;
    let addrs = cluster.bases();
    let hint = AtomicU64::new(leader);
    let value = |i: u64| format!("value {i} ").repeat(200).into_bytes();
    let client = cluster.client.clone();
    let (client, addrs_ref, hint_ref) = (&client, &addrs, &hint);
    let write = move |i: u64| {
        let key = format!("key-{}", i % 150);
        let bytes = value(i);
        async move { assert!(put(client, addrs_ref, &key, &bytes, hint_ref, || false).await) }
    };
    let log_dir = cluster.nodes[&leader].dir.join("log");

    // The first 280 fill several WAL segments before the first snapshot;
    // past the snapshot threshold come a snapshot, then a purge, then more
    // segments checkpointed (which deletes purged archives).
    let mut max_size = 0;
    for i in 0..1200 {
        write(i).await;
        max_size = max_size.max(dir_bytes(&log_dir));
    }
    let metrics = cluster.metrics(leader).await.unwrap();
    let purged = metrics["purged"]
        .as_u64()
        .expect("the leader purged its log");
    assert!(metrics["snapshot"].as_u64().is_some(), "{metrics}");
    // The directory's size is a sawtooth (each WAL checkpoint writes an
    // archive and deletes fully purged ones), and the last write may have
    // been at a peak: keep writing until it is below the peak seen so far.
    let mut now = dir_bytes(&log_dir);
    let mut extra = 0;
    while now >= max_size && extra < 600 {
        write(1200 + extra).await;
        extra += 1;
        now = dir_bytes(&log_dir);
    }
    println!(
        "leader log directory: at most {max_size} bytes while writing 1200 entries, {now} bytes \
         after {extra} more; purged through {purged}"
    );
    assert!(
        now < max_size,
        "the log's files never shrank below their peak of {max_size} bytes after purges, even \
         with {extra} more writes (now {now})"
    );

    // A learner that joins now cannot get the purged entries: it must be
    // sent a snapshot.
    cluster.add_node(4, &args);
    cluster.wait_up(&[4]).await;
    let response = cluster
        .client
        .post(cluster.nodes[&leader].url("/cluster/add-learner"))
        .json(&serde_json::json!({ "id": 4, "addr": cluster.nodes[&4].addr }))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let deadline = Instant::now() + Duration::from_secs(20);
    let target = cluster.metrics(leader).await.unwrap()["last_applied"].as_u64();
    loop {
        let m = cluster.metrics(4).await.unwrap();
        if m["last_applied"].as_u64() >= target {
            assert!(
                m["snapshot"].as_u64().is_some_and(|s| s >= purged),
                "the learner installed a snapshot past the purged entries: {m}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the learner did not catch up: {m}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let written = 1200 + extra;
    for i in written - 150..written {
        let key = format!("key-{}", i % 150);
        assert_eq!(
            cluster.local_get(4, &key).await.as_deref(),
            Some(&value(i)[..]),
            "{key} on the learner"
        );
    }
}
