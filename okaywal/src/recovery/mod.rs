//! Recovery's view of a log directory: which segments exist, what each
//! holds, and what survives (damage, torn tails, segments that lost
//! records). The walk over one segment is [`scan`]; the reader that hands
//! committed entries to the manager is [`entries`]. Replaying them into a
//! running log is `crate::log::open`'s.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::RecoveryMode;
use crate::encryption::{Cipher, KeyError, Seal};
use crate::format::{
    AnyHeader, SealedSegmentHeader, SegmentHeader, HEADER_SIZE, RECORD_HEADER_SIZE,
};
use crate::fs::{FileHandle, FileSystem, OpenMode};
use crate::sealed::{Layout, SegmentSeal};
use crate::segment::FileName;

mod entries;
mod scan;

pub use entries::{Entry, EntryChunk, ReadChunkResult, SegmentReader};
pub(crate) use scan::{scan_segment, ChunkLocation, SegmentScan, SegmentScanner, Stop};

/// A segment found at open, with its header and what its walk found.
#[derive(Debug)]
pub(crate) struct FoundSegment {
    pub id: u64,
    pub path: PathBuf,
    pub file: Arc<dyn FileHandle>,
    pub header: SegmentHeader,
    /// Plain, or encrypted with the segment's key and generation.
    pub layout: Layout,
    pub scan: SegmentScan,
}

/// What opening a directory found.
#[derive(Debug, Default)]
pub(crate) struct Found {
    /// The segments to replay, in order.
    pub segments: Vec<FoundSegment>,
    /// Files that hold nothing to replay and may be reused.
    pub reusable: Vec<PathBuf>,
    /// Segments written by okaywal 0.2 or 0.3 (see `crate::legacy`).
    pub legacy: Vec<crate::legacy::LegacySegment>,
    /// Segments recovery decided not to replay (a suffix cut off after
    /// lost or damaged records), with the highest entry id each held: they
    /// must be renamed away before the log goes on, or the next open would
    /// make the same cut and drop what is written after it.
    pub dropped: Vec<(PathBuf, u64)>,
    /// The highest entry id seen anywhere (replayed or not).
    pub max_id: u64,
    /// With [`Look::Inspect`], everything that recovery would report or
    /// act on: the file, the offset where one applies, and what is wrong.
    pub problems: Vec<(PathBuf, Option<u64>, String)>,
    /// Ids of `wal-{id}` files whose header was unreadable (empty, zeros,
    /// cut short or damaged with no records following it), taken as never
    /// written and listed in `reusable`.
    unreadable: Vec<u64>,
    /// Ids of every `wal-{id}` file in the directory.
    present: Vec<u64>,
}

/// A segment that a later one's header says held records, and that is
/// gone: its file is missing while an older segment is still live (so it
/// was never checkpointed: checkpoints go in id order and rename what they
/// finish), or its header is unreadable. The later segment got its name
/// only after the lost one was synced whole, so this is damage, never a
/// crash's torn write.
struct LostSegment {
    /// Index in `Found::segments` of the segment that names it.
    named_by: usize,
    /// Its file.
    path: PathBuf,
    /// What is wrong.
    message: String,
}

/// The segments that later ones name as their predecessors with records
/// (`previous_end` past the header), and that are missing or unreadable.
fn lost_segments(found: &Found, directory: &Path) -> Vec<LostSegment> {
    let mut lost = Vec::new();
    for (i, segment) in found.segments.iter().enumerate() {
        let Some((previous_id, previous_end)) = segment.header.previous else {
            continue;
        };
        let adjacent = i
            .checked_sub(1)
            .is_some_and(|before| found.segments[before].id == previous_id);
        if adjacent || previous_end <= HEADER_SIZE {
            continue;
        }
        let path = FileName::Segment(previous_id).path_in(directory);
        let what = if found.unreadable.contains(&previous_id) {
            "its header is missing or damaged"
        } else if !found.present.contains(&previous_id)
            && (!found.legacy.is_empty() || found.segments.iter().any(|s| s.id < previous_id))
        {
            "the file is missing, while an older segment is still live"
        } else {
            continue;
        };
        lost.push(LostSegment {
            named_by: i,
            message: format!(
                "segment {}: {what}, but segment {} records that it held records up to offset \
                 {previous_end} when it was started and synced",
                path.display(),
                segment.id
            ),
            path,
        });
    }
    lost
}

/// How [`find_segments`] looks at a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Look {
    /// Recovery of a log opened for writing: damage is handled as the
    /// mode says, and a point-in-time cut is made permanent.
    Recover(RecoveryMode),
    /// Recovery of a log opened read-only: the same decisions, made in
    /// memory only; files are opened for reading.
    ReadOnly(RecoveryMode),
    /// Inspection: nothing fails on damage and nothing is written; every
    /// problem recovery would report is collected in `Found::problems`,
    /// and the walk goes on past damage.
    Inspect,
}

