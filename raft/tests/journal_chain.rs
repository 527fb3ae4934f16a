//! The state machine's journal when applies carry many changes each (a
//! leader gathers concurrent client writes into one entry): the chain of
//! journal records a restart replays stays within about half the map, its
//! old records are archived, and a restart finds every key.

use openraft::{CommittedLeaderId, EntryPayload};
use sediment_raft::journal::{replay_cost, Journal};
use sediment_raft::types::{Change, Entry, LogId, Request};
use sediment_raft::StateMachine;

fn log_id(index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(1, 1), index)
}

fn batch(index: u64, changes: Vec<Change>) -> Entry {
    Entry {
        log_id: log_id(index),
        payload: EntryPayload::Normal(Request::Batch(changes)),
    }
}

fn put(key: String) -> Change {
    let value = format!("value of {key}").into_bytes();
    Change::Put { key, value }
}

/// The journal chain as stored: (records, replay cost of the records after
/// the full record that starts it).
fn stored_chain(sm: &StateMachine) -> (usize, usize) {
    let db = sm.database();
    let mut records = Vec::new();
    let mut next = db.embedded_header();
    while let Some(id) = next {
        let bytes = db.get(id).unwrap().expect("a journal grain is live");
        let record = Journal::decode(&bytes).unwrap();
        next = record
            .prev
            .map(|prev| sediment::GrainId::from_u64(prev).unwrap());
        records.push(record);
    }
    let after_full: usize = records
        .iter()
        .rev()
        .skip(1)
        .map(|r| replay_cost(r.changes.len()))
        .sum();
    (records.len(), after_full)
}

#[test]
fn applies_of_many_new_keys_keep_the_journal_chain_within_half_the_map() {
    const PER_APPLY: usize = 8;
    let dir = tempfile::tempdir().unwrap();
    let sm = StateMachine::open(dir.path()).unwrap();
    let mut keys = 0usize;
    let mut longest = 0usize;
    for index in 1..=1_500u64 {
        let mut changes: Vec<Change> = (0..PER_APPLY)
            .map(|i| put(format!("k{index}-{i}")))
            .collect();
        // Now and then, also a delete and a rewrite of older keys.
        if index % 10 == 0 {
            changes.push(Change::Delete {
                key: format!("k{}-0", index - 5),
            });
            changes.push(put(format!("k{}-1", index - 5)));
            keys -= 1;
        }
        keys += PER_APPLY;
        sm.apply_entries(vec![batch(index, changes)]).unwrap();
        assert_eq!(sm.len(), keys);
        let (records, cost) = stored_chain(&sm);
        longest = longest.max(records);
        let bound = 64.max(keys / 2) + replay_cost(PER_APPLY + 2);
        assert!(
            cost <= bound,
            "apply {index}: the chain replays {cost} (records {records}) for {keys} keys"
        );
    }
    assert!(
        longest < 1_500 / 2,
        "the chain grew to {longest} records in 1,500 applies"
    );
    sm.shutdown().unwrap();

    let sm = StateMachine::open(dir.path()).unwrap();
    assert_eq!(sm.len(), keys);
    assert_eq!(sm.applied().0, Some(log_id(1_500)));
    assert_eq!(sm.get("k5-0").unwrap(), None, "deleted");
    assert_eq!(
        sm.get("k1500-7").unwrap().as_deref(),
        Some(&b"value of k1500-7"[..])
    );
    assert_eq!(
        sm.get("k995-1").unwrap().as_deref(),
        Some(&b"value of k995-1"[..])
    );
    // The next apply after the restart follows the chain as stored.
    sm.apply_entries(vec![batch(1_501, vec![put("after".into())])])
        .unwrap();
    let (_, cost) = stored_chain(&sm);
    assert!(cost <= 64.max(keys / 2) + replay_cost(1), "{cost}");
    sm.shutdown().unwrap();
    let sm = StateMachine::open(dir.path()).unwrap();
    assert_eq!(sm.len(), keys + 1);
    sm.shutdown().unwrap();
}

#[test]
fn applies_rewriting_the_same_keys_start_new_chains_too() {
    let dir = tempfile::tempdir().unwrap();
    let sm = StateMachine::open(dir.path()).unwrap();
    for index in 1..=600u64 {
        let changes = (0..4).map(|i| put(format!("hot-{}", (index as usize + i) % 16)));
        sm.apply_entries(vec![batch(index, changes.collect())])
            .unwrap();
        let (records, cost) = stored_chain(&sm);
        assert!(
            cost <= 64 + replay_cost(4),
            "apply {index}: {records} records replay {cost} for 16 keys"
        );
    }
    sm.shutdown().unwrap();
    let sm = StateMachine::open(dir.path()).unwrap();
    assert_eq!(sm.len(), 16);
    assert_eq!(sm.applied().0, Some(log_id(600)));
    sm.shutdown().unwrap();
}

/// A store whose journal chain grew long under the rule older versions
/// followed (a full record only once the chain held half as many records
/// as the map held keys): it opens with every key, and its next apply
/// starts a new chain instead of extending the old one.
#[test]
fn a_long_chain_written_by_an_older_version_is_replaced_by_the_next_apply() {
    const RECORDS: u64 = 300;
    let dir = tempfile::tempdir().unwrap();
    {
        let db = sediment::Config::for_directory(dir.path().join("data"))
            .open()
            .unwrap();
        let mut prev = None;
        for index in 1..=RECORDS {
            let mut tx = db.begin_transaction().unwrap();
            let mut changes = Vec::new();
            for i in 0..8 {
                let key = format!("old{index}-{i}");
                let id = tx.write(format!("value of {key}").as_bytes()).unwrap();
                changes.push((key, Some(id.as_u64())));
            }
            let record = Journal {
                prev,
                last_applied: Some(log_id(index)),
                membership: Default::default(),
                changes,
            };
            let journal = tx.write(&record.encode()).unwrap();
            tx.set_embedded_header(Some(journal)).unwrap();
            tx.commit().unwrap();
            prev = Some(journal.as_u64());
        }
        db.shutdown().unwrap();
    }
    let sm = StateMachine::open(dir.path()).unwrap();
    let keys = RECORDS as usize * 8;
    assert_eq!(sm.len(), keys);
    assert_eq!(sm.applied().0, Some(log_id(RECORDS)));
    assert_eq!(stored_chain(&sm).0, RECORDS as usize);
    sm.apply_entries(vec![batch(RECORDS + 1, vec![put("new".into())])])
        .unwrap();
    assert_eq!(
        stored_chain(&sm),
        (1, 0),
        "the next apply wrote a full record"
    );
    sm.shutdown().unwrap();

    let sm = StateMachine::open(dir.path()).unwrap();
    assert_eq!(sm.len(), keys + 1);
    assert_eq!(
        sm.get("old1-0").unwrap().as_deref(),
        Some(&b"value of old1-0"[..])
    );
    assert_eq!(
        sm.get("new").unwrap().as_deref(),
        Some(&b"value of new"[..])
    );
    sm.shutdown().unwrap();
}
