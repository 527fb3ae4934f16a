//! The scale section (`--only scale`, not part of the full run): load
//! 4 GiB of blobs (log-uniform 1 KiB–1 MiB, 8 threads, 1–8 blobs per
//! transaction) into each store, each in a child process of its own so
//! its peak RSS is its own; then delete 25% and write a quarter of the
//! load again.
//!
//! The child is this same binary, run as `compare __scale-child SYSTEM
//! BYTES DIR`: it prints `key value…` lines on stdout, which the parent
//! reads. The parent reaps the child with `wait4`, whose `ru_maxrss` is
//! that child's peak RSS alone (`getrusage(RUSAGE_CHILDREN)` would give
//! the largest of every child reaped so far); the child also prints its
//! own `VmHWM`, a cross-check the table shows when the two disagree.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::Mutex;

use super::{output, saved, select, Options};
use crate::blob::{self, BlobSystem};
use crate::chart::{line_chart, Series};
use crate::report::{human_size, mib, rate, Table};
use crate::{temp_dir, PayloadPool, Rng};

/// The name of the hidden subcommand that runs one system.
pub const CHILD_COMMAND: &str = "__scale-child";

/// The systems of the scale section. `parallel-limit` is no store: the
/// disk itself under the same load (see `ParallelLimit` in this module).
pub const SYSTEMS: &[&str] = &[
    "parallel-limit",
    "sediment",
    "redb",
    "fjall",
    "marble",
    "sqlite",
];

const THREADS: usize = 8;
const MIN_BLOB: u64 = 1 << 10;
const MAX_BLOB: u64 = 1 << 20;

/// Default bytes to load: 4 GiB (512 MiB with `--quick`).
#[must_use]
pub fn default_bytes(quick: bool) -> u64 {
    if quick {
        512 << 20
    } else {
        4 << 30
    }
}

