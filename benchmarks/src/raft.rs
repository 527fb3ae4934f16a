//! The `raft` section of `compare` (feature `raft`): replicated `PUT`
//! throughput and latency of a 3-node `sediment-raft` cluster on loopback
//! (HTTP client → leader → quorum → applied), beside single-node sediment
//! transactions (one blob written and the previous one archived per
//! commit) measured in the same run on the same disk.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sediment_raft::node::{self, NodeConfig, RunningNode};

use crate::harness::{self, Measurement};
use crate::report::{micros, rate, Table};
use crate::sections::Options;
use crate::{temp_dir, PayloadPool, Rng};

const THREADS: [usize; 2] = [1, 16];
const PAYLOADS: [usize; 2] = [256, 4096];
/// Keys per client thread: values are overwritten, so the state machine
/// archives and frees grains as a long-running service would.
const KEYS_PER_THREAD: u64 = 1000;

struct Cluster {
    runtime: tokio::runtime::Runtime,
    nodes: Vec<RunningNode>,
    leader: Arc<AtomicU64>,
    client: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl Cluster {
    fn start() -> Result<Self, String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let dir = temp_dir();
        let nodes = runtime.block_on(async {
            let mut nodes = Vec::new();
            for id in 1..=3 {
                let config = NodeConfig {
                    heartbeat_ms: 100,
                    ..NodeConfig::new(
                        id,
                        "127.0.0.1:0".parse().expect("an address"),
                        dir.path().join(format!("node-{id}")),
                    )
                };
                nodes.push(node::start(config).await.map_err(|e| e.to_string())?);
            }
            Ok::<_, String>(nodes)
        })?;
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(64)
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| e.to_string())?;
        let members: BTreeMap<String, String> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| ((i + 1).to_string(), n.addr.to_string()))
            .collect();
        let leader = runtime.block_on(async {
            let init = client
                .post(format!("http://{}/cluster/init", nodes[0].addr))
                .json(&serde_json::json!({ "members": members }))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            if !init.status().is_success() {
                return Err(format!("init answered {}", init.status()));
            }
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let current = nodes[0].raft.metrics().borrow().current_leader;
                if let Some(leader) = current {
                    return Ok(leader);
                }
                if Instant::now() > deadline {
                    return Err("no leader elected".to_string());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })?;
        Ok(Self {
            runtime,
            nodes,
            leader: Arc::new(AtomicU64::new(leader)),
            client,
            _dir: dir,
        })
    }

    /// One acknowledged PUT, following a change of leader.
    fn put(&self, key: &str, value: &[u8]) -> Result<(), String> {
        self.runtime.handle().block_on(async {
            for _ in 0..20 {
                let leader = self.leader.load(Ordering::Relaxed) as usize;
                let addr = self.nodes[leader - 1].addr;
                let response = self
                    .client
                    .put(format!("http://{addr}/kv/{key}"))
                    .body(value.to_vec())
                    .send()
                    .await
                    .map_err(|e| e.to_string())?;
                match response.status().as_u16() {
                    200 => return Ok(()),
                    307 | 503 => {
                        let body: serde_json::Value = response.json().await.unwrap_or_default();
                        if let Some(id) = body["leader_id"].as_u64() {
                            self.leader.store(id, Ordering::Relaxed);
                        } else {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                    other => return Err(format!("PUT answered {other}")),
                }
            }
            Err("no stable leader".to_string())
        })
    }

    fn stop(self) {
        let Cluster { runtime, nodes, .. } = self;
        runtime.block_on(async {
            for node in nodes {
                let _ = node.shutdown().await;
            }
        });
    }
}

/// Single-node sediment: each operation is a transaction that writes the
/// value and archives the key's previous one, as the state machine does.
fn sediment_cell(threads: usize, len: usize, options: &Options) -> Result<Measurement, String> {
    let dir = temp_dir();
    let db = sediment::Database::recover(dir.path()).map_err(|e| e.to_string())?;
    let pool = PayloadPool::new(len, 7);
    let previous: Mutex<BTreeMap<(usize, u64), sediment::GrainId>> = Mutex::new(BTreeMap::new());
    let (warmup, duration) = timing(options);
    let result = harness::run(threads, warmup, duration, |thread, i| {
        let mut rng = Rng::new(i ^ ((thread as u64) << 32));
        let value = pool.slice(len, &mut rng);
        let key = (thread, i % KEYS_PER_THREAD);
        let mut tx = db.begin_transaction().map_err(|e| e.to_string())?;
        let id = tx.write(value).map_err(|e| e.to_string())?;
        let old = previous.lock().insert(key, id);
        if let Some(old) = old {
            tx.archive(old).map_err(|e| e.to_string())?;
        }
        tx.commit().map_err(|e| e.to_string())?;
        Ok(len as u64)
    });
    let _ = db.shutdown();
    result
}

fn raft_cell(
    cluster: &Cluster,
    threads: usize,
    len: usize,
    options: &Options,
) -> Result<Measurement, String> {
    let pool = PayloadPool::new(len, 11);
    let (warmup, duration) = timing(options);
    harness::run(threads, warmup, duration, |thread, i| {
        let mut rng = Rng::new(i ^ ((thread as u64) << 32));
        let value = pool.slice(len, &mut rng);
        cluster.put(&format!("t{thread}-{}", i % KEYS_PER_THREAD), value)?;
        Ok(len as u64)
    })
}

fn timing(options: &Options) -> (Duration, Duration) {
    let seconds = options
        .seconds
        .unwrap_or(if options.quick { 2.0 } else { 5.0 });
    (Duration::from_millis(500), Duration::from_secs_f64(seconds))
}

/// Runs the section: prints its table and writes `raft.csv`.
pub fn run(options: &Options) -> Vec<PathBuf> {
    println!("## Replication (raft)\n");
    println!(
        "`PUT /kv/{{key}}` over HTTP to the leader of a 3-node sediment-raft cluster on \
         loopback (in this process), acknowledged once committed by a quorum and applied; \
         `sediment` is one transaction per write on a single node (write the value, archive \
         the key's previous one, commit). Keys cycle over {KEYS_PER_THREAD} per thread.\n"
    );
    let mut table = Table::new(&[
        "system",
        "threads#",
        "value",
        "writes/s#",
        "p50 µs#",
        "p99 µs#",
        "× sediment#",
    ]);
    let cluster = match Cluster::start() {
        Ok(cluster) => cluster,
        Err(e) => {
            eprintln!("raft section skipped: {e}");
            println!("Skipped: the cluster did not start ({e}).\n");
            return Vec::new();
        }
    };
    for len in PAYLOADS {
        for threads in THREADS {
            let label = if len >= 1024 {
                format!("{} KiB", len / 1024)
            } else {
                format!("{len} B")
            };
            eprintln!("raft: sediment, {threads} threads, {label}");
            let single = sediment_cell(threads, len, options);
            eprintln!("raft: 3-node cluster, {threads} threads, {label}");
            let replicated = raft_cell(&cluster, threads, len, options);
            let base = single.as_ref().map(Measurement::per_second).ok();
            for (system, result) in [
                ("sediment (1 node)", single),
                ("sediment-raft (3 nodes)", replicated),
            ] {
                match result {
                    Ok(m) => table.row(vec![
                        system.into(),
                        threads.to_string(),
                        label.clone(),
                        rate(m.per_second()),
                        micros(m.p50),
                        micros(m.p99),
                        base.map_or(String::new(), |b| format!("{:.2}", m.per_second() / b)),
                    ]),
                    Err(e) => table.note(format!("{system}, {threads} threads, {label}: {e}")),
                }
            }
        }
    }
    cluster.stop();
    print!("{}", table.to_markdown());
    println!();
    let path = crate::sections::output(options, "raft.csv");
    match table.write_csv(&path) {
        Ok(()) => vec![path],
        Err(e) => {
            eprintln!("could not write {}: {e}", path.display());
            Vec::new()
        }
    }
}
