//! The Raft log on okaywal: openraft's [`RaftLogStorage`].
//!
//! Every `append` is one WAL entry with one chunk per Raft entry, committed
//! with `commit_buffered` (handed to the OS in log order), then made
//! durable by `WriteAheadLog::sync`, and only after that sync returns are
//! the `LogFlushed` callbacks of every append it covered fired, so appends
//! share fsyncs. The append syncs in place when no sync is running
//! (openraft waits for the flush before it appends again, so the hand-off
//! to another thread and back would only add to each write); otherwise a
//! sync thread syncs once for every append queued meanwhile. Votes,
//! truncations and purges are WAL entries too, synced before their call
//! returns. The committed log id is written the same way
//! but not synced: the next sync of the log (an append's) carries it. Raft
//! does not need it durable, as a restarted node learns it again from the
//! leader, and a committed id that did survive only lets the node re-apply
//! its own log sooner (see `FORMAT.md`, "One sync per write").
//!
//! When the WAL checkpoints a segment, the entries in it that are still in
//! the log are copied to an archive file (`archive-{id}`) and a metadata
//! file (`meta`, replaced by rename) records the vote, committed and purged
//! ids and which index range of each archive file is live. Archive files
//! whose entries were all purged or truncated are deleted then, so the space
//! of purged entries comes back at the next checkpoint.
//!
//! With a key provider ([`LogStoreConfig::encryption`]) the metadata and
//! archive files are sealed (see [`crate::encryption`] and `FORMAT.md`),
//! and so is the WAL.
//!
//! In-memory state changes *before* its WAL record is written: a checkpoint
//! that runs in between then records a state at least as new as every record
//! of the segment it recycles, and records replayed after it are idempotent.
//!
//! **Pre-staged entries.** On a follower, a leader's `/raft/stage` request
//! ([`crate::stage`]) writes the entries the leader is appending before
//! openraft's AppendEntries brings them ([`LogStore::stage_entries`]): they
//! are ordinary entries of the log, written and synced as an append is,
//! which openraft does not know of yet. When openraft then appends entries
//! the store already holds with the same log ids and bytes, nothing is
//! written again: `LogFlushed` fires once the sync of the staged write is
//! done. When it appends over staged entries with other log ids (a new
//! leader replaced them), the append's WAL entry starts with a truncate
//! record that drops them. On a leader, `append` hands the entries to a
//! [`StageOffer`] before writing them. Every change to the log's entries or
//! vote holds one lock (`Inner::writes`), so each sees the log the one
//! before left. `FORMAT.md`, "Pre-staged entries", gives the safety
//! argument.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use okaywal::encryption::{Cipher, KeyError, KeyProvider};
use okaywal::fs::{FileHandle, FileSystem, OpenMode, StdFileSystem};
use okaywal::{EntryId, LogManager, LogPosition, ReadChunkResult, SegmentReader, WriteAheadLog};
use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{EntryPayload, OptionalSend, RaftLogId, StorageIOError};
use parking_lot::{Condvar, Mutex};

use crate::encryption::{classify, key_error, SharedKeys};
use crate::error::{Error, Result};
use crate::log_format::{
    encode_entry_header, is_sealed_archive_header, open_archive_record, seal_archive_record,
    sealed_archive_header, sealed_record_header, verify_sealed_archive_header, ArchiveHeader,
    ArchiveRange, LogMeta, MetaForm, WalRecord, ARCHIVE_HEADER, ENTRY_HEADER,
    SEALED_ARCHIVE_HEADER, SEALED_RECORD_HEADER,
};
use crate::metrics::{Histogram, StageCounters};
use crate::types::{Entry, LogId, NodeId, StorageError, TypeConfig, Vote};
use crate::validate;

const META: &str = "meta";
const META_TMP: &str = "meta.tmp";
const ARCHIVE_PREFIX: &str = "archive-";

/// Where the log store keeps its files and how big its WAL segments are.
#[derive(Debug, Clone)]
pub struct LogStoreConfig {
    /// The directory of the log (the WAL lives in `wal/` inside it).
    pub directory: PathBuf,
    /// The file system everything goes through.
    pub file_system: Arc<dyn FileSystem>,
    /// WAL segment size: entries move to archive files at this interval.
    pub segment_bytes: u64,
    /// The keys that seal the metadata and archive files (and the WAL);
    /// `None`: plain files.
    pub encryption: Option<SharedKeys>,
    /// The id of the node whose log this is. With it, openraft reads a
    /// saved vote that is committed and names this node as not committed
    /// ([`LogStore::vote_at_start`]), and the store can stage its appends
    /// on followers ([`LogStore::set_stage_offer`]).
    pub node_id: Option<NodeId>,
}

impl LogStoreConfig {
    /// The defaults for `directory` on the real disk: 8 MiB segments.
    pub fn new(directory: impl AsRef<Path>) -> Self {
        Self {
            directory: directory.as_ref().to_path_buf(),
            file_system: Arc::new(StdFileSystem),
            segment_bytes: 8 << 20,
            encryption: None,
            node_id: None,
        }
    }

    /// Seals the log's files with the keys of `keys` (see
    /// [`crate::encryption`]). A log written without a key does not open
    /// with one, nor the other way round.
    #[must_use]
    pub fn encryption(mut self, keys: impl KeyProvider) -> Self {
        self.encryption = Some(SharedKeys::new(keys));
        self
    }

    /// Runs the store on `file_system` (for crash tests).
    #[must_use]
    pub fn file_system(mut self, file_system: Arc<dyn FileSystem>) -> Self {
        self.file_system = file_system;
        self
    }

    /// Sets the WAL segment size.
    #[must_use]
    pub fn segment_bytes(mut self, bytes: u64) -> Self {
        self.segment_bytes = bytes;
        self
    }

    /// Sets the id of the node whose log this is.
    #[must_use]
    pub fn node_id(mut self, id: NodeId) -> Self {
        self.node_id = Some(id);
        self
    }
}

/// Where one entry's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Location {
    /// A chunk in a live WAL segment.
    Wal(LogPosition),
    /// In an archive file: the encoded entry at `offset`, `len` bytes (in
    /// a sealed archive: the record at `offset`, with `len` bytes of
    /// sealed payload, and no CRC).
    Archive {
        file: u64,
        offset: u64,
        len: u32,
        crc: u32,
    },
}

/// The length and CRC32 of an entry's bincode: an append whose entry has
/// the staged entry's log id but other bytes replaces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Digest {
    len: usize,
    crc: u32,
}

impl Digest {
    fn of(bytes: &[u8]) -> Self {
        Self {
            len: bytes.len(),
            crc: crc32fast::hash(bytes),
        }
    }
}

/// An entry written from a stage request that openraft has not appended
/// yet.
#[derive(Debug, Clone, Copy)]
struct Staged {
    log_id: LogId,
    digest: Digest,
    /// The write's number in the sync queue: durable once the queue has
    /// synced through it.
    seq: u64,
}

#[derive(Debug, Default)]
struct State {
    entries: BTreeMap<u64, (LogId, Location)>,
    /// The staged entries openraft has not appended: always the last
    /// entries of `entries` (every other change of the log drops the ones
    /// it covers). Kept in memory only: after a restart openraft reads
    /// them as part of the log.
    staged: BTreeMap<u64, Staged>,
    vote: Option<Vote>,
    committed: Option<LogId>,
    purged: Option<LogId>,
    checkpointed_through: u64,
    archives: BTreeMap<u64, Arc<ArchiveFile>>,
    counters: Arc<StageCounters>,
}

/// An open archive file.
#[derive(Debug)]
struct ArchiveFile {
    handle: Arc<dyn FileHandle>,
    /// A sealed archive's header (bound into its records); empty for a
    /// plain one.
    header: Vec<u8>,
}

