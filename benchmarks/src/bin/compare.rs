//! Side-by-side comparison of this project with the systems a user would
//! pick instead:
//!
//! ```text
//! cargo run --release -p benchmarks --bin compare -- [--quick] [--only wal|blob|scale]
//! ```
//!
//! Markdown tables go to stdout, a progress line per cell to stderr, CSV
//! files and SVG charts to `target/benchmarks/`. Started by `cargo run`
//! without the `peers` feature, a run that wants peers first builds itself
//! with `--features peers` and runs that build (see
//! [`benchmarks::relaunch`]); with `COMPARE_NO_REBUILD=1`, or run directly,
//! such a build runs only this project's systems and says which peers were
//! not compiled in. `--help` lists every option.

use std::process::ExitCode;

use benchmarks::sections::{self, scale, Options};
use benchmarks::{machine_description, peers, relaunch};

const HELP: &str = "\
compare [--quick] [--only wal|blob|scale|raft] [--systems a,b,...]
        [--payloads 256,4096,...] [--threads 1,16,...] [--nodes 3,1] [--seconds S]
        [--rounds N] [--transactions N] [--blobs N] [--scale-bytes N[K|M|G]]
        [--out DIR]

  --quick        short cells and scaled-down counts (whole run < 3 minutes)
  --only S       one section: wal, blob, scale or raft (scale runs only when asked;
                 raft needs --features raft, which peers includes: sediment-raft
                 and etcd node processes, 3 s x 6 rounds per cell, quick 1 s x 2)
  --systems L    only these systems (see the list below)
  --payloads L   payload sizes in bytes (WAL default 256,4096,1048576;
                 raft 256,4096)
  --threads L    WAL thread counts (default 1,4,16); raft client counts
                 (default 1,16,64)
  --nodes L      raft cluster sizes (default 3,1)
  --seconds S    measured seconds per timed cell and round
  --rounds N     rounds per timed cell, merged (default 2, quick 1); every
                 other round runs the systems in reverse order
  --transactions N
                 blob (a)'s transactions, split over the rounds (default 2000,
                 quick 400); with many rounds, more of them keep each round long
  --blobs N      blobs loaded for blob (c) and (d) (default 100000, quick 20000)
  --scale-bytes  bytes loaded by the scale section (default 4G, quick 512M)
  --out DIR      where CSV files and charts go (default target/benchmarks)

PostgreSQL runs when PG_URL is set (benchmarks/pg.sh start prints it).
The raft section starts etcd with benchmarks/etcd.sh (installing Debian's
etcd-server and strace when missing) and builds sediment-raft in release
unless SEDIMENT_RAFT_BIN names a binary.
Started by `cargo run` without the peer features, compare builds itself
with `--features peers` first and runs that build; COMPARE_NO_REBUILD=1
runs without the peers instead.";

fn numbers(list: &str, what: &str) -> Result<Vec<usize>, String> {
    list.split(',')
        .map(|n| {
            n.trim()
                .parse()
                .map_err(|_| format!("{what}: {n:?} is not a number"))
        })
        .collect()
}

