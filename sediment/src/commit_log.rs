//! The commit log files: commit records kept for replicas and for freeing
//! archived grains, in `commits-{first sequence}` files, appended to by
//! the WAL checkpoint and read back at open and by `Database::commit_log`.
//!
//! The file is a little over 700 lines, most of them its damage and
//! rotation tests; the code is the methods of one type, [`CommitLogFiles`],
//! whose appending, trimming and reading share its buffered tail and file
//! list, so they stay together. The records' bytes are `commit_record`'s.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use okaywal::encryption::KeyId;
use okaywal::fs::{FileHandle, FileSystem, OpenMode};

use crate::commit_record::{CommitLogDamage, CommitRecord, SequenceId};
use crate::error::{Context, Error, Result};
use crate::files::open_existing;
use crate::sealing::{Sealer, Unsealed, SEALED_FRAME_HEAD};

/// Commit log files are rotated at this size so trimming can delete them.
const ROTATE_BYTES: u64 = 1 << 20;
/// Length and CRC before each record in a commit log file.
const FRAME_HEADER: usize = 8;

/// What [`CommitLogFiles::read`] found: the records it could read and the
/// damaged stretches it had to skip.
#[derive(Debug, Default)]
pub(crate) struct LogContents {
    /// Every readable record with a sequence at or above the one asked for,
    /// in sequence order.
    pub records: Vec<CommitRecord>,
    /// One entry per file in which damage was found, in file order.
    pub damage: Vec<CommitLogDamage>,
    /// Sealed: the key ids of every frame read.
    pub key_ids: BTreeSet<KeyId>,
}

/// The readable frames of one file, for resealing: each frame's offset and
/// record bytes, and where damage starts (the rest of the file is copied
/// as it is).
#[derive(Debug, Default)]
struct Frames {
    frames: Vec<(u64, Vec<u8>)>,
    damaged_from: Option<u64>,
    /// How many bytes of the file can be read.
    readable: u64,
}

/// The commit log files of a database, appended to only by the
/// checkpointer.
#[derive(Debug)]
pub(crate) struct CommitLogFiles {
    directory: PathBuf,
    fs: Arc<dyn FileSystem>,
    /// First sequence (file name) → file, oldest first.
    files: BTreeMap<u64, Arc<dyn FileHandle>>,
    /// The file being appended to and its valid length.
    current: Option<(u64, u64)>,
    /// Files written since the last sync.
    unsynced: Vec<u64>,
    /// Appended frames not yet written, and the file and offset they start
    /// at: a checkpoint appends thousands of small records, and one
    /// `pwrite` for all of them (at `sync`, or when the file rotates) costs
    /// far less than one each.
    pending: Vec<u8>,
    pending_at: (u64, u64),
    /// A file was created since the last directory sync.
    created: bool,
    /// Files in which [`CommitLogFiles::read`] found damage. Nothing is
    /// appended to them: records after a damaged frame could not be reached
    /// by a reader, so the next append starts a new file.
    damaged: BTreeSet<u64>,
    /// The store's sealing context, if it is encrypted: frames are sealed.
    sealer: Option<Arc<Sealer>>,
}

pub(crate) fn file_path(directory: &Path, first: u64) -> PathBuf {
    directory.join(format!("commits-{first}"))
}

/// The name of the file a commit log file is resealed into before it
/// replaces it (`Database::rekey`); a leftover one is removed at open.
pub(crate) fn reseal_file_name(first: u64) -> String {
    format!("rekey-commits-{first}")
}