impl State {
    /// The last log id: the last entry's, else the last purged one.
    fn last_log_id(&self) -> Option<LogId> {
        self.entries
            .values()
            .next_back()
            .map(|(id, _)| *id)
            .or(self.purged)
    }

    /// Forgets the staged entries from `index` on (they are being dropped
    /// from the log) and counts them wasted.
    fn drop_staged_from(&mut self, index: u64) {
        let dropped = self.staged.split_off(&index).len();
        StageCounters::add(&self.counters.wasted, dropped as u64);
    }

    fn apply(&mut self, record: WalRecord, location: Option<LogPosition>) {
        match record {
            WalRecord::Entry { log_id, .. } => {
                if self.purged.is_some_and(|p| log_id.index <= p.index) {
                    return;
                }
                self.drop_staged_from(log_id.index);
                self.entries.split_off(&log_id.index);
                let location = location.expect("entries come with their position");
                self.entries
                    .insert(log_id.index, (log_id, Location::Wal(location)));
            }
            WalRecord::Vote(vote) => {
                if self.vote.map_or(true, |v| v <= vote) {
                    self.vote = Some(vote);
                }
            }
            WalRecord::Committed(committed) => {
                if committed >= self.committed {
                    self.committed = committed;
                }
            }
            WalRecord::Truncate { since } => {
                self.drop_staged_from(since);
                self.entries.split_off(&since);
            }
            // Checked against the metadata during recovery.
            WalRecord::Checkpointed(_) => {}
            WalRecord::Purge(log_id) => {
                if self.purged.is_some_and(|p| p.index >= log_id.index) {
                    return;
                }
                let kept = self.staged.split_off(&(log_id.index + 1));
                let dropped = std::mem::replace(&mut self.staged, kept).len();
                StageCounters::add(&self.counters.wasted, dropped as u64);
                self.entries = self.entries.split_off(&(log_id.index + 1));
                self.purged = Some(log_id);
            }
        }
    }

    fn meta(&self) -> LogMeta {
        let mut ranges: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        for (&index, (_, location)) in &self.entries {
            if let Location::Archive { file, .. } = location {
                let range = ranges.entry(*file).or_insert((index, index));
                range.0 = range.0.min(index);
                range.1 = range.1.max(index);
            }
        }
        LogMeta {
            vote: self.vote,
            committed: self.committed,
            purged: self.purged,
            checkpointed_through: self.checkpointed_through,
            archives: ranges
                .into_iter()
                .map(|(file, (first, last))| ArchiveRange { file, first, last })
                .collect(),
        }
    }
}

/// What the WAL's manager and the store share (never the WAL itself, so
/// dropping the store drops the WAL).
#[derive(Debug)]
struct Core {
    directory: PathBuf,
    fs: Arc<dyn FileSystem>,
    state: Mutex<State>,
    /// Seals the metadata and archives; `None` for a plain log.
    cipher: Option<Cipher>,
}

/// Called once an append is durable (or with why it cannot be).
pub type Durable = Box<dyn FnOnce(io::Result<()>) + Send>;

/// Where a leading node's log store hands the entries it appends, so that
/// its followers can write them while it writes its own copy (see
/// `FORMAT.md`, "Pre-staged entries"): [`crate::stage::Stager`] sends them.
pub trait StageOffer: Send + Sync + Debug {
    /// This node's id: the store leads while its vote is committed and
    /// names this node.
    fn node_id(&self) -> NodeId;

    /// Hands over `entries`, appended under `vote` right after `prev` (the
    /// log's last id before them), and says whether they are on their way
    /// to a follower. Called with the log's write lock held: it must not
    /// block, and must not call into the store.
    ///
    /// When they are, and the store runs on a single-threaded runtime, the
    /// append leaves its sync to the store's sync thread instead of making
    /// it in place, so that the requests go out while it runs.
    fn offer(&self, vote: &Vote, prev: Option<LogId>, entries: &[Entry]) -> bool;
}

/// What became of a stage request ([`LogStore::stage_entries`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StageOutcome {
    /// This many entries were written; the log's next sync makes them
    /// durable.
    Staged(usize),
    /// Nothing was written, for this reason: the log or the vote do not
    /// match the request's (a follower behind or ahead, another leader).
    Ignored(&'static str),
}

/// Numbers the log's writes and runs the callbacks waiting for them once a
/// sync covers them. A write gets its number after its `commit_buffered`
/// returned, and the sync thread reads the highest number before it calls
/// `WriteAheadLog::sync`, which makes durable every entry committed before
/// it: after that sync, every write up to the number read is durable.
#[derive(Default)]
struct SyncQueue {
    state: Mutex<SyncQueueState>,
    wake: Condvar,
}

#[derive(Default)]
struct SyncQueueState {
    /// The last number given to a write.
    written: u64,
    /// Every write up to this number is durable.
    synced: u64,
    waiting: Vec<(u64, Durable)>,
    /// A sync is running (on the sync thread or in place).
    syncing: bool,
    closed: bool,
}

impl Debug for SyncQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state.lock();
        f.debug_struct("SyncQueue")
            .field("written", &state.written)
            .field("synced", &state.synced)
            .field("waiting", &state.waiting.len())
            .finish()
    }
}

impl SyncQueue {
    /// Numbers a write whose `commit_buffered` returned.
    fn written(&self) -> u64 {
        let mut state = self.state.lock();
        state.written += 1;
        state.written
    }

    /// Runs `done` once write `seq` is durable: at once if it is already.
    fn when_durable(&self, seq: u64, done: Durable) {
        let mut state = self.state.lock();
        if state.synced >= seq {
            drop(state);
            done(Ok(()));
        } else if state.closed {
            drop(state);
            done(Err(io::Error::other("the log store is closed")));
        } else {
            state.waiting.push((seq, done));
            drop(state);
            self.wake.notify_one();
        }
    }

    /// Makes write `seq` durable and runs `done`, syncing on the calling
    /// thread when no sync is running: the caller saves the hand-off to the
    /// sync thread and back. While another sync runs, `done` waits for the
    /// sync thread as with [`SyncQueue::when_durable`]. Callbacks of other
    /// writes the sync covers run here too.
    fn sync_in_place(&self, wal: &WriteAheadLog, syncs: &Histogram, seq: u64, done: Durable) {
        let (target, waiting) = {
            let mut state = self.state.lock();
            if state.synced >= seq {
                drop(state);
                done(Ok(()));
                return;
            }
            if state.syncing || state.closed {
                drop(state);
                self.when_durable(seq, done);
                return;
            }
            state.syncing = true;
            state.waiting.push((seq, done));
            (state.written, state.waiting.len())
        };
        let result = timed_sync(wal, syncs, waiting);
        self.finish_sync(target, &result);
    }

    /// Records the end of a sync that covered every write up to `target`
    /// and runs the callbacks it covered; wakes the sync thread for any
    /// left.
    fn finish_sync(&self, target: u64, result: &io::Result<()>) {
        let ready: Vec<Durable> = {
            let mut state = self.state.lock();
            state.syncing = false;
            if result.is_ok() {
                state.synced = state.synced.max(target);
            }
            let (ready, later) = std::mem::take(&mut state.waiting)
                .into_iter()
                .partition(|(seq, _)| *seq <= target);
            state.waiting = later;
            if !state.waiting.is_empty() || state.closed {
                self.wake.notify_one();
            }
            ready.into_iter().map(|(_, done)| done).collect()
        };
        for done in ready {
            done(match result {
                Ok(()) => Ok(()),
                Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
            });
        }
    }

    /// Ends the sync thread once it has synced what is waiting.
    fn close(&self) {
        self.state.lock().closed = true;
        self.wake.notify_all();
    }
}

/// An entry to read: its log id, location and archive handle.
type Wanted = (LogId, Location, Option<Arc<ArchiveFile>>);

