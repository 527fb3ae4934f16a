//! Threads waiting for the writes in flight below an offset to land,
//! each woken alone once they have.
//!
//! A committer that syncs must first wait until no write below its
//! record is still in flight (a large chunk's data, or buffered records
//! another thread took for writing). With one condition variable for all
//! of them, every write that landed woke every waiter, and each went back
//! to sleep but one: with sixteen writers of large entries, most of the
//! log's wake-ups. Here each waiter says what it waits for, and a write
//! that lands wakes only the waiters it unblocked.

use std::sync::Arc;

use parking_lot::Condvar;

/// The registered waiters, kept under the log's state lock.
#[derive(Debug, Default)]
pub(crate) struct HoleWaiters {
    next: u64,
    waiting: Vec<Waiter>,
}

#[derive(Debug)]
struct Waiter {
    ticket: u64,
    segment: u64,
    end: u64,
    woken: Arc<Condvar>,
}

impl HoleWaiters {
    /// Registers a thread waiting until nothing below `end` in `segment`
    /// is in flight; it waits on the returned condition variable (with the
    /// state lock) and calls [`HoleWaiters::leave`] with the ticket when it
    /// wakes.
    pub fn enter(&mut self, segment: u64, end: u64) -> (u64, Arc<Condvar>) {
        let ticket = self.next;
        self.next += 1;
        let woken = Arc::new(Condvar::new());
        self.waiting.push(Waiter {
            ticket,
            segment,
            end,
            woken: woken.clone(),
        });
        (ticket, woken)
    }

    /// The waiter with `ticket` is awake.
    pub fn leave(&mut self, ticket: u64) {
        if let Some(at) = self.waiting.iter().position(|w| w.ticket == ticket) {
            self.waiting.swap_remove(at);
        }
    }

    /// Wakes the waiters for which `still_busy(segment, end)` is false.
    pub fn wake_unblocked(&self, mut still_busy: impl FnMut(u64, u64) -> bool) {
        for waiter in &self.waiting {
            if !still_busy(waiter.segment, waiter.end) {
                waiter.woken.notify_one();
            }
        }
    }

    /// Wakes every waiter (the log failed: they must see it).
    pub fn wake_all(&self) {
        for waiter in &self.waiting {
            waiter.woken.notify_one();
        }
    }

    /// How many threads are waiting.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// Three threads wait below 100, 200 and 300 of one segment while
    /// "written" rises: each wakes only once its own end is reached, and
    /// a rise that unblocks nobody wakes nobody.
    #[test]
    fn a_landed_write_wakes_only_the_waiters_it_unblocked() {
        struct Shared {
            written: u64,
            waiters: HoleWaiters,
        }
        let shared = Arc::new(Mutex::new(Shared {
            written: 0,
            waiters: HoleWaiters::default(),
        }));
        let wakeups = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = [100u64, 200, 300]
            .into_iter()
            .map(|end| {
                let shared = shared.clone();
                let wakeups = wakeups.clone();
                std::thread::spawn(move || {
                    let mut state = shared.lock();
                    while state.written < end {
                        let (ticket, woken) = state.waiters.enter(7, end);
                        // Long enough that a timeout never passes for a wake.
                        woken.wait_for(&mut state, Duration::from_secs(60));
                        state.waiters.leave(ticket);
                        wakeups.fetch_add(1, Ordering::SeqCst);
                    }
                    state.written
                })
            })
            .collect();
        let raise = |to: u64| {
            let mut state = shared.lock();
            state.written = to;
            let written = state.written;
            state
                .waiters
                .wake_unblocked(|segment, end| segment != 7 || written < end);
        };
        while shared.lock().waiters.len() < 3 {
            std::thread::yield_now();
        }
        raise(50);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(wakeups.load(Ordering::SeqCst), 0, "woken below every end");
        raise(250);
        let results: Vec<u64> = threads
            .into_iter()
            .take(2)
            .map(|t| t.join().unwrap())
            .collect();
        assert!(results.iter().all(|&w| w == 250));
        assert_eq!(wakeups.load(Ordering::SeqCst), 2);
        assert_eq!(
            shared.lock().waiters.len(),
            1,
            "the waiter below 300 sleeps on"
        );
        raise(300);
        while shared.lock().waiters.len() > 0 {
            std::thread::yield_now();
        }
        assert_eq!(wakeups.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn wake_all_wakes_every_waiter() {
        let shared = Arc::new(Mutex::new((false, HoleWaiters::default())));
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let shared = shared.clone();
                std::thread::spawn(move || {
                    let mut state = shared.lock();
                    while !state.0 {
                        let (ticket, woken) = state.1.enter(i, 1_000);
                        woken.wait_for(&mut state, Duration::from_secs(60));
                        state.1.leave(ticket);
                    }
                })
            })
            .collect();
        while shared.lock().1.len() < 4 {
            std::thread::yield_now();
        }
        let mut state = shared.lock();
        state.0 = true;
        state.1.wake_all();
        drop(state);
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(shared.lock().1.len(), 0);
    }
}
