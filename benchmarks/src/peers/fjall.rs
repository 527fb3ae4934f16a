//! fjall 3 (an LSM tree): one keyspace with key-value separation (blobs in
//! blob files), every batch persisted with `PersistMode::SyncData`.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use fjall::{Database, Keyspace, KeyspaceCreateOptions, KvSeparationOptions, PersistMode};

use crate::blob::BlobSystem;

fn err(e: impl std::fmt::Display) -> String {
    format!("fjall: {e}")
}

/// fjall with its default settings plus key-value separation.
pub struct FjallBlobs {
    db: Database,
    blobs: Keyspace,
    next_key: AtomicU64,
}

impl FjallBlobs {
    /// Creates a database in `dir`.
    pub fn open(dir: &Path) -> Result<Self, String> {
        let db = Database::builder(dir).open().map_err(err)?;
        let blobs = db
            .keyspace("blobs", || {
                KeyspaceCreateOptions::default()
                    .with_kv_separation(Some(KvSeparationOptions::default()))
            })
            .map_err(err)?;
        Ok(Self {
            db,
            blobs,
            next_key: AtomicU64::new(1),
        })
    }
}

impl BlobSystem for FjallBlobs {
    fn write(&self, _thread: usize, blobs: &[&[u8]]) -> Result<Vec<u64>, String> {
        let first = self
            .next_key
            .fetch_add(blobs.len() as u64, Ordering::Relaxed);
        let mut batch = self.db.batch().durability(Some(PersistMode::SyncData));
        for (i, blob) in blobs.iter().enumerate() {
            batch.insert(&self.blobs, (first + i as u64).to_be_bytes(), *blob);
        }
        batch.commit().map_err(err)?;
        Ok((first..first + blobs.len() as u64).collect())
    }

    fn get(&self, _thread: usize, key: u64) -> Result<Option<usize>, String> {
        Ok(self
            .blobs
            .get(key.to_be_bytes())
            .map_err(err)?
            .map(|v| v.len()))
    }

    fn delete(&self, keys: &[u64]) -> Result<(), String> {
        let mut batch = self.db.batch().durability(Some(PersistMode::SyncData));
        for &key in keys {
            batch.remove(&self.blobs, key.to_be_bytes());
        }
        batch.commit().map_err(err)
    }

    fn reclaim(&mut self) -> Result<Option<&'static str>, String> {
        self.blobs.rotate_memtable_and_wait().map_err(err)?;
        self.blobs.major_compact().map_err(err)?;
        Ok(Some("flush + major_compact"))
    }
}
