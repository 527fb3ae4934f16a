//! Settings for opening a log.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::encryption::{Cipher, KeyProvider};
use crate::format::MAX_VERSION_INFO;
use crate::fs::{FileSystem, StdFileSystem};
use crate::tuning::{MAX_BUFFER_BYTES, MAX_PREALLOCATE_BYTES};
use crate::{LogManager, WriteAheadLog};

/// Default preallocated size of a segment: 32 MiB.
pub const DEFAULT_PREALLOCATE_BYTES: u64 = 32 * 1024 * 1024;
/// Default segment size that triggers a checkpoint: 32 MiB.
pub const DEFAULT_CHECKPOINT_AFTER_BYTES: u64 = 32 * 1024 * 1024;
/// Default buffer size for streaming chunk writes and sequential reads.
pub const DEFAULT_BUFFER_BYTES: usize = 256 * 1024;

/// What recovery does with damage in the middle of the log: bytes that
/// were synced once and no longer verify, with valid records after them.
/// (A torn tail, the normal result of a crash, is always cut off.)
///
/// The damaged segment stays on disk until it has been checkpointed, so
/// reopening before that needs the same mode again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RecoveryMode {
    /// Opening fails with an `InvalidData` error naming the segment and
    /// offset: nothing committed is dropped silently.
    #[default]
    ErrorOnCorruption,
    /// Keep everything before the first damaged record and drop the rest of
    /// the log (like RocksDB's point-in-time recovery).
    PointInTime,
    /// Skip the damaged record (its entry is lost) and keep everything
    /// after it.
    SkipCorrupted,
}

/// Byte strings that [`Configuration::version_info`] accepts: `Vec<u8>`
/// (also boxed or borrowed), `Arc<Vec<u8>>`, `&[u8]`, byte arrays, `&str`,
/// `String` and `&String`.
pub trait IntoVersionInfo {
    /// The bytes, shared as the configuration stores them.
    fn into_version_info(self) -> Arc<Vec<u8>>;
}

impl IntoVersionInfo for Arc<Vec<u8>> {
    fn into_version_info(self) -> Arc<Vec<u8>> {
        self
    }
}

impl IntoVersionInfo for Vec<u8> {
    fn into_version_info(self) -> Arc<Vec<u8>> {
        Arc::new(self)
    }
}

impl IntoVersionInfo for &Vec<u8> {
    fn into_version_info(self) -> Arc<Vec<u8>> {
        Arc::new(self.clone())
    }
}

impl IntoVersionInfo for Box<Vec<u8>> {
    fn into_version_info(self) -> Arc<Vec<u8>> {
        Arc::new(*self)
    }
}

impl IntoVersionInfo for &String {
    fn into_version_info(self) -> Arc<Vec<u8>> {
        Arc::new(self.as_bytes().to_vec())
    }
}

impl IntoVersionInfo for &[u8] {
    fn into_version_info(self) -> Arc<Vec<u8>> {
        Arc::new(self.to_vec())
    }
}

impl<const N: usize> IntoVersionInfo for [u8; N] {
    fn into_version_info(self) -> Arc<Vec<u8>> {
        Arc::new(self.to_vec())
    }
}

impl<const N: usize> IntoVersionInfo for &[u8; N] {
    fn into_version_info(self) -> Arc<Vec<u8>> {
        Arc::new(self.to_vec())
    }
}

impl IntoVersionInfo for &str {
    fn into_version_info(self) -> Arc<Vec<u8>> {
        Arc::new(self.as_bytes().to_vec())
    }
}

impl IntoVersionInfo for String {
    fn into_version_info(self) -> Arc<Vec<u8>> {
        Arc::new(self.into_bytes())
    }
}

