//! Following the live log in tests: a manager whose checkpoints wait for
//! the follower, a manager that records recovered chunks, and the
//! follower's loop.

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use okaywal::{Entry, EntryId, LogEntries, LogManager, SegmentReader, WriteAheadLog};

/// Records every recovered entry's chunks; refuses checkpoints, so every
/// segment stays live (for tests that look at recovery).
#[derive(Debug, Clone, Default)]
pub struct ChunkRecorder {
    pub recovered: Arc<Mutex<BTreeMap<u64, Vec<Vec<u8>>>>>,
}

impl LogManager for ChunkRecorder {
    fn recover(&mut self, entry: &mut Entry<'_>) -> io::Result<()> {
        let id = entry.id().0;
        let chunks = entry.read_all_chunks()?.expect("complete");
        self.recovered.lock().unwrap().insert(id, chunks);
        Ok(())
    }

    fn checkpoint_to(
        &mut self,
        _: EntryId,
        _: &mut SegmentReader,
        _: &WriteAheadLog,
    ) -> io::Result<()> {
        Err(io::Error::other("checkpoints are refused in this test"))
    }
}

/// A manager for a replica-style follower: a checkpoint waits until the
/// follower has passed every committed entry of the segment (it never
/// sees rolled-back ones, possibly the segment's last), so no entry is
/// recycled before it was read.
#[derive(Debug, Clone, Default)]
pub struct WaitsForReader {
    /// One past the id of the last entry the follower read.
    pub reader_at: Arc<AtomicU64>,
    /// The ids of every checkpointed entry.
    pub checkpointed: Arc<Mutex<Vec<u64>>>,
}

impl LogManager for WaitsForReader {
    fn recover(&mut self, _: &mut Entry<'_>) -> io::Result<()> {
        Ok(())
    }

    fn checkpoint_to(
        &mut self,
        last: EntryId,
        entries: &mut SegmentReader,
        _: &WriteAheadLog,
    ) -> io::Result<()> {
        let mut ids = Vec::new();
        while let Some(entry) = entries.read_entry()? {
            assert!(entry.id() <= last);
            ids.push(entry.id().0);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        let highest = ids.iter().copied().max().unwrap_or(0);
        while self.reader_at.load(Ordering::SeqCst) <= highest {
            if Instant::now() > deadline {
                return Err(io::Error::other("the reader fell behind"));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.checkpointed.lock().unwrap().extend(ids);
        Ok(())
    }
}

/// Reads entries as they come, telling `reader_at` after each, until
/// `stop` is set (if given) and then `idle_rounds` waits of `wait` in a
/// row found nothing. Returns (id, chunks) in the order read.
pub fn follow(
    mut entries: LogEntries,
    reader_at: &AtomicU64,
    stop: Option<&AtomicBool>,
    idle_rounds: u32,
    wait: Duration,
) -> Vec<(u64, Vec<Vec<u8>>)> {
    let mut seen = Vec::new();
    let mut idle = 0;
    while idle < idle_rounds || stop.is_some_and(|stop| !stop.load(Ordering::SeqCst)) {
        match entries.next_timeout(wait).unwrap() {
            Some(entry) => {
                idle = 0;
                reader_at.store(entry.id().0 + 1, Ordering::SeqCst);
                seen.push((entry.id().0, entry.into_chunks()));
            }
            None => idle += 1,
        }
    }
    seen
}
