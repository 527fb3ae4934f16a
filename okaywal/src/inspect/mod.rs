//! Looking at a log without opening it: what recovery would find, with
//! the scanner recovery uses, and never a byte written.
//!
//! [`Configuration::inspect`] lists the segments of a log directory, the
//! entries each would hand to a [`LogManager`](crate::LogManager), the
//! committed entries whose chunks no longer verify (with what is left of
//! their bytes), where each segment ends, and every problem that would
//! make an open fail or drop entries. [`Configuration::open_read_only`]
//! recovers a log the same way, without writing, and serves its chunks.
//! [`Configuration::inspect_segment`] lists one segment's records, for
//! tools that dump the log.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::Configuration;
use crate::format::HEADER_SIZE;
use crate::fs::{FileHandle, FileSystem, LockGuard, OpenMode};
use crate::manager::{LogManager, RecoveredSegment, Recovery};
use crate::position::{EntryId, LogPosition};
use crate::reader::ChunkReader;
use crate::recovery::{find_segments, ChunkLocation, Look, SegmentReader};
use crate::sealed::{ChunkId, Layout};
use crate::segment::{FileName, LOCK_FILE};

mod records;

pub use records::{
    HeaderStatus, InspectedRecord, LogFileName, RecordType, RecordsEnd, SegmentRecords, TornRecord,
};

/// What [`Configuration::inspect`] found in a log directory.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct LogInspection {
    /// The segment files of this crate's format, in id order.
    pub segments: Vec<InspectedSegment>,
    /// Segment files written by okaywal 0.2 or 0.3: an open for writing
    /// replays, checkpoints and recycles them.
    pub older_format: Vec<PathBuf>,
    /// Everything recovery would report or drop entries over: damaged
    /// records, committed entries that no longer verify where the log
    /// proves they did, segments that lost records, damaged headers and
    /// foreign files. Empty for a healthy log (a torn tail is no problem).
    pub problems: Vec<LogProblem>,
}

impl LogInspection {
    /// True if recovery would find nothing wrong.
    #[must_use]
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// One segment file, as recovery walks it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct InspectedSegment {
    /// The segment's id: its first entry id, and the number in its name.
    pub id: u64,
    /// The file.
    pub path: PathBuf,
    /// The version information in its header.
    pub version_info: Vec<u8>,
    /// The segment before it and the offset where that one ended, as this
    /// segment's header records them (see FORMAT.md).
    pub previous: Option<(u64, u64)>,
    /// The complete committed entries, in id order: what recovery hands
    /// to the manager (past damage, as `RecoveryMode::SkipCorrupted`
    /// would).
    pub entries: Vec<EntryId>,
    /// Committed entries whose chunks do not all verify, in file order.
    pub incomplete: Vec<IncompleteEntry>,
    /// Where recovery ends the segment.
    pub end: u64,
    /// Where the walk stopped, and why: the torn or unwritten tail, or
    /// damage (then also in [`LogInspection::problems`]).
    pub stopped: Option<(u64, String)>,
    /// Committed entries whose commit record verifies *past* `end`, where
    /// recovery ends the segment: past a record that does not verify while
    /// no later record's durable mark proves it was synced (a torn tail, as
    /// far as the log can tell), or past an [`incomplete`](Self::incomplete)
    /// entry nothing proves was synced. Recovery drops them. A power cut
    /// while they were being written leaves this (then none was
    /// acknowledged); so does damage to entries that were committed, which
    /// nothing written after them can prove. An inspection cannot tell the
    /// two apart: an application that knows no power cut interrupted
    /// these writes has lost them. Empty when the log simply ends.
    pub committed_past_end: Vec<EntryId>,
}

/// A committed entry whose chunks do not all verify: its commit record is
/// there, so it was committed, but its contents are not whole. Whether it
/// is damage or a write a crash cut short is in
/// [`LogInspection::problems`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct IncompleteEntry {
    /// The entry.
    pub id: EntryId,
    /// The offset of its commit record.
    pub commit_offset: u64,
    /// How many chunks its commit record counts.
    pub chunks_committed: u32,
    /// The chunk records of the entry found before its commit record.
    pub chunks: Vec<InspectedChunk>,
}

