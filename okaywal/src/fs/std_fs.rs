use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{FileHandle, FileSystem, LockGuard, OpenMode};

/// The real file system, through `std::fs` (positioned I/O via `pread` and
/// `pwrite`, `fdatasync` for [`FileHandle::sync_data`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct StdFileSystem;

/// Adds the path to an I/O error's message, keeping its kind and source.
fn with_path(err: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(err.kind(), format!("{what} {}: {err}", path.display()))
}

use crate::tuning::LOCK_PATIENCE;

/// Takes an `flock` lock on `file`: it belongs to the open file
/// description, so it keeps every other open of the file out, in this
/// process as in others (a second open of a directory already open here
/// fails as one from another process does), and closing some other
/// descriptor of the file does not drop it (as it would a POSIX record
/// lock). Waits up to [`LOCK_PATIENCE`] for a holder to let go.
fn lock_file(file: &File, path: &Path, shared: bool) -> io::Result<()> {
    use rustix::fs::{flock, FlockOperation};
    use rustix::io::Errno;
    let operation = if shared {
        FlockOperation::NonBlockingLockShared
    } else {
        FlockOperation::NonBlockingLockExclusive
    };
    let deadline = Instant::now() + LOCK_PATIENCE;
    loop {
        match flock(file, operation) {
            Ok(()) => return Ok(()),
            Err(Errno::INTR) => {}
            Err(Errno::WOULDBLOCK) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(Errno::WOULDBLOCK) => {
                let holder = if shared {
                    "it is open for writing"
                } else {
                    "it is open elsewhere (for writing, or read-only)"
                };
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!(
                        "{} is locked: {holder}, by another process or another open in \
                         this one (a log or store is open for writing once at a time, and \
                         not while it is open read-only)",
                        path.display()
                    ),
                ));
            }
            Err(err) => return Err(with_path(err.into(), "locking", path)),
        }
    }
}

/// Whether `path` still names the lock file `file` that was just locked:
/// an open that failed removes the lock file it created while holding the
/// lock ([`super::OpenLock`]), and a lock taken meanwhile on the removed
/// file would lock nothing anyone else can find. Then the caller opens
/// the path again.
fn still_named(file: &File, path: &Path) -> io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let locked = file
        .metadata()
        .map_err(|e| with_path(e, "reading the lock file", path))?;
    match std::fs::metadata(path) {
        Ok(named) => Ok(named.dev() == locked.dev() && named.ino() == locked.ino()),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(err) => Err(with_path(err, "reading the lock file", path)),
    }
}

impl FileSystem for StdFileSystem {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir_all(path).map_err(|e| with_path(e, "creating directory", path))
    }

    fn list_files(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| with_path(e, "listing", dir))? {
            let entry = entry.map_err(|e| with_path(e, "listing", dir))?;
            let file_type = entry.file_type()?;
            // A symbolic link counts as the file it points to: a segment
            // moved elsewhere and linked back is still the log's (ignored,
            // its entry ids would be used again). Links to anything else,
            // or to nothing, are not files.
            let is_file = file_type.is_file()
                || (file_type.is_symlink()
                    && std::fs::metadata(entry.path()).is_ok_and(|m| m.is_file()));
            if is_file {
                if let Some(name) = entry.file_name().to_str() {
                    names.push(name.to_string());
                }
            }
        }
        Ok(names)
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        path.try_exists()
    }

    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn FileHandle>> {
        let mut options = OpenOptions::new();
        match mode {
            OpenMode::Read => options.read(true),
            OpenMode::ReadWrite => options.read(true).write(true),
            OpenMode::Create => options.read(true).write(true).create(true),
            OpenMode::CreateNew => options.read(true).write(true).create_new(true),
        };
        let file = options
            .open(path)
            .map_err(|e| with_path(e, "opening", path))?;
        Ok(Arc::new(StdFile {
            file,
            path: parking_lot::Mutex::new(path.display().to_string()),
        }))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("renaming {} to {}: {e}", from.display(), to.display()),
            )
        })
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path).map_err(|e| with_path(e, "removing", path))
    }

    fn lock_exclusive(&self, path: &Path) -> io::Result<LockGuard> {
        loop {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .map_err(|e| with_path(e, "opening the lock file", path))?;
            lock_file(&file, path, false)?;
            if still_named(&file, path)? {
                return Ok(LockGuard::holding(file));
            }
        }
    }

    fn lock_shared(&self, path: &Path) -> io::Result<LockGuard> {
        // Opened for reading and never created: a read-only open writes
        // nothing. Without the file no writer has ever opened the
        // directory, and there is nothing to lock.
        loop {
            match File::open(path) {
                Ok(file) => {
                    lock_file(&file, path, true)?;
                    if still_named(&file, path)? {
                        return Ok(LockGuard::holding(file));
                    }
                }
                Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(LockGuard::none()),
                Err(err) => return Err(with_path(err, "opening the lock file", path)),
            }
        }
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| with_path(e, "syncing directory", dir))
    }
}

#[derive(Debug)]
struct StdFile {
    file: File,
    /// The file's name, for error messages (it changes when the log
    /// renames the file: see [`FileHandle::renamed`]).
    path: parking_lot::Mutex<String>,
}

impl StdFile {
    fn err(&self, what: &str, err: io::Error) -> io::Error {
        io::Error::new(err.kind(), format!("{what} {}: {err}", self.path.lock()))
    }

