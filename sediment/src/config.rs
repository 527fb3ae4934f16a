//! Settings for opening a database.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use okaywal::encryption::KeyProvider;
use okaywal::fs::{FileSystem, StdFileSystem};

use crate::error::{Error, Result};
use crate::format::{MAX_FORMAT_BLOB_BYTES, MAX_SEALED_BLOB_BYTES};
use crate::sealing::SharedProvider;

/// Default largest blob: 256 MiB.
pub const DEFAULT_MAX_BLOB_BYTES: u64 = 256 << 20;
/// Default size of a WAL segment for a database: 4 MiB.
pub const DEFAULT_WAL_SEGMENT_BYTES: u64 = 4 << 20;
/// Default size of the cache of small blobs that `get` keeps: 128 MiB.
pub const DEFAULT_CACHE_BYTES: u64 = 128 << 20;
/// Blobs at least this large are written straight into their grains
/// (synced before the commit, buffered or not) instead of passing through
/// the WAL.
pub const DEFAULT_DIRECT_WRITE_BYTES: u64 = 64 << 10;

/// How to open a [`Database`](crate::Database).
///
/// ```rust
/// # fn main() -> sediment::Result<()> {
/// let dir = tempfile::tempdir()?;
/// let db = sediment::Config::for_directory(dir.path())
///     .wal(|wal| wal.checkpoint_after_bytes(4 << 20))
///     .max_blob_bytes(1 << 30 >> 1)
///     .open()?;
/// db.shutdown()?;
/// # Ok(())
/// # }
/// ```
///
/// Settings are made with the builder methods and read with the getters.
/// A setting the store cannot honour is never replaced by another value:
/// [`Config::open`] refuses it with [`Error::InvalidConfig`] naming it
/// (a `max_blob_bytes` above what the format holds; a WAL directory or
/// file system set through [`Config::wal`], since the WAL always lives in
/// the database's directory on its file system).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    pub(crate) directory: PathBuf,
    /// Its `directory` and `file_system` are the database's (set with
    /// them, and checked by `Config::open`).
    pub(crate) wal: okaywal::Configuration,
    pub(crate) file_system: Arc<dyn FileSystem>,
    pub(crate) max_blob_bytes: u64,
    pub(crate) direct_write_bytes: u64,
    pub(crate) cache_bytes: u64,
    pub(crate) read_only: bool,
    /// Set by [`Config::encryption`].
    encryption: Option<SharedProvider>,
}

impl Config {
    /// The default configuration for a database in `directory`.
    ///
    /// The WAL uses 4 MiB segments: small blobs travel through it and are
    /// moved into the strata at each WAL checkpoint, and large blobs bypass
    /// it, so larger segments would mostly cost disk space.
    pub fn for_directory<P: AsRef<Path>>(directory: P) -> Self {
        let directory = directory.as_ref().to_path_buf();
        let file_system: Arc<dyn FileSystem> = Arc::new(StdFileSystem);
        Self {
            wal: okaywal::Configuration::default_for(&directory)
                .shared_file_system(file_system.clone())
                .preallocate_bytes(DEFAULT_WAL_SEGMENT_BYTES)
                .checkpoint_after_bytes(DEFAULT_WAL_SEGMENT_BYTES),
            directory,
            file_system,
            max_blob_bytes: DEFAULT_MAX_BLOB_BYTES,
            direct_write_bytes: DEFAULT_DIRECT_WRITE_BYTES,
            cache_bytes: DEFAULT_CACHE_BYTES,
            read_only: false,
            encryption: None,
        }
    }

    /// Encrypts the store at rest with keys from `key_provider` (a
    /// [`StaticKey`](okaywal::encryption::StaticKey), a
    /// [`Keyring`](okaywal::encryption::Keyring), or an application's own
    /// [`KeyProvider`] over a KMS).
    ///
    /// Everything sediment writes into its files is then ciphertext,
    /// authenticated with AES-256-GCM and bound to its place:
    /// blobs, stratum headers and bitmaps, the index and the commit log
    /// (`FORMAT.md`, format version 2, lists what stays plaintext: format
    /// versions, key ids, nonces and tags). The WAL is an encrypted okaywal
    /// log with the same provider
    /// ([`okaywal::Configuration::encryption`]). Bytes changed, moved to another
    /// place, or an old copy of a grain that was freed and reused, read as
    /// damage ([`Error::ChecksumMismatch`](crate::Error::ChecksumMismatch),
    /// [`Error::Corrupt`](crate::Error::Corrupt)), never as data.
    ///
    /// A store is encrypted or not from its creation on: opening an
    /// encrypted store without a key, or a plain one with a key, fails
    /// with [`Error::Key`](crate::Error::Key), as does opening with a
    /// missing or wrong key (the error names the key id the store wants),
    /// and nothing is changed.
    ///
    /// New data is sealed with the provider's current key; older keys are
    /// asked for by id when old data is read. After rotating the key,
    /// [`Database::rekey`](crate::Database::rekey) rewrites what the old
    /// keys sealed, so that they can be retired.
    #[must_use]
    pub fn encryption(mut self, key_provider: impl KeyProvider) -> Self {
        let shared = SharedProvider(Arc::new(key_provider));
        self.encryption = Some(shared);
        self
    }

