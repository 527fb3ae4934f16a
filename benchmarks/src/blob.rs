//! The systems of the blob and scale sections: each stores blobs in durable
//! transactions (or, for the variants in [`COMMIT_VARIANTS`], buffered
//! ones with a sync now and then), reads them back by key and deletes
//! them.

use std::path::Path;

use sediment::{Database, GrainId};

/// A blob store, used from many threads at once.
pub trait BlobSystem: Sync {
    /// Stores `blobs` in one transaction that is durable when this returns
    /// (for the [`COMMIT_VARIANTS`], as each says); returns their keys in
    /// order.
    fn write(&self, thread: usize, blobs: &[&[u8]]) -> Result<Vec<u64>, String>;

    /// Reads the blob at `key`; returns its length, or `None` if absent.
    fn get(&self, thread: usize, key: u64) -> Result<Option<usize>, String>;

    /// Deletes the blobs at `keys` durably, in one transaction (for
    /// sediment: one that archives them and one `checkpoint_to` that frees
    /// them).
    fn delete(&self, keys: &[u64]) -> Result<(), String>;

    /// Runs the system's own space reclamation, if it has one a user would
    /// run, and names it. Sediment has none: freed grains are reused.
    fn reclaim(&mut self) -> Result<Option<&'static str>, String> {
        Ok(None)
    }

    /// Bytes the store takes on disk (by default: allocated blocks of
    /// every file under its directory).
    fn bytes_on_disk(&self, dir: &Path) -> Result<u64, String> {
        crate::disk_usage(dir).map_err(|e| format!("measuring {}: {e}", dir.display()))
    }

    /// How [`BlobSystem::bytes_on_disk`] counts, when it is not `du`.
    fn space_note(&self) -> Option<&'static str> {
        None
    }

    /// Shuts the store down cleanly.
    fn close(self: Box<Self>) -> Result<(), String> {
        Ok(())
    }
}

/// Every blob system this crate knows, in report order.
pub const ALL: &[&str] = &[
    "sediment",
    "sediment-encrypted",
    "redb",
    "fjall",
    "marble",
    "sqlite",
    "postgresql",
];

/// Variants of the systems above that trade durability for speed: they
/// run in the commit cells of the blob section ((a) and (b)) beside the
/// durable numbers, not in the read and space cells.
pub const COMMIT_VARIANTS: &[&str] = &["sediment-buffered"];

/// `sediment-buffered` calls `Database::sync` after this many
/// transactions (counted over all threads).
pub const BUFFERED_SYNC_EVERY: u64 = 16;

/// Opens `name` in the empty directory `dir`, for up to `threads` threads.
pub fn open(name: &str, dir: &Path, threads: usize) -> Result<Box<dyn BlobSystem>, String> {
    let _ = threads;
    match name {
        "sediment" => Ok(Box::new(SedimentBlobs::open(dir)?)),
        "sediment-encrypted" => Ok(Box::new(SedimentBlobs::open_encrypted(dir)?)),
        "sediment-buffered" => Ok(Box::new(SedimentBlobs::open_buffered(
            dir,
            BUFFERED_SYNC_EVERY,
        )?)),
        "floor" => Ok(Box::new(FloorBlobs::open(dir)?)),
        #[cfg(feature = "redb")]
        "redb" => Ok(Box::new(crate::peers::redb::RedbBlobs::open(dir)?)),
        #[cfg(feature = "fjall")]
        "fjall" => Ok(Box::new(crate::peers::fjall::FjallBlobs::open(dir)?)),
        #[cfg(feature = "marble")]
        "marble" => Ok(Box::new(crate::peers::marble::MarbleBlobs::open(
            dir, threads,
        )?)),
        #[cfg(feature = "sqlite")]
        "sqlite" => Ok(Box::new(crate::peers::sqlite::SqliteBlobs::open(
            dir, threads,
        )?)),
        #[cfg(feature = "postgres")]
        "postgresql" => Ok(Box::new(crate::peers::postgres::PostgresBlobs::open(
            threads,
        )?)),
        other => Err(crate::peers::not_available(other)),
    }
}

/// Blob (a)'s reference point, no store: each transaction's blobs are
/// written with one `pwrite` into a preallocated, zero-filled file and made
/// durable with one `fdatasync` ([`crate::floor::Floor`] at one thread).
/// It keeps nothing to read back: `get` finds nothing.
pub struct FloorBlobs {
    floor: crate::floor::Floor,
    next_key: std::sync::atomic::AtomicU64,
}

impl FloorBlobs {
    /// Creates the preallocated file in `dir`: 16 MiB, room for (a)'s
    /// transactions many times over (writes wrap around inside it).
    pub fn open(dir: &Path) -> Result<Self, String> {
        Ok(Self {
            floor: crate::floor::Floor::open_sized(dir, 16 << 20)
                .map_err(|e| format!("preallocating the floor's file: {e}"))?,
            next_key: std::sync::atomic::AtomicU64::new(1),
        })
    }
}

