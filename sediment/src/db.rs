//! The database: shared state, opening and recovery, reads.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::ThreadId;

use okaywal::fs::{FileHandle, FileSystem, LockGuard, OpenMode};
use okaywal::{ChunkReader, LogPosition, WriteAheadLog};
use parking_lot::{Condvar, Mutex, RwLock};

use crate::cache::BlobCache;
use crate::commit_log::CommitLogFiles;
use crate::commit_record::{CommitRecord, SequenceId};
use crate::config::Config;
use crate::error::{Context, Error, Result};
use crate::format::{
    newest, placement, stratum_capacity, GrainHeader, IndexHeader, BASINS, GRAIN_HEADER_SIZE,
    INDEX_SLOT_SIZE,
};
use crate::grain_id::GrainId;
use crate::manager::Manager;
use crate::stratum::{self, Stratum};
use crate::transaction::Transaction;
use crate::verify;
use crate::verify_report::VerifyReport;
use crate::wal_entry::skip_data_prefix;

/// The name of the index file.
pub(crate) const INDEX_FILE: &str = "index";

/// The file an open store holds locked; never read or written.
pub(crate) const LOCK_FILE: &str = "sediment.lock";

/// A committed blob whose bytes are still only in the WAL.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pending {
    /// Position of the WAL chunk; the blob follows a 9-byte prefix.
    pub position: LogPosition,
    pub length: u32,
    pub crc: u32,
    pub sequence: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Basin {
    pub strata: RwLock<Vec<Arc<Stratum>>>,
    pub grow: Mutex<()>,
}

/// Transaction bookkeeping shared by all threads.
#[derive(Debug, Default)]
pub(crate) struct Meta {
    pub embedded_header: Option<GrainId>,
    /// The sequence that set `embedded_header` (0: the index's value).
    /// Commits may finish out of sequence order, but the WAL checkpoint,
    /// replay and commit-log readers apply them in order: the highest
    /// sequence must win here too.
    pub embedded_header_sequence: u64,
    pub checkpointed_to: u64,
    pub last_committed: u64,
    /// Sequences of transactions that have started writing and not
    /// finished, with the thread that began each (a checkpoint that would
    /// wait for the calling thread's own transaction fails instead).
    pub in_flight: BTreeMap<u64, ThreadId>,
    /// Transactions waiting for their WAL entry (which may wait for the
    /// WAL's checkpoints, so no lock is held meanwhile): the lowest id each
    /// can get, with a count. Their sequences are not known yet, so nothing
    /// at or above the lowest of these counts as finished.
    pub beginning: BTreeMap<u64, usize>,
    /// Archived grains by the sequence that archived them. After a reopen
    /// this can also list grains already freed (see `taking`): a grain is
    /// archived only while `archived_set` maps it to that sequence.
    pub archived: BTreeMap<u64, Vec<GrainId>>,
    /// Archived, not yet freed, grains and the sequence that archived each.
    pub archived_set: HashMap<GrainId, u64>,
    /// Grains that running transactions are archiving.
    pub claimed: HashSet<GrainId>,
    /// Committing transactions that took archived grains to free for their
    /// `checkpoint_to`, by their sequence: the lowest archiving sequence
    /// each took. Until such a record is durable its grains are archived on
    /// disk, so another record's `checkpointed_to` (which drops the commit
    /// records up to it) stays below that sequence: if the taker then
    /// failed, a reopen would no longer know the grains are archived, and
    /// they would never be freed. That record still frees every grain it
    /// took, so it can free grains archived after its `checkpointed_to`.
    pub taking: BTreeMap<u64, u64>,
    /// Grains freed by a committed sequence, reusable once every
    /// transaction with a lower sequence has finished (see
    /// `Shared::release_freed`).
    pub freeing: BTreeMap<u64, Vec<GrainId>>,
    /// Grains freed by buffered commits that are not known to be durable
    /// yet, by the freeing sequence. A power cut may still take such a
    /// commit away, and with it the free: the grain would then hold its
    /// archived blob again, so it must keep that blob's bytes until a sync
    /// covers the free (see `Shared::frees_became_durable`).
    pub unsynced_frees: BTreeMap<u64, UnsyncedFrees>,
    /// Set while a WAL checkpoint copies the blobs of entries up to this
    /// sequence into the strata.
    pub checkpointing_through: Option<u64>,
    /// Grains whose blob that running checkpoint may be copying (it was
    /// freed while its bytes were only in the WAL, and the checkpoint
    /// checks `Shared::superseded` without a lock), by the sequence that
    /// wrote the blob: (freeing sequence, grain). They move to `freeing`
    /// when the checkpoint ends, so its copy never lands on a reused grain.
    pub freed_in_wal: BTreeMap<u64, Vec<(u64, GrainId)>>,
    /// Commit records not yet in the commit log files.
    pub recent: BTreeMap<u64, CommitRecord>,
    pub wal_checkpointed_entry: u64,
}

/// The grains one buffered commit freed, waiting for it to be durable.
#[derive(Debug)]
pub(crate) struct UnsyncedFrees {
    /// The commit's place among buffered commits (`Shared::buffered_applied`
    /// once it was applied): a durable commit or a sync that began after
    /// it was applied covers it.
    pub order: u64,
    /// Each grain, with the sequence that wrote its blob if that blob was
    /// still only in the WAL when it was freed (a WAL checkpoint may copy
    /// it into the grain until the free is made durable).
    pub grains: Vec<(GrainId, Option<u64>)>,
}