    /// A new open file description of the same file, for reading (which
    /// `fdatasync` needs no more than); `None` without `/proc`.
    fn reopen(&self) -> io::Result<Option<StdFile>> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::MetadataExt;
        // Opening the descriptor's /proc link makes a new description of
        // the same inode, whatever the file is called now.
        let link = format!("/proc/self/fd/{}", self.file.as_raw_fd());
        let Ok(file) = File::open(&link) else {
            return Ok(None);
        };
        let ours = self
            .file
            .metadata()
            .map_err(|e| self.err("reading metadata of", e))?;
        let theirs = file
            .metadata()
            .map_err(|e| self.err("reading metadata of", e))?;
        if (ours.dev(), ours.ino()) != (theirs.dev(), theirs.ino()) {
            return Ok(None);
        }
        Ok(Some(StdFile {
            file,
            path: parking_lot::Mutex::new(self.path.lock().clone()),
        }))
    }
}

impl FileHandle for StdFile {
    fn renamed(&self, path: &Path) {
        *self.path.lock() = path.display().to_string();
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.file
            .read_at(buf, offset)
            .map_err(|e| self.err("reading", e))
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file
            .write_all_at(buf, offset)
            .map_err(|e| self.err("writing", e))
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data().map_err(|e| self.err("fdatasync", e))
    }

    /// On Linux, `posix_fadvise(POSIX_FADV_DONTNEED)` over the range: the
    /// kernel starts writing its dirty pages back (without waiting for
    /// them) and then drops only the pages of the range that are already
    /// clean, which pages just written and under write-back are not.
    /// PostgreSQL's `pg_flush_data` uses the same call for the same
    /// purpose where `sync_file_range` is missing; `sync_file_range`
    /// itself has no safe binding in `rustix` or `std`. A failed
    /// write-back is recorded on the file, and reported by the next
    /// `fdatasync` as always: this call does not take it. Elsewhere a
    /// no-op.
    fn start_writeback(&self, offset: u64, len: u64) -> io::Result<()> {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        if let Some(len) = std::num::NonZeroU64::new(len) {
            rustix::fs::fadvise(&self.file, offset, Some(len), rustix::fs::Advice::DontNeed)
                .map_err(|e| self.err("starting write-back", io::Error::from(e)))?;
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        let _ = (offset, len);
        Ok(())
    }

    fn sync_all(&self) -> io::Result<()> {
        self.file.sync_all().map_err(|e| self.err("fsync", e))
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len).map_err(|e| self.err("resizing", e))
    }

    fn sync_handle(&self) -> io::Result<Option<Arc<dyn FileHandle>>> {
        Ok(self
            .reopen()?
            .map(|file| Arc::new(file) as Arc<dyn FileHandle>))
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self
            .file
            .metadata()
            .map_err(|e| self.err("reading metadata of", e))?
            .len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fs::{flock, FlockOperation};

    #[test]
    fn an_sync_handle_reaches_the_file_after_a_rename() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal-spare-1");
        let file = StdFileSystem.open(&path, OpenMode::CreateNew).unwrap();
        file.write_all_at(b"head", 0).unwrap();
        let renamed = dir.path().join("wal-1");
        StdFileSystem.rename(&path, &renamed).unwrap();
        // Another file under the old name: the handle follows the file.
        std::fs::write(&path, b"another file").unwrap();
        let other = file.sync_handle().unwrap().expect("a handle");
        file.write_all_at(b" and tail", 4).unwrap();
        other.sync_data().unwrap();
        let mut read = [0_u8; 13];
        other.read_exact_at(&mut read, 0).unwrap();
        assert_eq!(&read, b"head and tail");
        assert_eq!(std::fs::read(&renamed).unwrap(), read);
        assert_eq!(std::fs::read(&path).unwrap(), b"another file");
    }

    #[test]
    fn an_sync_handle_is_an_open_file_description_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("file");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        let handle = StdFile {
            file,
            path: parking_lot::Mutex::new(path.display().to_string()),
        };
        let other = handle.reopen().unwrap().expect("a handle");
        // An flock belongs to an open file description: a duplicate of
        // the descriptor shares it, another description does not.
        flock(&handle.file, FlockOperation::NonBlockingLockExclusive).unwrap();
        let duplicate = handle.file.try_clone().unwrap();
        flock(&duplicate, FlockOperation::NonBlockingLockExclusive).unwrap();
        assert!(flock(&other.file, FlockOperation::NonBlockingLockExclusive).is_err());
    }

    #[test]
    fn errors_name_the_file_by_its_name_after_a_rename() {
        let dir = tempfile::tempdir().unwrap();
        let (spare, named) = (dir.path().join("wal-spare-3"), dir.path().join("wal-807"));
        std::fs::write(&spare, b"x").unwrap();
        let fs = StdFileSystem;
        let file = fs.open(&spare, OpenMode::Read).unwrap();
        fs.rename(&spare, &named).unwrap();
        file.renamed(&named);
        // A write through a read-only handle fails: its message names the
        // file as it is called now.
        let err = file.write_all_at(b"y", 0).unwrap_err();
        let message = err.to_string();
        assert!(message.contains("wal-807"), "{message}");
        assert!(!message.contains("wal-spare-3"), "{message}");
    }

    #[test]
    fn a_file_opened_read_only_has_a_sync_handle_too() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("file");
        std::fs::write(&path, b"x").unwrap();
        let file = StdFileSystem.open(&path, OpenMode::Read).unwrap();
        let other = file.sync_handle().unwrap().expect("a handle");
        other.sync_data().unwrap();
        other.sync_all().unwrap();
    }
}
