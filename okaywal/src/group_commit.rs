//! Leader/follower group commit: threads, no bytes.
//!
//! A committer whose data is not yet durable either leads a sync or waits
//! for one. Group syncs never overlap (the disk serialises flushes anyway,
//! and overlapping `fdatasync`s measured slower than one at a time for
//! small commits). Entries of 256 KiB or more commit with a sync pass of
//! their own instead of joining the group (`Inner::sync_own`): for them
//! the overlap pays. (Their writers used to also flush each large chunk
//! early while a group sync ran; with the sync of their own right after,
//! that was a second flush per commit. Five alternated runs at 1 MiB
//! after dropping it: median 1,541 → 1,669 commits/s at 16 threads and
//! 912 → 942 at 4.)
//!
//! While sync *k* runs, the first thread to arrive becomes the leader of
//! sync *k + 1*; later arrivals become its followers. When sync *k*
//! finishes, its leader wakes the next leader first and then exactly the
//! followers sync *k* covered, each with its own unpark; every thread it
//! wakes takes a share of the remaining unparks (on a small machine a
//! wake-up costs several microseconds, and one thread waking fifteen in a
//! row delays the last of them by all of it).
//!
//! **Gathering.** A plain group commit splits many committers into two
//! cohorts that take turns: the threads sync *k* covered come back while
//! sync *k + 1* already runs, so each sync covers about half of them and
//! every commit waits for almost two syncs. So a leader first *gathers*:
//! it waits, parked, until as many committers have joined as were active
//! around the previous sync (those it covered plus those that were
//! already waiting for the next), or until a fraction of the previous
//! sync's duration has passed, whichever comes first. Committers that
//! arrive meanwhile join this sync. With one committer, or committers that
//! do not come back quickly, the expected count falls to what actually
//! arrives and nobody waits; the wait is bounded by [`MAX_GATHER`] in any
//! case. (ext4's journal does the same for concurrent `fsync`s.)
//!
//! After a failed sync every current and later waiter gets an error: a
//! failed `fdatasync` is never retried as if nothing had happened.
//!
//! **Outside the log.** [`GroupCommit`] is public so that a store built on
//! the log coalesces the `fdatasync`s of its own files with the same
//! protocol (sediment does, one per stratum file). An instance made with
//! [`GroupCommit::new`] does not gather: a sync starts as soon as none is
//! running, and the threads that arrive meanwhile share the next one.
//! Gathering pays for committers that come back at once, as the log's
//! do; it only delays callers that do not.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};

use crate::failure::{Failure, STOPPED};
use crate::tuning::{GATHER_DIVISOR, MAX_GATHER};

#[derive(Debug, Default)]
struct State {
    /// A sync is running.
    syncing: bool,
    /// A leader is gathering committers for the sync it is about to start.
    gathering: Option<Thread>,
    /// How many committers (leader included) the gathering leader waits for.
    gather_target: usize,
    /// The thread waiting to lead the next sync.
    next_leader: Option<Thread>,
    /// Threads waiting for the next sync that has not started yet.
    followers: Vec<Thread>,
    /// Committers seen around the last sync: those it covered plus those
    /// waiting for the next one when it ended.
    active: usize,
    /// How long the last sync took.
    last_sync: Duration,
}

/// How a gathering leader's wait ended.
enum Gathered<'a> {
    /// This thread runs the sync.
    Lead(MutexGuard<'a, State>),
    /// Another committer completed the batch and ran its sync; the
    /// gathering thread waited for it.
    TakenOver,
}