    /// The key provider set with [`Config::encryption`], if any.
    #[must_use]
    pub fn key_provider(&self) -> Option<Arc<dyn KeyProvider>> {
        self.encryption.as_ref().map(|shared| shared.0.clone())
    }

    /// Opens the store read-only: not a byte is written. No header copy is
    /// repaired, the WAL is not replayed into the strata (what it holds is
    /// read from its files, recovered as usual in memory), nothing is
    /// recycled and nothing is checkpointed on close; transactions,
    /// [`Database::checkpoint_wal`](crate::Database::checkpoint_wal),
    /// [`Database::sync`](crate::Database::sync) and
    /// [`Database::rekey`](crate::Database::rekey) fail with
    /// [`Error::ReadOnly`]. The
    /// store's lock is taken shared: any number of read-only opens may run
    /// at once, none while a writer has the store open, and a writer
    /// cannot open it while one lives (both fail with an error naming the
    /// lock file). A directory without a store is an error, not created.
    /// The WAL's [`RecoveryMode`](okaywal::RecoveryMode) applies as usual
    /// (a point-in-time cut is made in memory only).
    ///
    /// [`Error::ReadOnly`]: crate::Error::ReadOnly
    #[must_use]
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// Adjusts the WAL settings: segment sizes, buffers, recovery mode,
    /// version info and so on.
    ///
    /// The WAL's directory and file system are the database's: changing
    /// them here makes [`Config::open`] fail with
    /// [`Error::InvalidConfig`] (use [`Config::for_directory`] and
    /// [`Config::file_system`]). A `minimum_next_entry_id` is honoured
    /// together with the store's own floor: the WAL starts at the higher
    /// of the two.
    #[must_use]
    pub fn wal(
        mut self,
        configure: impl FnOnce(okaywal::Configuration) -> okaywal::Configuration,
    ) -> Self {
        self.wal = configure(self.wal);
        self
    }

    /// Runs the database (and its WAL) on `file_system` instead of the
    /// real disk.
    #[must_use]
    pub fn file_system<F: FileSystem>(self, file_system: F) -> Self {
        self.shared_file_system(Arc::new(file_system))
    }

    /// Runs the database (and its WAL) on an already shared file system.
    #[must_use]
    pub fn shared_file_system(mut self, file_system: Arc<dyn FileSystem>) -> Self {
        self.wal = self.wal.shared_file_system(file_system.clone());
        self.file_system = file_system;
        self
    }

    /// Sets the largest blob `write` accepts: at most
    /// [`MAX_FORMAT_BLOB_BYTES`] (1 GiB − 16 bytes), the largest the format
    /// holds; [`Config::open`] refuses a larger value.
    #[must_use]
    pub fn max_blob_bytes(mut self, bytes: u64) -> Self {
        self.max_blob_bytes = bytes;
        self
    }

    /// Bounds how long a [`commit_buffered`](crate::Transaction::commit_buffered)
    /// transaction stays unsynced: a background thread of the WAL syncs
    /// at least every `interval` while buffered commits wait, so each is
    /// durable (survives a power loss) within about `interval` of its
    /// return, without a [`Database::sync`](crate::Database::sync). (The WAL's
    /// [`max_unsynced`](okaywal::Configuration::max_unsynced); no bound
    /// by default.) Durable commits are not affected.
    #[must_use]
    pub fn max_unsynced(mut self, interval: std::time::Duration) -> Self {
        self.wal = self.wal.max_unsynced(interval);
        self
    }

    /// Bounds how many bytes of [`commit_buffered`](crate::Transaction::commit_buffered)
    /// transactions' WAL entries stay unsynced: the buffered commit that
    /// brings them to `bytes` syncs the WAL before it returns, and is
    /// durable then with every commit before it. (The WAL's
    /// [`max_unsynced_bytes`](okaywal::Configuration::max_unsynced_bytes);
    /// no bound by default.) Blobs that bypass the WAL count only with
    /// their line in the commit record: their bytes are synced into their
    /// grains before any commit returns.
    #[must_use]
    pub fn max_unsynced_bytes(mut self, bytes: u64) -> Self {
        self.wal = self.wal.max_unsynced_bytes(bytes);
        self
    }