impl Meta {
    /// Every transaction with a sequence at or below this has finished.
    pub fn finished_through(&self) -> u64 {
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

/// The index file and the commit log files: written only by checkpoints.
#[derive(Debug)]
pub(crate) struct Store {
    pub index_file: Arc<dyn FileHandle>,
    pub index: IndexHeader,
    pub next_slot: usize,
    pub commit_log: CommitLogFiles,
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub directory: PathBuf,
    pub fs: Arc<dyn FileSystem>,
    pub max_blob_bytes: u64,
    pub direct_write_bytes: u64,
    pub basins: Vec<Basin>,
    pub pending: RwLock<HashMap<GrainId, Pending>>,
    /// Blobs (grain, writing sequence) that were freed while their bytes
    /// were still only in the WAL: the WAL checkpoint must not copy them
    /// into the strata, where the freed grains may already hold a newer
    /// blob. A checkpoint that started before the free may have checked
    /// already: such grains wait for it to end (`Meta::freed_in_wal`).
    pub superseded: Mutex<HashSet<(GrainId, u64)>>,
    /// Recently read small blobs.
    pub cache: BlobCache,
    pub meta: Mutex<Meta>,
    /// Signalled (with `meta`) when a transaction leaves
    /// `Meta::in_flight`; a checkpointing commit waits on it.
    pub finished: Condvar,
    /// How many buffered commits have been applied (their WAL entries
    /// handed to the OS) since the store was opened; increased under
    /// `meta`. A durable commit or a sync reads it before it begins: every
    /// buffered commit counted then is durable once it returns.
    pub buffered_applied: AtomicU64,
    pub store: Mutex<Store>,
    pub shut_down: AtomicBool,
    /// The store's one failure state, set by the first failed sync (or
    /// commit): nothing more may be acknowledged. Every later error is
    /// built from it (see `Shared::check_usable`).
    pub failure: Mutex<Option<Failure>>,
    /// Keeps other processes out of the directory while this store (or
    /// its WAL's maintenance thread) can write to it.
    pub _lock: LockGuard,
}

/// The first failure of a store: the kind of the underlying I/O error
/// (`Other` if there was none) and the whole message.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub kind: io::ErrorKind,
    pub message: String,
}

/// A crash-safe blob store. See the [crate docs](crate).
///
/// `Database` is `Send + Sync`; share it between threads by reference, in
/// an `Arc`, or by cloning it: a clone is a cheap handle to the same open
/// store. The store closes when the last handle is dropped, or for every
/// handle at once when one of them calls [`Database::shutdown`].
#[derive(Debug, Clone)]
pub struct Database {
    pub(crate) shared: Arc<Shared>,
    pub(crate) wal: Wal,
}

/// The write-ahead log under a database: open for writing, or recovered
/// read-only (see [`Config::read_only`]).
#[derive(Debug, Clone)]
pub(crate) enum Wal {
    Live(WriteAheadLog),
    ReadOnly(Arc<okaywal::ReadOnlyLog>),
}

impl Wal {
    /// The chunk at `position`.
    pub fn read_at(&self, position: LogPosition) -> io::Result<ChunkReader> {
        match self {
            Wal::Live(wal) => wal.read_at(position),
            Wal::ReadOnly(wal) => wal.read_at(position),
        }
    }

    /// The log open for writing, or [`Error::ReadOnly`].
    pub fn live(&self) -> Result<&WriteAheadLog> {
        match self {
            Wal::Live(wal) => Ok(wal),
            Wal::ReadOnly(_) => Err(Error::ReadOnly),
        }
    }
}

impl Shared {
    /// Fails if the database was shut down or hit a failed sync. After a
    /// failure the error has the first failure's I/O error kind and
    /// message (a full disk stays `StorageFull`).
    pub fn check_usable(&self) -> Result<()> {
        if self.shut_down.load(Ordering::Acquire) {
            return Err(Error::ShutDown);
        }
        if let Some(failure) = &*self.failure.lock() {
            return Err(Error::Io {
                context: "the database stopped accepting commits after a failed sync; reopen it"
                    .into(),
                source: io::Error::new(failure.kind, failure.message.clone()),
            });
        }
        Ok(())
    }

    /// Records a failed sync (unless an earlier failure is recorded): every
    /// later commit fails until reopened.
    pub fn poison(&self, err: &Error) {
        let mut failure = self.failure.lock();
        if failure.is_none() {
            let kind = match err {
                Error::Io { source, .. } => source.kind(),
                _ => io::ErrorKind::Other,
            };
            *failure = Some(Failure {
                kind,
                message: err.to_string(),
            });
        }
    }

    /// The stratum holding `id`; `Ok(None)` if that stratum does not exist,
    /// an error if the id cannot name a blob at all.
    pub fn stratum_of(&self, id: GrainId) -> Result<Option<Arc<Stratum>>> {
        let capacity = stratum_capacity(id.basin());
        if u64::from(id.index()) + u64::from(id.count()) > u64::from(capacity) {
            return Err(Error::InvalidGrainId(format!(
                "{id}: grains {}..{} are past the end of a stratum of {capacity} grains",
                id.index(),
                u64::from(id.index()) + u64::from(id.count())
            )));
        }
        let basin = &self.basins[usize::from(id.basin())];
        Ok(basin.strata.read().get(id.stratum() as usize).cloned())
    }

    /// Reserves grains for a blob of `len` bytes; `None` if no stratum
    /// has room and `may_grow` is false (otherwise a stratum is added).
    pub fn allocate(&self, len: u64, may_grow: bool) -> Result<Option<(GrainId, Arc<Stratum>)>> {
        if len > self.max_blob_bytes {
            return Err(Error::TooLarge {
                length: len,
                maximum: self.max_blob_bytes,
            });
        }
        let (basin_number, count) = placement(len).ok_or(Error::TooLarge {
            length: len,
            maximum: self.max_blob_bytes,
        })?;
        let basin = &self.basins[usize::from(basin_number)];
        let found = |strata: &[Arc<Stratum>]| {
            strata.iter().find_map(|stratum| {
                let index = stratum.bits.write().reserve(count)?;
                Some((stratum.clone(), index))
            })
        };
        let reserved = found(&basin.strata.read());
        let (stratum, index) = match reserved {
            Some(found) => found,
            None if !may_grow => return Ok(None),
            None => {
                let _grow = basin.grow.lock();
                // Another thread may have added a stratum meanwhile.
                let existing = basin.strata.read().clone();
                match found(&existing) {
                    Some(found) => found,
                    None => {
                        let number = existing.len() as u32;
                        let stratum = Arc::new(Stratum::create(
                            &*self.fs,
                            &self.directory,
                            basin_number,
                            number,
                        )?);
                        let index = stratum
                            .bits
                            .write()
                            .reserve(count)
                            .expect("a new stratum has room for any blob");
                        basin.strata.write().push(stratum.clone());
                        (stratum, index)
                    }
                }
            }
        };
        let id = GrainId::new(basin_number, stratum.number, index, count)
            .ok_or_else(|| Error::InvalidGrainId("stratum numbers exhausted".into()))?;
        Ok(Some((id, stratum)))
    }

    /// Makes reserved (never committed) grains available again.
    pub fn release(&self, id: GrainId) {
        if let Ok(Some(stratum)) = self.stratum_of(id) {
            stratum.bits.write().release(id.index(), id.count());
        }
    }

    /// True if `id` names exactly a committed blob.
    pub fn is_live(&self, id: GrainId) -> Result<bool> {
        Ok(match self.stratum_of(id)? {
            Some(stratum) => stratum.bits.read().is_live_blob(id.index(), id.count()),
            None => false,
        })
    }

