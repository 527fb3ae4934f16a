//! Helpers shared by the integration tests: a small seedable generator,
//! recognisable blob contents and directory measurements.
#![allow(dead_code)]

pub mod crash;

use std::path::Path;

use okaywal::fs::{CrashFileSystem, FaultKind, Operation, PowerLoss};
use sediment::{Config, Database, GrainId};

#[allow(unused_imports)]
pub use testkit::rng::Rng;

/// The seed for a randomised test: `SEDIMENT_TEST_SEED` if set, otherwise
/// derived from the clock. Always printed so a failure can be replayed.
pub fn seed(test: &str) -> u64 {
    testkit::rng::seed("SEDIMENT_TEST_SEED", test)
}

/// Recognisable contents for a blob: the tag (little-endian, as far as the
/// length allows) followed by bytes derived from it, so two blobs of at
/// least 8 bytes with different tags never share contents. Every 4 KiB
/// block carries its number, so misplaced blocks are noticed too. (Cheap
/// enough in debug builds for blobs of many MiB.)
pub fn blob(tag: u64, len: usize) -> Vec<u8> {
    const BLOCK: usize = 4096;
    let mut rng = Rng::new(tag ^ 0xA5A5_5A5A_DEAD_BEEF);
    let mut block = Vec::with_capacity(BLOCK);
    while block.len() < BLOCK {
        block.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    let mut out = Vec::with_capacity(len);
    let mut number = 0_u64;
    while out.len() < len {
        let stamp = if number == 0 {
            tag
        } else {
            number ^ tag.rotate_left(17)
        };
        block[..8].copy_from_slice(&stamp.to_le_bytes());
        let n = (len - out.len()).min(BLOCK);
        out.extend_from_slice(&block[..n]);
        number += 1;
    }
    out
}

/// Total bytes of the regular files directly inside `dir`.
pub fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .expect("read the database directory")
        .filter_map(|entry| file_len(&entry.expect("directory entry").path()))
        .sum()
}

/// Length of the regular file at `path`, or `None` when it is not a
/// regular file or vanished: the store's background threads rename and
/// delete WAL segments while a test lists the directory.
pub fn file_len(path: &Path) -> Option<u64> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => Some(meta.len()),
        Ok(_) => None,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => None,
        Err(err) => panic!("metadata of {}: {err}", path.display()),
    }
}

/// Names of the files directly inside `dir` starting with `prefix`.
pub fn files_with_prefix(dir: &Path, prefix: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read the database directory")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.starts_with(prefix))
        .collect();
    names.sort();
    names
}

/// Opens a database with WAL segments of `wal_bytes`.
pub fn open_small_wal(dir: &Path, wal_bytes: u64) -> Database {
    Config::for_directory(dir)
        .wal(|wal| {
            wal.checkpoint_after_bytes(wal_bytes)
                .preallocate_bytes(wal_bytes)
        })
        .open()
        .expect("open the database")
}

/// Reads `id` and compares it with `expected` without printing megabytes.
pub fn assert_blob(db: &Database, id: GrainId, expected: &[u8], context: &str) {
    let got = db
        .get(id)
        .unwrap_or_else(|e| panic!("{context}: get({id}) failed: {e}"))
        .unwrap_or_else(|| panic!("{context}: get({id}) returned None"));
    assert_eq!(
        got.len(),
        expected.len(),
        "{context}: {id} has the wrong length"
    );
    if got != expected {
        let at = got.iter().zip(expected).position(|(a, b)| a != b);
        panic!("{context}: {id} has the wrong bytes (first difference at {at:?})");
    }
}