/// For a commit log file after the current one, which an interrupted
/// checkpoint left, and for a resealed copy an interrupted rekey left
/// (both removed at open): the error for another program's file of that
/// name. An interruption leaves nothing, zeros, or frames from the start of
/// the file (written in one write, so its first sector is whole or
/// unwritten): a plain frame's record begins with the sequence in the
/// file's name, a sealed frame's length opens.
pub(crate) fn refuse_unrecognised(
    fs: &dyn FileSystem,
    path: &Path,
    first: u64,
    sealer: Option<&Sealer>,
) -> Result<()> {
    let (file, len) = crate::open::open_to_read(fs, path)?;
    let mut bytes = vec![0; len.min(512) as usize];
    read_exact(&*file, &mut bytes, 0, path)?;
    let ours = bytes.iter().all(|b| *b == 0)
        || match sealer {
            None => bytes.get(FRAME_HEADER..FRAME_HEADER + 8) == Some(&first.to_le_bytes()[..]),
            Some(sealer) => bytes.get(..SEALED_FRAME_HEAD).is_some_and(|head| {
                sealer
                    .open_frame_len(first, 0, head, &path.display())
                    .is_ok()
            }),
        };
    if ours {
        return Ok(());
    }
    let named_like = match path.file_name().and_then(|name| name.to_str()) {
        Some(name) if name.starts_with("rekey-") => "a rekey's copy of a commit log file",
        _ => "a commit log file",
    };
    Err(Error::UnrecognisedFile {
        path: path.to_path_buf(),
        what: format!(
            "it is named like {named_like}, but it does not begin with a commit log \
             frame of sequence {first}, nor with zeros: it begins with {}",
            crate::error::first_bytes(&bytes)
        ),
    })
}

pub(crate) fn parse_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("commits-")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

impl CommitLogFiles {
    /// True if a file was created since [`CommitLogFiles::dir_synced`]:
    /// the directory must be synced for its name to be durable.
    pub fn created_since_dir_sync(&self) -> bool {
        self.created
    }

    /// The directory was synced: every file created so far is named
    /// durably.
    pub fn dir_synced(&mut self) {
        self.created = false;
    }
    /// Opens the files named in `names`. `current`/`end` come from the
    /// index header: files after `current` were created after the last
    /// checkpoint that counts and are removed.
    ///
    /// A read-only open (`writable` false) leaves those files where they
    /// are and opens the others for reading.
    pub fn open(
        directory: &Path,
        fs: Arc<dyn FileSystem>,
        names: &[String],
        current: u64,
        end: u64,
        writable: bool,
        sealer: Option<Arc<Sealer>>,
    ) -> Result<Self> {
        let mut files = BTreeMap::new();
        for first in names.iter().filter_map(|n| parse_file_name(n)) {
            let path = file_path(directory, first);
            if current == 0 || first > current {
                // A read-only open refuses such a file too: an open for
                // writing would, so `verify` must not call the store fine.
                refuse_unrecognised(&*fs, &path, first, sealer.as_deref())?;
                if writable {
                    fs.remove_file(&path)
                        .context(|| format!("removing unused commit log {}", path.display()))?;
                }
                continue;
            }
            let file = open_existing(&*fs, &path, writable)
                .context(|| format!("opening commit log {}", path.display()))?;
            files.insert(first, file);
        }
        if current != 0 && !files.contains_key(&current) {
            return Err(Error::Corrupt {
                path: file_path(directory, current),
                what: "the index names this commit log file but it is missing".into(),
            });
        }
        Ok(Self {
            directory: directory.to_path_buf(),
            fs,
            files,
            current: (current != 0).then_some((current, end)),
            unsynced: Vec::new(),
            pending: Vec::new(),
            pending_at: (0, 0),
            created: false,
            damaged: BTreeSet::new(),
            sealer,
        })
    }

    /// Bytes of a frame before its record.
    fn frame_head(&self) -> usize {
        if self.sealer.is_some() {
            SEALED_FRAME_HEAD
        } else {
            FRAME_HEADER
        }
    }

    /// The file being appended to and its valid length (0, 0 if none).
    pub fn position(&self) -> (u64, u64) {
        self.current.unwrap_or((0, 0))
    }

    /// Forgets appends made after `position()` returned `position`.
    pub fn rewind(&mut self, position: (u64, u64)) {
        // Unwritten frames past the position are forgotten with it.
        let (file, start) = self.pending_at;
        let keep = match position {
            (at, end) if at == file && end > start => (end - start) as usize,
            _ => 0,
        };
        self.pending.truncate(keep);
        match position {
            (0, _) => {
                // No file existed before: drop any created since (they are
                // removed at the next open if they linger on disk).
                self.current = None;
            }
            (file, end) => self.current = Some((file, end)),
        }
    }