    /// Applies a committed transaction's record to the in-memory state:
    /// at commit time or while replaying the WAL (see [`Applied`]).
    pub fn apply_commit(
        &self,
        meta: &mut Meta,
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
                let stratum = self.stratum_of(grain.id)?.ok_or_else(|| Error::Corrupt {
                    path: self
                        .directory
                        .join(stratum::file_name(grain.id.basin(), grain.id.stratum())),
                    what: format!(
                        "sequence {sequence} wrote grain {} but the stratum is missing",
                        grain.id
                    ),
                })?;
                let mut bits = stratum.bits.write();
                if replay {
                    bits.mark_busy(grain.id.index(), grain.id.count());
                }
                bits.set_live(grain.id.index(), grain.id.count(), true);
                drop(bits);
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
                if let Some(stratum) = self.stratum_of(*id)? {
                    stratum.bits.write().set_live(id.index(), id.count(), false);
                    // Bumped before the removal: a reader that checked the
                    // blob was live before this point will not cache it.
                    stratum.reuse_epoch.fetch_add(1, Ordering::AcqRel);
                }
                self.cache.remove(*id);
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
        self.release_freed(meta);
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
    pub fn frees_became_durable(&self, meta: &mut Meta, covered: impl Fn(u64, u64) -> bool) {
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
        self.release_freed(meta);
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
    pub fn release_freed(&self, meta: &mut Meta) {
        let through = meta.finished_through();
        while let Some(entry) = meta.freeing.first_entry() {
            if *entry.key() > through {
                break;
            }
            for id in entry.remove() {
                if let Ok(Some(stratum)) = self.stratum_of(id) {
                    stratum.reuse_epoch.fetch_add(1, Ordering::AcqRel);
                    stratum.bits.write().release(id.index(), id.count());
                }
                self.cache.remove(id);
            }
        }
    }
}

/// How a commit record reaches [`Shared::apply_commit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Applied {
    /// Replayed from the WAL at open (okaywal syncs what it recovers, so
    /// it is durable).
    Replayed,
    /// Committed with `Transaction::commit`: durable.
    Durable,
    /// Committed with `Transaction::commit_buffered`: handed to the OS,
    /// not yet known to be durable.
    Buffered,
}

/// What [`Database::open`] found before the WAL replays.
fn open_index(
    fs: &dyn FileSystem,
    directory: &Path,
    names: &[String],
    writable: bool,
) -> Result<(Arc<dyn FileHandle>, IndexHeader, usize)> {
    let path = directory.join(INDEX_FILE);
    let strata = names
        .iter()
        .filter(|n| stratum::parse_file_name(n).is_some())
        .count();
    let logs = names
        .iter()
        .filter(|n| crate::commit_log::parse_file_name(n).is_some())
        .count();
    let wal = names.iter().filter(|n| n.starts_with("wal-")).count();
    let mut exists = fs
        .exists(&path)
        .context(|| format!("checking {}", path.display()))?;
    if !writable && (!exists || !index_has_a_valid_copy(fs, &path)?) && strata + logs + wal == 0 {
        return Err(Error::Io {
            context: format!("opening the store in {} read-only", directory.display()),
            source: io::Error::new(
                io::ErrorKind::NotFound,
                "the directory holds no store (no index file)",
            ),
        });
    }
    if exists && strata + logs + wal == 0 && !index_has_a_valid_copy(fs, &path)? {
        // The index is the first file a store creates, and the only one
        // here: its creation was cut short (a file system may make the new
        // name durable before the data, e.g. when another file's sync
        // commits the journal). Nothing was ever stored; start afresh.
        fs.remove_file(&path)
            .context(|| format!("removing the unfinished {}", path.display()))?;
        exists = false;
    }
    if exists {
        let mode = if writable {
            OpenMode::ReadWrite
        } else {
            OpenMode::Read
        };
        let file = fs
            .open(&path, mode)
            .context(|| format!("opening {}", path.display()))?;
        let len = file
            .len()
            .context(|| format!("reading {}", path.display()))?;
        let mut copies = Vec::new();
        for slot in 0..2 {
            let start = slot * INDEX_SLOT_SIZE;
            let mut bytes = vec![0; len.saturating_sub(start).min(INDEX_SLOT_SIZE) as usize];
            file.read_exact_at(&mut bytes, start)
                .context(|| format!("reading {}", path.display()))?;
            copies.push(IndexHeader::decode(&bytes));
        }
        let second = copies.pop().expect("two");
        let first = copies.pop().expect("two");
        let copies = [first.clone(), second.clone()];
        let (slot, header) =
            newest(first, second, |h| h.generation).map_err(|(a, b)| Error::Corrupt {
                path: path.clone(),
                what: format!("both index header copies are invalid ({a}; {b})"),
            })?;
        if writable && copies[1 - slot].as_ref() != Ok(&header) {
            // A checkpoint leaves both copies alike, so the other one was
            // being written when a crash hit, or has decayed since: make it
            // a copy of the good one again.
            file.write_all_at(&header.encode(), (1 - slot as u64) * INDEX_SLOT_SIZE)
                .and_then(|()| file.sync_data())
                .context(|| format!("repairing a header copy of {}", path.display()))?;
        }
        Ok((file, header, 1 - slot))
    } else {
        // The index is created, synced and named in the directory before any
        // stratum or commit log file exists, so finding those without it is
        // damage. A fresh index would forget the embedded header and every
        // checkpointed strata count; refuse instead.
        if strata + logs > 0 {
            return Err(Error::Corrupt {
                path,
                what: format!(
                    "the index file is missing, but the directory holds {strata} stratum \
                     and {logs} commit log files"
                ),
            });
        }
        let file = fs
            .open(&path, OpenMode::CreateNew)
            .context(|| format!("creating {}", path.display()))?;
        let header = IndexHeader {
            generation: 1,
            ..IndexHeader::default()
        };
        file.write_all_at(&header.encode(), 0)
            .and_then(|()| file.sync_data())
            .and_then(|()| fs.sync_dir(directory))
            .context(|| format!("initializing {}", path.display()))?;
        Ok((file, header, 1))
    }
}

/// Whether either copy of the index header at `path` decodes.
fn index_has_a_valid_copy(fs: &dyn FileSystem, path: &Path) -> Result<bool> {
    let file = fs
        .open(path, OpenMode::Read)
        .context(|| format!("opening {}", path.display()))?;
    let len = file
        .len()
        .context(|| format!("reading {}", path.display()))?;
    for slot in 0..2 {
        let start = slot * INDEX_SLOT_SIZE;
        let mut bytes = vec![0; len.saturating_sub(start).min(INDEX_SLOT_SIZE) as usize];
        file.read_exact_at(&mut bytes, start)
            .context(|| format!("reading {}", path.display()))?;
        if IndexHeader::decode(&bytes).is_ok() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Opens every stratum file, in order, per basin; `known` is the index's
/// count of strata per basin that had a durable header.
fn open_strata(
    fs: &dyn FileSystem,
    directory: &Path,
    names: &[String],
    known: &[u32; BASINS],
    writable: bool,
) -> Result<Vec<Basin>> {
    let mut numbers: Vec<Vec<u32>> = vec![Vec::new(); BASINS];
    for (basin, number) in names.iter().filter_map(|n| stratum::parse_file_name(n)) {
        if usize::from(basin) < BASINS {
            numbers[usize::from(basin)].push(number);
        }
    }
    let mut basins = Vec::with_capacity(BASINS);
    for (basin, mut numbers) in numbers.into_iter().enumerate() {
        numbers.sort_unstable();
        let mut strata = Vec::with_capacity(numbers.len());
        for (expected, number) in numbers.into_iter().enumerate() {
            let basin = basin as u8;
            if number != expected as u32 {
                return Err(Error::Corrupt {
                    path: directory.join(stratum::file_name(basin, expected as u32)),
                    what: format!("stratum file is missing (stratum {number} exists)"),
                });
            }
            let is_known = number < known[usize::from(basin)];
            strata.push(Arc::new(open_stratum(
                fs, directory, basin, number, is_known, writable,
            )?));
        }
        let listed = known[basin];
        if (strata.len() as u64) < u64::from(listed) {
            return Err(Error::Corrupt {
                path: directory.join(stratum::file_name(basin as u8, strata.len() as u32)),
                what: format!(
                    "stratum file is missing (the index lists {listed} strata of basin {basin})"
                ),
            });
        }
        basins.push(Basin {
            strata: RwLock::new(strata),
            grow: Mutex::new(()),
        });
    }
    Ok(basins)
}

/// Opens one stratum; `known` says the index lists it as created.
fn open_stratum(
    fs: &dyn FileSystem,
    directory: &Path,
    basin: u8,
    number: u32,
    known: bool,
    writable: bool,
) -> Result<Stratum> {
    match Stratum::open(fs, directory, basin, number, writable) {
        Err(Error::Corrupt { path, what }) if !known => {
            // A stratum whose creation was cut short before its header was
            // synced holds no grains yet; one with grains is really damaged.
            // (A stratum the index knows had a durable header once, so a
            // short file there is damage, not a crash: see FORMAT.md.)
            let len = fs
                .open(&path, OpenMode::Read)
                .and_then(|f| f.len())
                .context(|| format!("reading {}", path.display()))?;
            if len <= 2 * crate::format::stratum_slot_size(basin) {
                if writable {
                    Stratum::create(fs, directory, basin, number)
                } else {
                    Stratum::unfinished(fs, directory, basin, number)
                }
            } else {
                Err(Error::Corrupt { path, what })
            }
        }
        other => other,
    }
}

impl Database {
    /// Opens (creating or recovering) the database in `directory` with the
    /// default [`Config`].
    pub fn recover<P: AsRef<Path>>(directory: P) -> Result<Self> {
        Config::for_directory(directory).open()
    }

    /// A database that lives in memory only, for tests and scratch data.
    ///
    /// # Panics
    ///
    /// Never in practice: the in-memory file system cannot fail.
    #[must_use]
    pub fn in_memory() -> Self {
        Config::for_directory("/sediment")
            .file_system(okaywal::fs::MemoryFileSystem::new())
            .open()
            .expect("an in-memory database always opens")
    }

    /// Opens the database in `directory` read-only with the default
    /// [`Config`] (see [`Config::read_only`]): nothing is written, any
    /// number of read-only opens may run at once, and none while the store
    /// is open for writing.
    pub fn open_read_only<P: AsRef<Path>>(directory: P) -> Result<Self> {
        Config::for_directory(directory).read_only(true).open()
    }

    pub(crate) fn open(config: Config) -> Result<Self> {
        let fs = config.file_system.clone();
        let directory = config.directory.clone();
        let writable = !config.read_only;
        let lock = if writable {
            okaywal::fs::create_dir_durably(&*fs, &directory)
                .context(|| format!("creating {}", directory.display()))?;
            // Before anything is read: open repairs and removes files.
            fs.lock_exclusive(&directory.join(LOCK_FILE))
        } else {
            fs.lock_shared(&directory.join(LOCK_FILE))
        }
        .context(|| format!("opening the store in {}", directory.display()))?;
        let names = fs
            .list_files(&directory)
            .context(|| format!("listing {}", directory.display()))?;
        let (index_file, index, next_slot) = open_index(&*fs, &directory, &names, writable)?;
        let wal_floor = index.wal_checkpointed_entry;
        let basins = open_strata(&*fs, &directory, &names, &index.strata, writable)?;
        let mut commit_log = CommitLogFiles::open(
            &directory,
            fs.clone(),
            &names,
            index.commit_log_file,
            index.commit_log_end,
            writable,
        )?;

        let mut meta = Meta {
            embedded_header: index.embedded_header,
            checkpointed_to: index.checkpointed_to,
            last_committed: index.last_committed,
            wal_checkpointed_entry: index.wal_checkpointed_entry,
            ..Meta::default()
        };
        // The commit log is read for the grains archived since the last
        // `checkpoint_to` (everything else it holds is in the index and the
        // strata). Damaged records are skipped; see
        // `forget_unprovable_archives` for what that costs.
        let contents = commit_log.read(
            index.checkpointed_to.saturating_add(1),
            index.last_committed,
        )?;
        let hidden_through = contents
            .damage
            .iter()
            .map(|damage| damage.last.0)
            .filter(|&last| last > index.checkpointed_to)
            .max();
        for record in contents.records {
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

        let shared = Arc::new(Shared {
            directory: directory.clone(),
            fs: fs.clone(),
            max_blob_bytes: config.max_blob_bytes,
            direct_write_bytes: config.direct_write_bytes,
            basins,
            pending: RwLock::default(),
            superseded: Mutex::default(),
            cache: BlobCache::new(config.cache_bytes),
            meta: Mutex::new(meta),
            finished: Condvar::new(),
            buffered_applied: AtomicU64::new(0),
            store: Mutex::new(Store {
                index_file,
                index,
                next_slot,
                commit_log,
            }),
            shut_down: AtomicBool::new(false),
            failure: Mutex::new(None),
            _lock: lock,
        });
        // `Config::open` checked that the WAL's directory and file system
        // are the database's.
        let wal_config = config.wal;
        // Sequences are WAL entry ids: never hand out one the strata have
        // already seen, whatever happened to the WAL's files (and never one
        // below a floor the configuration asks for).
        let floor = wal_floor
            .saturating_add(1)
            .max(wal_config.minimum_next_entry_id);
        let wal_config = wal_config.minimum_next_entry_id(floor);
        let wal = if writable {
            wal_config.open(Manager::new(shared.clone())).map(Wal::Live)
        } else {
            wal_config
                .open_read_only(Manager::new(shared.clone()))
                .map(|wal| Wal::ReadOnly(Arc::new(wal)))
        }
        .context(|| "opening the write-ahead log".to_string())?;
        let db = Self { shared, wal };
        if let Some(through) = hidden_through {
            db.forget_unprovable_archives(through);
        }
        Ok(db)
    }

    /// After damage hid the commit records of sequences up to `through`
    /// (and after the WAL replay, so that blobs still in the WAL count): a
    /// hidden record may have freed grains that a readable record before it
    /// archived, and their space may hold a newer blob by now. So an
    /// archived grain whose archiving sequence is below `through` stays
    /// archived only if the blob there is provably the one that was
    /// archived: live, written before the archiving sequence, and reading
    /// back with its checksum. Any other grain is no longer taken as
    /// archived, so no `checkpoint_to` frees it: its space is kept rather
    /// than risk freeing a newer blob. Grains that hidden records archived
    /// stay live and unarchived the same way (see FORMAT.md).
    fn forget_unprovable_archives(&self, through: u64) {
        let candidates: Vec<(GrainId, u64)> = {
            let meta = self.shared.meta.lock();
            meta.archived_set
                .iter()
                .filter(|(_, &archived_by)| archived_by < through)
                .map(|(&id, &archived_by)| (id, archived_by))
                .collect()
        };
        for (id, archived_by) in candidates {
            let provable = match self.read(id) {
                Ok(Some(mut reader)) => {
                    reader.sequence().0 < archived_by
                        && io::copy(&mut reader, &mut io::sink()).is_ok()
                }
                Ok(None) | Err(_) => false,
            };
            if provable {
                continue;
            }
            let mut meta = self.shared.meta.lock();
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
    }

    fn check_open(&self) -> Result<()> {
        if self.shared.shut_down.load(Ordering::Acquire) {
            Err(Error::ShutDown)
        } else {
            Ok(())
        }
    }

    /// Begins a transaction. Many may run at once, from many threads.
    /// Fails with [`Error::ReadOnly`] on a store opened read-only.
    pub fn begin_transaction(&self) -> Result<Transaction<'_>> {
        self.check_open()?;
        self.wal.live()?;
        Ok(Transaction::new(self))
    }

    /// Returns the blob stored at `id`, or `None` if no committed blob is
    /// there (never written, or freed by a checkpoint).
    ///
    /// Fails with [`Error::InvalidGrainId`] for ids that cannot name a blob
    /// and [`Error::ChecksumMismatch`] if the stored bytes are damaged.
    pub fn get(&self, id: GrainId) -> Result<Option<Vec<u8>>> {
        self.check_open()?;
        let shared = &self.shared;
        // Only live blobs are ever cached, and freeing removes them.
        if let Some(hit) = shared.cache.get(id) {
            return Ok(Some(hit.to_vec()));
        }
        // Read before the liveness check inside `read`: if the blob is
        // freed after that check, the epoch moves and it is not cached.
        let epoch = shared
            .stratum_of(id)?
            .map(|stratum| (stratum.reuse_epoch.load(Ordering::Acquire), stratum));
        match self.read(id)? {
            Some(mut reader) => {
                let mut data = Vec::with_capacity(reader.len() as usize);
                reader.read_to_end(&mut data).map_err(|e| reader.error(e))?;
                if let Some((epoch, stratum)) = epoch {
                    shared.cache.insert_if(id, &data, || {
                        stratum.reuse_epoch.load(Ordering::Acquire) == epoch
                    });
                }
                Ok(Some(data))
            }
            None => Ok(None),
        }
    }

    /// Like [`Database::get`], but returns a reader that streams the blob
    /// (and checks its CRC when it reaches the end), for large blobs.
    pub fn read(&self, id: GrainId) -> Result<Option<GrainReader>> {
        self.check_open()?;
        // A blob's bytes move from the WAL to its stratum at checkpoints and
        // freed grains may be reused; retry if either happens mid-lookup.
        for _ in 0..16 {
            let stratum = self.shared.stratum_of(id)?;
            // Under the `pending` lock a commit's blobs are both live and
            // pending, or neither: a live blob that is not pending has its
            // bytes in the stratum. The epoch, read under the same lock,
            // tells whether it was freed (and maybe reused) since.
            let (pending, epoch) = {
                let pending = self.shared.pending.read();
                match (pending.get(&id).copied(), &stratum) {
                    (Some(found), _) => (Some(found), 0),
                    (None, None) => return Ok(None),
                    (None, Some(stratum)) => {
                        let epoch = stratum.reuse_epoch.load(Ordering::Acquire);
                        if !stratum.bits.read().is_live_blob(id.index(), id.count()) {
                            return Ok(None);
                        }
                        (None, epoch)
                    }
                }
            };
            if let Some(pending) = pending {
                match self.wal.read_at(pending.position) {
                    Ok(mut chunk) => {
                        skip_data_prefix(&mut chunk)
                            .context(|| format!("reading grain {id} from the WAL"))?;
                        return Ok(Some(GrainReader::wal(id, chunk, pending)));
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e).context(|| format!("reading grain {id} from the WAL")),
                }
            }
            let Some(stratum) = stratum else {
                return Ok(None);
            };
            let read = GrainReader::stratum(id, &stratum);
            if stratum.reuse_epoch.load(Ordering::Acquire) == epoch {
                return read.map(Some);
            }
        }
        Err(Error::Io {
            context: format!("reading grain {id}"),
            source: io::Error::other("the grain kept moving while being read"),
        })
    }

    /// The embedded header (a root pointer for structures built on top):
    /// the one set by the committed transaction with the highest sequence
    /// among those that set it (see
    /// [`Transaction::set_embedded_header`](crate::Transaction::set_embedded_header)).
    #[must_use]
    pub fn embedded_header(&self) -> Option<GrainId> {
        self.shared.meta.lock().embedded_header
    }

    /// The highest sequence checkpointed to by a committed `checkpoint_to`
    /// (0 before any).
    ///
    /// A transaction's `checkpoint_to` may stop short of the sequence it was
    /// given, just below the grains another transaction took for its own
    /// checkpoint while committing at the same time; those grains are freed
    /// by that transaction or, if it fails, by a later checkpoint.
    #[must_use]
    pub fn checkpointed_to(&self) -> SequenceId {
        SequenceId(self.shared.meta.lock().checkpointed_to)
    }

    /// The highest committed sequence (0 for an empty database).
    ///
    /// A sequence is committed once its transaction's changes are visible,
    /// just before its [`commit`](crate::Transaction::commit) or
    /// [`commit_buffered`](crate::Transaction::commit_buffered) returns it;
    /// so this is at least every sequence any commit has returned, on any
    /// thread. A sequence `commit` returned is durable; one
    /// `commit_buffered` returned may still be lost to a power loss (with
    /// every commit after it) until a durable commit or
    /// [`Database::sync`] that began after it returns. After a reopen this
    /// is the highest sequence that survived. Transactions with lower sequences may still
    /// be running (sequences are handed out when transactions start
    /// writing, and commits return in any order). Every sequence up to this
    /// one is accepted by
    /// [`checkpoint_to`](crate::Transaction::checkpoint_to), which waits
    /// for those transactions when it commits.
    #[must_use]
    pub fn last_committed(&self) -> SequenceId {
        SequenceId(self.shared.meta.lock().last_committed)
    }

    /// The commit records with a sequence ≥ `since`, in sequence order, up
    /// to the point through which every transaction has finished (so a
    /// reader never sees a gap that fills in later). Records at or below
    /// [`Database::checkpointed_to`] have been dropped.
    ///
    /// Transactions committed with
    /// [`commit_buffered`](crate::Transaction::commit_buffered) are listed
    /// as soon as they are visible, before they are durable: until a
    /// durable commit or [`Database::sync`] that began after them returns,
    /// a power loss may still take them away (only as a suffix of the
    /// commits), and a reopened store then no longer lists them.
    ///
    /// If commit log bytes are damaged and hide records with sequences
    /// ≥ `since`, the call fails with [`Error::CommitLogDamaged`] naming the
    /// file, the offset and the sequences whose records cannot be read
    /// (`first..=last`): it never skips records silently. The records after
    /// the damage are read with a call from `last + 1`; the hidden ones are
    /// lost to readers (a replica needs the state they changed from
    /// elsewhere). The damage is reported until a `checkpoint_to` at or past
    /// `last` drops those records. The blobs are not affected: the store
    /// opens and serves them as usual.
    pub fn commit_log(&self, since: SequenceId) -> Result<CommitLog> {
        self.check_open()?;
        let (recent, through, checkpointed_to) = {
            let meta = self.shared.meta.lock();
            let through = meta.finished_through();
            let recent: Vec<CommitRecord> = if since.0 <= through {
                meta.recent
                    .range(since.0..=through)
                    .map(|(_, r)| r.clone())
                    .collect()
            } else {
                Vec::new()
            };
            (recent, through, meta.checkpointed_to)
        };
        let from = since.0.max(checkpointed_to.saturating_add(1));
        let contents = {
            let mut store = self.shared.store.lock();
            let last_written = store.index.last_committed;
            store.commit_log.read(from, last_written)?
        };
        let mut records: BTreeMap<u64, CommitRecord> = contents
            .records
            .into_iter()
            .filter(|r| r.sequence.0 <= through)
            .map(|r| (r.sequence.0, r))
            .collect();
        for record in recent {
            if record.sequence.0 >= from {
                records.insert(record.sequence.0, record);
            }
        }
        // Damage in the range asked for is an error: the records it hid
        // cannot be returned, and returning the others as if they were all
        // would let a follower skip them unknowingly.
        let damage = contents
            .damage
            .into_iter()
            .filter(|damage| damage.last.0 >= from && damage.first.0 <= through)
            .min_by_key(|damage| damage.first);
        if let Some(mut damage) = damage {
            // Records at or below the checkpoint are dropped, not lost.
            damage.first = damage
                .first
                .max(SequenceId(checkpointed_to.saturating_add(1)));
            return Err(Error::CommitLogDamaged(damage));
        }
        Ok(CommitLog {
            records: records.into_values().collect::<Vec<_>>().into_iter(),
        })
    }

    /// Checks every header, allocation, grain checksum and commit record,
    /// and that each blob a commit record (after the last `checkpoint_to`)
    /// lists as written, and no later record frees, is allocated and holds
    /// the length and CRC the record lists. Damaged commit log bytes are
    /// problems too (see [`VerifyReport::commit_log_damage`]).
    /// Returns `Ok(report)` when nothing is wrong and
    /// [`Error::Verification`] listing each problem (with its grain, file
    /// and offset) otherwise.
    pub fn verify(&self) -> Result<VerifyReport> {
        let report = self.verify_report(|_, _| {})?;
        if report.is_ok() {
            Ok(report)
        } else {
            Err(Error::Verification(report))
        }
    }

    /// Like [`Database::verify`] but returns the report even when it lists
    /// problems, calling `progress(done, total)` (in grains) as it goes.
    pub fn verify_report(&self, progress: impl FnMut(u64, u64)) -> Result<VerifyReport> {
        self.check_open()?;
        verify::verify(self, progress)
    }

    /// Space and allocation figures per basin, and the WAL's files.
    pub fn stats(&self) -> Result<crate::Stats> {
        self.check_open()?;
        crate::stats::collect(self)
    }

    /// Makes every transaction whose commit returned before this call
    /// durable, [`commit_buffered`](crate::Transaction::commit_buffered)
    /// ones included, and returns [`Database::last_committed`] as it was
    /// when the call began: a sequence at or above every sequence a commit
    /// returned before the call, on any thread. Once this returns `Ok`, a
    /// power loss takes away none of those transactions. (Transactions
    /// with lower sequences may still have been running; they are durable
    /// once their own commits, or a later sync, return.)
    ///
    /// It costs one `fdatasync` of the WAL, shared with concurrent commits,
    /// or nothing if everything was synced already. Blobs written straight
    /// into their grains need no sync here: every commit syncs them before
    /// it returns. Grains freed by buffered commits this sync covers
    /// become reusable.
    ///
    /// A failed sync stops the store from acknowledging anything more, as
    /// a failed commit does. Fails with [`Error::ReadOnly`] on a store
    /// opened read-only.
    pub fn sync(&self) -> Result<SequenceId> {
        self.check_open()?;
        let wal = self.wal.live()?;
        self.sync_wal(wal)
    }

    fn sync_wal(&self, wal: &WriteAheadLog) -> Result<SequenceId> {
        let shared = &self.shared;
        shared.check_usable()?;
        let (buffered_before, last_committed) = {
            // Read together: every commit counted in `last_committed` was
            // applied, and so counted in `buffered_applied` if buffered.
            let meta = shared.meta.lock();
            (
                shared.buffered_applied.load(Ordering::Acquire),
                meta.last_committed,
            )
        };
        if let Err(err) = wal
            .sync()
            .context(|| "syncing the write-ahead log".to_string())
        {
            shared.poison(&err);
            return Err(err);
        }
        let mut meta = shared.meta.lock();
        shared.frees_became_durable(&mut meta, |_, order| order <= buffered_before);
        Ok(SequenceId(last_committed))
    }

    /// Syncs the WAL if grains freed by buffered commits wait for it, so
    /// that they become reusable; returns whether it synced. Called before
    /// a stratum is added: the store grows only if the grains it already
    /// has cannot be reused.
    pub(crate) fn sync_for_space(&self) -> Result<bool> {
        let wal = self.wal.live()?;
        if self.shared.meta.lock().unsynced_frees.is_empty() {
            return Ok(false);
        }
        self.sync_wal(wal)?;
        Ok(true)
    }

    /// The directory of the database.
    #[must_use]
    pub fn directory(&self) -> &Path {
        &self.shared.directory
    }

    /// Moves everything the write-ahead log holds into the strata, the
    /// commit log and the index now (as a shutdown does, and as happens by
    /// itself whenever a WAL segment fills), and returns once it is done.
    ///
    /// Do not call it while this thread has a transaction open: the
    /// checkpoint would wait for it.
    pub fn checkpoint_wal(&self) -> Result<()> {
        self.check_open()?;
        self.wal
            .live()?
            .checkpoint_active()
            .context(|| "checkpointing the write-ahead log".to_string())
    }

    /// The write-ahead log's counters (commits, syncs, bytes, segments);
    /// `None` for a store open read-only.
    #[must_use]
    pub fn wal_stats(&self) -> Option<okaywal::LogStats> {
        self.wal.live().ok().map(WriteAheadLog::stats)
    }

    /// True if the store was opened read-only.
    #[must_use]
    pub fn is_read_only(&self) -> bool {
        matches!(self.wal, Wal::ReadOnly(_))
    }

    /// The live blobs (committed and not freed, archived or not), in id
    /// order: for each its id, length, the sequence that wrote it and
    /// whether it is archived. Blobs whose bytes are still only in the WAL
    /// are listed with the others.
    ///
    /// The listing is lazy: it walks each stratum's allocation bitmap from
    /// where it left off and reads one grain header (16 bytes) per blob,
    /// so it needs no memory per blob. Other threads may write meanwhile:
    /// a blob committed or freed while the listing runs may or may not be
    /// listed, and every item describes a blob as it was when read.
    ///
    /// An item is an error when that blob's header cannot be read or is
    /// damaged ([`Error::ChecksumMismatch`]; only the header is checked,
    /// [`Database::verify`] checks the data too); the listing goes on with
    /// the next blob. If the store is shut down meanwhile, the last item
    /// is [`Error::ShutDown`].
    ///
    /// ```rust
    /// # fn main() -> sediment::Result<()> {
    /// let db = sediment::Database::in_memory();
    /// let mut tx = db.begin_transaction()?;
    /// let id = tx.write(b"found again")?;
    /// tx.commit()?;
    /// let listed: Vec<sediment::GrainInfo> = db.grains()?.collect::<Result<_, _>>()?;
    /// assert_eq!(listed.len(), 1);
    /// assert_eq!((listed[0].id, listed[0].length), (id, 11));
    /// # Ok(())
    /// # }
    /// ```
    pub fn grains(&self) -> Result<crate::Grains<'_>> {
        self.check_open()?;
        Ok(crate::Grains::new(self))
    }

    /// Closes the database for every handle: later calls on any clone fail
    /// with [`Error::ShutDown`], and so does a second `shutdown`.
    ///
    /// New transactions and commits are refused first. Then everything in
    /// the WAL is moved into the strata, unless transactions begun on other
    /// handles are still open (their WAL entries would hold that checkpoint
    /// up for as long as they stay open): the WAL is then left as it is and
    /// replayed at the next open, and those transactions can no longer
    /// commit. Last, the WAL is synced and closed.
    pub fn shutdown(self) -> Result<()> {
        if self.shared.shut_down.swap(true, Ordering::AcqRel) {
            return Err(Error::ShutDown);
        }
        let Wal::Live(wal) = &self.wal else {
            // A read-only store has nothing to move or sync.
            return Ok(());
        };
        let open_transactions = {
            let meta = self.shared.meta.lock();
            !meta.in_flight.is_empty() || !meta.beginning.is_empty()
        };
        let checkpoint = if open_transactions {
            Ok(())
        } else {
            wal.checkpoint_active()
                .context(|| "checkpointing the WAL at shutdown".to_string())
        };
        let shutdown = wal
            .shutdown()
            .context(|| "shutting down the WAL".to_string());
        checkpoint.and(shutdown)
    }
}

/// The commit records returned by [`Database::commit_log`], in sequence
/// order.
#[derive(Debug)]
pub struct CommitLog {
    records: std::vec::IntoIter<CommitRecord>,
}

impl Iterator for CommitLog {
    type Item = CommitRecord;

    fn next(&mut self) -> Option<CommitRecord> {
        self.records.next()
    }
}

/// Streams one blob; the CRC is checked when the end is reached, and a
/// mismatch is reported as an `InvalidData` error from `read`.
#[derive(Debug)]
pub struct GrainReader {
    id: GrainId,
    source: Source,
    length: u32,
    remaining: u32,
    sequence: u64,
    expected_crc: u32,
    hasher: crc32fast::Hasher,
    location: (PathBuf, u64),
}

#[derive(Debug)]
enum Source {
    Wal(ChunkReader),
    Stratum {
        file: Arc<dyn FileHandle>,
        next: u64,
        /// The first bytes of the blob, read with the header.
        head: Vec<u8>,
    },
}

impl GrainReader {
    fn wal(id: GrainId, chunk: ChunkReader, pending: Pending) -> Self {
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&pending.sequence.to_le_bytes());
        hasher.update(&pending.length.to_le_bytes());
        let position = chunk.position();
        Self {
            id,
            source: Source::Wal(chunk),
            length: pending.length,
            remaining: pending.length,
            sequence: pending.sequence,
            expected_crc: pending.crc,
            hasher,
            location: (
                PathBuf::from(format!("wal-{}", position.file_id)),
                position.offset,
            ),
        }
    }

    fn stratum(id: GrainId, stratum: &Stratum) -> Result<Self> {
        let offset = stratum.offset_of(id.index());
        let capacity = u64::from(id.count()) * stratum.grain_size();
        // One read covers the header and, for small blobs, all the data.
        let first_read = capacity.min(64 * 1024) as usize;
        let mut head = vec![0; first_read];
        let mut filled = 0;
        while filled < head.len() {
            let n = stratum
                .file
                .read_at(&mut head[filled..], offset + filled as u64)
                .context(|| format!("reading grain {id} from {}", stratum.path.display()))?;
            if n == 0 {
                break;
            }
            filled += n;
        }
        head.truncate(filled);
        let mismatch = || Error::ChecksumMismatch {
            grain: id,
            path: stratum.path.clone(),
            offset,
        };
        let header = GrainHeader::decode(&head).ok_or_else(mismatch)?;
        // The header's length must be one that this exact extent holds.
        if placement(u64::from(header.length)) != Some((id.basin(), id.count())) {
            return Err(mismatch());
        }
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&header.sequence.to_le_bytes());
        hasher.update(&header.length.to_le_bytes());
        head.drain(..GRAIN_HEADER_SIZE);
        head.truncate(header.length as usize);
        Ok(Self {
            id,
            source: Source::Stratum {
                file: stratum.file.clone(),
                next: offset + GRAIN_HEADER_SIZE as u64 + head.len() as u64,
                head,
            },
            length: header.length,
            remaining: header.length,
            sequence: header.sequence,
            expected_crc: header.crc,
            hasher,
            location: (stratum.path.clone(), offset),
        })
    }

    /// The blob's id.
    #[must_use]
    pub fn id(&self) -> GrainId {
        self.id
    }

    /// The blob's length in bytes.
    #[must_use]
    pub fn len(&self) -> u64 {
        u64::from(self.length)
    }

    /// True for a zero-length blob.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    /// The sequence of the transaction that wrote the blob.
    #[must_use]
    pub fn sequence(&self) -> SequenceId {
        SequenceId(self.sequence)
    }

    /// Turns a read error into the crate's error type, recognising CRC
    /// mismatches.
    pub(crate) fn error(&self, err: io::Error) -> Error {
        if err.kind() == io::ErrorKind::InvalidData {
            Error::ChecksumMismatch {
                grain: self.id,
                path: self.location.0.clone(),
                offset: self.location.1,
            }
        } else {
            Error::Io {
                context: format!("reading grain {}", self.id),
                source: err,
            }
        }
    }
}

impl GrainReader {
    fn checksum_error(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "grain {} failed its checksum ({}, offset {})",
                self.id,
                self.location.0.display(),
                self.location.1
            ),
        )
    }
}

