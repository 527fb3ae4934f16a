//! The blob section:
//! (a) one thread, small transactions of one 16-byte blob;
//! (b) 8 threads, transactions of 1–20 blobs of 0–4 KiB;
//! both also for `sediment-buffered` (`commit_buffered` with a sync every
//! 16 transactions) beside the durable numbers;
//! (c) random gets of 1 KiB blobs, 1 and 4 threads: *cold*, at once after
//! loading a fresh store, and *warm*, from a store every system's cells
//! have read before;
//! (d) space: load, delete half, write the same volume again.
//!
//! Every (c) and (d) store first receives [`Plan::earlier_blobs`] blobs of
//! 100 B–4 KiB, then the 1 KiB blobs, loaded by 8 threads in transactions
//! of [`Plan::load_batch`] blobs: the store a user has after a while,
//! not an empty one.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::wal::round_label;
use super::{output, saved, select, Options};
use crate::blob::{self, BlobSystem};
use crate::chart::{bar_chart, line_chart, Series};
use crate::harness::{self, Samples};
use crate::report::{human_size, mib, micros, rate, Table};
use crate::{payload, temp_dir, PayloadPool, Rng};

/// The sizes of one run of the section.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Transactions of (a), split over the rounds.
    pub small_transactions: u64,
    /// Warm-up of timed cells.
    pub warmup: Duration,
    /// Measured time of each (b) and (c) cell per round.
    pub duration: Duration,
    /// Rounds of (a), (b) and (c), systems in reverse order every other one.
    pub rounds: usize,
    /// Blobs of 1 KiB loaded for (c) and (d).
    pub blobs: u64,
    /// Blobs of 100 B–4 KiB each (c) and (d) store holds before those.
    pub earlier_blobs: u64,
    /// Blobs per transaction while loading (8 threads).
    pub load_batch: usize,
    /// Blobs deleted per transaction in (d).
    pub delete_batch: usize,
}

impl Plan {
    /// The plan `options` ask for.
    #[must_use]
    pub fn for_options(options: &Options) -> Self {
        let mut plan = if options.quick {
            Self {
                small_transactions: 400,
                warmup: Duration::from_millis(150),
                duration: Duration::from_millis(600),
                rounds: 1,
                blobs: 20_000,
                earlier_blobs: 5_000,
                load_batch: 10,
                delete_batch: 1_000,
            }
        } else {
            Self {
                small_transactions: 2_000,
                warmup: Duration::from_millis(300),
                duration: Duration::from_millis(1500),
                rounds: 2,
                blobs: 100_000,
                earlier_blobs: 30_000,
                load_batch: 10,
                delete_batch: 1_000,
            }
        };
        if let Some(seconds) = options.seconds {
            plan.duration = Duration::from_secs_f64(seconds);
        }
        if let Some(transactions) = options.transactions {
            plan.small_transactions = transactions.max(1);
        }
        if let Some(blobs) = options.blobs {
            plan.blobs = blobs.max(2);
        }
        plan.rounds = options.rounds();
        plan
    }

    fn describe(&self) -> String {
        let rounds = if self.rounds == 1 {
            "1 round".to_string()
        } else {
            format!(
                "{} rounds, systems in reverse order every other round,",
                self.rounds
            )
        };
        format!(
            "{rounds} of {} ms measured per cell after {} ms of warm-up",
            self.duration.as_millis(),
            self.warmup.as_millis()
        )
    }
}

const BLOB_THREADS: usize = 8;
const GET_THREADS: [usize; 2] = [1, 4];
const GET_SIZE: usize = 1024;
/// Sizes of the earlier blobs: 100 B to 4 KiB, uniform.
const EARLIER_SIZES: (usize, usize) = (100, 4096);