/// Runs the section; prints its tables and returns the files written.
pub fn run(options: &Options) -> Vec<PathBuf> {
    let bytes = options
        .scale_bytes
        .unwrap_or_else(|| default_bytes(options.quick));
    let (systems, notes) = select(SYSTEMS, options);
    println!(
        "## Scale: {} of blobs (log-uniform {}–{}, {THREADS} threads, 1–8 blobs per \
         transaction)\n",
        human_size(bytes),
        human_size(MIN_BLOB),
        human_size(MAX_BLOB)
    );
    for note in &notes {
        println!("- {note}");
    }
    if !notes.is_empty() {
        println!();
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(err) => {
            println!("Scale section skipped: cannot find this program: {err}\n");
            return Vec::new();
        }
    };
    let mut throughput = Table::new(&[
        "system",
        "10%#",
        "20%#",
        "30%#",
        "40%#",
        "50%#",
        "60%#",
        "70%#",
        "80%#",
        "90%#",
        "100%#",
        "last ÷ first#",
        "load s#",
    ]);
    throughput.note("MiB/s of payload committed during each tenth of the load");
    throughput.note(
        "last ÷ first: the last tenth's rate over the first's; parallel-limit's is the \
         device's own (a virtual disk may absorb a burst far faster than it sustains)",
    );
    let extra = bytes / 4;
    let mut space = Table::new(&[
        "system",
        "peak RSS MiB#",
        "after load MiB#",
        "× payload#",
        "after deleting 25% MiB#",
        "× live payload#",
        &format!("after writing {} more, MiB#", human_size(extra)),
        "× live payload#",
        "space reclamation run",
    ]);
    space.note(
        "peak RSS: ru_maxrss from wait4 on the child process that ran the system \
         (payload buffers included, about 2 MiB); in brackets the child's own VmHWM \
         where it differs by more than 1 MiB",
    );
    space.note(
        "bytes on disk = blocks allocated by the store's files (du); sediment deletes by \
         archive + checkpoint_to and runs no compaction; each peer's own reclamation runs \
         after the deletes",
    );
    space.note(
        "parallel-limit is no store: every transaction is one pwrite at a reserved offset \
         of one file plus fdatasync, by its own thread (the device's own speed under this \
         load); it never reuses space",
    );
    let mut series = Vec::new();
    for &system in &systems {
        eprintln!("scale {}: {system} (child process) …", human_size(bytes));
        let dir = temp_dir();
        let outcome = run_child(&exe, system, bytes, dir.path());
        drop(dir);
        let values = match outcome {
            Ok(values) => values,
            Err(err) => {
                eprintln!("scale {system} failed: {err}");
                throughput.row(vec![system.to_string(), format!("failed: {err}")]);
                space.row(vec![system.to_string(), format!("failed: {err}")]);
                continue;
            }
        };
        let get = |key: &str| -> Option<f64> {
            values
                .get(key)
                .and_then(|v| v.first())
                .and_then(|v| v.parse().ok())
        };
        let tenths: Vec<Option<f64>> = values
            .get("tenths")
            .map(|v| v.iter().map(|s| s.parse().ok()).collect())
            .unwrap_or_default();
        let mut row = vec![system.to_string()];
        row.extend(tenths.iter().map(|t| t.map_or(String::new(), rate)));
        row.resize(11, String::new());
        row.push(match (tenths.first(), tenths.last()) {
            (Some(Some(first)), Some(Some(last))) if *first > 0.0 => format!("{:.2}", last / first),
            _ => String::new(),
        });
        row.push(get("load_seconds").map_or(String::new(), |s| format!("{s:.1}")));
        throughput.row(row);
        series.push(Series {
            name: system.to_string(),
            values: tenths,
        });
        let cell = |bytes: Option<f64>, live: Option<f64>| -> [String; 2] {
            match (bytes, live) {
                (Some(b), Some(l)) if l > 0.0 => [mib(b as u64), format!("{:.2}", b / l)],
                _ => [String::new(), String::new()],
            }
        };
        let mut row = vec![
            system.to_string(),
            peak_rss_cell(get("wait4_maxrss_kib"), get("peak_rss_kib")),
        ];
        row.extend(cell(get("disk_after_load"), get("live_after_load")));
        row.extend(cell(get("disk_after_delete"), get("live_after_delete")));
        row.extend(cell(get("disk_after_more"), get("live_after_more")));
        row.push(
            values
                .get("reclaim")
                .map_or("none".to_string(), |v| v.join(" ")),
        );
        space.row(row);
    }
    println!(
        "### Load throughput\n\n{}\n### Memory and space\n\n{}",
        throughput.to_markdown(),
        space.to_markdown()
    );
    let mut files = Vec::new();
    let csv = output(options, "scale-throughput.csv");
    saved(throughput.write_csv(&csv), &csv, &mut files);
    let csv = output(options, "scale-space.csv");
    saved(space.write_csv(&csv), &csv, &mut files);
    let svg = output(options, "scale-throughput.svg");
    let labels: Vec<String> = (1..=10).map(|t| format!("{}%", t * 10)).collect();
    saved(
        line_chart(
            &svg,
            &format!("Loading {} of blobs: MiB/s per tenth", human_size(bytes)),
            "share of the load",
            "MiB/s",
            &labels,
            &series,
        ),
        &svg,
        &mut files,
    );
    files
}

/// The peak RSS column: `wait4`'s figure, with the child's own `VmHWM`
/// in brackets when they differ by more than 1 MiB (either alone when
/// the other is missing).
fn peak_rss_cell(wait4_kib: Option<f64>, vm_hwm_kib: Option<f64>) -> String {
    let mib = |kib: f64| format!("{:.0}", kib / 1024.0);
    match (wait4_kib, vm_hwm_kib) {
        (Some(w), Some(v)) if (w - v).abs() > 1024.0 => format!("{} ({})", mib(w), mib(v)),
        (Some(w), _) => mib(w),
        (None, Some(v)) => format!("({})", mib(v)),
        (None, None) => String::new(),
    }
}

