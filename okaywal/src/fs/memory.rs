use std::io;
use std::path::Path;
use std::sync::Arc;

use super::{CrashFileSystem, FileHandle, FileSystem, OpenMode};

/// A file system that lives in memory: for tests and ephemeral logs.
///
/// Syncs are no-ops and nothing survives the last clone being dropped.
/// Clones share the same files.
#[derive(Debug, Clone)]
pub struct MemoryFileSystem {
    // The crash simulator without its durability bookkeeping: one
    // implementation of the namespace and of positioned I/O for both.
    inner: CrashFileSystem,
}

impl Default for MemoryFileSystem {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryFileSystem {
    /// Returns a new, empty in-memory file system.
    #[must_use]
    pub fn new() -> Self {
        Self {
            inner: CrashFileSystem::untracked(),
        }
    }
}

impl FileSystem for MemoryFileSystem {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.inner.create_dir_all(path)
    }

    fn list_files(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.inner.list_files(dir)
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        self.inner.exists(path)
    }

    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn FileHandle>> {
        self.inner.open(path, mode)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.inner.sync_dir(dir)
    }
}
