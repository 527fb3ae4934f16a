//! An in-memory disk that remembers what was made durable.
//!
//! Every write is applied to the file's visible contents at once and also
//! queued as "unsynced" until `sync_data`/`sync_all` on that file; directory
//! entries (creations, renames, removals) become durable only on `sync_dir`
//! of their parent. [`CrashFileSystem::power_loss`] rebuilds the disk from
//! the durable state alone, optionally letting some unsynced writes through
//! (torn writes, holes, random subsets) the way a real disk might.
//!
//! Faults can be injected on the Nth operation of a kind: an I/O error of a
//! chosen kind for that one call, or a power cut from that call on (the call
//! and everything after it fail and nothing more reaches the disk).
//!
//! A sync makes durable only the writes that were made before it began; a
//! write that lands while the sync is running stays unsynced, as on a real
//! disk. [`CrashFileSystem::jitter`] adds random delays around operations,
//! so that concurrent callers interleave in more ways than the scheduler
//! alone would produce.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use super::{path_error, FileHandle, FileSystem, OpenMode};

/// The kinds of operation that faults can be attached to and that are
/// counted by [`CrashFileSystem::operation_count`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Operation {
    /// A positioned write to a file.
    Write,
    /// `sync_data` or `sync_all` on a file.
    Sync,
    /// `sync_dir` on a directory.
    SyncDir,
    /// A rename.
    Rename,
    /// A positioned read from a file.
    Read,
    /// Opening a file with creation allowed.
    Create,
    /// Removing a file.
    Remove,
    /// Changing a file's length.
    SetLen,
}

impl Operation {
    fn index(self) -> usize {
        self as usize
    }
}

/// What happens when an injected fault fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// This one call fails with an error of this kind; the disk is unchanged
    /// by it (a failed sync makes nothing durable) and later calls work.
    Error(io::ErrorKind),
    /// The power goes out: this call and every later one fail, and nothing
    /// more reaches the disk until [`CrashFileSystem::power_loss`].
    PowerOff,
}

/// Which unsynced writes survive a [`CrashFileSystem::power_loss`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerLoss {
    /// Only what was synced survives.
    Clean,
    /// Every unsynced write survives except the last one of each file, of
    /// which only the first half (rounded down) reaches the disk.
    TornPrefix,
    /// Every unsynced write survives, but one 512-byte sector inside the
    /// last write of each file keeps its old durable contents.
    SectorHole,
    /// Each unsynced write independently survives or not, chosen by a
    /// generator seeded with this value.
    Random(u64),
}

#[derive(Debug, Clone)]
enum Pending {
    Write { offset: u64, bytes: Vec<u8> },
    SetLen(u64),
}

#[derive(Debug, Default)]
struct Inode {
    data: Vec<u8>,
    durable: Vec<u8>,
    /// Unsynced changes in the order they were made, each numbered so a
    /// sync can tell the ones made before it began from later ones.
    pending: Vec<(u64, Pending)>,
    next_change: u64,
}

impl Inode {
    fn push(&mut self, change: Pending) {
        self.pending.push((self.next_change, change));
        self.next_change += 1;
    }
}

fn apply(target: &mut Vec<u8>, op: &Pending) {
    match op {
        Pending::Write { offset, bytes } => write_into(target, *offset, bytes),
        Pending::SetLen(len) => target.resize(*len as usize, 0),
    }
}

fn write_into(target: &mut Vec<u8>, offset: u64, bytes: &[u8]) {
    let offset = offset as usize;
    let end = offset + bytes.len();
    if target.len() < end {
        target.resize(end, 0);
    }
    target[offset..end].copy_from_slice(bytes);
}

type InodeRef = Arc<RwLock<Inode>>;

#[derive(Debug, Default)]
struct Namespace {
    dirs: BTreeSet<PathBuf>,
    files: BTreeMap<PathBuf, InodeRef>,
    durable_files: BTreeMap<PathBuf, InodeRef>,
}

#[derive(Debug, Default)]
struct Faults {
    counts: [u64; 8],
    planned: Vec<(Operation, u64, FaultKind)>,
    powered_off: bool,
}

/// Random delays: a generator and the longest delay.
#[derive(Debug)]
struct Jitter {
    state: u64,
    max: Duration,
}

#[derive(Debug)]
struct Disk {
    tracking: bool,
    generation: AtomicU64,
    namespace: Mutex<Namespace>,
    faults: Mutex<Faults>,
    jitter: Mutex<Option<Jitter>>,
}

impl Disk {
    fn new(tracking: bool) -> Self {
        Self {
            tracking,
            generation: AtomicU64::new(0),
            namespace: Mutex::default(),
            faults: Mutex::default(),
            jitter: Mutex::new(None),
        }
    }

