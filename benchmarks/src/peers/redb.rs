//! redb: one table `u64 → &[u8]`, default durability
//! (`Durability::Immediate`: every commit is synced).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use redb::{Database, ReadableDatabase, TableDefinition};

use crate::blob::BlobSystem;

const BLOBS: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("blobs");

fn err(e: impl std::fmt::Display) -> String {
    format!("redb: {e}")
}

/// redb with its default settings.
pub struct RedbBlobs {
    db: Database,
    next_key: AtomicU64,
}

impl RedbBlobs {
    /// Creates `blobs.redb` in `dir`.
    pub fn open(dir: &Path) -> Result<Self, String> {
        let db = Database::create(dir.join("blobs.redb")).map_err(err)?;
        let tx = db.begin_write().map_err(err)?;
        tx.open_table(BLOBS).map_err(err)?;
        tx.commit().map_err(err)?;
        Ok(Self {
            db,
            next_key: AtomicU64::new(1),
        })
    }
}

impl BlobSystem for RedbBlobs {
    fn write(&self, _thread: usize, blobs: &[&[u8]]) -> Result<Vec<u64>, String> {
        let tx = self.db.begin_write().map_err(err)?;
        // Keys are taken inside the (single) write transaction, so they
        // arrive in order.
        let first = self
            .next_key
            .fetch_add(blobs.len() as u64, Ordering::Relaxed);
        {
            let mut table = tx.open_table(BLOBS).map_err(err)?;
            for (i, blob) in blobs.iter().enumerate() {
                table.insert(first + i as u64, *blob).map_err(err)?;
            }
        }
        tx.commit().map_err(err)?;
        Ok((first..first + blobs.len() as u64).collect())
    }

    fn get(&self, _thread: usize, key: u64) -> Result<Option<usize>, String> {
        let tx = self.db.begin_read().map_err(err)?;
        let table = tx.open_table(BLOBS).map_err(err)?;
        Ok(table.get(key).map_err(err)?.map(|v| v.value().len()))
    }

    fn delete(&self, keys: &[u64]) -> Result<(), String> {
        let tx = self.db.begin_write().map_err(err)?;
        {
            let mut table = tx.open_table(BLOBS).map_err(err)?;
            for &key in keys {
                table.remove(key).map_err(err)?;
            }
        }
        tx.commit().map_err(err)
    }

    fn reclaim(&mut self) -> Result<Option<&'static str>, String> {
        for _ in 0..8 {
            if !self.db.compact().map_err(err)? {
                break;
            }
        }
        Ok(Some("Database::compact"))
    }
}
