//! The reclamation protocol: how a grain goes from committed to archived to
//! freed to reusable, and everything that decides when, kept in one place.
//!
//! 1. A transaction [claims an archive](Reclamation::claim_archive) of a
//!    live blob; its commit record lists it as archived.
//! 2. A committing `checkpoint_to` [takes](Reclamation::take_for_checkpoint)
//!    the grains archived at or below its sequence; its record frees them.
//!    Until that record is durable, other records checkpoint only below
//!    them.
//! 3. [Applying](Reclamation::apply_live) a record (or
//!    [replaying](Reclamation::apply_replayed) it at open) marks its blobs
//!    live and its frees dead. A freed grain is reusable once every
//!    transaction with a lower sequence has finished
//!    ([`Reclamation::release_freed`]); freed by a buffered commit, only
//!    once that commit is durable as well ([`Reclamation::synced`]).
//! 4. Blobs whose bytes are still only in the WAL are `pending`. One freed
//!    that way is `superseded`: the WAL checkpoint must not copy it over a
//!    grain that may hold a newer blob. A WAL checkpoint that may already
//!    have checked it holds its grain until it ends
//!    ([`Reclamation::checkpoint_started`],
//!    [`Reclamation::checkpoint_finished`]).
//!
//! # Lock order
//!
//! `store → meta → pending → bits → superseded → cache`: the store
//! (index and commit log files, held by the WAL checkpoint and `verify`),
//! then this module's `meta`, `pending` and `superseded`, a stratum's
//! allocation `bits` in between, and the blob cache's shards last.
//!
//! The order is kept by construction: `meta`, `pending` and `superseded`
//! are private to [`Reclamation`]; each method takes them in that order
//! and releases them before it returns, never hands out a guard and never
//! runs a caller's code while holding one. Under them it takes only a
//! stratum's `bits` and the cache, whose holders take no other lock (see
//! `stratum` and `cache`). Callers may hold the store while they call in;
//! nothing here takes it.
//!
//! # Files
//!
//! This file holds the state and the operations of the protocol; `apply`
//! applies one commit record and releases freed grains; `views` reads the
//! state consistently for readers, `verify` and `stats`. All three are
//! methods of [`Reclamation`], the one owner of the state: they live in
//! submodules only to keep each file readable. Its unit tests are in
//! `tests`.

mod apply;
mod views;

pub(crate) use views::{Described, Location};

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::ThreadId;
use std::time::Duration;

use okaywal::{Durability, LogPosition};
use parking_lot::{Condvar, Mutex, RwLock};

use crate::cache::BlobCache;
use crate::commit_record::CommitRecord;
use crate::error::{Error, Result};
use crate::format::IndexHeader;
use crate::grain_id::GrainId;
use crate::strata::Strata;

/// A committed blob whose bytes are still only in the WAL.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pending {
    /// Position of the WAL chunk; the blob follows the data chunk's prefix.
    pub position: LogPosition,
    /// The blob's length.
    pub length: u32,
    /// The blob's CRC (over sequence, length and data).
    pub crc: u32,
    /// The sequence that wrote it.
    pub sequence: u64,
}