impl BlobSystem for FloorBlobs {
    fn write(&self, _thread: usize, blobs: &[&[u8]]) -> Result<Vec<u64>, String> {
        let first = self
            .next_key
            .fetch_add(blobs.len() as u64, std::sync::atomic::Ordering::Relaxed);
        self.floor
            .commit(&blobs.concat())
            .map_err(|e| format!("floor: {e}"))?;
        Ok((first..first + blobs.len() as u64).collect())
    }

    fn get(&self, _thread: usize, _key: u64) -> Result<Option<usize>, String> {
        Ok(None)
    }

    fn delete(&self, _keys: &[u64]) -> Result<(), String> {
        Ok(())
    }
}

/// Sediment with its default configuration: durable commits, or (as
/// `sediment-buffered`) `commit_buffered` with a `Database::sync` every
/// `sync_every` transactions, so that a write may return before it is
/// durable (it survives a crash of the process; a power cut may take the
/// transactions since the last sync).
pub struct SedimentBlobs {
    db: Option<Database>,
    /// `Some(n)`: commit buffered and sync every `n` transactions.
    sync_every: Option<u64>,
    transactions: std::sync::atomic::AtomicU64,
}

impl SedimentBlobs {
    /// Opens (creates) the database in `dir`.
    pub fn open(dir: &Path) -> Result<Self, String> {
        Ok(Self {
            db: Some(Database::recover(dir).map_err(|e| e.to_string())?),
            sync_every: None,
            transactions: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Opens (creates) the database in `dir` with encryption at rest
    /// (`Config::encryption`, the benchmarks' fixed key).
    pub fn open_encrypted(dir: &Path) -> Result<Self, String> {
        Ok(Self {
            db: Some(
                sediment::Config::for_directory(dir)
                    .encryption(crate::benchmark_key())
                    .open()
                    .map_err(|e| e.to_string())?,
            ),
            sync_every: None,
            transactions: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Opens (creates) the database in `dir`, committing with
    /// `commit_buffered` and syncing every `sync_every` transactions.
    pub fn open_buffered(dir: &Path, sync_every: u64) -> Result<Self, String> {
        let mut store = Self::open(dir)?;
        store.sync_every = Some(sync_every.max(1));
        Ok(store)
    }

    /// Commits `tx` as this system does.
    fn commit(&self, tx: sediment::Transaction<'_>) -> Result<(), String> {
        let Some(every) = self.sync_every else {
            return tx.commit().map(|_| ()).map_err(|e| e.to_string());
        };
        tx.commit_buffered().map_err(|e| e.to_string())?;
        let done = self
            .transactions
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        if done % every == 0 {
            self.db().sync().map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    fn db(&self) -> &Database {
        self.db.as_ref().expect("open until closed")
    }
}

fn grain(key: u64) -> Result<GrainId, String> {
    GrainId::from_u64(key).map_err(|e| e.to_string())
}

impl BlobSystem for SedimentBlobs {
    fn write(&self, _thread: usize, blobs: &[&[u8]]) -> Result<Vec<u64>, String> {
        let mut tx = self.db().begin_transaction().map_err(|e| e.to_string())?;
        let mut keys = Vec::with_capacity(blobs.len());
        for blob in blobs {
            keys.push(tx.write(blob).map_err(|e| e.to_string())?.as_u64());
        }
        self.commit(tx)?;
        Ok(keys)
    }

    fn get(&self, _thread: usize, key: u64) -> Result<Option<usize>, String> {
        Ok(self
            .db()
            .get(grain(key)?)
            .map_err(|e| e.to_string())?
            .map(|blob| blob.len()))
    }

    fn delete(&self, keys: &[u64]) -> Result<(), String> {
        let mut tx = self.db().begin_transaction().map_err(|e| e.to_string())?;
        for &key in keys {
            tx.archive(grain(key)?).map_err(|e| e.to_string())?;
        }
        let archived = tx.commit().map_err(|e| e.to_string())?;
        let mut tx = self.db().begin_transaction().map_err(|e| e.to_string())?;
        tx.checkpoint_to(archived).map_err(|e| e.to_string())?;
        tx.commit().map_err(|e| e.to_string())?;
        Ok(())
    }

    fn close(mut self: Box<Self>) -> Result<(), String> {
        match self.db.take() {
            Some(db) => db.shutdown().map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }
}

impl Drop for SedimentBlobs {
    fn drop(&mut self) {
        if let Some(db) = self.db.take() {
            let _ = db.shutdown();
        }
    }
}
