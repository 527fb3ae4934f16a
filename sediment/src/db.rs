//! The database handle: the state every handle shares, and every
//! operation of [`Database`] but opening (`open`) and reading blobs
//! (`read`).

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use okaywal::fs::{FileSystem, LockGuard, OpenLock};
use okaywal::{ChunkReader, LogPosition, WriteAheadLog};
use parking_lot::{Mutex, MutexGuard};

use crate::cache::BlobCache;
use crate::checkpoint::Store;
use crate::commit_record::{CommitRecord, SequenceId};
use crate::config::Config;
use crate::error::{Context, Error, Result};
use crate::grain_id::GrainId;
use crate::orphans::BlobStart;
use crate::reclamation::Reclamation;
use crate::strata::Strata;
use crate::stratum::Stratum;
use crate::transaction::Transaction;
use crate::verify;
use crate::verify_report::VerifyReport;

/// What every handle, transaction and the WAL's manager share.
#[derive(Debug)]
pub(crate) struct Shared {
    directory: PathBuf,
    fs: Arc<dyn FileSystem>,
    direct_write_bytes: u64,
    /// Every stratum, by basin.
    strata: Strata,
    /// The reclamation protocol's state (see `reclamation`).
    reclamation: Reclamation,
    /// Recently read small blobs.
    cache: BlobCache,
    /// The index and commit log files (see `checkpoint`).
    store: Mutex<Store>,
    shut_down: AtomicBool,
    /// The store's one failure state, set by the first failed sync (or
    /// commit): nothing more may be acknowledged. Every later error is
    /// built from it (see `Shared::check_usable`).
    failure: Mutex<Option<Failure>>,
    /// Keeps other processes out of the directory while this store (or
    /// its WAL's maintenance thread) can write to it.
    lock: StoreLock,
    /// While an open replays the WAL, and only if it looks for orphans
    /// (see `crate::orphans`): where the blobs of the replayed entries
    /// start.
    replayed: Mutex<Option<HashSet<BlobStart>>>,
}

/// The lock a store holds on its directory (`sediment.lock`).
#[derive(Debug)]
pub(crate) enum StoreLock {
    /// Exclusive, for writing: until [`Shared::opened`], a lock file the
    /// open created is removed again if the open fails. The index too
    /// (when there was one), which keeps out readers of a copy of the
    /// store that left `sediment.lock` out.
    Writer {
        /// `sediment.lock`.
        lock: OpenLock,
        /// The index (held until the store is dropped).
        _index: Option<LockGuard>,
    },
    /// Shared, read-only (holding nothing if no writer ever made the
    /// file).
    Reader {
        /// Held until the store is dropped.
        _guard: LockGuard,
    },
}

/// The first failure of a store: the kind of the underlying I/O error
/// (`Other` if there was none) and the whole message.
#[derive(Debug, Clone)]
struct Failure {
    kind: io::ErrorKind,
    message: String,
}

/// A crash-safe blob store. See the [crate docs](crate).
///
/// `Database` is `Send + Sync`; share it between threads by reference, in
/// an `Arc`, or by cloning it: a clone is a cheap handle to the same open
/// store. The store closes when the last handle is dropped, or for every
/// handle at once when one of them calls [`Database::shutdown`].
#[derive(Debug, Clone)]
pub struct Database {
    shared: Arc<Shared>,
    wal: Wal,
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
    /// The state of a store opened with `config` in `directory` (the
    /// store's lock held by `lock`): its strata per basin, the reclamation
    /// state and the store recovered from its files.
    pub fn new(
        config: &Config,
        strata: Vec<Vec<Arc<Stratum>>>,
        reclamation: Reclamation,
        store: Store,
        lock: StoreLock,
        sealer: Option<Arc<crate::sealing::Sealer>>,
    ) -> Self {
        let directory = config.directory().to_path_buf();
        let fs = config.file_system_in_use().clone();
        Self {
            strata: Strata::new(
                directory.clone(),
                fs.clone(),
                config.blob_size_limit(),
                strata,
                sealer,
            ),
            directory,
            fs,
            direct_write_bytes: config.direct_write_threshold(),
            reclamation,
            cache: BlobCache::new(config.cache_size()),
            store: Mutex::new(store),
            shut_down: AtomicBool::new(false),
            failure: Mutex::new(None),
            lock,
            replayed: Mutex::new(None),
        }
    }

    /// From now on the replay notes where the blobs it applies start.
    pub fn track_replayed(&self) {
        *self.replayed.lock() = Some(HashSet::new());
    }

    /// The replay applied a record whose new blobs are `ids`.
    pub fn note_replayed(&self, ids: impl IntoIterator<Item = GrainId>) {
        if let Some(replayed) = self.replayed.lock().as_mut() {
            replayed.extend(ids.into_iter().map(crate::orphans::start_of));
        }
    }

    /// Where the replayed blobs start, if they were tracked; stops tracking.
    pub fn take_replayed(&self) -> Option<HashSet<BlobStart>> {
        self.replayed.lock().take()
    }

    /// The open succeeded: the lock file stays.
    pub fn opened(&self) {
        if let StoreLock::Writer { lock, .. } = &self.lock {
            lock.keep();
        }
    }