/// Coordinates the syncs of threads that each need their writes made
/// durable: at most one sync runs at a time, and every thread that
/// arrives while one runs waits for the next, which covers all of them.
///
/// Waiting threads park and are unparked one by one by the leader whose
/// sync covered them (the next leader first, so the next sync starts at
/// once); they check an atomic counter instead of re-taking a mutex, which
/// with a condition variable made woken threads queue on the mutex and
/// wake each other one after another.
///
/// Once a sync has failed, every waiting and later call fails.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use okaywal::GroupCommit;
///
/// // A "file": writes bump `written`, a sync makes them durable.
/// let written = AtomicU64::new(0);
/// let durable = AtomicU64::new(0);
/// let syncs = AtomicU64::new(0);
/// let group = GroupCommit::new();
/// std::thread::scope(|scope| {
///     for _ in 0..4 {
///         scope.spawn(|| {
///             for _ in 0..50 {
///                 let mine = written.fetch_add(1, Ordering::SeqCst) + 1;
///                 group
///                     .wait(
///                         || durable.load(Ordering::SeqCst) >= mine,
///                         || {
///                             // Covers every write that completed before it started.
///                             let target = written.load(Ordering::SeqCst);
///                             syncs.fetch_add(1, Ordering::SeqCst);
///                             durable.fetch_max(target, Ordering::SeqCst);
///                             Ok(())
///                         },
///                     )
///                     .unwrap();
///             }
///         });
///     }
/// });
/// assert_eq!(durable.load(Ordering::SeqCst), 200);
/// assert!(syncs.load(Ordering::SeqCst) <= 200);
/// ```
#[derive(Debug)]
pub struct GroupCommit {
    state: Mutex<State>,
    /// Number of syncs that have finished (successfully or not).
    completed: AtomicU64,
    /// The log's failure state, shared with the rest of the log: set by
    /// the first failed sync (or any other failure); never cleared. It is
    /// set before the state lock is taken to collect the waiters to wake,
    /// and waiters check it under that lock, so none is left waiting.
    failure: Arc<Failure>,
    /// Covered threads still to be woken; every thread that wakes helps.
    wake_queue: Mutex<Vec<Thread>>,
    /// Gathers that ended at their deadline, short of their target.
    gather_timeouts: AtomicU64,
    /// Whether a leader gathers committers before its sync (the log's
    /// does; see the module docs).
    gathers: bool,
    /// What errors after a failed sync say before its message.
    stopped: &'static str,
}

impl Default for GroupCommit {
    fn default() -> Self {
        Self::new()
    }
}

impl GroupCommit {
    /// A group commit of its own, which does not gather: a sync starts as
    /// soon as none is running.
    #[must_use]
    pub fn new() -> Self {
        Self {
            state: Mutex::default(),
            completed: AtomicU64::new(0),
            failure: Arc::default(),
            wake_queue: Mutex::default(),
            gather_timeouts: AtomicU64::new(0),
            gathers: false,
            stopped: "an earlier sync failed, and writes it covered may be lost",
        }
    }

    /// The log's group commit: it gathers committers (see the module
    /// docs) and reports failures into the log's `failure`.
    pub(crate) fn with_failure(failure: Arc<Failure>) -> Self {
        Self {
            failure,
            gathers: true,
            stopped: STOPPED,
            ..Self::new()
        }
    }

