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
    let measuring = AtomicBool::new(false);
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(threads + 1);
    let results = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|thread| {
                let (op, measuring, stop, barrier) = (&op, &measuring, &stop, &barrier);
                scope.spawn(move || -> Result<(Vec<u32>, u64), String> {
                    let mut latencies = Vec::with_capacity(1 << 16);
                    let mut bytes = 0;
                    barrier.wait();
                    let mut iteration = 0_u64;
                    while !stop.load(Ordering::Relaxed) {
                        let counting = measuring.load(Ordering::Relaxed);
                        let started = Instant::now();
                        let moved = op(thread, iteration)?;
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
        std::thread::sleep(warmup);
        measuring.store(true, Ordering::Relaxed);
        let started = Instant::now();
        std::thread::sleep(duration);
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
    let mut all = Vec::new();
    let mut bytes = 0;
    for result in results {
        let (latencies, moved) = result?;
        all.extend(latencies);
        bytes += moved;
    }
    Ok(summarise(all, elapsed, bytes))
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
