//! Three `sediment-raft node` processes; a client writes from 4 tasks while
//! the leader is SIGKILLed at seeded random moments, five times, and after
//! each, once it is back, one of the followers (its state machine does not
//! sync its applies; it catches up from its log and the leader's). Every
//! acknowledged write must be readable, with its value, from every node
//! afterwards, and nothing that was never written may appear.
//!
//! It runs twice: on plain HTTP with the nodes' default single-threaded
//! event loop, and with mutual TLS, a bearer token (every RPC and client
//! request then goes through both) and `--worker-threads 2`.
//!
//! `SEED=n cargo test -p sediment-raft --test kill_leader -- --nocapture`
//! replays a run's kill timings.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{put, Cluster, Credentials, Rng};
use parking_lot::Mutex;

const WRITERS: u64 = 4;
const KILLS: usize = 5;

#[derive(Default)]
struct Ledger {
    /// Unique keys: the one value each was written with.
    attempted: HashMap<String, Vec<u8>>,
    acknowledged: BTreeMap<String, Vec<u8>>,
    /// Per writer's overwritten key: (sequence, value) of every attempt and
    /// the highest acknowledged sequence.
    hot_attempts: HashMap<String, HashMap<Vec<u8>, u64>>,
    hot_acknowledged: HashMap<String, u64>,
}

fn value(writer: u64, n: u64, rng: &mut Rng) -> Vec<u8> {
    let mut v = format!("writer {writer} write {n} ").into_bytes();
    let pad = 32 + rng.below(200) as usize;
    v.extend((0..pad).map(|i| b'a' + ((n as usize + i) % 26) as u8));
    v
}

/// The two runs take turns: each keeps the machine's cores busy.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_writes_survive_leader_kills() {
    let _turn = ONE_AT_A_TIME.lock().await;
    kill_leaders(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_writes_survive_leader_kills_over_tls_with_a_token() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let credentials = Credentials::generate();
    kill_leaders(Some(&credentials)).await;
}

