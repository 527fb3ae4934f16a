//! What a node counts, and `GET /metrics` in the Prometheus text format.
//!
//! Every name starts with `sediment_raft_`:
//!
//! | name | type | what |
//! | --- | --- | --- |
//! | `http_requests_total{endpoint, status}` | counter | answered requests by endpoint (`kv_get`, `kv_put`, `kv_delete`, `cluster`, `raft_append`, `raft_vote`, `raft_snapshot`, `raft_stage`, `metrics`, `other`) and HTTP status |
//! | `writes_total` | counter | `PUT`s and `DELETE`s acknowledged (200) |
//! | `reads_total` | counter | `GET /kv` answered 200 or 404 |
//! | `errors_total{status}` | counter | requests answered 4xx or 5xx, by status |
//! | `term` | gauge | the node's current Raft term |
//! | `is_leader` | gauge | 1 while this node's Raft state is Leader, else 0 |
//! | `leader_id` | gauge | the leader this node knows of (absent when none) |
//! | `last_log_index` | gauge | the node's last log index |
//! | `last_applied_index` | gauge | the last entry applied to the state machine |
//! | `apply_lag` | gauge | `last_log_index − last_applied_index` |
//! | `purged_index` | gauge | log entries up to here were purged |
//! | `snapshot_index` | gauge | last entry the current snapshot covers |
//! | `snapshots_built_total` | counter | snapshots this node built since it started |
//! | `snapshots_installed_total` | counter | snapshots received from a leader and installed |
//! | `log_bytes` | gauge | bytes of the Raft log's files on disk (WAL segments, archives, metadata) |
//! | `log_syncs_total` | counter | syncs of the Raft log (one covers every append waiting for it) |
//! | `log_sync_seconds` | histogram | time of each log sync |
//! | `keys` | gauge | keys in the state machine |
//! | `log_appends_total` | counter | appends openraft asked of this node's log (entries it wrote, or found staged) |
//! | `log_appends_prestaged_total` | counter | those whose every entry was already staged: no write and no sync of their own |
//! | `staged_entries_total{outcome}` | counter | entries this node wrote from a leader's `/raft/stage` request, by what became of them: `used` (openraft appended them: their write and sync were done early), `wasted` (dropped before openraft appended them: a new leader replaced them, a truncation or a snapshot) |
//! | `stage_requests_total{result}` | counter | on a leader, `/raft/stage` requests to its followers, by result: `staged`, `ignored` (the follower's log or vote did not match), `failed` (no answer, or an error), `dropped` (not sent: too many waiting for that follower) |
//!
//! Nothing secret is ever part of a metric: no keys, values or credentials.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

/// Upper bounds of [`Histogram`]'s buckets, in seconds.
pub const BUCKETS: [f64; 12] = [
    0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// A latency histogram with the fixed [`BUCKETS`] (plus `+Inf`).
#[derive(Debug, Default)]
pub struct Histogram {
    /// Observations at or below each bound (not cumulative; the last slot
    /// is `+Inf`).
    counts: [AtomicU64; BUCKETS.len() + 1],
    sum_nanos: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let slot = BUCKETS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(BUCKETS.len());
        self.counts[slot].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// How many observations were recorded.
    #[must_use]
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// Appends the histogram as `name_bucket`, `name_sum` and `name_count`.
    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, count) in self.counts.iter().enumerate() {
            cumulative += count.load(Ordering::Relaxed);
            let le = BUCKETS
                .get(i)
                .map_or_else(|| "+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
        }
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {cumulative}");
    }
}

/// The counters a node keeps about the requests it answered and the
/// snapshots it made.
#[derive(Debug, Default)]
pub struct Counters {
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    writes: AtomicU64,
    reads: AtomicU64,
}