/// Aborts the test process if it is still alive after `limit`, so a hang
/// shows up as a failure instead of a stuck run. Disarmed on drop.
pub struct Watchdog {
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Watchdog {
    pub fn new(what: &str, limit: std::time::Duration) -> Self {
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = done.clone();
        let what = what.to_string();
        std::thread::spawn(move || {
            let start = std::time::Instant::now();
            while start.elapsed() < limit {
                std::thread::sleep(std::time::Duration::from_millis(50));
                if flag.load(std::sync::atomic::Ordering::Acquire) {
                    return;
                }
            }
            eprintln!("WATCHDOG: {what} did not finish within {limit:?}; it is hung. Aborting.");
            std::process::abort();
        });
        Self { done }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// Archives `id` and commits a `checkpoint_to` that frees it.
pub fn free(db: &Database, id: GrainId) {
    let mut tx = db.begin_transaction().unwrap();
    tx.archive(id).unwrap();
    let archived = tx.commit().unwrap();
    let mut tx = db.begin_transaction().unwrap();
    tx.checkpoint_to(archived).unwrap();
    tx.commit().unwrap();
}

/// Called by a [`HookedFs`] before the file operations it passes on, with
/// the file's name (the last component of its path).
pub trait FileHooks: Send + Sync + std::fmt::Debug + 'static {
    /// Before `write_all_at`.
    fn before_write(&self, _name: &str) {}
    /// Before `sync_data` and `sync_all`; an error is returned instead of
    /// syncing.
    fn before_sync(&self, _name: &str) -> std::io::Result<()> {
        Ok(())
    }
}

/// Holds the first caller of [`Gate::pass`] after [`Gate::arm`] until
/// [`Gate::release`].
#[derive(Debug, Default)]
pub struct Gate {
    /// (armed, entered, released)
    state: parking_lot::Mutex<(bool, bool, bool)>,
    changed: parking_lot::Condvar,
}

impl Gate {
    /// Makes the next `pass` wait.
    pub fn arm(&self) {
        self.state.lock().0 = true;
    }

    /// Waits for the release if the gate is armed; returns whether this
    /// call was the one held.
    pub fn pass(&self) -> bool {
        let mut state = self.state.lock();
        if !state.0 {
            return false;
        }
        state.0 = false;
        state.1 = true;
        self.changed.notify_all();
        while !state.2 {
            self.changed.wait(&mut state);
        }
        true
    }

    /// Waits until a caller is held.
    pub fn wait_entered(&self) {
        let mut state = self.state.lock();
        while !state.1 {
            self.changed.wait(&mut state);
        }
    }

    /// Lets the held caller (and every later one) through.
    pub fn release(&self) {
        self.state.lock().2 = true;
        self.changed.notify_all();
    }
}

/// Releases the gate when dropped, so a failed assertion never leaves a
/// thread held (and a scoped thread never joined).
pub struct ReleaseOnDrop<'a>(pub &'a Gate);

impl Drop for ReleaseOnDrop<'_> {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// Holds the first stratum sync after `gate.arm()`; fails it if `fail`.
#[derive(Debug, Default)]
pub struct HeldStratumSync {
    pub gate: Gate,
    pub fail: std::sync::atomic::AtomicBool,
}

impl FileHooks for HeldStratumSync {
    fn before_sync(&self, name: &str) -> std::io::Result<()> {
        if name.starts_with("stratum-")
            && self.gate.pass()
            && self.fail.load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(std::io::Error::other("injected stratum sync failure"));
        }
        Ok(())
    }
}

/// A file system that passes everything on to `inner`, calling `hooks`
/// first for writes and syncs (to slow them down or hold them).
#[derive(Debug)]
pub struct HookedFs<F, H> {
    pub inner: F,
    pub hooks: std::sync::Arc<H>,
}

#[derive(Debug)]
struct HookedFile<H> {
    inner: std::sync::Arc<dyn okaywal::fs::FileHandle>,
    name: String,
    hooks: std::sync::Arc<H>,
}

impl<F: okaywal::fs::FileSystem, H: FileHooks> okaywal::fs::FileSystem for HookedFs<F, H> {
    fn create_dir_all(&self, path: &Path) -> std::io::Result<()> {
        self.inner.create_dir_all(path)
    }
    fn list_files(&self, dir: &Path) -> std::io::Result<Vec<String>> {
        self.inner.list_files(dir)
    }
    fn exists(&self, path: &Path) -> std::io::Result<bool> {
        self.inner.exists(path)
    }
    fn open(
        &self,
        path: &Path,
        mode: okaywal::fs::OpenMode,
    ) -> std::io::Result<std::sync::Arc<dyn okaywal::fs::FileHandle>> {
        let name = path
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default();
        Ok(std::sync::Arc::new(HookedFile {
            inner: self.inner.open(path, mode)?,
            name,
            hooks: self.hooks.clone(),
        }))
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        self.inner.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> std::io::Result<()> {
        self.inner.remove_file(path)
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        self.inner.sync_dir(dir)
    }
}

impl<H: FileHooks> okaywal::fs::FileHandle for HookedFile<H> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.hooks.before_write(&self.name);
        self.inner.write_all_at(buf, offset)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.hooks.before_sync(&self.name)?;
        self.inner.sync_data()
    }
    fn sync_all(&self) -> std::io::Result<()> {
        self.hooks.before_sync(&self.name)?;
        self.inner.sync_all()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.inner.set_len(len)
    }
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
}