/// Transaction bookkeeping shared by all threads.
#[derive(Debug, Default)]
struct Meta {
    embedded_header: Option<GrainId>,
    /// The sequence that set `embedded_header` (0: the index's value).
    /// Commits may finish out of sequence order, but the WAL checkpoint,
    /// replay and commit-log readers apply them in order: the highest
    /// sequence must win here too.
    embedded_header_sequence: u64,
    checkpointed_to: u64,
    last_committed: u64,
    /// Sequences of transactions that have started writing and not
    /// finished, with the thread that began each (a checkpoint that would
    /// wait for the calling thread's own transaction fails instead).
    in_flight: BTreeMap<u64, ThreadId>,
    /// Transactions waiting for their WAL entry (which may wait for the
    /// WAL's checkpoints, so no lock is held meanwhile): the lowest id each
    /// can get, with a count. Their sequences are not known yet, so nothing
    /// at or above the lowest of these counts as finished.
    beginning: BTreeMap<u64, usize>,
    /// Archived grains by the sequence that archived them. After a reopen
    /// this can also list grains already freed (see `taking`): a grain is
    /// archived only while `archived_set` maps it to that sequence.
    archived: BTreeMap<u64, Vec<GrainId>>,
    /// Archived, not yet freed, grains and the sequence that archived each.
    archived_set: HashMap<GrainId, u64>,
    /// Grains that running transactions are archiving.
    claimed: HashSet<GrainId>,
    /// Committing transactions that took archived grains to free for their
    /// `checkpoint_to`, by their sequence: the lowest archiving sequence
    /// each took. Until such a record is durable its grains are archived on
    /// disk, so another record's `checkpointed_to` (which drops the commit
    /// records up to it) stays below that sequence: if the taker then
    /// failed, a reopen would no longer know the grains are archived, and
    /// they would never be freed. That record still frees every grain it
    /// took, so it can free grains archived after its `checkpointed_to`.
    taking: BTreeMap<u64, u64>,
    /// Grains freed by a committed sequence, reusable once every
    /// transaction with a lower sequence has finished (see
    /// `Reclamation::release_freed`).
    freeing: BTreeMap<u64, Vec<GrainId>>,
    /// Grains freed by buffered commits that are not known to be durable
    /// yet, by the freeing sequence. A power cut may still take such a
    /// commit away, and with it the free: the grain would then hold its
    /// archived blob again, so it must keep that blob's bytes until a sync
    /// covers the free (see `Reclamation::frees_became_durable`).
    unsynced_frees: BTreeMap<u64, UnsyncedFrees>,
    /// Set while a WAL checkpoint copies the blobs of entries up to this
    /// sequence into the strata.
    checkpointing_through: Option<u64>,
    /// Grains whose blob that running checkpoint may be copying (it was
    /// freed while its bytes were only in the WAL, and the checkpoint
    /// checks `superseded` without a lock), by the sequence that wrote the
    /// blob: (freeing sequence, grain). They move to `freeing` when the
    /// checkpoint ends, so its copy never lands on a reused grain.
    freed_in_wal: BTreeMap<u64, Vec<(u64, GrainId)>>,
    /// Commit records not yet in the commit log files.
    recent: BTreeMap<u64, CommitRecord>,
    wal_checkpointed_entry: u64,
}

/// The grains one buffered commit freed, waiting for it to be durable.
#[derive(Debug)]
struct UnsyncedFrees {
    /// The commit's place among buffered commits (`buffered_applied` once
    /// it was applied): a durable commit or a sync that began after it was
    /// applied covers it.
    order: u64,
    /// Each grain, with the sequence that wrote its blob if that blob was
    /// still only in the WAL when it was freed (a WAL checkpoint may copy
    /// it into the grain until the free is made durable).
    grains: Vec<(GrainId, Option<u64>)>,
}

impl Meta {
    /// Every transaction with a sequence at or below this has finished.
    fn finished_through(&self) -> u64 {
        let through = match self.in_flight.keys().next() {
            Some(first) => first - 1,
            None => self.last_committed,
        };
        match self.beginning.keys().next() {
            Some(floor) => through.min(floor.saturating_sub(1)),
            None => through,
        }
    }
}

/// How a commit record reaches `Reclamation::apply`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Applied {
    /// Replayed from the WAL at open (okaywal syncs what it recovers, so
    /// it is durable).
    Replayed,
    /// Committed with `Transaction::commit`: durable.
    Durable,
    /// Committed with `Transaction::commit_buffered`: handed to the OS,
    /// not yet known to be durable.
    Buffered,
}