    /// Returns once `covered()` is true, leading syncs (`sync()`) or waiting
    /// for other threads' syncs as needed.
    ///
    /// `covered` must become true after a successful `sync` that started
    /// after the caller's data was written; `sync` must return an error
    /// when the data could not be made durable. `sync` runs on the calling
    /// thread, never while another thread's runs.
    ///
    /// # Errors
    ///
    /// The error of the `sync` this thread ran, or, once any sync has
    /// failed, an error of the first failure's kind whose message
    /// includes the first failure's.
    pub fn wait(
        &self,
        covered: impl Fn() -> bool,
        mut sync: impl FnMut() -> io::Result<()>,
    ) -> io::Result<()> {
        loop {
            if covered() {
                return Ok(());
            }
            let mut state = self.state.lock();
            if let Some(err) = self.failure() {
                return Err(err);
            }
            if covered() {
                return Ok(());
            }
            if state.gathering.is_some() {
                if state.followers.len() + 2 >= state.gather_target {
                    // With this thread the batch is complete: it is running
                    // already, so it leads the sync itself rather than wake
                    // the gathering leader, who becomes a follower.
                    let gatherer = state.gathering.take().expect("checked above");
                    state.followers.push(gatherer);
                    self.run_sync(state, &mut sync)?;
                    continue;
                }
                // No sync runs, and the one about to start covers this
                // thread's data (written before it got here).
                let this_sync = self.completed.load(Ordering::Acquire) + 1;
                state.followers.push(thread::current());
                drop(state);
                self.park_until(this_sync);
                continue;
            }
            if !state.syncing {
                self.lead(state, &mut sync)?;
                continue;
            }
            // Sync number `completed + 1` is running; the next one starts
            // after it, with every thread waiting by then.
            let running = self.completed.load(Ordering::Acquire) + 1;
            if state.next_leader.is_none() {
                state.next_leader = Some(thread::current());
                drop(state);
                self.park_until(running);
                let state = self.state.lock();
                // Followers are counting on this thread to start their sync,
                // even if the sync that just ended covered its own data.
                if !self.failure.is_set()
                    && !state.syncing
                    && state.gathering.is_none()
                    && !state.followers.is_empty()
                {
                    self.lead(state, &mut sync)?;
                }
                continue;
            }
            state.followers.push(thread::current());
            drop(state);
            self.park_until(running + 1);
        }
    }

    /// Parks until sync number `sync` has finished or the log failed.
    fn park_until(&self, sync: u64) {
        while self.completed.load(Ordering::Acquire) < sync && !self.failure.is_set() {
            thread::park();
        }
        self.help_wake();
    }

    /// Unparks queued threads until none is left: the waking is shared by
    /// every thread already awake instead of falling on the leader alone.
    fn help_wake(&self) {
        loop {
            let next = self.wake_queue.lock().pop();
            match next {
                Some(thread) => thread.unpark(),
                None => return,
            }
        }
    }

    /// Waits, parked, for committers to join the sync this thread is about
    /// to lead (see the module docs).
    fn gather<'a>(&'a self, mut state: MutexGuard<'a, State>) -> Gathered<'a> {
        let target = state.active;
        if !self.gathers || target <= state.followers.len() + 1 || state.last_sync.is_zero() {
            return Gathered::Lead(state);
        }
        let window = (state.last_sync / GATHER_DIVISOR).min(MAX_GATHER);
        let deadline = Instant::now() + window;
        let me = thread::current();
        let this_sync = self.completed.load(Ordering::Acquire) + 1;
        state.gathering = Some(me.clone());
        state.gather_target = target;
        loop {
            drop(state);
            let now = Instant::now();
            if now < deadline {
                thread::park_timeout(deadline - now);
            }
            state = self.state.lock();
            if !state.gathering.as_ref().is_some_and(|t| t.id() == me.id()) {
                // The committer that completed the batch leads its sync.
                drop(state);
                self.park_until(this_sync);
                return Gathered::TakenOver;
            }
            let complete = state.followers.len() + 1 >= target;
            if complete || self.failure.is_set() || Instant::now() >= deadline {
                if !complete {
                    self.gather_timeouts.fetch_add(1, Ordering::Relaxed);
                }
                state.gathering = None;
                return Gathered::Lead(state);
            }
        }
    }

    /// Gathers committers, then runs a sync for them unless another
    /// committer took the lead meanwhile.
    fn lead(
        &self,
        state: MutexGuard<'_, State>,
        sync: &mut impl FnMut() -> io::Result<()>,
    ) -> io::Result<()> {
        match self.gather(state) {
            Gathered::Lead(state) => self.run_sync(state, sync),
            Gathered::TakenOver => Ok(()),
        }
    }

