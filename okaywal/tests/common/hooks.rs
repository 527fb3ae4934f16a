//! A file system for tests that need to hold a rename back: it delegates
//! to a [`CrashFileSystem`] and calls a hook with the target path before
//! every rename.

use std::fmt;
use std::io;
use std::path::Path;
use std::sync::Arc;

use okaywal::fs::{CrashFileSystem, FileHandle, FileSystem, OpenMode};

/// The hook a [`BeforeRename`] calls with each rename's target.
pub type RenameHook = Arc<dyn Fn(&Path) + Send + Sync>;

/// Delegates to `inner`; `hook(to)` runs before each rename (it may block
/// or sleep to widen a race).
#[derive(Clone)]
pub struct BeforeRename {
    pub inner: CrashFileSystem,
    pub hook: RenameHook,
}

impl fmt::Debug for BeforeRename {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BeforeRename").finish_non_exhaustive()
    }
}

impl FileSystem for BeforeRename {
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
        (self.hook)(to);
        self.inner.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_file(path)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.inner.sync_dir(dir)
    }
}