/// Archived grains a committing transaction took for its `checkpoint_to`,
/// by archiving sequence: handed back with [`Reclamation::abandon`] if it
/// does not commit.
#[derive(Debug, Default)]
pub(crate) struct Taken {
    by_sequence: BTreeMap<u64, Vec<GrainId>>,
}

/// What [`Reclamation::take_for_checkpoint`] gives a committing
/// transaction.
#[derive(Debug)]
pub(crate) struct TakenForCheckpoint {
    /// The grains its record frees.
    pub freed: Vec<GrainId>,
    /// The sequence its record checkpoints to: the one asked for, or just
    /// below the grains a concurrent committer took.
    pub checkpointed_to: u64,
    /// Everything it took, to hand back if it does not commit.
    pub taken: Taken,
}

/// The sole owner of the reclamation state; see the module docs.
#[derive(Debug)]
pub(crate) struct Reclamation {
    meta: Mutex<Meta>,
    /// Committed blobs whose bytes are still only in the WAL.
    pending: RwLock<HashMap<GrainId, Pending>>,
    /// Blobs (grain, writing sequence) that were freed while their bytes
    /// were still only in the WAL: the WAL checkpoint must not copy them
    /// into the strata, where the freed grains may already hold a newer
    /// blob. A checkpoint that started before the free may have checked
    /// already: such grains wait for it to end (`Meta::freed_in_wal`).
    superseded: Mutex<HashSet<(GrainId, u64)>>,
    /// Signalled (with `meta`) when a transaction leaves
    /// `Meta::in_flight`; a checkpointing commit waits on it.
    finished: Condvar,
    /// How many buffered commits have been applied (their WAL entries
    /// handed to the OS) since the store was opened; increased under
    /// `meta`. A durable commit or a sync reads it before it begins: every
    /// buffered commit counted then is durable once it returns.
    buffered_applied: AtomicU64,
}

impl Reclamation {
    /// The state at open, before the WAL replays: what the index holds and
    /// what the readable commit records after its last `checkpoint_to`
    /// archived and freed.
    pub fn recovered(index: &IndexHeader, records: Vec<CommitRecord>) -> Self {
        let mut meta = Meta {
            embedded_header: index.embedded_header,
            checkpointed_to: index.checkpointed_to,
            last_committed: index.last_committed,
            wal_checkpointed_entry: index.wal_checkpointed_entry,
            ..Meta::default()
        };
        for record in records {
            meta.last_committed = meta.last_committed.max(record.sequence.0);
            let sequence = record.sequence.0;
            for id in &record.archived {
                meta.archived_set.insert(*id, sequence);
            }
            for id in &record.freed {
                meta.archived_set.remove(id);
            }
            if !record.archived.is_empty() {
                meta.archived.insert(sequence, record.archived);
            }
        }
        Self {
            meta: Mutex::new(meta),
            pending: RwLock::default(),
            superseded: Mutex::default(),
            finished: Condvar::new(),
            buffered_applied: AtomicU64::new(0),
        }
    }

    /// The embedded header of the committed transaction with the highest
    /// sequence among those that set it.
    pub fn embedded_header(&self) -> Option<GrainId> {
        self.meta.lock().embedded_header
    }

    /// The highest sequence a committed `checkpoint_to` reached.
    pub fn checkpointed_to(&self) -> u64 {
        self.meta.lock().checkpointed_to
    }

    /// The highest committed sequence.
    pub fn last_committed(&self) -> u64 {
        self.meta.lock().last_committed
    }

    /// The last WAL entry the strata, the commit log and the index hold.
    pub fn wal_checkpointed_entry(&self) -> u64 {
        self.meta.lock().wal_checkpointed_entry
    }

    /// True while a transaction has begun writing, or waits to, and has
    /// not finished.
    pub fn transactions_open(&self) -> bool {
        let meta = self.meta.lock();
        !meta.in_flight.is_empty() || !meta.beginning.is_empty()
    }

