//! Transactions: one WAL entry each, published once durable.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use okaywal::{EntryWriter, LogPosition};

use crate::commit_log::{CommitRecord, NewGrain, SequenceId};
use crate::db::Database;
use crate::error::{Context, Error, Result};
use crate::format::{grain_crc, GrainHeader, GRAIN_HEADER_SIZE};
use crate::grain_id::GrainId;
use crate::manager::{DATA_CHUNK, RECORD_CHUNK};
use crate::stratum::Stratum;

/// A set of writes, archives, an embedded-header change and a checkpoint
/// that commit together or not at all.
///
/// Nothing a transaction does is visible to others until
/// [`Transaction::commit`] has made it durable. Dropping a transaction
/// without committing rolls it back.
#[derive(Debug)]
pub struct Transaction<'db> {
    db: &'db Database,
    entry: Option<EntryWriter<'db>>,
    sequence: u64,
    /// Every grain reserved, whether or not its bytes were written.
    reserved: Vec<GrainId>,
    new_grains: Vec<NewGrain>,
    positions: HashMap<GrainId, LogPosition>,
    archived: Vec<GrainId>,
    /// Archived grains this transaction's checkpoint took for freeing,
    /// returned if it does not commit.
    taken: BTreeMap<u64, Vec<GrainId>>,
    header: Option<Option<GrainId>>,
    checkpoint_to: Option<u64>,
    direct: Vec<Arc<Stratum>>,
    scratch: Vec<u8>,
    finished: bool,
}

impl<'db> Transaction<'db> {
    pub(crate) fn new(db: &'db Database) -> Self {
        Self {
            db,
            entry: None,
            sequence: 0,
            reserved: Vec::new(),
            new_grains: Vec::new(),
            positions: HashMap::new(),
            archived: Vec::new(),
            taken: BTreeMap::new(),
            header: None,
            checkpoint_to: None,
            direct: Vec::new(),
            scratch: Vec::new(),
            finished: false,
        }
    }

    /// The WAL entry starts with the first write, so the sequence (= entry
    /// id) is known when grain headers are built.
    fn ensure_entry(&mut self) -> Result<u64> {
        if self.entry.is_none() {
            let shared = &self.db.shared;
            shared.check_usable()?;
            // No lock is held across `begin_entry`, which may wait for the
            // WAL's checkpoints (and so for other transactions). Until the
            // sequence is known, a floor below it keeps readers of
            // `finished_through` from looking past it.
            let db: &'db Database = self.db;
            let wal = db.wal.live()?;
            let floor = wal.next_entry_id().0;
            *shared.meta.lock().beginning.entry(floor).or_default() += 1;
            let begun = wal.begin_entry();
            let mut meta = shared.meta.lock();
            if let Some(count) = meta.beginning.get_mut(&floor) {
                *count -= 1;
                if *count == 0 {
                    meta.beginning.remove(&floor);
                }
            }
            let entry = begun.context(|| "beginning a WAL entry".to_string())?;
            self.sequence = entry.id().0;
            meta.in_flight.insert(self.sequence);
            drop(meta);
            self.entry = Some(entry);
        }
        Ok(self.sequence)
    }