#[derive(Debug)]
struct Inner {
    core: Arc<Core>,
    wal: WriteAheadLog,
    /// Held by every change of the log's entries or vote (openraft's
    /// appends, truncations, purges and votes, and stage requests) from
    /// its checks to its WAL commit, so that each sees the log the one
    /// before it left. Taken before `core.state`, never while holding it.
    writes: Mutex<()>,
    syncer: Arc<SyncQueue>,
    /// How long each sync of the sync thread took.
    syncs: Arc<Histogram>,
    /// The node whose log this is, if known.
    node_id: Option<NodeId>,
    /// Where a leader's appends are offered to its followers, once the
    /// node has set it.
    offer: OnceLock<Arc<dyn StageOffer>>,
    counters: Arc<StageCounters>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.syncer.close();
    }
}

/// The Raft log store: cheap to clone (clones share the log), and its own
/// [`RaftLogReader`].
#[derive(Debug, Clone)]
pub struct LogStore {
    inner: Arc<Inner>,
}

fn archive_name(file: u64) -> String {
    format!("{ARCHIVE_PREFIX}{file:020}")
}

fn corrupt(what: impl Into<String>, detail: impl Into<String>) -> Error {
    Error::Corrupt {
        what: what.into(),
        detail: detail.into(),
    }
}

fn read_file(fs: &dyn FileSystem, path: &Path) -> io::Result<Vec<u8>> {
    let file = fs.open(path, OpenMode::Read)?;
    let mut bytes = vec![0; file.len()? as usize];
    file.read_exact_at(&mut bytes, 0)?;
    Ok(bytes)
}

impl Core {
    fn path(&self, name: &str) -> PathBuf {
        self.directory.join(name)
    }

    /// Reads the metadata file, if there is one, in the form the store's
    /// key (or its absence) expects.
    fn read_meta(&self) -> Result<LogMeta> {
        let fs = &*self.fs;
        let meta_path = self.path(META);
        let shown = meta_path.display().to_string();
        if !fs
            .exists(&meta_path)
            .map_err(|e| Error::io(format!("looking for {shown}"), e))?
        {
            return Ok(LogMeta::default());
        }
        let bytes =
            read_file(fs, &meta_path).map_err(|e| Error::io(format!("reading {shown}"), e))?;
        match (&self.cipher, MetaForm::of(&bytes)) {
            (None, MetaForm::Sealed) => Err(key_error(KeyError::NotConfigured, &shown)),
            (Some(_), MetaForm::Plain) => Err(key_error(KeyError::NotEncrypted, &shown)),
            (Some(cipher), MetaForm::Sealed) => {
                LogMeta::open_sealed(&bytes, cipher, &shown).map_err(|e| classify(&shown, e))
            }
            (_, _) => LogMeta::decode(&bytes).map_err(|e| corrupt(shown, e)),
        }
    }

    /// Loads the metadata and archive files into the state.
    fn load(&self) -> Result<()> {
        let fs = &*self.fs;
        let meta = self.read_meta()?;
        let mut state = self.state.lock();
        state.vote = meta.vote;
        state.committed = meta.committed;
        state.purged = meta.purged;
        state.checkpointed_through = meta.checkpointed_through;
        let mut listed = BTreeSet::new();
        for range in &meta.archives {
            listed.insert(archive_name(range.file));
            let path = self.path(&archive_name(range.file));
            let shown = path.display().to_string();
            let file = fs
                .open(&path, OpenMode::Read)
                .map_err(|e| Error::io(format!("opening {shown}"), e))?;
            let len = file
                .len()
                .map_err(|e| Error::io(format!("reading {shown}"), e))?;
            let (mut offset, header, record_header) = match &self.cipher {
                None => (0, Vec::new(), ARCHIVE_HEADER),
                Some(cipher) => {
                    let mut header = vec![0_u8; SEALED_ARCHIVE_HEADER];
                    if len < header.len() as u64 {
                        return Err(corrupt(shown, "not a sealed archive file"));
                    }
                    file.read_exact_at(&mut header, 0)
                        .map_err(|e| Error::io(format!("reading {shown}"), e))?;
                    verify_sealed_archive_header(cipher, &header, &shown)
                        .map_err(|e| classify(&shown, e))?;
                    (SEALED_ARCHIVE_HEADER as u64, header, SEALED_RECORD_HEADER)
                }
            };
            let mut found = 0_u64;
            let mut bytes = vec![0_u8; record_header];
            while offset + record_header as u64 <= len {
                file.read_exact_at(&mut bytes, offset)
                    .map_err(|e| Error::io(format!("reading {shown}"), e))?;
                let decoded = if self.cipher.is_some() {
                    sealed_record_header(&bytes).map(|(len, log_id)| ArchiveHeader {
                        len,
                        crc: 0,
                        log_id,
                    })
                } else {
                    ArchiveHeader::decode(&bytes)
                };
                let decoded = decoded
                    .and_then(|h| {
                        validate::check_log_id(&h.log_id, &format!("the entry at offset {offset}"))
                            .map(|()| h)
                    })
                    .map_err(|e| corrupt(shown.clone(), e))?;
                let index = decoded.log_id.index;
                let payload_at = offset + record_header as u64;
                if payload_at + u64::from(decoded.len) > len {
                    return Err(corrupt(
                        shown,
                        format!("entry {index} at offset {offset} runs past the end"),
                    ));
                }
                if index >= range.first
                    && index <= range.last
                    && state.purged.map_or(true, |p| index > p.index)
                {
                    found += 1;
                    state.entries.insert(
                        index,
                        (
                            decoded.log_id,
                            Location::Archive {
                                file: range.file,
                                // A sealed record is read whole, with its
                                // header.
                                offset: if self.cipher.is_some() {
                                    offset
                                } else {
                                    payload_at
                                },
                                len: decoded.len,
                                crc: decoded.crc,
                            },
                        ),
                    );
                }
                offset = payload_at + u64::from(decoded.len);
            }
            // Sealed records' headers are authenticated only when a record
            // is read: here every index the metadata lists for the file must
            // have been found in it, so that a changed header cannot hide
            // an entry.
            if self.cipher.is_some() {
                let first = state
                    .purged
                    .map_or(range.first, |p| range.first.max(p.index + 1));
                let wanted = (range.last + 1).saturating_sub(first);
                if found != wanted {
                    return Err(corrupt(
                        shown,
                        format!(
                            "holds {found} of the {wanted} entries {first}..={} the metadata lists",
                            range.last
                        ),
                    ));
                }
            }
            state.archives.insert(
                range.file,
                Arc::new(ArchiveFile {
                    handle: file,
                    header,
                }),
            );
        }
        drop(state);
        // Archives written by a checkpoint that died before its metadata
        // (their entries are still in the WAL). Their key checks are
        // checked first: a wrong key, or none for sealed ones, must not
        // delete anything. A sealed log keeps them until its next
        // checkpoint: until the WAL is replayed, the metadata that does not
        // list them may be an older file put in place of the current one.
        let mut unlisted = Vec::new();
        for name in fs.list_files(&self.directory)? {
            if name.starts_with(ARCHIVE_PREFIX) && !listed.contains(&name) {
                let path = self.path(&name);
                self.check_unlisted_archive(&path)?;
                unlisted.push(path);
            }
        }
        if self.cipher.is_none() {
            for path in unlisted {
                fs.remove_file(&path)?;
            }
        }
        Ok(())
    }

    /// A sealed archive the metadata does not list must still be one of
    /// this key's, and a plain log must have no sealed one; anything
    /// shorter than a sealed header is a torn write.
    fn check_unlisted_archive(&self, path: &Path) -> Result<()> {
        let shown = path.display().to_string();
        let file = self
            .fs
            .open(path, OpenMode::Read)
            .map_err(|e| Error::io(format!("opening {shown}"), e))?;
        let mut header = vec![0_u8; SEALED_ARCHIVE_HEADER];
        if file.len()? < header.len() as u64 {
            return Ok(());
        }
        file.read_exact_at(&mut header, 0)
            .map_err(|e| Error::io(format!("reading {shown}"), e))?;
        if !is_sealed_archive_header(&header) {
            return Ok(());
        }
        match &self.cipher {
            None => Err(key_error(KeyError::NotConfigured, &shown)),
            Some(cipher) => match verify_sealed_archive_header(cipher, &header, &shown) {
                Err(e) if KeyError::of(&e).is_some() => Err(Error::Key(e)),
                _ => Ok(()),
            },
        }
    }