    /// Sets the size from which blobs bypass the WAL.
    #[must_use]
    pub fn direct_write_bytes(mut self, bytes: u64) -> Self {
        self.direct_write_bytes = bytes;
        self
    }

    /// Sets how much memory the blob cache may hold (default
    /// [`DEFAULT_CACHE_BYTES`]; 0 turns it off). It keeps blobs of up to
    /// 64 KiB that committed transactions wrote or
    /// [`Database::get`](crate::Database::get) read, evicting the oldest
    /// first, so reads right after a load hit as well as repeated ones. A
    /// hit costs a hash lookup and a copy instead of a system call; freed
    /// blobs leave the cache at once.
    #[must_use]
    pub fn cache_bytes(mut self, bytes: u64) -> Self {
        self.cache_bytes = bytes;
        self
    }

    /// The database directory.
    #[must_use]
    pub fn directory(&self) -> &Path {
        &self.directory
    }

    /// The WAL settings (see [`Config::wal`]).
    #[must_use]
    pub fn wal_configuration(&self) -> &okaywal::Configuration {
        &self.wal
    }

    /// The file system the database and its WAL live on (see
    /// [`Config::file_system`]).
    #[must_use]
    pub fn file_system_in_use(&self) -> &Arc<dyn FileSystem> {
        &self.file_system
    }

    /// The largest blob `write` accepts (see [`Config::max_blob_bytes`]).
    #[must_use]
    pub fn blob_size_limit(&self) -> u64 {
        self.max_blob_bytes
    }

    /// The size from which blobs bypass the WAL (see
    /// [`Config::direct_write_bytes`]).
    #[must_use]
    pub fn direct_write_threshold(&self) -> u64 {
        self.direct_write_bytes
    }

    /// The memory for recently read blobs (see [`Config::cache_bytes`]).
    #[must_use]
    pub fn cache_size(&self) -> u64 {
        self.cache_bytes
    }

    /// True if the store is to be opened read-only.
    pub(crate) fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// The WAL's configuration, taken out of the database's, with the
    /// store's key provider.
    pub(crate) fn into_wal_configuration(self) -> okaywal::Configuration {
        match self.encryption {
            Some(provider) => wal_encryption(self.wal, provider),
            None => self.wal,
        }
    }

    /// Fails with [`Error::InvalidConfig`] naming the first setting that
    /// cannot be honoured.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.directory.as_os_str().is_empty() {
            return Err(Error::InvalidConfig(
                "the store's directory is an empty path: name a directory (\".\" for the \
                 current one)"
                    .to_string(),
            ));
        }
        if self.max_blob_bytes > MAX_FORMAT_BLOB_BYTES {
            return Err(Error::InvalidConfig(format!(
                "max_blob_bytes is {}, above {MAX_FORMAT_BLOB_BYTES} bytes (1 GiB - 16), the \
                 largest blob the format holds",
                self.max_blob_bytes
            )));
        }
        if self.encryption.is_some() && self.max_blob_bytes > MAX_SEALED_BLOB_BYTES {
            return Err(Error::InvalidConfig(format!(
                "max_blob_bytes is {}, above {MAX_SEALED_BLOB_BYTES} bytes, the largest blob an \
                 encrypted store holds (its chunks' seals take the rest of 1 GiB)",
                self.max_blob_bytes
            )));
        }
        if self.wal.directory != self.directory {
            return Err(Error::InvalidConfig(format!(
                "wal.directory is {}, but the WAL always lives in the database directory {}: \
                 choose the directory with Config::for_directory, not in Config::wal",
                self.wal.directory.display(),
                self.directory.display()
            )));
        }
        if !Arc::ptr_eq(&self.wal.file_system, &self.file_system) {
            return Err(Error::InvalidConfig(
                "wal.file_system differs from the database's file system, but the WAL always \
                 lives on the database's file system: choose it with Config::file_system, not \
                 in Config::wal"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// The WAL of an encrypted store: okaywal seals its records (chunks,
/// commit records, entry ids) with the same provider. Blobs that travel
/// through the WAL are also sealed before they enter it (they are the
/// grains' images), so they are bound to their grains as well.
fn wal_encryption(wal: okaywal::Configuration, provider: SharedProvider) -> okaywal::Configuration {
    wal.encryption(provider)
}
