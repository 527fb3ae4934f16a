//! The WAL section: one entry per durable commit, payloads × threads.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use super::{output, saved, select, Options};
use crate::chart::{line_chart, Series};
use crate::harness::{self, Samples};
use crate::report::{human_size, micros, rate, Table};
use crate::wal::{self, WalSystem};
use crate::{payload, temp_dir};

/// Runs the section; prints its table and returns the files written.
pub fn run(options: &Options) -> Vec<PathBuf> {
    let (warmup, mut duration) = if options.quick {
        (Duration::from_millis(150), Duration::from_millis(600))
    } else {
        (Duration::from_millis(300), Duration::from_secs(2))
    };
    if let Some(seconds) = options.seconds {
        duration = Duration::from_secs_f64(seconds);
    }
    let rounds = options.rounds();
    let (systems, notes) = select(wal::ALL, options);
    let sizes = options
        .payloads
        .clone()
        .unwrap_or_else(|| vec![256, 4096, 1 << 20]);
    let thread_counts = options.threads.clone().unwrap_or_else(|| vec![1, 4, 16]);

    let mut table = Table::new(&[
        "payload",
        "threads#",
        "system",
        "commits/s#",
        "p50 µs#",
        "p99 µs#",
        "p99 ÷ p50#",
        "× floor#",
    ]);
    for note in notes {
        table.note(note);
    }
    table.note(format!(
        "{} measured per cell ({rounds} round{} of {} ms after {} ms of warm-up, \
         systems in reverse order every other round); every round starts from an empty \
         directory, except floor and parallel-limit, whose preallocated 256 MiB files \
         are made once per run; × floor = commits/s ÷ the floor's in the same \
         configuration; p99 ÷ p50 of floor at 1 thread is the spread of a lone \
         fdatasync on this disk, which no log can narrow",
        format_args!("{:.1} s", duration.as_secs_f64() * rounds as f64),
        if rounds == 1 { "" } else { "s" },
        duration.as_millis(),
        warmup.as_millis(),
    ));
    if systems.contains(&"okaywal-encrypted") {
        table.note(
            "okaywal-encrypted: okaywal with Configuration::encryption (AES-256-GCM, \
             every record header and chunk frame sealed)",
        );
    }
    println!("## WAL: one entry per durable commit\n");
    if systems.is_empty() {
        println!("No WAL system selected.\n");
        for note in &table.notes[..table.notes.len() - 1] {
            println!("- {note}");
        }
        println!();
        return Vec::new();
    }

    // The reference files are preallocated once (256 MiB each), before
    // the first cell, and reused.
    let reference_dir = temp_dir();
    let mut references: HashMap<&str, Result<Box<dyn WalSystem>, String>> = HashMap::new();
    for &system in &systems {
        if matches!(system, "floor" | "parallel-limit") {
            eprintln!("wal: preallocating the {system} file");
            let dir = reference_dir.path().join(system);
            let opened = std::fs::create_dir_all(&dir)
                .map_err(|e| e.to_string())
                .and_then(|()| wal::open(system, &dir, 1));
            references.insert(system, opened);
        }
    }
    // rates[size][system][threads]
    let mut rates: Vec<HashMap<&str, Vec<Option<f64>>>> = vec![HashMap::new(); sizes.len()];

    for (size_index, &size) in sizes.iter().enumerate() {
        for (thread_index, &threads) in thread_counts.iter().enumerate() {
            let payloads: Vec<Vec<u8>> = (0..threads).map(|t| payload(size, t as u64)).collect();
            let mut results: HashMap<&str, Result<Samples, String>> = HashMap::new();
            for round in 0..rounds {
                // Every other round runs the systems in reverse order, so
                // no system always follows the same neighbour.
                let mut order = systems.clone();
                if round % 2 == 1 {
                    order.reverse();
                }
                for &system in &order {
                    if matches!(results.get(system), Some(Err(_))) {
                        continue;
                    }
                    eprint!(
                        "wal {} × {threads} threads{}: {system} … ",
                        human_size(size as u64),
                        round_label(round, rounds)
                    );
                    let cell = if let Some(reference) = references.get(system) {
                        reference.as_ref().map_err(Clone::clone).and_then(|log| {
                            harness::run_samples(threads, warmup, duration, |thread, _| {
                                log.commit(thread, &payloads[thread]).map(|()| size as u64)
                            })
                        })
                    } else {
                        let dir = temp_dir();
                        wal::open(system, dir.path(), threads).and_then(|log| {
                            let m = harness::run_samples(threads, warmup, duration, |thread, _| {
                                log.commit(thread, &payloads[thread]).map(|()| size as u64)
                            });
                            drop(log);
                            m
                        })
                    };
                    match cell {
                        Ok(samples) => {
                            let m = samples.summary();
                            eprintln!(
                                "{} commits/s (p50 {} µs, p99 {} µs)",
                                rate(m.per_second()),
                                micros(m.p50),
                                micros(m.p99)
                            );
                            match results
                                .entry(system)
                                .or_insert_with(|| Ok(Samples::default()))
                            {
                                Ok(all) => all.merge(samples),
                                Err(_) => unreachable!("failed systems are skipped"),
                            }
                        }
                        Err(err) => {
                            eprintln!("failed: {err}");
                            results.insert(system, Err(err));
                        }
                    }
                }
            }
            let floor = match results.get("floor") {
                Some(Ok(samples)) => Some(samples.summary().per_second()),
                _ => None,
            };
            for &system in &systems {
                match results.get(system) {
                    Some(Ok(samples)) => {
                        let m = samples.summary();
                        let per_second = m.per_second();
                        let ratio =
                            floor.map_or("–".to_string(), |f| format!("{:.2}", per_second / f));
                        table.row(vec![
                            human_size(size as u64),
                            threads.to_string(),
                            system.to_string(),
                            rate(per_second),
                            micros(m.p50),
                            micros(m.p99),
                            spread(m.p50, m.p99),
                            ratio,
                        ]);
                        rates[size_index]
                            .entry(system)
                            .or_insert_with(|| vec![None; thread_counts.len()])[thread_index] =
                            Some(per_second);
                    }
                    Some(Err(err)) => table.row(failed_row(size, threads, system, err)),
                    None => {}
                }
            }
        }
    }
    drop(references);
    drop(reference_dir);

    println!("{}", table.to_markdown());
    let mut files = Vec::new();
    let csv = output(options, "wal.csv");
    saved(table.write_csv(&csv), &csv, &mut files);
    let labels: Vec<String> = thread_counts.iter().map(ToString::to_string).collect();
    for (size_index, &size) in sizes.iter().enumerate() {
        let series: Vec<Series> = systems
            .iter()
            .filter_map(|s| {
                rates[size_index].get(s).map(|values| Series {
                    name: s.to_string(),
                    values: values.clone(),
                })
            })
            .collect();
        let name = human_size(size as u64).replace(' ', "");
        let path = output(options, &format!("wal-{name}.svg"));
        saved(
            line_chart(
                &path,
                &format!(
                    "WAL: durable commits/s, {} payloads",
                    human_size(size as u64)
                ),
                "threads",
                "commits/s",
                &labels,
                &series,
            ),
            &path,
            &mut files,
        );
    }
    files
}

/// `, round 2/2` when there are several rounds.
pub(crate) fn round_label(round: usize, rounds: usize) -> String {
    if rounds > 1 {
        format!(", round {}/{rounds}", round + 1)
    } else {
        String::new()
    }
}

fn failed_row(size: usize, threads: usize, system: &str, err: &str) -> Vec<String> {
    vec![
        human_size(size as u64),
        threads.to_string(),
        system.to_string(),
        format!("failed: {err}"),
    ]
}

/// p99 over p50, or a dash when p50 is zero.
fn spread(p50: Duration, p99: Duration) -> String {
    if p50.is_zero() {
        "–".to_string()
    } else {
        format!("{:.1}", p99.as_secs_f64() / p50.as_secs_f64())
    }
}
