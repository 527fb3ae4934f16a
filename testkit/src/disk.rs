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
