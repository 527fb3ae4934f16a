//! Opening a store: the lock, the index, the strata and the commit log
//! files, then the WAL's replay (through `manager`), and recovery from
//! what a crash or damage left behind.

use std::io;
use std::path::Path;
use std::sync::Arc;

use okaywal::encryption::{KeyError, KeyProvider};
use okaywal::fs::{FileHandle, FileSystem, OpenLock, OpenMode};

use crate::checkpoint::{encode_index, Store};
use crate::commit_log::CommitLogFiles;
use crate::config::Config;
use crate::db::{Database, Shared, StoreLock, Wal};
use crate::error::{Context, Error, Result};
use crate::files::open_existing;
use crate::format::{
    newest, open_envelope, version_of, HeaderError, IndexHeader, Layout, SealedIndex, BASINS,
    INDEX_MAGIC_BYTES, INDEX_SLOT_SIZE, SEALED_FORMAT_VERSION, SEALED_INDEX_BODY,
};
use crate::manager::Manager;
use crate::reclamation::Reclamation;
use crate::sealing::{Sealer, Unsealed};
use crate::stratum::{self, Stratum};

/// The name of the index file.
pub(crate) const INDEX_FILE: &str = "index";

/// The file an open store holds locked; never read or written.
pub(crate) const LOCK_FILE: &str = "sediment.lock";

impl Config {
    /// Opens (creating or recovering) the database.
    ///
    /// Fails with [`Error::InvalidConfig`] for a setting it cannot honour
    /// (see [`Config`]), and with [`Error::Io`] (of kind
    /// [`WouldBlock`](std::io::ErrorKind::WouldBlock)) if another process
    /// has the store open: its `sediment.lock` stays locked for 2 s.
    pub fn open(self) -> Result<Database> {
        self.validate()?;
        Database::open(self)
    }

    /// The same as [`Config::open`].
    pub fn recover(self) -> Result<Database> {
        self.open()
    }
}

/// The index as [`open_index`] opened it.
struct OpenedIndex {
    file: Arc<dyn FileHandle>,
    header: IndexHeader,
    /// The copy the next checkpoint overwrites first.
    next_slot: usize,
    /// The store's sealing context, if it is encrypted.
    sealer: Option<Arc<Sealer>>,
}

/// One index header copy as read.
enum IndexCopy {
    Plain(IndexHeader),
    /// Format version 2 with the right magic and CRC; not opened yet.
    Sealed(crate::format::Envelope),
    Invalid(HeaderError),
}

impl IndexCopy {
    fn read(bytes: &[u8]) -> Self {
        if version_of(bytes, INDEX_MAGIC_BYTES) == Some(SEALED_FORMAT_VERSION) {
            match open_envelope(bytes, INDEX_MAGIC_BYTES, SEALED_INDEX_BODY) {
                Ok(envelope) => IndexCopy::Sealed(envelope),
                Err(error) => IndexCopy::Invalid(error),
            }
        } else {
            match IndexHeader::decode(bytes) {
                Ok(header) => IndexCopy::Plain(header),
                Err(error) => IndexCopy::Invalid(error),
            }
        }
    }
}

/// A key error about `path`, as [`Error::Key`].
fn key_error(error: KeyError, path: &Path) -> Error {
    key_error_naming(error, path, path.display())
}

/// A key error about the file `path`, which its message calls `what`.
fn key_error_naming(error: KeyError, path: &Path, what: impl std::fmt::Display) -> Error {
    Error::Key {
        context: format!(
            "opening the store in {}",
            path.parent().unwrap_or(path).display()
        ),
        source: error.into_io(what),
    }
}

/// Locks the store in `directory`: for writing, `sediment.lock`
/// exclusively (created if need be) and, if the index exists, the index
/// exclusively too; read-only, `sediment.lock` shared or, if a copy of the
/// store left that file out, the index shared. A read-only open creates
/// nothing, and a writer cannot open the store while a reader holds
/// either file (nor a reader while a writer holds both).
fn lock_store(fs: &Arc<dyn FileSystem>, directory: &Path, writable: bool) -> io::Result<StoreLock> {
    let lock_file = directory.join(LOCK_FILE);
    let index = directory.join(INDEX_FILE);
    if writable {
        okaywal::fs::create_dir_durably(&**fs, directory)?;
        let lock = OpenLock::take(fs.clone(), &lock_file)?;
        let index = if fs.exists(&index)? {
            Some(fs.lock_exclusive(&index)?)
        } else {
            // A new store: any reader finds the lock file this open made.
            None
        };
        Ok(StoreLock::Writer {
            lock,
            _index: index,
        })
    } else {
        let guard = if fs.exists(&lock_file)? {
            fs.lock_shared(&lock_file)?
        } else {
            fs.lock_shared(&index)?
        };
        Ok(StoreLock::Reader { _guard: guard })
    }
}