    /// With jitter on: half the time nothing, a quarter of the time a
    /// yield, otherwise a sleep of up to the configured maximum.
    fn delay(&self) {
        let pause = {
            let mut jitter = self.jitter.lock();
            let Some(jitter) = jitter.as_mut() else {
                return;
            };
            let draw = next_random(&mut jitter.state);
            match draw % 4 {
                0 | 1 => None,
                2 => Some(Duration::ZERO),
                _ => {
                    let max = u64::try_from(jitter.max.as_nanos())
                        .unwrap_or(u64::MAX)
                        .max(1);
                    Some(Duration::from_nanos((draw >> 2) % max))
                }
            }
        };
        match pause {
            None => {}
            Some(Duration::ZERO) => std::thread::yield_now(),
            Some(pause) => std::thread::sleep(pause),
        }
    }

    /// Counts an operation and decides whether it may proceed.
    fn check(&self, op: Operation, generation: u64, what: &dyn Fn() -> String) -> io::Result<()> {
        self.delay();
        if generation != self.generation.load(Ordering::Acquire) {
            return Err(io::Error::other(format!(
                "{}: handle from before a simulated power loss",
                what()
            )));
        }
        let mut faults = self.faults.lock();
        if faults.powered_off {
            return Err(io::Error::other(format!(
                "{}: simulated power loss",
                what()
            )));
        }
        let count = faults.counts[op.index()];
        faults.counts[op.index()] += 1;
        let fired = faults
            .planned
            .iter()
            .position(|(o, n, _)| *o == op && *n == count);
        if let Some(index) = fired {
            let (_, _, kind) = faults.planned.remove(index);
            match kind {
                FaultKind::Error(kind) => {
                    return Err(io::Error::new(
                        kind,
                        format!("{}: injected {op:?} fault #{count}", what()),
                    ))
                }
                FaultKind::PowerOff => {
                    faults.powered_off = true;
                    return Err(io::Error::other(format!(
                        "{}: simulated power loss at {op:?} #{count}",
                        what()
                    )));
                }
            }
        }
        Ok(())
    }
}

/// A simulated disk for crash tests: it remembers which writes and
/// directory entries were synced, injects faults on the Nth operation of a
/// kind, and rebuilds itself from what was durable on [`CrashFileSystem::power_loss`].
///
/// Clones share the same disk.
#[derive(Debug, Clone)]
pub struct CrashFileSystem {
    disk: Arc<Disk>,
}

impl Default for CrashFileSystem {
    fn default() -> Self {
        Self::new()
    }
}

impl CrashFileSystem {
    /// Returns a new, empty simulated disk.
    #[must_use]
    pub fn new() -> Self {
        Self {
            disk: Arc::new(Disk::new(true)),
        }
    }

    pub(super) fn untracked() -> Self {
        Self {
            disk: Arc::new(Disk::new(false)),
        }
    }

    /// Makes the `nth` (counting from 0 since this disk was created) call of
    /// `operation` fail as `kind` says.
    pub fn inject(&self, operation: Operation, nth: u64, kind: FaultKind) {
        self.disk.faults.lock().planned.push((operation, nth, kind));
    }

    /// From now on every operation may wait up to `max_delay` (a random
    /// time drawn from a generator seeded with `seed`) before it takes
    /// effect, a write also after, and a sync between deciding which writes
    /// it covers and making them durable. Races between threads that the
    /// scheduler rarely produces then happen often; `Duration::ZERO` turns
    /// the delays off again.
    ///
    /// ```
    /// use std::time::Duration;
    /// use okaywal::fs::CrashFileSystem;
    ///
    /// let fs = CrashFileSystem::new();
    /// fs.jitter(42, Duration::from_micros(200));
    /// ```
    pub fn jitter(&self, seed: u64, max_delay: Duration) {
        *self.disk.jitter.lock() = (!max_delay.is_zero()).then_some(Jitter {
            state: seed,
            max: max_delay,
        });
    }

    /// Removes every planned fault that has not fired yet.
    pub fn clear_faults(&self) {
        self.disk.faults.lock().planned.clear();
    }

    /// How many calls of `operation` were made since this disk was created
    /// (including ones that failed).
    #[must_use]
    pub fn operation_count(&self, operation: Operation) -> u64 {
        self.disk.faults.lock().counts[operation.index()]
    }

    /// Returns true once an injected [`FaultKind::PowerOff`] has fired.
    #[must_use]
    pub fn is_powered_off(&self) -> bool {
        self.disk.faults.lock().powered_off
    }