/// Runs the section; prints its tables and returns the files written.
pub fn run(options: &Options) -> Vec<PathBuf> {
    let plan = Plan::for_options(options);
    let (systems, notes) = select(blob::ALL, options);
    println!("## Blob store\n");
    for note in &notes {
        println!("- {note}");
    }
    if options.quick {
        println!(
            "- --quick: (a) {} transactions instead of 2,000, (c)/(d) {} blobs instead \
             of 100,000, {} ms per timed cell",
            rate(plan.small_transactions as f64),
            rate(plan.blobs as f64),
            plan.duration.as_millis()
        );
    }
    println!();
    // (a) and (b) also run the buffered variants (next to the system they
    // vary), and (a) `floor` (no store), unless `--systems` leaves them
    // out.
    let (variants, _) = select(blob::COMMIT_VARIANTS, options);
    if systems.is_empty() && variants.is_empty() {
        println!("No blob system selected.\n");
        return Vec::new();
    }
    let mut files = Vec::new();
    let mut committing = Vec::new();
    for system in &systems {
        committing.push(*system);
        committing.extend(
            variants
                .iter()
                .filter(|v| v.starts_with(&format!("{system}-"))),
        );
    }
    for variant in &variants {
        if !committing.contains(variant) {
            committing.push(variant);
        }
    }
    let floor_wanted = options
        .systems
        .as_ref()
        .map_or(true, |names| names.iter().any(|n| n == "floor"));
    let mut with_floor = committing.clone();
    if floor_wanted {
        with_floor.push("floor");
    }
    small_transactions(&with_floor, &plan, options, &mut files);
    mixed_transactions(&committing, &plan, options, &mut files);
    if !systems.is_empty() {
        gets_and_space(&systems, &plan, options, &mut files);
    }
    files
}

fn open(system: &str, threads: usize) -> Result<(tempfile::TempDir, Box<dyn BlobSystem>), String> {
    let dir = temp_dir();
    let store = blob::open(system, dir.path(), threads)?;
    Ok((dir, store))
}

fn close(store: Box<dyn BlobSystem>) {
    if let Err(err) = store.close() {
        eprintln!("closing: {err}");
    }
}

/// The order of `systems` in `round`: reversed every other round.
fn order<'a>(systems: &[&'a str], round: usize) -> Vec<&'a str> {
    let mut order = systems.to_vec();
    if round % 2 == 1 {
        order.reverse();
    }
    order
}

