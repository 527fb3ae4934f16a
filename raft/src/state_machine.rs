//! The key-value state machine on sediment: openraft's
//! [`RaftStateMachine`] and [`RaftSnapshotBuilder`].
//!
//! Values are grains; the map from keys to grains, the last applied log id
//! and the membership are kept in memory and made durable by the
//! [`journal`](crate::journal) grain each apply commits in the same sediment
//! transaction as the values. Replaced values are archived in that
//! transaction, and freed by a later one's `checkpoint_to` once no reader or
//! snapshot build still holds a view older than the archiving.
//!
//! Applies commit without waiting for a sync ([`sediment::Transaction::commit_buffered`]):
//! the entries they apply are durable in the Raft log already, so a crash
//! that drops the newest applies (always a suffix of them, with their
//! journal records) leaves an older last applied id, and the node applies
//! those entries again from its log when it restarts. The store syncs on
//! its own at least every [`SYNC_INTERVAL`], and always before a snapshot
//! is built, so the log is never purged past what the store holds durably.
//! Installing a received snapshot commits durably.
//!
//! With a key provider ([`StateMachineConfig::encryption`]) snapshot files
//! are sealed ([`crate::sealed_snapshot`]), and so is the sediment store.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use okaywal::encryption::{Cipher, KeyError, KeyProvider};
use okaywal::fs::{FileSystem, StdFileSystem};
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine, Snapshot};
use openraft::{EntryPayload, OptionalSend, RaftLogId, StorageIOError};
use parking_lot::Mutex;
use sediment::{Database, GrainId, SequenceId};

use crate::encryption::{classify, key_error, SharedKeys};
use crate::error::{Error, Result};
use crate::journal::{replay_cost, wants_full_record, Journal};
use crate::log_store::{payload_bytes, INLINE_APPEND_BYTES};
use crate::sealed_snapshot::{is_sealed, SealedSnapshotReader, SealedSnapshotWriter};
use crate::snapshot::{SnapshotReader, SnapshotWriter};
use crate::snapshot_data::{SnapshotData, SnapshotParts};
use crate::types::{
    Entry, LogId, Request, Response, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
    MAX_VALUE_BYTES,
};

const SNAPSHOT_PREFIX: &str = "snapshot-";
/// A snapshot being built: `building-{id}`, renamed to
/// `snapshot-{id}` once synced.
const BUILDING_PREFIX: &str = "building-";
/// A snapshot being received: `incoming-{pid}-{n}`.
const INCOMING_PREFIX: &str = "incoming-";

/// The longest the store leaves applied entries unsynced: a restart after
/// a power cut re-applies at most this much of the log.
pub const SYNC_INTERVAL: std::time::Duration = std::time::Duration::from_millis(500);

/// The most bytes of applied values the store leaves unsynced before an
/// apply syncs.
pub const SYNC_BYTES: u64 = 64 << 20;

/// Whether a journal commit waits for its sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Commit {
    /// An apply: re-done from the log after a crash.
    Buffered,
    /// A snapshot install: the log before it may be gone.
    Durable,
}

/// Where the state machine keeps its store and snapshots.
#[derive(Debug, Clone)]
pub struct StateMachineConfig {
    /// The sediment store's directory.
    pub directory: PathBuf,
    /// Where snapshot files go (always on the real disk: openraft streams
    /// them from files, through [`SnapshotData`]).
    pub snapshot_directory: PathBuf,
    /// The file system the sediment store runs on.
    pub file_system: Arc<dyn FileSystem>,
    /// The keys that seal snapshot files (and the sediment store); `None`:
    /// plain files.
    pub encryption: Option<SharedKeys>,
}

impl StateMachineConfig {
    /// The store in `directory/data`, snapshots in `directory/snapshots`.
    pub fn new(directory: impl AsRef<Path>) -> Self {
        let directory = directory.as_ref();
        Self {
            directory: directory.join("data"),
            snapshot_directory: directory.join("snapshots"),
            file_system: Arc::new(StdFileSystem),
            encryption: None,
        }
    }

    /// Seals snapshot files (and the store) with the keys of `keys` (see
    /// [`crate::encryption`]). Files written without a key do not open
    /// with one, nor the other way round.
    #[must_use]
    pub fn encryption(mut self, keys: impl KeyProvider) -> Self {
        self.encryption = Some(SharedKeys::new(keys));
        self
    }

