//! The log store's side of pre-staging (`FORMAT.md`, "Pre-staged
//! entries"), on the crash-simulating file system: entries staged from a
//! leader's request are ordinary log entries that openraft does not know
//! of yet; an identical append over them writes and syncs nothing, a
//! conflicting one replaces them, requests that do not extend the log
//! under the node's leader change nothing, and a snapshot's purge drops
//! the staged entries it replaced.

use std::sync::atomic::AtomicU64;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use okaywal::fs::{CrashFileSystem, Operation, PowerLoss};
use openraft::{CommittedLeaderId, EntryPayload};
use sediment_raft::log_store::{log_ids, StageOutcome};
use sediment_raft::metrics::StageCounters;
use sediment_raft::types::{Entry, LogId, Request, Vote};
use sediment_raft::{LogStore, LogStoreConfig};

/// This node.
const OWN: u64 = 1;
/// The leader of term 1.
const LEADER: u64 = 2;
/// The leader of term 2.
const NEXT_LEADER: u64 = 3;

fn log_id(term: u64, node: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, node), index)
}

fn put(term: u64, node: u64, index: u64, tag: &str) -> Entry {
    Entry {
        log_id: log_id(term, node, index),
        payload: EntryPayload::Normal(Request::Put {
            key: format!("key-{index}"),
            value: format!("{tag} {index} of term {term}").into_bytes(),
        }),
    }
}

fn open(fs: &CrashFileSystem) -> LogStore {
    LogStore::open_with(LogStoreConfig::new("/log").file_system(Arc::new(fs.clone()))).unwrap()
}

/// Appends as openraft does and waits for the durable callback.
fn append_durably(log: &LogStore, entries: Vec<Entry>) {
    let (tx, rx) = mpsc::channel();
    log.append_entries(entries, Box::new(move |r| tx.send(r).unwrap()))
        .unwrap();
    rx.recv_timeout(Duration::from_secs(10))
        .expect("the callback fired")
        .expect("the append is durable");
}

/// A follower's log: entries 0..=3 of term 1 from `LEADER`, whose
/// committed vote it holds.
fn follower(fs: &CrashFileSystem) -> LogStore {
    let log = open(fs);
    log.save_vote_blocking(Vote::new_committed(1, LEADER))
        .unwrap();
    append_durably(&log, (0..=3).map(|i| put(1, LEADER, i, "a")).collect());
    log
}

fn ids(log: &LogStore) -> Vec<LogId> {
    log_ids(&log.read_entries(..).unwrap())
}

fn get(counter: &AtomicU64) -> u64 {
    StageCounters::get(counter)
}

