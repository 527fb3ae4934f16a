//! The parts of the log other modules may use (the checkpointer, the
//! writers, the live reader, the okaywal 0.2/0.3 conversion), as named
//! methods of [`Inner`]: its fields stay private to `log`.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::{JoinHandle, ThreadId};
use std::time::Duration;

use parking_lot::MutexGuard;

use super::{Inner, Signal, State};
use crate::config::Configuration;
use crate::fs::FileSystem;
use crate::stats::Counters;

impl Inner {
    /// The log's configuration (fixed once it is open).
    pub fn config(&self) -> &Configuration {
        &self.config
    }

    /// The file system the log's files live on.
    pub fn fs(&self) -> &dyn FileSystem {
        &*self.fs
    }

    /// The counters behind [`WriteAheadLog::stats`].
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Locks the log's state (see the module docs for the lock order).
    pub fn lock_state(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    /// The maintenance thread's wake-ups.
    pub fn signal(&self) -> &Arc<Signal> {
        &self.signal
    }

    /// True once a write or sync has failed: the log is stopped.
    pub fn has_failed(&self) -> bool {
        self.failure.is_set()
    }

    /// Records `err` as the log's failure without waking anyone (see
    /// [`Inner::poison`], which also wakes every waiter).
    pub fn record_failure(&self, err: &io::Error) {
        self.group.fail(err);
    }

    /// Keeps the maintenance thread's handle, to be joined at shutdown.
    pub fn set_maintenance(&self, handle: JoinHandle<()>) {
        *self.maintenance_thread.lock() = Some(handle.thread().id());
        *self.maintenance.lock() = Some(handle);
    }

    /// Takes the maintenance thread's handle, for joining it.
    pub fn take_maintenance(&self) -> Option<JoinHandle<()>> {
        self.maintenance.lock().take()
    }

    /// The maintenance thread was started and has ended while the log is
    /// open: it ends only at shutdown (which takes its handle first), so
    /// it panicked.
    pub fn maintenance_has_died(&self) -> bool {
        self.maintenance
            .lock()
            .as_ref()
            .is_some_and(JoinHandle::is_finished)
    }

    /// Marks (or, with `None`, unmarks) a thread as acting for the
    /// maintenance thread: it never stalls on checkpoints.
    pub fn set_maintenance_thread(&self, thread: Option<ThreadId>) {
        *self.maintenance_thread.lock() = thread;
    }

    /// The calling thread is the maintenance thread (or acts for it).
    pub fn on_maintenance_thread(&self) -> bool {
        *self.maintenance_thread.lock() == Some(std::thread::current().id())
    }

    /// Wakes the callers of `checkpoint_active` (and stalled writers)
    /// after a checkpoint attempt.
    pub fn checkpoint_attempted(&self) {
        self.checkpointed.notify_all();
    }

    /// Waits up to `timeout` for the next checkpoint attempt, with `state`
    /// released meanwhile.
    pub fn wait_for_checkpoint(&self, state: &mut MutexGuard<'_, State>, timeout: Duration) {
        self.checkpointed.wait_for(state, timeout);
    }

    /// Wakes every thread that waits on the log (for a shutdown).
    pub fn wake_all_waiters(&self) {
        self.signal.wake();
        self.checkpointed.notify_all();
        self.synced.notify_all();
    }

    /// Waits, with `state` released meanwhile, for the next sync (or
    /// buffered commit, while a reader takes them) until `deadline`, or
    /// without a limit; returns true if the deadline passed.
    pub fn wait_for_sync(
        &self,
        state: &mut MutexGuard<'_, State>,
        deadline: Option<std::time::Instant>,
    ) -> bool {
        match deadline {
            Some(deadline) => self.synced.wait_until(state, deadline).timed_out(),
            None => {
                self.synced.wait(state);
                false
            }
        }
    }

    /// Rollbacks of the lowest open entry so far (each lets readers move
    /// on).
    pub fn unblocking_rollbacks(&self) -> u64 {
        self.unblocking_rollbacks.load(Ordering::Acquire)
    }

    /// A live reader starts (`true`) or stops taking buffered entries.
    pub fn follow_buffered(&self, follow: bool) {
        if follow {
            self.buffered_followers.fetch_add(1, Ordering::AcqRel);
        } else {
            self.buffered_followers.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// A buffered commit is in the file: wakes the readers that take
    /// buffered entries, if any.
    pub fn buffered_commit_done(&self) {
        if self.buffered_followers.load(Ordering::Acquire) > 0 {
            // A reader checks the counter under the state lock before it
            // waits: taking the lock here means it either saw the new
            // count or is already waiting.
            drop(self.state.lock());
            self.synced.notify_all();
        }
    }

    /// Serves `read_at` from a segment in the okaywal 0.2/0.3 format while
    /// it is being checkpointed (`None`: no longer).
    pub fn set_legacy_file(&self, id: u64, file: Option<crate::legacy::OpenLegacyFile>) {
        let mut files = self.legacy_files.lock();
        match file {
            Some(file) => {
                files.insert(id, file);
            }
            None => {
                files.remove(&id);
            }
        }
    }
}
