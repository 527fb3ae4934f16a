//! Runs `sediment-raft node` processes on loopback for the tests.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Runs a one-node `sediment-raft node` on `dir` with `args` until it
/// exits (at most 30 s, then it is killed): whether it succeeded (`None`
/// if it had to be killed), and its stderr.
pub fn run_node_to_exit(dir: &Path, args: &[&str]) -> (Option<bool>, String) {
    let listen = format!("127.0.0.1:{}", free_port());
    let dir_arg = dir.to_str().expect("a UTF-8 path");
    let mut all = vec![
        "node",
        "--id",
        "1",
        "--heartbeat-ms",
        "100",
        "--listen",
        &listen,
        "--dir",
        dir_arg,
    ];
    all.extend_from_slice(args);
    run_to_exit(&all, &dir.with_extension("run.log"))
}

/// Runs `sediment-raft` with exactly `args` until it exits (at most 30 s,
/// then it is killed), its stderr going to `log`: whether it succeeded
/// (`None` if it had to be killed), and its stderr.
pub fn run_to_exit(args: &[&str], log: &Path) -> (Option<bool>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sediment-raft"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status.success());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status, std::fs::read_to_string(log).unwrap_or_default())
}

/// Every file under `dir` with its bytes, sorted by path.
pub fn files_under(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(at) = pending.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else {
                out.push((path.clone(), std::fs::read(&path).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// POSTs `body` as JSON to `url` (a client that waits up to 30 s, for
/// calls bounded by a node's write timeout): the status and the JSON body
/// (`Null` if it is not JSON).
pub async fn post_json(url: String, body: Value) -> (u16, Value) {
    let response = plain_client(Duration::from_secs(30))
        .post(url)
        .json(&body)
        .send()
        .await
        .expect("the endpoint answers within the client's timeout");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// PUTs the value `v` at `url`: the status (0 if no answer came).
pub async fn put_v(url: String) -> u16 {
    plain_client(Duration::from_secs(30))
        .put(url)
        .body("v")
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

/// A plain-HTTP client that follows no redirects and gives up on a
/// request after `timeout`.
pub fn plain_client(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(timeout)
        .build()
        .expect("an HTTP client")
}

/// A free loopback port for a node. It lies below Linux's ephemeral range
/// (32768 and up), so that no outgoing connection of the tests or the
/// nodes takes it between this check and the node's bind, and no port is
/// handed out twice in one test process (tests run their clusters side by
/// side): a port given to one cluster's node could otherwise reach another
/// cluster's, which a node now refuses to join.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let seed = *SEED.get_or_init(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        u64::from(std::process::id()).wrapping_mul(7919) ^ u64::from(now)
    });
    for _ in 0..12_000 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = 20_000 + ((seed + n) % 12_000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port between 20000 and 32000");
}

#[allow(unused_imports)]
pub use testkit::rng::Rng;

/// A throwaway CA, a certificate for the nodes (for `127.0.0.1` and
/// `localhost`, usable by servers and clients), one for test clients and
/// a token, written to a temporary directory.
#[derive(Debug)]
pub struct Credentials {
    pub dir: tempfile::TempDir,
    pub token: String,
}

impl Credentials {
    pub fn generate() -> Self {
        use rcgen::{
            BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
            IsCa, KeyPair, KeyUsagePurpose,
        };
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "sediment-raft test CA");
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        for name in ["node", "client"] {
            let mut params =
                CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
                    .unwrap();
            params
                .distinguished_name
                .push(DnType::CommonName, format!("sediment-raft test {name}"));
            params.extended_key_usages = vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ];
            let key = KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &*ca).unwrap();
            std::fs::write(dir.path().join(format!("{name}.pem")), cert.pem()).unwrap();
            std::fs::write(
                dir.path().join(format!("{name}-key.pem")),
                key.serialize_pem(),
            )
            .unwrap();
        }
        let token = format!(
            "test-token-{:016x}",
            Rng::new(std::process::id().into()).next_u64()
        );
        std::fs::write(dir.path().join("token"), format!("{token}\n")).unwrap();
        Self { dir, token }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn arg(&self, name: &str) -> String {
        self.path(name).to_str().expect("a UTF-8 path").to_string()
    }

    /// `--tls-cert`, `--tls-key` and, if `mutual`, `--tls-ca`.
    pub fn tls_args(&self, mutual: bool) -> Vec<String> {
        let mut args = vec![
            "--tls-cert".into(),
            self.arg("node.pem"),
            "--tls-key".into(),
            self.arg("node-key.pem"),
        ];
        if mutual {
            args.extend(["--tls-ca".into(), self.arg("ca.pem")]);
        }
        args
    }

    /// Mutual TLS and the token.
    pub fn node_args(&self) -> Vec<String> {
        let mut args = self.tls_args(true);
        args.extend(["--token-file".into(), self.arg("token")]);
        args
    }

    /// A client that trusts the CA and presents the client certificate
    /// (when `identity`), without a token.
    pub fn client_builder(&self, identity: bool) -> reqwest::ClientBuilder {
        let ca = std::fs::read(self.path("ca.pem")).unwrap();
        let mut builder = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(5));
        if identity {
            let mut pem = std::fs::read(self.path("client.pem")).unwrap();
            pem.extend(std::fs::read(self.path("client-key.pem")).unwrap());
            builder = builder.identity(reqwest::Identity::from_pem(&pem).unwrap());
        }
        builder
    }

    /// The same, sending `token` on every request.
    pub fn client_with_token(&self, token: &str) -> reqwest::Client {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {token}").parse().unwrap(),
        );
        self.client_builder(true)
            .default_headers(headers)
            .build()
            .unwrap()
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
    /// `http` or `https`.
    pub scheme: &'static str,
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

    /// SIGTERM, then waits for the process to exit: a clean stop.
    pub fn stop(&mut self) {
        if let Some(child) = self.child.take() {
            Command::new("kill")
                .arg(child.id().to_string())
                .status()
                .expect("running kill");
            let _ = child.wait_with_output();
        }
    }

    /// Whether the node's process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| child.try_wait().unwrap().is_none())
    }

    /// SIGKILL: no shutdown, no flush.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}://{}{path}", self.scheme, self.addr)
    }

    /// The node's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// What the node wrote to stderr.
    pub fn log(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(self.dir.with_extension("log")).unwrap_or_default())
            .into_owned()
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
    /// The arguments every node gets for TLS and the token.
    pub security_args: Vec<String>,
    pub scheme: &'static str,
}