    fn write_meta(&self, meta: &LogMeta) -> io::Result<()> {
        let fs = &*self.fs;
        let tmp = self.path(META_TMP);
        let file = fs.open(&tmp, OpenMode::Create)?;
        file.set_len(0)?;
        let bytes = match &self.cipher {
            Some(cipher) => meta.seal(cipher)?,
            None => meta.encode(),
        };
        file.write_all_at(&bytes, 0)?;
        file.sync_all()?;
        fs.rename(&tmp, &self.path(META))?;
        fs.sync_dir(&self.directory)
    }

    fn checkpoint(
        &self,
        last_id: EntryId,
        reader: &mut SegmentReader,
        wal: &WriteAheadLog,
    ) -> io::Result<()> {
        let mut candidates = Vec::new();
        while let Some(mut entry) = reader.read_entry()? {
            if entry.id().0 <= self.state.lock().checkpointed_through {
                continue;
            }
            while let ReadChunkResult::Chunk(mut chunk) = entry.read_chunk()? {
                let position = chunk.position();
                let bytes = chunk.read_all()?;
                if let Ok(WalRecord::Entry { log_id, .. }) =
                    WalRecord::decode(&bytes[..bytes.len().min(ENTRY_HEADER)])
                {
                    candidates.push((log_id, position, bytes));
                }
            }
        }
        let live: Vec<_> = {
            let state = self.state.lock();
            candidates
                .into_iter()
                .filter(|(log_id, position, _)| {
                    state.entries.get(&log_id.index) == Some(&(*log_id, Location::Wal(*position)))
                })
                .collect()
        };
        let file_number = last_id.0;
        let mut moved = Vec::with_capacity(live.len());
        let mut handle = None;
        if !live.is_empty() {
            let path = self.path(&archive_name(file_number));
            let file = self.fs.open(&path, OpenMode::Create)?;
            file.set_len(0)?;
            let mut out = Vec::new();
            let mut header = Vec::new();
            if let Some(cipher) = &self.cipher {
                header = sealed_archive_header(cipher)?;
                out.extend_from_slice(&header);
            }
            for (log_id, position, bytes) in &live {
                let payload = &bytes[ENTRY_HEADER..];
                let location = match &self.cipher {
                    Some(cipher) => {
                        let offset = out.len() as u64;
                        seal_archive_record(
                            cipher,
                            file_number,
                            &header,
                            log_id,
                            payload,
                            &mut out,
                        )?;
                        Location::Archive {
                            file: file_number,
                            offset,
                            len: payload.len() as u32,
                            crc: 0,
                        }
                    }
                    None => {
                        let record = ArchiveHeader::for_payload(*log_id, payload);
                        out.extend_from_slice(&record.encode());
                        let offset = out.len() as u64;
                        out.extend_from_slice(payload);
                        Location::Archive {
                            file: file_number,
                            offset,
                            len: record.len,
                            crc: record.crc,
                        }
                    }
                };
                moved.push((*log_id, *position, location));
            }
            file.write_all_at(&out, 0)?;
            file.sync_data()?;
            self.fs.sync_dir(&self.directory)?;
            handle = Some(Arc::new(ArchiveFile {
                handle: file,
                header,
            }));
        }
        let (meta, unused) = {
            let mut state = self.state.lock();
            if let Some(handle) = handle {
                state.archives.insert(file_number, handle);
            }
            for (log_id, position, location) in moved {
                if let Some(slot) = state.entries.get_mut(&log_id.index) {
                    if *slot == (log_id, Location::Wal(position)) {
                        slot.1 = location;
                    }
                }
            }
            state.checkpointed_through = state.checkpointed_through.max(last_id.0);
            let meta = state.meta();
            let used: BTreeSet<u64> = meta.archives.iter().map(|r| r.file).collect();
            let unused: Vec<u64> = state
                .archives
                .keys()
                .filter(|f| !used.contains(f))
                .copied()
                .collect();
            for file in &unused {
                state.archives.remove(file);
            }
            (meta, unused)
        };
        self.write_meta(&meta)?;
        for file in unused {
            // Readers holding the handle keep reading the unlinked file.
            self.fs.remove_file(&self.path(&archive_name(file)))?;
        }
        if self.cipher.is_some() {
            self.after_sealed_checkpoint(&meta, wal);
        }
        Ok(())
    }

    /// After a sealed log's metadata was written: records in the WAL what
    /// it covers, so that an older metadata file put in its place is
    /// refused at the next open (the record stays in the WAL until the
    /// next checkpoint, which writes newer metadata and a newer record);
    /// then deletes the archives a checkpoint that died before its
    /// metadata left (checkpoints run one at a time, so none is being
    /// written). Both only narrow what a later open has to trust: failures
    /// are logged, not returned.
    fn after_sealed_checkpoint(&self, meta: &LogMeta, wal: &WriteAheadLog) {
        let record = WalRecord::Checkpointed(meta.checkpointed_through).encode();
        let written = wal.begin_entry().and_then(|mut writer| {
            writer.write_chunk(&record)?;
            writer.commit_buffered().map(drop)
        });
        if let Err(e) = written {
            tracing::warn!(error = %e, "could not record a checkpoint in the Raft log's WAL");
        }
        let listed: BTreeSet<String> = meta.archives.iter().map(|r| archive_name(r.file)).collect();
        let names = match self.fs.list_files(&self.directory) {
            Ok(names) => names,
            Err(e) => {
                tracing::warn!(error = %e, "could not list the Raft log's archives");
                return;
            }
        };
        for name in names {
            if name.starts_with(ARCHIVE_PREFIX) && !listed.contains(&name) {
                if let Err(e) = self.fs.remove_file(&self.path(&name)) {
                    tracing::warn!(error = %e, file = name, "could not delete an unlisted archive");
                }
            }
        }
    }
}

/// Replays the WAL at open and archives entries at checkpoints.
#[derive(Debug)]
struct Manager {
    core: Arc<Core>,
}

impl LogManager for Manager {
    fn recover(&mut self, entry: &mut okaywal::Entry<'_>) -> io::Result<()> {
        if entry.id().0 <= self.core.state.lock().checkpointed_through {
            return Ok(());
        }
        let mut records = Vec::new();
        loop {
            match entry.read_chunk()? {
                ReadChunkResult::Chunk(mut chunk) => {
                    let position = chunk.position();
                    let bytes = chunk.read_all()?;
                    let record = WalRecord::decode(&bytes)
                        .and_then(|record| record.check_bounds().map(|()| record))
                        .map_err(|e| {
                            io::Error::new(
                                io::ErrorKind::InvalidData,
                                format!("WAL entry {}: {e}", entry.id().0),
                            )
                        })?;
                    records.push((record, position));
                }
                ReadChunkResult::EndOfEntry => break,
                ReadChunkResult::AbortedEntry => return Ok(()),
            }
        }
        let mut state = self.core.state.lock();
        for (record, _) in &records {
            if let WalRecord::Checkpointed(through) = record {
                if *through > state.checkpointed_through {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "{}: covers the WAL through entry {}, but WAL entry {} records \
                             metadata written through entry {through}: the metadata file is \
                             older than the log",
                            self.core.path(META).display(),
                            state.checkpointed_through,
                            entry.id().0
                        ),
                    ));
                }
            }
        }
        for (record, position) in records {
            state.apply(record, Some(position));
        }
        Ok(())
    }

    fn checkpoint_to(
        &mut self,
        last_checkpointed_id: EntryId,
        checkpointed_entries: &mut SegmentReader,
        wal: &WriteAheadLog,
    ) -> io::Result<()> {
        self.core
            .checkpoint(last_checkpointed_id, checkpointed_entries, wal)
    }
}

