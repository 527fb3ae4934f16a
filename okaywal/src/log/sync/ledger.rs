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
//!
//! A sync through an open file description that no other sync uses at
//! the same time ([`SyncLedger::run_alone`]) is told of every failure
//! since that description's last sync itself, so its success counts at
//! once; the others (through a shared description, [`SyncLedger::run`])
//! wait only for each other.

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

    /// Runs `sync` (an `fdatasync` through a description other syncs may
    /// use at the same time), and succeeds only if it succeeded and no
    /// sync of that kind that overlapped it failed.
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

    /// Runs `sync`, an `fdatasync` through an open file description that
    /// no other sync uses until it ends, and opened before any failure
    /// its syncs have not reported: the sync itself is told of every
    /// failed write-back it covers, so it need not wait for syncs that
    /// overlapped it. After any failure it fails, as every sync does.
    pub fn run_alone(&self, sync: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
        if let Some(err) = self.earlier() {
            return Err(err);
        }
        let result = sync();
        let _state = self.state.lock();
        if let Err(err) = &result {
            self.failure.record(err);
        }
        result?;
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
    fn a_sync_through_its_own_description_does_not_wait_for_others() {
        let ledger = SyncLedger::default();
        let (entered, wait_entered) = mpsc::channel();
        let (release, released) = mpsc::channel::<()>();
        std::thread::scope(|s| {
            let ledger = &ledger;
            let shared = s.spawn(move || {
                ledger.run(move || {
                    entered.send(()).unwrap();
                    released.recv().unwrap();
                    Ok(())
                })
            });
            wait_entered.recv().unwrap();
            // Returns while the shared sync is still running.
            ledger.run_alone(|| Ok(())).unwrap();
            assert!(!shared.is_finished());
            release.send(()).unwrap();
            shared.join().unwrap().unwrap();
        });
    }

    #[test]
    fn a_failed_sync_through_its_own_description_fails_every_later_sync() {
        let ledger = SyncLedger::default();
        let err = ledger
            .run_alone(|| Err(io::Error::new(io::ErrorKind::StorageFull, "ENOSPC")))
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::StorageFull);
        for err in [
            ledger.run_alone(|| Ok(())).unwrap_err(),
            ledger.run(|| Ok(())).unwrap_err(),
        ] {
            assert_eq!(err.kind(), io::ErrorKind::StorageFull, "{err}");
            assert!(err.to_string().contains("ENOSPC"), "{err}");
        }
    }

    #[test]
    fn a_sync_through_its_own_description_that_ends_after_a_failure_fails() {
        let ledger = SyncLedger::default();
        let (entered, wait_entered) = mpsc::channel();
        let (release, released) = mpsc::channel::<()>();
        std::thread::scope(|s| {
            let ledger = &ledger;
            let alone = s.spawn(move || {
                ledger.run_alone(move || {
                    entered.send(()).unwrap();
                    released.recv().unwrap();
                    Ok(())
                })
            });
            wait_entered.recv().unwrap();
            assert!(ledger.run(|| Err(io::Error::other("EIO"))).is_err());
            release.send(()).unwrap();
            let err = alone.join().unwrap().unwrap_err();
            assert!(err.to_string().contains("EIO"), "{err}");
        });
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
