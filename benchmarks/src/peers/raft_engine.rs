//! raft-engine 0.4 (TiKV's log store): default configuration, one region per
//! thread, one `put` per `LogBatch`, `write(&mut batch, true)` (synced).

use std::path::Path;

use raft_engine::{Config, Engine, LogBatch};

use crate::wal::WalSystem;

/// raft-engine with its default configuration.
pub struct RaftEngine(Engine);

impl RaftEngine {
    /// Opens (creates) an engine in `dir`.
    pub fn open(dir: &Path) -> Result<Self, String> {
        let config = Config {
            dir: dir.to_string_lossy().into_owned(),
            ..Config::default()
        };
        Ok(Self(Engine::open(config).map_err(|e| e.to_string())?))
    }
}

impl WalSystem for RaftEngine {
    fn commit(&self, thread: usize, payload: &[u8]) -> Result<(), String> {
        let mut batch = LogBatch::default();
        // One key per region, overwritten: the engine's in-memory index
        // stays small however long the run.
        batch
            .put(thread as u64 + 1, b"entry".to_vec(), payload.to_vec())
            .map_err(|e| e.to_string())?;
        self.0.write(&mut batch, true).map_err(|e| e.to_string())?;
        Ok(())
    }
}