    /// Appends an encoded record of transaction `sequence`. It reaches the
    /// file at the next [`CommitLogFiles::sync`] (or when the file rotates).
    pub fn append(&mut self, sequence: u64, payload: &[u8]) -> Result<()> {
        let needs_new = match self.current {
            None => true,
            Some((first, end)) => end >= ROTATE_BYTES || self.damaged.contains(&first),
        };
        if needs_new {
            self.write_pending()?;
            if let Some((first, end)) = self.current {
                self.settle_length(first, end)?;
            }
            let path = file_path(&self.directory, sequence);
            let file = self
                .fs
                .open(&path, OpenMode::Create)
                .context(|| format!("creating commit log {}", path.display()))?;
            self.files.insert(sequence, file);
            self.current = Some((sequence, 0));
            self.created = true;
        }
        let (first, end) = self.current.expect("a current file");
        if self.pending.is_empty() {
            self.pending_at = (first, end);
        }
        let len = u32::try_from(payload.len()).map_err(|_| Error::Corrupt {
            path: file_path(&self.directory, first),
            what: format!(
                "commit record of sequence {sequence} is {} bytes, more than a frame holds",
                payload.len()
            ),
        })?;
        match &self.sealer {
            Some(sealer) => sealer
                .seal_frame(first, end, payload, &mut self.pending)
                .context(|| format!("sealing the commit record of sequence {sequence}"))?,
            None => {
                self.pending.extend_from_slice(&len.to_le_bytes());
                self.pending
                    .extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
                self.pending.extend_from_slice(payload);
            }
        }
        self.current = Some((first, end + (self.frame_head() + payload.len()) as u64));
        Ok(())
    }

    /// Makes the file being left behind exactly `end` bytes long, its valid
    /// length: once it is no longer the current file, readers take its
    /// length as the end of its records. Bytes past `end` (left by a
    /// checkpoint a crash cut short) are cut off; a file shorter than `end`
    /// is filled with zeros, which read as a damaged frame rather than
    /// letting the missing records vanish unnoticed.
    fn settle_length(&mut self, first: u64, end: u64) -> Result<()> {
        let Some(file) = self.files.get(&first) else {
            return Ok(());
        };
        let path = file_path(&self.directory, first);
        let len = file
            .len()
            .context(|| format!("reading the length of {}", path.display()))?;
        if len != end {
            file.set_len(end)
                .context(|| format!("setting the length of {} to {end}", path.display()))?;
            if !self.unsynced.contains(&first) {
                self.unsynced.push(first);
            }
        }
        Ok(())
    }

    /// Writes the appended frames not yet in their file.
    fn write_pending(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let (first, start) = self.pending_at;
        self.files[&first]
            .write_all_at(&self.pending, start)
            .context(|| {
                format!(
                    "appending to {}",
                    file_path(&self.directory, first).display()
                )
            })?;
        self.pending.clear();
        if !self.unsynced.contains(&first) {
            self.unsynced.push(first);
        }
        Ok(())
    }

    /// Writes and syncs every file appended to since the last sync.
    pub fn sync(&mut self) -> Result<()> {
        self.write_pending()?;
        // A file leaves the list only once its sync succeeded: after an
        // error the rest stay listed for the retry.
        while let Some(&first) = self.unsynced.first() {
            if let Some(file) = self.files.get(&first) {
                file.sync_data().context(|| {
                    format!("syncing {}", file_path(&self.directory, first).display())
                })?;
            }
            self.unsynced.remove(0);
        }
        Ok(())
    }

    /// Deletes files whose every record has a sequence ≤ `through`.
    pub fn trim(&mut self, through: u64) -> Result<()> {
        let current = self.current.map(|(first, _)| first);
        let firsts: Vec<u64> = self.files.keys().copied().collect();
        for pair in firsts.windows(2) {
            let (first, next) = (pair[0], pair[1]);
            if Some(first) != current && next.saturating_sub(1) <= through {
                self.files.remove(&first);
                self.damaged.remove(&first);
                let path = file_path(&self.directory, first);
                self.fs
                    .remove_file(&path)
                    .context(|| format!("removing trimmed commit log {}", path.display()))?;
            }
        }
        Ok(())
    }

    /// Bytes in the commit log files.
    pub fn bytes(&self) -> u64 {
        self.files.values().map(|f| f.len().unwrap_or(0)).sum()
    }

