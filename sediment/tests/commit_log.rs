//! The commit log lists exactly what each committed transaction did, in
//! sequence order; it survives reopening and is trimmed by `checkpoint_to`,
//! in memory and on disk.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{blob, file_len, files_with_prefix, open_small_wal, seed, Rng};
use sediment::format::grain_crc;
use sediment::{CommitRecord, Database, GrainId, NewGrain, SequenceId};

/// What the commit log should hold, kept next to the database.
#[derive(Debug, Default)]
struct Model {
    records: BTreeMap<u64, CommitRecord>,
    /// Archived, not yet freed: archiving sequence → grains.
    archived: BTreeMap<u64, Vec<GrainId>>,
    checkpointed_to: u64,
}

/// What one transaction does, to be turned into the expected record.
#[derive(Debug, Default)]
struct Plan {
    writes: Vec<(GrainId, Vec<u8>)>,
    archives: Vec<GrainId>,
    header: Option<Option<GrainId>>,
    checkpoint_to: Option<u64>,
}

impl Model {
    fn committed(&mut self, sequence: SequenceId, plan: Plan) {
        let s = sequence.0;
        let freed = match plan.checkpoint_to {
            Some(to) => {
                let keep = self.archived.split_off(&(to + 1));
                std::mem::replace(&mut self.archived, keep)
                    .into_values()
                    .flatten()
                    .collect()
            }
            None => Vec::new(),
        };
        if !plan.archives.is_empty() {
            self.archived.insert(s, plan.archives.clone());
        }
        let record = CommitRecord {
            sequence,
            new_grains: plan
                .writes
                .iter()
                .map(|(id, data)| NewGrain {
                    id: *id,
                    length: data.len() as u32,
                    crc: grain_crc(s, data),
                })
                .collect(),
            archived: plan.archives,
            freed,
            embedded_header: plan.header,
            checkpointed_to: plan.checkpoint_to.map(SequenceId),
        };
        self.records.insert(s, record);
        if let Some(to) = plan.checkpoint_to {
            self.checkpointed_to = self.checkpointed_to.max(to);
            self.records = self.records.split_off(&(self.checkpointed_to + 1));
        }
    }

    fn expected(&self, since: u64) -> Vec<CommitRecord> {
        self.records
            .range(since..)
            .map(|(_, r)| normal(r))
            .collect()
    }
}

/// The order of `freed` is not specified; compare it sorted.
fn normal(record: &CommitRecord) -> CommitRecord {
    let mut record = record.clone();
    record.freed.sort_unstable();
    record
}

fn log(db: &Database, since: u64) -> Vec<CommitRecord> {
    let records: Vec<CommitRecord> = db.commit_log(SequenceId(since)).unwrap().collect();
    for pair in records.windows(2) {
        assert!(
            pair[0].sequence < pair[1].sequence,
            "the commit log is out of order: {} then {}",
            pair[0].sequence,
            pair[1].sequence
        );
    }
    records.iter().map(normal).collect()
}

fn assert_log(db: &Database, model: &Model, phase: &str) {
    let actual = log(db, 0);
    let expected = model.expected(0);
    if actual != expected {
        let seqs = |r: &[CommitRecord]| r.iter().map(|r| r.sequence.0).collect::<Vec<_>>();
        for (a, e) in actual.iter().zip(&expected) {
            assert_eq!(a, e, "{phase}: first differing record");
        }
        panic!(
            "{phase}: the log holds sequences {:?}, expected {:?}",
            seqs(&actual),
            seqs(&expected)
        );
    }
    // Every `since` in range selects the matching suffix.
    if let (Some(first), Some(last)) = (expected.first(), expected.last()) {
        for since in [
            first.sequence.0,
            (first.sequence.0 + last.sequence.0) / 2,
            last.sequence.0,
        ] {
            assert_eq!(
                log(db, since),
                model.expected(since),
                "{phase}: since {since}"
            );
        }
        assert!(log(db, last.sequence.0 + 1).is_empty(), "{phase}");
    }
    assert!(log(db, u64::MAX).is_empty(), "{phase}: since u64::MAX");
}