impl Look {
    fn mode(self) -> Option<RecoveryMode> {
        match self {
            Look::Recover(mode) | Look::ReadOnly(mode) => Some(mode),
            Look::Inspect => None,
        }
    }
}

/// The error for a file of this crate's layout but another format
/// version, which is neither read nor reused.
pub(crate) fn other_version_error(path: &Path, version: u8) -> io::Error {
    invalid(format!(
        "{}: written in okaywal segment format version {version}, which this version of the \
         crate (format versions {} to {}) cannot read; open the log with the okaywal that \
         wrote it, or move the file away. It was left as it was",
        path.display(),
        crate::format::FORMAT_VERSION,
        crate::format::ENCRYPTED_FORMAT_VERSION
    ))
}

pub(super) fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// The error for an intact plain segment file (or an okaywal 0.2/0.3 one)
/// when the configuration gives a key.
pub(crate) fn plain_with_key_error(path: &Path) -> io::Error {
    KeyError::NotEncrypted.into_io(path.display())
}

/// The error for an intact encrypted segment file when the configuration
/// gives no key: it names the file and the key id its header wants.
pub(crate) fn sealed_without_key_error(path: &Path, header: &SealedSegmentHeader) -> io::Error {
    let key_id = Seal::from_bytes(&header.key_check).key_id;
    KeyError::NotConfigured.into_io(format_args!("{} (encrypted with {key_id})", path.display()))
}

/// The header of segment `id` (file `path`) in its layout: a plain header,
/// or an encrypted one opened with `cipher` (a missing or wrong key is a
/// `PermissionDenied` error carrying a [`KeyError`], as is a header of the
/// other kind of log than `cipher` says). `Ok(None)` for bytes that are
/// not an intact header of this segment.
pub(crate) fn open_header(
    bytes: &[u8],
    id: u64,
    path: &Path,
    cipher: Option<&Cipher>,
) -> io::Result<Option<(SegmentHeader, Layout)>> {
    match (AnyHeader::decode(bytes), cipher) {
        (Ok(header), _) if header.first_entry_id() != id => Ok(None),
        (Ok(AnyHeader::Plain(header)), None) => Ok(Some((header, Layout::Plain))),
        (Ok(AnyHeader::Sealed(raw)), Some(cipher)) => {
            let (seal, header) = SegmentSeal::open(cipher, &raw, path)?;
            Ok(Some((header, Layout::Sealed(Arc::new(seal)))))
        }
        (Ok(AnyHeader::Plain(_)), Some(_)) => Err(plain_with_key_error(path)),
        (Ok(AnyHeader::Sealed(raw)), None) => Err(sealed_without_key_error(path, &raw)),
        (Err(_), _) => Ok(None),
    }
}