    /// Runs one sync for this thread and every follower registered now.
    fn run_sync(
        &self,
        mut state: MutexGuard<'_, State>,
        sync: &mut impl FnMut() -> io::Result<()>,
    ) -> io::Result<()> {
        if let Some(err) = self.failure() {
            return Err(err);
        }
        state.syncing = true;
        let covered = std::mem::take(&mut state.followers);
        let this_sync = self.completed.load(Ordering::Acquire) + 1;
        drop(state);
        let started = Instant::now();
        let result = sync();
        let took = started.elapsed();
        let mut state = self.state.lock();
        state.syncing = false;
        state.last_sync = took;
        state.active =
            covered.len() + 1 + state.followers.len() + usize::from(state.next_leader.is_some());
        let mut wake = covered;
        if let Err(err) = &result {
            self.failure.record(err);
            wake.append(&mut state.followers);
        }
        self.completed.store(this_sync, Ordering::Release);
        let next_leader = state.next_leader.take();
        drop(state);
        if let Some(next) = next_leader {
            next.unpark();
        }
        if !wake.is_empty() {
            self.wake_queue.lock().append(&mut wake);
            self.help_wake();
        }
        result
    }

    /// How many gathers ended at their deadline.
    #[cfg(test)]
    fn gather_timeouts(&self) -> u64 {
        self.gather_timeouts.load(Ordering::Relaxed)
    }

    /// Marks the log as failed (e.g. a write error outside a sync), unless
    /// it failed before, and wakes every waiter with that error.
    pub(crate) fn fail(&self, err: &io::Error) {
        let mut state = self.state.lock();
        self.failure.record(err);
        let next = state.next_leader.take();
        let gathering = state.gathering.clone();
        let followers = std::mem::take(&mut state.followers);
        drop(state);
        next.into_iter()
            .chain(gathering)
            .chain(followers)
            .for_each(|t| t.unpark());
    }

    /// The error every commit gets once the log has failed: the first
    /// failure's kind and message.
    pub(crate) fn failure(&self) -> Option<io::Error> {
        self.failure.error(self.stopped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    /// A fake log: writers bump `written`, a sync copies `written` to
    /// `synced` and counts itself.
    #[derive(Default)]
    struct Fake {
        written: AtomicU64,
        synced: AtomicU64,
        syncs: AtomicU64,
        fail_at_sync: AtomicU64,
    }

    /// The log's kind, which gathers.
    fn gathering() -> GroupCommit {
        GroupCommit::with_failure(Arc::default())
    }

    fn commit(group: &GroupCommit, fake: &Fake) -> io::Result<()> {
        commit_with_sync_time(group, fake, Duration::from_micros(200))
    }

    fn commit_with_sync_time(group: &GroupCommit, fake: &Fake, took: Duration) -> io::Result<()> {
        let mine = fake.written.fetch_add(1, Ordering::SeqCst) + 1;
        group.wait(
            || fake.synced.load(Ordering::SeqCst) >= mine,
            || {
                let n = fake.syncs.fetch_add(1, Ordering::SeqCst) + 1;
                let target = fake.written.load(Ordering::SeqCst);
                std::thread::sleep(took);
                if fake.fail_at_sync.load(Ordering::SeqCst) == n {
                    return Err(io::Error::other("disk on fire"));
                }
                fake.synced.fetch_max(target, Ordering::SeqCst);
                Ok(())
            },
        )
    }

    #[test]
    fn many_threads_share_syncs_and_all_return() {
        for group in [gathering(), GroupCommit::new()] {
            many_threads_share_syncs_of(group);
        }
    }

    fn many_threads_share_syncs_of(group: GroupCommit) {
        let group = Arc::new(group);
        let fake = Arc::new(Fake::default());
        let threads: Vec<_> = (0..16)
            .map(|_| {
                let (group, fake) = (group.clone(), fake.clone());
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        commit(&group, &fake).unwrap();
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(fake.synced.load(Ordering::SeqCst), 16 * 200);
        let syncs = fake.syncs.load(Ordering::SeqCst);
        assert!(syncs < 16 * 200, "no batching happened: {syncs} syncs");
    }

    #[test]
    fn a_failed_sync_fails_every_later_commit() {
        for group in [gathering(), GroupCommit::new()] {
            a_failed_sync_fails_every_later_commit_of(group);
        }
    }

    fn a_failed_sync_fails_every_later_commit_of(group: GroupCommit) {
        let group = Arc::new(group);
        let fake = Arc::new(Fake::default());
        fake.fail_at_sync.store(3, Ordering::SeqCst);
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (group, fake) = (group.clone(), fake.clone());
                std::thread::spawn(move || {
                    let mut results = Vec::new();
                    for _ in 0..50 {
                        results.push(commit(&group, &fake).is_ok());
                    }
                    results
                })
            })
            .collect();
        for thread in threads {
            let results = thread.join().unwrap();
            // Once a commit fails, no later commit of that thread succeeds.
            let first_failure = results.iter().position(|ok| !ok).unwrap();
            assert!(results[first_failure..].iter().all(|ok| !ok));
        }
        assert!(group.failure().is_some());
        assert!(commit(&group, &fake).is_err());
    }

    fn run_threads(group: &Arc<GroupCommit>, fake: &Arc<Fake>, threads: usize, commits: usize) {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (group, fake) = (group.clone(), fake.clone());
                std::thread::spawn(move || {
                    for _ in 0..commits {
                        commit_with_sync_time(&group, &fake, Duration::from_millis(2)).unwrap();
                    }
                })
            })
            .collect();
        for handle in handles {
            handle.join().unwrap();
        }
    }