    /// A transaction is about to wait for its WAL entry, whose id will be
    /// at least `floor`: until [`Reclamation::sequence_assigned`], nothing
    /// at or above `floor` counts as finished.
    pub fn sequence_requested(&self, floor: u64) {
        *self.meta.lock().beginning.entry(floor).or_default() += 1;
    }

    /// The transaction that requested a sequence at `floor` got `sequence`
    /// (`None`: beginning its entry failed); it is in flight on the
    /// calling thread until it commits or is abandoned.
    pub fn sequence_assigned(&self, floor: u64, sequence: Option<u64>) {
        let mut meta = self.meta.lock();
        if let Some(count) = meta.beginning.get_mut(&floor) {
            *count -= 1;
            if *count == 0 {
                meta.beginning.remove(&floor);
            }
        }
        if let Some(sequence) = sequence {
            meta.in_flight.insert(sequence, std::thread::current().id());
        }
    }

    /// The transaction in flight as `sequence` is used on thread `holder`
    /// now (it was moved there).
    pub fn note_holder(&self, sequence: u64, holder: ThreadId) {
        if let Some(thread) = self.meta.lock().in_flight.get_mut(&sequence) {
            *thread = holder;
        }
    }

    /// Claims the archive of the live blob `id` for a running transaction.
    pub fn claim_archive(&self, strata: &Strata, id: GrainId) -> Result<()> {
        // Liveness is checked under the meta lock, which a commit freeing
        // this grain holds while clearing it: checked before, a grain freed
        // meanwhile would be claimed, and a later checkpoint would free
        // whatever blob had reused its grains by then.
        let mut meta = self.meta.lock();
        if !strata.is_live(id)? {
            return Err(Error::NotAllocated(id));
        }
        if meta.archived_set.contains_key(&id) || meta.claimed.contains(&id) {
            return Err(Error::AlreadyArchived(id));
        }
        meta.claimed.insert(id);
        Ok(())
    }

    /// Fails if the calling thread holds open a transaction (other than
    /// `own`) with a sequence ≤ `through`: waiting for it would never end.
    pub fn check_not_held_by_this_thread(&self, through: u64, own: u64) -> Result<()> {
        check_not_held_by_this_thread(&self.meta.lock(), through, own)
    }

    /// `Ok(true)` if no transaction with a sequence ≤ `through` other than
    /// `own` is in flight here and `open_in_wal` says none is open in the
    /// WAL. Otherwise waits until one finishes (at most 10 ms, which covers
    /// one that got its sequence from the WAL and is not in flight here
    /// yet) and returns `Ok(false)`: ask again. Fails as
    /// [`Reclamation::check_not_held_by_this_thread`] does.
    pub fn wait_for_finished(&self, through: u64, own: u64, open_in_wal: bool) -> Result<bool> {
        let mut meta = self.meta.lock();
        check_not_held_by_this_thread(&meta, through, own)?;
        let running = meta
            .in_flight
            .range(..=through)
            .any(|(sequence, _)| *sequence != own);
        if !running && !open_in_wal {
            return Ok(true);
        }
        // Woken when a transaction finishes (signalled under the lock held
        // since the check).
        self.finished.wait_for(&mut meta, Duration::from_millis(10));
        Ok(false)
    }

    /// Takes, for the `checkpoint_to(requested)` of the committing
    /// transaction `sequence`, every grain archived at or below
    /// `requested`.
    pub fn take_for_checkpoint(&self, sequence: u64, requested: u64) -> TakenForCheckpoint {
        let mut meta = self.meta.lock();
        let keep = meta.archived.split_off(&requested.saturating_add(1));
        let taken = std::mem::replace(&mut meta.archived, keep);
        let mut freed = Vec::new();
        let mut lowest = None;
        for (archived_by, grains) in &taken {
            // After a reopen, grains that a record freed without
            // checkpointing past their archiving are listed again (see
            // `Meta::taking`); the set knows which still are.
            for id in grains {
                if meta.archived_set.get(id) == Some(archived_by) {
                    freed.push(*id);
                    lowest.get_or_insert(*archived_by);
                }
            }
        }
        // Grains a concurrent committer took stay archived on disk until
        // its record is durable: checkpoint only below them.
        let checkpointed_to = match meta.taking.values().min() {
            Some(&theirs) => requested.min(theirs.saturating_sub(1)),
            None => requested,
        };
        if let Some(lowest) = lowest {
            meta.taking.insert(sequence, lowest);
        }
        TakenForCheckpoint {
            freed,
            checkpointed_to,
            taken: Taken { by_sequence: taken },
        }
    }

