//! Logs written by okaywal 0.2 and 0.3 (the published crate), whose
//! segment files share the `wal-{id}` names of this crate's but not its
//! byte format. `FORMAT.md` ("Logs written by okaywal 0.2 and 0.3")
//! describes that format and what opening such a log does.
//!
//! At open, a `wal-{id}` file whose header starts with `okw\0` is walked
//! the way okaywal 0.3.1's own recovery walks it; its committed entries are
//! replayed through [`LogManager::recover`] before this crate's segments,
//! then handed to [`LogManager::checkpoint_to`] before the open returns, and
//! only then is the file recycled. A `wal-{id}-cp` file (a segment 0.3 had
//! checkpointed) holds nothing to replay: only the entry ids in it count.
//! A `wal-{id}` or `wal-{id}-cp` file whose header belongs to neither
//! format, and is not unwritten either, makes the open fail: it is never
//! reused or overwritten.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use crate::config::RecoveryMode;
use crate::fs::{FileSystem, OpenMode};
use crate::manager::{LogManager, RecoveredSegment, Recovery};
use crate::position::EntryId;
use crate::recovery::SegmentReader;
use crate::segment::FileName;
use crate::WriteAheadLog;

mod format;
#[cfg(test)]
mod tests;

pub(crate) use format::*;

/// A 0.2/0.3 segment with what its walk found.
#[derive(Debug)]
struct Scanned {
    segment: LegacySegment,
    scan: LegacyScan,
    abandoned: bool,
}

impl Scanned {
    fn highest_id(&self) -> u64 {
        self.scan.max_entry_id.unwrap_or(0).max(self.segment.id)
    }

    fn reader(&self) -> SegmentReader {
        SegmentReader::legacy(
            self.segment.id,
            &self.segment.header.version_info,
            self.segment.file.clone(),
            self.scan.entries.clone(),
            self.scan.end,
        )
    }
}

/// The okaywal 0.2/0.3 files of a log directory.
#[derive(Debug, Default)]
pub(crate) struct LegacyLog {
    segments: Vec<Scanned>,
    /// `wal-{id}-cp` files, with the highest entry id each shows.
    checkpointed: Vec<(PathBuf, u64)>,
    max_id: u64,
}