    /// Runs the sediment store on `file_system` (for crash tests).
    #[must_use]
    pub fn file_system(mut self, file_system: Arc<dyn FileSystem>) -> Self {
        self.file_system = file_system;
        self
    }
}

#[derive(Debug, Default)]
struct SmState {
    index: BTreeMap<String, GrainId>,
    last_applied: Option<LogId>,
    membership: StoredMembership,
    /// The journal grains since (and including) the last full record.
    chain: Vec<GrainId>,
    /// What a restart replays beyond the last full record
    /// ([`crate::journal::replay_cost`] of each record after it).
    replay_cost: usize,
    /// The sediment sequence the in-memory view was committed at.
    sequence: u64,
    current_snapshot: Option<(SnapshotMeta, PathBuf)>,
}

#[derive(Debug)]
struct Shared {
    db: Database,
    snapshot_directory: PathBuf,
    state: Mutex<SmState>,
    /// Views in use (sequence → how many): grains archived after the oldest
    /// are not freed yet.
    pins: Mutex<BTreeMap<u64, usize>>,
    snapshot_counter: AtomicU64,
    /// Snapshots built and installed since the store was opened.
    snapshots_built: AtomicU64,
    snapshots_installed: AtomicU64,
    /// Seals snapshot files; `None` for plain ones.
    cipher: Option<Cipher>,
    /// Files handed out by `begin_receiving_snapshot`.
    incoming: Mutex<HashSet<PathBuf>>,
}

/// The state machine: cheap to clone (clones share the store), and its own
/// snapshot builder.
#[derive(Debug, Clone)]
pub struct StateMachine {
    shared: Arc<Shared>,
}

/// A view of the map that keeps its grains from being freed while it lives.
struct Pin<'a> {
    shared: &'a Shared,
    sequence: u64,
}

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        let mut pins = self.shared.pins.lock();
        if let Some(count) = pins.get_mut(&self.sequence) {
            *count -= 1;
            if *count == 0 {
                pins.remove(&self.sequence);
            }
        }
    }
}

impl Shared {
    /// Pins the view of `state`; call with the state lock held.
    fn pin(&self, state: &SmState) -> Pin<'_> {
        *self.pins.lock().entry(state.sequence).or_default() += 1;
        Pin {
            shared: self,
            sequence: state.sequence,
        }
    }

    /// The newest sequence whose archived grains nothing still needs.
    fn safe_checkpoint(&self, state: &SmState) -> u64 {
        let oldest_pin = self.pins.lock().keys().next().copied();
        oldest_pin.map_or(state.sequence, |p| p.min(state.sequence))
    }
}

fn sm_error(e: impl std::error::Error + 'static) -> StorageError {
    StorageError::from(StorageIOError::write_state_machine(
        openraft::AnyError::new(&e),
    ))
}

fn snapshot_error(e: impl std::error::Error + 'static) -> StorageError {
    StorageError::from(StorageIOError::write_snapshot(
        None,
        openraft::AnyError::new(&e),
    ))
}

fn grain(value: u64) -> Result<GrainId> {
    GrainId::from_u64(value).map_err(|e| Error::Corrupt {
        what: "journal".into(),
        detail: e.to_string(),
    })
}

fn sync_dir(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()
}

impl StateMachine {
    /// Opens (creating or recovering) the state machine in `directory` on
    /// the real disk.
    pub fn open(directory: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(StateMachineConfig::new(directory))
    }