/// Whether the calling thread runs a single-threaded tokio runtime: there,
/// a sync made in place also holds up every task of the node.
fn on_single_threaded_runtime() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|handle| handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread)
}

/// A log sync slower than this is logged as a warning.
const SLOW_SYNC: std::time::Duration = std::time::Duration::from_millis(250);

/// One `WriteAheadLog::sync`, timed into `syncs` and logged when slow.
fn timed_sync(wal: &WriteAheadLog, syncs: &Histogram, waiting: usize) -> io::Result<()> {
    let started = std::time::Instant::now();
    let result = wal.sync().map(|_| ());
    let elapsed = started.elapsed();
    syncs.observe(elapsed);
    if elapsed >= SLOW_SYNC {
        tracing::warn!(
            millis = elapsed.as_millis() as u64,
            appends = waiting,
            "slow sync of the Raft log"
        );
    }
    if let Err(e) = &result {
        tracing::error!(error = %e, "syncing the Raft log failed");
    }
    result
}

/// Syncs the log whenever a callback waits for a write that is not durable
/// yet and no other sync runs, then runs the callbacks the sync covered;
/// once the queue is closed, syncs what still waits and returns.
fn sync_loop(wal: WriteAheadLog, queue: Arc<SyncQueue>, syncs: Arc<Histogram>) {
    loop {
        let (target, waiting) = {
            let mut state = queue.state.lock();
            while (state.waiting.is_empty() || state.syncing) && !state.closed {
                queue.wake.wait(&mut state);
            }
            while state.syncing {
                // Closed while a sync runs in place: its end wakes us.
                queue.wake.wait(&mut state);
            }
            if state.waiting.is_empty() {
                return;
            }
            // Callbacks queued while the last sync ran, for writes it
            // covered, need no sync of their own.
            let synced = state.synced;
            let (ready, later): (Vec<_>, Vec<_>) = std::mem::take(&mut state.waiting)
                .into_iter()
                .partition(|(seq, _)| *seq <= synced);
            state.waiting = later;
            if !ready.is_empty() {
                drop(state);
                for (_, done) in ready {
                    done(Ok(()));
                }
                continue;
            }
            state.syncing = true;
            (state.written, state.waiting.len())
        };
        let result = timed_sync(&wal, &syncs, waiting);
        queue.finish_sync(target, &result);
    }
}

/// Encodes `entry` as a WAL chunk into `chunk`: its header, then its
/// bincode.
fn encode_chunk(chunk: &mut Vec<u8>, entry: &Entry) -> Result<()> {
    chunk.clear();
    encode_entry_header(chunk, &entry.log_id);
    bincode::serialize_into(&mut *chunk, entry).map_err(|e| Error::Invalid(e.to_string()))
}

/// Decodes a stored entry (reading at most [`validate::MAX_ENTRY_BYTES`])
/// and checks that it is the one the index expects.
fn decode_entry(payload: &[u8], expected: &LogId) -> Result<Entry, String> {
    let entry: Entry = validate::decode(payload, validate::MAX_ENTRY_BYTES)
        .map_err(|e| format!("undecodable: {e}"))?;
    if entry.log_id != *expected {
        return Err(format!(
            "holds entry {} where {expected} was written",
            entry.log_id
        ));
    }
    Ok(entry)
}

impl LogStore {
    /// Opens (creating or recovering) the log store in `directory` on the
    /// real disk.
    pub fn open(directory: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(LogStoreConfig::new(directory))
    }

    /// Opens (creating or recovering) the log store as `config` says.
    pub fn open_with(config: LogStoreConfig) -> Result<Self> {
        let fs = config.file_system.clone();
        okaywal::fs::create_dir_durably(&*fs, &config.directory)
            .map_err(|e| Error::io(format!("creating {}", config.directory.display()), e))?;
        let core = Arc::new(Core {
            directory: config.directory.clone(),
            fs: fs.clone(),
            state: Mutex::new(State::default()),
            cipher: config.encryption.as_ref().map(SharedKeys::cipher),
        });
        core.load()?;
        let wal_dir = config.directory.join("wal");
        let mut wal_config = okaywal::Configuration::default_for(&wal_dir)
            .shared_file_system(fs)
            .preallocate_bytes(config.segment_bytes)
            .checkpoint_after_bytes(config.segment_bytes);
        if let Some(keys) = &config.encryption {
            wal_config = wal_config.encryption(keys.clone());
        }
        let wal = wal_config
            .open(Manager { core: core.clone() })
            .map_err(|e| {
                if KeyError::of(&e).is_some() {
                    Error::Key(e)
                } else {
                    Error::io(format!("opening the WAL in {}", wal_dir.display()), e)
                }
            })?;
        let syncer = Arc::new(SyncQueue::default());
        let sync_wal = wal.clone();
        let syncs = Arc::new(Histogram::default());
        let (sync_queue, sync_stats) = (syncer.clone(), syncs.clone());
        std::thread::Builder::new()
            .name("raft-log-sync".into())
            .spawn(move || sync_loop(sync_wal, sync_queue, sync_stats))
            .map_err(|e| Error::io("starting the log sync thread", e))?;
        let counters = core.state.lock().counters.clone();
        Ok(Self {
            inner: Arc::new(Inner {
                core,
                wal,
                writes: Mutex::new(()),
                syncer,
                syncs,
                node_id: config.node_id,
                offer: OnceLock::new(),
                counters,
            }),
        })
    }

    /// Makes this store offer the entries it appends while it leads to
    /// `offer` (see [`StageOffer`]). Set once, after the node's Raft is
    /// built; later calls change nothing. Nothing is offered unless the
    /// store was opened with the same node id
    /// ([`LogStoreConfig::node_id`]): staging is safe only if a restarted
    /// leader never resumes the term it led ([`LogStore::vote_at_start`]).
    pub fn set_stage_offer(&self, offer: Arc<dyn StageOffer>) {
        let _ = self.inner.offer.set(offer);
    }

    /// What pre-staging did on this node.
    #[must_use]
    pub fn stage_counters(&self) -> Arc<StageCounters> {
        self.inner.counters.clone()
    }

