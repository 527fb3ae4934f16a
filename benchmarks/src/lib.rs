//! Shared code of the benchmark binaries: payloads, timing, statistics,
//! data directories and the machine description.

pub mod blob;
pub mod chart;
pub mod floor;
pub mod harness;
pub mod peers;
#[cfg(feature = "raft")]
pub mod raft;
pub mod relaunch;
pub mod replication;
pub mod report;
pub mod sections;
pub mod wal;

use std::path::{Path, PathBuf};

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
    root.canonicalize().unwrap_or(root)
}

/// Where `compare` writes its CSV files and charts:
/// `target/benchmarks/` of the workspace.
#[must_use]
pub fn output_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("target")
        .join("benchmarks");
    std::fs::create_dir_all(&dir).expect("creating target/benchmarks");
    dir.canonicalize().unwrap_or(dir)
}

/// Bytes allocated on disk (`st_blocks` × 512, as `du` counts them) by
/// every file under `path`: sparse and preallocated-but-unwritten ranges
/// count only where the file system allocated blocks.
pub fn disk_usage(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let metadata = std::fs::symlink_metadata(path)?;
    let mut total = metadata.blocks() * 512;
    if metadata.is_dir() {
        for entry in std::fs::read_dir(path)? {
            match disk_usage(&entry?.path()) {
                Ok(bytes) => total += bytes,
                // Files that background threads delete while we walk.
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => return Err(err),
            }
        }
    }
    Ok(total)
}

/// A small, seeded xorshift generator: the benchmarks need repeatable
/// choices, not statistical quality.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` (any value, including 0).
    #[must_use]
    pub fn new(seed: u64) -> Self {
        let mut rng = Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        rng.next_u64();
        rng
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next_u64() % (high - low + 1)
    }

    /// A number in `low..=high` whose logarithm is uniform.
    pub fn log_uniform(&mut self, low: u64, high: u64) -> u64 {
        let unit = (self.next_u64() >> 11) as f64 / (1_u64 << 53) as f64;
        let (l, h) = ((low as f64).ln(), (high as f64).ln());
        ((l + (h - l) * unit).exp() as u64).clamp(low, high)
    }
}

/// A block of incompressible bytes to cut blobs from: a blob of `len`
/// bytes is a slice at a random offset, so no two neighbours repeat.
#[derive(Debug, Clone)]
pub struct PayloadPool(Vec<u8>);

impl PayloadPool {
    /// A pool able to serve blobs of up to `max_len` bytes.
    #[must_use]
    pub fn new(max_len: usize, seed: u64) -> Self {
        Self(payload(max_len * 2 + 4096, seed))
    }

    /// `len` bytes starting at a position chosen by `rng`.
    pub fn slice(&self, len: usize, rng: &mut Rng) -> &[u8] {
        let room = self.0.len() - len;
        let start = (rng.next_u64() % (room as u64 + 1)) as usize;
        &self.0[start..start + len]
    }
}

/// The key of the `*-encrypted` systems: a fixed key (the cost of
/// encryption does not depend on the key's bytes).
#[must_use]
pub fn benchmark_key() -> okaywal::encryption::StaticKey {
    okaywal::encryption::StaticKey::new([0x5e; 32])
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