    /// Opens (creating or recovering) the state machine as `config` says.
    pub fn open_with(config: StateMachineConfig) -> Result<Self> {
        let mut db_config = sediment::Config::for_directory(&config.directory)
            .shared_file_system(config.file_system.clone())
            .max_blob_bytes(sediment::MAX_FORMAT_BLOB_BYTES)
            .max_unsynced(SYNC_INTERVAL)
            .max_unsynced_bytes(SYNC_BYTES);
        if let Some(keys) = &config.encryption {
            // Seals take some of a blob's grains.
            db_config = db_config
                .max_blob_bytes(sediment::MAX_SEALED_BLOB_BYTES)
                .encryption(keys.clone());
        }
        let db = db_config.open().map_err(|e| match e.key_error() {
            Some(_) => match e {
                sediment::Error::Key { source, .. } | sediment::Error::Io { source, .. } => {
                    Error::Key(source)
                }
                other => Error::Sediment(other),
            },
            None => Error::Sediment(e),
        })?;
        let mut state = SmState {
            sequence: db.last_committed().0,
            ..SmState::default()
        };
        // Newest first, back to the last full record.
        let mut records = Vec::new();
        let mut next = db.embedded_header();
        while let Some(id) = next {
            let bytes = db.get(id)?.ok_or_else(|| Error::Corrupt {
                what: "journal".into(),
                detail: format!("journal grain {id} is missing"),
            })?;
            let record = Journal::decode(&bytes).map_err(|detail| Error::Corrupt {
                what: format!("journal grain {id}"),
                detail,
            })?;
            next = record.prev.map(grain).transpose()?;
            state.chain.push(id);
            records.push(record);
        }
        state.chain.reverse();
        state.replay_cost = records
            .iter()
            .rev()
            .skip(1)
            .map(|record| replay_cost(record.changes.len()))
            .sum();
        for record in records.into_iter().rev() {
            for (key, value) in record.changes {
                match value {
                    Some(value) => {
                        state.index.insert(key, grain(value)?);
                    }
                    None => {
                        state.index.remove(&key);
                    }
                }
            }
            state.last_applied = record.last_applied;
            state.membership = record.membership;
        }
        fs::create_dir_all(&config.snapshot_directory).map_err(|e| {
            Error::io(
                format!("creating {}", config.snapshot_directory.display()),
                e,
            )
        })?;
        let cipher = config.encryption.as_ref().map(SharedKeys::cipher);
        state.current_snapshot = find_snapshot(&config.snapshot_directory, cipher.as_ref())?;
        Ok(Self {
            shared: Arc::new(Shared {
                db,
                snapshot_directory: config.snapshot_directory,
                state: Mutex::new(state),
                pins: Mutex::new(BTreeMap::new()),
                snapshot_counter: AtomicU64::new(0),
                snapshots_built: AtomicU64::new(0),
                snapshots_installed: AtomicU64::new(0),
                cipher,
                incoming: Mutex::new(HashSet::new()),
            }),
        })
    }