/// The exit status and peak RSS (KiB) of a child, from `wait4(2)`.
fn wait4(pid: u32) -> std::io::Result<(std::process::ExitStatus, u64)> {
    use std::os::unix::process::ExitStatusExt;
    let pid = libc::pid_t::try_from(pid).map_err(std::io::Error::other)?;
    let mut status: libc::c_int = 0;
    // SAFETY: `rusage` is plain old data that wait4 fills in; both
    // pointers are to live locals for the duration of the call.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: see above; `pid` is our own unreaped child.
        let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if reaped == pid {
            break;
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
    // Linux reports ru_maxrss in KiB.
    let kib = u64::try_from(usage.ru_maxrss).unwrap_or(0);
    Ok((std::process::ExitStatus::from_raw(status), kib))
}

fn run_child(
    exe: &Path,
    system: &str,
    bytes: u64,
    dir: &Path,
) -> Result<HashMap<String, Vec<String>>, String> {
    use std::io::Read;
    let mut child = Command::new(exe)
        .arg(CHILD_COMMAND)
        .arg(system)
        .arg(bytes.to_string())
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("starting the child: {e}"))?;
    let mut stdout = String::new();
    let read = child
        .stdout
        .take()
        .expect("stdout is piped")
        .read_to_string(&mut stdout);
    // Reaped here, by wait4, not by `Child::wait` (which would lose the
    // rusage); `child` is not waited on afterwards.
    let (status, maxrss_kib) =
        wait4(child.id()).map_err(|e| format!("waiting for the child: {e}"))?;
    read.map_err(|e| format!("reading the child's output: {e}"))?;
    let mut values: HashMap<String, Vec<String>> = HashMap::new();
    values.insert("wait4_maxrss_kib".into(), vec![maxrss_kib.to_string()]);
    for line in stdout.lines() {
        let mut words = line.split_whitespace();
        if let Some(key) = words.next() {
            values.insert(key.to_string(), words.map(str::to_string).collect());
        }
    }
    if let Some(err) = values.get("error") {
        return Err(err.join(" "));
    }
    if !status.success() {
        return Err(format!("child exited with {status}"));
    }
    Ok(values)
}

/// The child's side: runs `system` in `dir`, prints results on stdout.
/// Returns the process exit code.
pub fn child_main(args: &[String]) -> i32 {
    let [system, bytes, dir] = args else {
        eprintln!("usage: compare {CHILD_COMMAND} SYSTEM BYTES DIR");
        return 2;
    };
    let Ok(bytes) = bytes.parse::<u64>() else {
        eprintln!("{CHILD_COMMAND}: {bytes:?} is not a byte count");
        return 2;
    };
    match child(system, bytes, Path::new(dir)) {
        Ok(()) => 0,
        Err(err) => {
            println!("error {}", err.replace('\n', " "));
            1
        }
    }
}

/// Reads this process's peak resident set (`VmHWM`) in KiB.
#[must_use]
pub fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
}

/// One stored blob: its key and length.
type Stored = (u64, u64);

/// Writes `target` bytes from [`THREADS`] threads; returns what was stored
/// and the time at which each tenth of `target` was committed.
fn fill(
    store: &dyn BlobSystem,
    target: u64,
    seed: u64,
    label: &str,
) -> Result<(Vec<Stored>, Vec<f64>), String> {
    let pool = PayloadPool::new(MAX_BLOB as usize, seed);
    let reserved = AtomicU64::new(0);
    let completed = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    let marks: Mutex<Vec<Option<f64>>> = Mutex::new(vec![None; 10]);
    let started = Instant::now();
    let results: Vec<Result<Vec<Stored>, String>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|thread| {
                let (pool, reserved, completed, failed, marks) =
                    (&pool, &reserved, &completed, &failed, &marks);
                scope.spawn(move || -> Result<Vec<Stored>, String> {
                    let mut stored = Vec::new();
                    let mut rng = Rng::new(seed << 8 | thread as u64);
                    while !failed.load(Ordering::Relaxed) {
                        let count = rng.between(1, 8) as usize;
                        let sizes: Vec<u64> = (0..count)
                            .map(|_| rng.log_uniform(MIN_BLOB, MAX_BLOB))
                            .collect();
                        let tx_bytes: u64 = sizes.iter().sum();
                        if reserved.fetch_add(tx_bytes, Ordering::Relaxed) >= target {
                            break;
                        }
                        let blobs: Vec<&[u8]> = sizes
                            .iter()
                            .map(|&len| pool.slice(len as usize, &mut rng))
                            .collect();
                        let keys = match store.write(thread, &blobs) {
                            Ok(keys) => keys,
                            Err(err) => {
                                failed.store(true, Ordering::Relaxed);
                                return Err(err);
                            }
                        };
                        stored.extend(keys.into_iter().zip(sizes));
                        let done = completed.fetch_add(tx_bytes, Ordering::Relaxed) + tx_bytes;
                        let from = (done - tx_bytes) * 10 / target;
                        let to = (done * 10 / target).min(10);
                        if to > from {
                            let at = started.elapsed().as_secs_f64();
                            let mut marks = marks.lock();
                            for tenth in from..to {
                                marks[tenth as usize] = Some(at);
                            }
                            drop(marks);
                            eprintln!(
                                "  {label}: {}% after {at:.1} s ({:.0} MiB/s so far)",
                                to * 10,
                                done as f64 / f64::from(1 << 20) / at
                            );
                        }
                    }
                    Ok(stored)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("writer panicked"))
            .collect()
    });
    let mut all = Vec::new();
    for result in results {
        all.extend(result?);
    }
    let marks = marks.into_inner();
    let mut previous = 0.0;
    let tenth_mib = target as f64 / 10.0 / f64::from(1 << 20);
    let rates = marks
        .iter()
        .map(|mark| {
            let at = mark.unwrap_or(previous);
            let rate = tenth_mib / (at - previous).max(1e-6);
            previous = at;
            rate
        })
        .collect();
    Ok((all, rates))
}

