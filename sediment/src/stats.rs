//! Space and allocation figures.

use crate::db::Database;
use crate::error::Result;
use crate::format::{grain_size, stratum_capacity, BASINS};
use crate::open::INDEX_FILE;

/// Figures for one basin (grain-size class) that has strata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BasinStats {
    /// The basin number.
    pub basin: u8,
    /// Bytes per grain.
    pub grain_size: u64,
    /// Stratum files.
    pub strata: u32,
    /// Grains holding committed blobs (including archived ones).
    pub grains_used: u64,
    /// Grains of archived, not yet freed, blobs.
    pub grains_archived: u64,
    /// Grains that can be allocated now.
    pub grains_free: u64,
    /// Bytes of the stratum files (and, in an encrypted store, of their
    /// stamps files).
    pub bytes_on_disk: u64,
}

/// What [`Database::stats`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stats {
    /// One entry per basin that has at least one stratum.
    pub basins: Vec<BasinStats>,
    /// WAL files (name, bytes).
    pub wal_files: Vec<(String, u64)>,
    /// Bytes of the commit log files.
    pub commit_log_bytes: u64,
    /// Bytes of the index file.
    pub index_bytes: u64,
    /// Committed blobs whose bytes are still only in the WAL.
    pub blobs_in_wal: u64,
    /// The highest committed sequence.
    pub last_committed: u64,
    /// The sequence of the last committed `checkpoint_to`.
    pub checkpointed_to: u64,
    /// The last WAL entry moved into the strata.
    pub wal_checkpointed_entry: u64,
    /// Memory held by the cache of recently read blobs (see
    /// [`Config::cache_bytes`](crate::Config::cache_bytes)).
    pub cache_bytes: u64,
}

impl Stats {
    /// Bytes of every file of the database.
    #[must_use]
    pub fn total_bytes(&self) -> u64 {
        self.basins.iter().map(|b| b.bytes_on_disk).sum::<u64>()
            + self.wal_files.iter().map(|(_, b)| b).sum::<u64>()
            + self.commit_log_bytes
            + self.index_bytes
    }
}

pub(crate) fn collect(db: &Database) -> Result<Stats> {
    let shared = db.shared();
    let figures = shared.reclamation().figures();
    let archived = figures.archived_grains;
    let mut basins = Vec::new();
    for number in 0..BASINS {
        let strata = shared.strata().of_basin(number);
        if strata.is_empty() {
            continue;
        }
        let number = number as u8;
        let mut stats = BasinStats {
            basin: number,
            grain_size: grain_size(number),
            strata: strata.len() as u32,
            grains_used: 0,
            grains_archived: archived[usize::from(number)],
            grains_free: 0,
            bytes_on_disk: 0,
        };
        for stratum in &strata {
            let (used, busy) = stratum.with_bits(|bits| {
                let used = bits
                    .live_allocated
                    .iter()
                    .map(|w| u64::from(w.count_ones()))
                    .sum::<u64>();
                (used, bits.busy_count)
            });
            stats.grains_used += used;
            stats.grains_free += u64::from(stratum_capacity(number) - busy);
            stats.bytes_on_disk += stratum.bytes_on_disk()?;
        }
        basins.push(stats);
    }
    let mut wal_files = Vec::new();
    let mut index_bytes = 0;
    for name in shared.fs().list_files(shared.directory())? {
        let path = shared.directory().join(&name);
        if !name.starts_with("wal-") && name != INDEX_FILE {
            continue;
        }
        // WAL files are renamed as they are recycled: one listed a moment
        // ago may be gone.
        let len = match shared.fs().open(&path, okaywal::fs::OpenMode::Read) {
            Ok(file) => file.len()?,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
            Err(err) => return Err(err.into()),
        };
        if name == INDEX_FILE {
            index_bytes = len;
        } else {
            wal_files.push((name, len));
        }
    }
    wal_files.sort();
    let commit_log_bytes = shared.lock_store().commit_log_bytes();
    Ok(Stats {
        basins,
        wal_files,
        commit_log_bytes,
        index_bytes,
        blobs_in_wal: shared.reclamation().blobs_in_wal() as u64,
        last_committed: figures.last_committed,
        checkpointed_to: figures.checkpointed_to,
        wal_checkpointed_entry: figures.wal_checkpointed_entry,
        cache_bytes: shared.cache().bytes(),
    })
}
