//! Transactions: one WAL entry each, published once durable.

use std::collections::HashMap;
use std::sync::Arc;
use std::thread::ThreadId;

use okaywal::{Durability, EntryWriter, LogPosition};

use crate::commit_record::{CommitRecord, NewGrain, SequenceId};
use crate::db::Database;
use crate::error::{Context, Error, Result};
use crate::format::{grain_crc, GrainHeader, GRAIN_HEADER_SIZE};
use crate::grain_id::GrainId;
use crate::reclamation::Taken;
use crate::stratum::Stratum;
use crate::wal_entry::{begin_image_chunk, encode_data_chunk, encode_record_chunk};

/// A set of writes, archives, an embedded-header change and a checkpoint
/// that commit together or not at all.
///
/// Nothing a transaction does is visible to others until
/// [`Transaction::commit`] has made it durable, or
/// [`Transaction::commit_buffered`] has handed it to the operating system
/// (see there for what a power loss may take away). Dropping a
/// transaction without committing rolls it back.
///
/// Keep transactions short. From its first [`write`](Self::write) until
/// it commits or rolls back, a transaction holds its WAL entry open, and
/// the WAL cannot checkpoint past it: once more than four WAL segments
/// wait, every other thread's writes wait for it to finish (its own
/// thread never does). Holding one open while waiting for another
/// thread's writes can therefore deadlock. A transaction is held by the
/// thread that last used it; one moved to another thread counts as that
/// thread's from its next use there (see
/// [`Error::CheckpointBlockedByOwnTransaction`]).
#[derive(Debug)]
#[must_use = "a transaction dropped without `commit` is rolled back"]
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
    taken: Taken,
    header: Option<Option<GrainId>>,
    checkpoint_to: Option<u64>,
    direct: Vec<Arc<Stratum>>,
    /// Copies of the small blobs written, for the blob cache once the
    /// transaction commits.
    for_cache: Vec<(GrainId, Arc<[u8]>, Arc<Stratum>)>,
    scratch: Vec<u8>,
    finished: bool,
    /// The thread that last used this transaction once it had a sequence:
    /// the one a checkpoint on that thread must not wait for.
    holder: Option<ThreadId>,
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
            taken: Taken::default(),
            header: None,
            checkpoint_to: None,
            direct: Vec::new(),
            for_cache: Vec::new(),
            scratch: Vec::new(),
            finished: false,
            holder: None,
        }
    }

    /// Notes the calling thread as this transaction's holder if another
    /// thread used it last (it was moved): a `checkpoint_to` commit on the
    /// thread that holds it fails rather than wait for it forever.
    fn note_use(&mut self) {
        if self.entry.is_none() {
            return;
        }
        let me = std::thread::current().id();
        if self.holder != Some(me) {
            self.holder = Some(me);
            self.db
                .shared()
                .reclamation()
                .note_holder(self.sequence, me);
        }
    }

    /// The WAL entry starts with the first write, so the sequence (= entry
    /// id) is known when grain headers are built.
    fn ensure_entry(&mut self) -> Result<u64> {
        if self.entry.is_none() {
            let shared = self.db.shared();
            shared.check_usable()?;
            // No lock is held across `begin_entry`, which may wait for the
            // WAL's checkpoints (and so for other transactions). Until the
            // sequence is known, a floor below it keeps readers of
            // `finished_through` from looking past it.
            let db: &'db Database = self.db;
            let wal = db.wal().live()?;
            let floor = wal.next_entry_id().0;
            shared.reclamation().sequence_requested(floor);
            let begun = wal.begin_entry();
            shared
                .reclamation()
                .sequence_assigned(floor, begun.as_ref().ok().map(|entry| entry.id().0));
            let entry = begun.context(|| "beginning a WAL entry".to_string())?;
            self.sequence = entry.id().0;
            self.entry = Some(entry);
            self.holder = Some(std::thread::current().id());
        }
        Ok(self.sequence)
    }

    fn entry(&mut self) -> &mut EntryWriter<'db> {
        self.entry.as_mut().expect("ensure_entry was called")
    }

    /// The sequence this transaction commits as, once it is known: it is
    /// fixed by the first `write` (`None` before; a transaction that
    /// writes nothing gets its sequence at `commit`).
    #[must_use]
    pub fn sequence(&self) -> Option<SequenceId> {
        self.entry.as_ref().map(|_| SequenceId(self.sequence))
    }

    /// Stores `data` as a new blob and returns its id. The blob becomes
    /// readable by others when the transaction commits.
    pub fn write(&mut self, data: &[u8]) -> Result<GrainId> {
        self.note_use();
        let shared = self.db.shared().clone();
        shared.check_usable()?;
        let length = data.len() as u64;
        if length > shared.strata().max_blob_bytes() {
            return Err(Error::TooLarge {
                length,
                maximum: shared.strata().max_blob_bytes(),
            });
        }
        let sequence = self.ensure_entry()?;
        let (id, stratum) = self.reserve(length)?;
        self.reserved.push(id);
        if shared.cache().accepts(data.len()) {
            self.for_cache.push((id, Arc::from(data), stratum.clone()));
        }
        let crc = grain_crc(sequence, data);
        let header = GrainHeader {
            sequence,
            length: length as u32,
            crc,
        };
        // An encrypted store seals the blob here, on the writer's thread
        // and outside every lock: the image (bound to the grain and the
        // sequence) is what the grains hold, whichever way it goes.
        let sealer = shared.strata().sealer().cloned();
        if length >= shared.direct_write_bytes() {
            // Large blobs go straight into their (unreferenced, reserved)
            // grains; commit syncs the stratum before the WAL entry that
            // makes them visible.
            let offset = stratum.offset_of(id.index());
            match &sealer {
                Some(sealer) => sealer.seal_image(id, &header, data, |at, piece| {
                    stratum.write_grains(piece, offset + at)
                }),
                None => stratum
                    .write_grains(&header.encode(), offset)
                    .and_then(|()| stratum.write_grains(data, offset + GRAIN_HEADER_SIZE as u64)),
            }
            .context(|| format!("writing grain {id} to {}", stratum.path().display()))?;
            if !self.direct.iter().any(|s| Arc::ptr_eq(s, &stratum)) {
                self.direct.push(stratum);
            }
        } else {
            // An encrypted store's chunk holds the blob's sealed image,
            // which the log stores as it is (`write_presealed_chunk`):
            // sealing it a second time would protect nothing more. It
            // names its grain by its place in the commit record.
            let written = match &sealer {
                Some(sealer) => {
                    let number = self.new_grains.len() as u32;
                    begin_image_chunk(&mut self.scratch, number);
                    sealer
                        .append_image(id, &header, data, &mut self.scratch)
                        .context(|| format!("sealing grain {id}"))?;
                    let scratch = std::mem::take(&mut self.scratch);
                    let written = self.entry().write_presealed_chunk(&scratch);
                    self.scratch = scratch;
                    written
                }
                None => {
                    encode_data_chunk(&mut self.scratch, id, data);
                    let scratch = std::mem::take(&mut self.scratch);
                    let written = self.entry().write_chunk(&scratch);
                    self.scratch = scratch;
                    written
                }
            };
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

    /// Reserves grains for a blob of `length` bytes, adding a stratum only
    /// if none has room even after a sync has made the grains that
    /// buffered commits freed reusable.
    fn reserve(&self, length: u64) -> Result<(GrainId, Arc<Stratum>)> {
        let shared = self.db.shared();
        if let Some(found) = shared.strata().allocate(length, false)? {
            return Ok(found);
        }
        if self.db.sync_for_space()? {
            if let Some(found) = shared.strata().allocate(length, false)? {
                return Ok(found);
            }
        }
        shared
            .strata()
            .allocate(length, true)?
            .ok_or_else(|| Error::Io {
                context: format!("allocating grains for a blob of {length} bytes"),
                source: std::io::Error::other("a new stratum had no room for the blob"),
            })
    }

    /// Marks a committed blob as no longer needed. It stays readable until
    /// a committed [`Transaction::checkpoint_to`] at or after this
    /// transaction's sequence frees it.
    ///
    /// Archiving the blob the embedded header points to does not change
    /// the header: once the blob is freed, the header names grains that a
    /// later blob may take. Set another header (or `None`) in the same
    /// transaction.
    pub fn archive(&mut self, id: GrainId) -> Result<()> {
        self.note_use();
        let shared = self.db.shared();
        shared.check_usable()?;
        shared.reclamation().claim_archive(shared.strata(), id)?;
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
        self.note_use();
        self.db.shared().check_usable()?;
        if let Some(id) = header {
            let written_here = self.new_grains.iter().any(|g| g.id == id);
            if !written_here && !self.db.shared().strata().is_live(id)? {
                return Err(Error::NotAllocated(id));
            }
        }
        self.header = Some(header);
        Ok(())
    }

    /// Frees, when this transaction commits, every grain archived by a
    /// transaction with sequence ≤ `sequence`, and drops the commit records
    /// up to it.
    ///
    /// `sequence` may be any committed sequence: any that a
    /// [`commit`](Self::commit) has returned, on any thread, or anything
    /// below [`Database::last_committed`](crate::Database::last_committed).
    /// Only a higher one is refused, with [`Error::FutureSequence`].
    /// Transactions with lower sequences may still be running (sequences
    /// are handed out when transactions start writing, and commits return
    /// in any order): the commit then waits until every transaction with a
    /// sequence ≤ `sequence` has committed or rolled back, and frees what
    /// those archived, nothing archived by a later one. If the calling
    /// thread itself holds one of those transactions open, the commit
    /// fails with [`Error::CheckpointBlockedByOwnTransaction`] instead of
    /// waiting forever.
    ///
    /// If this transaction's own sequence is below `sequence` (it began
    /// writing before `sequence` was handed out), its record cannot free
    /// what later transactions archived: the commit then makes its own
    /// changes durable first and frees the grains with a second,
    /// checkpoint-only transaction right after, and returns once both are
    /// committed. (If that second commit fails, say because a sync failed
    /// or the store was shut down meanwhile, its error is returned although
    /// this transaction's own changes are committed; the grains then stay
    /// archived until a later checkpoint.) Calling `checkpoint_to` before
    /// the first [`write`](Self::write) keeps everything in one
    /// transaction.
    ///
    /// If another transaction is committing a `checkpoint_to` at the same
    /// moment, this one stops just below the grains that one is freeing
    /// (see [`Database::checkpointed_to`](crate::Database::checkpointed_to)).
    ///
    /// With buffered commits ([`commit_buffered`](Self::commit_buffered))
    /// in the mix: the grains freed are those archived by transactions
    /// whose commits returned before this one was written, so the free
    /// comes after every archive it undoes in commit order, and a power
    /// loss never keeps the free without the archive. Whether this
    /// transaction commits durably or buffered, its freed grains are
    /// handed to later writes only once it is durable (a durable commit
    /// or [`Database::sync`](crate::Database::sync) after it, or a WAL
    /// checkpoint): until then a power loss could take the free away, and
    /// the archived blob must still be there, with its bytes.
    pub fn checkpoint_to(&mut self, sequence: SequenceId) -> Result<()> {
        self.note_use();
        self.db.shared().check_usable()?;
        let committed = self.db.shared().reclamation().last_committed();
        if sequence.0 > committed {
            return Err(Error::FutureSequence {
                requested: sequence.0,
                committed,
            });
        }
        self.checkpoint_to = Some(self.checkpoint_to.unwrap_or(0).max(sequence.0));
        Ok(())
    }

    /// Waits until every transaction with a sequence ≤ `through` (other
    /// than this one) has committed or rolled back, so that every grain
    /// they archive is known before a checkpoint takes them.
    ///
    /// Two sources together cover every such transaction: the WAL's open
    /// entries (from the moment a transaction's sequence is handed out
    /// until its commit record is written) and the transactions in flight
    /// in `Reclamation` (from just after that until its commit is
    /// applied). Transactions still waiting
    /// for their WAL entry get sequences above `through`, which was handed
    /// out already, so they are not waited for (they may be waiting for a
    /// WAL checkpoint that this transaction's own entry holds back).
    fn wait_until_finished_through(&self, through: u64) -> Result<()> {
        let shared = self.db.shared();
        loop {
            shared.check_usable()?;
            let open_in_wal = self
                .db
                .wal()
                .live()?
                .oldest_open_entry()
                .is_some_and(|oldest| oldest.0 <= through && oldest.0 != self.sequence);
            if shared
                .reclamation()
                .wait_for_finished(through, self.sequence, open_in_wal)?
            {
                return Ok(());
            }
        }
    }

    /// Commits: returns the transaction's sequence once everything it did is
    /// durable, and only then makes it visible to others.
    ///
    /// Its WAL entry shares an `fdatasync` with concurrent commits. When it
    /// returns, every [`commit_buffered`](Self::commit_buffered) that had
    /// returned before this call began is durable too.
    pub fn commit(self) -> Result<SequenceId> {
        self.commit_with(Durability::Durable)
    }

    /// Commits without waiting for a sync: returns the transaction's
    /// sequence once its WAL entry is handed to the operating system, in
    /// commit order, and makes it visible to others then.
    ///
    /// - A crash of the process loses nothing this call has returned: the
    ///   operating system still writes it out.
    /// - A power loss (or an operating system crash) may lose it, but only
    ///   as a suffix of the commits: it is never lost while a transaction
    ///   whose commit began after this call returned survives. So once a
    ///   [`commit`](Self::commit) or [`Database::sync`] that began after
    ///   this call returned has returned, on any thread, this transaction
    ///   survives a power loss too.
    /// - It becomes durable with such a durable commit or sync, with the
    ///   next WAL checkpoint, or within the bounds set by
    ///   [`Config::max_unsynced`](crate::Config::max_unsynced) and
    ///   [`Config::max_unsynced_bytes`](crate::Config::max_unsynced_bytes).
    ///
    /// Blobs that bypass the WAL (at least
    /// [`Config::direct_write_bytes`](crate::Config::direct_write_bytes))
    /// are synced into their grains before the entry is handed over, as
    /// for [`commit`](Self::commit): a transaction that survives a power
    /// loss never comes back without its blobs' bytes. Grains this
    /// transaction's [`checkpoint_to`](Self::checkpoint_to) frees are
    /// reused only once the transaction is durable: until then a power
    /// loss could take the free away and leave the archived blob in place.
    ///
    /// The returned sequence counts as committed at once: it is in
    /// [`Database::last_committed`], in [`Database::commit_log`] and
    /// accepted by `checkpoint_to`, although a power loss may still take it
    /// away.
    pub fn commit_buffered(self) -> Result<SequenceId> {
        self.commit_with(Durability::Buffered)
    }

    fn commit_with(mut self, durability: Durability) -> Result<SequenceId> {
        self.finished = true;
        let result = self.commit_inner(durability);
        if result.is_err() {
            self.abort();
        }
        result
    }

    fn commit_inner(&mut self, durability: Durability) -> Result<SequenceId> {
        self.note_use();
        let shared = self.db.shared().clone();
        shared.check_usable()?;
        if let (Some(requested), None) = (self.checkpoint_to, &self.entry) {
            // Waiting before the WAL entry begins holds nothing back.
            self.wait_until_finished_through(requested)?;
        }
        let sequence = self.ensure_entry()?;
        // A checkpoint past this transaction's own sequence is committed by
        // a checkpoint-only transaction after this one (see
        // `checkpoint_to`): a record may only free grains that records
        // before it archived, which is the order replay, the WAL
        // checkpoint and replicas apply them in.
        let mut checkpoint_after = None;
        if let Some(requested) = self.checkpoint_to {
            if requested >= sequence {
                // Refused now rather than by the checkpoint-only transaction
                // once this one has committed.
                shared
                    .reclamation()
                    .check_not_held_by_this_thread(requested, sequence)?;
                checkpoint_after = Some(requested);
                self.checkpoint_to = None;
            } else {
                self.wait_until_finished_through(requested)?;
            }
        }
        let committed = self.commit_entry(sequence, durability)?;
        if let Some(requested) = checkpoint_after {
            // With the same durability: it comes after this transaction in
            // commit order either way.
            let mut checkpoint = Transaction::new(self.db);
            checkpoint.checkpoint_to = Some(requested);
            checkpoint.commit_with(durability)?;
        }
        Ok(committed)
    }

    /// Writes the commit record into the transaction's WAL entry, commits
    /// it and applies it.
    fn commit_entry(&mut self, sequence: u64, durability: Durability) -> Result<SequenceId> {
        let shared = self.db.shared().clone();
        let mut freed = Vec::new();
        if let Some(requested) = self.checkpoint_to {
            let taking = shared
                .reclamation()
                .take_for_checkpoint(sequence, requested);
            freed = taking.freed;
            self.taken = taking.taken;
            self.checkpoint_to = Some(taking.checkpointed_to);
        }
        let record = CommitRecord {
            sequence: SequenceId(sequence),
            new_grains: std::mem::take(&mut self.new_grains),
            archived: self.archived.clone(),
            freed,
            embedded_header: self.header,
            checkpointed_to: self.checkpoint_to.map(SequenceId),
        };
        encode_record_chunk(&mut self.scratch, &record);
        let scratch = std::mem::take(&mut self.scratch);
        self.entry()
            .write_chunk(&scratch)
            .context(|| "writing the commit record to the WAL".to_string())?;
        // Blobs written straight into their grains are synced before the
        // entry that makes them visible is handed to the WAL, for a
        // buffered commit too. Syncing them later (with the next durable
        // commit or `Database::sync`) would not do: the WAL is also synced
        // where this store cannot step in first (okaywal's `max_unsynced`
        // thread and `max_unsynced_bytes`, its checkpoints and segment
        // switches, any other thread's durable commit), and each of those
        // could make the entry durable while its grains' bytes are still
        // only in the page cache; after a power cut the entry would come
        // back with blobs that fail their checksums. Large blobs are the
        // ones that bypass the WAL, so this sync is a small part of their
        // cost.
        for stratum in &self.direct {
            if let Err(err) = stratum.sync() {
                // After a failed fsync the kernel may have dropped other
                // writers' pages too: nothing more may be acknowledged.
                shared.poison(&err);
                return Err(err);
            }
        }
        // Every buffered commit applied before this durable one's commit
        // record is written is handed to the OS before it, so the sync
        // that makes this one durable covers them too.
        let buffered_before = shared.reclamation().sync_horizon();
        let entry = self.entry.take().expect("ensure_entry was called");
        if let Err(err) = entry
            .commit_with(durability)
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
        // Nothing can free the new blobs before `apply_live` makes them
        // visible, so their strata's reuse epochs read now are ones at
        // which they were not freed (see `cache`).
        let for_cache: Vec<_> = std::mem::take(&mut self.for_cache)
            .into_iter()
            .map(|(id, data, stratum)| {
                let epoch = stratum.reuse_epoch();
                (id, data, stratum, epoch)
            })
            .collect();
        shared.reclamation().apply_live(
            shared.strata(),
            shared.cache(),
            record,
            &self.positions,
            durability,
            buffered_before,
        )?;
        self.reserved.clear();
        self.archived.clear();
        self.taken = Taken::default();
        for (id, data, stratum, epoch) in for_cache {
            shared
                .cache()
                .insert_shared_if(id, data, || stratum.reuse_epoch() == epoch);
        }
        Ok(SequenceId(sequence))
    }

    /// Abandons the transaction: its grains are released and nothing it did
    /// is ever visible, after a crash or otherwise.
    ///
    /// It cannot fail: nothing of the transaction is committed, so there is
    /// nothing to undo on disk. (Its WAL entry gets a rollback record if
    /// that can still be written; an entry without a commit record is never
    /// replayed either way.)
    pub fn rollback(mut self) {
        self.finished = true;
        self.abort();
    }

    fn abort(&mut self) {
        let shared = self.db.shared();
        for id in self.reserved.drain(..) {
            shared.strata().release(id);
        }
        shared.reclamation().abandon(
            shared.strata(),
            shared.cache(),
            self.sequence,
            self.archived.drain(..),
            std::mem::take(&mut self.taken),
        );
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