    /// Appends `entries` as one WAL entry and returns once they are
    /// readable; `on_durable` runs (on the sync thread, or before this
    /// returns if they already are) once the WAL sync that made them
    /// durable returned, or with the error that prevented it.
    ///
    /// This is openraft's append: the log ends right before the first
    /// entry. Leading entries the store already holds from a stage request
    /// (same log id, same bytes) are not written again; `on_durable` then
    /// also waits for their staged write's sync. Anything else the store
    /// holds from the first entry written on (staged entries a new leader
    /// replaced) is dropped by a truncate record at the start of the
    /// append's WAL entry. While this node leads, the entries are offered
    /// to the [`StageOffer`] before they are written.
    pub fn append_entries(&self, entries: Vec<Entry>, on_durable: Durable) -> Result<()> {
        let Some(first) = entries.first().map(|entry| entry.log_id.index) else {
            on_durable(Ok(()));
            return Ok(());
        };
        let core = &self.inner.core;
        let counters = &self.inner.counters;
        let writes = self.inner.writes.lock();
        let staged: Vec<Staged> = {
            let state = core.state.lock();
            if let Some(&lowest) = state.staged.keys().next() {
                if lowest < first {
                    // openraft only moves past entries it did not append
                    // by installing a snapshot, whose purge drops them
                    // first (see `purge_blocking`).
                    return Err(Error::Invalid(format!(
                        "an append at index {first} with staged entries from index {lowest} \
                         left before it"
                    )));
                }
            }
            state
                .staged
                .range(first..first.saturating_add(entries.len() as u64))
                .map(|(_, staged)| *staged)
                .collect()
        };
        let mut chunk = Vec::new();
        let mut present = 0;
        let mut present_seq = 0;
        for (entry, staged) in entries.iter().zip(&staged) {
            if staged.log_id != entry.log_id {
                break;
            }
            encode_chunk(&mut chunk, entry)?;
            if Digest::of(&chunk[ENTRY_HEADER..]) != staged.digest {
                break;
            }
            present += 1;
            present_seq = present_seq.max(staged.seq);
        }
        StageCounters::add(&counters.appends, 1);
        if present > 0 {
            let mut state = core.state.lock();
            for entry in &entries[..present] {
                state.staged.remove(&entry.log_id.index);
            }
            StageCounters::add(&counters.used, present as u64);
        }
        let rest = &entries[present..];
        let Some(rest_first) = rest.first().map(|entry| entry.log_id.index) else {
            StageCounters::add(&counters.appends_prestaged, 1);
            drop(writes);
            self.inner.syncer.sync_in_place(
                &self.inner.wal,
                &self.inner.syncs,
                present_seq,
                on_durable,
            );
            return Ok(());
        };
        let (replaces, prev, vote, committed) = {
            let state = core.state.lock();
            let prev = state
                .entries
                .range(..rest_first)
                .next_back()
                .map(|(_, (id, _))| *id)
                .or(state.purged);
            (
                state.entries.range(rest_first..).next().is_some(),
                prev,
                state.vote,
                state.committed,
            )
        };
        let mut offered = false;
        if let (Some(offer), Some(vote)) = (self.inner.offer.get(), vote) {
            let leading = self.inner.node_id == Some(offer.node_id())
                && vote.is_committed()
                && vote.leader_id().voted_for() == Some(offer.node_id())
                && rest.iter().all(|e| e.log_id.leader_id == *vote.leader_id())
                && prev.map_or(0, |p| p.index + 1) == rest_first;
            // Staging pays off when the pipeline is idle: the followers'
            // syncs then overlap the leader's instead of following it.
            // While an earlier entry still waits for its commit, the
            // followers' syncs are shared by the entries in flight anyway,
            // and the second request per follower only costs CPU, which a
            // busy cluster on few cores is short of.
            let idle = prev.map_or(true, |prev| committed >= Some(prev));
            if leading && idle {
                offered = offer.offer(&vote, prev, rest);
            }
        }
        let wal = &self.inner.wal;
        let mut writer = wal
            .begin_entry()
            .map_err(|e| Error::io("beginning a log entry", e))?;
        if replaces {
            let truncate = WalRecord::Truncate { since: rest_first };
            core.state.lock().apply(truncate.clone(), None);
            writer
                .write_chunk(&truncate.encode())
                .map_err(|e| Error::io("writing a log record", e))?;
        }
        let mut written = Vec::with_capacity(rest.len());
        for entry in rest {
            encode_chunk(&mut chunk, entry)?;
            let record = writer
                .write_chunk(&chunk)
                .map_err(|e| Error::io("writing a log entry", e))?;
            written.push((entry.log_id, record.position));
        }
        // The entries are indexed before the commit: the WAL checkpoints a
        // segment only after every entry in it finished, so a checkpoint
        // always sees them as part of the log.
        {
            let mut state = core.state.lock();
            for (log_id, position) in &written {
                state.apply(
                    WalRecord::Entry {
                        log_id: *log_id,
                        payload: Vec::new(),
                    },
                    Some(*position),
                );
            }
        }
        if let Err(e) = writer.commit_buffered() {
            core.state.lock().entries.split_off(&rest_first);
            return Err(Error::io("committing log entries", e));
        }
        let seq = self.inner.syncer.written();
        drop(writes);
        // openraft waits for this sync before it appends again: made here
        // when no other sync runs, it saves two thread hand-offs per entry.
        // On a single-threaded runtime, entries just offered to followers
        // are synced by the sync thread instead: the stage requests are
        // sent by tasks of this thread, and would wait for the sync.
        if offered && on_single_threaded_runtime() {
            self.inner.syncer.when_durable(seq, on_durable);
        } else {
            self.inner
                .syncer
                .sync_in_place(&self.inner.wal, &self.inner.syncs, seq, on_durable);
        }
        Ok(())
    }

    /// Writes `entries` from a leader's stage request (see
    /// [`crate::stage`]) if they extend this log in order under the
    /// leader this node follows: `vote` is committed, names another node
    /// and is the vote this store holds, `prev` is the log's last id, the
    /// entries follow it one index at a time, and each was created by that
    /// leader. Otherwise nothing is written ([`StageOutcome::Ignored`]):
    /// staging never truncates or overwrites. Written entries become
    /// durable with the log's next sync, which this requests; the call
    /// does not wait for it.
    pub fn stage_entries(
        &self,
        own_id: NodeId,
        vote: &Vote,
        prev: Option<LogId>,
        entries: &[Entry],
    ) -> Result<StageOutcome> {
        let writes = self.inner.writes.lock();
        let outcome = self.stage_locked(own_id, vote, prev, entries);
        drop(writes);
        outcome
    }

    /// [`LogStore::stage_entries`] without waiting for another change of
    /// the log to finish: `None`, and nothing done, while one runs.
    pub fn try_stage_entries(
        &self,
        own_id: NodeId,
        vote: &Vote,
        prev: Option<LogId>,
        entries: &[Entry],
    ) -> Option<Result<StageOutcome>> {
        let writes = self.inner.writes.try_lock()?;
        let outcome = self.stage_locked(own_id, vote, prev, entries);
        drop(writes);
        Some(outcome)
    }

    /// [`LogStore::stage_entries`] with the write lock held.
    fn stage_locked(
        &self,
        own_id: NodeId,
        vote: &Vote,
        prev: Option<LogId>,
        entries: &[Entry],
    ) -> Result<StageOutcome> {
        let core = &self.inner.core;
        {
            let state = core.state.lock();
            let ignored = if !vote.is_committed() {
                Some("the vote is not committed")
            } else if vote.leader_id().voted_for() == Some(own_id) {
                Some("the vote is this node's own")
            } else if state.vote != Some(*vote) {
                Some("the vote is not the one this node holds")
            } else if state.last_log_id() != prev {
                Some("the log does not end at the request's previous log id")
            } else if entries.is_empty() {
                Some("there are no entries")
            } else if !entries.iter().enumerate().all(|(i, entry)| {
                entry.log_id.index == prev.map_or(0, |p| p.index + 1) + i as u64
                    && entry.log_id.leader_id == *vote.leader_id()
            }) {
                Some("the entries do not follow the previous log id under the vote's leader")
            } else {
                None
            };
            if let Some(reason) = ignored {
                return Ok(StageOutcome::Ignored(reason));
            }
        }
        let wal = &self.inner.wal;
        let mut writer = wal
            .begin_entry()
            .map_err(|e| Error::io("beginning a log entry", e))?;
        let mut written = Vec::with_capacity(entries.len());
        let mut chunk = Vec::new();
        for entry in entries {
            encode_chunk(&mut chunk, entry)?;
            let record = writer
                .write_chunk(&chunk)
                .map_err(|e| Error::io("writing a log entry", e))?;
            written.push((
                entry.log_id,
                record.position,
                Digest::of(&chunk[ENTRY_HEADER..]),
            ));
        }
        let first = entries[0].log_id.index;
        {
            let mut state = core.state.lock();
            for (log_id, position, digest) in &written {
                state.apply(
                    WalRecord::Entry {
                        log_id: *log_id,
                        payload: Vec::new(),
                    },
                    Some(*position),
                );
                // Its number is set below, before the write lock is
                // released: no append sees it before then.
                state.staged.insert(
                    log_id.index,
                    Staged {
                        log_id: *log_id,
                        digest: *digest,
                        seq: u64::MAX,
                    },
                );
            }
        }
        if let Err(e) = writer.commit_buffered() {
            let mut state = core.state.lock();
            state.entries.split_off(&first);
            state.staged.split_off(&first);
            return Err(Error::io("committing staged log entries", e));
        }
        let seq = self.inner.syncer.written();
        {
            let mut state = core.state.lock();
            for staged in state.staged.range_mut(first..) {
                staged.1.seq = seq;
            }
        }
        self.inner.syncer.when_durable(seq, Box::new(|_| {}));
        Ok(StageOutcome::Staged(entries.len()))
    }