    /// The value of `key`, as of the last applied entry.
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let shared = &*self.shared;
        let (id, _pin) = {
            let state = shared.state.lock();
            match state.index.get(key) {
                Some(&id) => (id, shared.pin(&state)),
                None => return Ok(None),
            }
        };
        Ok(shared.db.get(id)?)
    }

    /// The last applied log id and the membership.
    #[must_use]
    pub fn applied(&self) -> (Option<LogId>, StoredMembership) {
        let state = self.shared.state.lock();
        (state.last_applied, state.membership.clone())
    }

    /// How many keys the map holds.
    #[must_use]
    pub fn len(&self) -> usize {
        self.shared.state.lock().index.len()
    }

    /// Returns true if the map is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every key with its value's length, in key order.
    #[must_use]
    pub fn keys(&self) -> Vec<String> {
        self.shared.state.lock().index.keys().cloned().collect()
    }

    /// The sediment store under the map.
    #[must_use]
    pub fn database(&self) -> &Database {
        &self.shared.db
    }

    /// Moves the store's WAL into its strata and closes it.
    pub fn shutdown(self) -> Result<()> {
        match Arc::try_unwrap(self.shared) {
            Ok(shared) => Ok(shared.db.shutdown()?),
            Err(shared) => {
                shared.db.sync()?;
                shared.db.checkpoint_wal()?;
                Ok(())
            }
        }
    }

    /// Makes every apply so far durable (they are otherwise synced within
    /// [`SYNC_INTERVAL`]).
    pub fn sync(&self) -> Result<()> {
        self.shared.db.sync()?;
        Ok(())
    }

    /// Whether the next apply writes a full journal record.
    fn next_record_is_full(&self) -> bool {
        let state = self.shared.state.lock();
        wants_full_record(state.replay_cost, state.index.len())
    }

    /// Applies `entries` in one sediment transaction.
    pub fn apply_entries(&self, entries: Vec<Entry>) -> Result<Vec<Response>> {
        let shared = &*self.shared;
        let Some(last) = entries.last().map(|e| *e.get_log_id()) else {
            return Ok(Vec::new());
        };
        // Entries come from the log, which a follower filled from the
        // network: a command the API would refuse is an error here, never
        // a value sediment cannot hold or a key no client can name.
        for entry in &entries {
            if let EntryPayload::Normal(request) = &entry.payload {
                request
                    .check(MAX_VALUE_BYTES)
                    .map_err(|detail| Error::Corrupt {
                        what: format!("log entry {}", entry.get_log_id()),
                        detail,
                    })?;
            }
        }
        let (mut membership, chain_last, cost_before, safe, keys_before) = {
            let state = shared.state.lock();
            (
                state.membership.clone(),
                state.chain.last().copied(),
                state.replay_cost,
                shared.safe_checkpoint(&state),
                state.index.len(),
            )
        };
        // Later commands on a key in the batch win; each one's response
        // still sees the ones before it.
        let mut overlay: HashMap<&str, bool> = HashMap::new();
        let mut finals: BTreeMap<&str, Option<&[u8]>> = BTreeMap::new();
        let mut responses = Vec::with_capacity(entries.len());
        {
            let state = shared.state.lock();
            for entry in &entries {
                match &entry.payload {
                    EntryPayload::Blank => responses.push(Response::default()),
                    EntryPayload::Normal(request) => {
                        let mut each = Vec::new();
                        for (key, value) in request.changes() {
                            each.push(
                                overlay
                                    .get(key)
                                    .copied()
                                    .unwrap_or_else(|| state.index.contains_key(key)),
                            );
                            overlay.insert(key, value.is_some());
                            finals.insert(key, value);
                        }
                        let existed = each.first().copied().unwrap_or(false);
                        if !matches!(request, Request::Batch(_)) {
                            each.clear();
                        }
                        responses.push(Response { existed, each });
                    }
                    EntryPayload::Membership(m) => {
                        membership = StoredMembership::new(Some(*entry.get_log_id()), m.clone());
                        responses.push(Response::default());
                    }
                }
            }
        }
        let db = &shared.db;
        let mut tx = db.begin_transaction()?;
        let mut changes: Vec<(String, Option<GrainId>)> = Vec::with_capacity(finals.len());
        {
            let state = shared.state.lock();
            let mut written = Vec::new();
            for (key, value) in &finals {
                let old = state.index.get(*key).copied();
                let new = match value {
                    Some(value) => {
                        let id = tx.write(value)?;
                        written.push(id);
                        Some(id)
                    }
                    None => None,
                };
                if let Some(old) = old {
                    tx.archive(old)?;
                }
                if old.is_some() || new.is_some() {
                    changes.push(((*key).to_string(), new));
                }
            }
        }
        let full = wants_full_record(cost_before, keys_before);
        let (record, new_index) = if full {
            let (mut index, chain) = {
                let state = shared.state.lock();
                (state.index.clone(), state.chain.clone())
            };
            for (key, value) in &changes {
                match value {
                    Some(id) => index.insert(key.clone(), *id),
                    None => index.remove(key),
                };
            }
            for id in &chain {
                tx.archive(*id)?;
            }
            let record = Journal {
                prev: None,
                last_applied: Some(last),
                membership: membership.clone(),
                changes: index
                    .iter()
                    .map(|(k, v)| (k.clone(), Some(v.as_u64())))
                    .collect(),
            };
            (record, Some(index))
        } else {
            let record = Journal {
                prev: chain_last.map(GrainId::as_u64),
                last_applied: Some(last),
                membership: membership.clone(),
                changes: changes
                    .iter()
                    .map(|(k, v)| (k.clone(), v.map(GrainId::as_u64)))
                    .collect(),
            };
            (record, None)
        };
        let added_cost = replay_cost(record.changes.len());
        let (journal, sequence) = commit_journal(db, tx, &record, safe, Commit::Buffered)?;
        let mut state = shared.state.lock();
        match new_index {
            Some(index) => {
                state.index = index;
                state.chain = vec![journal];
                state.replay_cost = 0;
            }
            None => {
                state.replay_cost += added_cost;
                for (key, value) in changes {
                    match value {
                        Some(id) => state.index.insert(key, id),
                        None => state.index.remove(&key),
                    };
                }
                state.chain.push(journal);
            }
        }
        state.last_applied = Some(last);
        state.membership = membership;
        state.sequence = sequence.0;
        Ok(responses)
    }

    /// Writes a snapshot of the current map to a file and makes it the
    /// current snapshot.
    pub fn build_snapshot_file(&self) -> Result<(SnapshotMeta, PathBuf)> {
        let shared = &*self.shared;
        // openraft purges the log up to a snapshot (less the entries it
        // keeps): every apply the snapshot covers must be durable in the
        // store first, or a crash could leave the store behind a log that
        // no longer holds the entries to re-apply. openraft builds
        // snapshots beside its applies, so the view is taken first and the
        // sync after: it covers every apply the view holds (each was
        // committed before its state was published), never fewer.
        let (items, last_applied, membership, _pin) = {
            let state = shared.state.lock();
            let items: Vec<(String, GrainId)> =
                state.index.iter().map(|(k, v)| (k.clone(), *v)).collect();
            (
                items,
                state.last_applied,
                state.membership.clone(),
                shared.pin(&state),
            )
        };
        shared.db.sync()?;
        let counter = shared.snapshot_counter.fetch_add(1, Ordering::Relaxed);
        let snapshot_id = match last_applied {
            Some(id) => format!(
                "{}-{}-{}-{counter}",
                id.leader_id.term, id.leader_id.node_id, id.index
            ),
            None => format!("0-0-0-{counter}"),
        };
        let meta = SnapshotMeta {
            last_log_id: last_applied,
            last_membership: membership,
            snapshot_id: snapshot_id.clone(),
        };
        let dir = &shared.snapshot_directory;
        let tmp = dir.join(format!("{BUILDING_PREFIX}{snapshot_id}"));
        let path = dir.join(format!("{SNAPSHOT_PREFIX}{snapshot_id}"));
        let written = (|| -> Result<()> {
            let sink = SnapshotSink::create(&tmp, shared.cipher.as_ref())
                .map_err(|e| Error::io("creating a snapshot", e))?;
            let mut writer =
                SnapshotWriter::new(sink, &meta).map_err(|e| Error::io("writing a snapshot", e))?;
            for (key, id) in &items {
                let value = shared.db.get(*id)?.ok_or_else(|| Error::Corrupt {
                    what: format!("value of {key:?}"),
                    detail: format!("grain {id} is gone"),
                })?;
                writer
                    .add(key, &value)
                    .map_err(|e| Error::io("writing a snapshot", e))?;
            }
            writer
                .finish()
                .map_err(|e| Error::io("writing a snapshot", e))?
                .finish()
                .map_err(|e| Error::io("syncing a snapshot", e))?;
            Ok(())
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        self.make_current(&tmp, &path, meta.clone())?;
        shared.snapshots_built.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            last_index = meta.last_log_id.map(|id| id.index),
            keys = items.len(),
            "built a snapshot"
        );
        Ok((meta, path))
    }

    /// Renames a finished snapshot file into place and deletes the older.
    fn make_current(&self, from: &Path, to: &Path, meta: SnapshotMeta) -> Result<()> {
        let dir = &self.shared.snapshot_directory;
        fs::rename(from, to).map_err(|e| Error::io("renaming a snapshot", e))?;
        sync_dir(dir).map_err(|e| Error::io("syncing the snapshot directory", e))?;
        let old = {
            let mut state = self.shared.state.lock();
            // A newer snapshot may have become current meanwhile.
            let newer = state
                .current_snapshot
                .as_ref()
                .is_some_and(|(m, _)| m.last_log_id > meta.last_log_id);
            if newer {
                Some(to.to_path_buf())
            } else {
                state
                    .current_snapshot
                    .replace((meta, to.to_path_buf()))
                    .map(|(_, p)| p)
            }
        };
        if let Some(old) = old {
            if old != to {
                // Readers holding it open keep reading the unlinked file.
                let _ = fs::remove_file(old);
            }
        }
        Ok(())
    }

    /// Replaces the map with the snapshot in the file at `path` (read from
    /// the start) in one transaction, then keeps the file as the current
    /// snapshot.
    pub fn install_snapshot_file(&self, meta: &SnapshotMeta, path: &Path) -> Result<()> {
        // The id becomes part of a file name.
        crate::validate::check_snapshot_id(&meta.snapshot_id).map_err(Error::Invalid)?;
        let shared = &*self.shared;
        let shown = path.display().to_string();
        let stream = open_stream(path, shared.cipher.as_ref()).map_err(|e| classify(&shown, e))?;
        let mut reader =
            SnapshotReader::new(stream).map_err(|e| Error::io("reading a received snapshot", e))?;
        if shared.cipher.is_some() && reader.meta.snapshot_id != meta.snapshot_id {
            return Err(Error::Invalid(format!(
                "the snapshot {} holds snapshot {}",
                meta.snapshot_id, reader.meta.snapshot_id
            )));
        }
        let (old_values, chain, safe) = {
            let state = shared.state.lock();
            (
                state.index.values().copied().collect::<Vec<_>>(),
                state.chain.clone(),
                shared.safe_checkpoint(&state),
            )
        };
        let db = &shared.db;
        let mut tx = db.begin_transaction()?;
        let mut index = BTreeMap::new();
        while let Some((key, value)) = reader
            .next_record()
            .map_err(|e| Error::io("reading a received snapshot", e))?
        {
            let id = tx.write(&value)?;
            if let Some(replaced) = index.insert(key, id) {
                return Err(Error::Invalid(format!(
                    "the snapshot holds a key twice (grain {replaced})"
                )));
            }
        }
        for id in old_values.into_iter().chain(chain) {
            tx.archive(id)?;
        }
        let record = Journal {
            prev: None,
            last_applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
            changes: index
                .iter()
                .map(|(k, v)| (k.clone(), Some(v.as_u64())))
                .collect(),
        };
        let (journal, sequence) = commit_journal(db, tx, &record, safe, Commit::Durable)?;
        {
            let mut state = shared.state.lock();
            state.index = index;
            state.chain = vec![journal];
            state.replay_cost = 0;
            state.last_applied = meta.last_log_id;
            state.membership = meta.last_membership.clone();
            state.sequence = sequence.0;
        }
        let to = shared
            .snapshot_directory
            .join(format!("{SNAPSHOT_PREFIX}{}", meta.snapshot_id));
        self.make_current(path, &to, meta.clone())?;
        shared.snapshots_installed.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            last_index = meta.last_log_id.map(|id| id.index),
            "installed a snapshot from the leader"
        );
        Ok(())
    }

    /// Snapshots this state machine built since it was opened.
    #[must_use]
    pub fn snapshots_built(&self) -> u64 {
        self.shared.snapshots_built.load(Ordering::Relaxed)
    }

    /// Snapshots received from a leader and installed since it was opened.
    #[must_use]
    pub fn snapshots_installed(&self) -> u64 {
        self.shared.snapshots_installed.load(Ordering::Relaxed)
    }

    /// The current snapshot's metadata and file, if any.
    #[must_use]
    pub fn current_snapshot(&self) -> Option<(SnapshotMeta, PathBuf)> {
        self.shared.state.lock().current_snapshot.clone()
    }

    /// The keys' cipher, if the snapshot files are sealed.
    fn cipher(&self) -> Option<&Cipher> {
        self.shared.cipher.as_ref()
    }

    /// Copies the snapshot stream `source` into a new incoming file of
    /// this state machine's form, synced, and returns its path.
    fn copy_into_incoming(&self, mut source: impl Read) -> Result<PathBuf> {
        let path = self.new_incoming_path();
        let copied = (|| -> io::Result<()> {
            let mut sink = SnapshotSink::create(&path, self.cipher())?;
            io::copy(&mut source, &mut sink)?;
            sink.finish()
        })();
        if let Err(e) = copied {
            let _ = fs::remove_file(&path);
            return Err(Error::io("copying a snapshot", e));
        }
        Ok(path)
    }

    fn new_incoming_path(&self) -> PathBuf {
        let counter = self.shared.snapshot_counter.fetch_add(1, Ordering::Relaxed);
        self.shared
            .snapshot_directory
            .join(format!("{INCOMING_PREFIX}{}-{counter}", std::process::id()))
    }
}

