//! Follows the log from a second thread while writers commit, the way a
//! replica tails its leader, and reports what following cost.
//!
//! ```text
//! cargo run --release -p okaywal --example follow -- [ENTRIES_PER_WRITER] [--no-reader]
//! ```
//!
//! Four writers commit 256-byte entries; the reader takes each one with
//! [`LogEntries::next_timeout`] as soon as it is durable. The log lives in
//! a temporary directory under the current one (on the project's disk, not
//! a memory-backed `/tmp`). On Linux the process's CPU time is printed
//! too: run once with `--no-reader` to see what the reader adds.

use std::time::{Duration, Instant};

use okaywal::{Configuration, EntryId, LogEntries, LogVoid};

fn main() -> std::io::Result<()> {
    let mut per_writer = 20_000_usize;
    let mut with_reader = true;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--no-reader" => with_reader = false,
            number => {
                per_writer = number.parse().map_err(|_| {
                    std::io::Error::other(format!("expected a number of entries, got {number:?}"))
                })?;
            }
        }
    }
    let writers = 4;
    let total = per_writer * writers;
    let dir = tempfile::tempdir_in(".")?;
    let log = Configuration::default_for(dir.path()).open(LogVoid)?;

    let start = Instant::now();
    let (written, read) = std::thread::scope(|scope| -> std::io::Result<_> {
        let reader = with_reader.then(|| {
            let log = log.clone();
            scope.spawn(move || -> std::io::Result<usize> {
                let mut entries: LogEntries = log.entries_from(EntryId(1));
                let mut seen = 0;
                while seen < total {
                    match entries.next_timeout(Duration::from_secs(10))? {
                        Some(_) => seen += 1,
                        None => break,
                    }
                }
                Ok(seen)
            })
        });
        let handles: Vec<_> = (0..writers)
            .map(|_| {
                let log = &log;
                scope.spawn(move || -> std::io::Result<()> {
                    let payload = [7_u8; 256];
                    for _ in 0..per_writer {
                        let mut entry = log.begin_entry()?;
                        entry.write_chunk(&payload)?;
                        entry.commit()?;
                    }
                    Ok(())
                })
            })
            .collect();
        for handle in handles {
            handle.join().expect("writer panicked")?;
        }
        let written = start.elapsed();
        let read = match reader {
            Some(reader) => {
                let seen = reader.join().expect("reader panicked")?;
                if seen < total {
                    return Err(std::io::Error::other(format!(
                        "the reader saw {seen} of {total} entries"
                    )));
                }
                Some(start.elapsed())
            }
            None => None,
        };
        Ok((written, read))
    })?;
    log.shutdown()?;

    println!(
        "{total} entries by {writers} writers in {written:.2?} ({:.0} commits/s)",
        total as f64 / written.as_secs_f64()
    );
    match read {
        Some(read) => println!(
            "reader had every entry {:.2?} after the last commit",
            read.saturating_sub(written)
        ),
        None => println!("no reader"),
    }
    if let Some((user, system)) = cpu_seconds() {
        println!("process CPU: user {user:.2} s, system {system:.2} s");
    }
    Ok(())
}

/// User and system CPU seconds of this process, from `/proc/self/stat`
/// (Linux; clock ticks assumed to be 100 per second, the kernel's
/// `USER_HZ` on every mainstream architecture).
fn cpu_seconds() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which is in parentheses and may
    // contain spaces: utime and stime are the 12th and 13th of them.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i)?.parse::<f64>().ok();
    Some((ticks(11)? / 100.0, ticks(12)? / 100.0))
}
