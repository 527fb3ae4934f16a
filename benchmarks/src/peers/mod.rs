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
