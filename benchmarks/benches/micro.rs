//! Criterion micro-benchmarks: `cargo bench -p benchmarks`.
//!
//! - `okaywal/commit 256 B`: one thread, one entry per durable commit.
//! - `okaywal/read_at 4 KiB`: reading a committed chunk back.
//! - `sediment/get 1 KiB hot` and `cold`: a random blob of a 10,000-blob
//!   store; cold drops the store's pages from the page cache
//!   (`posix_fadvise(DONTNEED)` on each file, nothing machine-wide) before
//!   each timed get.
//! - `recovery/okaywal 64 MiB log` and `recovery/sediment store`: opening
//!   a copy of a prepared log or store. The store holds 1 GiB of 1 MiB
//!   blobs (and 2,000 small ones in its WAL); each iteration copies it, so
//!   `BENCH_STORE_MIB=256 cargo bench -p benchmarks` is a quicker run.

use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

use benchmarks::{payload, temp_dir, Rng};
use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, SamplingMode};
use okaywal::{Entry, EntryId, LogManager, LogVoid, SegmentReader, WriteAheadLog};
use sediment::{Database, GrainId};

fn okaywal_benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("okaywal");
    group.sample_size(30);
    group.measurement_time(Duration::from_secs(4));
    group.warm_up_time(Duration::from_secs(1));

    let dir = temp_dir();
    let log = WriteAheadLog::recover(dir.path(), LogVoid).expect("opening a log");
    let small = payload(256, 1);
    group.bench_function("commit 256 B", |b| {
        b.iter(|| {
            let mut entry = log.begin_entry().expect("begin");
            entry.write_chunk(&small).expect("write");
            entry.commit().expect("commit")
        });
    });

    let chunk = payload(4096, 2);
    let mut positions = Vec::new();
    for _ in 0..1_000 {
        let mut entry = log.begin_entry().expect("begin");
        positions.push(entry.write_chunk(&chunk).expect("write").position);
        entry.commit().expect("commit");
    }
    let mut next = 0;
    let mut buffer = Vec::with_capacity(4096);
    group.bench_function("read_at 4 KiB", |b| {
        b.iter(|| {
            next = (next + 1) % positions.len();
            let mut reader = log.read_at(positions[next]).expect("read_at");
            buffer.clear();
            reader.read_to_end(&mut buffer).expect("read");
            black_box(buffer.len())
        });
    });
    group.finish();
    log.shutdown().expect("shutdown");
}

/// Drops the clean pages of every file under `dir` from the page cache.
fn evict(dir: &Path) {
    for entry in std::fs::read_dir(dir).expect("listing the store") {
        let path = entry.expect("listing the store").path();
        if path.is_file() {
            let file = std::fs::File::open(&path).expect("opening a store file");
            rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed)
                .expect("posix_fadvise");
        }
    }
}

fn sediment_get_benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("sediment");
    group.sample_size(30);
    group.measurement_time(Duration::from_secs(4));
    group.warm_up_time(Duration::from_secs(1));

    let dir = temp_dir();
    // Without the blob cache, so "hot" means the OS page cache and "cold"
    // means the disk; "cached" below measures the cache.
    let db = sediment::Config::for_directory(dir.path())
        .cache_bytes(0)
        .open()
        .expect("opening a store");
    let mut keys: Vec<GrainId> = Vec::new();
    let mut rng = Rng::new(3);
    let pool = benchmarks::PayloadPool::new(1024, 3);
    for _ in 0..10 {
        let mut tx = db.begin_transaction().expect("begin");
        for _ in 0..1_000 {
            keys.push(tx.write(pool.slice(1024, &mut rng)).expect("write"));
        }
        tx.commit().expect("commit");
    }
    db.checkpoint_wal().expect("checkpoint");
    group.bench_function("get 1 KiB hot", |b| {
        b.iter(|| {
            let key = keys[(rng.next_u64() % keys.len() as u64) as usize];
            black_box(db.get(key).expect("get").expect("present").len())
        });
    });
    {
        let cached_dir = temp_dir();
        let cached = Database::recover(cached_dir.path()).expect("opening a store");
        let mut tx = cached.begin_transaction().expect("begin");
        let cached_keys: Vec<GrainId> = (0..10_000)
            .map(|_| tx.write(pool.slice(1024, &mut rng)).expect("write"))
            .collect();
        tx.commit().expect("commit");
        cached.checkpoint_wal().expect("checkpoint");
        for key in &cached_keys {
            cached.get(*key).expect("get");
        }
        group.bench_function("get 1 KiB cached", |b| {
            b.iter(|| {
                let key = cached_keys[(rng.next_u64() % cached_keys.len() as u64) as usize];
                black_box(cached.get(key).expect("get").expect("present").len())
            });
        });
        cached.shutdown().expect("shutdown");
    }
    group.bench_function("get 1 KiB cold", |b| {
        b.iter_custom(|iterations| {
            let mut total = Duration::ZERO;
            for _ in 0..iterations {
                let key = keys[(rng.next_u64() % keys.len() as u64) as usize];
                evict(dir.path());
                let started = Instant::now();
                black_box(db.get(key).expect("get").expect("present").len());
                total += started.elapsed();
            }
            total
        });
    });
    group.finish();
    db.shutdown().expect("shutdown");
}

