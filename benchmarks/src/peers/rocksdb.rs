//! RocksDB through the `rocksdb` crate (feature `rocksdb`, not in `peers`):
//! default options, one `put` per commit with `WriteOptions::set_sync(true)`
//! (the write-ahead log is synced before `put` returns).

use std::path::Path;

use crate::wal::WalSystem;

/// RocksDB with synced writes.
pub struct RocksDb {
    db: rocksdb::DB,
    sync: rocksdb::WriteOptions,
}

impl RocksDb {
    /// Opens (creates) a database in `dir`.
    pub fn open(dir: &Path) -> Result<Self, String> {
        let mut options = rocksdb::Options::default();
        options.create_if_missing(true);
        let db = rocksdb::DB::open(&options, dir).map_err(|e| e.to_string())?;
        let mut sync = rocksdb::WriteOptions::default();
        sync.set_sync(true);
        Ok(Self { db, sync })
    }
}

impl WalSystem for RocksDb {
    fn commit(&self, thread: usize, payload: &[u8]) -> Result<(), String> {
        self.db
            .put_opt((thread as u64).to_be_bytes(), payload, &self.sync)
            .map_err(|e| e.to_string())
    }
}
