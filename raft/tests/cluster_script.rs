//! `scripts/cluster.sh` runs to the end (also with `SECURE=1`: TLS and a
//! token), and stops instead of waiting forever when a node cannot run.
//! The tests hand the script the binary
//! cargo built for them (`SEDIMENT_RAFT_BIN`): the script's own
//! `cargo build -p sediment-raft` resolves features for that package alone
//! and, on a fresh checkout, rebuilds half the dependency tree first.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A base port whose next three ports are free now. The ports lie below
/// Linux's ephemeral range (32768 and up), so that the outgoing
/// connections of other tests and nodes running meanwhile cannot take one
/// between this check and the script's use of it.
fn free_base_port() -> u16 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let seed = u64::from(std::process::id()) ^ u64::from(now);
    for attempt in 0..200_u64 {
        let base = 20_000 + ((seed.wrapping_mul(7919) + attempt * 613) % 12_000) as u16;
        if (1..=3).all(|i| TcpListener::bind(("127.0.0.1", base + i)).is_ok()) {
            return base;
        }
    }
    panic!("no three consecutive free ports");
}

/// Stops (SIGKILL, by pid) every `sediment-raft` process whose command
/// line names a path under `dir`; returns how many there were.
fn kill_nodes_under(dir: &Path) -> usize {
    let needle = dir.to_str().expect("a UTF-8 temporary path");
    let mut killed = 0;
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline);
        let mut args = cmdline.split('\0');
        let is_node = args
            .next()
            .is_some_and(|bin| bin.ends_with("sediment-raft"));
        if is_node && cmdline.contains(needle) {
            let _ = Command::new("kill")
                .args(["-s", "KILL", "--", &pid.to_string()])
                .status();
            killed += 1;
        }
    }
    killed
}

/// Runs the script with its temporary files under a directory of our own;
/// returns (exit code, stdout, stderr). Fails after `limit`, and if the
/// script leaves a node process running; either way every node it started
/// is stopped.
fn run_script(envs: &[(&str, &str)], limit: Duration) -> (i32, String, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let out_path = tmp.path().join("stdout");
    let err_path = tmp.path().join("stderr");
    let mut child: Child = Command::new("bash")
        .arg(root.join("scripts/cluster.sh"))
        .envs(envs.iter().copied())
        .env("TMPDIR", tmp.path())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("bash runs");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for the script") {
            break Some(status);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let left = kill_nodes_under(tmp.path());
    let read = |path: &Path| String::from_utf8_lossy(&std::fs::read(path).unwrap()).into_owned();
    let (out, err) = (read(&out_path), read(&err_path));
    let Some(status) = status else {
        panic!("scripts/cluster.sh still running after {limit:?}; stdout:\n{out}\nstderr:\n{err}");
    };
    assert_eq!(left, 0, "the script left {left} node process(es) running");
    (status.code().unwrap_or(-1), out, err)
}

#[test]
fn cluster_script_runs_to_the_end() {
    let base = free_base_port().to_string();
    let (code, out, err) = run_script(
        &[
            ("SEDIMENT_RAFT_BIN", env!("CARGO_BIN_EXE_sediment-raft")),
            ("BASE_PORT", &base),
        ],
        Duration::from_secs(90),
    );
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    for expected in [
        "3 nodes up in ",
        "{\"initialized\":true}",
        "hello, raft",
        "HTTP/1.1 307 Temporary Redirect",
        "new leader: node ",
        "still here",
        "stopped",
    ] {
        assert!(out.contains(expected), "{expected:?} missing from:\n{out}");
    }
}

#[test]
fn cluster_script_gives_up_when_a_node_cannot_start() {
    // Something else already listens on node 1's port: the script must
    // say so and start nothing, rather than send its requests there or
    // wait for a node that cannot bind.
    let (base, _taken) = (0..50)
        .find_map(|_| {
            let base = free_base_port();
            let taken = TcpListener::bind(("127.0.0.1", base + 1)).ok()?;
            Some((base, taken))
        })
        .expect("a free base port whose first node port can be held");
    let base = base.to_string();
    let (code, out, err) = run_script(
        &[
            ("SEDIMENT_RAFT_BIN", env!("CARGO_BIN_EXE_sediment-raft")),
            ("BASE_PORT", &base),
        ],
        Duration::from_secs(60),
    );
    assert_ne!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        err.contains("is in use by another process"),
        "stderr:\n{err}"
    );
    assert!(!out.contains("nodes up"), "stdout:\n{out}");
}

#[test]
fn cluster_script_runs_over_tls_with_a_token() {
    let base = free_base_port().to_string();
    let (code, out, err) = run_script(
        &[
            ("SEDIMENT_RAFT_BIN", env!("CARGO_BIN_EXE_sediment-raft")),
            ("BASE_PORT", &base),
            ("SECURE", "1"),
        ],
        Duration::from_secs(90),
    );
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    for expected in [
        "--tls-ca",
        "--token-file",
        "{\"initialized\":true}",
        "hello, raft",
        "HTTP/1.1 307 Temporary Redirect",
        "location: https://127.0.0.1:",
        "\nblue\n",
        " 401\n",
        "new leader: node ",
        "still here",
        "stopped",
    ] {
        assert!(out.contains(expected), "{expected:?} missing from:\n{out}");
    }
}