/// Opens and walks segments `ids` (ascending), then decides what survives:
/// damage is handled as the mode says, and a segment whose predecessor
/// ends short of where it was closed is dropped with everything after it,
/// unless it proves it was synced (then the predecessor is damaged).
///
/// Every segment's header is read (and, encrypted, its key checked)
/// before anything is changed: a key error leaves the directory as it
/// was.
pub(crate) fn find_segments(
    fs: &dyn FileSystem,
    directory: &Path,
    ids: &[u64],
    buffer_bytes: usize,
    cipher: Option<&Cipher>,
    look: Look,
) -> io::Result<Found> {
    let mut found = Found {
        present: ids.to_vec(),
        ..Found::default()
    };
    let open_mode = match look {
        Look::Recover(_) => OpenMode::ReadWrite,
        Look::ReadOnly(_) | Look::Inspect => OpenMode::Read,
    };
    let skip_damage = look
        .mode()
        .is_none_or(|mode| mode == RecoveryMode::SkipCorrupted);
    for &id in ids {
        let path = FileName::Segment(id).path_in(directory);
        let file = fs.open(&path, open_mode)?;
        let len = file.len()?;
        let mut header_bytes = vec![0; HEADER_SIZE.min(len) as usize];
        file.read_exact_at(&mut header_bytes, 0)?;
        let opened = match open_header(&header_bytes, id, &path, cipher) {
            // An encrypted header whose checksum matches but whose
            // encrypted part does not authenticate: damage (a key error
            // fails inspection too).
            Err(error) if look == Look::Inspect && error.kind() == io::ErrorKind::InvalidData => {
                found.problems.push((path, Some(0), error.to_string()));
                continue;
            }
            opened => opened?,
        };
        let (header, layout) = match opened {
            Some(found) => found,
            None => {
                let result = AnyHeader::decode(&header_bytes);
                // Another version of this format, written whole: never
                // taken for a header that was never written.
                if let Some(version) = SegmentHeader::other_version(&header_bytes) {
                    let error = other_version_error(&path, version);
                    if look == Look::Inspect {
                        found.problems.push((path, Some(0), error.to_string()));
                        continue;
                    }
                    return Err(error);
                }
                // A segment written by okaywal 0.2/0.3 (`crate::legacy`).
                if let Some(legacy) = crate::legacy::recognise(id, &path, &file, &header_bytes) {
                    if cipher.is_some() {
                        // An okaywal 0.2/0.3 log is never encrypted.
                        return Err(plain_with_key_error(&path));
                    }
                    found.legacy.push(legacy);
                    continue;
                }
                // A header that never became durable means nothing in the
                // file was ever acknowledged (the file is named only after
                // its header is synced), unless records of this segment
                // follow it: then the header was written and later
                // damaged. They are searched for anywhere, not just right
                // after the header, since the damage may have taken the
                // first records too: reusing such a file would drop its
                // entries silently, and its old records would pass for
                // the new segment's if it got the same id.
                let records_follow = len >= HEADER_SIZE + RECORD_HEADER_SIZE as u64
                    && scan::verified_record_between(&*file, HEADER_SIZE, len, id, buffer_bytes)?;
                if records_follow {
                    let why = match result {
                        Ok(_) => "names another segment".to_string(),
                        Err(err) => err.to_string(),
                    };
                    let error = format!(
                        "segment {}: header is damaged ({why}) but valid records follow it",
                        path.display()
                    );
                    if look == Look::Inspect {
                        found.problems.push((path, Some(0), error));
                        continue;
                    }
                    return Err(invalid(error));
                }
                // A file whose header is of neither format is refused.
                if let Err(err) = crate::legacy::refuse_foreign(&path, &header_bytes) {
                    if look == Look::Inspect {
                        found.problems.push((path, Some(0), err.to_string()));
                        continue;
                    }
                    return Err(err);
                }
                found.unreadable.push(id);
                found.reusable.push(path);
                continue;
            }
        };
        let scan = scan_segment(&*file, &layout, id, len, buffer_bytes, skip_damage)?;
        found.max_id = found.max_id.max(scan.max_entry_id.unwrap_or(0));
        found.segments.push(FoundSegment {
            id,
            path,
            file,
            header,
            layout,
            scan,
        });
    }

    judge_failed_commits(&mut found.segments);
    let Some(mode) = look.mode() else {
        collect_problems(&mut found, directory);
        return Ok(found);
    };
    let mut keep = found.segments.len();
    for (i, segment) in found.segments.iter_mut().enumerate() {
        if let Some((offset, reason)) = segment.scan.damage.clone() {
            match mode {
                RecoveryMode::ErrorOnCorruption => {
                    return Err(invalid(format!(
                        "segment {}: damaged record at offset {offset} ({reason}), with records \
                         that were synced after it; open with RecoveryMode::PointInTime to keep \
                         only what precedes it, or RecoveryMode::SkipCorrupted to skip it",
                        segment.path.display()
                    )));
                }
                RecoveryMode::PointInTime => {
                    // Make the cut permanent: the damaged segment ends
                    // where the damage begins.
                    segment.scan.truncate(offset);
                    if look == Look::Recover(mode) {
                        segment.file.set_len(offset)?;
                        segment.file.sync_data()?;
                    }
                    keep = i + 1;
                    break;
                }
                RecoveryMode::SkipCorrupted => {}
            }
        }
    }
    if let Some(lost) = lost_segments(&found, directory).into_iter().next() {
        match mode {
            RecoveryMode::ErrorOnCorruption => {
                return Err(invalid(format!(
                    "{}; open with RecoveryMode::PointInTime to keep only the segments before \
                     it, or RecoveryMode::SkipCorrupted to go on without it",
                    lost.message
                )));
            }
            // Keeping the later segments would keep entries logged after
            // the lost ones.
            RecoveryMode::PointInTime => keep = keep.min(lost.named_by),
            RecoveryMode::SkipCorrupted => {}
        }
    }
    for i in 1..keep {
        let (before, after) = found.segments.split_at(i);
        let (previous, segment) = (&before[i - 1], &after[0]);
        let Some((previous_id, previous_end)) = segment.header.previous else {
            continue;
        };
        if previous_id != previous.id || previous.scan.end >= previous_end {
            continue;
        }
        // This segment has its `wal-` name, which it only gets in a sync
        // pass that synced the earlier segment whole first (FORMAT.md,
        // "Durability order"): the earlier segment lost records that were
        // durable, which is damage, not a crash's torn tail. Its own
        // records may all carry mark 0 (its first commit's sync is its
        // first sync) and still be acknowledged.
        if mode == RecoveryMode::PointInTime {
            // Keeping it would keep entries logged after lost ones.
            keep = i;
            break;
        }
        if mode == RecoveryMode::ErrorOnCorruption {
            return Err(invalid(format!(
                "segment {}: ends at offset {} but held records up to {previous_end} when \
                 segment {} was started and synced",
                previous.path.display(),
                previous.scan.end,
                segment.id
            )));
        }
    }
    for dropped in found.segments.drain(keep..) {
        let highest = dropped
            .scan
            .max_entry_id
            .unwrap_or(dropped.id)
            .max(dropped.id);
        found.dropped.push((dropped.path, highest));
    }
    Ok(found)
}

