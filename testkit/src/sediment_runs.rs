//! A second run of a sediment store that commits one transaction and dies
//! before any checkpoint, as a process killed right after its commit would.
//!
//! A second run of sediment itself checkpoints the first run's WAL segment
//! as it opens, and closing waits for that checkpoint; tests that need the
//! first segment to stay (damage in it, a reader that must see both) write
//! the second run's transaction through okaywal directly instead.

use okaywal::Configuration;

use crate::recorder::Recorder;

/// Opens the store's WAL as `wal` says (its open recovers the first run's
/// segment and starts a new one, whose header records where the first
/// ended), commits one transaction (an embedded-header change) in
/// sediment's WAL entry format (one chunk: tag 2, then the encoded commit
/// record) and drops the log with every checkpoint refused. Returns the
/// transaction's sequence.
///
/// # Panics
/// If the WAL cannot be opened or written.
#[must_use]
pub fn second_run_without_a_checkpoint(wal: Configuration) -> sediment::SequenceId {
    let log = wal
        .open(Recorder::refusing())
        .expect("the second run opens the WAL");
    let mut entry = log.begin_entry().expect("begin");
    let sequence = sediment::SequenceId(entry.id().0);
    let record = sediment::CommitRecord {
        sequence,
        new_grains: Vec::new(),
        archived: Vec::new(),
        freed: Vec::new(),
        embedded_header: Some(None),
        checkpointed_to: None,
    };
    let mut chunk = vec![2];
    record.encode(&mut chunk);
    entry.write_chunk(&chunk).expect("write");
    entry.commit().expect("commit");
    drop(log);
    sequence
}