/// Waits until the log's sync thread has synced more than `syncs` times
/// (staged entries are synced in the background).
fn wait_for_sync_after(log: &LogStore, syncs: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while log.sync_latencies().count() <= syncs {
        assert!(Instant::now() < deadline, "the staged entries were synced");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Stages `entries` after `prev` under `LEADER`'s vote of term 1 and
/// waits until they are durable.
fn stage_durably(log: &LogStore, prev: LogId, entries: &[Entry]) {
    let syncs = log.sync_latencies().count();
    let outcome = log
        .stage_entries(OWN, &Vote::new_committed(1, LEADER), Some(prev), entries)
        .unwrap();
    assert_eq!(outcome, StageOutcome::Staged(entries.len()));
    wait_for_sync_after(log, syncs);
}

/// A power cut that keeps only what was synced, then a reopen.
fn cut_and_reopen(log: LogStore, fs: &CrashFileSystem) -> LogStore {
    fs.power_loss(PowerLoss::Clean);
    drop(log);
    open(fs)
}

#[test]
fn an_identical_append_over_staged_entries_writes_and_syncs_nothing() {
    let fs = CrashFileSystem::new();
    let log = follower(&fs);
    let staged: Vec<Entry> = (4..=5).map(|i| put(1, LEADER, i, "a")).collect();
    stage_durably(&log, log_id(1, LEADER, 3), &staged);
    // The staged entries are in the log already.
    assert_eq!(
        log.log_state().last_log_id,
        Some(log_id(1, LEADER, 5)),
        "staged entries are part of the log"
    );

    let (writes, syncs) = (
        fs.operation_count(Operation::Write),
        fs.operation_count(Operation::Sync),
    );
    let (tx, rx) = mpsc::channel();
    log.append_entries(staged.clone(), Box::new(move |r| tx.send(r).unwrap()))
        .unwrap();
    rx.recv_timeout(Duration::from_secs(10))
        .expect("the callback fired")
        .expect("the staged entries are durable");
    assert_eq!(
        fs.operation_count(Operation::Write),
        writes,
        "the append wrote nothing"
    );
    assert_eq!(
        fs.operation_count(Operation::Sync),
        syncs,
        "the append synced nothing"
    );
    let counters = log.stage_counters();
    assert_eq!(get(&counters.used), 2);
    assert_eq!(get(&counters.wasted), 0);
    assert_eq!(get(&counters.appends_prestaged), 1);

    // The next append goes on from there as usual, and everything comes
    // back after a power cut.
    append_durably(&log, vec![put(1, LEADER, 6, "a")]);
    let log = cut_and_reopen(log, &fs);
    assert_eq!(
        ids(&log),
        (0..=6).map(|i| log_id(1, LEADER, i)).collect::<Vec<_>>()
    );
    assert_eq!(log.read_entries(4..=5).unwrap(), staged);
}

#[test]
fn an_append_waits_for_the_sync_of_the_staged_write() {
    // Every sync takes a while: the append comes while the staged
    // entries' sync may still run, and its callback must wait for it.
    let fs = CrashFileSystem::new();
    let log = follower(&fs);
    fs.jitter(7, Duration::from_millis(5));
    let staged: Vec<Entry> = (4..=5).map(|i| put(1, LEADER, i, "a")).collect();
    let outcome = log
        .stage_entries(
            OWN,
            &Vote::new_committed(1, LEADER),
            Some(log_id(1, LEADER, 3)),
            &staged,
        )
        .unwrap();
    assert_eq!(outcome, StageOutcome::Staged(2));
    let (tx, rx) = mpsc::channel();
    log.append_entries(staged, Box::new(move |r| tx.send(r).unwrap()))
        .unwrap();
    rx.recv_timeout(Duration::from_secs(10))
        .expect("the callback fired")
        .expect("the staged entries are durable");
    fs.jitter(0, Duration::ZERO);
    // The callback fired, so a power cut now keeps them.
    let log = cut_and_reopen(log, &fs);
    assert_eq!(log.log_state().last_log_id, Some(log_id(1, LEADER, 5)));
}

#[test]
fn a_conflicting_append_replaces_staged_entries_and_a_reopen_reads_the_new_log() {
    let fs = CrashFileSystem::new();
    let log = follower(&fs);
    let staged: Vec<Entry> = (4..=6).map(|i| put(1, LEADER, i, "a")).collect();
    stage_durably(&log, log_id(1, LEADER, 3), &staged);

    // A new leader of term 2, whose log has entry 4 of term 1 but not 5
    // and 6, appends its own from 5 on.
    log.save_vote_blocking(Vote::new_committed(2, NEXT_LEADER))
        .unwrap();
    let mut appended = vec![put(1, LEADER, 4, "a")];
    appended.extend((5..=6).map(|i| put(2, NEXT_LEADER, i, "b")));
    append_durably(&log, appended.clone());
    let expected: Vec<LogId> = (0..=4)
        .map(|i| log_id(1, LEADER, i))
        .chain((5..=6).map(|i| log_id(2, NEXT_LEADER, i)))
        .collect();
    assert_eq!(ids(&log), expected);
    let counters = log.stage_counters();
    assert_eq!(get(&counters.used), 1, "entry 4 was found staged");
    assert_eq!(get(&counters.wasted), 2, "entries 5 and 6 were replaced");
    assert_eq!(get(&counters.appends_prestaged), 0);

    let log = cut_and_reopen(log, &fs);
    assert_eq!(ids(&log), expected);
    assert_eq!(log.read_entries(4..).unwrap(), appended);
    // And once more after the WAL moved everything into archive files.
    log.checkpoint().unwrap();
    let log = cut_and_reopen(log, &fs);
    assert_eq!(log.read_entries(4..).unwrap(), appended);
}

#[test]
fn an_entry_with_the_staged_log_id_but_other_bytes_replaces_it() {
    let fs = CrashFileSystem::new();
    let log = follower(&fs);
    let forged = put(1, LEADER, 4, "forged");
    stage_durably(&log, log_id(1, LEADER, 3), std::slice::from_ref(&forged));
    let real = put(1, LEADER, 4, "real");
    assert_eq!(real.log_id, forged.log_id);
    append_durably(&log, vec![real.clone()]);
    assert_eq!(log.read_entries(4..).unwrap(), vec![real.clone()]);
    assert_eq!(get(&log.stage_counters().wasted), 1);
    let log = cut_and_reopen(log, &fs);
    assert_eq!(log.read_entries(4..).unwrap(), vec![real]);
}

#[test]
fn stage_requests_that_do_not_extend_the_log_under_its_leader_change_nothing() {
    let fs = CrashFileSystem::new();
    let log = follower(&fs);
    let before = ids(&log);
    let vote = Vote::new_committed(1, LEADER);
    let prev = Some(log_id(1, LEADER, 3));
    let next = vec![put(1, LEADER, 4, "x")];
    let cases: Vec<(&str, Vote, Option<LogId>, Vec<Entry>)> = vec![
        (
            "a later term's vote",
            Vote::new_committed(2, LEADER),
            prev,
            vec![put(2, LEADER, 4, "x")],
        ),
        (
            "an earlier term's vote",
            Vote::new_committed(0, LEADER),
            prev,
            next.clone(),
        ),
        (
            "another node's vote",
            Vote::new_committed(1, NEXT_LEADER),
            prev,
            vec![put(1, NEXT_LEADER, 4, "x")],
        ),
        (
            "the vote, not committed",
            Vote::new(1, LEADER),
            prev,
            next.clone(),
        ),
        (
            "this node's own vote",
            Vote::new_committed(1, OWN),
            prev,
            vec![put(1, OWN, 4, "x")],
        ),
        (
            "a gap after the log",
            vote,
            Some(log_id(1, LEADER, 4)),
            vec![put(1, LEADER, 5, "x")],
        ),
        (
            "a prev of another term at the log's end",
            vote,
            Some(log_id(0, LEADER, 3)),
            next.clone(),
        ),
        (
            "a prev inside the log",
            vote,
            Some(log_id(1, LEADER, 2)),
            vec![put(1, LEADER, 3, "x")],
        ),
        ("no prev", vote, None, vec![put(1, LEADER, 0, "x")]),
        (
            "entries that skip an index",
            vote,
            prev,
            vec![put(1, LEADER, 5, "x")],
        ),
        (
            "entries of another leader",
            vote,
            prev,
            vec![put(1, NEXT_LEADER, 4, "x")],
        ),
        ("no entries", vote, prev, Vec::new()),
    ];
    let writes = fs.operation_count(Operation::Write);
    for (what, vote, prev, entries) in cases {
        let outcome = log.stage_entries(OWN, &vote, prev, &entries).unwrap();
        assert!(
            matches!(outcome, StageOutcome::Ignored(_)),
            "{what}: {outcome:?}"
        );
        let tried = log.try_stage_entries(OWN, &vote, prev, &entries);
        assert!(
            matches!(tried, Some(Ok(StageOutcome::Ignored(_)))),
            "{what}: {tried:?}"
        );
        assert_eq!(ids(&log), before, "{what}: the log changed");
    }
    assert_eq!(
        fs.operation_count(Operation::Write),
        writes,
        "an ignored request wrote something"
    );
    // After all that, the leader's own request is staged.
    assert_eq!(
        log.stage_entries(OWN, &vote, prev, &next).unwrap(),
        StageOutcome::Staged(1)
    );
    // And the same again is ignored: the log no longer ends at `prev`.
    assert!(matches!(
        log.stage_entries(OWN, &vote, prev, &next).unwrap(),
        StageOutcome::Ignored(_)
    ));
    let log = cut_and_reopen(log, &fs);
    let vote_after = log.vote();
    assert_eq!(vote_after, Some(vote), "the vote did not change");
}

#[test]
fn staged_entries_are_part_of_the_log_after_a_restart() {
    let fs = CrashFileSystem::new();
    let log = follower(&fs);
    stage_durably(
        &log,
        log_id(1, LEADER, 3),
        &[put(1, LEADER, 4, "a"), put(1, LEADER, 5, "a")],
    );
    let log = cut_and_reopen(log, &fs);
    assert_eq!(log.log_state().last_log_id, Some(log_id(1, LEADER, 5)));
    // openraft now knows them: an append after them is an ordinary one.
    append_durably(&log, vec![put(1, LEADER, 6, "a")]);
    assert_eq!(
        ids(&log),
        (0..=6).map(|i| log_id(1, LEADER, i)).collect::<Vec<_>>()
    );
    // Nothing is staged any more: the next stage request goes on from 6.
    assert_eq!(
        log.stage_entries(
            OWN,
            &Vote::new_committed(1, LEADER),
            Some(log_id(1, LEADER, 6)),
            &[put(1, LEADER, 7, "a")]
        )
        .unwrap(),
        StageOutcome::Staged(1)
    );
}

#[test]
fn a_snapshot_purge_drops_the_staged_entries_it_replaced() {
    let fs = CrashFileSystem::new();
    let log = follower(&fs);
    let staged: Vec<Entry> = (4..=8).map(|i| put(1, LEADER, i, "a")).collect();
    stage_durably(&log, log_id(1, LEADER, 3), &staged);
    // A snapshot of term 2 up to index 6 arrives (its leader replaced
    // entries 4 to 6): its purge drops everything staged, 7 and 8 too.
    log.save_vote_blocking(Vote::new_committed(2, NEXT_LEADER))
        .unwrap();
    let snapshot = log_id(2, NEXT_LEADER, 6);
    log.purge_blocking(snapshot).unwrap();
    let state = log.log_state();
    assert_eq!(state.last_purged_log_id, Some(snapshot));
    assert_eq!(state.last_log_id, Some(snapshot));
    assert!(ids(&log).is_empty());
    assert_eq!(get(&log.stage_counters().wasted), 5);
    let log = cut_and_reopen(log, &fs);
    let state = log.log_state();
    assert_eq!(state.last_log_id, Some(snapshot));
    assert!(ids(&log).is_empty());
    // openraft appends after the snapshot as usual.
    append_durably(&log, vec![put(2, NEXT_LEADER, 7, "b")]);
    assert_eq!(ids(&log), vec![log_id(2, NEXT_LEADER, 7)]);
}

#[test]
fn a_snapshot_purge_keeps_the_staged_entries_that_follow_it() {
    let fs = CrashFileSystem::new();
    let log = follower(&fs);
    let staged: Vec<Entry> = (4..=8).map(|i| put(1, LEADER, i, "a")).collect();
    stage_durably(&log, log_id(1, LEADER, 3), &staged);
    // A snapshot up to entry 6 as staged: 7 and 8 still follow it.
    let snapshot = log_id(1, LEADER, 6);
    log.purge_blocking(snapshot).unwrap();
    assert_eq!(ids(&log), vec![log_id(1, LEADER, 7), log_id(1, LEADER, 8)]);
    // openraft appends them after the snapshot: found staged.
    append_durably(&log, staged[3..].to_vec());
    assert_eq!(get(&log.stage_counters().used), 2);
    let log = cut_and_reopen(log, &fs);
    assert_eq!(log.log_state().last_purged_log_id, Some(snapshot));
    assert_eq!(ids(&log), vec![log_id(1, LEADER, 7), log_id(1, LEADER, 8)]);
}

#[test]
fn truncating_drops_staged_entries() {
    let fs = CrashFileSystem::new();
    let log = follower(&fs);
    stage_durably(
        &log,
        log_id(1, LEADER, 3),
        &[put(1, LEADER, 4, "a"), put(1, LEADER, 5, "a")],
    );
    log.truncate_blocking(3).unwrap();
    assert_eq!(
        ids(&log),
        (0..=2).map(|i| log_id(1, LEADER, i)).collect::<Vec<_>>()
    );
    assert_eq!(get(&log.stage_counters().wasted), 2);
    let log = cut_and_reopen(log, &fs);
    assert_eq!(log.log_state().last_log_id, Some(log_id(1, LEADER, 2)));
}

#[test]
fn an_append_that_skips_over_staged_entries_is_refused() {
    // openraft only moves past entries it did not append by installing a
    // snapshot, and purges up to it before it appends: an append after
    // staged entries it never saw is an error, not a guess.
    let fs = CrashFileSystem::new();
    let log = follower(&fs);
    stage_durably(&log, log_id(1, LEADER, 3), &[put(1, LEADER, 4, "a")]);
    let (tx, _rx) = mpsc::channel();
    let result = log.append_entries(
        vec![put(1, LEADER, 6, "a")],
        Box::new(move |r| tx.send(r).unwrap()),
    );
    assert!(result.is_err());
    assert_eq!(log.log_state().last_log_id, Some(log_id(1, LEADER, 4)));
}

#[test]
fn a_restarted_leader_reads_its_own_vote_as_not_committed() {
    // openraft 0.9 resumes leading at once when it reads a committed vote
    // naming its node; a leader that lost entries it had staged on
    // followers would then reuse their log ids.
    let fs = CrashFileSystem::new();
    let config = || LogStoreConfig::new("/log").file_system(Arc::new(fs.clone()));
    let log = LogStore::open_with(config().node_id(OWN)).unwrap();
    log.save_vote_blocking(Vote::new_committed(3, OWN)).unwrap();
    assert_eq!(log.vote(), Some(Vote::new_committed(3, OWN)));
    assert_eq!(log.vote_at_start(), Some(Vote::new(3, OWN)));
    // Another node's committed vote is read as it is.
    log.save_vote_blocking(Vote::new_committed(4, LEADER))
        .unwrap();
    assert_eq!(log.vote_at_start(), Some(Vote::new_committed(4, LEADER)));
    drop(log);
    // A store that does not know its node reads every vote as saved.
    let log = LogStore::open_with(config()).unwrap();
    log.save_vote_blocking(Vote::new_committed(5, OWN)).unwrap();
    assert_eq!(log.vote_at_start(), Some(Vote::new_committed(5, OWN)));
}

/// Records what the store offers for staging.
#[derive(Debug, Default)]
struct Offers(parking_lot::Mutex<Vec<(Option<LogId>, Vec<LogId>)>>);

impl sediment_raft::log_store::StageOffer for Offers {
    fn node_id(&self) -> u64 {
        OWN
    }

    fn offer(&self, _vote: &Vote, prev: Option<LogId>, entries: &[Entry]) -> bool {
        self.0.lock().push((prev, log_ids(entries)));
        true
    }
}

/// A leader offers an append for staging while the entry before it is
/// committed, and not while an earlier entry still waits for its commit:
/// then the followers' syncs are shared by the entries in flight anyway.
#[test]
fn a_leader_stages_appends_only_behind_a_committed_entry() {
    let fs = CrashFileSystem::new();
    let log = LogStore::open_with(
        LogStoreConfig::new("/log")
            .file_system(Arc::new(fs.clone()))
            .node_id(OWN),
    )
    .unwrap();
    let offers = Arc::new(Offers::default());
    log.set_stage_offer(offers.clone());
    log.save_vote_blocking(Vote::new_committed(1, OWN)).unwrap();
    let offered = || offers.0.lock().clone();

    // The log is empty: nothing waits for a commit.
    append_durably(&log, vec![put(1, OWN, 0, "a")]);
    assert_eq!(offered(), vec![(None, vec![log_id(1, OWN, 0)])]);

    // Entry 0 is not committed yet: entries 1 and 2 are not offered.
    append_durably(&log, vec![put(1, OWN, 1, "a")]);
    append_durably(&log, vec![put(1, OWN, 2, "a")]);
    assert_eq!(offered().len(), 1);

    // Committed up to 1 only: entry 3 follows the uncommitted 2.
    log.save_committed_blocking(Some(log_id(1, OWN, 1)))
        .unwrap();
    append_durably(&log, vec![put(1, OWN, 3, "a")]);
    assert_eq!(offered().len(), 1);

    // Everything before it committed: entries 4 and 5 are offered as one.
    log.save_committed_blocking(Some(log_id(1, OWN, 3)))
        .unwrap();
    append_durably(&log, vec![put(1, OWN, 4, "a"), put(1, OWN, 5, "a")]);
    assert_eq!(
        offered()[1],
        (
            Some(log_id(1, OWN, 3)),
            vec![log_id(1, OWN, 4), log_id(1, OWN, 5)]
        )
    );
    assert_eq!(ids(&log).len(), 6);
}

/// Takes every offer, as a stager with followers to send to does.
#[derive(Debug, Default)]
struct Sending;

impl sediment_raft::log_store::StageOffer for Sending {
    fn node_id(&self) -> u64 {
        OWN
    }

    fn offer(&self, _vote: &Vote, _prev: Option<LogId>, _entries: &[Entry]) -> bool {
        true
    }
}

/// Appends `entries` and returns the name of the thread its durable
/// callback ran on.
fn thread_of_durable_callback(log: &LogStore, entries: Vec<Entry>) -> String {
    let (tx, rx) = mpsc::channel();
    log.append_entries(
        entries,
        Box::new(move |r| {
            r.unwrap();
            let name = std::thread::current().name().unwrap_or("").to_string();
            tx.send(name).unwrap();
        }),
    )
    .unwrap();
    rx.recv_timeout(Duration::from_secs(10))
        .expect("the callback fired")
}

/// On a single-threaded runtime, an append just offered to followers is
/// synced by the log's sync thread, so that the runtime's one thread can
/// send the stage requests meanwhile; an append not offered (here a
/// follower's, or a leader's while an entry waits for its commit) is
/// synced in place, on the calling thread, as on any other thread.
#[test]
fn offered_appends_leave_the_sync_to_the_sync_thread_on_a_single_threaded_runtime() {
    let leader = |fs: &CrashFileSystem| {
        let log = LogStore::open_with(
            LogStoreConfig::new("/log")
                .file_system(Arc::new(fs.clone()))
                .node_id(OWN),
        )
        .unwrap();
        log.set_stage_offer(Arc::new(Sending));
        log.save_vote_blocking(Vote::new_committed(1, OWN)).unwrap();
        log
    };
    let here = std::thread::current().name().unwrap_or("").to_string();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();

    let fs = CrashFileSystem::new();
    let log = leader(&fs);
    runtime.block_on(async {
        // Offered: the sync thread syncs it.
        let first = thread_of_durable_callback(&log, vec![put(1, OWN, 0, "a")]);
        assert_eq!(first, "raft-log-sync");
        // Entry 0 waits for its commit: not offered, synced in place.
        let second = thread_of_durable_callback(&log, vec![put(1, OWN, 1, "a")]);
        assert_eq!(second, here);
    });

    // Outside a single-threaded runtime an offered append syncs in place.
    let fs = CrashFileSystem::new();
    let log = leader(&fs);
    let first = thread_of_durable_callback(&log, vec![put(1, OWN, 0, "a")]);
    assert_eq!(first, here);
}