    /// How many buffered commits have been applied: a sync that begins
    /// after this is read covers all of them.
    pub fn sync_horizon(&self) -> u64 {
        self.buffered_applied.load(Ordering::Acquire)
    }

    /// Before a WAL sync: [`Reclamation::sync_horizon`] and the highest
    /// committed sequence, read together (every commit counted in the
    /// latter is counted in the former if buffered).
    pub fn sync_starting(&self) -> (u64, u64) {
        let meta = self.meta.lock();
        (
            self.buffered_applied.load(Ordering::Acquire),
            meta.last_committed,
        )
    }

    /// A WAL sync that began at `horizon` (see
    /// [`Reclamation::sync_starting`]) succeeded: the frees of the buffered
    /// commits it covers are durable.
    pub fn synced(&self, strata: &Strata, cache: &BlobCache, horizon: u64) {
        let mut meta = self.meta.lock();
        self.frees_became_durable(&mut meta, strata, cache, |_, order| order <= horizon);
    }

    /// True if grains freed by buffered commits wait for a sync.
    pub fn has_unsynced_frees(&self) -> bool {
        !self.meta.lock().unsynced_frees.is_empty()
    }

    /// Applies the record of a transaction whose WAL entry was committed
    /// with `durability`, after that commit returned; `horizon` is the
    /// [`Reclamation::sync_horizon`] read before it began.
    pub fn apply_live(
        &self,
        strata: &Strata,
        cache: &BlobCache,
        record: CommitRecord,
        positions: &HashMap<GrainId, LogPosition>,
        durability: Durability,
        horizon: u64,
    ) -> Result<()> {
        let sequence = record.sequence.0;
        let mut meta = self.meta.lock();
        let applied = match durability {
            Durability::Durable => Applied::Durable,
            Durability::Buffered => Applied::Buffered,
        };
        self.apply(&mut meta, strata, cache, record, positions, applied)?;
        if durability == Durability::Durable {
            self.frees_became_durable(&mut meta, strata, cache, |_, order| order <= horizon);
        }
        meta.taking.remove(&sequence);
        Ok(())
    }

    /// Applies a record replayed from the WAL at open; `positions` are its
    /// data chunks.
    pub fn apply_replayed(
        &self,
        strata: &Strata,
        cache: &BlobCache,
        record: CommitRecord,
        positions: &HashMap<GrainId, LogPosition>,
    ) -> Result<()> {
        let mut meta = self.meta.lock();
        self.apply(
            &mut meta,
            strata,
            cache,
            record,
            positions,
            Applied::Replayed,
        )
    }

    /// A transaction that did not commit gives back what it claimed and
    /// took; `sequence` is 0 if it never got one.
    pub fn abandon(
        &self,
        strata: &Strata,
        cache: &BlobCache,
        sequence: u64,
        claimed: impl IntoIterator<Item = GrainId>,
        taken: Taken,
    ) {
        let mut meta = self.meta.lock();
        for id in claimed {
            meta.claimed.remove(&id);
        }
        // No other record checkpointed past these meanwhile (see
        // `Meta::taking`), so they go back where a later checkpoint, or
        // the commit log after a reopen, still finds them.
        meta.taking.remove(&sequence);
        for (archived_by, grains) in taken.by_sequence {
            meta.archived.entry(archived_by).or_default().extend(grains);
        }
        if sequence != 0 {
            if meta.in_flight.remove(&sequence).is_some() {
                self.finished.notify_all();
            }
            self.release_freed(&mut meta, strata, cache);
        }
    }