    /// Applies `records` in memory, then writes them as one WAL entry and
    /// waits until it is durable.
    fn write_durably(&self, records: &[WalRecord]) -> Result<()> {
        self.write_buffered(records)?;
        let wal = &self.inner.wal;
        wal.sync().map_err(|e| Error::io("syncing the log", e))?;
        Ok(())
    }

    /// Applies `records` in memory, then writes them as one WAL entry and
    /// hands it to the OS: it is durable with the next sync of the log, and
    /// a crash before that can only drop it with every record after it.
    fn write_buffered(&self, records: &[WalRecord]) -> Result<()> {
        {
            let mut state = self.inner.core.state.lock();
            for record in records {
                state.apply(record.clone(), None);
            }
        }
        let wal = &self.inner.wal;
        let mut writer = wal
            .begin_entry()
            .map_err(|e| Error::io("beginning a log entry", e))?;
        for record in records {
            writer
                .write_chunk(&record.encode())
                .map_err(|e| Error::io("writing a log record", e))?;
        }
        writer
            .commit_buffered()
            .map_err(|e| Error::io("committing a log record", e))?;
        Ok(())
    }

    /// Saves the vote durably.
    pub fn save_vote_blocking(&self, vote: Vote) -> Result<()> {
        let _writes = self.inner.writes.lock();
        self.write_durably(&[WalRecord::Vote(vote)])
    }

    /// Saves the committed log id without waiting for a sync: it becomes
    /// durable with the next append's (a crash before then may lose it
    /// with every later record, never alone out of order).
    pub fn save_committed_blocking(&self, committed: Option<LogId>) -> Result<()> {
        self.write_buffered(&[WalRecord::Committed(committed)])
    }

    /// Drops the entries from `since` on, durably.
    pub fn truncate_blocking(&self, since: u64) -> Result<()> {
        let _writes = self.inner.writes.lock();
        self.write_durably(&[WalRecord::Truncate { since }])
    }

    /// Drops the entries up to and including `log_id`, durably.
    ///
    /// If the log holds another entry at `log_id`'s index (staged entries
    /// openraft never appended, which the snapshot it is installing
    /// replaced), no entry after it can be part of the log that holds
    /// `log_id`: they are dropped too, by a truncate record in the same
    /// WAL entry as the purge.
    pub fn purge_blocking(&self, log_id: LogId) -> Result<()> {
        let _writes = self.inner.writes.lock();
        let replaced = {
            let state = self.inner.core.state.lock();
            let newer = state.purged.is_none_or(|p| p.index < log_id.index);
            newer
                && state
                    .entries
                    .get(&log_id.index)
                    .is_some_and(|(id, _)| *id != log_id)
        };
        if replaced {
            self.write_durably(&[
                WalRecord::Truncate {
                    since: log_id.index,
                },
                WalRecord::Purge(log_id),
            ])?;
            tracing::info!(
                from = log_id.index,
                "dropped log entries that a snapshot replaced"
            );
        } else {
            self.write_durably(&[WalRecord::Purge(log_id)])?;
        }
        tracing::info!(up_to = log_id.index, "purged the Raft log");
        Ok(())
    }

    /// The latencies of the log's syncs so far (each covers every append
    /// that was waiting for it).
    #[must_use]
    pub fn sync_latencies(&self) -> &Histogram {
        &self.inner.syncs
    }

    /// Bytes of the log's files: WAL segments, archive files and metadata.
    pub fn disk_bytes(&self) -> Result<u64> {
        let core = &self.inner.core;
        let mut total = 0;
        for dir in [core.directory.clone(), core.directory.join("wal")] {
            let names = core
                .fs
                .list_files(&dir)
                .map_err(|e| Error::io(format!("listing {}", dir.display()), e))?;
            for name in names {
                // A file removed meanwhile (a recycled segment, an old
                // archive) no longer counts.
                if let Ok(file) = core.fs.open(&dir.join(&name), OpenMode::Read) {
                    total += file.len().unwrap_or(0);
                }
            }
        }
        Ok(total)
    }

    /// The saved vote.
    #[must_use]
    pub fn vote(&self) -> Option<Vote> {
        self.inner.core.state.lock().vote
    }

    /// The saved vote as openraft reads it when it starts: a committed
    /// vote that names this node ([`LogStoreConfig::node_id`]) is given as
    /// not committed, so that a restarted leader does not lead again in
    /// the term it led (openraft 0.9 would resume it at once) and must win
    /// a later term. A leader that crashed before syncing entries it had
    /// already staged on followers would otherwise create other entries
    /// under the same log ids, while a follower holds the staged ones:
    /// Log Matching would break (`FORMAT.md`, "Pre-staged entries"). The
    /// vote itself stays what was saved: the node still voted for itself
    /// in that term, and votes for no one else in it.
    #[must_use]
    pub fn vote_at_start(&self) -> Option<Vote> {
        let mut vote = self.vote()?;
        if vote.is_committed() && self.inner.node_id == vote.leader_id().voted_for() {
            vote.committed = false;
        }
        Some(vote)
    }

    /// The saved committed log id.
    #[must_use]
    pub fn committed(&self) -> Option<LogId> {
        self.inner.core.state.lock().committed
    }

    /// The last purged and the last log id.
    #[must_use]
    pub fn log_state(&self) -> LogState<TypeConfig> {
        let state = self.inner.core.state.lock();
        LogState {
            last_purged_log_id: state.purged,
            last_log_id: state.last_log_id(),
        }
    }

    /// Reads the entries with indexes in `range` (those present).
    pub fn read_entries(&self, range: impl RangeBounds<u64>) -> Result<Vec<Entry>> {
        let start = match range.start_bound() {
            Bound::Included(&s) => Bound::Included(s),
            Bound::Excluded(&s) => Bound::Excluded(s),
            Bound::Unbounded => Bound::Unbounded,
        };
        let end = match range.end_bound() {
            Bound::Included(&s) => Bound::Included(s),
            Bound::Excluded(&s) => Bound::Excluded(s),
            Bound::Unbounded => Bound::Unbounded,
        };
        let wanted: Vec<Wanted> = {
            let state = self.inner.core.state.lock();
            state
                .entries
                .range((start, end))
                .map(|(_, &(log_id, location))| {
                    let handle = match location {
                        Location::Archive { file, .. } => state.archives.get(&file).cloned(),
                        Location::Wal(_) => None,
                    };
                    (log_id, location, handle)
                })
                .collect()
        };
        let mut out = Vec::with_capacity(wanted.len());
        for (log_id, location, handle) in wanted {
            out.push(self.read_one(log_id, location, handle)?);
        }
        Ok(out)
    }

