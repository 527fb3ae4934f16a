//! Settings for opening a database.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use okaywal::fs::{FileSystem, StdFileSystem};

use crate::format::MAX_FORMAT_BLOB_BYTES;
use crate::{Database, Result};

/// Default largest blob: 256 MiB.
pub const DEFAULT_MAX_BLOB_BYTES: u64 = 256 << 20;
/// Default size of a WAL segment for a database: 4 MiB.
pub const DEFAULT_WAL_SEGMENT_BYTES: u64 = 4 << 20;
/// Default size of the cache of small blobs that `get` keeps: 128 MiB.
pub const DEFAULT_CACHE_BYTES: u64 = 128 << 20;
/// Blobs at least this large are written straight into their grains
/// (synced before the commit) instead of passing through the WAL.
pub const DEFAULT_DIRECT_WRITE_BYTES: u64 = 64 << 10;

/// How to open a [`Database`].
///
/// ```rust
/// # fn main() -> sediment::Result<()> {
/// let dir = tempfile::tempdir()?;
/// let db = sediment::Config::for_directory(dir.path())
///     .wal(|wal| wal.checkpoint_after_bytes(4 << 20))
///     .max_blob_bytes(1 << 30)
///     .open()?;
/// db.shutdown()?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Config {
    /// The database directory.
    pub directory: PathBuf,
    /// Settings of the write-ahead log (its directory and file system are
    /// always the database's).
    pub wal: okaywal::Configuration,
    /// The file system the database lives on.
    pub file_system: Arc<dyn FileSystem>,
    /// The largest blob accepted by `write`.
    pub max_blob_bytes: u64,
    /// Blobs of at least this many bytes bypass the WAL (see
    /// [`DEFAULT_DIRECT_WRITE_BYTES`]).
    pub direct_write_bytes: u64,
    /// Memory for recently read small blobs (see [`Config::cache_bytes`]).
    pub cache_bytes: u64,
    /// Open without writing anything (see [`Config::read_only`]).
    pub read_only: bool,
}

impl Config {
    /// The default configuration for a database in `directory`.
    ///
    /// The WAL uses 4 MiB segments: small blobs travel through it and are
    /// moved into the strata at each WAL checkpoint, and large blobs bypass
    /// it, so larger segments would mostly cost disk space.
    pub fn for_directory<P: AsRef<Path>>(directory: P) -> Self {
        let directory = directory.as_ref().to_path_buf();
        Self {
            wal: okaywal::Configuration::default_for(&directory)
                .preallocate_bytes(DEFAULT_WAL_SEGMENT_BYTES)
                .checkpoint_after_bytes(DEFAULT_WAL_SEGMENT_BYTES),
            directory,
            file_system: Arc::new(StdFileSystem),
            max_blob_bytes: DEFAULT_MAX_BLOB_BYTES,
            direct_write_bytes: DEFAULT_DIRECT_WRITE_BYTES,
            cache_bytes: DEFAULT_CACHE_BYTES,
            read_only: false,
        }
    }

    /// Opens the store read-only: not a byte is written. No header copy is
    /// repaired, the WAL is not replayed into the strata (what it holds is
    /// read from its files, recovered as usual in memory), nothing is
    /// recycled and nothing is checkpointed on close; transactions and
    /// [`Database::checkpoint_wal`] fail with [`Error::ReadOnly`]. The
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

    /// Adjusts the WAL settings.
    #[must_use]
    pub fn wal(
        mut self,
        configure: impl FnOnce(okaywal::Configuration) -> okaywal::Configuration,
    ) -> Self {
        self.wal = configure(self.wal);
        self
    }

    /// Runs the database on `file_system` instead of the real disk.
    #[must_use]
    pub fn file_system<F: FileSystem>(mut self, file_system: F) -> Self {
        self.file_system = Arc::new(file_system);
        self
    }

    /// Sets the largest blob `write` accepts (at most 1 GiB − 16 bytes).
    #[must_use]
    pub fn max_blob_bytes(mut self, bytes: u64) -> Self {
        self.max_blob_bytes = bytes.min(MAX_FORMAT_BLOB_BYTES);
        self
    }

    /// Sets the size from which blobs bypass the WAL.
    #[must_use]
    pub fn direct_write_bytes(mut self, bytes: u64) -> Self {
        self.direct_write_bytes = bytes;
        self
    }

    /// Sets how much memory [`Database::get`] may keep for recently read
    /// blobs of up to 64 KiB (default [`DEFAULT_CACHE_BYTES`]; 0 turns the
    /// cache off). A hit costs a hash lookup and a copy instead of a system
    /// call; freed blobs leave the cache at once.
    #[must_use]
    pub fn cache_bytes(mut self, bytes: u64) -> Self {
        self.cache_bytes = bytes;
        self
    }

    /// Opens (creating or recovering) the database.
    ///
    /// Fails with [`Error::Io`](crate::Error::Io) (of kind
    /// [`WouldBlock`](std::io::ErrorKind::WouldBlock)) if another process
    /// has the store open: its `sediment.lock` stays locked for 2 s.
    pub fn open(self) -> Result<Database> {
        Database::open(self)
    }

    /// The same as [`Config::open`].
    pub fn recover(self) -> Result<Database> {
        self.open()
    }
}
