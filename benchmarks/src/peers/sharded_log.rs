//! sharded-log 0.0.1 (from the sled/komora authors): one shard per thread,
//! `write_batch` of one buffer then `flush` (which syncs) per commit.

use std::path::Path;

use crate::wal::WalSystem;

/// sharded-log with one shard and one handle per thread.
pub struct ShardedLog(Vec<sharded_log::ShardedLog>);

impl ShardedLog {
    /// Creates a log in `dir` for `threads` threads.
    pub fn open(dir: &Path, threads: usize) -> Result<Self, String> {
        let config = sharded_log::Config {
            path: dir.to_path_buf(),
            shards: threads.clamp(1, 255) as u8,
            ..sharded_log::Config::default()
        };
        let log = config.create().map_err(|e| e.to_string())?;
        // Each clone prefers its own shard.
        let handles = (0..threads.max(1)).map(|_| log.clone()).collect();
        Ok(Self(handles))
    }
}

impl WalSystem for ShardedLog {
    fn commit(&self, thread: usize, payload: &[u8]) -> Result<(), String> {
        let log = &self.0[thread % self.0.len()];
        log.write_batch(&[payload]).map_err(|e| e.to_string())?;
        log.flush().map_err(|e| e.to_string())
    }
}