    /// Reads every readable record with a sequence ≥ `since`, in order,
    /// and notes each damaged stretch instead of failing: the rest of a file
    /// after a frame that does not read back is skipped, and reading goes on
    /// with the next file. `last_written` is the highest sequence the index
    /// counts as written to the commit log: the upper end of damage in the
    /// last file. Only failed reads are errors.
    ///
    /// A file found damaged is not appended to again (see `damaged`).
    pub fn read(&mut self, since: u64, last_written: u64) -> Result<LogContents> {
        let mut contents = LogContents::default();
        let firsts: Vec<u64> = self.files.keys().copied().collect();
        for (at, &first) in firsts.iter().enumerate() {
            let next_first = firsts.get(at + 1).copied();
            if let Some(damage) = self.read_file(
                first,
                next_first,
                since,
                last_written,
                &mut contents.records,
                &mut contents.key_ids,
                None,
            )? {
                self.damaged.insert(first);
                contents.damage.push(damage);
            }
        }
        Ok(contents)
    }

    /// Reads the records of the file `first` into `records`; returns where
    /// and how it is damaged, if it is. `next_first` is the next file's
    /// first sequence, if there is a next file.
    #[allow(clippy::too_many_arguments)]
    fn read_file(
        &self,
        first: u64,
        next_first: Option<u64>,
        since: u64,
        last_written: u64,
        records: &mut Vec<CommitRecord>,
        key_ids: &mut BTreeSet<KeyId>,
        mut frames: Option<&mut Frames>,
    ) -> Result<Option<CommitLogDamage>> {
        let frame_head = self.frame_head();
        let file = &self.files[&first];
        let path = file_path(&self.directory, first);
        let file_len = file
            .len()
            .context(|| format!("reading the length of {}", path.display()))?;
        let pending = (first == self.pending_at.0 && !self.pending.is_empty())
            .then_some((self.pending_at.1, &self.pending[..]));
        // The index gives the current file's valid length; every other file
        // ends where its records end (see `settle_length`).
        let limit = match self.current {
            Some((current, end)) if current == first => end,
            _ => file_len,
        };
        // Bytes that can be read: a file shorter than the index says is
        // damage at the first frame that reaches past its end.
        let readable = match pending {
            Some(_) => limit,
            None => limit.min(file_len),
        };
        let mut reader = FrameReader {
            file: &**file,
            path: &path,
            limit: readable,
            pending,
            window: Vec::new(),
            window_start: 0,
        };
        // Sequences in this file lie in `first..=highest`.
        let highest = match next_first {
            Some(next) => next.saturating_sub(1),
            None => last_written.max(first),
        };
        if let Some(frames) = frames.as_deref_mut() {
            frames.readable = readable;
        }
        let mut previous: Option<u64> = None;
        let mut offset = 0;
        while offset < limit {
            if let Some(frames) = frames.as_deref_mut() {
                frames.damaged_from = Some(offset);
            }
            let damage = |what: String| -> Result<Option<CommitLogDamage>> {
                let lowest = previous.map_or(first, |p| p.saturating_add(1));
                Ok(Some(CommitLogDamage {
                    path: path.clone(),
                    offset,
                    first: SequenceId(lowest),
                    last: SequenceId(highest.max(lowest)),
                    what,
                }))
            };
            let short = |needed: u64| {
                format!(
                    "the file ends at byte {file_len}, but the index counts {limit} bytes \
                     and the frame here needs {needed}"
                )
            };
            if limit - offset < frame_head as u64 {
                return damage(format!(
                    "{} bytes are left, too few for a frame header",
                    limit - offset
                ));
            }
            if offset + frame_head as u64 > readable {
                return damage(short(frame_head as u64));
            }
            let frame = reader.bytes(offset, frame_head)?.to_vec();
            let what = format!("{} offset {offset}", path.display());
            let (len, crc) = match &self.sealer {
                Some(sealer) => match sealer.open_frame_len(first, offset, &frame, &what) {
                    Ok((len, _)) => (len, None),
                    Err(Unsealed::Damaged) => {
                        return damage("authentication failed".into());
                    }
                    Err(Unsealed::Key(source)) => {
                        return Err(Error::from_io(format!("reading {what}"), source))
                    }
                },
                None => (
                    u32::from_le_bytes(frame[..4].try_into().expect("4")),
                    Some(u32::from_le_bytes(frame[4..].try_into().expect("4"))),
                ),
            };
            let frame_len = frame_head as u64 + u64::from(len);
            if frame_len > limit - offset {
                return damage(format!(
                    "its length {len} runs past the end of the file's records at byte {limit}"
                ));
            }
            if offset + frame_len > readable {
                return damage(short(frame_len));
            }
            let mut payload = reader
                .bytes(offset + frame_head as u64, len as usize)?
                .to_vec();
            match (&self.sealer, crc) {
                (Some(sealer), _) => {
                    match sealer.open_frame_record(first, offset, &frame, &mut payload, &what) {
                        Ok(_) => {
                            if let Some((a, b)) = Sealer::frame_key_ids(&frame) {
                                key_ids.extend([a, b]);
                            }
                        }
                        Err(Unsealed::Damaged) => {
                            return damage("authentication failed".into());
                        }
                        Err(Unsealed::Key(source)) => {
                            return Err(Error::from_io(format!("reading {what}"), source))
                        }
                    }
                }
                (None, Some(crc)) => {
                    if crc32fast::hash(&payload) != crc {
                        return damage("checksum mismatch".into());
                    }
                }
                (None, None) => {}
            }
            let record = match CommitRecord::decode(&payload) {
                Ok(record) => record,
                Err(what) => return damage(what),
            };
            // Records of a file are in increasing order, the first one has
            // the file's sequence, and all lie below the next file's.
            let sequence = record.sequence.0;
            let in_order = match previous {
                None => sequence == first,
                Some(previous) => sequence > previous,
            };
            if !in_order || next_first.is_some_and(|next| sequence >= next) {
                return damage(format!(
                    "the record of sequence {sequence} is out of place (after {}, in a file \
                     of sequences {first}..={highest})",
                    previous.map_or_else(|| "the start of the file".to_string(), |p| p.to_string())
                ));
            }
            if sequence >= since {
                records.push(record);
            }
            if let Some(frames) = frames.as_deref_mut() {
                frames.frames.push((offset, payload));
            }
            previous = Some(sequence);
            offset += frame_len;
        }
        if let Some(frames) = frames {
            frames.damaged_from = None;
        }
        Ok(None)
    }