impl LegacyLog {
    /// Walks the 0.2/0.3 `segments` (in id order) and the checkpointed
    /// files named `wal-{id}-cp` in `checkpointed`. A committed entry that
    /// fails its CRC-32C while committed entries follow it is handled as
    /// `mode` says for damage; a foreign header in a checkpointed file is
    /// an error.
    pub fn read(
        fs: &dyn FileSystem,
        segments: Vec<LegacySegment>,
        checkpointed: Vec<(u64, PathBuf)>,
        buffer_bytes: usize,
        mode: RecoveryMode,
    ) -> io::Result<Self> {
        let mut log = LegacyLog::default();
        let uppers: Vec<Option<u64>> = segments
            .iter()
            .skip(1)
            .map(|s| Some(s.id))
            .chain([None])
            .collect();
        let mut cut = false;
        for (segment, upper) in segments.into_iter().zip(uppers) {
            let mut scan = scan(
                &*segment.file,
                segment.id,
                &segment.header,
                upper,
                buffer_bytes,
            )?;
            log.max_id = log
                .max_id
                .max(segment.id.saturating_sub(1))
                .max(scan.max_entry_id.unwrap_or(0));
            if cut {
                scan.entries.clear();
            } else if let Some(damage) = scan.damage.clone() {
                match mode {
                    RecoveryMode::ErrorOnCorruption => {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!(
                                "{}: segment in the {FORMAT_NAME}: entry {} was committed but its \
                                 chunk at offset {} fails its CRC-32C, and entries committed after \
                                 it follow; nothing was changed. Open with RecoveryMode::PointInTime \
                                 to keep only the entries before it, or RecoveryMode::SkipCorrupted \
                                 to skip it",
                                segment.path.display(),
                                damage.entry_id,
                                damage.offset
                            ),
                        ));
                    }
                    RecoveryMode::PointInTime => {
                        scan.entries.retain(|&id, _| id < damage.entry_id);
                        cut = true;
                    }
                    RecoveryMode::SkipCorrupted => {}
                }
            }
            log.segments.push(Scanned {
                segment,
                scan,
                abandoned: false,
            });
        }
        for (id, path) in checkpointed {
            let file = fs.open(&path, OpenMode::Read)?;
            let len = file.len()?;
            let mut header_bytes = vec![0; len.min(crate::format::HEADER_SIZE) as usize];
            file.read_exact_at(&mut header_bytes, 0)?;
            let highest =
                match classify(&header_bytes) {
                    HeaderKind::Unwritten => id,
                    HeaderKind::Legacy(header) => {
                        let scan = scan(&*file, id, &header, None, buffer_bytes)?;
                        scan.max_entry_id.unwrap_or(0).max(id)
                    }
                    HeaderKind::Ours => return Err(foreign_file_error(
                        &path,
                        "this crate's header under a name (`wal-{id}-cp`) only okaywal 0.2 and \
                         0.3 use",
                    )),
                    HeaderKind::Foreign(what) => return Err(foreign_file_error(&path, &what)),
                };
            log.max_id = log.max_id.max(highest);
            log.checkpointed.push((path, highest));
        }
        Ok(log)
    }

    /// The highest entry id the 0.2/0.3 files show (names included).
    pub fn max_id(&self) -> u64 {
        self.max_id
    }

    /// Replays the committed entries of every segment the manager does not
    /// abandon, in id order.
    pub fn recover(&mut self, manager: &mut dyn LogManager) -> io::Result<()> {
        for scanned in &mut self.segments {
            let info = RecoveredSegment {
                id: scanned.segment.id,
                version_info: scanned.segment.header.version_info.clone(),
            };
            if manager.should_recover_segment(&info)? == Recovery::Abandon {
                scanned.abandoned = true;
                continue;
            }
            let mut reader = scanned.reader();
            while let Some(mut entry) = reader.read_entry()? {
                manager.recover(&mut entry)?;
            }
        }
        Ok(())
    }

    /// Checkpoints every segment not abandoned through `manager`, in
    /// order, recycling each once its checkpoint returned, then recycles
    /// the checkpointed files. Of the files it recycled, only the one
    /// named for the highest id is kept (as `wal-recycled-{id}`, which
    /// keeps later ids above every id the old log used); the rest are
    /// removed. On an error the segments not yet checkpointed are kept.
    pub fn checkpoint_and_recycle(
        self,
        log: &WriteAheadLog,
        manager: &mut dyn LogManager,
    ) -> io::Result<()> {
        if self.segments.is_empty() && self.checkpointed.is_empty() {
            return Ok(());
        }
        let inner = &log.inner;
        let fs = inner.fs();
        let directory = inner.directory().to_path_buf();
        // Calls the manager makes on the log from `checkpoint_to` behave
        // as they do on the background thread (`checkpoint_active` seals
        // without waiting for a checkpoint nobody else would run).
        let _as_maintenance = AsMaintenanceThread::enter(log);
        let mut kept = BTreeMap::new();
        for scanned in self.segments {
            let path = scanned.segment.path.clone();
            if let (false, Some(last)) = (scanned.abandoned, scanned.scan.max_entry_id) {
                let mut reader = scanned.reader();
                let id = scanned.segment.id;
                inner.set_legacy_file(
                    id,
                    Some(OpenLegacyFile {
                        file: scanned.segment.file.clone(),
                        records_start: scanned.segment.header.records_start.unwrap_or(u64::MAX),
                    }),
                );
                let result = manager.checkpoint_to(EntryId(last), &mut reader, log);
                inner.set_legacy_file(id, None);
                result.map_err(|err| {
                    io::Error::new(
                        err.kind(),
                        format!(
                            "{}: checkpointing this segment in the {FORMAT_NAME} while opening the \
                             log failed (the segment is kept, and the next open replays and \
                             checkpoints it again): {err}",
                            path.display()
                        ),
                    )
                })?;
            }
            let highest = scanned.highest_id();
            drop(scanned);
            retire(fs, &directory, &path, highest, &mut kept)?;
        }
        for (path, highest) in self.checkpointed {
            retire(fs, &directory, &path, highest, &mut kept)?;
        }
        let highest = kept.keys().next_back().copied();
        let surplus: Vec<PathBuf> = kept
            .into_iter()
            .filter(|(id, _)| Some(*id) != highest)
            .map(|(_, path)| path)
            .collect();
        if !surplus.is_empty() {
            for path in surplus {
                fs.remove_file(&path)?;
            }
            fs.sync_dir(&directory)?;
        }
        Ok(())
    }
}

/// Renames a 0.2/0.3 file whose entries are safe to `wal-recycled-{id}`
/// (recording in `kept` the names it made), or removes it if that name
/// exists already; the directory is synced before the next file is
/// looked at, so a segment is never replayed after a later one is gone.
fn retire(
    fs: &dyn FileSystem,
    directory: &Path,
    path: &Path,
    highest: u64,
    kept: &mut BTreeMap<u64, PathBuf>,
) -> io::Result<()> {
    let recycled = FileName::Recycled(highest).path_in(directory);
    if kept.contains_key(&highest) || fs.exists(&recycled)? {
        fs.remove_file(path)?;
    } else {
        fs.rename(path, &recycled)?;
        kept.insert(highest, recycled);
    }
    fs.sync_dir(directory)
}

/// Marks the calling thread as the log's maintenance thread while the 0.3
/// segments are checkpointed during open (before the real one starts).
struct AsMaintenanceThread<'a> {
    log: &'a WriteAheadLog,
}

impl<'a> AsMaintenanceThread<'a> {
    fn enter(log: &'a WriteAheadLog) -> Self {
        log.inner
            .set_maintenance_thread(Some(std::thread::current().id()));
        Self { log }
    }
}

impl Drop for AsMaintenanceThread<'_> {
    fn drop(&mut self) {
        self.log.inner.set_maintenance_thread(None);
    }
}