    fn entry(&mut self) -> &mut EntryWriter<'db> {
        self.entry.as_mut().expect("ensure_entry was called")
    }

    /// Stores `data` as a new blob and returns its id. The blob becomes
    /// readable by others when the transaction commits.
    pub fn write(&mut self, data: &[u8]) -> Result<GrainId> {
        let shared = self.db.shared.clone();
        shared.check_usable()?;
        let length = data.len() as u64;
        if length > shared.max_blob_bytes {
            return Err(Error::TooLarge {
                length,
                maximum: shared.max_blob_bytes,
            });
        }
        let sequence = self.ensure_entry()?;
        let (id, stratum) = shared.allocate(length)?;
        self.reserved.push(id);
        let crc = grain_crc(sequence, data);
        if length >= shared.direct_write_bytes {
            // Large blobs go straight into their (unreferenced, reserved)
            // grains; commit syncs the stratum before the WAL entry that
            // makes them visible.
            let header = GrainHeader {
                sequence,
                length: length as u32,
                crc,
            };
            let offset = stratum.offset_of(id.index());
            stratum
                .file
                .write_all_at(&header.encode(), offset)
                .and_then(|()| {
                    stratum
                        .file
                        .write_all_at(data, offset + GRAIN_HEADER_SIZE as u64)
                })
                .context(|| format!("writing grain {id} to {}", stratum.path.display()))?;
            if !self.direct.iter().any(|s| Arc::ptr_eq(s, &stratum)) {
                self.direct.push(stratum);
            }
        } else {
            self.scratch.clear();
            self.scratch.push(DATA_CHUNK);
            self.scratch.extend_from_slice(&id.to_bytes());
            self.scratch.extend_from_slice(data);
            let scratch = std::mem::take(&mut self.scratch);
            let written = self.entry().write_chunk(&scratch);
            self.scratch = scratch;
            let record = written.context(|| format!("writing grain {id} to the WAL"))?;
            self.positions.insert(id, record.position);
        }
        self.new_grains.push(NewGrain {
            id,
            length: length as u32,
            crc,
        });
        Ok(id)
    }

    /// Marks a committed blob as no longer needed. It stays readable until
    /// a committed [`Transaction::checkpoint_to`] at or after this
    /// transaction's sequence frees it.
    pub fn archive(&mut self, id: GrainId) -> Result<()> {
        let shared = &self.db.shared;
        shared.check_usable()?;
        // Liveness is checked under the meta lock, which a commit freeing
        // this grain holds while clearing it: checked before, a grain freed
        // meanwhile would be claimed, and a later checkpoint would free
        // whatever blob had reused its grains by then.
        let mut meta = shared.meta.lock();
        if !shared.is_live(id)? {
            return Err(Error::NotAllocated(id));
        }
        if meta.archived_set.contains_key(&id) || meta.claimed.contains(&id) {
            return Err(Error::AlreadyArchived(id));
        }
        meta.claimed.insert(id);
        drop(meta);
        self.archived.push(id);
        Ok(())
    }

    /// Sets the embedded header (a root pointer for structures built on
    /// top) to `header`, which must be a committed blob or one written by
    /// this transaction.
    ///
    /// Of the committed transactions that set it, the one with the highest
    /// sequence wins, whatever order their commits return in: that is the
    /// order the commit log, a replica and a reopened database apply them
    /// in. A transaction's sequence is fixed by its first
    /// [`write`](Self::write) (or by [`commit`](Self::commit) if it writes
    /// nothing), so of two overlapping transactions that both set the
    /// header, the one that started writing later wins.
    pub fn set_embedded_header(&mut self, header: Option<GrainId>) -> Result<()> {
        self.db.shared.check_usable()?;
        if let Some(id) = header {
            let written_here = self.new_grains.iter().any(|g| g.id == id);
            if !written_here && !self.db.shared.is_live(id)? {
                return Err(Error::NotAllocated(id));
            }
        }
        self.header = Some(header);
        Ok(())
    }

    /// Frees, when this transaction commits, every grain archived by a
    /// transaction with sequence ≤ `sequence`, and drops the commit records
    /// up to it. `sequence` must be committed (with every transaction
    /// before it finished).
    ///
    /// If another transaction is committing a `checkpoint_to` at the same
    /// moment, this one stops just below the grains that one is freeing
    /// (see [`Database::checkpointed_to`](crate::Database::checkpointed_to)).
    pub fn checkpoint_to(&mut self, sequence: SequenceId) -> Result<()> {
        self.db.shared.check_usable()?;
        let meta = self.db.shared.meta.lock();
        let through = meta.finished_through();
        if sequence.0 > through {
            return Err(Error::FutureSequence {
                requested: sequence.0,
                committed: through,
            });
        }
        drop(meta);
        self.checkpoint_to = Some(self.checkpoint_to.unwrap_or(0).max(sequence.0));
        Ok(())
    }

    /// Commits: returns the transaction's sequence once everything it did is
    /// durable, and only then makes it visible to others.
    pub fn commit(mut self) -> Result<SequenceId> {
        self.finished = true;
        let result = self.commit_inner();
        if result.is_err() {
            self.abort();
        }
        result
    }

    fn commit_inner(&mut self) -> Result<SequenceId> {
        let shared = self.db.shared.clone();
        shared.check_usable()?;
        let sequence = self.ensure_entry()?;
        let mut freed = Vec::new();
        if let Some(requested) = self.checkpoint_to {
            let mut meta = shared.meta.lock();
            let keep = meta.archived.split_off(&requested.saturating_add(1));
            self.taken = std::mem::replace(&mut meta.archived, keep);
            let mut lowest = None;
            for (archived_by, grains) in &self.taken {
                // After a reopen, grains that a record freed without
                // checkpointing past their archiving are listed again
                // (see `Meta::taking`); the set knows which still are.
                for id in grains {
                    if meta.archived_set.get(id) == Some(archived_by) {
                        freed.push(*id);
                        lowest.get_or_insert(*archived_by);
                    }
                }
            }
            // Grains a concurrent committer took stay archived on disk
            // until its record is durable: checkpoint only below them.
            let to = match meta.taking.values().min() {
                Some(&theirs) => requested.min(theirs.saturating_sub(1)),
                None => requested,
            };
            self.checkpoint_to = Some(to);
            if let Some(lowest) = lowest {
                meta.taking.insert(sequence, lowest);
            }
        }
        let record = CommitRecord {
            sequence: SequenceId(sequence),
            new_grains: std::mem::take(&mut self.new_grains),
            archived: self.archived.clone(),
            freed,
            embedded_header: self.header,
            checkpointed_to: self.checkpoint_to.map(SequenceId),
        };
        self.scratch.clear();
        self.scratch.push(RECORD_CHUNK);
        record.encode(&mut self.scratch);
        let scratch = std::mem::take(&mut self.scratch);
        self.entry()
            .write_chunk(&scratch)
            .context(|| "writing the commit record to the WAL".to_string())?;
        for stratum in &self.direct {
            if let Err(err) = stratum.sync() {
                // After a failed fsync the kernel may have dropped other
                // writers' pages too: nothing more may be acknowledged.
                shared.poison(&err);
                return Err(err);
            }
        }
        let entry = self.entry.take().expect("ensure_entry was called");
        if let Err(err) = entry
            .commit()
            .context(|| format!("committing sequence {sequence} to the WAL"))
        {
            // Whether the transaction committed is unknown: its records may
            // have reached the WAL file before the sync failed, and then the
            // next open replays it. So its grains stay taken (released, a
            // transaction still in flight could write over a blob that comes
            // back), and nothing more is written until the store is reopened
            // and recovery decides.
            shared.poison(&err);
            self.reserved.clear();
            return Err(err);
        }
        let mut meta = shared.meta.lock();
        shared.apply_commit(&mut meta, record, &self.positions, false)?;
        meta.taking.remove(&sequence);
        self.reserved.clear();
        self.archived.clear();
        self.taken.clear();
        Ok(SequenceId(sequence))
    }

    /// Abandons the transaction: its grains are released and nothing it did
    /// is ever visible.
    pub fn rollback(mut self) -> Result<()> {
        self.finished = true;
        self.abort();
        Ok(())
    }

    fn abort(&mut self) {
        let shared = &self.db.shared;
        for id in self.reserved.drain(..) {
            shared.release(id);
        }
        let mut meta = shared.meta.lock();
        for id in self.archived.drain(..) {
            meta.claimed.remove(&id);
        }
        // No other record checkpointed past these meanwhile (see
        // `Meta::taking`), so they go back where a later checkpoint, or
        // the commit log after a reopen, still finds them.
        meta.taking.remove(&self.sequence);
        for (sequence, grains) in std::mem::take(&mut self.taken) {
            meta.archived.entry(sequence).or_default().extend(grains);
        }
        if self.sequence != 0 {
            meta.in_flight.remove(&self.sequence);
            shared.release_freed(&mut meta);
        }
        drop(meta);
        if let Some(entry) = self.entry.take() {
            let _ = entry.rollback();
        }
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.finished = true;
            self.abort();
        }
    }
}
