//! Consistent reads of the reclamation state: where a blob's bytes are,
//! what `verify`, `stats` and `Database::commit_log` need, each taken
//! under the locks that make it one moment's state.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::{Pending, Reclamation};
use crate::allocator::StratumBits;
use crate::commit_record::CommitRecord;
use crate::format::BASINS;
use crate::grain_id::GrainId;
use crate::stratum::Stratum;

/// Where the bytes of a blob are, as [`Reclamation::locate`] found them.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Location {
    /// Only in the WAL.
    Wal(Pending),
    /// In its stratum, which had this `reuse_epoch` while the blob was
    /// live: if the epoch has moved since, it may have been freed.
    Stratum {
        /// The stratum's `reuse_epoch` when the blob was found live.
        epoch: u64,
    },
    /// No committed blob is there.
    Nowhere,
}

/// A live blob as [`Reclamation::describe`] found it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Described {
    /// Its bytes are only in the WAL.
    Wal {
        /// What the commit knows of it.
        pending: Pending,
        /// Whether it is archived.
        archived: bool,
    },
    /// Its bytes are in its stratum.
    Stratum {
        /// The stratum's `reuse_epoch` when the blob was found live.
        epoch: u64,
        /// Whether it is archived.
        archived: bool,
        /// The highest committed sequence then.
        last_committed: u64,
    },
    /// No committed blob is there.
    Nowhere,
}

/// One stratum's allocation state, taken at one moment by
/// [`Reclamation::stratum_snapshot`].
#[derive(Debug)]
pub(crate) struct StratumSnapshot {
    /// The stratum's `reuse_epoch` then.
    pub epoch: u64,
    /// Its bitmaps then.
    pub bits: StratumBits,
    /// Its blobs whose bytes were only in the WAL then.
    pub in_wal: HashMap<GrainId, Pending>,
}

/// The figures [`Reclamation::figures`] reports for `Database::stats`.
#[derive(Debug)]
pub(crate) struct Figures {
    /// Archived grains, per basin.
    pub archived_grains: Vec<u64>,
    /// The highest committed sequence.
    pub last_committed: u64,
    /// The highest sequence a committed `checkpoint_to` reached.
    pub checkpointed_to: u64,
    /// The last WAL entry the strata hold.
    pub wal_checkpointed_entry: u64,
}

impl Reclamation {
    /// The records of finished transactions with a sequence ≥ `since` that
    /// are not in the commit log files yet, the sequence through which
    /// every transaction has finished, and the last `checkpoint_to`.
    pub fn finished_records(&self, since: u64) -> (Vec<CommitRecord>, u64, u64) {
        let meta = self.meta.lock();
        let through = meta.finished_through();
        let recent: Vec<CommitRecord> = if since <= through {
            meta.recent
                .range(since..=through)
                .map(|(_, r)| r.clone())
                .collect()
        } else {
            Vec::new()
        };
        (recent, through, meta.checkpointed_to)
    }

    /// Where the bytes of `id` are, `stratum` being the one its id names.
    ///
    /// Under the `pending` lock a commit's blobs are both live and pending,
    /// or neither: a live blob that is not pending has its bytes in the
    /// stratum. The epoch, read under the same lock, tells whether it was
    /// freed (and maybe reused) since.
    pub fn locate(&self, id: GrainId, stratum: Option<&Stratum>) -> Location {
        let pending = self.pending.read();
        match (pending.get(&id).copied(), stratum) {
            (Some(found), _) => Location::Wal(found),
            (None, None) => Location::Nowhere,
            (None, Some(stratum)) => {
                let epoch = stratum.reuse_epoch();
                if stratum.is_live_blob(id.index(), id.count()) {
                    Location::Stratum { epoch }
                } else {
                    Location::Nowhere
                }
            }
        }
    }

    /// As [`Reclamation::locate`], with whether the blob is archived and
    /// the highest committed sequence.
    pub fn describe(&self, id: GrainId, stratum: &Stratum) -> Described {
        // Under the meta lock the archived set matches the liveness seen
        // under the `pending` lock: a commit changes both while holding it.
        let meta = self.meta.lock();
        let pending = self.pending.read();
        let archived = meta.archived_set.contains_key(&id);
        if let Some(found) = pending.get(&id) {
            return Described::Wal {
                pending: *found,
                archived,
            };
        }
        let epoch = stratum.reuse_epoch();
        if !stratum.is_live_blob(id.index(), id.count()) {
            return Described::Nowhere;
        }
        Described::Stratum {
            epoch,
            archived,
            last_committed: meta.last_committed,
        }
    }