/// What [`Database::open`] found before the WAL replays.
fn open_index(
    fs: &dyn FileSystem,
    directory: &Path,
    names: &[String],
    writable: bool,
    provider: Option<&Arc<dyn KeyProvider>>,
) -> Result<OpenedIndex> {
    let path = directory.join(INDEX_FILE);
    let strata = names
        .iter()
        .filter(|n| stratum::parse_file_name(n).is_some())
        .count();
    let logs = names
        .iter()
        .filter(|n| crate::commit_log::parse_file_name(n).is_some())
        .count();
    let wal = names
        .iter()
        .filter(|n| okaywal::LogFileName::parse(n).is_some())
        .count();
    let mut exists = fs
        .exists(&path)
        .context(|| format!("checking {}", path.display()))?;
    let valid = exists && index_has_a_valid_copy(fs, &path)?;
    if !writable && !valid && strata + logs + wal == 0 {
        return Err(Error::Io {
            context: format!("opening the store in {} read-only", directory.display()),
            source: io::Error::new(
                io::ErrorKind::NotFound,
                if exists {
                    "the directory holds no store (its index file is not a sediment index)"
                } else {
                    "the directory holds no store (no index file)"
                },
            ),
        });
    }
    if exists && !valid && strata + logs + wal == 0 {
        // The index is the first file a store creates, and the only one
        // here. If it is what a cut-short creation leaves (a file system
        // may make the new name durable before the data, e.g. when another
        // file's sync commits the journal), nothing was ever stored: start
        // afresh. Any other file of that name is not ours to replace.
        if !unfinished_index(fs, &path)? {
            return Err(Error::Corrupt {
                path,
                what: "the file is not a sediment index (it does not start with the index \
                       magic) and the directory holds no other store file: it is not a \
                       store, and the file is left as it is"
                    .to_string(),
            });
        }
        fs.remove_file(&path)
            .context(|| format!("removing the unfinished {}", path.display()))?;
        exists = false;
    }
    if exists {
        let file =
            open_existing(fs, &path, writable).context(|| format!("opening {}", path.display()))?;
        let len = file
            .len()
            .context(|| format!("reading {}", path.display()))?;
        let mut copies = Vec::new();
        for slot in 0..2 {
            let start = slot * INDEX_SLOT_SIZE;
            let mut bytes = vec![0; len.saturating_sub(start).min(INDEX_SLOT_SIZE) as usize];
            file.read_exact_at(&mut bytes, start)
                .context(|| format!("reading {}", path.display()))?;
            copies.push(IndexCopy::read(&bytes));
        }
        let sealed = copies.iter().any(|c| matches!(c, IndexCopy::Sealed(_)));
        let plain = copies.iter().any(|c| matches!(c, IndexCopy::Plain(_)));
        // Whether the store is encrypted is settled before anything is
        // changed: a key for a plain store, or none for an encrypted one,
        // is refused.
        let decoded: Vec<Result<SealedIndex, HeaderError>> = match (provider, sealed) {
            (None, true) => {
                // Name the key the store wants: key ids are plaintext.
                let wanted = copies.iter().find_map(|copy| match copy {
                    IndexCopy::Sealed(envelope) => Some(envelope.key_check.key_id),
                    _ => None,
                });
                let what = match wanted {
                    Some(id) => format!("{} (encrypted with {id})", path.display()),
                    None => path.display().to_string(),
                };
                return Err(key_error_naming(KeyError::NotConfigured, &path, what));
            }
            (Some(_), false) if plain => return Err(key_error(KeyError::NotEncrypted, &path)),
            (Some(provider), true) => {
                let mut decoded = Vec::new();
                for (slot, copy) in copies.into_iter().enumerate() {
                    decoded.push(match copy {
                        IndexCopy::Sealed(envelope) => {
                            match Sealer::open_index(
                                provider,
                                &envelope,
                                slot as u64,
                                &path.display(),
                            ) {
                                Ok((body, _)) => SealedIndex::decode_body(&body),
                                Err(Unsealed::Damaged) => Err(HeaderError::NotAuthentic),
                                Err(Unsealed::Key(source)) => {
                                    return Err(Error::from_io(
                                        format!("opening the store in {}", directory.display()),
                                        source,
                                    ))
                                }
                            }
                        }
                        IndexCopy::Plain(_) => Err(HeaderError::UnknownVersion(1)),
                        IndexCopy::Invalid(error) => Err(error),
                    });
                }
                decoded
            }
            _ => copies
                .into_iter()
                .map(|copy| match copy {
                    IndexCopy::Plain(header) => Ok(SealedIndex {
                        header,
                        store_id: [0; 16],
                        key_checks: Vec::new(),
                    }),
                    IndexCopy::Sealed(_) => Err(HeaderError::UnknownVersion(SEALED_FORMAT_VERSION)),
                    IndexCopy::Invalid(error) => Err(error),
                })
                .collect(),
        };
        let mut decoded = decoded.into_iter();
        let first = decoded.next().unwrap_or(Err(HeaderError::Truncated));
        let second = decoded.next().unwrap_or(Err(HeaderError::Truncated));
        let copies = [first.clone(), second.clone()];
        let (slot, opened) =
            newest(first, second, |h| h.header.generation).map_err(|(a, b)| Error::Corrupt {
                path: path.clone(),
                what: format!("both index header copies are invalid ({a}; {b})"),
            })?;
        let sealer = match provider {
            Some(provider) => {
                // Every key the store's files may be sealed with must be
                // there and right before anything is read or changed.
                Sealer::verify_key_checks(provider, &opened.key_checks, &path.display())
                    .context(|| format!("opening the store in {}", directory.display()))?;
                Some(Arc::new(
                    Sealer::new(provider.clone(), opened.store_id, &opened.key_checks)
                        .context(|| format!("opening the store in {}", directory.display()))?,
                ))
            }
            None => None,
        };
        let header = opened.header;
        let same = copies[1 - slot]
            .as_ref()
            .is_ok_and(|other| other.header == header && other.store_id == opened.store_id);
        if writable && !same {
            // A checkpoint leaves both copies alike, so the other one was
            // being written when a crash hit, or has decayed since: make it
            // a copy of the good one again.
            let other = 1 - slot as u64;
            let repaired = encode_index(sealer.as_deref(), &header, other)
                .and_then(|bytes| file.write_all_at(&bytes, other * INDEX_SLOT_SIZE))
                .and_then(|()| file.sync_data());
            match repaired {
                // An index no checkpoint has written yet (generation 1, the
                // other copy never written): on a full disk the first
                // checkpoint writes both copies instead (see `Stratum::open`).
                Err(err)
                    if err.kind() == io::ErrorKind::StorageFull
                        && header.generation == 1
                        && copies[1 - slot].is_err() => {}
                repaired => {
                    repaired.context(|| format!("repairing a header copy of {}", path.display()))?
                }
            }
        }
        Ok(OpenedIndex {
            file,
            header,
            next_slot: 1 - slot,
            sealer,
        })
    } else {
        // The index is created, synced and named in the directory before any
        // stratum or commit log file exists, so finding those without it is
        // damage. A fresh index would forget the embedded header and every
        // checkpointed strata count; refuse instead.
        if strata + logs + wal > 0 {
            // The WAL too is created after the index: a directory with WAL
            // files and no index is an okaywal log of its own, or a store
            // that lost its index; creating one would write into either.
            return Err(Error::Corrupt {
                path,
                what: format!(
                    "the index file is missing, but the directory holds {strata} stratum, \
                     {logs} commit log and {wal} write-ahead log file(s) (an okaywal log, or \
                     a store that lost its index)"
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
        let sealer = match provider {
            Some(provider) => Some(Arc::new(
                Sealer::new_store_id()
                    .and_then(|id| Sealer::new(provider.clone(), id, &[]))
                    .context(|| format!("creating {}", path.display()))?,
            )),
            None => None,
        };
        encode_index(sealer.as_deref(), &header, 0)
            .and_then(|bytes| file.write_all_at(&bytes, 0))
            .and_then(|()| file.sync_data())
            .and_then(|()| fs.sync_dir(directory))
            .context(|| format!("initializing {}", path.display()))?;
        Ok(OpenedIndex {
            file,
            header,
            next_slot: 1,
            sealer,
        })
    }
}

/// Whether the index file at `path` (no copy of which decodes) is what a
/// cut-short creation leaves: empty, all zeros, or the start of a header
/// copy (the index magic, or a prefix of it, then anything).
fn unfinished_index(fs: &dyn FileSystem, path: &Path) -> Result<bool> {
    let (file, len) = open_to_read(fs, path)?;
    let mut bytes = vec![0; len.min(INDEX_SLOT_SIZE) as usize];
    file.read_exact_at(&mut bytes, 0)
        .context(|| format!("reading {}", path.display()))?;
    Ok(unwritten_or_begins_with(&bytes, &INDEX_MAGIC_BYTES))
}

/// Whether `bytes` (a header slot's) are what this crate, or a write of it
/// cut short, leaves there: nothing, all zeros, or `magic` (or as much of
/// it as there is) followed by anything.
fn unwritten_or_begins_with(bytes: &[u8], magic: &[u8]) -> bool {
    let magic = &magic[..bytes.len().min(magic.len())];
    bytes.iter().all(|b| *b == 0) || bytes.starts_with(magic)
}

/// For a stratum file none of whose header copies decodes: the error for
/// another program's file, if its header slots hold bytes that neither
/// sediment nor a cut-short write of it leaves there (each slot is all
/// zeros, or begins with the stratum magic).
fn refuse_unrecognised_stratum(fs: &dyn FileSystem, path: &Path, slot_size: u64) -> Result<()> {
    let (file, len) = open_to_read(fs, path)?;
    for slot in 0..2 {
        let start = slot * slot_size;
        let mut bytes = vec![0; len.saturating_sub(start).min(slot_size) as usize];
        file.read_exact_at(&mut bytes, start)
            .context(|| format!("reading {}", path.display()))?;
        if !unwritten_or_begins_with(&bytes, &crate::format::STRATUM_MAGIC_BYTES) {
            return Err(Error::UnrecognisedFile {
                path: path.to_path_buf(),
                what: format!(
                    "its header copy {slot} is neither a stratum header (\"SEDSTRAT\") nor \
                     zeros: it begins with {}",
                    crate::error::first_bytes(&bytes)
                ),
            });
        }
    }
    Ok(())
}

/// The file at `path`, opened for reading, and its length.
pub(crate) fn open_to_read(fs: &dyn FileSystem, path: &Path) -> Result<(Arc<dyn FileHandle>, u64)> {
    let file = fs
        .open(path, OpenMode::Read)
        .context(|| format!("opening {}", path.display()))?;
    let len = file
        .len()
        .context(|| format!("reading {}", path.display()))?;
    Ok((file, len))
}

/// Whether either copy of the index header at `path` decodes.
fn index_has_a_valid_copy(fs: &dyn FileSystem, path: &Path) -> Result<bool> {
    let (file, len) = open_to_read(fs, path)?;
    for slot in 0..2 {
        let start = slot * INDEX_SLOT_SIZE;
        let mut bytes = vec![0; len.saturating_sub(start).min(INDEX_SLOT_SIZE) as usize];
        file.read_exact_at(&mut bytes, start)
            .context(|| format!("reading {}", path.display()))?;
        // A sealed copy whose checksum is right counts, whatever the key.
        if !matches!(IndexCopy::read(&bytes), IndexCopy::Invalid(_)) {
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
    sealer: Option<&Arc<Sealer>>,
) -> Result<Vec<Vec<Arc<Stratum>>>> {
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
                // A file of another program named like a later stratum is
                // no sign that strata are missing: name it instead.
                let path = directory.join(stratum::file_name(basin, number));
                refuse_unrecognised_stratum(fs, &path, stratum_slot_size(basin, sealer))?;
                return Err(Error::Corrupt {
                    path: directory.join(stratum::file_name(basin, expected as u32)),
                    what: format!("stratum file is missing (stratum {number} exists)"),
                });
            }
            let is_known = number < known[usize::from(basin)];
            strata.push(Arc::new(open_stratum(
                fs, directory, basin, number, is_known, writable, sealer,
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
        basins.push(strata);
    }
    Ok(basins)
}

/// The size of a stratum header slot of `basin` in this store's layout.
fn stratum_slot_size(basin: u8, sealer: Option<&Arc<Sealer>>) -> u64 {
    let layout = if sealer.is_some() {
        Layout::Sealed
    } else {
        Layout::Plain
    };
    layout.slot_size(basin)
}

/// Opens one stratum; `known` says the index lists it as created.
fn open_stratum(
    fs: &dyn FileSystem,
    directory: &Path,
    basin: u8,
    number: u32,
    known: bool,
    writable: bool,
    sealer: Option<&Arc<Sealer>>,
) -> Result<Stratum> {
    match Stratum::open(fs, directory, basin, number, writable, sealer) {
        Err(Error::Corrupt { path, what }) if !known => {
            // A stratum whose creation was cut short before its header was
            // synced holds no grains yet; one with grains is really damaged.
            // (A stratum the index knows had a durable header once, so a
            // short file there is damage, not a crash: see FORMAT.md.)
            let len = fs
                .open(&path, OpenMode::Read)
                .and_then(|f| f.len())
                .context(|| format!("reading {}", path.display()))?;
            let slot_size = stratum_slot_size(basin, sealer);
            // Never take another program's file for a cut-short creation,
            // which would overwrite it, or for damage.
            refuse_unrecognised_stratum(fs, &path, slot_size)?;
            if len <= 2 * slot_size {
                if writable {
                    Stratum::create(fs, directory, basin, number, sealer)
                } else {
                    Stratum::unfinished(fs, directory, basin, number, sealer)
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
        let fs = config.file_system_in_use().clone();
        let directory = config.directory().to_path_buf();
        let writable = !config.is_read_only();
        // Before anything is read: open repairs and removes files. Until
        // the open succeeds, a lock file this open created goes again if it
        // fails (a refused directory is left as it was found).
        let lock = lock_store(&fs, &directory, writable)
            .context(|| format!("opening the store in {}", directory.display()))?;
        // (The file system's error names the directory already.)
        let names = fs
            .list_files(&directory)
            .context(|| format!("opening the store in {}", directory.display()))?;
        let provider = config.key_provider();
        let OpenedIndex {
            file: index_file,
            header: index,
            next_slot,
            sealer,
        } = open_index(&*fs, &directory, &names, writable, provider.as_ref())?;
        if let (true, Some(sealer)) = (writable, sealer.as_deref()) {
            crate::rekey::remove_leftovers(&*fs, &directory, &names, sealer)?;
        }
        let wal_floor = index.wal_checkpointed_entry;
        let strata = open_strata(
            &*fs,
            &directory,
            &names,
            &index.strata,
            writable,
            sealer.as_ref(),
        )?;
        let mut commit_log = CommitLogFiles::open(
            &directory,
            fs.clone(),
            &names,
            index.commit_log_file,
            index.commit_log_end,
            writable,
            sealer.clone(),
        )?;

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
        let reclamation = Reclamation::recovered(&index, contents.records);

        let shared = Arc::new(Shared::new(
            &config,
            strata,
            reclamation,
            Store::new(index_file, index, next_slot, commit_log, sealer.clone()),
            lock,
            sealer,
        ));
        // `Config::open` checked that the WAL's directory and file system
        // are the database's.
        let wal_config = config.into_wal_configuration();
        // Sequences are WAL entry ids: never hand out one the strata have
        // already seen, whatever happened to the WAL's files (and never one
        // below a floor the configuration asks for).
        let floor = wal_floor
            .saturating_add(1)
            .max(wal_config.minimum_next_entry_id);
        let wal_config = wal_config.minimum_next_entry_id(floor);
        // Recovery that may drop damaged WAL entries: an entry it drops may
        // have blobs in the strata already (see `crate::orphans`).
        let drops_entries =
            writable && wal_config.recovery_mode != okaywal::RecoveryMode::ErrorOnCorruption;
        if drops_entries {
            shared.track_replayed();
        }
        let wal = if writable {
            wal_config.open(Manager::new(shared.clone())).map(Wal::Live)
        } else {
            wal_config
                .open_read_only(Manager::new(shared.clone()))
                .map(|wal| Wal::ReadOnly(Arc::new(wal)))
        }
        .context(|| "opening the write-ahead log".to_string())?;
        let db = Self::from_parts(shared, wal);
        if let Some(through) = hidden_through {
            db.forget_unprovable_archives(through);
        }
        if let Some(replayed) = db.shared().take_replayed() {
            crate::orphans::drop_orphans(&db, wal_floor, &replayed)?;
        }
        if writable {
            // A rekey that a crash cut short finishes its last batch now
            // that the WAL replay says which blobs are live.
            crate::rekey::finish_interrupted(&db)?;
        }
        db.shared().opened();
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
        let candidates = self.shared().reclamation().archives_before(through);
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
            self.shared().reclamation().forget_archive(id, archived_by);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commit_record::SequenceId;
    use crate::grain_id::GrainId;

    /// What open concludes when damage hid the commit records up to
    /// `through`: `meta` says `id` was archived by `archived_by`, as a
    /// readable record said, but a hidden record may have freed it since.
    fn provable_after_damage(
        db: &Database,
        id: GrainId,
        archived_by: SequenceId,
        through: SequenceId,
    ) -> bool {
        db.shared().reclamation().record_archive(id, archived_by.0);
        db.forget_unprovable_archives(through.0);
        db.shared().reclamation().is_archived_by(id, archived_by.0)
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