/// How to open a [`WriteAheadLog`].
///
/// The defaults are chosen for SSDs:
///
/// - `preallocate_bytes` = 32 MiB: each segment is zero-filled once to this
///   size (and then recycled, so the cost is paid once per file), so that
///   appends overwrite allocated blocks and `fdatasync` has no file size or
///   extent metadata to flush. Larger segments also mean that 1 MiB entries
///   cause a checkpoint every ~32 commits, not every commit (every ~128
///   once the log sizes its segments up, below).
/// - `checkpoint_after_bytes` = 32 MiB: a segment is handed to the
///   checkpointer once it holds this much, bounding recovery work to about
///   one segment per writer burst while keeping checkpoints infrequent.
///   Entries so large that two segments in a row filled up with fewer than
///   128 of them make the log size its next segments to hold about 128
///   (at most 8 × this, with spares preallocated to 8 × `preallocate_bytes`
///   at most), so that 1 MiB entries switch segments every ~128 commits;
///   an idle log goes back to the configured sizes. Segments configured
///   under 1 MiB keep their size.
/// - `buffer_bytes` = 256 KiB: large enough to stream big chunks and scan
///   segments in few system calls, small enough not to matter for memory.
///
/// Start from [`Configuration::default_for`] (or [`Default`]) and change
/// settings with the builder methods; the fields can also be read and
/// assigned directly, as in okaywal 0.3. The struct is
/// `#[non_exhaustive]`: a struct literal (`Configuration { .. }`) does not
/// compile outside this crate, so settings added later get their
/// defaults. [`Configuration::open`] rejects values it cannot honour
/// instead of replacing them.
///
/// ```
/// # fn main() -> std::io::Result<()> {
/// let dir = tempfile::tempdir()?;
/// let mut config = okaywal::Configuration::default_for(dir.path())
///     .checkpoint_after_bytes(8 << 20);
/// config.buffer_bytes = 64 * 1024;
/// let log = config.open(okaywal::LogVoid)?;
/// # log.shutdown()?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Configuration {
    /// The directory holding the segment files.
    pub directory: PathBuf,
    /// Bytes each new segment file is zero-filled to, at most 4 GiB. On a
    /// disk too full for that, a new file gets half as much, and so on
    /// down to 64 KiB (segments grow past their preallocation as records
    /// need).
    pub preallocate_bytes: u64,
    /// Bytes after which the active segment is checkpointed. A log of
    /// entries so large that a segment of this size holds fewer than 128
    /// of them sizes its segments up to hold about 128, at most 8 × this,
    /// until it is idle again (when this is 1 MiB or more).
    pub checkpoint_after_bytes: u64,
    /// Buffer size for streaming writes and sequential reads, 1 byte to
    /// 256 MiB.
    pub buffer_bytes: usize,
    /// User version information stored in every segment header (≤ 255
    /// bytes).
    pub version_info: Arc<Vec<u8>>,
    /// The file system the log lives on.
    pub file_system: Arc<dyn FileSystem>,
    /// Entry ids handed out after opening are at least this.
    pub minimum_next_entry_id: u64,
    /// What to do with damage in the middle of the log.
    pub recovery_mode: RecoveryMode,
    /// With buffered commits waiting, a background sync runs at least this
    /// often.
    pub max_unsynced: Option<std::time::Duration>,
    /// A buffered commit that brings the unsynced bytes to this many syncs
    /// the log before returning.
    pub max_unsynced_bytes: Option<u64>,
    /// Encryption at rest: the keys segments are sealed with (see
    /// [`Configuration::encryption`]). `None` writes and reads logs
    /// without encryption.
    pub encryption: Option<Cipher>,
}

impl Default for Configuration {
    /// [`Configuration::default_for`] the directory `okaywal` (relative to
    /// the current directory), as okaywal 0.3 has it.
    fn default() -> Self {
        Self::default_for("okaywal")
    }
}

impl Configuration {
    /// The default configuration for a log stored in `directory` on the
    /// real file system.
    pub fn default_for<P: AsRef<Path>>(directory: P) -> Self {
        Self {
            directory: directory.as_ref().to_path_buf(),
            preallocate_bytes: DEFAULT_PREALLOCATE_BYTES,
            checkpoint_after_bytes: DEFAULT_CHECKPOINT_AFTER_BYTES,
            buffer_bytes: DEFAULT_BUFFER_BYTES,
            version_info: Arc::default(),
            file_system: Arc::new(StdFileSystem),
            minimum_next_entry_id: 1,
            recovery_mode: RecoveryMode::default(),
            max_unsynced: None,
            max_unsynced_bytes: None,
            encryption: None,
        }
    }

