//! Applying one commit record to the reclamation state, and releasing
//! freed grains once nothing can still see them.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use okaywal::LogPosition;

use super::{Applied, Meta, Pending, Reclamation, UnsyncedFrees};
use crate::cache::BlobCache;
use crate::commit_record::CommitRecord;
use crate::error::{Error, Result};
use crate::grain_id::GrainId;
use crate::strata::Strata;
use crate::stratum;

impl Reclamation {
    /// Applies a committed transaction's record to the in-memory state:
    /// at commit time or while replaying the WAL (see [`Applied`]).
    pub(super) fn apply(
        &self,
        meta: &mut Meta,
        strata: &Strata,
        cache: &BlobCache,
        record: CommitRecord,
        positions: &HashMap<GrainId, LogPosition>,
        applied: Applied,
    ) -> Result<()> {
        let sequence = record.sequence.0;
        let replay = applied == Applied::Replayed;
        let buffered = applied == Applied::Buffered;
        let mut in_wal = Vec::new();
        let mut reusable = Vec::new();
        // A buffered commit's frees wait for it to be durable (see
        // `Meta::unsynced_frees`), with the sequence of each freed blob
        // that is still only in the WAL.
        let mut unsynced = Vec::new();
        {
            let mut pending = self.pending.write();
            // A WAL checkpoint may already have moved this sequence into the
            // strata (it can run while the commit waits for its sync): then
            // the WAL position is gone and the strata serve the blob.
            let in_strata = sequence <= meta.wal_checkpointed_entry;
            for grain in &record.new_grains {
                let stratum = strata.stratum_of(grain.id)?.ok_or_else(|| Error::Corrupt {
                    path: strata
                        .directory()
                        .join(stratum::file_name(grain.id.basin(), grain.id.stratum())),
                    what: format!(
                        "sequence {sequence} wrote grain {} but the stratum is missing",
                        grain.id
                    ),
                })?;
                stratum.blob_committed(grain.id.index(), grain.id.count(), replay, sequence);
                if let (false, Some(position)) = (in_strata, positions.get(&grain.id)) {
                    pending.insert(
                        grain.id,
                        Pending {
                            position: *position,
                            length: grain.length,
                            crc: grain.crc,
                            sequence,
                        },
                    );
                }
            }
            for id in &record.freed {
                if let Some(stratum) = strata.stratum_of(*id)? {
                    // The epoch moves before the removal: a reader that
                    // checked the blob was live before this point will not
                    // cache it.
                    stratum.blob_freed(id.index(), id.count());
                }
                cache.remove(*id);
                match pending.remove(id) {
                    // Not `superseded` yet: until the free is durable, a
                    // WAL checkpoint must still copy the blob into its
                    // grains, where a power cut would bring it back.
                    freed if buffered => unsynced.push((*id, freed.map(|f| f.sequence))),
                    Some(freed) => {
                        self.superseded.lock().insert((*id, freed.sequence));
                        if meta
                            .checkpointing_through
                            .is_some_and(|through| freed.sequence <= through)
                        {
                            in_wal.push((freed.sequence, *id));
                        } else {
                            reusable.push(*id);
                        }
                    }
                    None => reusable.push(*id),
                }
            }
        }
        for id in &record.archived {
            meta.claimed.remove(id);
            meta.archived_set.insert(*id, sequence);
        }
        if !record.archived.is_empty() {
            meta.archived.insert(sequence, record.archived.clone());
        }
        for id in &record.freed {
            meta.archived_set.remove(id);
        }
        if !reusable.is_empty() {
            meta.freeing.entry(sequence).or_default().extend(reusable);
        }
        if buffered {
            let order = self.buffered_applied.fetch_add(1, Ordering::AcqRel) + 1;
            if !unsynced.is_empty() {
                meta.unsynced_frees.insert(
                    sequence,
                    UnsyncedFrees {
                        order,
                        grains: unsynced,
                    },
                );
            }
        }
        for (written_by, id) in in_wal {
            meta.freed_in_wal
                .entry(written_by)
                .or_default()
                .push((sequence, id));
        }
        if let Some(header) = record.embedded_header {
            if sequence >= meta.embedded_header_sequence {
                meta.embedded_header = header;
                meta.embedded_header_sequence = sequence;
            }
        }
        if let Some(to) = record.checkpointed_to {
            // Archived entries at or below `to` were freed by this record;
            // dropping them again is harmless when replaying.
            meta.archived = meta.archived.split_off(&to.0.saturating_add(1));
            meta.checkpointed_to = meta.checkpointed_to.max(to.0);
            meta.recent = meta
                .recent
                .split_off(&meta.checkpointed_to.saturating_add(1));
        }
        meta.last_committed = meta.last_committed.max(sequence);
        if meta.in_flight.remove(&sequence).is_some() {
            self.finished.notify_all();
        }
        if sequence > meta.checkpointed_to {
            meta.recent.insert(sequence, record);
        }
        self.release_freed(meta, strata, cache);
        Ok(())
    }