    fn read_one(
        &self,
        log_id: LogId,
        mut location: Location,
        mut handle: Option<Arc<ArchiveFile>>,
    ) -> Result<Entry> {
        let (mut log_id, index) = (log_id, log_id.index);
        // A WAL position goes stale when its segment is recycled; by then
        // the index points into an archive file.
        for _ in 0..8 {
            match location {
                Location::Wal(position) => match self.inner.wal.read_at(position) {
                    Ok(reader) => {
                        let bytes = reader
                            .read_all()
                            .map_err(|e| Error::io(format!("reading log entry {index}"), e))?;
                        if bytes.len() < ENTRY_HEADER {
                            return Err(corrupt(format!("log entry {index}"), "chunk too short"));
                        }
                        return decode_entry(&bytes[ENTRY_HEADER..], &log_id)
                            .map_err(|e| corrupt(format!("log entry {index}"), e));
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(Error::io(format!("reading log entry {index}"), e)),
                },
                Location::Archive {
                    file,
                    offset,
                    len,
                    crc,
                } => {
                    let handle = handle.take().ok_or_else(|| {
                        corrupt(
                            format!("log entry {index}"),
                            format!("archive {file} is gone"),
                        )
                    })?;
                    let what = format!("log entry {index} in {}", archive_name(file));
                    let sealed = self.inner.core.cipher.as_ref();
                    let extra = if sealed.is_some() {
                        SEALED_RECORD_HEADER
                    } else {
                        0
                    };
                    let mut bytes = vec![0; len as usize + extra];
                    handle
                        .handle
                        .read_exact_at(&mut bytes, offset)
                        .map_err(|e| Error::io(format!("reading log entry {index}"), e))?;
                    if let Some(cipher) = sealed {
                        let payload = open_archive_record(
                            cipher,
                            file,
                            &handle.header,
                            offset,
                            &log_id,
                            bytes,
                            &what,
                        )
                        .map_err(|e| classify(&what, e))?;
                        return decode_entry(&payload, &log_id).map_err(|e| corrupt(what, e));
                    }
                    if crc32fast::hash(&bytes) != crc {
                        return Err(corrupt(
                            format!("log entry {index} in {}", archive_name(file)),
                            "checksum mismatch",
                        ));
                    }
                    return decode_entry(&bytes, &log_id).map_err(|e| {
                        corrupt(format!("log entry {index} in {}", archive_name(file)), e)
                    });
                }
            }
            let state = self.inner.core.state.lock();
            match state.entries.get(&index) {
                Some(&(now_id, now)) => {
                    log_id = now_id;
                    location = now;
                    if let Location::Archive { file, .. } = now {
                        handle = state.archives.get(&file).cloned();
                    }
                }
                None => {
                    return Err(corrupt(
                        format!("log entry {index}"),
                        "dropped while being read",
                    ))
                }
            }
        }
        Err(corrupt(
            format!("log entry {index}"),
            "kept moving while being read",
        ))
    }

    /// Seals the active WAL segment and waits until every segment has been
    /// checkpointed into archive files.
    pub fn checkpoint(&self) -> Result<()> {
        self.inner
            .wal
            .checkpoint_active()
            .map_err(|e| Error::io("checkpointing the log", e))
    }

    /// Syncs and stops the WAL. Later calls fail.
    pub fn shutdown(&self) -> Result<()> {
        self.inner
            .wal
            .shutdown()
            .map_err(|e| Error::io("shutting down the log", e))
    }

    /// The directory of the store.
    #[must_use]
    pub fn directory(&self) -> &Path {
        &self.inner.core.directory
    }

    /// How many archive files are in use.
    #[must_use]
    pub fn archive_files(&self) -> usize {
        self.inner.core.state.lock().archives.len()
    }
}

fn storage_error(e: Error) -> StorageError {
    StorageError::from(StorageIOError::write_logs(openraft::AnyError::new(&e)))
}

/// Appends whose values total at most this many bytes are written on the
/// calling task instead of a blocking thread.
pub(crate) const INLINE_APPEND_BYTES: usize = 64 << 10;

/// Bytes of keys and values `entries` carry.
pub(crate) fn payload_bytes(entries: &[Entry]) -> usize {
    entries
        .iter()
        .map(|entry| match &entry.payload {
            EntryPayload::Normal(request) => request.payload_bytes(),
            _ => 0,
        })
        .sum()
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Error::io("a blocking log task", io::Error::other(e.to_string())))?
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        self.read_entries(range)
            .map_err(|e| StorageError::from(StorageIOError::read_logs(openraft::AnyError::new(&e))))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        Ok(self.log_state())
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let (store, vote) = (self.clone(), *vote);
        blocking(move || store.save_vote_blocking(vote))
            .await
            .map_err(|e| {
                StorageError::from(StorageIOError::write_vote(openraft::AnyError::new(&e)))
            })
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        Ok(self.vote_at_start())
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        // A small record copied into the WAL's buffer and handed to the OS,
        // no sync: done in place, as small appends are.
        self.save_committed_blocking(committed)
            .map_err(storage_error)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.committed())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        if entries.is_empty() {
            callback.log_io_completed(Ok(()));
            return Ok(());
        }
        let on_durable: Durable = Box::new(move |result| callback.log_io_completed(result));
        // openraft waits for each append's flush before it appends again,
        // so the hand-off to a blocking thread (~150 µs here) is paid once
        // per entry on every node. Small appends are done in place: they
        // copy into the WAL's buffer, hand it to the OS (a `pwrite`) and
        // sync it unless a sync is already running. They can also wait
        // inside `begin_entry`: up to 100 ms for open entries at a segment
        // switch, and for the checkpointer when too many segments await
        // it. openraft's core awaits this call and its flush in either
        // case; in place, the wait also holds this runtime worker.
        if payload_bytes(&entries) <= INLINE_APPEND_BYTES {
            return self
                .append_entries(entries, on_durable)
                .map_err(storage_error);
        }
        let store = self.clone();
        blocking(move || store.append_entries(entries, on_durable))
            .await
            .map_err(storage_error)
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let store = self.clone();
        blocking(move || store.truncate_blocking(log_id.index))
            .await
            .map_err(storage_error)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let store = self.clone();
        blocking(move || store.purge_blocking(log_id))
            .await
            .map_err(storage_error)
    }
}

/// The entry ids in `entries` are a log: used by tests and the recovery
/// checks to compare stores.
#[must_use]
pub fn log_ids(entries: &[Entry]) -> Vec<LogId> {
    entries.iter().map(|e| *e.get_log_id()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Writers that sync in place and writers that leave it to the sync
    /// thread, at once: every callback runs exactly once, after a sync
    /// that covered its write, and nothing is left waiting.
    #[test]
    fn syncs_in_place_and_on_the_sync_thread_cover_every_write_once() {
        let dir = tempfile::tempdir().unwrap();
        let wal = okaywal::Configuration::default_for(dir.path())
            .open(okaywal::LogVoid)
            .unwrap();
        let queue = Arc::new(SyncQueue::default());
        let syncs = Arc::new(Histogram::default());
        let thread = {
            let (wal, queue, syncs) = (wal.clone(), queue.clone(), syncs.clone());
            std::thread::spawn(move || sync_loop(wal, queue, syncs))
        };
        let fired = Arc::new(AtomicUsize::new(0));
        std::thread::scope(|scope| {
            for writer in 0..4 {
                let (wal, queue, syncs, fired) = (&wal, &queue, &syncs, &fired);
                scope.spawn(move || {
                    for i in 0..100 {
                        let mut entry = wal.begin_entry().unwrap();
                        entry.write_chunk(&[writer as u8; 16]).unwrap();
                        entry.commit_buffered().unwrap();
                        let seq = queue.written();
                        let (sent, done) = std::sync::mpsc::channel();
                        let fired = fired.clone();
                        let check = queue.clone();
                        let callback: Durable = Box::new(move |result| {
                            assert!(result.is_ok());
                            assert!(check.state.lock().synced >= seq, "fired before its sync");
                            fired.fetch_add(1, Ordering::SeqCst);
                            let _ = sent.send(());
                        });
                        if (writer + i) % 2 == 0 {
                            queue.sync_in_place(wal, syncs, seq, callback);
                        } else {
                            queue.when_durable(seq, callback);
                        }
                        done.recv().unwrap();
                    }
                });
            }
        });
        assert_eq!(fired.load(Ordering::SeqCst), 400);
        {
            let state = queue.state.lock();
            assert_eq!(state.synced, 400);
            assert!(state.waiting.is_empty() && !state.syncing);
        }
        queue.close();
        thread.join().unwrap();
        assert!(syncs.count() > 0);
    }
}