/// Where a snapshot is written: a plain file (buffered) or a sealed one.
enum SnapshotSink {
    Plain(BufWriter<File>),
    Sealed(SealedSnapshotWriter),
}

impl SnapshotSink {
    fn create(path: &Path, cipher: Option<&Cipher>) -> io::Result<Self> {
        Ok(match cipher {
            Some(cipher) => Self::Sealed(SealedSnapshotWriter::create(path, cipher)?),
            None => Self::Plain(BufWriter::new(File::create(path)?)),
        })
    }

    /// Writes what is buffered (sealing the last block) and syncs.
    fn finish(self) -> io::Result<()> {
        match self {
            Self::Plain(writer) => writer.into_inner().map_err(|e| e.into_error())?.sync_all(),
            Self::Sealed(writer) => writer.finish().map(drop),
        }
    }
}

impl Write for SnapshotSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Self::Plain(writer) => writer.write(buf),
            Self::Sealed(writer) => writer.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Self::Plain(writer) => writer.flush(),
            Self::Sealed(writer) => writer.flush(),
        }
    }
}

/// The snapshot stream of the file at `path`: plain, or sealed with
/// `cipher`. A file of the other form is a key error naming the file.
fn open_stream(path: &Path, cipher: Option<&Cipher>) -> io::Result<Box<dyn Read + Send>> {
    let shown = path.display().to_string();
    match (cipher, is_sealed(path)?) {
        (None, Some(true)) => Err(KeyError::NotConfigured.into_io(shown)),
        (Some(_), Some(false)) => Err(KeyError::NotEncrypted.into_io(shown)),
        (Some(cipher), _) => Ok(Box::new(SealedSnapshotReader::open(path, cipher)?)),
        (None, _) => Ok(Box::new(BufReader::new(File::open(path)?))),
    }
}

