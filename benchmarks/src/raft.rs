//! The `raft` section of `compare` (feature `raft`): replicated writes of
//! sediment-raft beside etcd, 3 nodes and 1 node of each as real
//! processes on loopback, driven by one HTTP load generator.
//!
//! - sediment-raft: the `sediment-raft` binary (built in release with
//!   cargo, or `SEDIMENT_RAFT_BIN`), one `sediment-raft node` process per
//!   node, initialized with `POST /cluster/init`; writes are
//!   `PUT /kv/{key}` to the leader.
//! - etcd: `benchmarks/etcd.sh start N` (Debian's etcd-server, default
//!   durability); writes are `POST /v3/kv/put` through etcd's JSON gateway
//!   to the leader, key and value base64-encoded.
//!
//! Every cell ({3, 1} nodes × {1, 16, 64} clients × {256 B, 4 KiB}) runs
//! in rounds, each system once per round, the order alternating; every
//! write is of a fresh key. One more round per cell counts the syncs each
//! node process makes, with `strace -c` attached to it.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::chart::{line_chart, Series};
use crate::harness::{self, Measurement};
use crate::replication::{
    etcd_put_body, median, ratio, strace_sync_calls, syncs_per_write_per_node,
};
use crate::report::{human_size, micros, rate, Table};
use crate::sections::{output, saved, Options};
use crate::{temp_dir, PayloadPool, Rng};

const NODES: [usize; 2] = [3, 1];
const CLIENTS: [usize; 3] = [1, 16, 64];
const PAYLOADS: [usize; 2] = [256, 4096];
/// The client counts of the 3-node ÷ 1-node table.
const SCALING_CLIENTS: [usize; 2] = [16, 64];
/// sediment-raft's heartbeat, etcd's default one (`--heartbeat-interval`).
const HEARTBEAT_MS: u64 = 100;
/// The system calls `strace` counts.
const TRACED: &str = "trace=fsync,fdatasync,sync_file_range";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum System {
    SedimentRaft,
    Etcd,
}

impl System {
    fn name(self) -> &'static str {
        match self {
            System::SedimentRaft => "sediment-raft",
            System::Etcd => "etcd",
        }
    }
}

const SYSTEMS: [System; 2] = [System::SedimentRaft, System::Etcd];

/// What stops a cluster's processes and removes its data.
enum Processes {
    /// `sediment-raft node` children, and the directory of their data and
    /// logs.
    Nodes {
        children: Vec<Child>,
        _dir: tempfile::TempDir,
    },
    /// Members started by `etcd.sh` with `ETCD_BENCH_DATA` = `dir`.
    Etcd {
        script: PathBuf,
        dir: tempfile::TempDir,
    },
}

/// A running cluster of one system.
struct Cluster {
    system: System,
    /// Each node's base URL (`http://127.0.0.1:PORT`), in node order
    /// (sediment-raft node id `i + 1` at index `i`).
    urls: Vec<String>,
    /// Each node's process id, in the same order.
    pids: Vec<u32>,
    /// The index of the node writes go to.
    leader: AtomicUsize,
    /// Version and configuration, for the notes.
    about: String,
    /// The leader's term once the cluster was up: a later one means an
    /// election during the measurements.
    term: u64,
    processes: Processes,
}

/// What a cluster says about itself: the node that leads, its term, and
/// the version of the software (etcd only).
struct Survey {
    leader: usize,
    term: u64,
    version: Option<String>,
}

impl Cluster {
    fn nodes(&self) -> usize {
        self.urls.len()
    }

    /// Asks the nodes which one leads; `None` until a node that leads
    /// answers for itself.
    fn survey(&self, load: &LoadGenerator) -> Option<Survey> {
        for (i, url) in self.urls.iter().enumerate() {
            match self.system {
                System::SedimentRaft => {
                    let Ok(metrics) = load.json(&format!("{url}/cluster/metrics"), None) else {
                        continue;
                    };
                    if metrics["current_leader"].as_u64() == Some(i as u64 + 1) {
                        return Some(Survey {
                            leader: i,
                            term: metrics["current_term"].as_u64()?,
                            version: None,
                        });
                    }
                }
                System::Etcd => {
                    // uint64 fields are strings in the gateway's JSON.
                    let Ok(status) =
                        load.json(&format!("{url}/v3/maintenance/status"), Some("{}".into()))
                    else {
                        continue;
                    };
                    let member = status["header"]["member_id"].as_str();
                    if member.is_some() && member == status["leader"].as_str() {
                        return Some(Survey {
                            leader: i,
                            term: status["header"]["raft_term"].as_str()?.parse().ok()?,
                            version: status["version"].as_str().map(str::to_string),
                        });
                    }
                }
            }
        }
        None
    }
}

