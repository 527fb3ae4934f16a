//! The systems of the WAL section: each commits one entry per call.

use std::path::Path;

use crate::floor::{Floor, ParallelLimit};

/// A log that can durably commit a payload from many threads.
pub trait WalSystem: Sync {
    /// Commits one entry holding `payload`; returns once it is durable.
    fn commit(&self, thread: usize, payload: &[u8]) -> Result<(), String>;
}

/// Every WAL system this crate knows, in report order (peers only when
/// compiled in: see [`crate::peers::compiled_in`]).
pub const ALL: &[&str] = &[
    "floor",
    "parallel-limit",
    "okaywal",
    "okaywal-encrypted",
    "buffered",
    "okaywal-0.3",
    "raft-engine",
    "sharded-log",
    "rocksdb",
    "postgresql",
    "sqlite",
];

/// Opens `name` in the empty directory `dir`, for up to `threads` threads.
pub fn open(name: &str, dir: &Path, threads: usize) -> Result<Box<dyn WalSystem>, String> {
    let _ = threads;
    match name {
        "floor" => Ok(Box::new(Floor::open(dir).map_err(|e| e.to_string())?)),
        "parallel-limit" => Ok(Box::new(
            ParallelLimit::open(dir).map_err(|e| e.to_string())?,
        )),
        "okaywal" => Ok(Box::new(OkayWal(
            okaywal::WriteAheadLog::recover(dir, okaywal::LogVoid).map_err(|e| e.to_string())?,
        ))),
        "okaywal-encrypted" => Ok(Box::new(OkayWal(
            okaywal::Configuration::default_for(dir)
                .encryption(crate::benchmark_key())
                .open(okaywal::LogVoid)
                .map_err(|e| e.to_string())?,
        ))),
        "buffered" => Ok(Box::new(Buffered(
            okaywal::WriteAheadLog::recover(dir, okaywal::LogVoid).map_err(|e| e.to_string())?,
        ))),
        #[cfg(feature = "okaywal-0.3")]
        "okaywal-0.3" => Ok(Box::new(crate::peers::okaywal03::OkayWal03::open(dir)?)),
        #[cfg(feature = "raft-engine")]
        "raft-engine" => Ok(Box::new(crate::peers::raft_engine::RaftEngine::open(dir)?)),
        #[cfg(feature = "sharded-log")]
        "sharded-log" => Ok(Box::new(crate::peers::sharded_log::ShardedLog::open(
            dir, threads,
        )?)),
        #[cfg(feature = "rocksdb")]
        "rocksdb" => Ok(Box::new(crate::peers::rocksdb::RocksDb::open(dir)?)),
        #[cfg(feature = "postgres")]
        "postgresql" => Ok(Box::new(crate::peers::postgres::PostgresWal::open(
            threads,
        )?)),
        #[cfg(feature = "sqlite")]
        "sqlite" => Ok(Box::new(crate::peers::sqlite::SqliteWal::open(
            dir, threads,
        )?)),
        other => Err(crate::peers::not_available(other)),
    }
}

impl WalSystem for Floor {
    fn commit(&self, _thread: usize, payload: &[u8]) -> Result<(), String> {
        Floor::commit(self, payload).map_err(|e| e.to_string())
    }
}

impl WalSystem for ParallelLimit {
    fn commit(&self, _thread: usize, payload: &[u8]) -> Result<(), String> {
        ParallelLimit::commit(self, payload).map_err(|e| e.to_string())
    }
}

struct OkayWal(okaywal::WriteAheadLog);

impl WalSystem for OkayWal {
    fn commit(&self, _thread: usize, payload: &[u8]) -> Result<(), String> {
        let mut entry = self.0.begin_entry().map_err(|e| e.to_string())?;
        entry.write_chunk(payload).map_err(|e| e.to_string())?;
        entry.commit().map_err(|e| e.to_string())?;
        Ok(())
    }
}

impl Drop for OkayWal {
    fn drop(&mut self) {
        let _ = self.0.shutdown();
    }
}

/// okaywal with `commit_buffered`: each commit is handed to the operating
/// system in log order and becomes durable with a later sync (survives a
/// process crash, not a power loss), so this measures the log's own cost
/// without `fdatasync`.
struct Buffered(okaywal::WriteAheadLog);

impl WalSystem for Buffered {
    fn commit(&self, _thread: usize, payload: &[u8]) -> Result<(), String> {
        let mut entry = self.0.begin_entry().map_err(|e| e.to_string())?;
        entry.write_chunk(payload).map_err(|e| e.to_string())?;
        entry.commit_buffered().map_err(|e| e.to_string())?;
        Ok(())
    }
}

impl Drop for Buffered {
    fn drop(&mut self) {
        let _ = self.0.shutdown();
    }
}
