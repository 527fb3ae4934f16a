//! A follower whose directory is put back from an older copy of itself
//! (a restored backup) no longer holds entries it acknowledged. openraft
//! 0.9 stops a leader that sees that; here the leader keeps leading and
//! writing with the other two, logs what happened, and the follower gets
//! nothing more until it is removed and added again, after which it
//! catches up. Real node processes on 127.0.0.1.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{put_v, Cluster};

// 50 ms heartbeats: a 3 s write timeout bounds every answer below.
const ARGS: &[&str] = &["--heartbeat-ms", "50"];

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_restored_from_an_older_copy_is_fenced_off_until_added_again() {
    let mut cluster = Cluster::start(&[1, 2, 3], ARGS);
    cluster.wait_up(&[1, 2, 3]).await;
    cluster.init().await;
    let leader = cluster.wait_for_leader(None, Duration::from_secs(20)).await;
    let url = |cluster: &Cluster, path: &str| cluster.nodes[&leader].url(path);
    for i in 0..10 {
        assert_eq!(put_v(url(&cluster, &format!("/kv/old-{i}"))).await, 200);
    }
    cluster.wait_caught_up(Duration::from_secs(20)).await;

    // A copy of a follower's directory, taken while it is stopped.
    let follower = cluster.followers(leader)[0];
    cluster.nodes.get_mut(&follower).unwrap().stop();
    let dir = cluster.nodes[&follower].dir.clone();
    let backup = dir.with_extension("backup");
    copy_dir(&dir, &backup);
    cluster.nodes.get_mut(&follower).unwrap().start();
    cluster.wait_up(&[follower]).await;
    for i in 0..30 {
        assert_eq!(put_v(url(&cluster, &format!("/kv/new-{i}"))).await, 200);
    }
    cluster.wait_caught_up(Duration::from_secs(20)).await;
    assert_eq!(
        cluster.local_get(follower, "new-29").await.as_deref(),
        Some(&b"v"[..])
    );

    // The copy is put back.
    cluster.nodes.get_mut(&follower).unwrap().stop();
    std::fs::remove_dir_all(&dir).unwrap();
    copy_dir(&backup, &dir);
    cluster.nodes.get_mut(&follower).unwrap().start();
    cluster.wait_up(&[follower]).await;

    let until = Instant::now() + Duration::from_secs(3);
    let mut i = 0;
    while Instant::now() < until {
        assert_eq!(put_v(url(&cluster, &format!("/kv/during-{i}"))).await, 200);
        i += 1;
    }
    let node = cluster.nodes.get_mut(&leader).unwrap();
    let alive = node
        .child
        .as_mut()
        .is_some_and(|child| child.try_wait().unwrap().is_none());
    assert!(alive, "the leader exited: {}", node.log());
    assert_eq!(
        cluster.wait_for_leader(None, Duration::from_secs(5)).await,
        leader
    );
    let log = cluster.nodes[&leader].log();
    assert!(log.contains("no longer holds log entry"), "{log}");
    assert_eq!(cluster.local_get_or_none(follower, "during-0").await, None);

    // Removed and added again, it catches up.
    cluster.remove_and_add_again(leader, follower).await;
    assert_eq!(cluster.voters(leader).await, BTreeSet::from([1, 2, 3]));
    cluster.wait_caught_up(Duration::from_secs(20)).await;
    for key in ["old-0", "new-29", "during-0"] {
        assert_eq!(
            cluster.local_get(follower, key).await.as_deref(),
            Some(&b"v"[..]),
            "{key}"
        );
    }
}