impl Cluster {
    /// What may explain a cluster without a leader: each member process
    /// that has exited with its log's last line, and the space left on
    /// the disk of its data.
    fn why_down(&self) -> String {
        let (dir, logs): (&Path, Vec<PathBuf>) = match &self.processes {
            Processes::Nodes { _dir: dir, .. } => (
                dir.path(),
                (1..=self.pids.len())
                    .map(|id| dir.path().join(format!("node-{id}.log")))
                    .collect(),
            ),
            Processes::Etcd { dir, .. } => (
                dir.path(),
                (1..=self.pids.len())
                    .map(|i| dir.path().join(format!("m{i}.log")))
                    .collect(),
            ),
        };
        let mut why = String::new();
        for (pid, log) in self.pids.iter().zip(&logs) {
            if !running(*pid) {
                why.push_str(&format!(
                    "; process {pid} exited, its log ends: {:?}",
                    tail(log, 1)
                ));
            }
        }
        if let Some(free) = free_bytes(dir) {
            why.push_str(&format!(
                "; {:.1} GB free on the data's disk",
                free as f64 / 1e9
            ));
        }
        why
    }
}

/// Whether process `pid` runs: it exists and is not a zombie (a child
/// that exited and was not waited for yet).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // The state follows the command name, which is in parentheses.
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

/// Bytes an unprivileged user may still write on the file system of `dir`.
fn free_bytes(dir: &Path) -> Option<u64> {
    let path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: `path` is a NUL-terminated string and `stat` a zeroed
    // statvfs that statvfs(3) fills in; neither outlives the call.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return None;
    }
    Some(stat.f_bavail.saturating_mul(stat.f_frsize))
}

impl Drop for Cluster {
    fn drop(&mut self) {
        match &mut self.processes {
            Processes::Nodes { children, .. } => {
                for child in children.iter() {
                    terminate(child.id());
                }
                for child in children.iter_mut() {
                    wait_or_kill(child, Duration::from_secs(10));
                }
            }
            Processes::Etcd { script, dir } => {
                let stopped = Command::new("bash")
                    .arg(&*script)
                    .arg("stop")
                    .env("ETCD_BENCH_DATA", dir.path())
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .status();
                if !matches!(stopped, Ok(status) if status.success()) {
                    eprintln!("raft: etcd.sh stop failed ({stopped:?})");
                }
            }
        }
    }
}

/// Sends SIGTERM to a process this section started.
fn terminate(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        // SAFETY: kill(2) with a valid signal has no memory effects.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
}

/// Sends SIGINT to a process this section started.
fn interrupt(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        // SAFETY: kill(2) with a valid signal has no memory effects.
        unsafe {
            libc::kill(pid, libc::SIGINT);
        }
    }
}

/// Waits for a child to exit, killing it after `within`.
fn wait_or_kill(child: &mut Child, within: Duration) {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return,
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The last lines of a log file, for error messages.
fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The one HTTP client of both systems: reqwest on a tokio runtime, one
/// keep-alive connection per client thread.
struct LoadGenerator {
    runtime: tokio::runtime::Runtime,
    client: reqwest::Client,
}

impl LoadGenerator {
    fn new() -> Result<Self, String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(256)
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self { runtime, client })
    }

    /// One write of `key`, acknowledged by the cluster (committed by a
    /// quorum). sediment-raft's redirects (307) and "no leader yet" (503)
    /// move the writes to the leader they name.
    fn put(&self, cluster: &Cluster, key: &str, value: &[u8]) -> Result<(), String> {
        self.runtime.handle().block_on(async {
            for _ in 0..20 {
                let base = &cluster.urls[cluster.leader.load(Ordering::Relaxed)];
                let request = match cluster.system {
                    System::SedimentRaft => self
                        .client
                        .put(format!("{base}/kv/{key}"))
                        .body(value.to_vec()),
                    System::Etcd => self
                        .client
                        .post(format!("{base}/v3/kv/put"))
                        .header(reqwest::header::CONTENT_TYPE, "application/json")
                        .body(etcd_put_body(key.as_bytes(), value)),
                };
                let response = request.send().await.map_err(|e| e.to_string())?;
                let status = response.status().as_u16();
                let body = response.bytes().await.map_err(|e| e.to_string())?;
                match (cluster.system, status) {
                    (_, 200) => return Ok(()),
                    (System::SedimentRaft, 307 | 503) => {
                        let answer: serde_json::Value =
                            serde_json::from_slice(&body).unwrap_or_default();
                        match answer["leader_id"].as_u64() {
                            Some(id) if (1..=cluster.nodes() as u64).contains(&id) => {
                                cluster.leader.store(id as usize - 1, Ordering::Relaxed);
                            }
                            _ => tokio::time::sleep(Duration::from_millis(50)).await,
                        }
                    }
                    _ => {
                        let text = String::from_utf8_lossy(&body[..body.len().min(300)]);
                        return Err(format!(
                            "{} answered {status}: {text}",
                            cluster.system.name()
                        ));
                    }
                }
            }
            Err("no stable leader after 20 tries".to_string())
        })
    }

    /// A JSON request during setup: GET without a body, POST with one.
    fn json(&self, url: &str, body: Option<String>) -> Result<serde_json::Value, String> {
        self.runtime.handle().block_on(async {
            let request = match body {
                None => self.client.get(url),
                Some(body) => self
                    .client
                    .post(url)
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body),
            };
            let response = request
                .timeout(Duration::from_secs(5))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            let status = response.status();
            let text = response.text().await.map_err(|e| e.to_string())?;
            if !status.is_success() {
                return Err(format!("{url} answered {status}: {text}"));
            }
            serde_json::from_str(&text).map_err(|e| format!("{url}: {e}: {text}"))
        })
    }
}

