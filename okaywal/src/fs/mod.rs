//! The file-system abstraction every byte of the log goes through.
//!
//! The log never touches `std::fs` directly: it asks a [`FileSystem`] for
//! [`FileHandle`]s and performs positioned reads and writes on them. That lets
//! the same code run on:
//!
//! - [`StdFileSystem`]: the real disk (the default);
//! - [`MemoryFileSystem`]: an in-memory tree, for tests and ephemeral logs;
//! - `CrashFileSystem` (with the cargo feature `testing`): an in-memory
//!   tree that remembers which bytes and directory entries were synced, can
//!   inject I/O errors on the Nth operation of a kind, and can "lose
//!   power", keeping only what was durable (optionally with a torn last
//!   write). For testing code built on the log.
//!
//! Positioned I/O (`read_at`/`write_all_at`) lets many threads write their own
//! reserved ranges of one file without sharing a cursor or a lock.

// The crash simulator is always built (the in-memory file system runs on
// it); it is public with the `testing` feature.
#[cfg_attr(not(feature = "testing"), allow(dead_code, unreachable_pub))]
mod crash;
mod memory;
mod std_fs;

use std::fmt::Debug;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[cfg(feature = "testing")]
pub use crash::{CrashFileSystem, FaultKind, Operation, PowerLoss};
#[cfg(not(feature = "testing"))]
#[allow(unused_imports)]
pub(crate) use crash::{CrashFileSystem, FaultKind, Operation, PowerLoss};
pub use memory::MemoryFileSystem;
pub use std_fs::StdFileSystem;

/// How a file is opened by [`FileSystem::open`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// Open an existing file for reading only.
    Read,
    /// Open an existing file for reading and writing.
    ReadWrite,
    /// Create the file (truncating nothing: an existing file is opened as is)
    /// for reading and writing.
    Create,
    /// Create a new file; fails with `AlreadyExists` if it exists.
    CreateNew,
}

/// A file system that the log (and crates built on it) can run on.
///
/// Paths are ordinary [`Path`]s; backends other than [`StdFileSystem`]
/// interpret them as keys of their own namespace.
pub trait FileSystem: Send + Sync + Debug + 'static {
    /// Creates `path` and all of its missing parents.
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Returns the names of the files (not directories) directly inside
    /// `dir`, symbolic links to files included.
    fn list_files(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Returns true if `path` names an existing file or directory.
    fn exists(&self, path: &Path) -> io::Result<bool>;
    /// Opens `path` as `mode` says.
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn FileHandle>>;
    /// Atomically renames `from` to `to`, replacing `to` if it exists.
    ///
    /// The new name is durable only after [`FileSystem::sync_dir`] on the
    /// parent directory.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes the file at `path`.
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Makes the directory entries of `dir` (creations, renames, removals)
    /// durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;

    /// Takes the advisory lock on `path` (created if missing) that keeps
    /// every other open of the same log or store, in this process or
    /// another, out while the returned guard lives. Fails with
    /// [`io::ErrorKind::WouldBlock`] when another open holds it, exclusive
    /// or shared.
    ///
    /// The default takes no lock, as suits a file system that lives inside
    /// one process (the crash-simulating one decides its own locking);
    /// [`StdFileSystem`] takes an `flock` lock, which belongs to the open
    /// file description.
    fn lock_exclusive(&self, path: &Path) -> io::Result<LockGuard> {
        let _ = path;
        Ok(LockGuard::none())
    }

    /// Takes the lock on `path` shared, for a read-only open: any number
    /// of shared holders at once, none while [`FileSystem::lock_exclusive`]
    /// is held, which in turn fails while a shared holder lives. Never
    /// creates `path`: with no lock file, no writer ever opened the
    /// directory, and the guard holds nothing.
    ///
    /// The default takes no lock.
    fn lock_shared(&self, path: &Path) -> io::Result<LockGuard> {
        let _ = path;
        Ok(LockGuard::none())
    }
}

/// The exclusive lock of an open for writing in progress. If the open
/// fails, the lock file is removed if this open created it, while the
/// lock is still held: an open refused before it changed anything (a wrong
/// key, a directory that is not a log) leaves the directory as it found
/// it. Once the open succeeds, [`OpenLock::keep`] (or
/// [`OpenLock::opened`], which hands over the guard) keeps the file.
///
/// The lock implementations of this crate take a lock only on the file
/// that the path still names once they hold it, so removing it under the
/// lock is safe: an open waiting for it opens the path again.
#[derive(Debug)]
pub struct OpenLock {
    fs: Arc<dyn FileSystem>,
    path: PathBuf,
    created: AtomicBool,
    guard: Option<LockGuard>,
}

impl OpenLock {
    /// Takes [`FileSystem::lock_exclusive`] on `path`, noting whether the
    /// file existed before.
    pub fn take(fs: Arc<dyn FileSystem>, path: &Path) -> io::Result<Self> {
        let created = !fs.exists(path)?;
        let guard = fs.lock_exclusive(path)?;
        Ok(Self {
            fs,
            path: path.to_path_buf(),
            created: AtomicBool::new(created),
            guard: Some(guard),
        })
    }

    /// The open succeeded: the lock file stays when this is dropped.
    pub fn keep(&self) {
        self.created.store(false, Ordering::Release);
    }

