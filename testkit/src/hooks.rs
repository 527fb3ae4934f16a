//! A file system for tests that need to hold back, slow down or fail a
//! rename or a sync: it delegates to a [`CrashFileSystem`] and calls a
//! hook before every rename and every file sync.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use okaywal::fs::{CrashFileSystem, FileHandle, FileSystem, OpenMode};

/// Called with a rename's target or a synced file's path; an error is
/// returned instead of doing the operation. It may block or sleep to
/// widen a race.
pub type Hook = Arc<dyn Fn(&Path) -> io::Result<()> + Send + Sync>;

/// Delegates to `inner`, calling `before_rename(to)` before each rename
/// and `before_sync(path)` before each `sync_data`/`sync_all` of a file.
#[derive(Clone)]
pub struct Hooked {
    /// The file system every operation goes to.
    pub inner: CrashFileSystem,
    /// Called with the target before each rename.
    pub before_rename: Hook,
    /// Called with the file's path before each file sync.
    pub before_sync: Hook,
}

impl Hooked {
    /// Hooks renames only.
    pub fn renames(inner: &CrashFileSystem, hook: impl Fn(&Path) + Send + Sync + 'static) -> Self {
        Self {
            inner: inner.clone(),
            before_rename: Arc::new(move |to| {
                hook(to);
                Ok(())
            }),
            before_sync: Arc::new(|_| Ok(())),
        }
    }
}

impl fmt::Debug for Hooked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hooked").finish_non_exhaustive()
    }
}

struct HookedFile {
    inner: Arc<dyn FileHandle>,
    path: PathBuf,
    before_sync: Hook,
}

impl fmt::Debug for HookedFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HookedFile")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl FileHandle for HookedFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_all_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        (self.before_sync)(&self.path)?;
        self.inner.sync_data()
    }
    fn sync_all(&self) -> io::Result<()> {
        (self.before_sync)(&self.path)?;
        self.inner.sync_all()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
}

impl FileSystem for Hooked {
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
        Ok(Arc::new(HookedFile {
            inner: self.inner.open(path, mode)?,
            path: path.to_path_buf(),
            before_sync: self.before_sync.clone(),
        }))
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        (self.before_rename)(to)?;
        self.inner.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_file(path)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.inner.sync_dir(dir)
    }
}

/// Holds every caller of [`Gate::hold`] until [`Gate::open`].
#[derive(Debug, Default)]
pub struct Gate {
    /// (open, someone held)
    state: std::sync::Mutex<(bool, bool)>,
    changed: std::sync::Condvar,
}

impl Gate {
    /// Waits until the gate opens.
    pub fn hold(&self) {
        let mut state = self.state.lock().unwrap();
        state.1 = true;
        self.changed.notify_all();
        while !state.0 {
            state = self.changed.wait(state).unwrap();
        }
    }

    /// Waits until a caller is held.
    pub fn wait_held(&self) {
        let mut state = self.state.lock().unwrap();
        while !state.1 {
            state = self.changed.wait(state).unwrap();
        }
    }

    /// Lets every held and later caller through.
    pub fn open(&self) {
        self.state.lock().unwrap().0 = true;
        self.changed.notify_all();
    }
}

/// Opens the gate when dropped, so a failed assertion never leaves a
/// thread held.
#[derive(Debug)]
pub struct OpenOnDrop<'a>(pub &'a Gate);

impl Drop for OpenOnDrop<'_> {
    fn drop(&mut self) {
        self.0.open();
    }
}
