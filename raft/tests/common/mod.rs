//! Runs `sediment-raft node` processes on loopback for the tests.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A free loopback port: bind port 0, read it, let it go.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding port 0");
    listener.local_addr().expect("a local address").port()
}

/// A small deterministic generator (xorshift64*), so failures replay from
/// the printed seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One node process.
#[derive(Debug)]
pub struct NodeProcess {
    pub id: u64,
    pub addr: String,
    pub dir: PathBuf,
    pub child: Option<Child>,
    pub extra_args: Vec<String>,
}

impl NodeProcess {
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "node {} is already running", self.id);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.with_extension("log"))
            .expect("a log file for the node");
        let child = Command::new(env!("CARGO_BIN_EXE_sediment-raft"))
            .args(["node", "--id", &self.id.to_string(), "--listen", &self.addr])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra_args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting sediment-raft");
        self.child = Some(child);
    }

    /// SIGKILL: no shutdown, no flush.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A cluster of node processes in a temporary directory.
#[derive(Debug)]
pub struct Cluster {
    pub nodes: BTreeMap<u64, NodeProcess>,
    pub client: reqwest::Client,
    pub dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts nodes `ids` (not yet initialized).
    pub fn start(ids: &[u64], extra_args: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut nodes = BTreeMap::new();
        for &id in ids {
            let mut node = NodeProcess {
                id,
                addr: format!("127.0.0.1:{}", free_port()),
                dir: dir.path().join(format!("node-{id}")),
                child: None,
                extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            };
            node.start();
            nodes.insert(id, node);
        }
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(5))
            .build()
            .expect("an HTTP client");
        Self { nodes, client, dir }
    }

    /// Adds and starts one more node process.
    pub fn add_node(&mut self, id: u64, extra_args: &[&str]) {
        let mut node = NodeProcess {
            id,
            addr: format!("127.0.0.1:{}", free_port()),
            dir: self.dir.path().join(format!("node-{id}")),
            child: None,
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
        };
        node.start();
        self.nodes.insert(id, node);
    }

    pub async fn metrics(&self, id: u64) -> Option<Value> {
        let response = self
            .client
            .get(self.nodes[&id].url("/cluster/metrics"))
            .timeout(Duration::from_millis(500))
            .send()
            .await
            .ok()?;
        response.json().await.ok()
    }

    /// Waits until every listed node answers its metrics.
    pub async fn wait_up(&self, ids: &[u64]) {
        let deadline = Instant::now() + Duration::from_secs(20);
        for &id in ids {
            while self.metrics(id).await.is_none() {
                assert!(Instant::now() < deadline, "node {id} did not come up");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    /// Initializes the cluster with every node as a voter.
    pub async fn init(&self) {
        let members: BTreeMap<String, String> = self
            .nodes
            .values()
            .map(|n| (n.id.to_string(), n.addr.clone()))
            .collect();
        let first = self.nodes.keys().next().copied().expect("a node");
        let response = self
            .client
            .post(self.nodes[&first].url("/cluster/init"))
            .json(&serde_json::json!({ "members": members }))
            .send()
            .await
            .expect("init answered");
        assert!(
            response.status().is_success(),
            "init: {}",
            response.status()
        );
    }

    /// The leader that a running node other than `excluding` reports.
    pub async fn leader(&self, excluding: Option<u64>) -> Option<u64> {
        for (&id, node) in &self.nodes {
            if Some(id) == excluding || node.child.is_none() {
                continue;
            }
            if let Some(m) = self.metrics(id).await {
                if let Some(leader) = m["current_leader"].as_u64() {
                    if Some(leader) != excluding && self.nodes[&leader].child.is_some() {
                        // Trust it only if the leader says so too.
                        if let Some(lm) = self.metrics(leader).await {
                            if lm["state"] == "Leader" {
                                return Some(leader);
                            }
                        }
                    }
                }
            }
        }
        None
    }

    pub async fn wait_for_leader(&self, excluding: Option<u64>, within: Duration) -> u64 {
        let deadline = Instant::now() + within;
        loop {
            if let Some(leader) = self.leader(excluding).await {
                return leader;
            }
            assert!(
                Instant::now() < deadline,
                "no leader elected within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Waits until every running node has applied what the leader has.
    pub async fn wait_caught_up(&self, within: Duration) -> u64 {
        let deadline = Instant::now() + within;
        loop {
            let mut applied = Vec::new();
            for (&id, node) in &self.nodes {
                if node.child.is_some() {
                    applied.push(
                        self.metrics(id)
                            .await
                            .and_then(|m| m["last_applied"].as_u64()),
                    );
                }
            }
            if let Some(Some(first)) = applied.first() {
                if applied.iter().all(|a| *a == Some(*first)) {
                    return *first;
                }
            }
            assert!(
                Instant::now() < deadline,
                "nodes did not catch up within {within:?}: {applied:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The value of `key` in node `id`'s own state machine.
    pub async fn local_get(&self, id: u64, key: &str) -> Option<Vec<u8>> {
        let response = self
            .client
            .get(self.nodes[&id].url(&format!("/kv/{key}?consistency=local")))
            .send()
            .await
            .expect("a local read answered");
        match response.status().as_u16() {
            200 => Some(response.bytes().await.expect("a body").to_vec()),
            404 => None,
            other => panic!("local read of {key} from node {id}: status {other}"),
        }
    }

    /// Node id → address.
    pub fn addrs(&self) -> BTreeMap<u64, String> {
        self.nodes
            .iter()
            .map(|(&id, n)| (id, n.addr.clone()))
            .collect()
    }
}

/// A PUT through whichever node leads, following redirects and retrying
/// other nodes on errors, until `give_up` says stop. Returns whether the
/// write was acknowledged.
pub async fn put(
    client: &reqwest::Client,
    addrs: &BTreeMap<u64, String>,
    key: &str,
    value: &[u8],
    hint: &std::sync::atomic::AtomicU64,
    give_up: impl Fn() -> bool,
) -> bool {
    use std::sync::atomic::Ordering;
    let ids: Vec<u64> = addrs.keys().copied().collect();
    loop {
        if give_up() {
            return false;
        }
        let target = hint.load(Ordering::Relaxed);
        let Some(addr) = addrs.get(&target) else {
            hint.store(ids[0], Ordering::Relaxed);
            continue;
        };
        let sent = client
            .put(format!("http://{addr}/kv/{key}"))
            .body(value.to_vec())
            .send()
            .await;
        match sent {
            Ok(r) if r.status() == 200 => return true,
            Ok(r) if r.status() == 307 => {
                let body: Value = r.json().await.unwrap_or_default();
                if let Some(leader) = body["leader_id"].as_u64() {
                    hint.store(leader, Ordering::Relaxed);
                }
            }
            _ => {
                let at = ids.iter().position(|&i| i == target).unwrap_or(0);
                hint.store(ids[(at + 1) % ids.len()], Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
        }
    }
}
