//! A node never panics on what it finds in its own directory. A vote or
//! entry of a term no leader can reach (`u64::MAX`: openraft's
//! `term + 1` would overflow), written with the crate's own log store,
//! stops the node process at start with an error naming it; entries whose
//! bytes do not decode, are too large to decode or hold commands the
//! client API refuses are errors from `LogStore::read_entries` and
//! `StateMachine::apply_entries`; and a node whose committed log holds
//! such a command starts without panicking.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{free_port, run_node_to_exit};
use okaywal::LogVoid;
use openraft::{CommittedLeaderId, EntryPayload, Membership};
use sediment_raft::log_format::encode_entry_header;
use sediment_raft::types::{Entry, LogId, Node, Request, Vote};
use sediment_raft::validate::MAX_ENTRY_BYTES;
use sediment_raft::{LogStore, StateMachine};

fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn entry(log_id: LogId, request: Request) -> Entry {
    Entry {
        log_id,
        payload: EntryPayload::Normal(request),
    }
}

fn append(store: &LogStore, entries: Vec<Entry>) {
    let (done, durable) = std::sync::mpsc::channel();
    store
        .append_entries(
            entries,
            Box::new(move |result| {
                let _ = done.send(result.is_ok());
            }),
        )
        .unwrap();
    assert!(durable.recv().unwrap(), "the append was made durable");
}

fn assert_refused_at_start(dir: &Path, what: &str) {
    let (status, log) = run_node_to_exit(dir, &[]);
    println!("{what}: {}", log.trim());
    assert_eq!(status, Some(false), "{what}: the node did not stop: {log}");
    assert!(!log.contains("panicked"), "{what}: {log}");
    assert!(
        log.contains(&u64::MAX.to_string()) && log.contains("term"),
        "{what}: the error names the term: {log}"
    );
}

#[test]
fn a_stored_vote_of_an_impossible_term_stops_the_start_with_an_error() {
    let root = tempfile::tempdir().unwrap();
    // In a WAL record.
    let dir = root.path().join("in-wal");
    let store = LogStore::open(dir.join("log")).unwrap();
    store
        .save_vote_blocking(Vote::new_committed(u64::MAX, 2))
        .unwrap();
    store.shutdown().unwrap();
    drop(store);
    assert_refused_at_start(&dir, "a vote in the WAL");

    // In the metadata written at a checkpoint.
    let dir = root.path().join("in-meta");
    let store = LogStore::open(dir.join("log")).unwrap();
    store.save_vote_blocking(Vote::new(u64::MAX, 2)).unwrap();
    store.checkpoint().unwrap();
    store.shutdown().unwrap();
    drop(store);
    assert!(dir.join("log/meta").exists());
    assert_refused_at_start(&dir, "a vote in the metadata");
}

#[test]
fn a_stored_entry_of_an_impossible_term_stops_the_start_with_an_error() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("node");
    let store = LogStore::open(dir.join("log")).unwrap();
    append(
        &store,
        vec![entry(
            log_id(u64::MAX, 0),
            Request::Delete { key: "k".into() },
        )],
    );
    store.shutdown().unwrap();
    drop(store);
    assert_refused_at_start(&dir, "an entry in the WAL");

    // The same entry moved to an archive file by a checkpoint.
    let dir = root.path().join("archived");
    let store = LogStore::open(dir.join("log")).unwrap();
    append(
        &store,
        vec![entry(
            log_id(u64::MAX, 0),
            Request::Delete { key: "k".into() },
        )],
    );
    store.checkpoint().unwrap();
    store.shutdown().unwrap();
    drop(store);
    assert_refused_at_start(&dir, "an entry in an archive");
}

#[test]
fn entries_that_do_not_decode_or_break_the_rules_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    // Entry 1: a chunk whose payload is not an entry at all, written to the
    // WAL behind the store's back.
    std::fs::create_dir_all(&log).unwrap();
    let wal = okaywal::Configuration::default_for(log.join("wal"))
        .open(LogVoid)
        .unwrap();
    let mut chunk = Vec::new();
    encode_entry_header(&mut chunk, &log_id(1, 1));
    chunk.extend_from_slice(&[0xff; 40]);
    let mut writer = wal.begin_entry().unwrap();
    writer.write_chunk(&chunk).unwrap();
    writer.commit().unwrap();
    wal.shutdown().unwrap();
    drop(wal);

    let store = LogStore::open(&log).unwrap();
    let empty_key = entry(
        log_id(1, 2),
        Request::Put {
            key: String::new(),
            value: b"v".to_vec(),
        },
    );
    let long_key = entry(
        log_id(1, 3),
        Request::Put {
            key: "k".repeat(100 << 10),
            value: b"v".to_vec(),
        },
    );
    let too_large = entry(
        log_id(1, 4),
        Request::Put {
            key: "large".into(),
            value: vec![1; MAX_ENTRY_BYTES as usize],
        },
    );
    append(&store, vec![empty_key, long_key, too_large]);
    store.shutdown().unwrap();
    drop(store);

    let store = LogStore::open(&log).unwrap();
    let error = store.read_entries(1..=1).unwrap_err().to_string();
    assert!(error.contains("log entry 1"), "{error}");
    let read = store.read_entries(2..=3).unwrap();
    assert_eq!(read.len(), 2);
    let error = store.read_entries(4..=4).unwrap_err().to_string();
    assert!(error.contains("log entry 4"), "{error}");
    assert!(store.read_entries(1..).is_err());

    let sm = StateMachine::open(dir.path().join("state")).unwrap();
    for entry in read {
        let index = entry.log_id.index;
        let error = sm.apply_entries(vec![entry]).unwrap_err().to_string();
        assert!(error.contains("key"), "entry {index}: {error}");
    }
    assert_eq!(sm.applied().0, None, "nothing was applied");
    assert!(sm.is_empty());
    store.shutdown().unwrap();
    sm.shutdown().unwrap();
}

#[test]
fn a_committed_command_the_api_refuses_does_not_make_the_node_panic() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("node");
    let store = LogStore::open(dir.join("log")).unwrap();
    let port = free_port();
    let membership = Membership::new(
        vec![[1].into_iter().collect()],
        [(1, Node::new(format!("127.0.0.1:{port}")))]
            .into_iter()
            .collect::<std::collections::BTreeMap<_, _>>(),
    );
    append(
        &store,
        vec![
            Entry {
                log_id: LogId::default(),
                payload: EntryPayload::Membership(membership),
            },
            entry(
                log_id(1, 1),
                Request::Put {
                    key: String::new(),
                    value: b"v".to_vec(),
                },
            ),
        ],
    );
    store.save_vote_blocking(Vote::new_committed(1, 1)).unwrap();
    store.save_committed_blocking(Some(log_id(1, 1))).unwrap();
    store.shutdown().unwrap();
    drop(store);

    // The node either stops with an error or keeps running without
    // applying the entry; it never panics.
    let log = dir.with_extension("log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_sediment-raft"))
        .args(["node", "--id", "1", "--heartbeat-ms", "50", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--dir")
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let exited = child.try_wait().unwrap();
    if exited.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let printed = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!printed.contains("panicked"), "{printed}");
    if let Some(status) = exited {
        assert!(!status.success(), "{printed}");
    }
    let sm = StateMachine::open(dir.join("state")).unwrap();
    assert!(sm.is_empty(), "the empty key was not applied");
    assert_ne!(sm.applied().0, Some(log_id(1, 1)));
    sm.shutdown().unwrap();
}