/// Runs `cell` for every system in every round (fresh store each time)
/// and merges each system's samples.
fn rounds_of(
    systems: &[&'static str],
    plan: &Plan,
    label: &str,
    threads: usize,
    cell: impl Fn(&dyn BlobSystem) -> Result<Samples, String>,
) -> Vec<(&'static str, Result<Samples, String>)> {
    let mut results: Vec<(&'static str, Result<Samples, String>)> = systems
        .iter()
        .map(|s| (*s, Ok(Samples::default())))
        .collect();
    for round in 0..plan.rounds {
        for system in order(systems, round) {
            let slot = &mut results
                .iter_mut()
                .find(|(s, _)| *s == system)
                .expect("every system has a slot")
                .1;
            let Ok(all) = slot else { continue };
            eprint!("{label}{}: {system} … ", round_label(round, plan.rounds));
            let outcome = open(system, threads).and_then(|(dir, store)| {
                let samples = cell(&*store);
                close(store);
                drop(dir);
                samples
            });
            match outcome {
                Ok(samples) => {
                    eprintln!("{} tx/s", rate(samples.summary().per_second()));
                    all.merge(samples);
                }
                Err(err) => {
                    eprintln!("failed: {err}");
                    *slot = Err(err);
                }
            }
        }
    }
    results
}

/// Says what `sediment-buffered` trades, if it ran.
fn buffered_note(table: &mut Table, systems: &[&str]) {
    if systems.contains(&"sediment-buffered") {
        table.note(format!(
            "sediment-buffered: `commit_buffered` (returns once the transaction is handed to \
             the OS; survives a process crash, a power cut may take the transactions since the \
             last sync) and a `Database::sync` every {} transactions over all threads; every \
             other row commits durably",
            blob::BUFFERED_SYNC_EVERY
        ));
    }
    encrypted_note(table, systems);
}

/// Says what `sediment-encrypted` is, if it ran.
fn encrypted_note(table: &mut Table, systems: &[&str]) {
    if systems.contains(&"sediment-encrypted") {
        table.note(
            "sediment-encrypted: sediment with Config::encryption (AES-256-GCM over \
             grains, headers, index, commit log and WAL)",
        );
    }
}

/// (a): 1 thread, one 16-byte blob per transaction.
fn small_transactions(
    systems: &[&'static str],
    plan: &Plan,
    options: &Options,
    files: &mut Vec<PathBuf>,
) {
    let mut table = Table::new(&["system", "tx/s#", "p50 µs#", "p99 µs#", "× floor#"]);
    let mut bars = Vec::new();
    let blob = payload(16, 16);
    let per_round = plan.small_transactions.div_ceil(plan.rounds as u64);
    let label = format!("blob (a) {per_round} × 1 blob of 16 B");
    let results = rounds_of(systems, plan, &label, 1, |store| {
        harness::run_fixed_samples(1, per_round, |thread, _| {
            store.write(thread, &[&blob]).map(|_| 16)
        })
    });
    let floor = results
        .iter()
        .find(|(s, _)| *s == "floor")
        .and_then(|(_, r)| r.as_ref().ok())
        .map(|samples| samples.summary().per_second());
    for (system, result) in results {
        match result {
            Ok(samples) => {
                let m = samples.summary();
                table.row(vec![
                    system.to_string(),
                    rate(m.per_second()),
                    micros(m.p50),
                    micros(m.p99),
                    floor.map_or("–".to_string(), |f| format!("{:.2}", m.per_second() / f)),
                ]);
                if system != "floor" {
                    bars.push((system.to_string(), m.per_second()));
                }
            }
            Err(err) => table.row(vec![system.to_string(), format!("failed: {err}")]),
        }
    }
    if floor.is_some() {
        // In the same rounds as the stores, so that their rates can be read
        // against what the disk gives one `pwrite` + `fdatasync`.
        table.note(
            "floor: no store; one `pwrite` of the 16-byte blob into a preallocated, zero-filled file and one `fdatasync` per transaction, in the same rounds",
        );
    }
    buffered_note(&mut table, systems);
    table.note(format!(
        "{} of {} transactions, each on a fresh store",
        if plan.rounds == 1 {
            "1 round".to_string()
        } else {
            format!("{} rounds", plan.rounds)
        },
        rate(per_round as f64)
    ));
    println!(
        "### (a) 1 thread, {} transactions of one 16-byte blob\n\n{}",
        rate((per_round * plan.rounds as u64) as f64),
        table.to_markdown()
    );
    let csv = output(options, "blob-a.csv");
    saved(table.write_csv(&csv), &csv, files);
    let svg = output(options, "blob-a.svg");
    saved(
        bar_chart(
            &svg,
            "(a) 1 thread, one 16-byte blob per transaction",
            "transactions/s",
            &bars,
        ),
        &svg,
        files,
    );
}

/// (b): 8 threads, transactions of 1–20 blobs of 0–4 KiB (seeded).
fn mixed_transactions(
    systems: &[&'static str],
    plan: &Plan,
    options: &Options,
    files: &mut Vec<PathBuf>,
) {
    let mut table = Table::new(&["system", "tx/s#", "MiB/s#", "p50 µs#", "p99 µs#"]);
    let mut bars = Vec::new();
    let pool = PayloadPool::new(4096, 4096);
    let label = format!("blob (b) {BLOB_THREADS} threads × 1–20 blobs of 0–4 KiB");
    let results = rounds_of(systems, plan, &label, BLOB_THREADS, |store| {
        harness::run_samples(
            BLOB_THREADS,
            plan.warmup,
            plan.duration,
            |thread, iteration| {
                let mut rng = Rng::new((thread as u64) << 40 | iteration);
                let count = rng.between(1, 20) as usize;
                let mut blobs = Vec::with_capacity(count);
                let mut bytes = 0;
                for _ in 0..count {
                    let len = rng.between(0, 4096) as usize;
                    bytes += len as u64;
                    blobs.push(pool.slice(len, &mut rng));
                }
                store.write(thread, &blobs).map(|_| bytes)
            },
        )
    });
    for (system, result) in results {
        match result {
            Ok(samples) => {
                let m = samples.summary();
                table.row(vec![
                    system.to_string(),
                    rate(m.per_second()),
                    format!(
                        "{:.1}",
                        m.bytes as f64 / f64::from(1 << 20) / m.elapsed.as_secs_f64()
                    ),
                    micros(m.p50),
                    micros(m.p99),
                ]);
                bars.push((system.to_string(), m.per_second()));
            }
            Err(err) => table.row(vec![system.to_string(), format!("failed: {err}")]),
        }
    }
    buffered_note(&mut table, systems);
    table.note(format!(
        "{}; each round on a fresh store; blob sizes uniform in 0–4096 bytes",
        plan.describe()
    ));
    println!(
        "### (b) {BLOB_THREADS} threads, transactions of 1–20 blobs of 0–4 KiB\n\n{}",
        table.to_markdown()
    );
    let csv = output(options, "blob-b.csv");
    saved(table.write_csv(&csv), &csv, files);
    let svg = output(options, "blob-b.svg");
    saved(
        bar_chart(
            &svg,
            "(b) 8 threads, 1–20 blobs of 0–4 KiB per transaction",
            "transactions/s",
            &bars,
        ),
        &svg,
        files,
    );
}

/// One system's store of (c) and (d), and what was measured on it.
struct Loaded {
    system: &'static str,
    store: Option<(tempfile::TempDir, Box<dyn BlobSystem>)>,
    keys: Vec<u64>,
    load: Duration,
    /// Payload bytes of the earlier blobs.
    earlier_bytes: u64,
    /// Cold cells, by thread count.
    cold: Vec<Samples>,
    /// Warm cells, by thread count.
    gets: Vec<Samples>,
    /// Bytes on disk after loading, after deleting half, after writing
    /// the same volume again.
    space: [Option<u64>; 3],
    reclaim: Option<&'static str>,
    space_note: Option<&'static str>,
    error: Option<String>,
}

impl Loaded {
    fn fail(&mut self, err: String) {
        eprintln!("{}: failed: {err}", self.system);
        self.error = Some(err);
        if let Some((dir, store)) = self.store.take() {
            close(store);
            drop(dir);
        }
    }
}

/// Loads `count` blobs of `size(rng)` bytes by [`BLOB_THREADS`] threads in
/// transactions of `batch`; returns their keys and payload bytes.
fn load(
    store: &dyn BlobSystem,
    count: u64,
    batch: usize,
    pool: &PayloadPool,
    seed: u64,
    size: fn(&mut Rng) -> usize,
) -> Result<(Vec<u64>, u64), String> {
    let threads = BLOB_THREADS as u64;
    let results: Vec<Result<(Vec<u64>, u64), String>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|thread| {
                scope.spawn(move || {
                    let share = count / threads + u64::from(thread < count % threads);
                    let mut rng = Rng::new(seed ^ (thread + 1) << 32);
                    let mut keys = Vec::with_capacity(share as usize);
                    let mut bytes = 0;
                    while (keys.len() as u64) < share {
                        let n = batch.min((share - keys.len() as u64) as usize);
                        let blobs: Vec<&[u8]> = (0..n)
                            .map(|_| {
                                let len = size(&mut rng);
                                pool.slice(len, &mut rng)
                            })
                            .collect();
                        bytes += blobs.iter().map(|b| b.len() as u64).sum::<u64>();
                        keys.extend(store.write(thread as usize, &blobs)?);
                    }
                    Ok((keys, bytes))
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("loader panicked"))
            .collect()
    });
    let mut keys = Vec::with_capacity(count as usize);
    let mut bytes = 0;
    for result in results {
        let (some, moved) = result?;
        keys.extend(some);
        bytes += moved;
    }
    Ok((keys, bytes))
}

fn one_kib(_: &mut Rng) -> usize {
    GET_SIZE
}

fn earlier_size(rng: &mut Rng) -> usize {
    let (low, high) = EARLIER_SIZES;
    low + (rng.next_u64() % (high - low + 1) as u64) as usize
}

/// The earlier blobs, then (timed) the 1 KiB ones: their keys, the time
/// the 1 KiB load took and the earlier payload bytes.
fn fill(
    store: &dyn BlobSystem,
    plan: &Plan,
    pool: &PayloadPool,
) -> Result<(Vec<u64>, Duration, u64), String> {
    let (_, earlier) = load(
        store,
        plan.earlier_blobs,
        plan.load_batch,
        pool,
        7,
        earlier_size,
    )?;
    let started = Instant::now();
    let (keys, _) = load(store, plan.blobs, plan.load_batch, pool, 1, one_kib)?;
    Ok((keys, started.elapsed(), earlier))
}

/// One random get of (c): checks the blob's length.
fn get_one(
    store: &dyn BlobSystem,
    keys: &[u64],
    thread: usize,
    iteration: u64,
) -> Result<u64, String> {
    let mut rng = Rng::new((thread as u64) << 40 | iteration);
    let key = keys[(rng.next_u64() % keys.len() as u64) as usize];
    match store.get(thread, key)? {
        Some(len) if len == GET_SIZE => Ok(len as u64),
        Some(len) => Err(format!("blob {key} has {len} bytes, not {GET_SIZE}")),
        None => Err(format!("blob {key} is missing")),
    }
}

/// (c) cold: a fresh store, filled, then as many random gets as it holds
/// 1 KiB blobs, split over `threads`, started the moment the load returns.
fn cold_gets(
    system: &str,
    threads: usize,
    plan: &Plan,
    pool: &PayloadPool,
) -> Result<Samples, String> {
    let (dir, store) = open(system, BLOB_THREADS)?;
    let outcome = fill(&*store, plan, pool).and_then(|(keys, _, _)| {
        let per_thread = plan.blobs / threads as u64;
        harness::run_fixed_samples(threads, per_thread, |thread, iteration| {
            get_one(&*store, &keys, thread, iteration)
        })
    });
    close(store);
    drop(dir);
    outcome
}

/// (c)'s first step: a store per system, loaded.
fn load_store(system: &'static str, plan: &Plan, pool: &PayloadPool) -> Loaded {
    let mut loaded = Loaded {
        system,
        store: None,
        keys: Vec::new(),
        load: Duration::ZERO,
        earlier_bytes: 0,
        cold: vec![Samples::default(); GET_THREADS.len()],
        gets: vec![Samples::default(); GET_THREADS.len()],
        space: [None; 3],
        reclaim: None,
        space_note: None,
        error: None,
    };
    eprint!(
        "blob (c) loading {} earlier blobs and {} blobs of 1 KiB: {system} … ",
        rate(plan.earlier_blobs as f64),
        rate(plan.blobs as f64)
    );
    let outcome = open(system, BLOB_THREADS).map(|(dir, store)| {
        let filled = fill(&*store, plan, pool);
        let space = settled_bytes(&*store, dir.path());
        (dir, store, filled, space)
    });
    match outcome {
        Ok((dir, store, filled, space)) => {
            loaded.space_note = store.space_note();
            loaded.store = Some((dir, store));
            match filled.and_then(|filled| space.map(|space| (filled, space))) {
                Ok(((keys, elapsed, earlier), space)) => {
                    eprintln!("{:.1} s", elapsed.as_secs_f64());
                    loaded.keys = keys;
                    loaded.load = elapsed;
                    loaded.earlier_bytes = earlier;
                    loaded.space[0] = Some(space);
                }
                Err(err) => loaded.fail(err),
            }
        }
        Err(err) => loaded.fail(err),
    }
    loaded
}

fn get_cell(loaded: &Loaded, threads: usize, plan: &Plan) -> Result<Samples, String> {
    let (_, store) = loaded.store.as_ref().ok_or("no store")?;
    let keys = &loaded.keys;
    harness::run_samples(threads, plan.warmup, plan.duration, |thread, iteration| {
        get_one(&**store, keys, thread, iteration)
    })
}

/// Bytes on disk once the store's background work (flushes, WAL
/// checkpoints, compactions) has settled: the same for every system, the
/// size is read every half second until two readings agree (at most 20 s).
fn settled_bytes(store: &dyn BlobSystem, dir: &std::path::Path) -> Result<u64, String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = store.bytes_on_disk(dir)?;
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = store.bytes_on_disk(dir)?;
        if now == last || Instant::now() >= deadline {
            return Ok(now);
        }
        last = now;
    }
}

/// (d) on a loaded store: delete every other blob, write the same volume
/// again, measuring the space after each step. Closes the store.
fn delete_and_rewrite(loaded: &mut Loaded, plan: &Plan, pool: &PayloadPool) {
    let Some((dir, mut store)) = loaded.store.take() else {
        return;
    };
    eprint!("blob (d) delete half, rewrite: {} … ", loaded.system);
    let keys = std::mem::take(&mut loaded.keys);
    let outcome = (|| -> Result<(), String> {
        let doomed: Vec<u64> = keys.iter().step_by(2).copied().collect();
        for chunk in doomed.chunks(plan.delete_batch) {
            store.delete(chunk)?;
        }
        loaded.reclaim = store.reclaim()?;
        loaded.space[1] = Some(settled_bytes(&*store, dir.path())?);
        if store.get(0, keys[0])?.is_some() {
            return Err(format!("deleted blob {} is still there", keys[0]));
        }
        if keys.len() > 1 && store.get(0, keys[1])? != Some(GET_SIZE) {
            return Err(format!("kept blob {} is gone", keys[1]));
        }
        load(
            &*store,
            doomed.len() as u64,
            plan.load_batch,
            pool,
            2,
            one_kib,
        )?;
        loaded.space[2] = Some(settled_bytes(&*store, dir.path())?);
        Ok(())
    })();
    match outcome {
        Ok(()) => eprintln!(
            "{} MiB after rewriting",
            loaded.space[2].map_or(String::new(), mib)
        ),
        Err(err) => {
            eprintln!("failed: {err}");
            loaded.error = Some(err);
        }
    }
    close(store);
    drop(dir);
}

/// (c) and (d): first the cold cells, each on a fresh store of its own, in
/// rounds; then every system's store is loaded and stays open, so the warm
/// get cells can be interleaved; then each store goes through (d).
fn gets_and_space(
    systems: &[&'static str],
    plan: &Plan,
    options: &Options,
    files: &mut Vec<PathBuf>,
) {
    let pool = PayloadPool::new(EARLIER_SIZES.1, 1024);
    let mut cold: Vec<Vec<Samples>> =
        vec![vec![Samples::default(); GET_THREADS.len()]; systems.len()];
    let mut cold_errors: Vec<Option<String>> = vec![None; systems.len()];
    for round in 0..plan.rounds {
        let mut indexes: Vec<usize> = (0..systems.len()).collect();
        if round % 2 == 1 {
            indexes.reverse();
        }
        for index in indexes {
            for (slot, threads) in GET_THREADS.into_iter().enumerate() {
                if cold_errors[index].is_some() {
                    continue;
                }
                eprint!(
                    "blob (c) cold gets right after the load, {threads} thread(s){}: {} … ",
                    round_label(round, plan.rounds),
                    systems[index]
                );
                match cold_gets(systems[index], threads, plan, &pool) {
                    Ok(samples) => {
                        eprintln!("{} gets/s", rate(samples.summary().per_second()));
                        cold[index][slot].merge(samples);
                    }
                    Err(err) => {
                        eprintln!("failed: {err}");
                        cold_errors[index] = Some(err);
                    }
                }
            }
        }
    }
    let mut stores: Vec<Loaded> = systems
        .iter()
        .map(|&system| load_store(system, plan, &pool))
        .collect();
    for (loaded, cells) in stores.iter_mut().zip(cold) {
        loaded.cold = cells;
    }
    for (loaded, error) in stores.iter_mut().zip(cold_errors) {
        if loaded.error.is_none() {
            if let Some(err) = error {
                loaded.error = Some(format!("cold gets: {err}"));
            }
        }
    }
    for round in 0..plan.rounds {
        let mut indexes: Vec<usize> = (0..stores.len()).collect();
        if round % 2 == 1 {
            indexes.reverse();
        }
        for index in indexes {
            for (slot, threads) in GET_THREADS.into_iter().enumerate() {
                let loaded = &mut stores[index];
                if loaded.store.is_none() {
                    continue;
                }
                eprint!(
                    "blob (c) gets, {threads} thread(s){}: {} … ",
                    round_label(round, plan.rounds),
                    loaded.system
                );
                match get_cell(loaded, threads, plan) {
                    Ok(samples) => {
                        eprintln!("{} gets/s", rate(samples.summary().per_second()));
                        loaded.gets[slot].merge(samples);
                    }
                    Err(err) => loaded.fail(err),
                }
            }
        }
    }
    for loaded in &mut stores {
        delete_and_rewrite(loaded, plan, &pool);
    }

    let mut gets = Table::new(&[
        "system",
        "load MiB/s#",
        "cold gets/s, 1 thread#",
        "p50 µs#",
        "p99 µs#",
        "cold gets/s, 4 threads#",
        "p50 µs#",
        "p99 µs#",
        "warm gets/s, 1 thread#",
        "p50 µs#",
        "p99 µs#",
        "warm gets/s, 4 threads#",
        "p50 µs#",
        "p99 µs#",
    ]);
    let mut space = Table::new(&[
        "system",
        "after load MiB#",
        "× payload#",
        "after deleting half MiB#",
        "× live payload#",
        "after rewriting MiB#",
        "× live payload#",
        "growth from load to rewrite#",
        "space reclamation run",
    ]);
    let payload_bytes = plan.blobs * GET_SIZE as u64;
    let half = plan.blobs.div_ceil(2) * GET_SIZE as u64;
    let mut get_series = Vec::new();
    let mut space_series = Vec::new();
    for r in &stores {
        let system = r.system;
        let load_rate = if r.load.is_zero() {
            String::new()
        } else {
            format!(
                "{:.1}",
                payload_bytes as f64 / f64::from(1 << 20) / r.load.as_secs_f64()
            )
        };
        let mut row = vec![system.to_string(), load_rate];
        let mut values = Vec::new();
        for samples in r.cold.iter().chain(&r.gets) {
            if samples.latencies.is_empty() {
                row.extend([String::new(), String::new(), String::new()]);
                values.push(None);
            } else {
                let m = samples.summary();
                row.extend([rate(m.per_second()), micros(m.p50), micros(m.p99)]);
                values.push(Some(m.per_second()));
            }
        }
        if let Some(err) = &r.error {
            row[1] = format!("failed: {err}");
        }
        gets.row(row);
        get_series.push(Series {
            name: system.to_string(),
            values,
        });
        let mut row = vec![system.to_string()];
        let mut ratios = Vec::new();
        let earlier = r.earlier_bytes;
        let live = [
            earlier + payload_bytes,
            earlier + payload_bytes - half,
            earlier + payload_bytes,
        ];
        for (bytes, live) in r.space.iter().zip(live) {
            match bytes {
                Some(bytes) => {
                    let ratio = *bytes as f64 / live as f64;
                    row.extend([mib(*bytes), format!("{ratio:.2}")]);
                    ratios.push(Some(ratio));
                }
                None => {
                    row.extend([String::new(), String::new()]);
                    ratios.push(None);
                }
            }
        }
        row.push(match r.space {
            [Some(loaded), _, Some(rewritten)] => {
                format!("{:+.1}%", (rewritten as f64 / loaded as f64 - 1.0) * 100.0)
            }
            _ => String::new(),
        });
        row.push(match (r.reclaim, &r.error) {
            (Some(what), _) => what.to_string(),
            (None, None) => "none".to_string(),
            (None, Some(err)) => format!("failed: {err}"),
        });
        if let Some(note) = r.space_note {
            space.note(note);
        }
        space.row(row);
        space_series.push(Series {
            name: system.to_string(),
            values: ratios,
        });
    }
    encrypted_note(&mut gets, systems);
    gets.note(format!(
        "every store first holds {} blobs of 100 B–4 KiB; then {} blobs of 1 KiB are loaded \
         by {BLOB_THREADS} threads in transactions of {} (load MiB/s); gets pick keys \
         uniformly at random and check each blob's length",
        rate(plan.earlier_blobs as f64),
        rate(plan.blobs as f64),
        rate(plan.load_batch as f64),
    ));
    gets.note(format!(
        "cold: a fresh store per cell and round, filled as above, then {} gets split over \
         the threads, started the moment the load returns (the store's own caches hold only \
         what its writes left there); {} rounds, systems in reverse order every other round",
        rate(plan.blobs as f64),
        plan.rounds
    ));
    gets.note(format!(
        "warm: one store per system stays open while the warm cells of all systems run \
         interleaved; {}",
        plan.describe()
    ));
    space.note(format!(
        "bytes on disk = blocks allocated by every file of the store (du) unless noted, read \
         once the store's background work has settled (two readings 0.5 s apart agree, at \
         most 20 s after the step); live payload = the earlier blobs' bytes plus {} of live \
         1 KiB blobs ({} after deleting every other blob, {} blobs a transaction); growth = \
         after rewriting ÷ after load",
        human_size(payload_bytes),
        human_size(payload_bytes - half),
        rate(plan.delete_batch as f64)
    ));
    space.note(
        "sediment deletes by archiving the blobs and committing a checkpoint_to; it has no \
         compaction step (freed grains are reused). Each peer's own reclamation runs after \
         the deletes, as named in the last column",
    );
    println!(
        "### (c) random gets of 1 KiB blobs from a store holding {} of them, cold and warm\n\n{}",
        rate(plan.blobs as f64),
        gets.to_markdown()
    );
    println!(
        "### (d) space: load {} × 1 KiB, delete half, write the same volume again\n\n{}",
        rate(plan.blobs as f64),
        space.to_markdown()
    );
    let csv = output(options, "blob-c.csv");
    saved(gets.write_csv(&csv), &csv, files);
    let csv = output(options, "blob-d.csv");
    saved(space.write_csv(&csv), &csv, files);
    let svg = output(options, "blob-c.svg");
    let labels: Vec<String> = ["cold", "warm"]
        .iter()
        .flat_map(|kind| GET_THREADS.iter().map(move |t| format!("{t}, {kind}")))
        .collect();
    saved(
        line_chart(
            &svg,
            "(c) random gets of 1 KiB blobs",
            "threads",
            "gets/s",
            &labels,
            &get_series,
        ),
        &svg,
        files,
    );
    let svg = output(options, "blob-d.svg");
    let labels = vec![
        "after load".to_string(),
        "after deleting half".to_string(),
        "after rewriting".to_string(),
    ];
    saved(
        line_chart(
            &svg,
            "(d) bytes on disk ÷ live payload",
            "step",
            "× live payload",
            &labels,
            &space_series,
        ),
        &svg,
        files,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sediment_load_get_delete() {
        let plan = Plan {
            small_transactions: 10,
            warmup: Duration::from_millis(10),
            duration: Duration::from_millis(50),
            rounds: 1,
            blobs: 300,
            earlier_blobs: 50,
            load_batch: 10,
            delete_batch: 100,
        };
        let pool = PayloadPool::new(EARLIER_SIZES.1, 1);
        for threads in GET_THREADS {
            let cold = cold_gets("sediment", threads, &plan, &pool).unwrap();
            assert_eq!(
                cold.latencies.len() as u64,
                300 / threads as u64 * threads as u64
            );
        }
        let mut loaded = load_store("sediment", &plan, &pool);
        assert!(loaded.error.is_none(), "{:?}", loaded.error);
        assert_eq!(loaded.keys.len(), 300);
        assert!(loaded.earlier_bytes >= 50 * EARLIER_SIZES.0 as u64);
        for threads in GET_THREADS {
            let samples = get_cell(&loaded, threads, &plan).unwrap();
            assert!(!samples.latencies.is_empty());
        }
        delete_and_rewrite(&mut loaded, &plan, &pool);
        assert!(loaded.error.is_none(), "{:?}", loaded.error);
        assert!(loaded.space.iter().all(Option::is_some));
        assert_eq!(loaded.reclaim, None);
        assert!(loaded.store.is_none());
    }
}