/// The disk alone under the scale load: each transaction's blobs are
/// written with one `pwrite` at an offset reserved in one file, then
/// `fdatasync`ed, by the committing thread, with no coordination, index
/// or space reuse. Its tenths show how fast the device itself is through
/// the load, to compare the stores' tenths with.
struct ParallelLimit {
    file: std::fs::File,
    end: AtomicU64,
    lengths: Mutex<HashMap<u64, usize>>,
}

impl ParallelLimit {
    fn open(dir: &Path) -> Result<Self, String> {
        let path = dir.join("parallel-limit");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| format!("creating {}: {e}", path.display()))?;
        Ok(Self {
            file,
            end: AtomicU64::new(0),
            lengths: Mutex::new(HashMap::new()),
        })
    }
}

impl BlobSystem for ParallelLimit {
    fn write(&self, _thread: usize, blobs: &[&[u8]]) -> Result<Vec<u64>, String> {
        use std::os::unix::fs::FileExt;
        let total: usize = blobs.iter().map(|b| b.len()).sum();
        let start = self.end.fetch_add(total as u64, Ordering::Relaxed);
        let joined = blobs.concat();
        self.file
            .write_all_at(&joined, start)
            .and_then(|()| self.file.sync_data())
            .map_err(|e| format!("writing at {start}: {e}"))?;
        let mut keys = Vec::with_capacity(blobs.len());
        let mut lengths = self.lengths.lock();
        let mut at = start;
        for blob in blobs {
            keys.push(at);
            lengths.insert(at, blob.len());
            at += blob.len() as u64;
        }
        Ok(keys)
    }

    fn get(&self, _thread: usize, key: u64) -> Result<Option<usize>, String> {
        Ok(self.lengths.lock().get(&key).copied())
    }

    fn delete(&self, keys: &[u64]) -> Result<(), String> {
        let mut lengths = self.lengths.lock();
        for key in keys {
            lengths.remove(key);
        }
        Ok(())
    }
}

fn open_system(system: &str, dir: &Path) -> Result<Box<dyn BlobSystem>, String> {
    if system == "parallel-limit" {
        return Ok(Box::new(ParallelLimit::open(dir)?));
    }
    if !blob::ALL.contains(&system) {
        return Err(format!("unknown system {system:?}"));
    }
    blob::open(system, dir, THREADS)
}

