//! Writes entries from several threads, reopens the log, recovers them and
//! prints what happened.
//!
//! `cargo run --release --example quickstart [DIRECTORY]`; without a
//! directory, a temporary one under `target/` is used and removed.

use std::collections::BTreeSet;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use okaywal::{Entry, EntryId, LogManager, SegmentReader, WriteAheadLog};

/// What recovery and checkpoints handed to the manager.
#[derive(Debug, Default)]
struct Seen {
    recovered: BTreeSet<u64>,
    recovered_bytes: usize,
    checkpointed: usize,
}

/// The manager moves into the log, so it records into shared state.
#[derive(Debug, Default, Clone)]
struct Tally(Arc<Mutex<Seen>>);

impl LogManager for Tally {
    fn recover(&mut self, entry: &mut Entry<'_>) -> io::Result<()> {
        let id = entry.id().0;
        if let Some(chunks) = entry.read_all_chunks()? {
            let mut seen = self.0.lock().expect("not poisoned");
            seen.recovered.insert(id);
            seen.recovered_bytes += chunks.iter().map(Vec::len).sum::<usize>();
        }
        Ok(())
    }

    fn checkpoint_to(
        &mut self,
        _last_checkpointed_id: EntryId,
        entries: &mut SegmentReader,
        _wal: &WriteAheadLog,
    ) -> io::Result<()> {
        // A real manager writes the entries into its primary store and
        // syncs it before returning.
        while let Some(mut entry) = entries.read_entry()? {
            entry.read_all_chunks()?;
            self.0.lock().expect("not poisoned").checkpointed += 1;
        }
        Ok(())
    }
}

const THREADS: usize = 8;
const ENTRIES_PER_THREAD: usize = 500;

fn main() -> io::Result<()> {
    let (directory, _temp) = match std::env::args().nth(1) {
        Some(dir) => (std::path::PathBuf::from(dir), None),
        None => {
            std::fs::create_dir_all("target")?;
            let temp = tempfile::tempdir_in("target")?;
            (temp.path().join("quickstart-log"), Some(temp))
        }
    };

    let log = WriteAheadLog::recover(&directory, Tally::default())?;
    println!("opened a log in {}", directory.display());

    let started = Instant::now();
    let committed: Vec<EntryId> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|thread| {
                let log = &log;
                scope.spawn(move || -> io::Result<Vec<EntryId>> {
                    let mut ids = Vec::new();
                    for i in 0..ENTRIES_PER_THREAD {
                        let mut entry = log.begin_entry()?;
                        entry.write_chunk(format!("thread {thread} entry {i}").as_bytes())?;
                        ids.push(entry.commit()?);
                    }
                    Ok(ids)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("writer thread panicked"))
            .collect::<io::Result<Vec<_>>>()
            .map(|all| all.into_iter().flatten().collect())
    })?;
    let elapsed = started.elapsed();
    println!(
        "{THREADS} threads committed {} entries in {elapsed:.2?} ({:.0} durable commits/s)",
        committed.len(),
        committed.len() as f64 / elapsed.as_secs_f64()
    );

    // A rolled-back entry never comes back.
    let mut doomed = log.begin_entry()?;
    doomed.write_chunk(b"this entry is rolled back")?;
    let doomed_id = doomed.id();
    doomed.rollback()?;
    println!("rolled back entry {doomed_id}");

    log.shutdown()?;
    drop(log);

    let tally = Tally::default();
    let log = WriteAheadLog::recover(&directory, tally.clone())?;
    {
        let seen = tally.0.lock().expect("not poisoned");
        let missing = committed
            .iter()
            .filter(|id| !seen.recovered.contains(&id.0))
            .count();
        println!(
            "reopened: recovered {} entries ({} bytes); {missing} committed entries missing; rolled-back entry recovered: {}",
            seen.recovered.len(),
            seen.recovered_bytes,
            seen.recovered.contains(&doomed_id.0)
        );
        if missing > 0 || seen.recovered.contains(&doomed_id.0) {
            return Err(io::Error::other(
                "recovery did not match what was committed",
            ));
        }
    }
    log.checkpoint_active()?;
    println!(
        "checkpointed {} recovered entries into the manager",
        tally.0.lock().expect("not poisoned").checkpointed
    );
    log.shutdown()?;
    Ok(())
}