/// Finds the newest complete snapshot file and deletes this node's
/// leftovers (older snapshots, half-built or half-received ones); files of
/// other names are left alone.
///
/// Plain snapshots that do not read are deleted if they carry a name this
/// node gives its snapshots (they are leftovers), and ignored otherwise.
/// Sealed ones are the node's own, renamed into place after a sync: one
/// that does not open, or whose name is not the id it holds, is an error
/// naming it.
fn find_snapshot(dir: &Path, cipher: Option<&Cipher>) -> Result<Option<(SnapshotMeta, PathBuf)>> {
    let mut best: Option<(SnapshotMeta, PathBuf)> = None;
    let entries =
        fs::read_dir(dir).map_err(|e| Error::io(format!("listing {}", dir.display()), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(format!("listing {}", dir.display()), e))?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with(SNAPSHOT_PREFIX) {
            // Only this node's leftovers go (a snapshot being built or
            // received when it stopped); a file it did not write, in a
            // snapshot directory the user chose, is none of its business.
            if name.starts_with(BUILDING_PREFIX) || name.starts_with(INCOMING_PREFIX) {
                let _ = fs::remove_file(&path);
            }
            continue;
        }
        let shown = path.display().to_string();
        // A plain node deletes a snapshot file it cannot read, as before.
        let sealed = match (cipher, is_sealed(&path)) {
            (_, Ok(sealed)) => sealed,
            (None, Err(_)) => None,
            (Some(_), Err(e)) => return Err(Error::io(format!("reading {shown}"), e)),
        };
        let meta = match (cipher, sealed) {
            (None, Some(true)) => return Err(key_error(KeyError::NotConfigured, &shown)),
            (None, _) => File::open(&path)
                .and_then(|f| SnapshotReader::new(BufReader::new(f)))
                .map(|r| r.meta),
            (Some(_), Some(false)) => return Err(key_error(KeyError::NotEncrypted, &shown)),
            (Some(cipher), _) => {
                let meta = SealedSnapshotReader::open(&path, cipher)
                    .and_then(SnapshotReader::new)
                    .map_err(|e| classify(&shown, e))?
                    .meta;
                if name[SNAPSHOT_PREFIX.len()..] != meta.snapshot_id {
                    return Err(Error::Corrupt {
                        what: format!("snapshot {shown}"),
                        detail: format!("holds snapshot {}", meta.snapshot_id),
                    });
                }
                Ok(meta)
            }
        };
        match meta {
            Ok(meta) => {
                crate::validate::check_opt_log_id(meta.last_log_id.as_ref(), "its last log id")
                    .and_then(|()| crate::validate::check_snapshot_id(&meta.snapshot_id))
                    .map_err(|detail| Error::Corrupt {
                        what: format!("snapshot {}", path.display()),
                        detail,
                    })?;
                if best
                    .as_ref()
                    .map_or(true, |(m, _)| m.last_log_id < meta.last_log_id)
                {
                    if let Some((_, older)) = best.replace((meta, path)) {
                        let _ = fs::remove_file(older);
                    }
                } else {
                    let _ = fs::remove_file(&path);
                }
            }
            // A file of this node's naming that does not read is a
            // leftover; another one is not the node's to delete.
            Err(_) if is_node_snapshot_id(&name[SNAPSHOT_PREFIX.len()..]) => {
                let _ = fs::remove_file(&path);
            }
            Err(_) => {}
        }
    }
    Ok(best)
}

