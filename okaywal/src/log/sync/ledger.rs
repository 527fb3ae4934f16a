//! Which `fdatasync`s of segment files overlap, and whether one failed.
//!
//! Linux reports a failed writeback once per open file description, to the
//! first `fdatasync` that looks after it happened, and may mark the pages
//! it could not write clean: their data is gone from the disk's point of
//! view. Syncs of one segment can overlap (large entries sync on their
//! own, the checkpoint thread syncs too), so a sync that succeeds may only
//! mean that another one, still on its way back, took the error that
//! covered the first one's pages. A sync's success therefore counts only
//! once every sync that started before it ended has ended without
//! failing, and after any failure no sync counts again: the log must be
//! reopened (the lesson of PostgreSQL's fsync bug of 2018).

use std::collections::BTreeSet;
use std::io;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::failure::Failure;

#[derive(Debug, Default)]
pub(crate) struct SyncLedger {
    state: Mutex<LedgerState>,
    ended: Condvar,
    /// The log's failure state: a failed sync is recorded there (unless
    /// the log failed before), and once it is set no sync counts. Set and
    /// checked under `state`'s lock by the syncs themselves.
    failure: Arc<Failure>,
}

#[derive(Debug, Default)]
struct LedgerState {
    /// The ticket of the next sync to start.
    next: u64,
    /// Tickets of the syncs that have started and not ended.
    running: BTreeSet<u64>,
}

impl SyncLedger {
    /// A ledger that shares the log's failure state.
    pub fn with_failure(failure: Arc<Failure>) -> Self {
        Self {
            failure,
            ..Self::default()
        }
    }

    /// Runs `sync` (an `fdatasync`), and succeeds only if it succeeded and
    /// no sync that overlapped it failed.
    pub fn run(&self, sync: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
        let ticket = {
            let mut state = self.state.lock();
            if let Some(err) = self.earlier() {
                return Err(err);
            }
            let ticket = state.next;
            state.next += 1;
            state.running.insert(ticket);
            ticket
        };
        let result = sync();
        let mut state = self.state.lock();
        state.running.remove(&ticket);
        if let Err(err) = &result {
            self.failure.record(err);
        }
        self.ended.notify_all();
        result?;
        // Every sync that started before this one ended may have taken the
        // error that covered this one's pages: wait for their outcome.
        let horizon = state.next;
        while !self.failure.is_set() && state.running.first().is_some_and(|t| *t < horizon) {
            self.ended.wait(&mut state);
        }
        match self.earlier() {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }

    /// The error a sync gets once the log has failed: the first failure's
    /// kind and message.
    fn earlier(&self) -> Option<io::Error> {
        self.failure.error(
            "the log failed earlier (writes an fdatasync may have covered can be lost, so no \
             later sync counts until the log is reopened)",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn a_success_overlapping_a_failure_does_not_count() {
        let ledger = SyncLedger::default();
        let (entered, wait_entered) = mpsc::channel();
        let (release, released) = mpsc::channel::<()>();
        std::thread::scope(|s| {
            let ledger = &ledger;
            let failing = s.spawn(move || {
                ledger.run(move || {
                    entered.send(()).unwrap();
                    released.recv().unwrap();
                    Err(io::Error::other("EIO"))
                })
            });
            wait_entered.recv().unwrap();
            let succeeding = s.spawn(|| ledger.run(|| Ok(())));
            std::thread::sleep(Duration::from_millis(50));
            assert!(!succeeding.is_finished(), "waits for the overlapping sync");
            release.send(()).unwrap();
            assert!(failing.join().unwrap().is_err());
            let err = succeeding.join().unwrap().unwrap_err();
            assert!(err.to_string().contains("EIO"), "{err}");
            assert_eq!(err.kind(), io::ErrorKind::Other);
        });
        assert!(ledger.run(|| Ok(())).is_err(), "sticky after a failure");
    }

    #[test]
    fn syncs_that_do_not_overlap_a_failure_count() {
        let ledger = SyncLedger::default();
        assert!(ledger.run(|| Ok(())).is_ok());
        assert!(ledger.run(|| Ok(())).is_ok());
        let full = || Err(io::Error::new(io::ErrorKind::StorageFull, "ENOSPC"));
        assert!(ledger.run(full).is_err());
        let err = ledger.run(|| Ok(())).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::StorageFull, "{err}");
        assert!(err.to_string().contains("ENOSPC"), "{err}");
    }
}
