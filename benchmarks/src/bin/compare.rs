//! Side-by-side comparison of this project with the systems a user would
//! pick instead. `cargo run --release -p benchmarks --bin compare -- --help`.

use std::time::Duration;

use benchmarks::harness::{self, Measurement};
use benchmarks::{machine_description, payload, temp_dir, wal};

struct Options {
    quick: bool,
    only: Option<String>,
    systems: Option<Vec<String>>,
    payloads: Option<Vec<usize>>,
    threads: Option<Vec<usize>>,
    seconds: Option<f64>,
}

fn numbers(list: &str, what: &str) -> Result<Vec<usize>, String> {
    list.split(',')
        .map(|n| {
            n.trim()
                .parse()
                .map_err(|_| format!("{what}: {n:?} is not a number"))
        })
        .collect()
}

fn parse_options() -> Result<Options, String> {
    let mut options = Options {
        quick: false,
        only: None,
        systems: None,
        payloads: None,
        threads: None,
        seconds: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => options.quick = true,
            "--only" => options.only = Some(args.next().ok_or("--only needs wal, blob or scale")?),
            "--systems" => {
                let list = args
                    .next()
                    .ok_or("--systems needs a comma-separated list")?;
                options.systems = Some(list.split(',').map(str::to_string).collect());
            }
            "--payloads" => {
                let list = args
                    .next()
                    .ok_or("--payloads needs sizes in bytes, e.g. 256,4096")?;
                options.payloads = Some(numbers(&list, "--payloads")?);
            }
            "--threads" => {
                let list = args.next().ok_or("--threads needs counts, e.g. 1,16")?;
                options.threads = Some(numbers(&list, "--threads")?);
            }
            "--seconds" => {
                let value = args.next().ok_or("--seconds needs a duration")?;
                options.seconds = Some(value.parse().map_err(|_| format!("--seconds: {value:?}"))?);
            }
            "--help" | "-h" => {
                println!(
                    "compare [--quick] [--only wal|blob|scale] [--systems a,b,...] \
                     [--payloads 256,4096,...] [--threads 1,16,...] [--seconds S]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    Ok(options)
}

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

fn micros(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1e6)
}

fn main() {
    let options = match parse_options() {
        Ok(options) => options,
        Err(err) => {
            eprintln!("compare: {err}");
            std::process::exit(2);
        }
    };
    println!("# Benchmark results\n\n{}\n", machine_description());
    if options.only.as_deref().map_or(true, |o| o == "wal") {
        wal_section(&options);
    }
}

fn wal_section(options: &Options) {
    let (warmup, mut duration) = if options.quick {
        (Duration::from_millis(200), Duration::from_millis(700))
    } else {
        (Duration::from_millis(300), Duration::from_secs(2))
    };
    if let Some(seconds) = options.seconds {
        duration = Duration::from_secs_f64(seconds);
    }
    let systems: Vec<&str> = wal::systems()
        .into_iter()
        .filter(|s| {
            options
                .systems
                .as_ref()
                .map_or(true, |l| l.iter().any(|x| x == s))
        })
        .collect();
    println!("## WAL: one entry per commit\n");
    println!("| payload | threads | system | commits/s | p50 µs | p99 µs | × floor |");
    println!("| --- | --- | --- | ---: | ---: | ---: | ---: |");
    let sizes = options
        .payloads
        .clone()
        .unwrap_or_else(|| vec![256, 4096, 1 << 20]);
    let thread_counts = options.threads.clone().unwrap_or_else(|| vec![1, 4, 16]);
    for &size in &sizes {
        for &threads in &thread_counts {
            let payloads: Vec<Vec<u8>> = (0..threads).map(|t| payload(size, t as u64)).collect();
            let mut floor: Option<f64> = None;
            for system in &systems {
                eprint!("wal {} × {threads} threads: {system} … ", human(size));
                let dir = temp_dir();
                let result = wal::open(system, dir.path(), threads).and_then(|log| {
                    let m = harness::run(threads, warmup, duration, |thread, _| {
                        log.commit(thread, &payloads[thread]).map(|()| size as u64)
                    });
                    drop(log);
                    m
                });
                match result {
                    Ok(m) => {
                        eprintln!("{:.0} commits/s", m.per_second());
                        if *system == "floor" {
                            floor = Some(m.per_second());
                        }
                        print_row(size, threads, system, &m, floor);
                    }
                    Err(err) => {
                        eprintln!("failed: {err}");
                        println!(
                            "| {} | {threads} | {system} | failed: {err} | | | |",
                            human(size)
                        );
                    }
                }
            }
        }
    }
    println!();
}

fn print_row(size: usize, threads: usize, system: &str, m: &Measurement, floor: Option<f64>) {
    let ratio = floor.map_or("–".to_string(), |f| format!("{:.2}", m.per_second() / f));
    println!(
        "| {} | {threads} | {system} | {:.0} | {} | {} | {ratio} |",
        human(size),
        m.per_second(),
        micros(m.p50),
        micros(m.p99)
    );
}