/// A chunk of an [`IncompleteEntry`], with its bytes as they are on disk.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct InspectedChunk {
    /// Where the chunk record starts.
    pub position: LogPosition,
    /// Whether its data matches its CRC.
    pub crc_ok: bool,
    /// Its data as stored (the part that is in the file), unverified when
    /// `crc_ok` is false.
    pub data: Vec<u8>,
}

/// Something recovery would report about a log directory.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LogProblem {
    /// The file concerned.
    pub path: PathBuf,
    /// Where in the file, when it applies.
    pub offset: Option<u64>,
    /// What is wrong.
    pub description: String,
}

impl fmt::Display for LogProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.offset {
            Some(offset) => write!(
                f,
                "{} offset {offset}: {}",
                self.path.display(),
                self.description
            ),
            None => write!(f, "{}: {}", self.path.display(), self.description),
        }
    }
}

/// The segments named in `directory`, in id order, and the files named
/// like okaywal 0.2/0.3 checkpointed segments.
fn segment_ids(fs: &dyn FileSystem, directory: &Path) -> io::Result<(Vec<u64>, Vec<PathBuf>)> {
    let mut ids = Vec::new();
    let mut older = Vec::new();
    for name in fs.list_files(directory)? {
        match FileName::parse(&name) {
            Some(FileName::Segment(id)) => ids.push(id),
            Some(_) => {}
            None => {
                if crate::legacy::checkpointed_name(&name).is_some() {
                    older.push(directory.join(&name));
                }
            }
        }
    }
    ids.sort_unstable();
    older.sort();
    Ok((ids, older))
}

/// The data of a chunk as far as it is in the file; in an encrypted
/// segment, the plaintext of its frames up to the first that does not
/// authenticate (bytes that do not are never shown), or a pre-sealed
/// chunk's bytes as its writer sealed them.
fn read_chunk(
    file: &Arc<dyn FileHandle>,
    layout: &Layout,
    entry_id: u64,
    location: ChunkLocation,
) -> io::Result<Vec<u8>> {
    let start = location.offset + layout.header_size() as u64;
    match layout {
        Layout::Sealed(seal) if !location.presealed => {
            let chunk = ChunkId {
                entry_id,
                index: location.index,
                length: location.length,
            };
            let position = LogPosition {
                file_id: 0,
                offset: location.offset,
            };
            let mut reader =
                ChunkReader::sealed(file.clone(), position, start, seal.clone(), chunk, None);
            let mut data = Vec::new();
            let mut piece = vec![0; 64 * 1024];
            loop {
                match reader.read(&mut piece) {
                    Ok(0) | Err(_) => return Ok(data),
                    Ok(n) => data.extend_from_slice(&piece[..n]),
                }
            }
        }
        // A plain segment's chunk, or a pre-sealed one: the bytes as
        // stored.
        _ => {}
    }
    let len = file.len()?;
    let end = (start + u64::from(location.length)).min(len);
    let mut data = vec![0; end.saturating_sub(start) as usize];
    file.read_exact_at(&mut data, start)?;
    Ok(data)
}