#[test]
fn records_list_exactly_what_happened() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::recover(dir.path()).unwrap();
    let mut model = Model::default();
    assert!(log(&db, 0).is_empty());

    // Writes of every kind: tiny, empty and large (direct) blobs.
    let mut tx = db.begin_transaction().unwrap();
    let mut plan = Plan::default();
    for (i, size) in [10_usize, 0, 100_000].into_iter().enumerate() {
        let data = blob(i as u64, size);
        plan.writes.push((tx.write(&data).unwrap(), data));
    }
    let s1 = tx.commit().unwrap();
    let (a, c, b) = (plan.writes[0].0, plan.writes[1].0, plan.writes[2].0);
    model.committed(s1, plan);
    assert_log(&db, &model, "after the writes");

    // Archives and a header change.
    let mut tx = db.begin_transaction().unwrap();
    tx.archive(a).unwrap();
    tx.archive(c).unwrap();
    tx.set_embedded_header(Some(b)).unwrap();
    let s2 = tx.commit().unwrap();
    assert!(s2 > s1);
    model.committed(
        s2,
        Plan {
            archives: vec![a, c],
            header: Some(Some(b)),
            ..Plan::default()
        },
    );

    // Rolled back and dropped transactions leave no record.
    let mut tx = db.begin_transaction().unwrap();
    tx.write(b"rolled back").unwrap();
    tx.archive(b).unwrap();
    tx.rollback();
    let mut tx = db.begin_transaction().unwrap();
    tx.set_embedded_header(None).unwrap();
    drop(tx);

    // An empty transaction still commits a record; so does clearing the
    // header.
    let s3 = db.begin_transaction().unwrap().commit().unwrap();
    model.committed(s3, Plan::default());
    let mut tx = db.begin_transaction().unwrap();
    tx.set_embedded_header(None).unwrap();
    let s4 = tx.commit().unwrap();
    model.committed(
        s4,
        Plan {
            header: Some(None),
            ..Plan::default()
        },
    );
    assert!(s2 < s3 && s3 < s4);
    assert_log(&db, &model, "before any checkpoint_to");
    assert_eq!(log(&db, 0).len(), 4);

    // checkpoint_to(s2) frees a and c and drops the records through s2.
    let mut tx = db.begin_transaction().unwrap();
    tx.checkpoint_to(s2).unwrap();
    let s5 = tx.commit().unwrap();
    model.committed(
        s5,
        Plan {
            checkpoint_to: Some(s2.0),
            ..Plan::default()
        },
    );
    let last = log(&db, s5.0);
    assert_eq!(last.len(), 1);
    let mut freed = vec![a, c];
    freed.sort_unstable();
    assert_eq!(last[0].freed, freed);
    assert_eq!(last[0].checkpointed_to, Some(s2));
    assert_eq!(
        log(&db, 0).iter().map(|r| r.sequence).collect::<Vec<_>>(),
        vec![s3, s4, s5]
    );
    assert_log(&db, &model, "after checkpoint_to");

    // The same after reopening: from the WAL, from the commit log files,
    // after a clean shutdown.
    drop(db);
    let db = Database::recover(dir.path()).unwrap();
    assert_log(&db, &model, "reopened without shutdown");
    db.checkpoint_wal().unwrap();
    assert_log(
        &db,
        &model,
        "after moving the WAL into the commit log files",
    );
    db.shutdown().unwrap();
    let db = Database::recover(dir.path()).unwrap();
    assert_log(&db, &model, "reopened after shutdown");
    assert_eq!(db.checkpointed_to(), s2);
    db.shutdown().unwrap();
}

#[test]
fn records_after_a_running_transaction_wait_for_it() {
    let db = Database::in_memory();
    let first = db.begin_transaction().unwrap().commit().unwrap();
    let mut running = db.begin_transaction().unwrap();
    running.write(b"in flight").unwrap();
    let mut tx = db.begin_transaction().unwrap();
    tx.write(b"committed after").unwrap();
    let after = tx.commit().unwrap();
    // The gap at the running transaction's sequence could still fill:
    // records after it are held back.
    let seen: Vec<SequenceId> = db.commit_log(first).unwrap().map(|r| r.sequence).collect();
    assert_eq!(
        seen,
        vec![first],
        "a record after a running transaction is listed"
    );
    running.rollback();
    let seen: Vec<SequenceId> = db.commit_log(first).unwrap().map(|r| r.sequence).collect();
    assert_eq!(seen, vec![first, after]);

    // When the running one commits, both appear in sequence order.
    let mut running = db.begin_transaction().unwrap();
    running.write(b"in flight again").unwrap();
    let mut tx = db.begin_transaction().unwrap();
    tx.write(b"committed before it").unwrap();
    let overtaking = tx.commit().unwrap();
    let slow = running.commit().unwrap();
    assert!(slow < overtaking, "sequences follow the start of writing");
    let seen: Vec<SequenceId> = db.commit_log(after).unwrap().map(|r| r.sequence).collect();
    assert_eq!(seen, vec![after, slow, overtaking]);
}

