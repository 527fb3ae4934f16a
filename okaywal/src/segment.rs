//! One segment file: its identity, how far it is durable, its name and its
//! end mark; and the names of the files in a log directory.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use std::io;

use crate::format::{RecordHeader, RecordKind};
use crate::fs::{FileHandle, FileSystem};
use crate::sealed::Layout;

/// A segment file while it is live (active, sealed or being checkpointed).
///
/// Its identity (`id`, `file`, `path`, `version_info`) never changes; how
/// far it is durable, whether its name is, and whether it owes an end
/// mark change only through its methods, which the sync path calls.
#[derive(Debug)]
pub(crate) struct Segment {
    /// The first entry id the segment may hold; also its name and CRC salt.
    id: u64,
    file: Arc<dyn FileHandle>,
    /// The segment's name, `wal-{id}`.
    path: PathBuf,
    /// The name the file still has (a spare's) until the first sync of the
    /// segment renames it to `path`: the header must be durable before the
    /// name is, or recovery would find a `wal-{id}` whose header was lost.
    pending_name: Mutex<Option<PathBuf>>,
    /// Every record below this offset is durable (the last completed sync);
    /// commits are acknowledged against it. The data of a large chunk may
    /// still have been in flight below it (its header was written first).
    synced_to: AtomicU64,
    /// Every byte below this offset is durable, large chunks' data
    /// included: the `durable_mark` written into record headers, which
    /// recovery takes as proof that damage below it is not a torn tail.
    marked_to: AtomicU64,
    /// The directory entry naming this file is durable.
    name_durable: AtomicBool,
    /// Whether this segment owes an end mark (FORMAT.md, "End marks"):
    /// the next segment started while entries were still open here, so its
    /// header could not record where this one ends. The lock is held for
    /// the mark's write only, so that a recycled file never gets one.
    end_mark: Mutex<EndMark>,
    /// The version information in the segment's header.
    version_info: Arc<Vec<u8>>,
    /// How its records are laid out: plain, or encrypted with its key and
    /// generation.
    layout: Layout,
}

impl Segment {
    /// A segment whose bytes below `durable_to` are durable. With a
    /// `pending_name` the file still has that (spare) name, and its real
    /// one becomes durable at its first sync pass.
    pub fn new(
        id: u64,
        file: Arc<dyn FileHandle>,
        path: PathBuf,
        pending_name: Option<PathBuf>,
        durable_to: u64,
        version_info: Arc<Vec<u8>>,
        layout: Layout,
    ) -> Self {
        Self {
            id,
            file,
            path,
            name_durable: pending_name.is_none().into(),
            pending_name: Mutex::new(pending_name),
            synced_to: durable_to.into(),
            marked_to: durable_to.into(),
            end_mark: Mutex::new(EndMark::NotDue),
            version_info,
            layout,
        }
    }

    /// The first entry id the segment may hold; also its name and CRC salt.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The open segment file.
    pub fn file(&self) -> &Arc<dyn FileHandle> {
        &self.file
    }

    /// The segment's name, `wal-{id}`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `bytes` at `offset`, a range the caller reserved (through
    /// `Segments`); not synced.
    pub fn write_reserved(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(bytes, offset)
    }

    /// The version information in the segment's header.
    pub fn version_info(&self) -> &Arc<Vec<u8>> {
        &self.version_info
    }

    /// How its records are laid out: plain, or encrypted with its key and
    /// generation.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Every record below this offset is durable.
    pub fn synced_to(&self) -> u64 {
        self.synced_to.load(Ordering::Acquire)
    }

    /// Every byte below this offset is durable, large chunks' data
    /// included: the durable mark for new record headers.
    pub fn marked_to(&self) -> u64 {
        self.marked_to.load(Ordering::Acquire)
    }

    /// The directory entry naming this file is durable.
    pub fn name_is_durable(&self) -> bool {
        self.name_durable.load(Ordering::Acquire)
    }

    /// A sync that covered the records below `written` (and, if it synced
    /// the file itself, every byte below `complete`) has completed.
    pub fn synced(&self, written: u64, complete: Option<u64>) {
        self.synced_to.fetch_max(written, Ordering::AcqRel);
        if let Some(complete) = complete {
            self.marked_to.fetch_max(complete, Ordering::AcqRel);
        }
    }

    /// Gives the file its real name if it still has its spare one (the
    /// caller has synced its header, and syncs the directory next).
    pub fn rename_to_final(&self, fs: &dyn FileSystem) -> io::Result<()> {
        let mut pending = self.pending_name.lock();
        if let Some(from) = pending.as_ref() {
            fs.rename(from, &self.path)?;
            *pending = None;
        }
        Ok(())
    }

    /// Test access: the spare name the file still has.
    #[cfg(test)]
    pub fn pending_name(&self) -> Option<PathBuf> {
        self.pending_name.lock().clone()
    }

    /// The directory sync after [`Segment::rename_to_final`] completed.
    pub fn name_made_durable(&self) {
        self.name_durable.store(true, Ordering::Release);
    }

    /// The segment owes an end mark (see [`EndMark::Due`]).
    pub fn end_mark_due(&self) -> bool {
        *self.end_mark.lock() == EndMark::Due
    }

    /// The next segment started while entries were open here: an end
    /// mark is owed once this one is closed and durable.
    pub fn owe_end_mark(&self) {
        *self.end_mark.lock() = EndMark::Due;
    }

    /// The segment is being recycled: no end mark may be written into it.
    pub fn retire(&self) {
        *self.end_mark.lock() = EndMark::Retired;
    }

    /// Writes the end mark at `end` if one is owed: a padding record with
    /// no filler whose durable mark is `end` (FORMAT.md, "End marks").
    /// Returns false if none was owed. The caller syncs the file, then
    /// calls [`Segment::end_mark_written`].
    pub fn write_end_mark(&self, end: u64) -> io::Result<bool> {
        // Held for the write only: a sync pass that wants the same mark
        // writes the same bytes, and does not wait for this pass's sync to
        // do so; a retired file never gets one.
        let state = self.end_mark.lock();
        if *state != EndMark::Due {
            return Ok(false);
        }
        let mark = RecordHeader {
            kind: RecordKind::Padding,
            entry_id: self.id,
            length: 0,
            durable_mark: end,
        };
        let mark = self.layout.encode(&mark, 0, self.id, end)?;
        self.file.write_all_at(&mark, end)?;
        Ok(true)
    }

    /// The end mark written by [`Segment::write_end_mark`] is durable.
    pub fn end_mark_written(&self) {
        let mut state = self.end_mark.lock();
        if *state == EndMark::Due {
            *state = EndMark::NotDue;
        }
    }

    /// Every byte below `end` is durable, and so is the file's name: what
    /// a commit whose record ends at `end` waits for. The one test of
    /// durability the log makes.
    pub fn is_durable_to(&self, end: u64) -> bool {
        self.synced_to() >= end && self.name_is_durable()
    }
}

/// Where a segment stands with its end mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EndMark {
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
