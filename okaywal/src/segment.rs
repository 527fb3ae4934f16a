//! One segment file and the bookkeeping of writes into it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::fs::FileHandle;

/// A segment file while it is live (active, sealed or being checkpointed).
#[derive(Debug)]
pub(crate) struct Segment {
    /// The first entry id the segment may hold; also its name and CRC salt.
    pub id: u64,
    pub file: Arc<dyn FileHandle>,
    /// The segment's name, `wal-{id}`.
    pub path: PathBuf,
    /// The name the file still has (a spare's) until the first sync of the
    /// segment renames it to `path`: the header must be durable before the
    /// name is, or recovery would find a `wal-{id}` whose header was lost.
    pub pending_name: Mutex<Option<PathBuf>>,
    /// Every record below this offset is durable (the last completed sync);
    /// commits are acknowledged against it. The data of a large chunk may
    /// still have been in flight below it (its header was written first).
    pub synced_to: AtomicU64,
    /// Every byte below this offset is durable, large chunks' data
    /// included: the `durable_mark` written into record headers, which
    /// recovery takes as proof that damage below it is not a torn tail.
    pub marked_to: AtomicU64,
    /// The directory entry naming this file is durable.
    pub name_durable: AtomicBool,
    /// Whether this segment owes an end mark (FORMAT.md, "End marks"):
    /// the next segment started while entries were still open here, so its
    /// header could not record where this one ends. The lock is held for
    /// the mark's write only, so that a recycled file never gets one.
    pub end_mark: Mutex<EndMark>,
    /// The version information in the segment's header.
    pub version_info: Arc<Vec<u8>>,
}

impl Segment {
    /// Every byte below `end` is durable, and so is the file's name: what
    /// a commit whose record ends at `end` waits for. The one test of
    /// durability the log makes.
    pub fn is_durable_to(&self, end: u64) -> bool {
        self.synced_to.load(Ordering::Acquire) >= end && self.name_durable.load(Ordering::Acquire)
    }
}

/// Where a segment stands with its end mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EndMark {
    /// None is owed, or it is written and durable.
    NotDue,
    /// Owed: the next sync pass that finds the segment closed writes it.
    Due,
    /// The segment is being recycled: nothing may be written into it.
    Retired,
}

/// The file a running log holds locked (see `FileSystem::lock_exclusive`);
/// its contents are never read or written.
pub(crate) const LOCK_FILE: &str = "okaywal.lock";

/// What a file name in the log directory means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileName {
    /// `wal-{id}`: a segment whose first entry id is `id`.
    Segment(u64),
    /// `wal-recycled-{id}`: a checkpointed segment whose entry ids were at
    /// most `id`; reusable.
    Recycled(u64),
    /// `wal-spare-{n}`: a fresh preallocated file; reusable.
    Spare(u64),
}

impl FileName {
    pub fn parse(name: &str) -> Option<Self> {
        let rest = name.strip_prefix("wal-")?;
        let number = |s: &str| -> Option<u64> {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                None
            } else {
                s.parse().ok()
            }
        };
        if let Some(id) = rest.strip_prefix("recycled-") {
            number(id).map(FileName::Recycled)
        } else if let Some(n) = rest.strip_prefix("spare-") {
            number(n).map(FileName::Spare)
        } else {
            number(rest).map(FileName::Segment)
        }
    }

    pub fn path_in(self, directory: &Path) -> PathBuf {
        directory.join(match self {
            FileName::Segment(id) => format!("wal-{id}"),
            FileName::Recycled(id) => format!("wal-recycled-{id}"),
            FileName::Spare(n) => format!("wal-spare-{n}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_round_trip() {
        for name in [
            FileName::Segment(1),
            FileName::Recycled(99),
            FileName::Spare(0),
        ] {
            let path = name.path_in(Path::new("d"));
            let file = path.file_name().unwrap().to_str().unwrap();
            assert_eq!(FileName::parse(file), Some(name));
        }
        for junk in [
            "wal-",
            "wal-x",
            "wal--1",
            "wal-1a",
            "index",
            "wal-spare-",
            "wal-+1",
        ] {
            assert_eq!(FileName::parse(junk), None, "{junk}");
        }
    }
}