fn child(system: &str, bytes: u64, dir: &Path) -> Result<(), String> {
    let mut store = open_system(system, dir)?;
    let started = Instant::now();
    let (mut stored, tenths) = fill(&*store, bytes, 1, system)?;
    println!("load_seconds {}", started.elapsed().as_secs_f64());
    println!(
        "tenths {}",
        tenths
            .iter()
            .map(|t| format!("{t:.1}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let live: u64 = stored.iter().map(|(_, len)| len).sum();
    println!("live_after_load {live}");
    println!("disk_after_load {}", store.bytes_on_disk(dir)?);

    // Delete every fourth blob (in the order they were committed per
    // thread, so deletes hit every part of the store).
    let mut doomed = Vec::new();
    let mut kept = Vec::new();
    for (i, blob) in stored.drain(..).enumerate() {
        if i % 4 == 0 {
            doomed.push(blob);
        } else {
            kept.push(blob);
        }
    }
    eprintln!("  {system}: deleting {} blobs", doomed.len());
    let keys: Vec<u64> = doomed.iter().map(|(key, _)| *key).collect();
    for chunk in keys.chunks(100) {
        store.delete(chunk)?;
    }
    if let Some(what) = store.reclaim()? {
        println!("reclaim {what}");
    }
    let live: u64 = kept.iter().map(|(_, len)| len).sum();
    println!("live_after_delete {live}");
    println!("disk_after_delete {}", store.bytes_on_disk(dir)?);

    let (more, _) = fill(&*store, bytes / 4, 2, system)?;
    let live = live + more.iter().map(|(_, len)| len).sum::<u64>();
    println!("live_after_more {live}");
    println!("disk_after_more {}", store.bytes_on_disk(dir)?);
    if let Some(&(key, len)) = more.last() {
        if store.get(0, key)? != Some(len as usize) {
            return Err(format!("blob {key} does not read back"));
        }
    }
    store.close()?;
    if let Some(kib) = peak_rss_kib() {
        println!("peak_rss_kib {kib}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_rss_is_read() {
        assert!(peak_rss_kib().is_some_and(|k| k > 0));
    }

    /// Run as a child by the test below: touches 64 MiB, then exits.
    #[test]
    fn touch_64_mib_when_asked() {
        if std::env::var_os("SCALE_TEST_TOUCH").is_some() {
            let block = vec![1_u8; 64 << 20];
            assert_eq!(block.iter().map(|b| u64::from(*b)).sum::<u64>(), 64 << 20);
        }
    }

    #[test]
    #[allow(clippy::zombie_processes)] // reaped by `wait4`, which the lint does not know
    fn wait4_reaps_the_child_with_its_status_and_its_own_peak_rss() {
        let exit3 = Command::new("sh").args(["-c", "exit 3"]).spawn().unwrap();
        let (status, _) = wait4(exit3.id()).unwrap();
        assert_eq!(status.code(), Some(3));

        let this = std::env::current_exe().unwrap();
        let run = |touch: bool| {
            let mut command = Command::new(&this);
            command
                .args(["--exact", "sections::scale::tests::touch_64_mib_when_asked"])
                .stdout(Stdio::null());
            if touch {
                command.env("SCALE_TEST_TOUCH", "1");
            }
            let (status, kib) = wait4(command.spawn().unwrap().id()).unwrap();
            assert!(status.success());
            kib
        };
        let grown = run(true);
        let idle = run(false);
        assert!(
            grown >= 64 * 1024,
            "a child that touched 64 MiB: {grown} KiB"
        );
        assert!(
            idle + 48 * 1024 < grown,
            "its own peak only: {idle} KiB, then {grown} KiB"
        );
    }

    #[test]
    fn the_peak_rss_cell_shows_vm_hwm_only_when_it_disagrees() {
        assert_eq!(
            peak_rss_cell(Some(30.0 * 1024.0), Some(30.5 * 1024.0)),
            "30"
        );
        assert_eq!(
            peak_rss_cell(Some(30.0 * 1024.0), Some(40.0 * 1024.0)),
            "30 (40)"
        );
        assert_eq!(peak_rss_cell(None, Some(40.0 * 1024.0)), "(40)");
        assert_eq!(peak_rss_cell(None, None), "");
    }

    #[test]
    fn small_fill_into_sediment() {
        let dir = temp_dir();
        let store = blob::open("sediment", dir.path(), THREADS).unwrap();
        let (stored, tenths) = fill(&*store, 4 << 20, 7, "test").unwrap();
        assert!(stored.iter().map(|(_, len)| len).sum::<u64>() >= 4 << 20);
        assert_eq!(tenths.len(), 10);
        assert!(tenths.iter().all(|t| *t > 0.0));
        let (key, len) = stored[0];
        assert_eq!(store.get(0, key).unwrap(), Some(len as usize));
        store.close().unwrap();
    }

    #[test]
    fn parallel_limit_keeps_every_blob_where_its_key_says() {
        let dir = temp_dir();
        let store = open_system("parallel-limit", dir.path()).unwrap();
        let (stored, _) = fill(&*store, 2 << 20, 3, "test").unwrap();
        let payload: u64 = stored.iter().map(|(_, len)| len).sum();
        assert!(payload >= 2 << 20);
        let file_len = std::fs::metadata(dir.path().join("parallel-limit"))
            .unwrap()
            .len();
        assert_eq!(file_len, payload);
        let mut keys: Vec<(u64, u64)> = stored.clone();
        keys.sort_unstable();
        // Keys are offsets: the blobs tile the file without gaps or overlap.
        let mut at = 0;
        for (key, len) in keys {
            assert_eq!(key, at);
            assert_eq!(store.get(0, key).unwrap(), Some(len as usize));
            at += len;
        }
        store.delete(&[stored[0].0]).unwrap();
        assert_eq!(store.get(0, stored[0].0).unwrap(), None);
        assert!(open_system("no-such-store", dir.path()).is_err());
    }
}