/// Whether `id` is of the form snapshot ids are built in:
/// `{term}-{node}-{index}-{counter}`, four decimal numbers.
fn is_node_snapshot_id(id: &str) -> bool {
    let parts: Vec<&str> = id.split('-').collect();
    parts.len() == 4 && parts.iter().all(|p| p.parse::<u64>().is_ok())
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work).await.map_err(|e| {
        Error::io(
            "a blocking state machine task",
            io::Error::other(e.to_string()),
        )
    })?
}

async fn open_snapshot(
    meta: SnapshotMeta,
    path: PathBuf,
    cipher: Option<Cipher>,
) -> Result<Snapshot<TypeConfig>> {
    let data = SnapshotData::open(&path, cipher.as_ref())
        .await
        .map_err(|e| {
            let shown = path.display().to_string();
            classify(&shown, e)
        })?;
    Ok(Snapshot {
        meta,
        snapshot: Box::new(data),
    })
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let sm = self.clone();
        let (meta, path) = blocking(move || sm.build_snapshot_file())
            .await
            .map_err(snapshot_error)?;
        open_snapshot(meta, path, self.cipher().cloned())
            .await
            .map_err(snapshot_error)
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        Ok(self.applied())
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        // Small applies are done in place, as small appends are
        // (`crate::log_store`): they copy values into the store's grains
        // and hand a buffered commit to the OS, no sync, and the hand-off
        // to a blocking thread and back would cost more than that.
        // An apply that writes a full journal record (the whole map) goes
        // to a blocking thread whatever its size.
        if payload_bytes(&entries) <= INLINE_APPEND_BYTES && !self.next_record_is_full() {
            return self.apply_entries(entries).map_err(sm_error);
        }
        let sm = self.clone();
        blocking(move || sm.apply_entries(entries))
            .await
            .map_err(sm_error)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<SnapshotData>, StorageError> {
        // Leftovers of a receive that never finished are deleted at the
        // next open.
        let path = self.new_incoming_path();
        let data = SnapshotData::create(&path, self.cipher())
            .await
            .map_err(snapshot_error)?;
        self.shared.incoming.lock().insert(path);
        Ok(Box::new(data))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<SnapshotData>,
    ) -> Result<(), StorageError> {
        let (path, parts) = snapshot.into_parts().await.map_err(snapshot_error)?;
        let sm = self.clone();
        let meta = meta.clone();
        blocking(move || {
            let ours = path
                .as_ref()
                .is_some_and(|path| sm.shared.incoming.lock().remove(path));
            let path = match (parts, path) {
                // A file from `begin_receiving_snapshot`, in this state
                // machine's form.
                (SnapshotParts::Plain(file), Some(path)) if ours && sm.cipher().is_none() => {
                    file.sync_all()
                        .map_err(|e| Error::io("syncing a received snapshot", e))?;
                    path
                }
                (SnapshotParts::SealedWriter(writer), Some(path)) if ours => {
                    writer
                        .finish()
                        .map_err(|e| Error::io("finishing a received snapshot", e))?;
                    path
                }
                // Anything else: keep a copy in this state machine's form.
                (SnapshotParts::Plain(mut file), _) => {
                    file.seek(SeekFrom::Start(0))
                        .map_err(|e| Error::io("copying a snapshot", e))?;
                    sm.copy_into_incoming(BufReader::new(file))?
                }
                (SnapshotParts::SealedReader(mut reader), _) => {
                    reader
                        .seek(SeekFrom::Start(0))
                        .map_err(|e| Error::io("copying a snapshot", e))?;
                    sm.copy_into_incoming(reader)?
                }
                (SnapshotParts::SealedWriter(_), _) => {
                    return Err(Error::Invalid(
                        "a snapshot still being written elsewhere cannot be installed".into(),
                    ))
                }
            };
            sm.install_snapshot_file(&meta, &path)
        })
        .await
        .map_err(snapshot_error)
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        match self.current_snapshot() {
            Some((meta, path)) => Ok(Some(
                open_snapshot(meta, path, self.cipher().cloned())
                    .await
                    .map_err(snapshot_error)?,
            )),
            None => Ok(None),
        }
    }
}

/// Writes `record` as the new head of the journal, frees the archived
/// grains no reader or snapshot needs any more (those archived at or before
/// `safe`) and commits `tx` as `commit` says.
fn commit_journal(
    db: &Database,
    mut tx: sediment::Transaction<'_>,
    record: &Journal,
    safe: u64,
    commit: Commit,
) -> sediment::Result<(GrainId, SequenceId)> {
    let journal = tx.write(&record.encode())?;
    tx.set_embedded_header(Some(journal))?;
    if safe > db.checkpointed_to().0 {
        tx.checkpoint_to(SequenceId(safe))?;
    }
    let sequence = match commit {
        Commit::Buffered => tx.commit_buffered()?,
        Commit::Durable => tx.commit()?,
    };
    Ok((journal, sequence))
}