    /// Simulates a power cut and reboot: the disk keeps only the durable
    /// directory entries and file contents, plus whatever unsynced writes
    /// `policy` lets through. Handles opened before this call stop working;
    /// planned faults are cleared and counters keep counting.
    pub fn power_loss(&self, policy: PowerLoss) {
        let mut faults = self.disk.faults.lock();
        let mut namespace = self.disk.namespace.lock();
        self.disk.generation.fetch_add(1, Ordering::AcqRel);
        let mut rng = policy_seed(policy);
        let mut seen = BTreeSet::new();
        let durable = namespace.durable_files.clone();
        for inode in durable.values() {
            if !seen.insert(Arc::as_ptr(inode) as usize) {
                continue;
            }
            let mut inode = inode.write();
            let mut contents = inode.durable.clone();
            let pending = std::mem::take(&mut inode.pending);
            let last = pending.len().checked_sub(1);
            for (i, (_, op)) in pending.iter().enumerate() {
                let is_last = Some(i) == last;
                match policy {
                    PowerLoss::Clean => {}
                    PowerLoss::TornPrefix => match (op, is_last) {
                        (Pending::Write { offset, bytes }, true) => {
                            write_into(&mut contents, *offset, &bytes[..bytes.len() / 2]);
                        }
                        _ => apply(&mut contents, op),
                    },
                    PowerLoss::SectorHole => match (op, is_last) {
                        (Pending::Write { offset, bytes }, true) => {
                            let before = contents.clone();
                            write_into(&mut contents, *offset, bytes);
                            let hole_start = (*offset as usize + bytes.len() / 2) / 512 * 512;
                            let hole_end = (hole_start + 512).min(contents.len());
                            for (at, byte) in contents
                                .iter_mut()
                                .enumerate()
                                .take(hole_end)
                                .skip(hole_start)
                            {
                                *byte = before.get(at).copied().unwrap_or(0);
                            }
                        }
                        _ => apply(&mut contents, op),
                    },
                    PowerLoss::Random(_) => {
                        if next_random(&mut rng) & 1 == 1 {
                            apply(&mut contents, op);
                        }
                    }
                }
            }
            inode.durable.clone_from(&contents);
            inode.data = contents;
        }
        namespace.files = namespace.durable_files.clone();
        faults.planned.clear();
        faults.powered_off = false;
    }

    /// Returns the visible contents of the file at `path`, if it exists.
    #[must_use]
    pub fn contents(&self, path: &Path) -> Option<Vec<u8>> {
        let namespace = self.disk.namespace.lock();
        namespace
            .files
            .get(path)
            .map(|inode| inode.read().data.clone())
    }

    /// Replaces the contents of the file at `path` (durably), for tests
    /// that corrupt files on purpose. Returns false if there is no such file.
    pub fn set_contents(&self, path: &Path, contents: Vec<u8>) -> bool {
        let namespace = self.disk.namespace.lock();
        match namespace.files.get(path) {
            Some(inode) => {
                let mut inode = inode.write();
                inode.durable.clone_from(&contents);
                inode.data = contents;
                inode.pending.clear();
                true
            }
            None => false,
        }
    }

    fn handle(&self, inode: InodeRef, path: &Path, writable: bool) -> Arc<dyn FileHandle> {
        Arc::new(SimFile {
            disk: self.disk.clone(),
            inode,
            path: path.to_path_buf(),
            writable,
            generation: self.disk.generation.load(Ordering::Acquire),
        })
    }

    fn gen(&self) -> u64 {
        self.disk.generation.load(Ordering::Acquire)
    }
}

fn policy_seed(policy: PowerLoss) -> u64 {
    match policy {
        PowerLoss::Random(seed) => seed ^ 0x9E37_79B9_7F4A_7C15,
        _ => 0,
    }
}