fn byte_count(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (digits, shift) = match text.chars().last() {
        Some('K' | 'k') => (&text[..text.len() - 1], 10),
        Some('M' | 'm') => (&text[..text.len() - 1], 20),
        Some('G' | 'g') => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    digits
        .parse::<u64>()
        .map(|n| n << shift)
        .map_err(|_| format!("{text:?} is not a byte count"))
}

struct Command {
    options: Options,
    only: Option<String>,
}

fn parse(args: &[String]) -> Result<Command, String> {
    let mut options = Options::new();
    let mut only = None;
    let mut args = args.iter();
    let value = |args: &mut std::slice::Iter<'_, String>, what: &str| {
        args.next()
            .cloned()
            .ok_or_else(|| format!("{what} needs a value (try --help)"))
    };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => options.quick = true,
            "--only" => {
                let section = value(&mut args, "--only")?;
                if !matches!(section.as_str(), "wal" | "blob" | "scale" | "raft") {
                    return Err(format!(
                        "--only takes wal, blob, scale or raft, not {section:?}"
                    ));
                }
                only = Some(section);
            }
            "--systems" => {
                let list = value(&mut args, "--systems")?;
                let known = sections::known_systems();
                let systems: Vec<String> = list.split(',').map(|s| s.trim().to_string()).collect();
                for system in &systems {
                    if !known.contains(&system.as_str()) {
                        return Err(format!(
                            "unknown system {system:?}; known: {}",
                            known.join(", ")
                        ));
                    }
                }
                options.systems = Some(systems);
            }
            "--payloads" => {
                options.payloads = Some(numbers(&value(&mut args, "--payloads")?, "--payloads")?);
            }
            "--threads" => {
                options.threads = Some(numbers(&value(&mut args, "--threads")?, "--threads")?);
            }
            "--nodes" => {
                let nodes = numbers(&value(&mut args, "--nodes")?, "--nodes")?;
                if nodes.contains(&0) {
                    return Err("--nodes: a cluster has at least one node".to_string());
                }
                options.nodes = Some(nodes);
            }
            "--seconds" => {
                let seconds = value(&mut args, "--seconds")?;
                options.seconds = Some(
                    seconds
                        .parse()
                        .map_err(|_| format!("--seconds: {seconds:?} is not a number"))?,
                );
            }
            "--rounds" => {
                let rounds = value(&mut args, "--rounds")?;
                options.rounds = Some(
                    rounds
                        .parse()
                        .map_err(|_| format!("--rounds: {rounds:?} is not a number"))?,
                );
            }
            "--transactions" => {
                let transactions = value(&mut args, "--transactions")?;
                options.transactions =
                    Some(transactions.parse().map_err(|_| {
                        format!("--transactions: {transactions:?} is not a number")
                    })?);
            }
            "--blobs" => {
                let blobs = value(&mut args, "--blobs")?;
                options.blobs = Some(
                    blobs
                        .parse()
                        .map_err(|_| format!("--blobs: {blobs:?} is not a number"))?,
                );
            }
            "--scale-bytes" => {
                options.scale_bytes = Some(byte_count(&value(&mut args, "--scale-bytes")?)?);
            }
            "--out" => options.out_dir = value(&mut args, "--out")?.into(),
            "--help" | "-h" => {
                println!(
                    "{HELP}\n\nsystems: {}",
                    sections::known_systems().join(", ")
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    Ok(Command { options, only })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(scale::CHILD_COMMAND) {
        return ExitCode::from(scale::child_main(&args[1..]) as u8);
    }
    let Command { options, only } = match parse(&args) {
        Ok(command) => command,
        Err(err) => {
            eprintln!("compare: {err}");
            return ExitCode::from(2);
        }
    };
    let wants_peers = relaunch::wants_rebuild(
        options.systems.as_deref(),
        only.as_deref(),
        peers::FEATURES,
        cfg!(feature = "raft"),
    );
    if let Some(code) = relaunch::relaunch_with_peers(&args, wants_peers, only.as_deref()) {
        return code;
    }
    println!("# Benchmark results\n\n{}\n", machine_description());
    let missing: Vec<String> = peers::FEATURES
        .iter()
        .filter(|(_, _, on)| !on)
        .map(|(name, _, _)| (*name).to_string())
        .collect();
    if missing.iter().any(|m| m != "rocksdb") {
        println!(
            "Peers not compiled in: {} (build with `--features peers`; RocksDB needs \
             `--features peers,rocksdb`).\n",
            missing.join(", ")
        );
    } else if !missing.is_empty() {
        println!(
            "Peers not compiled in: rocksdb (build with `--features peers,rocksdb`; see \
             benchmarks/README.md).\n"
        );
    }
    if options.quick {
        println!("Run with --quick: short cells, scaled-down counts.\n");
    }
    let mut files = Vec::new();
    let wanted = |section: &str| only.as_deref().map_or(section != "scale", |o| o == section);
    if wanted("wal") {
        files.extend(sections::wal::run(&options));
    }
    if wanted("blob") {
        files.extend(sections::blob::run(&options));
    }
    if wanted("scale") {
        files.extend(sections::scale::run(&options));
    }
    if wanted("raft") {
        #[cfg(feature = "raft")]
        files.extend(benchmarks::raft::run(&options));
        #[cfg(not(feature = "raft"))]
        println!("## Replication (raft)\n\nNot compiled in: build with `--features raft`.\n");
    }
    if !files.is_empty() {
        println!("Files written:\n");
        for file in &files {
            println!("- {}", file.display());
        }
        println!();
    }
    ExitCode::SUCCESS
}
