//! The peers: published systems a user would pick instead of okaywal or
//! sediment. Each is an optional dependency behind a cargo feature of this
//! crate (`peers` turns on all but RocksDB), so the workspace's own builds
//! and tests never compile them.

#[cfg(feature = "fjall")]
pub mod fjall;
#[cfg(feature = "marble")]
pub mod marble;
#[cfg(feature = "okaywal-0.3")]
pub mod okaywal03;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "raft-engine")]
pub mod raft_engine;
#[cfg(feature = "redb")]
pub mod redb;
#[cfg(feature = "rocksdb")]
pub mod rocksdb;
#[cfg(feature = "sharded-log")]
pub mod sharded_log;
#[cfg(feature = "sqlite")]
pub mod sqlite;

/// Each peer system: its name in `--systems`, the cargo feature that
/// compiles it in, and whether this build has it.
pub const FEATURES: &[(&str, &str, bool)] = &[
    ("okaywal-0.3", "okaywal-0.3", cfg!(feature = "okaywal-0.3")),
    ("raft-engine", "raft-engine", cfg!(feature = "raft-engine")),
    ("sharded-log", "sharded-log", cfg!(feature = "sharded-log")),
    ("rocksdb", "rocksdb", cfg!(feature = "rocksdb")),
    ("postgresql", "postgres", cfg!(feature = "postgres")),
    ("sqlite", "sqlite", cfg!(feature = "sqlite")),
    ("redb", "redb", cfg!(feature = "redb")),
    ("fjall", "fjall", cfg!(feature = "fjall")),
    ("marble", "marble", cfg!(feature = "marble")),
];

/// Whether `system` can run in this build (our own systems always can).
#[must_use]
pub fn compiled_in(system: &str) -> bool {
    FEATURES
        .iter()
        .find(|(name, _, _)| *name == system)
        .map_or(true, |(_, _, on)| *on)
}

/// The cargo feature that compiles `system` in, if it is a peer.
#[must_use]
pub fn feature_of(system: &str) -> Option<&'static str> {
    FEATURES
        .iter()
        .find(|(name, _, _)| *name == system)
        .map(|(_, feature, _)| *feature)
}

/// The connection string in a `PG_URL` value. `benchmarks/pg.sh start`
/// prints the bare string; an `export PG_URL=...` line (what `pg.sh env`
/// prints, for `eval`) pasted whole, and quotes, are taken too.
#[must_use]
pub fn pg_url(raw: &str) -> &str {
    let url = raw.trim();
    let url = url.strip_prefix("export ").map_or(url, str::trim_start);
    let url = url.strip_prefix("PG_URL=").unwrap_or(url);
    let unquoted = ['"', '\'']
        .iter()
        .find_map(|q| url.strip_prefix(*q).and_then(|u| u.strip_suffix(*q)));
    unquoted.unwrap_or(url).trim()
}

/// Why `system` cannot be opened.
#[must_use]
pub fn not_available(system: &str) -> String {
    match feature_of(system) {
        Some("rocksdb") => "not compiled in (build with `--features peers,rocksdb`; needs \
                            clang and libclang-dev; see benchmarks/README.md for linking \
                            Debian's librocksdb-dev instead of building RocksDB)"
            .to_string(),
        Some(feature) => {
            format!("not compiled in (build with `--features peers` or `--features {feature}`)")
        }
        None => format!("unknown system {system:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::pg_url;

    #[test]
    fn pg_url_takes_the_bare_string_an_export_line_and_quotes() {
        let url = "postgresql://bench@127.0.0.1:54320/postgres";
        for raw in [
            url.to_string(),
            format!("{url}\n"),
            format!("export PG_URL={url}"),
            format!("PG_URL={url}"),
            format!("export PG_URL=\"{url}\"\n"),
            format!("'{url}'"),
        ] {
            assert_eq!(pg_url(&raw), url, "{raw:?}");
        }
        assert_eq!(pg_url("  "), "");
    }
}