impl Counters {
    /// Counts one answered request.
    pub fn request(&self, endpoint: &'static str, status: u16) {
        *self.requests.lock().entry((endpoint, status)).or_default() += 1;
        match (endpoint, status) {
            ("kv_put" | "kv_delete", 200) => {
                self.writes.fetch_add(1, Ordering::Relaxed);
            }
            ("kv_get", 200 | 404) => {
                self.reads.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    /// Acknowledged writes so far.
    #[must_use]
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }
}

/// What pre-staging did on this node (see `FORMAT.md`, "Pre-staged
/// entries"): the follower side counts entries and appends, the leader side
/// its requests.
#[derive(Debug, Default)]
pub struct StageCounters {
    /// Appends openraft asked of the log.
    pub appends: AtomicU64,
    /// Appends whose every entry was already staged.
    pub appends_prestaged: AtomicU64,
    /// Staged entries openraft then appended (their write was skipped).
    pub used: AtomicU64,
    /// Staged entries dropped before openraft appended them.
    pub wasted: AtomicU64,
    /// Stage requests a follower staged.
    pub sent_staged: AtomicU64,
    /// Stage requests a follower answered but did not stage.
    pub sent_ignored: AtomicU64,
    /// Stage requests that failed (no answer or an error status).
    pub sent_failed: AtomicU64,
    /// Stage requests not sent because too many waited for their follower.
    pub dropped: AtomicU64,
}

impl StageCounters {
    /// Adds `n` to `counter`.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Reads `counter`.
    #[must_use]
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    fn render(&self, out: &mut String) {
        counter(
            out,
            "log_appends_total",
            "Appends openraft asked of this node's log.",
            Self::get(&self.appends),
        );
        counter(
            out,
            "log_appends_prestaged_total",
            "Appends whose every entry was already staged (no write or sync of their own).",
            Self::get(&self.appends_prestaged),
        );
        let _ = writeln!(
            out,
            "# HELP sediment_raft_staged_entries_total Entries written ahead from a leader's \
             stage request, by outcome."
        );
        let _ = writeln!(out, "# TYPE sediment_raft_staged_entries_total counter");
        for (outcome, value) in [("used", &self.used), ("wasted", &self.wasted)] {
            let _ = writeln!(
                out,
                "sediment_raft_staged_entries_total{{outcome=\"{outcome}\"}} {}",
                Self::get(value)
            );
        }
        let _ = writeln!(
            out,
            "# HELP sediment_raft_stage_requests_total Stage requests a leader made of its \
             followers, by result."
        );
        let _ = writeln!(out, "# TYPE sediment_raft_stage_requests_total counter");
        for (result, value) in [
            ("staged", &self.sent_staged),
            ("ignored", &self.sent_ignored),
            ("failed", &self.sent_failed),
            ("dropped", &self.dropped),
        ] {
            let _ = writeln!(
                out,
                "sediment_raft_stage_requests_total{{result=\"{result}\"}} {}",
                Self::get(value)
            );
        }
    }
}

/// The endpoint label of a request path.
#[must_use]
pub fn endpoint(method: &axum::http::Method, path: &str) -> &'static str {
    use axum::http::Method;
    if path == crate::network::APPEND_PATH {
        "raft_append"
    } else if path == crate::network::VOTE_PATH {
        "raft_vote"
    } else if path == crate::network::SNAPSHOT_PATH {
        "raft_snapshot"
    } else if path == crate::stage::STAGE_PATH {
        "raft_stage"
    } else if path == "/metrics" {
        "metrics"
    } else if path.starts_with("/cluster/") {
        "cluster"
    } else if path.starts_with("/kv") {
        match *method {
            Method::GET => "kv_get",
            Method::PUT => "kv_put",
            Method::DELETE => "kv_delete",
            _ => "other",
        }
    } else {
        "other"
    }
}

/// The node's state at one moment, as the text exposition renders it.
#[derive(Debug, Default, Clone)]
pub struct Gauges {
    /// Current term.
    pub term: u64,
    /// Whether this node leads (its Raft server state is Leader).
    pub is_leader: bool,
    /// The leader it knows of.
    pub leader_id: Option<u64>,
    /// Last log index.
    pub last_log_index: Option<u64>,
    /// Last applied index.
    pub last_applied_index: Option<u64>,
    /// Last purged index.
    pub purged_index: Option<u64>,
    /// Last index of the current snapshot.
    pub snapshot_index: Option<u64>,
    /// Snapshots built since the node started.
    pub snapshots_built: u64,
    /// Snapshots installed since the node started.
    pub snapshots_installed: u64,
    /// Bytes of the log's files.
    pub log_bytes: u64,
    /// Keys in the map.
    pub keys: u64,
}

fn gauge(out: &mut String, name: &str, help: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "# HELP sediment_raft_{name} {help}");
    let _ = writeln!(out, "# TYPE sediment_raft_{name} gauge");
    let _ = writeln!(out, "sediment_raft_{name} {value}");
}

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(out, "# HELP sediment_raft_{name} {help}");
    let _ = writeln!(out, "# TYPE sediment_raft_{name} counter");
    let _ = writeln!(out, "sediment_raft_{name} {value}");
}