impl Configuration {
    /// Looks at the log in this configuration's directory as recovery
    /// would, without opening it: takes no lock, creates, repairs, renames
    /// and writes nothing. Damage does not stop the look: every segment is
    /// walked to its end, and what an open would report is in
    /// [`LogInspection::problems`]. A log that a process is writing may be
    /// seen half-written; inspect a log nobody has open (or hold it open
    /// with [`Configuration::open_read_only`]) for an exact answer.
    ///
    /// An encrypted log is inspected with its key
    /// ([`Configuration::encryption`]); without it, or with a wrong one,
    /// inspection fails with the key error an open would give (see
    /// [`KeyError`](crate::encryption::KeyError)), reading nothing else.
    /// Bytes of an incomplete entry's chunks are shown as far as they
    /// authenticate.
    ///
    /// ```
    /// use okaywal::{Configuration, LogVoid};
    /// # let dir = tempfile::tempdir()?;
    /// let log = Configuration::default_for(dir.path()).open(LogVoid)?;
    /// let mut entry = log.begin_entry()?;
    /// entry.write_chunk(b"hello")?;
    /// let id = entry.commit()?;
    /// log.shutdown()?;
    ///
    /// let inspection = Configuration::default_for(dir.path()).inspect()?;
    /// assert!(inspection.is_ok());
    /// assert!(inspection.segments.iter().any(|s| s.entries.contains(&id)));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn inspect(&self) -> io::Result<LogInspection> {
        self.validate()?;
        let fs = &*self.file_system;
        let (ids, mut older_format) = segment_ids(fs, &self.directory)?;
        let found = find_segments(
            fs,
            &self.directory,
            &ids,
            self.buffer_bytes,
            self.encryption.as_ref(),
            Look::Inspect,
        )?;
        older_format.extend(found.legacy.iter().map(|legacy| legacy.path.clone()));
        older_format.sort();
        let mut segments = Vec::with_capacity(found.segments.len());
        for segment in &found.segments {
            let mut incomplete = Vec::with_capacity(segment.scan.incomplete.len());
            for entry in segment.scan.incomplete.iter().chain(&segment.scan.unproven) {
                let mut chunks = Vec::with_capacity(entry.chunks.len());
                for chunk in &entry.chunks {
                    chunks.push(InspectedChunk {
                        position: LogPosition {
                            file_id: segment.id,
                            offset: chunk.offset,
                        },
                        crc_ok: !entry.bad.contains(chunk),
                        data: read_chunk(&segment.file, &segment.layout, entry.id, *chunk)?,
                    });
                }
                let mut count = vec![0_u8; segment.layout.header_size()];
                segment.file.read_exact_at(&mut count, entry.commit)?;
                let chunks_committed = segment
                    .layout
                    .decode(&count, segment.id, entry.commit)
                    .map_or(0, |(header, _)| header.length);
                incomplete.push(IncompleteEntry {
                    id: EntryId(entry.id),
                    commit_offset: entry.commit,
                    chunks_committed,
                    chunks,
                });
            }
            segments.push(InspectedSegment {
                id: segment.id,
                path: segment.path.clone(),
                version_info: segment.header.version_info.clone(),
                previous: segment.header.previous,
                entries: segment
                    .scan
                    .committed
                    .keys()
                    .map(|id| EntryId(*id))
                    .collect(),
                incomplete,
                end: segment.scan.end,
                stopped: segment.scan.stopped.clone(),
                committed_past_end: segment
                    .scan
                    .commits_past_stop
                    .iter()
                    .map(|id| EntryId(*id))
                    .collect(),
            });
        }
        let problems = found
            .problems
            .into_iter()
            .map(|(path, offset, description)| LogProblem {
                path,
                offset,
                description,
            })
            .collect();
        Ok(LogInspection {
            segments,
            older_format,
            problems,
        })
    }

    /// Opens the log read-only: recovers it as [`Configuration::open`]
    /// would, handing every entry to `manager`'s
    /// [`LogManager::recover`](crate::LogManager::recover) (and honouring
    /// [`LogManager::should_recover_segment`](crate::LogManager::should_recover_segment)),
    /// but writes nothing at all: no spare segment, no repair, no
    /// point-in-time cut on disk (damage is handled as
    /// [`Configuration::recovery_mode`] says, in memory), no checkpoint.
    /// The returned [`ReadOnlyLog`] serves the chunks of the recovered
    /// entries by position.
    ///
    /// An encrypted log needs its key, as for [`Configuration::open`].
    ///
    /// It holds the log's lock shared: any number of read-only opens may
    /// run at once, none while a writer has the log open, and a writer
    /// cannot open it while one lives (both fail with
    /// [`io::ErrorKind::WouldBlock`] naming the lock file). A directory
    /// holding an okaywal 0.2/0.3 log is refused: opening it for writing
    /// once converts it.
    ///
    /// ```
    /// use okaywal::{Configuration, LogVoid};
    /// # let dir = tempfile::tempdir()?;
    /// let log = Configuration::default_for(dir.path()).open(LogVoid)?;
    /// let mut entry = log.begin_entry()?;
    /// let record = entry.write_chunk(b"hello")?;
    /// entry.commit()?;
    /// log.shutdown()?;
    /// drop(log); // the writer's lock goes with its last handle
    ///
    /// let log = Configuration::default_for(dir.path()).open_read_only(LogVoid)?;
    /// let mut chunk = log.read_at(record.position)?;
    /// assert_eq!(chunk.read_all()?, b"hello");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn open_read_only<Manager: LogManager>(
        self,
        mut manager: Manager,
    ) -> io::Result<ReadOnlyLog> {
        self.validate()?;
        let fs = self.file_system.clone();
        let directory = self.directory.clone();
        let lock = fs.lock_shared(&directory.join(LOCK_FILE))?;
        let (ids, older) = segment_ids(&*fs, &directory)?;
        let found = find_segments(
            &*fs,
            &directory,
            &ids,
            self.buffer_bytes,
            self.encryption.as_ref(),
            Look::ReadOnly(self.recovery_mode),
        )?;
        for path in &older {
            // A file named as 0.3 names a checkpointed segment, but with
            // contents of neither format, is refused as an open for
            // writing refuses it.
            let file = fs.open(path, OpenMode::Read)?;
            let mut header = vec![0; file.len()?.min(HEADER_SIZE) as usize];
            file.read_exact_at(&mut header, 0)?;
            crate::legacy::refuse_foreign(path, &header)?;
        }
        if let Some(path) = older
            .first()
            .or_else(|| found.legacy.first().map(|legacy| &legacy.path))
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} holds a log in the okaywal 0.3 format: open the log for writing once \
                     to replay and convert it; it cannot be read without writing",
                    path.display()
                ),
            ));
        }
        let mut segments = BTreeMap::new();
        let mut last_entry_id = None;
        for segment in found.segments {
            let info = RecoveredSegment {
                id: segment.id,
                version_info: segment.header.version_info.clone(),
            };
            if manager.should_recover_segment(&info)? == Recovery::Abandon {
                continue;
            }
            if let Some(last) = segment.scan.committed.keys().next_back() {
                last_entry_id = last_entry_id.max(Some(EntryId(*last)));
            }
            let mut reader = SegmentReader::new(
                segment.id,
                &info.version_info,
                segment.file.clone(),
                segment.layout.clone(),
                segment.scan.committed,
                None,
            );
            while let Some(mut entry) = reader.read_entry()? {
                manager.recover(&mut entry)?;
            }
            segments.insert(segment.id, (segment.file, segment.layout, segment.scan.end));
        }
        Ok(ReadOnlyLog {
            directory,
            segments,
            last_entry_id,
            _lock: lock,
        })
    }
}

