//! The disk under a test: a real directory's files as they are now (to
//! check that a read-only open changed nothing), and okaywal's simulated
//! disk's operations (every kind, and waiting until none happens any
//! more).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use okaywal::fs::{CrashFileSystem, Operation};

/// Every file of a directory: its path, bytes and modification time.
pub type Snapshot = BTreeMap<PathBuf, (Vec<u8>, SystemTime)>;

/// The files directly in `dir` as they are now.
///
/// # Panics
/// If the directory or one of its files cannot be read.
#[must_use]
pub fn snapshot(dir: &Path) -> Snapshot {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| {
            let path = entry.unwrap().path();
            let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
            (path.clone(), (std::fs::read(&path).unwrap(), modified))
        })
        .collect()
}

/// Every kind of operation the simulated disk counts.
pub const ALL_OPERATIONS: [Operation; 8] = [
    Operation::Write,
    Operation::Sync,
    Operation::SyncDir,
    Operation::Rename,
    Operation::Read,
    Operation::Create,
    Operation::Remove,
    Operation::SetLen,
];

/// How many operations of each kind `fs` has done.
#[must_use]
pub fn operation_counts(fs: &CrashFileSystem) -> [u64; 8] {
    ALL_OPERATIONS.map(|op| fs.operation_count(op))
}

/// Waits until nothing touches the disk any more: no operation in 40 ms
/// (a log makes a spare segment file in the background after opening).
///
/// # Panics
/// If the disk is still busy after 10 seconds.
pub fn quiesce(fs: &CrashFileSystem) {
    let start = Instant::now();
    let mut last = operation_counts(fs);
    loop {
        std::thread::sleep(Duration::from_millis(40));
        let now = operation_counts(fs);
        if now == last {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the disk never went quiet"
        );
        last = now;
    }
}

/// A small tmpfs mounted for a test (which needs root, as CI has), so that
/// the test can fill a real disk; unmounted when dropped.
#[derive(Debug)]
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (`mount`'s syntax: `16m`) at `at`,
    /// creating the directory; the error is `mount`'s message (not root,
    /// no `mount` command), for the test to say that it skips.
    ///
    /// # Errors
    /// If the directory cannot be created or `mount` fails.
    pub fn mount(at: &Path, size: &str) -> Result<Self, String> {
        std::fs::create_dir_all(at).map_err(|e| e.to_string())?;
        let output = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .output()
            .map_err(|e| e.to_string())?;
        if output.status.success() {
            Ok(Self(at.to_path_buf()))
        } else {
            Err(String::from_utf8_lossy(&output.stderr).into_owned())
        }
    }

    /// Where it is mounted.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Resizes it to `size`.
    ///
    /// # Panics
    /// If `mount -o remount` fails.
    pub fn grow(&self, size: &str) {
        let status = std::process::Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .status()
            .unwrap();
        assert!(status.success(), "remounting {}", self.0.display());
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}