    /// Hands the frees of buffered commits that are durable now (those
    /// `covered` says are: by their sequence and their
    /// [`UnsyncedFrees::order`]) on to `Meta::freeing`, where they wait
    /// as the frees of durable commits do, and releases what may be
    /// released.
    ///
    /// Their blobs that were still only in the WAL are marked
    /// `superseded` only now: until the free was durable, a WAL
    /// checkpoint had to copy them into their grains, where a power cut
    /// that took the free away would bring them back.
    pub(super) fn frees_became_durable(
        &self,
        meta: &mut Meta,
        strata: &Strata,
        cache: &BlobCache,
        covered: impl Fn(u64, u64) -> bool,
    ) {
        if meta.unsynced_frees.is_empty() {
            return;
        }
        let durable: Vec<u64> = meta
            .unsynced_frees
            .iter()
            .filter(|(sequence, frees)| covered(**sequence, frees.order))
            .map(|(sequence, _)| *sequence)
            .collect();
        if durable.is_empty() {
            return;
        }
        let mut superseded = self.superseded.lock();
        for freed_by in durable {
            let Some(frees) = meta.unsynced_frees.remove(&freed_by) else {
                continue;
            };
            for (id, written_by) in frees.grains {
                if let Some(written_by) = written_by {
                    if written_by > meta.wal_checkpointed_entry {
                        // The same rule as for a durable commit's free:
                        // a checkpoint that may have checked the blob
                        // already holds the grain until it ends.
                        superseded.insert((id, written_by));
                        if meta
                            .checkpointing_through
                            .is_some_and(|through| written_by <= through)
                        {
                            meta.freed_in_wal
                                .entry(written_by)
                                .or_default()
                                .push((freed_by, id));
                            continue;
                        }
                    }
                }
                meta.freeing.entry(freed_by).or_default().push(id);
            }
        }
        drop(superseded);
        self.release_freed(meta, strata, cache);
    }

    /// Makes freed grains reusable once every transaction with a lower
    /// sequence than the one that freed them has finished.
    ///
    /// A WAL checkpoint applies records in sequence order, so a grain may
    /// only go to a transaction whose record comes after the free: one
    /// that started earlier would have its allocation undone on disk by
    /// the free. Transactions that start from now on get higher sequences.
    /// Grains whose freed blob a running WAL checkpoint may be copying wait
    /// in `Meta::freed_in_wal` for it to end first.
    pub(super) fn release_freed(&self, meta: &mut Meta, strata: &Strata, cache: &BlobCache) {
        let through = meta.finished_through();
        while let Some(entry) = meta.freeing.first_entry() {
            if *entry.key() > through {
                break;
            }
            for id in entry.remove() {
                if let Ok(Some(stratum)) = strata.stratum_of(id) {
                    stratum.freed_grains_reusable(id.index(), id.count());
                }
                cache.remove(id);
            }
        }
    }
}
