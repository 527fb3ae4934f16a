//! Shared code of the benchmark binaries: payloads, timing, statistics,
//! data directories and the machine description.

pub mod floor;
pub mod harness;
pub mod wal;

use std::path::PathBuf;

/// Incompressible bytes: a seeded xorshift stream, so peers that compress
/// gain nothing over those that do not.
#[must_use]
pub fn payload(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed ^ 0x9E37_79B9_7F4A_7C15;
    let mut bytes = Vec::with_capacity(len + 8);
    while bytes.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        bytes.extend_from_slice(&state.to_le_bytes());
    }
    bytes.truncate(len);
    bytes
}

/// The directory under which benchmark data directories are created: on
/// the project's disk (not `/tmp`, which may be memory).
#[must_use]
pub fn data_root() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("target")
        .join("bench-data");
    std::fs::create_dir_all(&root).expect("creating target/bench-data");
    root
}

/// A fresh temporary directory under [`data_root`], removed when dropped.
#[must_use]
pub fn temp_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(data_root()).expect("creating a benchmark data directory")
}

/// One line describing the machine: kernel, CPUs, and the file system of
/// the data directory.
#[must_use]
pub fn machine_description() -> String {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown kernel".into());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let root = data_root().canonicalize().unwrap_or_else(|_| data_root());
    let mut fs = String::from("unknown file system");
    let mut best = 0;
    if let Ok(mounts) = std::fs::read_to_string("/proc/mounts") {
        for line in mounts.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() >= 3 && root.starts_with(fields[1]) && fields[1].len() >= best {
                best = fields[1].len();
                fs = format!("{} on {} ({})", fields[2], fields[0], fields[1]);
            }
        }
    }
    format!("Linux {kernel}, {cpus} CPUs, data on {fs}")
}