    /// Sets how many bytes each new segment file is zero-filled to (at
    /// most 4 GiB; [`Configuration::open`] rejects more).
    #[must_use]
    pub fn preallocate_bytes(mut self, bytes: u64) -> Self {
        self.preallocate_bytes = bytes;
        self
    }

    /// Sets the segment size after which a checkpoint is started.
    #[must_use]
    pub fn checkpoint_after_bytes(mut self, bytes: u64) -> Self {
        self.checkpoint_after_bytes = bytes;
        self
    }

    /// Sets the buffer size for streaming writes and sequential reads (1
    /// byte to 256 MiB; [`Configuration::open`] rejects other values).
    #[must_use]
    pub fn buffer_bytes(mut self, bytes: usize) -> Self {
        self.buffer_bytes = bytes;
        self
    }

    /// Sets the version information written into every segment header and
    /// shown to [`LogManager::should_recover_segment`]. At most 255 bytes;
    /// [`Configuration::open`] rejects longer values.
    ///
    /// Takes bytes in any of the usual forms:
    ///
    /// ```
    /// # use okaywal::Configuration;
    /// let config = Configuration::default_for("log").version_info(b"format 2");
    /// assert_eq!(config.version_info.as_slice(), b"format 2");
    /// let config = config.version_info("format 3").version_info(vec![3_u8]);
    /// assert_eq!(config.version_info.as_slice(), [3]);
    /// ```
    #[must_use]
    pub fn version_info<Info: IntoVersionInfo>(mut self, info: Info) -> Self {
        self.version_info = info.into_version_info();
        self
    }

    /// Runs the log on `file_system` instead of the real disk.
    #[must_use]
    pub fn file_system<F: FileSystem>(mut self, file_system: F) -> Self {
        self.file_system = Arc::new(file_system);
        self
    }

    /// Runs the log on an already shared file system.
    #[must_use]
    pub fn shared_file_system(mut self, file_system: Arc<dyn FileSystem>) -> Self {
        self.file_system = file_system;
        self
    }

    /// Bounds how long buffered commits stay unsynced: a background thread
    /// syncs the log at least this often while any wait. Without it,
    /// buffered commits become durable with the next durable commit or
    /// [`WriteAheadLog::sync`]. Intervals under 1 ms count as 1 ms (the
    /// thread would otherwise poll without pause); to make every commit
    /// durable, use [`EntryWriter::commit`](crate::EntryWriter::commit).
    #[must_use]
    pub fn max_unsynced(mut self, interval: std::time::Duration) -> Self {
        self.max_unsynced = Some(interval);
        self
    }

    /// Bounds how many bytes of buffered commits stay unsynced: the commit
    /// that reaches `bytes` syncs the log before it returns.
    #[must_use]
    pub fn max_unsynced_bytes(mut self, bytes: u64) -> Self {
        self.max_unsynced_bytes = Some(bytes);
        self
    }