impl Read for GrainReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.remaining == 0 {
            // An empty blob has no data to hash on the way: check its CRC
            // (over sequence and length) here.
            if self.length == 0 && self.hasher.clone().finalize() != self.expected_crc {
                return Err(self.checksum_error());
            }
            return Ok(0);
        }
        let wanted = buf.len().min(self.remaining as usize);
        let n = match &mut self.source {
            Source::Wal(chunk) => chunk.read(&mut buf[..wanted])?,
            Source::Stratum { file, next, head } => {
                if head.is_empty() {
                    let n = file.read_at(&mut buf[..wanted], *next)?;
                    *next += n as u64;
                    n
                } else {
                    let n = wanted.min(head.len());
                    buf[..n].copy_from_slice(&head[..n]);
                    head.drain(..n);
                    n
                }
            }
        };
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("grain {} ends early", self.id),
            ));
        }
        self.hasher.update(&buf[..n]);
        self.remaining -= n as u32;
        if self.remaining == 0 && self.hasher.clone().finalize() != self.expected_crc {
            return Err(self.checksum_error());
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What open concludes when damage hid the commit records up to
    /// `through`: `meta` says `id` was archived by `archived_by`, as a
    /// readable record said, but a hidden record may have freed it since.
    fn provable_after_damage(
        db: &Database,
        id: GrainId,
        archived_by: SequenceId,
        through: SequenceId,
    ) -> bool {
        {
            let mut meta = db.shared.meta.lock();
            meta.archived_set.insert(id, archived_by.0);
            meta.archived.entry(archived_by.0).or_default().push(id);
        }
        db.forget_unprovable_archives(through.0);
        let meta = db.shared.meta.lock();
        let listed = meta
            .archived
            .get(&archived_by.0)
            .is_some_and(|grains| grains.contains(&id));
        let archived = meta.archived_set.get(&id) == Some(&archived_by.0);
        assert_eq!(listed, archived, "the map and the set agree");
        archived
    }

    #[test]
    fn a_full_basin_syncs_to_reuse_grains_freed_by_buffered_commits_before_it_grows() {
        let db = Database::in_memory();
        let data = [7_u8; 100];
        let mut tx = db.begin_transaction().unwrap();
        let old = tx.write(&data).unwrap();
        tx.commit().unwrap();
        let mut tx = db.begin_transaction().unwrap();
        tx.archive(old).unwrap();
        let archived = tx.commit().unwrap();
        let mut tx = db.begin_transaction().unwrap();
        tx.checkpoint_to(archived).unwrap();
        tx.commit_buffered().unwrap();
        // Fill every other grain of the blob's stratum.
        let basin = &db.shared.basins[usize::from(old.basin())];
        let stratum = basin.strata.read()[0].clone();
        while stratum.bits.write().reserve(1).is_some() {}
        assert!(!db.shared.meta.lock().unsynced_frees.is_empty());
        let syncs = db.wal_stats().unwrap().syncs;

        let mut tx = db.begin_transaction().unwrap();
        let new = tx.write(&data).unwrap();
        tx.commit_buffered().unwrap();
        assert_eq!(new, old, "the freed grains are reused after a sync");
        assert_eq!(basin.strata.read().len(), 1, "no stratum was added");
        assert!(db.wal_stats().unwrap().syncs > syncs);
        assert!(db.shared.meta.lock().unsynced_frees.is_empty());

        // With nothing waiting for a sync, a full basin grows.
        let mut tx = db.begin_transaction().unwrap();
        let grown = tx.write(&data).unwrap();
        tx.commit_buffered().unwrap();
        assert_eq!(grown.stratum(), 1);
        assert_eq!(db.get(new).unwrap().as_deref(), Some(&data[..]));
    }

    #[test]
    fn archives_a_hidden_record_may_have_freed_are_kept_only_when_provable() {
        let db = Database::in_memory();
        let mut tx = db.begin_transaction().unwrap();
        let first = tx.write(b"0123456789").unwrap();
        let second = tx.write(b"9876543210").unwrap();
        tx.commit().unwrap();
        let mut tx = db.begin_transaction().unwrap();
        tx.archive(first).unwrap();
        tx.archive(second).unwrap();
        let archived_by = tx.commit().unwrap();
        // The free that damage would hide, then a blob of the same size in
        // one of the freed grains.
        let mut tx = db.begin_transaction().unwrap();
        tx.checkpoint_to(archived_by).unwrap();
        let freeing = tx.commit().unwrap();
        let mut tx = db.begin_transaction().unwrap();
        let newer = tx.write(b"abcdefghij").unwrap();
        tx.commit().unwrap();
        let left_free = match newer {
            id if id == first => second,
            id if id == second => first,
            other => panic!("{other} reuses neither freed grain"),
        };
        // Taking them as archived would free `newer` at the next checkpoint.
        assert!(!provable_after_damage(&db, newer, archived_by, freeing));
        assert!(!provable_after_damage(&db, left_free, archived_by, freeing));

        // A blob archived (by a sequence below the damage's end) and still
        // there stays archived, so a later checkpoint frees it.
        let mut tx = db.begin_transaction().unwrap();
        let kept = tx.write(b"still archived").unwrap();
        tx.commit().unwrap();
        let mut tx = db.begin_transaction().unwrap();
        tx.archive(kept).unwrap();
        let kept_by = tx.commit().unwrap();
        let through = SequenceId(kept_by.0 + 1);
        assert!(provable_after_damage(&db, kept, kept_by, through));
        // Claimed archived before the blob there was written: not provable.
        assert!(!provable_after_damage(&db, kept, SequenceId(1), through));
        // Archived after the damage's end: not in doubt, left alone.
        assert!(provable_after_damage(
            &db,
            newer,
            SequenceId(through.0),
            through
        ));
        assert_eq!(db.get(newer).unwrap().as_deref(), Some(&b"abcdefghij"[..]));
    }
}