    /// Rewrites every commit log file that holds a frame sealed under a key
    /// other than `current`, with each readable frame sealed again (at the
    /// same offset: a frame's length does not depend on the key) and the
    /// bytes from a damaged frame on copied as they are. Each file is
    /// written whole under another name, synced, and renamed over the old
    /// one, then the directory is synced: a crash leaves the old file or
    /// the new one, both readable. Returns how many files were rewritten.
    pub fn reseal(&mut self, current: KeyId) -> Result<usize> {
        let Some(sealer) = self.sealer.clone() else {
            return Ok(0);
        };
        self.sync()?;
        let firsts: Vec<u64> = self.files.keys().copied().collect();
        let mut rewritten = 0;
        for (at, &first) in firsts.iter().enumerate() {
            let next_first = firsts.get(at + 1).copied();
            let mut frames = Frames::default();
            let mut key_ids = BTreeSet::new();
            self.read_file(
                first,
                next_first,
                u64::MAX,
                u64::MAX,
                &mut Vec::new(),
                &mut key_ids,
                Some(&mut frames),
            )?;
            if key_ids.iter().all(|id| *id == current) {
                continue;
            }
            let path = file_path(&self.directory, first);
            let mut bytes = Vec::new();
            for (offset, payload) in &frames.frames {
                sealer
                    .seal_frame(first, *offset, payload, &mut bytes)
                    .context(|| format!("resealing {}", path.display()))?;
            }
            if let Some(from) = frames.damaged_from {
                let tail = frames.readable.saturating_sub(from) as usize;
                let mut rest = vec![0; tail];
                read_exact(&*self.files[&first], &mut rest, from, &path)?;
                bytes.extend_from_slice(&rest);
            }
            let temporary = self.directory.join(reseal_file_name(first));
            let file = self
                .fs
                .open(&temporary, OpenMode::Create)
                .context(|| format!("creating {}", temporary.display()))?;
            file.set_len(0)
                .and_then(|()| file.write_all_at(&bytes, 0))
                .and_then(|()| file.sync_data())
                .and_then(|()| self.fs.rename(&temporary, &path))
                .and_then(|()| self.fs.sync_dir(&self.directory))
                .context(|| format!("replacing {} with its resealed copy", path.display()))?;
            let reopened = self
                .fs
                .open(&path, OpenMode::ReadWrite)
                .context(|| format!("opening {}", path.display()))?;
            self.files.insert(first, reopened);
            rewritten += 1;
        }
        Ok(rewritten)
    }
}