/// Renders everything in the Prometheus text format (version 0.0.4).
#[must_use]
pub fn render(
    counters: &Counters,
    gauges: &Gauges,
    log_syncs: &Histogram,
    staging: &StageCounters,
) -> String {
    let mut out = String::new();
    let requests = counters.requests.lock().clone();
    let _ = writeln!(
        out,
        "# HELP sediment_raft_http_requests_total Requests answered, by endpoint and status."
    );
    let _ = writeln!(out, "# TYPE sediment_raft_http_requests_total counter");
    let mut errors: BTreeMap<u16, u64> = BTreeMap::new();
    for ((endpoint, status), count) in &requests {
        let _ = writeln!(
            out,
            "sediment_raft_http_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} {count}"
        );
        if *status >= 400 {
            *errors.entry(*status).or_default() += count;
        }
    }
    let _ = writeln!(
        out,
        "# HELP sediment_raft_errors_total Requests answered with a 4xx or 5xx status."
    );
    let _ = writeln!(out, "# TYPE sediment_raft_errors_total counter");
    for (status, count) in errors {
        let _ = writeln!(
            out,
            "sediment_raft_errors_total{{status=\"{status}\"}} {count}"
        );
    }
    counter(
        &mut out,
        "writes_total",
        "PUTs and DELETEs acknowledged.",
        counters.writes(),
    );
    counter(
        &mut out,
        "reads_total",
        "GETs of a key answered (found or not).",
        counters.reads.load(Ordering::Relaxed),
    );
    gauge(&mut out, "term", "The current Raft term.", gauges.term);
    gauge(
        &mut out,
        "is_leader",
        "1 if this node is the leader.",
        u8::from(gauges.is_leader),
    );
    if let Some(leader) = gauges.leader_id {
        gauge(
            &mut out,
            "leader_id",
            "The leader this node knows of.",
            leader,
        );
    }
    let last_log = gauges.last_log_index.unwrap_or(0);
    let applied = gauges.last_applied_index.unwrap_or(0);
    gauge(
        &mut out,
        "last_log_index",
        "The last index in this node's log.",
        last_log,
    );
    gauge(
        &mut out,
        "last_applied_index",
        "The last entry applied to the state machine.",
        applied,
    );
    gauge(
        &mut out,
        "apply_lag",
        "Entries in the log not yet applied.",
        last_log.saturating_sub(applied),
    );
    gauge(
        &mut out,
        "purged_index",
        "Log entries up to this index were purged.",
        gauges.purged_index.unwrap_or(0),
    );
    gauge(
        &mut out,
        "snapshot_index",
        "The last entry the current snapshot covers.",
        gauges.snapshot_index.unwrap_or(0),
    );
    counter(
        &mut out,
        "snapshots_built_total",
        "Snapshots built by this node since it started.",
        gauges.snapshots_built,
    );
    counter(
        &mut out,
        "snapshots_installed_total",
        "Snapshots received from a leader and installed since this node started.",
        gauges.snapshots_installed,
    );
    gauge(
        &mut out,
        "log_bytes",
        "Bytes of the Raft log's files on disk.",
        gauges.log_bytes,
    );
    counter(
        &mut out,
        "log_syncs_total",
        "Syncs of the Raft log.",
        log_syncs.count(),
    );
    log_syncs.render(
        &mut out,
        "sediment_raft_log_sync_seconds",
        "Time of each sync of the Raft log.",
    );
    gauge(&mut out, "keys", "Keys in the state machine.", gauges.keys);
    staging.render(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_end_with_infinity() {
        let histogram = Histogram::default();
        histogram.observe(Duration::from_micros(100));
        histogram.observe(Duration::from_millis(3));
        histogram.observe(Duration::from_secs(5));
        let mut out = String::new();
        histogram.render(&mut out, "h", "help");
        assert!(out.contains("h_bucket{le=\"0.00025\"} 1\n"), "{out}");
        assert!(out.contains("h_bucket{le=\"0.005\"} 2\n"), "{out}");
        assert!(out.contains("h_bucket{le=\"1\"} 2\n"), "{out}");
        assert!(out.contains("h_bucket{le=\"+Inf\"} 3\n"), "{out}");
        assert!(out.contains("h_count 3\n"), "{out}");
        assert_eq!(histogram.count(), 3);
    }

    #[test]
    fn errors_are_summed_by_status_and_writes_counted_once_acknowledged() {
        let counters = Counters::default();
        counters.request("kv_put", 200);
        counters.request("kv_put", 413);
        counters.request("kv_delete", 200);
        counters.request("kv_get", 404);
        counters.request("raft_append", 401);
        counters.request("cluster", 401);
        let out = render(
            &counters,
            &Gauges::default(),
            &Histogram::default(),
            &StageCounters::default(),
        );
        assert!(out.contains("sediment_raft_writes_total 2\n"), "{out}");
        assert!(out.contains("sediment_raft_reads_total 1\n"), "{out}");
        assert!(
            out.contains("sediment_raft_errors_total{status=\"401\"} 2\n"),
            "{out}"
        );
        assert!(
            out.contains(
                "sediment_raft_http_requests_total{endpoint=\"kv_put\",status=\"413\"} 1\n"
            ),
            "{out}"
        );
    }
}