#[test]
fn random_history_matches_the_log_through_checkpoints_and_reopens() {
    let seed = seed("random_history_matches_the_log_through_checkpoints_and_reopens");
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let mut db = open_small_wal(dir.path(), 64 << 10);
    let mut model = Model::default();
    let mut live: Vec<GrainId> = Vec::new();
    let mut committed: Vec<u64> = Vec::new();
    for i in 0..400_u64 {
        let mut tx = db.begin_transaction().unwrap();
        let mut plan = Plan::default();
        for j in 0..rng.below(4) {
            let size = if rng.percent(5) {
                70_000
            } else {
                rng.below(3000) as usize
            };
            let data = blob(i << 8 | j, size);
            plan.writes.push((tx.write(&data).unwrap(), data));
        }
        for _ in 0..rng.below(3) {
            if live.is_empty() {
                break;
            }
            let id = live.swap_remove(rng.below(live.len() as u64) as usize);
            tx.archive(id).unwrap();
            plan.archives.push(id);
        }
        if rng.percent(20) {
            let header = match (rng.below(3), plan.writes.first(), live.first()) {
                (0, Some((id, _)), _) | (1, _, Some(id)) => Some(*id),
                _ => None,
            };
            tx.set_embedded_header(header).unwrap();
            plan.header = Some(header);
        }
        if !committed.is_empty() && rng.percent(10) {
            let to = *rng.pick(&committed);
            tx.checkpoint_to(SequenceId(to)).unwrap();
            plan.checkpoint_to = Some(to);
        }
        if rng.percent(10) {
            tx.rollback();
            live.extend(plan.archives);
            continue;
        }
        let sequence = tx.commit().unwrap();
        committed.push(sequence.0);
        live.extend(plan.writes.iter().map(|(id, _)| *id));
        model.committed(sequence, plan);
        if i % 50 == 49 {
            assert_log(&db, &model, &format!("after transaction {i}"));
        }
        if i % 130 == 129 {
            drop(db);
            db = open_small_wal(dir.path(), 64 << 10);
            assert_log(&db, &model, &format!("reopened after transaction {i}"));
        }
    }
    assert_log(&db, &model, "at the end");
    assert_eq!(db.checkpointed_to().0, model.checkpointed_to);
    db.shutdown().unwrap();
    let db = open_small_wal(dir.path(), 64 << 10);
    assert_log(&db, &model, "after shutdown and reopen");
    db.verify().unwrap();
    db.shutdown().unwrap();
}

fn commit_log_bytes(dir: &Path) -> (usize, u64) {
    let files = files_with_prefix(dir, "commits-");
    let bytes = files
        .iter()
        .filter_map(|name| file_len(&dir.join(name)))
        .sum();
    (files.len(), bytes)
}

/// Every cycle writes 40 empty blobs, archives the previous cycle's 40 and
/// checkpoints to the previous cycle: about 1.3 KB of commit records per
/// cycle, several MiB in all. The commit log files rotate at 1 MiB and are
/// deleted once checkpointed, so they must stay small.
#[test]
fn commit_log_files_are_trimmed_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let db = open_small_wal(dir.path(), 256 << 10);
    let mut previous: Vec<GrainId> = Vec::new();
    let mut previous_sequence = None;
    let mut largest = (0, 0);
    let mut files_seen = std::collections::BTreeSet::new();
    for cycle in 0..4000_u64 {
        let mut tx = db.begin_transaction().unwrap();
        let written: Vec<GrainId> = (0..40).map(|_| tx.write(b"").unwrap()).collect();
        for id in previous.drain(..) {
            tx.archive(id).unwrap();
        }
        if let Some(sequence) = previous_sequence {
            tx.checkpoint_to(sequence).unwrap();
        }
        previous_sequence = Some(tx.commit().unwrap());
        previous = written;
        if cycle % 100 == 99 {
            let now = commit_log_bytes(dir.path());
            largest = largest.max(now);
            files_seen.extend(files_with_prefix(dir.path(), "commits-"));
        }
    }
    db.checkpoint_wal().unwrap();
    let at_end = commit_log_bytes(dir.path());
    println!(
        "commit log: {} files ever, {at_end:?} (files, bytes) at the end, largest {largest:?}",
        files_seen.len()
    );
    assert!(
        files_seen.len() >= 3,
        "the workload should rotate the log several times"
    );
    assert!(
        at_end.0 <= 2 && largest.0 <= 3,
        "old commit log files are not deleted: {at_end:?} at the end, up to {largest:?}"
    );
    assert!(
        largest.1 <= 3 << 20,
        "the commit log files grew to {} bytes",
        largest.1
    );
    // Only the records after the last checkpoint are listed.
    let records: Vec<CommitRecord> = db.commit_log(SequenceId(0)).unwrap().collect();
    assert_eq!(records.len(), 1);
    assert_eq!(Some(records[0].sequence), previous_sequence);
    assert_eq!(db.stats().unwrap().commit_log_bytes, at_end.1);
    db.shutdown().unwrap();
    let db = open_small_wal(dir.path(), 256 << 10);
    let records: Vec<CommitRecord> = db.commit_log(SequenceId(0)).unwrap().collect();
    assert_eq!(records.len(), 1);
    db.verify().unwrap();
    db.shutdown().unwrap();
}