    /// The open succeeded: the lock file stays, held by the guard returned.
    #[must_use]
    pub fn opened(mut self) -> LockGuard {
        self.keep();
        self.guard.take().unwrap_or_else(LockGuard::none)
    }
}

impl Drop for OpenLock {
    fn drop(&mut self) {
        if self.created.load(Ordering::Acquire) {
            // Best effort: a file left behind is only an empty lock file.
            // The guard, a field, is dropped after this.
            let _ = self.fs.remove_file(&self.path);
        }
    }
}

/// Holds a lock taken by [`FileSystem::lock_exclusive`] or
/// [`FileSystem::lock_shared`] until dropped.
pub struct LockGuard {
    held: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl LockGuard {
    /// A guard that holds nothing.
    #[must_use]
    pub fn none() -> Self {
        Self { held: None }
    }

    /// A guard that keeps `held` (say, the locked file) until dropped.
    #[must_use]
    pub fn holding(held: impl std::any::Any + Send + Sync) -> Self {
        Self {
            held: Some(Box::new(held)),
        }
    }
}

impl Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("held", &self.held.is_some())
            .finish()
    }
}

/// An open file supporting positioned I/O from many threads at once.
pub trait FileHandle: Send + Sync + Debug {
    /// Reads up to `buf.len()` bytes at `offset`, returning how many were
    /// read (0 at or past the end of the file).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Writes all of `buf` at `offset`, growing the file if needed.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes the file's data (and the metadata needed to read it, such as
    /// its length) durable: `fdatasync`.
    fn sync_data(&self) -> io::Result<()>;
    /// Makes the file's data and all of its metadata durable: `fsync`.
    fn sync_all(&self) -> io::Result<()>;
    /// Asks for the `len` bytes at `offset`, just written, to start on
    /// their way to the device now, without waiting for them: a hint that
    /// makes no promise of durability (that takes
    /// [`FileHandle::sync_data`]) and must not report a failed write-back
    /// in place of the next sync. The log gives it after the data of each
    /// chunk of 256 KiB or more while other entries are open, so that the
    /// device is already writing one writer's data while others still
    /// copy theirs, instead of all of it waiting for the first sync. The
    /// default does nothing.
    fn start_writeback(&self, offset: u64, len: u64) -> io::Result<()> {
        let _ = (offset, len);
        Ok(())
    }
    /// The file was renamed to `path`: later errors name it so. The
    /// default does nothing.
    fn renamed(&self, path: &Path) {
        let _ = path;
    }
    /// Another handle on the same file, for its syncs, that learns of
    /// every failed write-back from now on by itself, whatever is synced
    /// through other handles; `None` if the file system has no such
    /// handles. Only [`FileHandle::sync_data`] and
    /// [`FileHandle::sync_all`] are called on it (it may be open for
    /// reading only).
    ///
    /// On Linux a failed write-back is reported once per open file
    /// description, to the first `fdatasync` through it that comes after
    /// the failure. Two syncs through one description can therefore
    /// overlap and one can take the error that lost the other's pages:
    /// the log then counts a sync as successful only once every sync that
    /// overlapped it has ended. A sync through a description of its own,
    /// opened before the failure, cannot lose the error that way, and
    /// counts at once. [`StdFileSystem`] opens a new description of the
    /// same file, for reading (through `/proc/self/fd`); the default has
    /// none.
    fn sync_handle(&self) -> io::Result<Option<Arc<dyn FileHandle>>> {
        Ok(None)
    }
    /// Truncates or extends the file to `len` bytes (extension reads as
    /// zeros).
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// The current length of the file in bytes.
    fn len(&self) -> io::Result<u64>;
    /// Returns true if the file is empty.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Fills `buf` from `offset`, failing with `UnexpectedEof` if the file
    /// ends first.
    fn read_exact_at(&self, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match self.read_at(buf, offset) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("file ended before offset {}", offset + buf.len() as u64),
                    ))
                }
                Ok(n) => {
                    buf = &mut buf[n..];
                    offset += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// Writes `len` zero bytes starting at `offset`, in bounded pieces, so that
/// the blocks are really allocated (unlike `set_len`, which leaves a sparse
/// hole whose first write costs a metadata update at `fdatasync` time).
pub fn zero_fill(file: &dyn FileHandle, offset: u64, len: u64) -> io::Result<()> {
    const PIECE: usize = crate::tuning::ZERO_FILL_PIECE;
    let zeros = vec![0_u8; PIECE.min(len as usize)];
    let mut written = 0;
    while written < len {
        let n = (len - written).min(PIECE as u64) as usize;
        file.write_all_at(&zeros[..n], offset + written)?;
        written += n as u64;
    }
    Ok(())
}

/// Creates `directory` (and missing parents) if it does not exist, and
/// then syncs its parent so that the new directory survives power loss.
pub fn create_dir_durably(fs: &dyn FileSystem, directory: &Path) -> io::Result<()> {
    if fs.exists(directory)? {
        return Ok(());
    }
    fs.create_dir_all(directory)?;
    match directory.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => fs.sync_dir(parent),
        _ => fs.sync_dir(Path::new(".")),
    }
}

/// Returns an error of kind `kind` whose message names `path`.
pub(crate) fn path_error(kind: io::ErrorKind, what: &str, path: &Path) -> io::Error {
    io::Error::new(kind, format!("{what}: {}", path.display()))
}