/// Reads a commit log file in large pieces (one `pread` per
/// [`READ_WINDOW`] rather than two per record), with frames appended but
/// not yet written taken from memory.
struct FrameReader<'a> {
    file: &'a dyn FileHandle,
    path: &'a Path,
    /// Valid length of the file, unwritten frames included.
    limit: u64,
    /// Where the unwritten frames start, and their bytes.
    pending: Option<(u64, &'a [u8])>,
    window: Vec<u8>,
    window_start: u64,
}

/// Bytes a [`FrameReader`] reads at a time (more when one record is longer).
const READ_WINDOW: usize = 1 << 20;

impl FrameReader<'_> {
    /// The `len` bytes at `offset`, which the caller has checked lie below
    /// `limit`.
    fn bytes(&mut self, offset: u64, len: usize) -> Result<&[u8]> {
        let window_end = self.window_start + self.window.len() as u64;
        if offset < self.window_start || offset + len as u64 > window_end {
            let want = (self.limit - offset).min(len.max(READ_WINDOW) as u64) as usize;
            self.window.clear();
            self.window.resize(want, 0);
            self.window_start = offset;
            let in_file = match self.pending {
                Some((start, _)) => start.saturating_sub(offset).min(want as u64) as usize,
                None => want,
            };
            read_exact(self.file, &mut self.window[..in_file], offset, self.path)?;
            if let Some((start, pending)) = self.pending {
                if in_file < want {
                    // `limit` ends where the unwritten frames end; should the
                    // two ever disagree, that is an error, not a panic.
                    let from = (offset + in_file as u64 - start) as usize;
                    let rest = &mut self.window[in_file..];
                    let n = rest.len();
                    let unwritten = pending.get(from..from + n).ok_or_else(|| Error::Corrupt {
                        path: self.path.to_path_buf(),
                        what: format!(
                            "reading {n} unwritten bytes at {} past the {} buffered",
                            offset + in_file as u64,
                            pending.len()
                        ),
                    })?;
                    rest.copy_from_slice(unwritten);
                }
            }
        }
        let at = (offset - self.window_start) as usize;
        Ok(&self.window[at..at + len])
    }
}

