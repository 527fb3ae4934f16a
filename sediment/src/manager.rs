//! The WAL's side of the database (okaywal's `LogManager`): replaying
//! entries at open, and handing checkpointed entries to `checkpoint`.
//! The entries' bytes are `wal_entry`'s.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;

use okaywal::{Entry, EntryId, LogManager, LogPosition, SegmentReader, WriteAheadLog};

use crate::checkpoint::checkpoint;
use crate::db::Shared;
use crate::error::Error;
use crate::grain_id::GrainId;
use crate::wal_entry::parse_entry;

/// The `LogManager` of a database's WAL.
#[derive(Debug)]
pub(crate) struct Manager {
    shared: Arc<Shared>,
}

impl Manager {
    /// The manager of the WAL under `shared`.
    pub fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }
}

fn to_io(err: Error) -> io::Error {
    match err {
        Error::Io { context, source } | Error::Key { context, source } => {
            io::Error::new(source.kind(), format!("{context}: {source}"))
        }
        other => io::Error::other(other.to_string()),
    }
}

impl LogManager for Manager {
    fn recover(&mut self, entry: &mut Entry<'_>) -> io::Result<()> {
        let shared = &self.shared;
        if entry.id().0 <= shared.reclamation().wal_checkpointed_entry() {
            return Ok(());
        }
        let (chunks, record) = parse_entry(entry, false, shared.strata().sealer().is_some())?;
        shared.note_replayed(record.new_grains.iter().map(|grain| grain.id));
        let positions: HashMap<GrainId, LogPosition> =
            chunks.into_iter().map(|c| (c.id, c.position)).collect();
        shared
            .reclamation()
            .apply_replayed(shared.strata(), shared.cache(), record, &positions)
            .map_err(to_io)
    }

    fn checkpoint_to(
        &mut self,
        last_checkpointed_id: EntryId,
        checkpointed_entries: &mut SegmentReader,
        _wal: &WriteAheadLog,
    ) -> io::Result<()> {
        checkpoint(&self.shared, last_checkpointed_id.0, checkpointed_entries).map_err(to_io)
    }
}