    #[test]
    fn gathering_puts_all_committers_in_one_sync() {
        // Without gathering, 16 threads that commit in a loop split into
        // two cohorts of about 8 per sync (those covered by sync k come
        // back while sync k + 1 already runs).
        let group = Arc::new(gathering());
        let fake = Arc::new(Fake::default());
        run_threads(&group, &fake, 16, 60);
        let commits = 16 * 60;
        assert_eq!(fake.synced.load(Ordering::SeqCst), commits);
        let syncs = fake.syncs.load(Ordering::SeqCst);
        let per_sync = commits as f64 / syncs as f64;
        assert!(
            per_sync > 11.0,
            "{per_sync:.1} commits per sync ({syncs} syncs): the cohorts were not merged"
        );
    }

    #[test]
    fn a_lone_committer_stops_waiting_for_absent_ones() {
        let group = Arc::new(gathering());
        let fake = Arc::new(Fake::default());
        run_threads(&group, &fake, 16, 10);
        let before = group.gather_timeouts();
        run_threads(&group, &fake, 1, 20);
        // The first lone commit may wait for the 15 threads that are gone;
        // after that the expected count is what actually arrives.
        assert!(
            group.gather_timeouts() - before <= 1,
            "{} gathers timed out",
            group.gather_timeouts() - before
        );
        assert_eq!(fake.synced.load(Ordering::SeqCst), 16 * 10 + 20);
    }

    #[test]
    fn a_group_commit_of_its_own_never_gathers_and_names_no_log() {
        let group = Arc::new(GroupCommit::new());
        let fake = Arc::new(Fake::default());
        run_threads(&group, &fake, 16, 20);
        assert_eq!(group.gather_timeouts(), 0);
        assert_eq!(fake.synced.load(Ordering::SeqCst), 16 * 20);
        let syncs = fake.syncs.load(Ordering::SeqCst);
        assert!(syncs < 16 * 20, "no batching happened: {syncs} syncs");

        fake.fail_at_sync.store(syncs + 1, Ordering::SeqCst);
        let err = commit(&group, &fake).unwrap_err();
        assert_eq!(err.to_string(), "disk on fire");
        let err = commit(&group, &fake).unwrap_err();
        assert!(err.to_string().ends_with(": disk on fire"), "{err}");
        assert!(!err.to_string().contains("log"), "{err}");
    }
}