    /// `stratum`'s epoch, bitmaps and blobs still in the WAL, read together
    /// under the `pending` lock, under which a commit makes its blobs live
    /// and pending at once.
    pub fn stratum_snapshot(&self, stratum: &Stratum) -> StratumSnapshot {
        let pending = self.pending.read();
        let epoch = stratum.reuse_epoch();
        let bits = stratum.bits_snapshot();
        let in_wal = pending
            .iter()
            .filter(|(id, _)| id.basin() == stratum.basin() && id.stratum() == stratum.number())
            .map(|(id, found)| (*id, *found))
            .collect();
        StratumSnapshot {
            epoch,
            bits,
            in_wal,
        }
    }

    /// Whether `id` is a live blob of `stratum`; `None` if the stratum's
    /// `reuse_epoch` is no longer `epoch` (liveness and epoch are read
    /// together, as a commit's free changes both).
    pub fn live_at_epoch(
        &self,
        stratum: &Stratum,
        id: GrainId,
        epoch: Option<u64>,
    ) -> Option<bool> {
        let _pending = self.pending.read();
        if epoch != Some(stratum.reuse_epoch()) {
            return None;
        }
        Some(stratum.is_live_blob(id.index(), id.count()))
    }

    /// The records of applied transactions above `after` and the last
    /// `checkpoint_to` (those in memory, then those of `from_files` not
    /// among them), with each of `strata`'s `reuse_epoch` by (basin,
    /// number), all read at one moment.
    pub fn applied_records(
        &self,
        after: u64,
        from_files: Vec<CommitRecord>,
        strata: &[Arc<Stratum>],
    ) -> (BTreeMap<u64, CommitRecord>, HashMap<(u8, u32), u64>) {
        let meta = self.meta.lock();
        // Taken with the records under the lock under which commits free
        // grains: a free after this point moves its stratum's epoch.
        let epochs = strata
            .iter()
            .map(|s| ((s.basin(), s.number()), s.reuse_epoch()))
            .collect();
        let after = after.max(meta.checkpointed_to);
        // `recent` holds the records of applied transactions (whose blobs
        // are live), in any order of commit. A WAL checkpoint can carry a
        // record into the commit log files while its transaction still
        // waits for its sync, before it is applied: such records are left
        // out.
        let mut records: BTreeMap<u64, CommitRecord> = meta
            .recent
            .range(after.saturating_add(1)..)
            .map(|(&sequence, record)| (sequence, record.clone()))
            .collect();
        let unapplied = |sequence: u64| meta.in_flight.contains_key(&sequence);
        for record in from_files {
            if record.sequence.0 > after && !unapplied(record.sequence.0) {
                records.entry(record.sequence.0).or_insert(record);
            }
        }
        (records, epochs)
    }

    /// The figures `Database::stats` reports.
    pub fn figures(&self) -> Figures {
        let meta = self.meta.lock();
        let mut archived_grains = vec![0_u64; BASINS];
        for id in meta.archived_set.keys() {
            archived_grains[usize::from(id.basin())] += u64::from(id.count());
        }
        Figures {
            archived_grains,
            last_committed: meta.last_committed,
            checkpointed_to: meta.checkpointed_to,
            wal_checkpointed_entry: meta.wal_checkpointed_entry,
        }
    }

    /// How many committed blobs have their bytes only in the WAL.
    pub fn blobs_in_wal(&self) -> usize {
        self.pending.read().len()
    }
}

#[cfg(test)]
impl Reclamation {
    /// Takes `id` as archived by `archived_by`, as a commit record read at
    /// open would.
    pub fn record_archive(&self, id: GrainId, archived_by: u64) {
        let mut meta = self.meta.lock();
        meta.archived_set.insert(id, archived_by);
        meta.archived.entry(archived_by).or_default().push(id);
    }

    /// Whether `id` is taken as archived by `archived_by`; panics if the
    /// map by sequence and the set disagree.
    pub fn is_archived_by(&self, id: GrainId, archived_by: u64) -> bool {
        let meta = self.meta.lock();
        let listed = meta
            .archived
            .get(&archived_by)
            .is_some_and(|grains| grains.contains(&id));
        let archived = meta.archived_set.get(&id) == Some(&archived_by);
        assert_eq!(listed, archived, "the map and the set agree");
        archived
    }
}