/// Replays every entry (reading its chunks) and checkpoints nothing.
struct Replay(u64);

impl LogManager for Replay {
    fn recover(&mut self, entry: &mut Entry<'_>) -> std::io::Result<()> {
        if let Some(chunks) = entry.read_all_chunks()? {
            self.0 += chunks.iter().map(|c| c.len() as u64).sum::<u64>();
        }
        Ok(())
    }

    fn checkpoint_to(
        &mut self,
        _last_checkpointed_id: EntryId,
        _entries: &mut SegmentReader,
        _wal: &WriteAheadLog,
    ) -> std::io::Result<()> {
        Ok(())
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("creating a copy");
    for entry in std::fs::read_dir(from).expect("listing") {
        let entry = entry.expect("listing");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).expect("copying");
        }
    }
}

fn recovery_benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("recovery");
    group.sample_size(10);
    group.sampling_mode(SamplingMode::Flat);
    group.measurement_time(Duration::from_secs(8));
    group.warm_up_time(Duration::from_secs(1));

    // A 64 MiB log: 16,384 entries of 4 KiB, never checkpointed.
    let log_dir = temp_dir();
    {
        let log = okaywal::Configuration::default_for(log_dir.path())
            .checkpoint_after_bytes(1 << 30)
            .open(LogVoid)
            .expect("opening a log");
        let chunk = payload(4096, 4);
        for _ in 0..16_384 {
            let mut entry = log.begin_entry().expect("begin");
            entry.write_chunk(&chunk).expect("write");
            entry.commit().expect("commit");
        }
        log.shutdown().expect("shutdown");
    }
    group.bench_function("okaywal 64 MiB log", |b| {
        b.iter_batched(
            || {
                let copy = temp_dir();
                copy_dir(log_dir.path(), copy.path());
                copy
            },
            |copy| {
                let log = okaywal::Configuration::default_for(copy.path())
                    .checkpoint_after_bytes(1 << 30)
                    .open(Replay(0))
                    .expect("recovering");
                // Dropped after the timing: the log, then the copy.
                (log, copy)
            },
            BatchSize::PerIteration,
        );
    });
    drop(log_dir);

    // A store of BENCH_STORE_MIB (default 1024) MiB of 1 MiB blobs plus
    // 2,000 small blobs still in the WAL.
    let store_mib: u64 = std::env::var("BENCH_STORE_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let store_dir = temp_dir();
    {
        let db = Database::recover(store_dir.path()).expect("opening a store");
        let big = benchmarks::PayloadPool::new(1 << 20, 5);
        let mut rng = Rng::new(5);
        for _ in 0..store_mib.div_ceil(8) {
            let mut tx = db.begin_transaction().expect("begin");
            for _ in 0..8 {
                tx.write(big.slice(1 << 20, &mut rng)).expect("write");
            }
            tx.commit().expect("commit");
        }
        for _ in 0..2_000 {
            let mut tx = db.begin_transaction().expect("begin");
            tx.write(big.slice(1024, &mut rng)).expect("write");
            tx.commit().expect("commit");
        }
        db.shutdown().expect("shutdown");
    }
    group.bench_function(format!("sediment {store_mib} MiB store"), |b| {
        b.iter_batched(
            || {
                let copy = temp_dir();
                copy_dir(store_dir.path(), copy.path());
                copy
            },
            |copy| {
                let db = Database::recover(copy.path()).expect("recovering");
                (db, copy)
            },
            BatchSize::PerIteration,
        );
    });
    group.finish();
}

criterion_group!(
    micro,
    okaywal_benches,
    sediment_get_benches,
    recovery_benches
);
criterion_main!(micro);