/// Waits until node `id` has applied at least `target`.
async fn wait_applied(cluster: &Cluster, id: u64, target: Option<u64>) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let applied = cluster
            .metrics(id)
            .await
            .and_then(|m| m["last_applied"].as_u64());
        if applied.is_some() && applied >= target {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "restarted node {id} did not catch up to {target:?} (at {applied:?})"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn kill_leaders(credentials: Option<&Credentials>) {
    let started = Instant::now();
    let seed: u64 = std::env::var("SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_0010);
    println!("seed {seed}");
    let mut rng = Rng::new(seed);
    let args: &[&str] = if credentials.is_some() {
        &["--heartbeat-ms", "100", "--worker-threads", "2"]
    } else {
        &["--heartbeat-ms", "100"]
    };
    let mut cluster = Cluster::start_with(&[1, 2, 3], args, credentials);
    cluster.wait_up(&[1, 2, 3]).await;
    cluster.init().await;
    let mut leader = cluster.wait_for_leader(None, Duration::from_secs(15)).await;
    let mut elections = 1;

    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let addrs = cluster.bases();
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (client, addrs, ledger, stop) = (
            cluster.client.clone(),
            addrs.clone(),
            ledger.clone(),
            stop.clone(),
        );
        let mut rng = Rng::new(seed ^ (w + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let hint = AtomicU64::new(leader);
        writers.push(tokio::spawn(async move {
            let mut n = 0_u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let v = value(w, n, &mut rng);
                if n % 10 == 0 {
                    let key = format!("hot-{w}");
                    ledger
                        .lock()
                        .hot_attempts
                        .entry(key.clone())
                        .or_default()
                        .insert(v.clone(), n);
                    if put(&client, &addrs, &key, &v, &hint, || {
                        stop.load(Ordering::Relaxed)
                    })
                    .await
                    {
                        let mut l = ledger.lock();
                        let best = l.hot_acknowledged.entry(key).or_default();
                        *best = (*best).max(n);
                    }
                } else {
                    let key = format!("w{w}-{n}");
                    ledger.lock().attempted.insert(key.clone(), v.clone());
                    if put(&client, &addrs, &key, &v, &hint, || {
                        stop.load(Ordering::Relaxed)
                    })
                    .await
                    {
                        ledger.lock().acknowledged.insert(key, v);
                    }
                }
            }
        }));
    }

    let mut kills = 0;
    let mut follower_kills = 0;
    for round in 0..KILLS {
        tokio::time::sleep(Duration::from_millis(300 + rng.below(900))).await;
        if let Some(now) = cluster.leader(None).await {
            leader = now;
        }
        let before = ledger.lock().acknowledged.len();
        cluster.nodes.get_mut(&leader).unwrap().kill();
        kills += 1;
        let killed_at = Instant::now();
        let new_leader = cluster
            .wait_for_leader(Some(leader), Duration::from_secs(20))
            .await;
        elections += 1;
        println!(
            "round {round}: killed leader {leader} after {before} acknowledged writes; node {new_leader} leads {:?} later",
            killed_at.elapsed()
        );
        // Writes go on through the new leader for a while.
        tokio::time::sleep(Duration::from_millis(300 + rng.below(500))).await;
        let target = cluster
            .metrics(new_leader)
            .await
            .and_then(|m| m["last_applied"].as_u64());
        cluster.nodes.get_mut(&leader).unwrap().start();
        wait_applied(&cluster, leader, target).await;
        leader = new_leader;

        // Then a follower: the leader keeps its quorum with the other one,
        // and the killed follower catches up from the leader's log when it
        // is back.
        let followers = cluster.followers(leader);
        let follower = followers[rng.below(followers.len() as u64) as usize];
        cluster.nodes.get_mut(&follower).unwrap().kill();
        follower_kills += 1;
        tokio::time::sleep(Duration::from_millis(200 + rng.below(500))).await;
        let target = cluster
            .metrics(leader)
            .await
            .and_then(|m| m["last_applied"].as_u64());
        println!(
            "round {round}: killed follower {follower}; the leader applied {target:?} meanwhile"
        );
        cluster.nodes.get_mut(&follower).unwrap().start();
        wait_applied(&cluster, follower, target).await;
    }
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.await.unwrap();
    }
    let applied = cluster.wait_caught_up(Duration::from_secs(30)).await;

    let ledger = Arc::try_unwrap(ledger)
        .ok()
        .expect("the writers are done")
        .into_inner();
    assert!(
        ledger.acknowledged.len() > 100,
        "the client made progress: {} acknowledged",
        ledger.acknowledged.len()
    );
    for &id in cluster.nodes.keys() {
        let mut present = 0;
        for (key, written) in &ledger.attempted {
            match cluster.local_get(id, key).await {
                Some(found) => {
                    assert_eq!(
                        &found, written,
                        "node {id}: {key} has a value never written"
                    );
                    present += 1;
                }
                None => assert!(
                    !ledger.acknowledged.contains_key(key),
                    "node {id}: acknowledged {key} is missing"
                ),
            }
        }
        for (key, attempts) in &ledger.hot_attempts {
            let found = cluster.local_get(id, key).await;
            let acked = ledger.hot_acknowledged.get(key).copied().unwrap_or(0);
            match found {
                Some(found) => {
                    let n = attempts
                        .get(&found)
                        .unwrap_or_else(|| panic!("node {id}: {key} has a value never written"));
                    assert!(
                        *n >= acked,
                        "node {id}: {key} went back to write {n} after write {acked} was acknowledged"
                    );
                    present += 1;
                }
                None => assert_eq!(acked, 0, "node {id}: acknowledged {key} is missing"),
            }
        }
        let keys = cluster.metrics(id).await.unwrap()["keys"].as_u64().unwrap();
        assert_eq!(keys, present, "node {id} holds keys nobody wrote");
    }
    println!(
        "writes acknowledged: {}, attempted: {}, leader kills: {kills}, follower kills: {follower_kills}, elections observed: {elections}, \
         last applied index: {applied}, took {:?}",
        ledger.acknowledged.len() + ledger.hot_acknowledged.len(),
        ledger.attempted.len()
            + ledger
                .hot_attempts
                .values()
                .map(HashMap::len)
                .sum::<usize>(),
        started.elapsed()
    );
    assert!(kills >= KILLS);
    assert!(follower_kills >= KILLS);
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "the test took too long"
    );
}
