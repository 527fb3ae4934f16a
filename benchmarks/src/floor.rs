//! The reference points every WAL is compared with: raw `pwrite` +
//! `fdatasync` on a preallocated file.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Condvar, Mutex};

/// Size of the preallocated file; writes wrap around inside it.
pub const FILE_BYTES: u64 = 256 << 20;

fn preallocated(path: &Path, bytes: u64) -> std::io::Result<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    let zeros = vec![0_u8; 1 << 20];
    for i in 0..bytes.div_ceil(1 << 20) {
        file.write_all_at(&zeros, i << 20)?;
    }
    file.sync_all()?;
    Ok(file)
}

/// One writer at a time: `pwrite` then `fdatasync` per commit; with many
/// threads, a plain leader/follower group commit: whoever finds no sync
/// running writes the whole pending batch and syncs while the others wait,
/// then wakes them all.
#[derive(Debug)]
pub struct Floor {
    file: File,
    /// Size of the preallocated file; batches wrap around inside it.
    size: u64,
    state: Mutex<FloorState>,
    done: Condvar,
}

#[derive(Debug, Default)]
struct FloorState {
    batch: Vec<u8>,
    /// Batch number that the next arrival joins.
    open_batch: u64,
    /// Batches that are durable.
    durable: u64,
    syncing: bool,
    offset: u64,
}

impl Floor {
    /// Creates the preallocated file ([`FILE_BYTES`]) in `dir`.
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        Self::open_sized(dir, FILE_BYTES)
    }

    /// Creates a preallocated file of `bytes` (rounded up to whole MiB) in
    /// `dir`.
    pub fn open_sized(dir: &Path, bytes: u64) -> std::io::Result<Self> {
        let size = bytes.div_ceil(1 << 20).max(1) << 20;
        Ok(Self {
            file: preallocated(&dir.join("floor"), size)?,
            size,
            state: Mutex::new(FloorState {
                open_batch: 1,
                ..FloorState::default()
            }),
            done: Condvar::new(),
        })
    }

    /// Commits `payload` durably.
    pub fn commit(&self, payload: &[u8]) -> std::io::Result<()> {
        let mut state = self.state.lock();
        state.batch.extend_from_slice(payload);
        let mine = state.open_batch;
        loop {
            if state.durable >= mine {
                return Ok(());
            }
            if !state.syncing {
                // Lead: take the open batch (which contains ours).
                state.syncing = true;
                let batch = std::mem::take(&mut state.batch);
                let number = state.open_batch;
                state.open_batch += 1;
                let mut offset = state.offset;
                if offset + batch.len() as u64 > self.size {
                    offset = 0;
                }
                state.offset = offset + batch.len() as u64;
                drop(state);
                let result = self
                    .file
                    .write_all_at(&batch, offset)
                    .and_then(|()| self.file.sync_data());
                state = self.state.lock();
                state.syncing = false;
                state.durable = number;
                self.done.notify_all();
                result?;
                continue;
            }
            self.done.wait(&mut state);
        }
    }
}

/// Every thread `pwrite`s at its own reserved offset and calls `fdatasync`
/// itself, with no coordination: the ceiling for large payloads.
#[derive(Debug)]
pub struct ParallelLimit {
    file: File,
    offset: AtomicU64,
}

impl ParallelLimit {
    /// Creates the preallocated file in `dir`.
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        Ok(Self {
            file: preallocated(&dir.join("parallel"), FILE_BYTES)?,
            offset: AtomicU64::new(0),
        })
    }

    /// Commits `payload` durably.
    pub fn commit(&self, payload: &[u8]) -> std::io::Result<()> {
        let len = payload.len() as u64;
        let offset =
            self.offset.fetch_add(len, Ordering::Relaxed) % (FILE_BYTES - len.min(FILE_BYTES - 1));
        self.file.write_all_at(payload, offset)?;
        self.file.sync_data()
    }
}