/// The `sediment-raft` binary: `SEDIMENT_RAFT_BIN`, else a release build
/// made with cargo into this program's target directory (up to date when
/// cargo is there; an existing build otherwise).
fn sediment_raft_binary() -> Result<PathBuf, String> {
    if let Some(bin) = std::env::var_os("SEDIMENT_RAFT_BIN") {
        let bin = PathBuf::from(bin);
        return if bin.is_file() {
            Ok(bin)
        } else {
            Err(format!("SEDIMENT_RAFT_BIN={} is not a file", bin.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let layout = crate::relaunch::layout(&exe)
        .ok_or_else(|| format!("no target directory above {}", exe.display()))?;
    let bin = layout.target_dir.join("release").join("sediment-raft");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
    eprintln!(
        "raft: building sediment-raft (release) into {}",
        layout.target_dir.display()
    );
    let built = Command::new(&cargo)
        .args(["build", "--release", "-p", "sediment-raft", "--bin"])
        .arg("sediment-raft")
        .arg("--manifest-path")
        .arg(manifest)
        .arg("--target-dir")
        .arg(&layout.target_dir)
        .stdin(Stdio::null())
        .status();
    let why = match built {
        Ok(status) if status.success() => return Ok(bin),
        Ok(status) => format!("cargo build -p sediment-raft failed ({status})"),
        Err(e) => format!("could not run cargo ({e})"),
    };
    if bin.is_file() {
        eprintln!("raft: {why}; using the existing {}", bin.display());
        Ok(bin)
    } else {
        Err(why)
    }
}

/// Free ports on 127.0.0.1: all bound at once, so that none repeats.
fn free_ports(count: usize) -> Result<Vec<u16>, String> {
    let listeners = (0..count)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("finding a free port: {e}"))?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("finding a free port: {e}"))
}

/// Starts `nodes` sediment-raft processes, initializes the cluster and
/// waits until every node knows the leader.
fn start_sediment_raft(bin: &Path, nodes: usize, load: &LoadGenerator) -> Result<Cluster, String> {
    let dir = temp_dir();
    let ports = free_ports(nodes)?;
    let mut children = Vec::new();
    let mut spawn_error = None;
    for (i, port) in ports.iter().enumerate() {
        let id = i + 1;
        let log = std::fs::File::create(dir.path().join(format!("node-{id}.log")))
            .map_err(|e| e.to_string())?;
        let child = Command::new(bin)
            .arg("node")
            .args(["--id", &id.to_string()])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--dir")
            .arg(dir.path().join(format!("node-{id}")))
            .args(["--heartbeat-ms", &HEARTBEAT_MS.to_string()])
            // Warnings and errors only in the node's log: no log line per
            // write in the measurements.
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn();
        match child {
            Ok(child) => children.push(child),
            Err(e) => {
                spawn_error = Some(format!("starting {}: {e}", bin.display()));
                break;
            }
        }
    }
    let log_dir = dir.path().to_path_buf();
    let mut cluster = Cluster {
        system: System::SedimentRaft,
        urls: ports
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect(),
        pids: children.iter().map(Child::id).collect(),
        leader: AtomicUsize::new(0),
        about: format!("sediment-raft: {}", bin.display()),
        term: 0,
        processes: Processes::Nodes {
            children,
            _dir: dir,
        },
    };
    if let Some(e) = spawn_error {
        return Err(e);
    }
    let died = |cluster: &mut Cluster| -> Option<String> {
        let Processes::Nodes { children, .. } = &mut cluster.processes else {
            return None;
        };
        for (i, child) in children.iter_mut().enumerate() {
            if let Ok(Some(status)) = child.try_wait() {
                let log = log_dir.join(format!("node-{}.log", i + 1));
                return Some(format!(
                    "node {} exited ({status}):\n{}",
                    i + 1,
                    tail(&log, 10)
                ));
            }
        }
        None
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    for url in cluster.urls.clone() {
        while load.json(&format!("{url}/cluster/metrics"), None).is_err() {
            if let Some(e) = died(&mut cluster) {
                return Err(e);
            }
            if Instant::now() > deadline {
                return Err(format!("{url} did not answer within 60 s"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let members: BTreeMap<String, String> = ports
        .iter()
        .enumerate()
        .map(|(i, port)| ((i + 1).to_string(), format!("127.0.0.1:{port}")))
        .collect();
    let body = serde_json::json!({ "members": members }).to_string();
    load.json(&format!("{}/cluster/init", cluster.urls[0]), Some(body))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(survey) = cluster.survey(load) {
            cluster.leader.store(survey.leader, Ordering::Relaxed);
            cluster.term = survey.term;
            return Ok(cluster);
        }
        if let Some(e) = died(&mut cluster) {
            return Err(e);
        }
        if Instant::now() > deadline {
            return Err("no leader within 30 s".to_string());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `benchmarks/etcd.sh`, beside this crate's manifest.
fn etcd_script() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/etcd.sh"))
}

/// Runs `etcd.sh ARGS` for the cluster in `dir`; its stdout, or why not
/// (the script's last lines of stderr).
fn etcd_sh(script: &Path, dir: &Path, args: &[&str]) -> Result<String, String> {
    let output = Command::new("bash")
        .arg(script)
        .args(args)
        .env("ETCD_BENCH_DATA", dir)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if output.status.success() {
        for line in stderr.lines().filter(|l| l.starts_with("etcd.sh:")) {
            eprintln!("raft: {line}");
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
    } else {
        eprint!("{stderr}");
        // The script's own last word, else whatever came last.
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        let why = lines
            .iter()
            .rev()
            .find_map(|l| l.strip_prefix("etcd.sh: "))
            .or(lines.last().copied())
            .unwrap_or("no message");
        Err(format!(
            "etcd.sh {} failed ({}): {why}",
            args.join(" "),
            output.status
        ))
    }
}

/// Starts an etcd cluster of `members` with `etcd.sh` and finds its
/// leader.
fn start_etcd(members: usize, load: &LoadGenerator) -> Result<Cluster, String> {
    let script = etcd_script();
    if !script.is_file() {
        return Err(format!("{} not found", script.display()));
    }
    let dir = temp_dir();
    let dir_path = dir.path().to_path_buf();
    let urls = etcd_sh(&script, &dir_path, &["start", &members.to_string()])?;
    let mut cluster = Cluster {
        system: System::Etcd,
        urls: urls.split(',').map(str::to_string).collect(),
        pids: Vec::new(),
        leader: AtomicUsize::new(0),
        about: String::new(),
        term: 0,
        processes: Processes::Etcd {
            script: script.clone(),
            dir,
        },
    };
    let pids: Vec<u32> = etcd_sh(&script, &dir_path, &["pids"])?
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    if pids.len() != members || cluster.urls.len() != members {
        return Err(format!(
            "etcd.sh started {} member(s) with {} process id(s), not {members}",
            cluster.urls.len(),
            pids.len()
        ));
    }
    cluster.pids = pids;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(survey) = cluster.survey(load) {
            cluster.leader.store(survey.leader, Ordering::Relaxed);
            cluster.term = survey.term;
            cluster.about = format!(
                "etcd {} (Debian's etcd-server, started by benchmarks/etcd.sh)",
                survey.version.as_deref().unwrap_or("of unknown version")
            );
            return Ok(cluster);
        }
        if Instant::now() > deadline {
            return Err("no etcd leader found within 30 s".to_string());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `strace`, installed with apt-get when missing and running as root.
fn strace_binary() -> Result<PathBuf, String> {
    let find = || {
        ["/usr/bin/strace", "/bin/strace", "/usr/local/bin/strace"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
    };
    if let Some(bin) = find() {
        return Ok(bin);
    }
    // SAFETY: geteuid(2) cannot fail and touches no memory.
    if unsafe { libc::geteuid() } != 0 {
        return Err("strace is not installed and installing it needs root".into());
    }
    eprintln!("raft: installing Debian's strace");
    let installed = Command::new("apt-get")
        .arg("update")
        .stdout(Stdio::null())
        .status()
        .and_then(|_| {
            Command::new("apt-get")
                .args(["install", "-y", "--no-install-recommends", "strace"])
                .env("DEBIAN_FRONTEND", "noninteractive")
                .stdout(Stdio::null())
                .status()
        });
    match (installed, find()) {
        (_, Some(bin)) => Ok(bin),
        (Ok(status), None) => Err(format!("apt-get install strace failed ({status})")),
        (Err(e), None) => Err(format!("could not run apt-get ({e})")),
    }
}

/// One `strace -f -c` attached to a node process.
struct Tracer {
    child: Child,
    summary: PathBuf,
    attached: mpsc::Receiver<()>,
    stderr: std::thread::JoinHandle<Vec<String>>,
}

impl Tracer {
    fn attach(strace: &Path, pid: u32, summary: PathBuf) -> Result<Self, String> {
        let mut child = Command::new(strace)
            .args(["-f", "-c", "-e", TRACED, "-o"])
            .arg(&summary)
            .args(["-p", &pid.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting strace: {e}"))?;
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, attached) = mpsc::channel();
        let stderr = std::thread::spawn(move || {
            let mut lines = Vec::new();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("attached") {
                    let _ = tx.send(());
                }
                lines.push(line);
            }
            lines
        });
        Ok(Self {
            child,
            summary,
            attached,
            stderr,
        })
    }

    /// Stops tracing (SIGINT: strace detaches and writes its summary) and
    /// returns the sync calls it counted, or why not.
    fn finish(mut self) -> Result<u64, String> {
        interrupt(self.child.id());
        wait_or_kill(&mut self.child, Duration::from_secs(20));
        let stderr = self.stderr.join().unwrap_or_default();
        let text = std::fs::read_to_string(&self.summary)
            .map_err(|e| format!("reading strace's summary: {e}"))?;
        strace_sync_calls(&text).ok_or_else(|| {
            format!(
                "strace wrote no summary: {} {}",
                text.trim(),
                stderr.join(" / ")
            )
        })
    }
}

/// What the strace round of one system in one cell counted.
struct SyncCount {
    /// Acknowledged writes.
    writes: u64,
    /// Syncs of each node process, in node order.
    per_node: Vec<u64>,
    /// The index of the node the writes went to.
    leader: usize,
}

/// Runs `work` (which returns the writes it got acknowledged) with strace
/// attached to every node process of `cluster`.
fn count_syncs(
    strace: &Path,
    cluster: &Cluster,
    dir: &Path,
    work: impl FnOnce() -> Result<u64, String>,
) -> Result<SyncCount, String> {
    let mut tracers = Vec::new();
    let mut failed = None;
    for (i, &pid) in cluster.pids.iter().enumerate() {
        match Tracer::attach(strace, pid, dir.join(format!("strace-{i}.txt"))) {
            Ok(tracer) => tracers.push(tracer),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    if failed.is_none() {
        for (tracer, pid) in tracers.iter().zip(&cluster.pids) {
            if tracer
                .attached
                .recv_timeout(Duration::from_secs(10))
                .is_err()
            {
                failed = Some(format!("strace did not attach to process {pid}"));
                break;
            }
        }
    }
    let writes = match failed {
        Some(e) => Err(e),
        None => {
            let writes = work();
            // The followers' syncs of the last entries.
            std::thread::sleep(Duration::from_millis(300));
            writes
        }
    };
    let counts: Vec<Result<u64, String>> = tracers.into_iter().map(Tracer::finish).collect();
    let writes = writes?;
    let per_node = counts.into_iter().collect::<Result<Vec<_>, _>>()?;
    Ok(SyncCount {
        writes,
        per_node,
        leader: cluster.leader.load(Ordering::Relaxed),
    })
}

/// A fresh key: never written before in this cluster.
fn key(cell: usize, round: usize, client: usize, i: u64) -> String {
    format!("c{cell}-r{round}-t{client}-{i}")
}

/// The cells of one cluster size, in run order: (value bytes, clients),
/// those `--payloads` and `--threads` name if given.
fn cells(options: &Options) -> Vec<(usize, usize)> {
    let payloads = options.payloads.clone().unwrap_or(PAYLOADS.to_vec());
    let clients = options.threads.clone().unwrap_or(CLIENTS.to_vec());
    payloads
        .iter()
        .flat_map(|&len| clients.iter().map(move |&clients| (len, clients)))
        .collect()
}

/// `1 node`, `3 nodes`.
fn node_count(nodes: usize) -> String {
    if nodes == 1 {
        "1 node".to_string()
    } else {
        format!("{nodes} nodes")
    }
}

/// Says a note at once on stderr and keeps it for under the table.
fn note(text: String, notes: &mut Vec<String>) {
    eprintln!("raft: {text}");
    if !notes.contains(&text) {
        notes.push(text);
    }
}

/// (nodes, clients, value bytes, system).
type CellKey = (usize, usize, usize, System);

/// Runs the section: prints its tables and writes `raft.csv`,
/// `raft-syncs.csv`, `raft-scaling.csv` and a chart per cluster size.
#[allow(clippy::too_many_lines)]
pub fn run(options: &Options) -> Vec<PathBuf> {
    let rounds = options
        .rounds
        .unwrap_or(if options.quick { 2 } else { 6 })
        .max(1);
    let seconds = options
        .seconds
        .unwrap_or(if options.quick { 1.0 } else { 3.0 });
    let duration = Duration::from_secs_f64(seconds);
    let warmup = Duration::from_millis(if options.quick { 200 } else { 500 });
    // Writes of the strace round: what the slower system made untraced in
    // this many seconds, at least 4 per client.
    let traced_seconds = if options.quick { 0.2 } else { 0.5 };
    println!("## Replication (raft): sediment-raft and etcd\n");
    println!(
        "Each cell: N clients, each writing a fresh key per write and waiting for the \
         answer, from one load generator (reqwest on tokio, one keep-alive HTTP/1.1 \
         connection per client) to the leader of a cluster of node processes on \
         127.0.0.1 with their data on the project's disk. sediment-raft: `PUT /kv/{{key}}` \
         with the raw value, nodes started with `--heartbeat-ms {HEARTBEAT_MS}` and \
         initialized with `POST /cluster/init`. etcd: `POST /v3/kv/put` through its JSON \
         gateway, key and value base64-encoded, default durability. A write counts once \
         the leader answers (committed by a quorum). {rounds} round(s) of {seconds} s \
         (after {} ms of warm-up) per system and cell, the systems alternating which goes \
         first; medians over the rounds.\n",
        warmup.as_millis()
    );
    let load = match LoadGenerator::new() {
        Ok(load) => load,
        Err(e) => {
            eprintln!("raft section skipped: {e}");
            println!("Skipped: no HTTP client ({e}).\n");
            return Vec::new();
        }
    };
    let mut notes: Vec<String> = Vec::new();
    let bin = sediment_raft_binary();
    if let Err(e) = &bin {
        note(format!("sediment-raft skipped: {e}"), &mut notes);
    }
    let strace = strace_binary();
    if let Err(e) = &strace {
        note(format!("syncs not measured: {e}"), &mut notes);
    }
    let mut results: BTreeMap<CellKey, Vec<Measurement>> = BTreeMap::new();
    let mut syncs: BTreeMap<CellKey, SyncCount> = BTreeMap::new();
    let mut about: Vec<String> = Vec::new();
    for nodes in options.nodes.clone().unwrap_or(NODES.to_vec()) {
        let count = node_count(nodes);
        let mut clusters: Vec<Cluster> = Vec::new();
        let bin = bin
            .as_ref()
            .ok()
            .filter(|_| options.wanted("sediment-raft"));
        if let Some(bin) = bin {
            eprintln!("raft: starting {nodes} sediment-raft node(s)");
            match start_sediment_raft(bin, nodes, &load) {
                Ok(cluster) => clusters.push(cluster),
                Err(e) => note(
                    format!("sediment-raft ({}) skipped: {e}", node_count(nodes)),
                    &mut notes,
                ),
            }
        }
        if options.wanted("etcd") {
            eprintln!("raft: starting {nodes} etcd member(s)");
            match start_etcd(nodes, &load) {
                Ok(cluster) => clusters.push(cluster),
                Err(e) => note(
                    format!("etcd ({}) skipped: {e}", node_count(nodes)),
                    &mut notes,
                ),
            }
        }
        for cluster in &clusters {
            if !about.contains(&cluster.about) {
                about.push(cluster.about.clone());
            }
        }
        for (cell, (len, clients)) in cells(options).into_iter().enumerate() {
            let pool = PayloadPool::new(len, 11);
            let label = human_size(len as u64);
            for round in 0..rounds {
                // etcd answers on every member, so a change of leader
                // would go unseen without asking.
                for cluster in &clusters {
                    if let Some(survey) = cluster.survey(&load) {
                        cluster.leader.store(survey.leader, Ordering::Relaxed);
                    }
                }
                let order: Vec<&Cluster> = if round % 2 == 0 {
                    clusters.iter().collect()
                } else {
                    clusters.iter().rev().collect()
                };
                for cluster in order {
                    let system = cluster.system;
                    let result = harness::run(clients, warmup, duration, |client, i| {
                        let mut rng =
                            Rng::new(i ^ ((client as u64) << 32) ^ ((round as u64) << 48));
                        let value = pool.slice(len, &mut rng);
                        load.put(cluster, &key(cell, round, client, i), value)?;
                        Ok(len as u64)
                    });
                    match result {
                        Ok(m) => {
                            if m.operations == 0 {
                                note(
                                    format!(
                                        "{}, {count}, {clients} clients, {label}, round {}: \
                                         no write acknowledged in the {seconds} s window \
                                         (0 writes/s; no latency)",
                                        system.name(),
                                        round + 1
                                    ),
                                    &mut notes,
                                );
                            }
                            eprintln!(
                                "raft {count}, {clients} clients, {label}, round {}/{rounds}: \
                                 {} {} writes/s, p50 {} µs, p99 {} µs",
                                round + 1,
                                system.name(),
                                rate(m.per_second()),
                                micros(m.p50),
                                micros(m.p99)
                            );
                            results
                                .entry((nodes, clients, len, system))
                                .or_default()
                                .push(m);
                        }
                        Err(e) => note(
                            format!(
                                "{}, {count}, {clients} clients, {label}, round {}: {e}",
                                system.name(),
                                round + 1
                            ),
                            &mut notes,
                        ),
                    }
                }
            }
            let Ok(strace) = &strace else { continue };
            let slowest = clusters
                .iter()
                .filter_map(|c| {
                    let rates: Vec<f64> = results
                        .get(&(nodes, clients, len, c.system))?
                        .iter()
                        .map(Measurement::per_second)
                        .collect();
                    median(&rates)
                })
                .fold(f64::INFINITY, f64::min);
            if !slowest.is_finite() {
                continue;
            }
            let per_client = ((slowest * traced_seconds / clients as f64).ceil() as u64).max(4);
            for cluster in &clusters {
                let system = cluster.system;
                let dir = temp_dir();
                let counted = count_syncs(strace, cluster, dir.path(), || {
                    harness::run_fixed_samples(clients, per_client, |client, i| {
                        let mut rng = Rng::new(i ^ ((client as u64) << 32));
                        let value = pool.slice(len, &mut rng);
                        load.put(cluster, &key(cell, rounds, client, i), value)?;
                        Ok(len as u64)
                    })
                    .map(|s| s.latencies.len() as u64)
                });
                match counted {
                    Ok(synced) => {
                        eprintln!(
                            "raft {count}, {clients} clients, {label}, traced: {} {} \
                             writes, syncs per node {:?}",
                            system.name(),
                            synced.writes,
                            synced.per_node
                        );
                        syncs.insert((nodes, clients, len, system), synced);
                    }
                    Err(e) => note(
                        format!(
                            "syncs of {} not measured ({count}, {clients} clients, \
                             {label}): {e}",
                            system.name()
                        ),
                        &mut notes,
                    ),
                }
            }
        }
        for cluster in &clusters {
            let name = cluster.system.name();
            match cluster.survey(&load) {
                Some(survey) if survey.term != cluster.term => note(
                    format!(
                        "{name} ({count}): the leader's term went from {} to {} during \
                         the measurements (an election: writes wait for the new leader)",
                        cluster.term, survey.term
                    ),
                    &mut notes,
                ),
                Some(_) => {}
                None => note(
                    format!(
                        "{name} ({count}): no leader after the measurements{}",
                        cluster.why_down()
                    ),
                    &mut notes,
                ),
            }
        }
        eprintln!("raft: stopping the {nodes}-node clusters");
        drop(clusters);
    }
    report(
        options,
        &results,
        &syncs,
        &about,
        &notes,
        traced_seconds,
        rounds,
    )
}

/// The medians of one system's rounds in one cell: writes/s, p50, p99.
fn medians(rounds: Option<&Vec<Measurement>>) -> Option<(f64, Option<Duration>, Option<Duration>)> {
    let rounds = rounds?;
    let per_second: Vec<f64> = rounds.iter().map(Measurement::per_second).collect();
    // A round without a single acknowledged write has no latencies.
    let timed = rounds.iter().filter(|m| m.operations > 0);
    let p50: Vec<f64> = timed.clone().map(|m| m.p50.as_secs_f64()).collect();
    let p99: Vec<f64> = timed.map(|m| m.p99.as_secs_f64()).collect();
    Some((
        median(&per_second)?,
        median(&p50).map(Duration::from_secs_f64),
        median(&p99).map(Duration::from_secs_f64),
    ))
}

/// Prints the tables and writes the CSV files and charts.
#[allow(clippy::too_many_lines)]
fn report(
    options: &Options,
    results: &BTreeMap<CellKey, Vec<Measurement>>,
    syncs: &BTreeMap<CellKey, SyncCount>,
    about: &[String],
    notes: &[String],
    traced_seconds: f64,
    rounds: usize,
) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut table = Table::new(&[
        "nodes#",
        "clients#",
        "value",
        "sediment-raft writes/s#",
        "sediment-raft p50 µs#",
        "sediment-raft p99 µs#",
        "etcd writes/s#",
        "etcd p50 µs#",
        "etcd p99 µs#",
        "sediment-raft ÷ etcd#",
    ]);
    for text in about {
        table.note(text.clone());
    }
    for text in notes {
        table.note(text.clone());
    }
    for nodes in NODES {
        for (len, clients) in cells(options) {
            let mut row = vec![
                nodes.to_string(),
                clients.to_string(),
                human_size(len as u64),
            ];
            let mut rates = Vec::new();
            for system in SYSTEMS {
                match medians(results.get(&(nodes, clients, len, system))) {
                    Some((per_second, p50, p99)) => {
                        rates.push(Some(per_second));
                        row.extend([
                            rate(per_second),
                            p50.map_or(String::new(), micros),
                            p99.map_or(String::new(), micros),
                        ]);
                    }
                    None => {
                        rates.push(None);
                        row.extend([String::new(), String::new(), String::new()]);
                    }
                }
            }
            if rates.iter().all(Option::is_none) {
                continue;
            }
            row.push(ratio(rates[0], rates[1]).map_or(String::new(), |r| format!("{r:.2}")));
            table.row(row);
        }
    }
    println!("### Writes ({rounds} round(s), medians)\n");
    print!("{}", table.to_markdown());
    println!();
    let path = output(options, "raft.csv");
    saved(table.write_csv(&path), &path, &mut files);

    let mut scaling = Table::new(&[
        "system",
        "clients#",
        "value",
        "3 nodes writes/s#",
        "1 node writes/s#",
        "3 nodes ÷ 1 node#",
    ]);
    for system in SYSTEMS {
        for len in PAYLOADS {
            for clients in SCALING_CLIENTS {
                let three = medians(results.get(&(3, clients, len, system))).map(|m| m.0);
                let one = medians(results.get(&(1, clients, len, system))).map(|m| m.0);
                if three.is_none() && one.is_none() {
                    continue;
                }
                scaling.row(vec![
                    system.name().into(),
                    clients.to_string(),
                    human_size(len as u64),
                    three.map_or(String::new(), rate),
                    one.map_or(String::new(), rate),
                    ratio(three, one).map_or(String::new(), |r| format!("{r:.2}")),
                ]);
            }
        }
    }
    println!("### Replication cost: 3-node ÷ 1-node throughput\n");
    print!("{}", scaling.to_markdown());
    println!();
    let path = output(options, "raft-scaling.csv");
    saved(scaling.write_csv(&path), &path, &mut files);

    let mut sync_table = Table::new(&[
        "nodes#",
        "clients#",
        "value",
        "system",
        "writes#",
        "syncs per node",
        "syncs ÷ write ÷ node#",
    ]);
    for nodes in NODES {
        for (len, clients) in cells(options) {
            for system in SYSTEMS {
                let Some(count) = syncs.get(&(nodes, clients, len, system)) else {
                    continue;
                };
                let per_node: Vec<String> = count
                    .per_node
                    .iter()
                    .enumerate()
                    .map(|(i, n)| {
                        let mark = if i == count.leader && nodes > 1 {
                            "*"
                        } else {
                            ""
                        };
                        format!("{}{mark}", rate(*n as f64))
                    })
                    .collect();
                let total = count.per_node.iter().sum();
                sync_table.row(vec![
                    nodes.to_string(),
                    clients.to_string(),
                    human_size(len as u64),
                    system.name().into(),
                    rate(count.writes as f64),
                    per_node.join(" / "),
                    syncs_per_write_per_node(total, count.writes, nodes)
                        .map_or(String::new(), |r| format!("{r:.2}")),
                ]);
            }
        }
    }
    sync_table.note(
        "`*` marks the node the writes went to (the leader). Tracing stops a node at every \
         system call, so writes queue up more than untraced and may share more of each sync: \
         this round's rate is not a result.",
    );
    println!("### Syncs per write per node (one more round per cell, strace attached)\n");
    println!(
        "`strace -f -c -e {TRACED} -p PID` attached to every node process of the cluster \
         from before the round's first write until 300 ms after its last; the same number \
         of writes for both systems (what the slower one made untraced in {traced_seconds} \
         s, at least 4 per client); total syncs ÷ acknowledged writes ÷ nodes.\n"
    );
    print!("{}", sync_table.to_markdown());
    println!();
    let path = output(options, "raft-syncs.csv");
    saved(sync_table.write_csv(&path), &path, &mut files);

    let labels: Vec<String> = CLIENTS.iter().map(ToString::to_string).collect();
    for nodes in NODES {
        let mut series = Vec::new();
        for len in PAYLOADS {
            for system in SYSTEMS {
                let values: Vec<Option<f64>> = CLIENTS
                    .iter()
                    .map(|&clients| {
                        medians(results.get(&(nodes, clients, len, system))).map(|m| m.0)
                    })
                    .collect();
                if values.iter().any(Option::is_some) {
                    series.push(Series {
                        name: format!("{} {}", system.name(), human_size(len as u64)),
                        values,
                    });
                }
            }
        }
        if series.is_empty() {
            continue;
        }
        let name = if nodes == 1 {
            "raft-1-node.svg".to_string()
        } else {
            format!("raft-{nodes}-nodes.svg")
        };
        let path = output(options, &name);
        saved(
            line_chart(
                &path,
                &format!(
                    "Replicated writes/s, {nodes} node{}",
                    if nodes == 1 { "" } else { "s" }
                ),
                "clients",
                "writes/s",
                &labels,
                &series,
            ),
            &path,
            &mut files,
        );
    }
    files
}