fn read_exact(file: &dyn FileHandle, buf: &mut [u8], offset: u64, path: &Path) -> Result<()> {
    file.read_exact_at(buf, offset).map_err(|source| Error::Io {
        context: format!("reading {} at {offset}", path.display()),
        source: io::Error::new(source.kind(), source.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grain_id::GrainId;

    #[test]
    fn damage_hides_the_rest_of_its_file_and_reading_resumes_at_the_next() {
        let (fs, dir, mut log) = empty_log();
        let mut expected = Vec::new();
        for sequence in 1..=3000_u64 {
            let (record, payload) = record(sequence, 100);
            log.append(sequence, &payload).unwrap();
            expected.push(record);
        }
        log.sync().unwrap();
        let firsts: Vec<u64> = log.files.keys().copied().collect();
        assert!(firsts.len() >= 3, "{firsts:?}");
        let (middle, next) = (firsts[1], firsts[2]);
        // A byte in the payload of the middle file's third record.
        let frame = FRAME_HEADER as u64 + record(middle, 100).1.len() as u64;
        let file = fs
            .open(&file_path(dir, middle), OpenMode::ReadWrite)
            .unwrap();
        let mut byte = [0_u8];
        file.read_exact_at(&mut byte, 2 * frame + 20).unwrap();
        file.write_all_at(&[byte[0] ^ 0x10], 2 * frame + 20)
            .unwrap();

        let (current, end) = log.position();
        let contents = log.read(0, 3000).unwrap();
        assert_eq!(
            contents.damage,
            vec![CommitLogDamage {
                path: file_path(dir, middle),
                offset: 2 * frame,
                first: SequenceId(middle + 2),
                last: SequenceId(next - 1),
                what: "checksum mismatch".into(),
            }]
        );
        let readable: Vec<CommitRecord> = expected
            .iter()
            .filter(|r| r.sequence.0 < middle + 2 || r.sequence.0 >= next)
            .cloned()
            .collect();
        assert_eq!(contents.records, readable);
        // The same after reopening; a damaged current file is left for a new
        // one at the next append, cut to its valid length.
        let names = fs.list_files(dir).unwrap();
        let mut reopened =
            CommitLogFiles::open(dir, fs.clone(), &names, current, end, true, None).unwrap();
        assert_eq!(reopened.read(0, 3000).unwrap().damage, contents.damage);
        let last_file = fs
            .open(&file_path(dir, current), OpenMode::ReadWrite)
            .unwrap();
        last_file.write_all_at(&[0xFF; 3], 5).unwrap();
        last_file.write_all_at(&[0xEE; 10], end).unwrap();
        let damage = reopened.read(0, 3000).unwrap().damage;
        assert_eq!(damage.len(), 2);
        assert_eq!(
            (damage[1].offset, damage[1].first),
            (0, SequenceId(current))
        );
        assert_eq!(damage[1].last, SequenceId(3000));
        let (record, payload) = record(3001, 1);
        reopened.append(3001, &payload).unwrap();
        reopened.sync().unwrap();
        assert_eq!(
            reopened.position(),
            (3001, (FRAME_HEADER + payload.len()) as u64)
        );
        assert_eq!(
            last_file.len().unwrap(),
            end,
            "bytes past the valid end are cut"
        );
        let contents = reopened.read(0, 3001).unwrap();
        assert_eq!(contents.damage.len(), 2);
        assert_eq!(contents.damage[1].last, SequenceId(3000));
        assert_eq!(contents.records.last(), Some(&record));
    }

    #[test]
    fn garbage_files_read_as_damage_without_panics() {
        let (fs, dir, _) = empty_log();
        let mut state = 0x1234_5678_9abc_def0_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for round in 0..300_u64 {
            let len = (next() % 200) as usize;
            let mut bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            // Some with a plausible first frame header.
            if round % 3 == 0 && len >= 8 {
                let payload = (len - 8) as u32;
                bytes[..4].copy_from_slice(&payload.min((next() % 300) as u32).to_le_bytes());
                let crc = crc32fast::hash(&bytes[8..]);
                bytes[4..8].copy_from_slice(&crc.to_le_bytes());
            }
            let first = round + 1;
            let file = fs.open(&file_path(dir, first), OpenMode::Create).unwrap();
            file.set_len(0).unwrap();
            file.write_all_at(&bytes, 0).unwrap();
            let names = fs.list_files(dir).unwrap();
            let claimed_end = len as u64 + next() % 20;
            let mut log =
                CommitLogFiles::open(dir, fs.clone(), &names, first, claimed_end, true, None)
                    .unwrap();
            let contents = log.read(0, first + 5).unwrap();
            for damage in &contents.damage {
                assert!(damage.first <= damage.last, "{damage}");
            }
            fs.remove_file(&file_path(dir, first)).unwrap();
        }
    }

    #[test]
    fn files_rotate_trim_and_read_back() {
        let (fs, dir, mut log) = empty_log();
        let mut payload = Vec::new();
        for sequence in 1..=3000_u64 {
            let mut record = CommitRecord::new(SequenceId(sequence));
            record.archived = vec![GrainId::new(0, 0, (sequence % 1000) as u32, 1).unwrap(); 50];
            payload.clear();
            record.encode(&mut payload);
            log.append(sequence, &payload).unwrap();
        }
        log.sync().unwrap();
        assert!(log.files.len() > 1);
        assert_eq!(undamaged(&mut log, 0).len(), 3000);
        assert_eq!(undamaged(&mut log, 2990).len(), 11);
        let before = log.files.len();
        log.trim(2900).unwrap();
        assert!(log.files.len() < before);
        let remaining = undamaged(&mut log, 0);
        assert!(remaining.first().unwrap().sequence.0 <= 2901);
        assert_eq!(remaining.last().unwrap().sequence.0, 3000);
        let (current, end) = log.position();
        let names = fs.list_files(dir).unwrap();
        let mut reopened = CommitLogFiles::open(dir, fs, &names, current, end, true, None).unwrap();
        assert_eq!(undamaged(&mut reopened, 0), remaining);
    }

    /// The records from `since` on, checking that nothing is damaged.
    fn undamaged(log: &mut CommitLogFiles, since: u64) -> Vec<CommitRecord> {
        let contents = log.read(since, u64::MAX).unwrap();
        assert!(contents.damage.is_empty(), "{:?}", contents.damage);
        contents.records
    }

    /// A commit log with no files, in a memory file system.
    fn empty_log() -> (Arc<dyn FileSystem>, &'static Path, CommitLogFiles) {
        let fs: Arc<dyn FileSystem> = Arc::new(okaywal::fs::MemoryFileSystem::new());
        let dir = Path::new("/db");
        fs.create_dir_all(dir).unwrap();
        let log = CommitLogFiles::open(dir, fs.clone(), &[], 0, 0, true, None).unwrap();
        (fs, dir, log)
    }

    fn record(sequence: u64, archived: usize) -> (CommitRecord, Vec<u8>) {
        let mut record = CommitRecord::new(SequenceId(sequence));
        record.archived = (0..archived)
            .map(|i| GrainId::new(0, 0, (i % 100_000) as u32, 1).unwrap())
            .collect();
        let mut payload = Vec::new();
        record.encode(&mut payload);
        (record, payload)
    }

    #[test]
    fn appends_reach_the_file_at_sync_and_read_back_before() {
        let (fs, dir, mut log) = empty_log();
        let mut expected = Vec::new();
        for sequence in 1..=10 {
            let (record, payload) = record(sequence, 3);
            log.append(sequence, &payload).unwrap();
            expected.push(record);
        }
        let path = file_path(dir, 1);
        let file = fs.open(&path, OpenMode::ReadWrite).unwrap();
        assert_eq!(file.len().unwrap(), 0, "nothing is written before sync");
        assert_eq!(
            undamaged(&mut log, 0),
            expected,
            "unwritten records read back"
        );
        log.sync().unwrap();
        let (_, end) = log.position();
        assert_eq!(file.len().unwrap(), end);
        assert_eq!(undamaged(&mut log, 0), expected);
        // Appends after a sync read back from file and memory together.
        let (record11, payload) = record(11, 2);
        log.append(11, &payload).unwrap();
        expected.push(record11);
        assert_eq!(undamaged(&mut log, 5), expected[4..]);
    }

    #[test]
    fn rewind_forgets_unwritten_appends() {
        let (fs, dir, mut log) = empty_log();
        let (first, payload) = record(1, 1);
        log.append(1, &payload).unwrap();
        log.sync().unwrap();
        let position = log.position();
        for sequence in 2..=5 {
            log.append(sequence, &record(sequence, 4).1).unwrap();
        }
        log.rewind(position);
        assert_eq!(undamaged(&mut log, 0), vec![first.clone()]);
        let (second, payload) = record(2, 7);
        log.append(2, &payload).unwrap();
        log.sync().unwrap();
        let (current, end) = log.position();
        let names = fs.list_files(dir).unwrap();
        let mut reopened = CommitLogFiles::open(dir, fs, &names, current, end, true, None).unwrap();
        assert_eq!(undamaged(&mut reopened, 0), vec![first, second]);
    }

    #[test]
    fn a_record_longer_than_the_read_window_reads_back() {
        let (_, _, mut log) = empty_log();
        let mut expected = Vec::new();
        // About 1.6 MiB of grain ids: past the window and the rotation size.
        for (sequence, archived) in [(1, 10), (2, 200_000), (3, 10), (4, 10)] {
            let (record, payload) = record(sequence, archived);
            log.append(sequence, &payload).unwrap();
            expected.push(record);
        }
        assert_eq!(undamaged(&mut log, 0), expected);
        log.sync().unwrap();
        assert_eq!(log.files.len(), 2, "the long record rotated the file");
        assert_eq!(undamaged(&mut log, 0), expected);
    }
}
