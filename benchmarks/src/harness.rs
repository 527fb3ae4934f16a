//! Running a closure on N threads for a while and summarising latencies.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// What one benchmark cell measured.
#[derive(Debug, Clone, Default)]
pub struct Measurement {
    /// Operations completed.
    pub operations: u64,
    /// Wall time of the measured window.
    pub elapsed: Duration,
    /// Median latency.
    pub p50: Duration,
    /// 99th percentile latency.
    pub p99: Duration,
    /// Payload bytes moved.
    pub bytes: u64,
}

impl Measurement {
    /// Operations per second.
    #[must_use]
    pub fn per_second(&self) -> f64 {
        self.operations as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Raw results of one or more timed runs, to be merged before the
/// percentiles are taken.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    /// Latencies in nanoseconds.
    pub latencies: Vec<u32>,
    /// Measured wall time (summed over merged runs).
    pub elapsed: Duration,
    /// Payload bytes moved.
    pub bytes: u64,
}

impl Samples {
    /// Adds another run's samples.
    pub fn merge(&mut self, other: Samples) {
        self.latencies.extend(other.latencies);
        self.elapsed += other.elapsed;
        self.bytes += other.bytes;
    }

    /// Operations per second, percentiles and bytes of all runs together.
    #[must_use]
    pub fn summary(&self) -> Measurement {
        summarise(self.latencies.clone(), self.elapsed, self.bytes)
    }
}

/// Runs `op(thread, iteration)` on `threads` threads for `duration` after a
/// short warm-up, recording each call's latency. `op` returns the payload
/// bytes it moved; an error stops the run and is returned.
pub fn run<F>(
    threads: usize,
    warmup: Duration,
    duration: Duration,
    op: F,
) -> Result<Measurement, String>
where
    F: Fn(usize, u64) -> Result<u64, String> + Sync,
{
    run_samples(threads, warmup, duration, op).map(|s| s.summary())
}

/// Like [`run`], but returns the raw samples (to merge several rounds).
pub fn run_samples<F>(
    threads: usize,
    warmup: Duration,
    duration: Duration,
    op: F,
) -> Result<Samples, String>
where
    F: Fn(usize, u64) -> Result<u64, String> + Sync,
{
    let measuring = AtomicBool::new(false);
    let stop = AtomicBool::new(false);
    let failed = AtomicBool::new(false);
    let barrier = Barrier::new(threads + 1);
    let results = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|thread| {
                let (op, measuring, stop, failed, barrier) =
                    (&op, &measuring, &stop, &failed, &barrier);
                scope.spawn(move || -> Result<(Vec<u32>, u64), String> {
                    let mut latencies = Vec::with_capacity(1 << 16);
                    let mut bytes = 0;
                    barrier.wait();
                    let mut iteration = 0_u64;
                    while !stop.load(Ordering::Relaxed) {
                        let counting = measuring.load(Ordering::Relaxed);
                        let started = Instant::now();
                        let moved = match op(thread, iteration) {
                            Ok(moved) => moved,
                            Err(err) => {
                                failed.store(true, Ordering::Relaxed);
                                return Err(err);
                            }
                        };
                        iteration += 1;
                        if counting && measuring.load(Ordering::Relaxed) {
                            latencies
                                .push(started.elapsed().as_nanos().min(u128::from(u32::MAX))
                                    as u32);
                            bytes += moved;
                        }
                    }
                    Ok((latencies, bytes))
                })
            })
            .collect();
        barrier.wait();
        sleep_unless(warmup, &failed);
        measuring.store(true, Ordering::Relaxed);
        let started = Instant::now();
        sleep_unless(duration, &failed);
        measuring.store(false, Ordering::Relaxed);
        let elapsed = started.elapsed();
        stop.store(true, Ordering::Relaxed);
        let results: Vec<_> = workers
            .into_iter()
            .map(|w| w.join().expect("worker panicked"))
            .collect();
        (results, elapsed)
    });
    let (results, elapsed) = results;
    let mut samples = Samples {
        elapsed,
        ..Samples::default()
    };
    for result in results {
        let (latencies, moved) = result?;
        samples.latencies.extend(latencies);
        samples.bytes += moved;
    }
    Ok(samples)
}

/// Sleeps for `duration`, waking early once `failed` is set.
fn sleep_unless(duration: Duration, failed: &AtomicBool) {
    let until = Instant::now() + duration;
    loop {
        let now = Instant::now();
        if now >= until || failed.load(Ordering::Relaxed) {
            return;
        }
        std::thread::sleep((until - now).min(Duration::from_millis(20)));
    }
}

/// Runs `op(thread, iteration)` exactly `per_thread` times on each of
/// `threads` threads (no warm-up) and measures the whole run.
pub fn run_fixed<F>(threads: usize, per_thread: u64, op: F) -> Result<Measurement, String>
where
    F: Fn(usize, u64) -> Result<u64, String> + Sync,
{
    run_fixed_samples(threads, per_thread, op).map(|s| s.summary())
}

/// Like [`run_fixed`], but returns the raw samples.
pub fn run_fixed_samples<F>(threads: usize, per_thread: u64, op: F) -> Result<Samples, String>
where
    F: Fn(usize, u64) -> Result<u64, String> + Sync,
{
    let barrier = Barrier::new(threads + 1);
    let (results, elapsed) = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|thread| {
                let (op, barrier) = (&op, &barrier);
                scope.spawn(move || -> Result<(Vec<u32>, u64), String> {
                    let mut latencies = Vec::with_capacity(per_thread as usize);
                    let mut bytes = 0;
                    barrier.wait();
                    for iteration in 0..per_thread {
                        let started = Instant::now();
                        bytes += op(thread, iteration)?;
                        latencies
                            .push(started.elapsed().as_nanos().min(u128::from(u32::MAX)) as u32);
                    }
                    Ok((latencies, bytes))
                })
            })
            .collect();
        let started = Instant::now();
        barrier.wait();
        let results: Vec<_> = workers
            .into_iter()
            .map(|w| w.join().expect("worker panicked"))
            .collect();
        (results, started.elapsed())
    });
    let mut samples = Samples {
        elapsed,
        ..Samples::default()
    };
    for result in results {
        let (latencies, moved) = result?;
        samples.latencies.extend(latencies);
        samples.bytes += moved;
    }
    Ok(samples)
}

/// Builds a measurement from latencies in nanoseconds.
#[must_use]
pub fn summarise(mut latencies: Vec<u32>, elapsed: Duration, bytes: u64) -> Measurement {
    latencies.sort_unstable();
    let percentile = |p: f64| -> Duration {
        if latencies.is_empty() {
            return Duration::ZERO;
        }
        let index = ((latencies.len() - 1) as f64 * p).round() as usize;
        Duration::from_nanos(u64::from(latencies[index]))
    };
    Measurement {
        operations: latencies.len() as u64,
        elapsed,
        p50: percentile(0.50),
        p99: percentile(0.99),
        bytes,
    }
}