    /// Encrypts the log at rest with keys from `key_provider`
    /// ([`StaticKey`](crate::encryption::StaticKey) for one key,
    /// [`Keyring`](crate::encryption::Keyring) for rotation, or a provider
    /// of your own over a KMS): every record's contents (chunk data, entry
    /// ids, commit records, durable marks) and the segment headers'
    /// `version_info` are sealed with AES-256-GCM and bound to
    /// their place in the log, so that damage, tampering and bytes moved
    /// from elsewhere are detected like any damage. FORMAT.md ("Encrypted
    /// logs") has the layout.
    ///
    /// Each segment is sealed with the key that was current when it was
    /// started; after a rotation, the next segment uses the new key (call
    /// [`WriteAheadLog::checkpoint_active`] to start one at once), and
    /// older segments still open with their keys, which the provider must
    /// keep until they are checkpointed.
    ///
    /// Opening fails with an `io::Error` of kind
    /// [`PermissionDenied`](io::ErrorKind::PermissionDenied) whose inner
    /// error is a [`KeyError`](crate::encryption::KeyError) (see
    /// [`KeyError::of`](crate::encryption::KeyError::of)) when a segment's
    /// key is missing or wrong, when the log is not encrypted although a
    /// provider is given, and when it is encrypted and none is; nothing
    /// in the directory is changed then.
    ///
    /// ```
    /// use okaywal::encryption::{KeyError, StaticKey};
    /// use okaywal::{Configuration, LogVoid};
    ///
    /// # fn main() -> std::io::Result<()> {
    /// let dir = tempfile::tempdir()?;
    /// let key = StaticKey::new([42; 32]);
    /// let log = Configuration::default_for(dir.path())
    ///     .encryption(key.clone())
    ///     .open(LogVoid)?;
    /// let mut entry = log.begin_entry()?;
    /// let record = entry.write_chunk(b"secret")?;
    /// entry.commit()?;
    /// assert_eq!(log.read_at(record.position)?.read_all()?, b"secret");
    /// log.shutdown()?;
    /// drop(log);
    ///
    /// // Without the key, the log does not open.
    /// let error = Configuration::default_for(dir.path()).open(LogVoid).unwrap_err();
    /// assert_eq!(KeyError::of(&error), Some(&KeyError::NotConfigured));
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn encryption(mut self, key_provider: impl KeyProvider) -> Self {
        self.encryption = Some(Cipher::new(key_provider));
        self
    }

    /// Chooses what recovery does with damage in the middle of the log
    /// (default: [`RecoveryMode::ErrorOnCorruption`]).
    #[must_use]
    pub fn recovery_mode(mut self, mode: RecoveryMode) -> Self {
        self.recovery_mode = mode;
        self
    }

    /// Makes every entry id handed out after opening at least `id`.
    ///
    /// A manager that records the last entry id it checkpointed can pass
    /// the next one here as a second guard (besides the log's own files)
    /// that ids never go backwards. Ids go up to `u64::MAX - 1`:
    /// [`Configuration::open`] refuses `u64::MAX` (`InvalidInput`), which
    /// would leave no id to write an entry with.
    #[must_use]
    pub fn minimum_next_entry_id(mut self, id: u64) -> Self {
        self.minimum_next_entry_id = id;
        self
    }

    /// Opens the log, recovering existing segments through `manager`.
    ///
    /// Fails with [`io::ErrorKind::WouldBlock`] if another process has the
    /// directory open (its `okaywal.lock` stays locked for 2 s): one
    /// process at a time may write a log.
    pub fn open<Manager: LogManager>(self, manager: Manager) -> io::Result<WriteAheadLog> {
        self.validate()?;
        WriteAheadLog::open(self, Box::new(manager))
    }

    pub(crate) fn validate(&self) -> io::Result<()> {
        if self.directory.as_os_str().is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the log's directory is an empty path: name a directory (\".\" for the current \
                 one)",
            ));
        }
        if self.version_info.len() > MAX_VERSION_INFO {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "version_info is {} bytes; at most {MAX_VERSION_INFO} fit in a segment header",
                    self.version_info.len()
                ),
            ));
        }
        if self.buffer_bytes == 0 || self.buffer_bytes > MAX_BUFFER_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "buffer_bytes is {}; it must be between 1 and {MAX_BUFFER_BYTES} (256 MiB)",
                    self.buffer_bytes
                ),
            ));
        }
        if self.preallocate_bytes > MAX_PREALLOCATE_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "preallocate_bytes is {}; at most {MAX_PREALLOCATE_BYTES} (4 GiB): every \
                     segment file is zero-filled to it",
                    self.preallocate_bytes
                ),
            ));
        }
        if self.minimum_next_entry_id == u64::MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "minimum_next_entry_id is u64::MAX, which no entry can have: ids go up to \
                 u64::MAX - 1, so the log could write nothing",
            ));
        }
        Ok(())
    }
}