#[allow(unused_imports)]
pub use testkit::sediment_runs::second_run_without_a_checkpoint;

/// Whether a parameterised suite runs on a plain store or an encrypted
/// one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    #[default]
    Plain,
    Encrypted,
}

impl Mode {
    /// Both, for suites that run with encryption off and on.
    pub const BOTH: [Mode; 2] = [Mode::Plain, Mode::Encrypted];

    /// `config` for this mode: unchanged, or encrypted with [`test_key`].
    pub fn apply(self, config: Config) -> Config {
        match self {
            Mode::Plain => config,
            Mode::Encrypted => config.encryption(test_key()),
        }
    }

    /// How blobs and headers are laid out on disk in this mode.
    pub fn layout(self) -> sediment::format::Layout {
        match self {
            Mode::Plain => sediment::format::Layout::Plain,
            Mode::Encrypted => sediment::format::Layout::Sealed,
        }
    }
}

/// The key of the encrypted runs (key id 1).
pub fn test_key() -> okaywal::encryption::StaticKey {
    okaywal::encryption::StaticKey::new([0x5E; 32])
}

/// The power goes out now: every later write, sync, directory sync,
/// creation, rename, removal and resize fails and reaches nothing.
pub fn cut_power_now(fs: &CrashFileSystem) {
    for operation in [
        Operation::Write,
        Operation::Sync,
        Operation::SyncDir,
        Operation::Create,
        Operation::Rename,
        Operation::Remove,
        Operation::SetLen,
    ] {
        fs.inject(
            operation,
            fs.operation_count(operation),
            FaultKind::PowerOff,
        );
    }
}

/// Cuts the power with `db` still open, drops it and reboots the disk
/// with only what was synced.
pub fn power_cut(fs: &CrashFileSystem, db: Database) {
    cut_power_now(fs);
    drop(db);
    fs.power_loss(PowerLoss::Clean);
}

/// Byte `k` of blob `n` of the stores in `tests/fixtures/` (their READMEs
/// give the same formula).
pub fn fixture_blob(n: u64, len: usize) -> Vec<u8> {
    let seed = 1000 + n;
    (0..len as u64)
        .map(|k| ((seed * 31 + k * 7 + k / 256) % 251) as u8)
        .collect()
}

/// Copies the store `tests/fixtures/{name}` into `dir`, and returns every
/// blob its `grains.txt` lists (by grain id, with its contents) and the
/// grain ids in the order of that listing.
pub fn copy_fixture(
    name: &str,
    dir: &Path,
) -> (std::collections::BTreeMap<GrainId, Vec<u8>>, Vec<GrainId>) {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let mut stored = std::collections::BTreeMap::new();
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(&fixture).unwrap() {
        let entry = entry.unwrap();
        let file = entry.file_name().to_string_lossy().into_owned();
        if file == "grains.txt" {
            let listing = std::fs::read_to_string(entry.path()).unwrap();
            for line in listing.lines() {
                let fields: Vec<u64> = line.split(' ').map(|f| f.parse().unwrap()).collect();
                let id = GrainId::from_u64(fields[1]).unwrap();
                stored.insert(id, fixture_blob(fields[0], fields[2] as usize));
                ids.push(id);
            }
        } else if file != "README.md" {
            std::fs::copy(entry.path(), dir.join(&file)).unwrap();
        }
    }
    (stored, ids)
}

/// Every regular file directly in `dir`, by name, with its bytes.
pub fn files(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap())
        .filter(|entry| entry.file_type().unwrap().is_file())
        .map(|entry| {
            (
                entry.file_name().to_string_lossy().into_owned(),
                std::fs::read(entry.path()).unwrap(),
            )
        })
        .collect()
}