/// splitmix64: small, seedable, good enough to pick which writes survive.
fn next_random(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl FileSystem for CrashFileSystem {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut namespace = self.disk.namespace.lock();
        for ancestor in path.ancestors() {
            if !ancestor.as_os_str().is_empty() {
                namespace.dirs.insert(ancestor.to_path_buf());
            }
        }
        Ok(())
    }

    fn list_files(&self, dir: &Path) -> io::Result<Vec<String>> {
        let namespace = self.disk.namespace.lock();
        if !namespace.dirs.contains(dir) {
            return Err(path_error(
                io::ErrorKind::NotFound,
                "no such directory",
                dir,
            ));
        }
        Ok(namespace
            .files
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name().and_then(|n| n.to_str()).map(String::from))
            .collect())
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        let namespace = self.disk.namespace.lock();
        Ok(namespace.files.contains_key(path) || namespace.dirs.contains(path))
    }

    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn FileHandle>> {
        let creating = matches!(mode, OpenMode::Create | OpenMode::CreateNew);
        if creating {
            self.disk.check(Operation::Create, self.gen(), &|| {
                format!("creating {}", path.display())
            })?;
        }
        let mut namespace = self.disk.namespace.lock();
        let parent_exists = path.parent().map_or(true, |p| {
            p.as_os_str().is_empty() || namespace.dirs.contains(p)
        });
        if let Some(inode) = namespace.files.get(path) {
            if mode == OpenMode::CreateNew {
                return Err(path_error(
                    io::ErrorKind::AlreadyExists,
                    "file already exists",
                    path,
                ));
            }
            let inode = inode.clone();
            return Ok(self.handle(inode, path, mode != OpenMode::Read));
        }
        if !creating {
            return Err(path_error(io::ErrorKind::NotFound, "no such file", path));
        }
        if !parent_exists {
            return Err(path_error(
                io::ErrorKind::NotFound,
                "parent directory does not exist",
                path,
            ));
        }
        let inode = InodeRef::default();
        namespace.files.insert(path.to_path_buf(), inode.clone());
        Ok(self.handle(inode, path, true))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.disk.check(Operation::Rename, self.gen(), &|| {
            format!("renaming {} to {}", from.display(), to.display())
        })?;
        let mut namespace = self.disk.namespace.lock();
        let inode = namespace
            .files
            .remove(from)
            .ok_or_else(|| path_error(io::ErrorKind::NotFound, "no such file", from))?;
        namespace.files.insert(to.to_path_buf(), inode);
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.disk.check(Operation::Remove, self.gen(), &|| {
            format!("removing {}", path.display())
        })?;
        let mut namespace = self.disk.namespace.lock();
        namespace
            .files
            .remove(path)
            .map(|_| ())
            .ok_or_else(|| path_error(io::ErrorKind::NotFound, "no such file", path))
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.disk.check(Operation::SyncDir, self.gen(), &|| {
            format!("syncing directory {}", dir.display())
        })?;
        let mut namespace = self.disk.namespace.lock();
        let namespace = &mut *namespace;
        namespace
            .durable_files
            .retain(|path, _| path.parent() != Some(dir));
        for (path, inode) in &namespace.files {
            if path.parent() == Some(dir) {
                namespace.durable_files.insert(path.clone(), inode.clone());
            }
        }
        Ok(())
    }
}

#[derive(Debug)]
struct SimFile {
    disk: Arc<Disk>,
    inode: InodeRef,
    path: PathBuf,
    writable: bool,
    generation: u64,
}

impl SimFile {
    fn check(&self, op: Operation, what: &str) -> io::Result<()> {
        self.disk.check(op, self.generation, &|| {
            format!("{what} {}", self.path.display())
        })
    }

    fn check_writable(&self) -> io::Result<()> {
        if self.writable {
            Ok(())
        } else {
            Err(path_error(
                io::ErrorKind::PermissionDenied,
                "file opened read-only",
                &self.path,
            ))
        }
    }
}

impl FileHandle for SimFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.check(Operation::Read, "reading")?;
        let inode = self.inode.read();
        let start = (offset as usize).min(inode.data.len());
        let n = buf.len().min(inode.data.len() - start);
        buf[..n].copy_from_slice(&inode.data[start..start + n]);
        Ok(n)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check_writable()?;
        self.check(Operation::Write, "writing")?;
        {
            let mut inode = self.inode.write();
            write_into(&mut inode.data, offset, buf);
            if self.disk.tracking {
                inode.push(Pending::Write {
                    offset,
                    bytes: buf.to_vec(),
                });
            }
        }
        self.disk.delay();
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        self.check(Operation::Sync, "syncing")?;
        if self.disk.tracking {
            let begun_at = self.inode.read().next_change;
            self.disk.delay();
            let mut inode = self.inode.write();
            let inode = &mut *inode;
            // Changes arrive in order, so those before the sync began are a
            // prefix (others may have taken part of it meanwhile).
            let covered = inode
                .pending
                .iter()
                .take_while(|(number, _)| *number < begun_at)
                .count();
            for (_, op) in inode.pending.drain(..covered) {
                apply(&mut inode.durable, &op);
            }
        }
        Ok(())
    }

    fn sync_all(&self) -> io::Result<()> {
        self.sync_data()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.check_writable()?;
        self.check(Operation::SetLen, "resizing")?;
        let mut inode = self.inode.write();
        inode.data.resize(len as usize, 0);
        if self.disk.tracking {
            inode.push(Pending::SetLen(len));
        }
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.inode.read().data.len() as u64)
    }
}

#[cfg(test)]
mod tests;
