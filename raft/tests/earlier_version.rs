//! A cluster whose node directories an earlier version wrote, before
//! identities were recorded, comes back under this version: every value is
//! there on every node, writes go on and replicate, and the nodes answer
//! one another as before (an identity is not taken from their RPCs).
//! Real node processes on 127.0.0.1.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::{plain_client, put_v, Cluster, NodeProcess};

/// The fixture's nodes listened here; their logs' membership names these
/// addresses. (Below the ports the other tests draw from.)
const ADDRS: [(u64, &str); 3] = [
    (1, "127.0.0.1:19711"),
    (2, "127.0.0.1:19712"),
    (3, "127.0.0.1:19713"),
];

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else if entry.file_name() != "README.md" {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_written_before_identities_comes_back_whole_and_takes_writes() {
    let dir = tempfile::tempdir().unwrap();
    copy_tree(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cluster-before-identities"),
        dir.path(),
    );
    for (_, addr) in ADDRS {
        assert!(
            std::net::TcpListener::bind(addr).is_ok(),
            "{addr}, where the fixture's nodes listened, is in use by another process"
        );
    }
    let mut nodes = BTreeMap::new();
    for (id, addr) in ADDRS {
        let mut node = NodeProcess {
            id,
            addr: addr.to_string(),
            dir: dir.path().join(format!("node-{id}")),
            child: None,
            extra_args: vec!["--heartbeat-ms".into(), "100".into()],
            scheme: "http",
        };
        node.start();
        nodes.insert(id, node);
    }
    let cluster = Cluster {
        nodes,
        client: plain_client(Duration::from_secs(5)),
        dir,
        security_args: Vec::new(),
        scheme: "http",
    };
    cluster.wait_up(&[1, 2, 3]).await;
    let leader = cluster.wait_for_leader(None, Duration::from_secs(20)).await;

    assert_eq!(
        put_v(cluster.nodes[&leader].url("/kv/after-upgrade")).await,
        200
    );
    cluster
        .wait_for_value(&[1, 2, 3], "after-upgrade", b"v", Duration::from_secs(20))
        .await;
    for id in [1, 2, 3] {
        for k in 1..20 {
            assert_eq!(
                cluster.local_get(id, &format!("key-{k}")).await,
                Some(format!("value-{k}").into_bytes()),
                "node {id}, key-{k}"
            );
        }
        assert_eq!(
            cluster.local_get(id, "key-20").await,
            None,
            "node {id}: key-20 was deleted"
        );
        assert!(
            !cluster.nodes[&id].dir.join("identity").exists(),
            "node {id} took an identity from an RPC"
        );
    }
    assert_eq!(
        cluster.voters(leader).await,
        std::collections::BTreeSet::from([1, 2, 3])
    );
}