impl Cluster {
    /// Starts nodes `ids` (not yet initialized) on plain HTTP.
    pub fn start(ids: &[u64], extra_args: &[&str]) -> Self {
        Self::start_with(ids, extra_args, None)
    }

    /// Starts nodes `ids` (not yet initialized), with mutual TLS and a
    /// token from `credentials` if given; the cluster's client then uses
    /// them too.
    pub fn start_with(ids: &[u64], extra_args: &[&str], credentials: Option<&Credentials>) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (client, security_args, scheme) = match credentials {
            Some(credentials) => (
                credentials.client_with_token(&credentials.token),
                credentials.node_args(),
                "https",
            ),
            None => (plain_client(Duration::from_secs(5)), Vec::new(), "http"),
        };
        let mut cluster = Self {
            nodes: BTreeMap::new(),
            client,
            dir,
            security_args,
            scheme,
        };
        for &id in ids {
            cluster.add_node(id, extra_args);
        }
        cluster
    }

    /// The nodes other than `leader`, in id order.
    pub fn followers(&self, leader: u64) -> Vec<u64> {
        self.nodes
            .keys()
            .copied()
            .filter(|id| *id != leader)
            .collect()
    }

    /// Adds and starts one more node process.
    pub fn add_node(&mut self, id: u64, extra_args: &[&str]) {
        let mut extra_args: Vec<String> = extra_args.iter().map(|s| s.to_string()).collect();
        extra_args.extend(self.security_args.iter().cloned());
        let mut node = NodeProcess {
            id,
            addr: format!("127.0.0.1:{}", free_port()),
            dir: self.dir.path().join(format!("node-{id}")),
            child: None,
            extra_args,
            scheme: self.scheme,
        };
        node.start();
        self.nodes.insert(id, node);
    }

    /// The voters node `id`'s metrics report.
    /// Through `leader`, takes `node` out of the voters, adds it again as
    /// a learner and makes every node of the cluster a voter again; each
    /// step must answer 200. Returns add-learner's answer.
    pub async fn remove_and_add_again(&self, leader: u64, node: u64) -> Value {
        let url = |path: &str| self.nodes[&leader].url(path);
        let all: Vec<u64> = self.nodes.keys().copied().collect();
        let others: Vec<u64> = all.iter().copied().filter(|&n| n != node).collect();
        let (status, body) = post_json(
            url("/cluster/change-membership"),
            serde_json::json!({ "members": others }),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let (status, added) = post_json(
            url("/cluster/add-learner"),
            serde_json::json!({"id": node, "addr": self.nodes[&node].addr}),
        )
        .await;
        assert_eq!(status, 200, "{added}");
        let (status, body) = post_json(
            url("/cluster/change-membership"),
            serde_json::json!({ "members": all }),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        added
    }

    pub async fn voters(&self, id: u64) -> std::collections::BTreeSet<u64> {
        let m = self.metrics(id).await.expect("metrics");
        serde_json::from_value(m["membership"]["voters"].clone()).unwrap()
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
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        assert!(status.is_success(), "init: {status} {body}");
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

    /// Waits until every node in `ids` holds `value` under `key` in its own
    /// state machine; fails with the node's log after `within`.
    pub async fn wait_for_value(&self, ids: &[u64], key: &str, value: &[u8], within: Duration) {
        let deadline = Instant::now() + within;
        for &id in ids {
            while self.local_get(id, key).await.as_deref() != Some(value) {
                assert!(
                    Instant::now() < deadline,
                    "node {id} did not get {key}: {}",
                    self.nodes[&id].log()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
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

    /// The same as [`Cluster::local_get`], but `None` also while the node
    /// does not answer (starting, or catching up) instead of failing.
    pub async fn local_get_or_none(&self, id: u64, key: &str) -> Option<Vec<u8>> {
        let response = self
            .client
            .get(self.nodes[&id].url(&format!("/kv/{key}?consistency=local")))
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .ok()?;
        if response.status() != 200 {
            return None;
        }
        response.bytes().await.ok().map(|b| b.to_vec())
    }

    /// Node id → address.
    pub fn addrs(&self) -> BTreeMap<u64, String> {
        self.nodes
            .iter()
            .map(|(&id, n)| (id, n.addr.clone()))
            .collect()
    }

    /// Node id → `scheme://address`.
    pub fn bases(&self) -> BTreeMap<u64, String> {
        self.nodes.iter().map(|(&id, n)| (id, n.url(""))).collect()
    }
}

/// Descriptors a process has open.
pub fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(Path::new("/proc").join(pid.to_string()).join("fd"))
        .map(|entries| entries.count())
        .unwrap_or(0)
}

/// A PUT through whichever node leads, following redirects and retrying
/// other nodes on errors, until `give_up` says stop. `bases` maps node ids
/// to `scheme://address` ([`Cluster::bases`]). Returns whether the write
/// was acknowledged.
pub async fn put(
    client: &reqwest::Client,
    bases: &BTreeMap<u64, String>,
    key: &str,
    value: &[u8],
    hint: &std::sync::atomic::AtomicU64,
    give_up: impl Fn() -> bool,
) -> bool {
    use std::sync::atomic::Ordering;
    let ids: Vec<u64> = bases.keys().copied().collect();
    loop {
        if give_up() {
            return false;
        }
        let target = hint.load(Ordering::Relaxed);
        let Some(base) = bases.get(&target) else {
            hint.store(ids[0], Ordering::Relaxed);
            continue;
        };
        let sent = client
            .put(format!("{base}/kv/{key}"))
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
