//! The protocol's steps on a store of empty strata: when freed grains
//! become reusable, and what an abandoned checkpoint gives back.

use std::path::Path;
use std::sync::Arc;

use okaywal::fs::FileSystem;

use super::*;
use crate::allocator::bit;
use crate::commit_record::{NewGrain, SequenceId};

fn empty() -> (Reclamation, Strata, BlobCache) {
    let fs: Arc<dyn FileSystem> = Arc::new(okaywal::fs::MemoryFileSystem::new());
    let dir = Path::new("/db");
    fs.create_dir_all(dir).unwrap();
    let strata = Strata::new(
        dir.to_path_buf(),
        fs,
        1 << 20,
        vec![Vec::new(); crate::format::BASINS],
        None,
    );
    let reclamation = Reclamation::recovered(&IndexHeader::default(), Vec::new());
    (reclamation, strata, BlobCache::new(0))
}

fn begin(reclamation: &Reclamation, sequence: u64) {
    reclamation.sequence_requested(sequence);
    reclamation.sequence_assigned(sequence, Some(sequence));
}

fn commit(reclamation: &Reclamation, strata: &Strata, cache: &BlobCache, record: CommitRecord) {
    let horizon = reclamation.sync_horizon();
    reclamation
        .apply_live(
            strata,
            cache,
            record,
            &HashMap::new(),
            Durability::Durable,
            horizon,
        )
        .unwrap();
}

/// Runs sequence `sequence`, which writes the 10-byte blob `id`.
fn commit_new_blob(
    reclamation: &Reclamation,
    strata: &Strata,
    cache: &BlobCache,
    sequence: u64,
    id: GrainId,
) {
    begin(reclamation, sequence);
    let mut written = CommitRecord::new(SequenceId(sequence));
    written.new_grains.push(NewGrain {
        id,
        length: 10,
        crc: 0,
    });
    commit(reclamation, strata, cache, written);
}

fn busy(strata: &Strata, id: GrainId) -> bool {
    let stratum = strata.stratum_of(id).unwrap().unwrap();
    stratum.with_bits(|bits| bit(&bits.busy, id.index()))
}

#[test]
fn a_freed_grain_waits_for_every_lower_sequence_to_finish() {
    let (reclamation, strata, cache) = empty();
    let (id, _) = strata.allocate(10, true).unwrap().unwrap();
    assert!(matches!(
        reclamation.claim_archive(&strata, id),
        Err(Error::NotAllocated(_))
    ));

    commit_new_blob(&reclamation, &strata, &cache, 1, id);
    assert!(strata.is_live(id).unwrap());

    begin(&reclamation, 2);
    reclamation.claim_archive(&strata, id).unwrap();
    assert!(matches!(
        reclamation.claim_archive(&strata, id),
        Err(Error::AlreadyArchived(_))
    ));
    let mut archived = CommitRecord::new(SequenceId(2));
    archived.archived.push(id);
    commit(&reclamation, &strata, &cache, archived);

    // A transaction below the freeing one is still running.
    begin(&reclamation, 3);
    begin(&reclamation, 4);
    let taking = reclamation.take_for_checkpoint(4, 2);
    assert_eq!(taking.freed, vec![id]);
    assert_eq!(taking.checkpointed_to, 2);
    let mut freeing = CommitRecord::new(SequenceId(4));
    freeing.freed = taking.freed;
    freeing.checkpointed_to = Some(SequenceId(2));
    commit(&reclamation, &strata, &cache, freeing);
    assert!(!strata.is_live(id).unwrap());
    assert!(busy(&strata, id), "held while sequence 3 runs");

    reclamation.abandon(&strata, &cache, 3, Vec::new(), Taken::default());
    assert!(!busy(&strata, id), "reusable once it finished");
    assert_eq!(reclamation.checkpointed_to(), 2);
    assert_eq!(reclamation.last_committed(), 4);
    assert!(!reclamation.transactions_open());
}

#[test]
fn grains_taken_by_an_abandoned_checkpoint_go_back_and_hold_others_below() {
    let (reclamation, strata, cache) = empty();
    let (id, _) = strata.allocate(10, true).unwrap().unwrap();
    commit_new_blob(&reclamation, &strata, &cache, 1, id);
    begin(&reclamation, 2);
    reclamation.claim_archive(&strata, id).unwrap();
    let mut archived = CommitRecord::new(SequenceId(2));
    archived.archived.push(id);
    commit(&reclamation, &strata, &cache, archived);

    begin(&reclamation, 3);
    let first = reclamation.take_for_checkpoint(3, 2);
    assert_eq!(first.freed, vec![id]);
    // A concurrent checkpoint stops just below what the first took.
    begin(&reclamation, 4);
    let second = reclamation.take_for_checkpoint(4, 2);
    assert!(second.freed.is_empty());
    assert_eq!(second.checkpointed_to, 1);
    reclamation.abandon(&strata, &cache, 4, Vec::new(), second.taken);

    // The first one fails: its grains are archived again.
    reclamation.abandon(&strata, &cache, 3, Vec::new(), first.taken);
    begin(&reclamation, 5);
    let retried = reclamation.take_for_checkpoint(5, 2);
    assert_eq!(retried.freed, vec![id]);
    assert_eq!(retried.checkpointed_to, 2);
}