    /// The store's directory.
    pub fn directory(&self) -> &Path {
        &self.directory
    }

    /// The file system the store lives on.
    pub fn fs(&self) -> &Arc<dyn FileSystem> {
        &self.fs
    }

    /// Blobs at least this long bypass the WAL.
    pub fn direct_write_bytes(&self) -> u64 {
        self.direct_write_bytes
    }

    /// Every stratum, by basin.
    pub fn strata(&self) -> &Strata {
        &self.strata
    }

    /// The reclamation protocol's state.
    pub fn reclamation(&self) -> &Reclamation {
        &self.reclamation
    }

    /// The cache of recently read small blobs.
    pub fn cache(&self) -> &BlobCache {
        &self.cache
    }

    /// Locks the index and commit log files: first in the lock order (see
    /// `reclamation`).
    pub fn lock_store(&self) -> MutexGuard<'_, Store> {
        self.store.lock()
    }

    /// True once the store was shut down.
    pub fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::Acquire)
    }

    /// Fails if the database was shut down or hit a failed sync. After a
    /// failure the error has the first failure's I/O error kind and
    /// message (a full disk stays `StorageFull`).
    pub fn check_usable(&self) -> Result<()> {
        if self.shut_down.load(Ordering::Acquire) {
            return Err(Error::ShutDown);
        }
        if let Some(failure) = &*self.failure.lock() {
            return Err(Error::Io {
                context:
                    "the database stopped accepting commits after a failed write or sync; reopen it"
                        .into(),
                source: io::Error::new(failure.kind, failure.message.clone()),
            });
        }
        Ok(())
    }

    /// Records a failed sync or WAL commit (unless an earlier failure is
    /// recorded): every later commit fails until reopened.
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
}

impl Database {
    /// A handle on an opened store's state and its write-ahead log.
    pub(crate) fn from_parts(shared: Arc<Shared>, wal: Wal) -> Self {
        Self { shared, wal }
    }

    /// The state every handle shares.
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The write-ahead log under the store.
    pub(crate) fn wal(&self) -> &Wal {
        &self.wal
    }

    /// Fails with [`Error::ShutDown`] once the store was shut down.
    pub(crate) fn check_open(&self) -> Result<()> {
        if self.shared.is_shut_down() {
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

    /// The embedded header (a root pointer for structures built on top):
    /// the one set by the committed transaction with the highest sequence
    /// among those that set it (see
    /// [`Transaction::set_embedded_header`](crate::Transaction::set_embedded_header)).
    #[must_use]
    pub fn embedded_header(&self) -> Option<GrainId> {
        self.shared.reclamation.embedded_header()
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
        SequenceId(self.shared.reclamation.checkpointed_to())
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
        SequenceId(self.shared.reclamation.last_committed())
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
        let (recent, through, checkpointed_to) = self.shared.reclamation.finished_records(since.0);
        let from = since.0.max(checkpointed_to.saturating_add(1));
        let contents = {
            let mut store = self.shared.store.lock();
            store.read_commit_log(from)?
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
        // Read together: every commit counted in `last_committed` was
        // applied, and so counted in the horizon if buffered.
        let (buffered_before, last_committed) = shared.reclamation.sync_starting();
        if let Err(err) = wal
            .sync()
            .context(|| "syncing the write-ahead log".to_string())
        {
            shared.poison(&err);
            return Err(err);
        }
        shared
            .reclamation
            .synced(&shared.strata, &shared.cache, buffered_before);
        Ok(SequenceId(last_committed))
    }

    /// Syncs the WAL if grains freed by buffered commits wait for it, so
    /// that they become reusable; returns whether it synced. Called before
    /// a stratum is added: the store grows only if the grains it already
    /// has cannot be reused.
    pub(crate) fn sync_for_space(&self) -> Result<bool> {
        let wal = self.wal.live()?;
        if !self.shared.reclamation.has_unsynced_frees() {
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
        let open_transactions = self.shared.reclamation.transactions_open();
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

#[cfg(test)]
mod tests {
    use super::*;

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
        let basin = usize::from(old.basin());
        let stratum = db.shared.strata.of_basin(basin)[0].clone();
        while stratum.reserve(1).is_some() {}
        assert!(db.shared.reclamation.has_unsynced_frees());
        let syncs = db.wal_stats().unwrap().syncs;

        let mut tx = db.begin_transaction().unwrap();
        let new = tx.write(&data).unwrap();
        tx.commit_buffered().unwrap();
        assert_eq!(new, old, "the freed grains are reused after a sync");
        assert_eq!(
            db.shared.strata.of_basin(basin).len(),
            1,
            "no stratum was added"
        );
        assert!(db.wal_stats().unwrap().syncs > syncs);
        assert!(!db.shared.reclamation.has_unsynced_frees());

        // With nothing waiting for a sync, a full basin grows.
        let mut tx = db.begin_transaction().unwrap();
        let grown = tx.write(&data).unwrap();
        tx.commit_buffered().unwrap();
        assert_eq!(grown.stratum(), 1);
        assert_eq!(db.get(new).unwrap().as_deref(), Some(&data[..]));
    }
}
