//! okaywal 0.3.1, the published version this project's okaywal replaces:
//! default configuration, one entry with one chunk per commit.

use std::path::Path;

use okaywal03::{LogVoid, WriteAheadLog};

use crate::wal::WalSystem;

/// The published okaywal 0.3.1.
pub struct OkayWal03(Option<WriteAheadLog>);

impl OkayWal03 {
    /// Opens (creates) a log in `dir`.
    pub fn open(dir: &Path) -> Result<Self, String> {
        Ok(Self(Some(
            WriteAheadLog::recover(dir, LogVoid).map_err(|e| e.to_string())?,
        )))
    }
}

impl WalSystem for OkayWal03 {
    fn commit(&self, _thread: usize, payload: &[u8]) -> Result<(), String> {
        let log = self.0.as_ref().expect("open until dropped");
        let mut entry = log.begin_entry().map_err(|e| e.to_string())?;
        entry.write_chunk(payload).map_err(|e| e.to_string())?;
        entry.commit().map_err(|e| e.to_string())?;
        Ok(())
    }
}

impl Drop for OkayWal03 {
    fn drop(&mut self) {
        if let Some(log) = self.0.take() {
            let _ = log.shutdown();
        }
    }
}
