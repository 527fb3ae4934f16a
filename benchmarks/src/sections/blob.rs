//! The blob section:
//! (a) one thread, small transactions of one 16-byte blob;
//! (b) 8 threads, transactions of 1–20 blobs of 0–4 KiB;
//! both also for `sediment-buffered` (`commit_buffered` with a sync every
//! 16 transactions) beside the durable numbers;
//! (c) random gets of 1 KiB blobs from a loaded store, 1 and 4 threads;
//! (d) space: load, delete half, write the same volume again.

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
    /// Blobs loaded for (c) and (d).
    pub blobs: u64,
    /// Blobs per transaction while loading.
    pub load_batch: usize,
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
                load_batch: 1_000,
            }
        } else {
            Self {
                small_transactions: 2_000,
                warmup: Duration::from_millis(300),
                duration: Duration::from_millis(1500),
                rounds: 2,
                blobs: 100_000,
                load_batch: 1_000,
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

fn load(
    store: &dyn BlobSystem,
    count: u64,
    batch: usize,
    pool: &PayloadPool,
    seed: u64,
) -> Result<Vec<u64>, String> {
    let mut rng = Rng::new(seed);
    let mut keys = Vec::with_capacity(count as usize);
    while (keys.len() as u64) < count {
        let n = batch.min((count - keys.len() as u64) as usize);
        let blobs: Vec<&[u8]> = (0..n).map(|_| pool.slice(GET_SIZE, &mut rng)).collect();
        keys.extend(store.write(0, &blobs)?);
    }
    Ok(keys)
}

/// (c)'s first step: a store per system, loaded.
fn load_store(system: &'static str, plan: &Plan, pool: &PayloadPool) -> Loaded {
    let mut loaded = Loaded {
        system,
        store: None,
        keys: Vec::new(),
        load: Duration::ZERO,
        gets: vec![Samples::default(); GET_THREADS.len()],
        space: [None; 3],
        reclaim: None,
        space_note: None,
        error: None,
    };
    eprint!(
        "blob (c) loading {} blobs of 1 KiB: {system} … ",
        rate(plan.blobs as f64)
    );
    let threads = GET_THREADS.iter().copied().max().unwrap_or(1);
    let outcome = open(system, threads).map(|(dir, store)| {
        let started = Instant::now();
        let keys = load(&*store, plan.blobs, plan.load_batch, pool, 1);
        let elapsed = started.elapsed();
        let space = settled_bytes(&*store, dir.path());
        (dir, store, keys, elapsed, space)
    });
    match outcome {
        Ok((dir, store, keys, elapsed, space)) => {
            loaded.space_note = store.space_note();
            loaded.store = Some((dir, store));
            match keys.and_then(|keys| space.map(|space| (keys, space))) {
                Ok((keys, space)) => {
                    eprintln!("{:.1} s", elapsed.as_secs_f64());
                    loaded.keys = keys;
                    loaded.load = elapsed;
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
        let mut rng = Rng::new((thread as u64) << 40 | iteration);
        let key = keys[(rng.next_u64() % keys.len() as u64) as usize];
        match store.get(thread, key)? {
            Some(len) if len == GET_SIZE => Ok(len as u64),
            Some(len) => Err(format!("blob {key} has {len} bytes, not {GET_SIZE}")),
            None => Err(format!("blob {key} is missing")),
        }
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
        for chunk in doomed.chunks(plan.load_batch) {
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
        load(&*store, doomed.len() as u64, plan.load_batch, pool, 2)?;
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

/// (c) and (d): every system's store is loaded first and stays open, so
/// the get cells can be interleaved; then each store goes through (d).
fn gets_and_space(
    systems: &[&'static str],
    plan: &Plan,
    options: &Options,
    files: &mut Vec<PathBuf>,
) {
    let pool = PayloadPool::new(GET_SIZE, 1024);
    let mut stores: Vec<Loaded> = systems
        .iter()
        .map(|&system| load_store(system, plan, &pool))
        .collect();
    for round in 0..plan.rounds {
        let mut indexes: Vec<usize> = (0..stores.len()).collect();
        if round % 2 == 1 {
            indexes.reverse();
        }
        for index in indexes {
            for (slot, threads) in GET_THREADS.into_iter().enumerate() {
                let loaded = &mut stores[index];
                if loaded.error.is_some() {
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
        "gets/s, 1 thread#",
        "p50 µs#",
        "p99 µs#",
        "gets/s, 4 threads#",
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
        "space reclamation run",
    ]);
    let payload_bytes = plan.blobs * GET_SIZE as u64;
    let half = plan.blobs.div_ceil(2) * GET_SIZE as u64;
    let live = [payload_bytes, payload_bytes - half, payload_bytes];
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
        for samples in &r.gets {
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
    gets.note(format!(
        "{} blobs of 1 KiB loaded by one thread in transactions of {} (load MiB/s); every \
         store stays open while the get cells of all systems run interleaved; gets pick \
         keys uniformly at random and check each blob's length; {}",
        rate(plan.blobs as f64),
        rate(plan.load_batch as f64),
        plan.describe()
    ));
    space.note(format!(
        "bytes on disk = blocks allocated by every file of the store (du) unless noted, read \
         once the store's background work has settled (two readings 0.5 s apart agree, at \
         most 20 s after the step); payload = {} of live 1 KiB blobs ({} after deleting every other blob)",
        human_size(payload_bytes),
        human_size(payload_bytes - half)
    ));
    space.note(
        "sediment deletes by archiving the blobs and committing a checkpoint_to; it has no \
         compaction step (freed grains are reused). Each peer's own reclamation runs after \
         the deletes, as named in the last column",
    );
    println!(
        "### (c) random gets of 1 KiB blobs from a {}-blob store\n\n{}",
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
    let labels: Vec<String> = GET_THREADS.iter().map(ToString::to_string).collect();
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
            load_batch: 100,
        };
        let pool = PayloadPool::new(GET_SIZE, 1);
        let mut loaded = load_store("sediment", &plan, &pool);
        assert!(loaded.error.is_none(), "{:?}", loaded.error);
        assert_eq!(loaded.keys.len(), 300);
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