    /// The archived grains whose archiving sequence is below `through`,
    /// with that sequence.
    pub fn archives_before(&self, through: u64) -> Vec<(GrainId, u64)> {
        let meta = self.meta.lock();
        meta.archived_set
            .iter()
            .filter(|(_, &archived_by)| archived_by < through)
            .map(|(&id, &archived_by)| (id, archived_by))
            .collect()
    }

    /// No longer takes `id` as archived by `archived_by`: no
    /// `checkpoint_to` frees it.
    pub fn forget_archive(&self, id: GrainId, archived_by: u64) {
        let mut meta = self.meta.lock();
        if meta.archived_set.get(&id) == Some(&archived_by) {
            meta.archived_set.remove(&id);
        }
        if let Some(grains) = meta.archived.get_mut(&archived_by) {
            grains.retain(|grain| *grain != id);
            if grains.is_empty() {
                meta.archived.remove(&archived_by);
            }
        }
    }

    /// A WAL checkpoint starts copying the entries up to `through`: frees
    /// of blobs it may copy hold their grains until it ends (see
    /// `Meta::freed_in_wal`). Called before any blob is checked.
    pub fn checkpoint_started(&self, through: u64) {
        self.meta.lock().checkpointing_through = Some(through);
    }

    /// True if the WAL checkpoint must not copy the blob `id` written by
    /// `sequence`: it was freed while only in the WAL.
    pub fn is_superseded(&self, id: GrainId, sequence: u64) -> bool {
        self.superseded.lock().contains(&(id, sequence))
    }

    /// The WAL checkpoint made the entries up to `through` durable in the
    /// strata, the commit log and the index: their blobs are read from the
    /// strata now, their records from the commit log files.
    pub fn checkpoint_copied(&self, through: u64) {
        let mut meta = self.meta.lock();
        meta.wal_checkpointed_entry = meta.wal_checkpointed_entry.max(through);
        meta.recent = meta.recent.split_off(&through.saturating_add(1));
        let mut pending = self.pending.write();
        pending.retain(|_, p| p.sequence > through);
        self.superseded
            .lock()
            .retain(|&(_, sequence)| sequence > through);
    }

    /// The WAL checkpoint of the entries up to `through` ended (`succeeded`
    /// or not): the grains it held become freed as usual, and if it
    /// succeeded, the frees of every entry it covered are durable.
    pub fn checkpoint_finished(
        &self,
        strata: &Strata,
        cache: &BlobCache,
        through: u64,
        succeeded: bool,
    ) {
        let mut meta = self.meta.lock();
        meta.checkpointing_through = None;
        let held = std::mem::take(&mut meta.freed_in_wal);
        for (freed_by, id) in held.into_values().flatten() {
            meta.freeing.entry(freed_by).or_default().push(id);
        }
        if succeeded {
            // The strata and the index now durably hold every entry up to
            // `through`, buffered commits included: their frees are durable.
            self.frees_became_durable(&mut meta, strata, cache, |freed_by, _| freed_by <= through);
        }
        self.release_freed(&mut meta, strata, cache);
    }
}

/// Fails if the calling thread holds open a transaction (other than
/// `own`) with a sequence ≤ `through`.
fn check_not_held_by_this_thread(meta: &Meta, through: u64, own: u64) -> Result<()> {
    let me = std::thread::current().id();
    let held = meta
        .in_flight
        .range(..=through)
        .find(|(sequence, thread)| **sequence != own && **thread == me);
    match held {
        Some((&open, _)) => Err(Error::CheckpointBlockedByOwnTransaction {
            requested: through,
            open,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests;