/// Everything recovery would report about `found`'s segments, as
/// problems: damage inside a segment, and a segment that ends short of
/// where its successor says it ended.
fn collect_problems(found: &mut Found, directory: &Path) {
    for lost in lost_segments(found, directory) {
        found.problems.push((lost.path, None, lost.message));
    }
    for segment in &found.segments {
        if let Some((offset, reason)) = &segment.scan.damage {
            found.problems.push((
                segment.path.clone(),
                Some(*offset),
                format!("damaged record ({reason}), with records that were synced after it"),
            ));
        }
    }
    for pair in found.segments.windows(2) {
        let (previous, segment) = (&pair[0], &pair[1]);
        if let Some((previous_id, previous_end)) = segment.header.previous {
            if previous_id == previous.id && previous.scan.end < previous_end {
                found.problems.push((
                    previous.path.clone(),
                    Some(previous.scan.end),
                    format!(
                        "ends at offset {} but held records up to {previous_end} when segment \
                         {} was started and synced",
                        previous.scan.end, segment.id
                    ),
                ));
            }
        }
    }
}

/// Decides what a commit record whose entry is incomplete means, from what
/// the segment after it proves (FORMAT.md, "Reading a segment" and "Across
/// segments"). Such an entry is damage when anything durable shows it was
/// complete once; otherwise it is a crash's torn write, and then no entry
/// committed after it in the segment may be kept either: every
/// acknowledged commit had a sync cover all that precedes its commit
/// record.
///
/// The next segment records where this one ended (`previous_end`): that
/// is where an earlier open (or the writer, at a segment switch) found it
/// to end, and everything below it was synced before the next segment got
/// its name. An incomplete entry committed below it is damage; what lies
/// past it was cut off then and stays cut off. Otherwise (no next segment,
/// or one that started while entries were still open here) the segment
/// ends at the incomplete entry's commit record, unless a durable mark
/// past its bad chunk (an end mark, say) already made it damage.
fn judge_failed_commits(segments: &mut [FoundSegment]) {
    for i in 0..segments.len() {
        let (before, after) = segments.split_at_mut(i + 1);
        let segment = &mut before[i];
        let recorded_end = after
            .first()
            .and_then(|next| next.header.previous)
            .filter(|(previous_id, _)| *previous_id == segment.id)
            .map(|(_, previous_end)| previous_end);
        if let Some(previous_end) = recorded_end {
            segment.scan.truncate(previous_end);
            // Bytes at or past the recorded end were not part of the
            // segment for the open that recorded it: whatever they hold is
            // not damage.
            if segment
                .scan
                .damage
                .as_ref()
                .is_some_and(|(offset, _)| *offset >= previous_end)
            {
                segment.scan.damage = None;
            }
            if let Some(failed) = segment.scan.failed_commit.take() {
                segment.scan.damage.get_or_insert((
                    failed.at,
                    format!(
                        "{}, although segment {} records that this one held durable records \
                         up to offset {previous_end}",
                        failed.reason, after[0].id
                    ),
                ));
            }
        } else if segment.scan.damage.is_none() {
            if let Some(failed) = segment.scan.failed_commit.take() {
                let scan = &mut segment.scan;
                scan.unproven = scan
                    .incomplete
                    .iter()
                    .filter(|entry| entry.commit >= failed.commit)
                    .cloned()
                    .collect();
                let cut_off: Vec<u64> = scan
                    .committed
                    .iter()
                    .filter(|(_, (_, commit))| *commit >= failed.commit)
                    .map(|(id, _)| *id)
                    .collect();
                scan.commits_past_stop.splice(0..0, cut_off);
                scan.truncate(failed.commit);
            }
        }
    }
}
