//! marble 16 (the sled authors' object store): `fsync_each_batch`, one
//! `write_batch` per transaction.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::blob::BlobSystem;

fn err(e: std::io::Error) -> String {
    format!("marble: {e}")
}

/// marble with its defaults plus `fsync_each_batch: true`. A `Marble` is
/// `Send` but not `Sync`: each thread gets its own clone, as marble's
/// documentation suggests.
pub struct MarbleBlobs {
    handles: Vec<Mutex<marble::Marble>>,
    next_key: AtomicU64,
}

impl MarbleBlobs {
    /// Opens (creates) a store in `dir` for `threads` threads.
    pub fn open(dir: &Path, threads: usize) -> Result<Self, String> {
        let config = marble::Config {
            path: dir.to_path_buf(),
            fsync_each_batch: true,
            ..marble::Config::default()
        };
        let marble = config.open().map_err(err)?;
        let handles = (0..threads.max(1))
            .map(|_| Mutex::new(marble.clone()))
            .collect();
        Ok(Self {
            handles,
            next_key: AtomicU64::new(1),
        })
    }

    fn handle(&self, thread: usize) -> parking_lot::MutexGuard<'_, marble::Marble> {
        self.handles[thread % self.handles.len()].lock()
    }
}

impl BlobSystem for MarbleBlobs {
    fn write(&self, thread: usize, blobs: &[&[u8]]) -> Result<Vec<u64>, String> {
        let first = self
            .next_key
            .fetch_add(blobs.len() as u64, Ordering::Relaxed);
        self.handle(thread)
            .write_batch(
                blobs
                    .iter()
                    .enumerate()
                    .map(|(i, blob)| (first + i as u64, Some(*blob))),
            )
            .map_err(err)?;
        Ok((first..first + blobs.len() as u64).collect())
    }

    fn get(&self, thread: usize, key: u64) -> Result<Option<usize>, String> {
        Ok(self.handle(thread).read(key).map_err(err)?.map(|v| v.len()))
    }

    fn delete(&self, keys: &[u64]) -> Result<(), String> {
        self.handle(0)
            .write_batch(keys.iter().map(|&key| (key, None::<&[u8]>)))
            .map_err(err)
    }

    fn reclaim(&mut self) -> Result<Option<&'static str>, String> {
        // Each pass rewrites the files below the live-data threshold; a
        // few passes settle it.
        for _ in 0..8 {
            if self.handle(0).maintenance().map_err(err)? == 0 {
                break;
            }
        }
        Ok(Some("maintenance"))
    }
}