/// A log opened with [`Configuration::open_read_only`]: the recovered
/// segments, read by position. Nothing is ever written through it.
#[derive(Debug)]
pub struct ReadOnlyLog {
    directory: PathBuf,
    /// Segment id → its file, its layout and where recovery ended it.
    segments: BTreeMap<u64, (Arc<dyn FileHandle>, Layout, u64)>,
    last_entry_id: Option<EntryId>,
    _lock: LockGuard,
}

impl ReadOnlyLog {
    /// Returns a reader over the chunk written at `position`, as
    /// [`WriteAheadLog::read_at`](crate::WriteAheadLog::read_at) does:
    /// `NotFound` if no recovered segment has that id, `InvalidData` if no
    /// chunk record of the segment starts there (the CRC is checked as the
    /// reader reaches the end).
    pub fn read_at(&self, position: LogPosition) -> io::Result<ChunkReader> {
        let (file, layout, end) = self.segments.get(&position.file_id).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "no recovered segment {} in {}",
                    position.file_id,
                    self.directory.display()
                ),
            )
        })?;
        crate::reader::chunk_at(file, layout, position, *end)
    }

    /// The highest entry id recovered, if any.
    #[must_use]
    pub fn last_entry_id(&self) -> Option<EntryId> {
        self.last_entry_id
    }

    /// The directory holding the segment files.
    #[must_use]
    pub fn directory(&self) -> &Path {
        &self.directory
    }

    /// How many segments were recovered.
    #[must_use]
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }
}
