//! The header copies of a stratum file, plain (format version 1) or sealed
//! (version 2), and a sealed stratum's stamps.
//!
//! A sealed copy is an envelope (fixed fields and both bitmaps, with a
//! version per stamp page) where a plain copy is, and stamp pages in the
//! stratum's stamps file (`stamps-{basin}-{n}`). A stamp is the low
//! 32 bits of the sequence that wrote the blob starting at that grain: a
//! blob's image carries its sequence, so an old image of a grain that was
//! freed and reused is told from the current one. A page is written only
//! when one of its stamps changed; the envelope records which generation
//! wrote each page, and a page opens only with that generation, so an old
//! page is damage too. Writing a copy writes its changed pages first and
//! its envelope last: a crash in between leaves that copy invalid (its
//! pages no longer match the old envelope) and the other copy, durable
//! before this one is touched, is used.

use std::collections::{BTreeSet, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use okaywal::encryption::KeyId;
use okaywal::fs::{FileHandle, FileSystem, OpenMode};
use parking_lot::Mutex;

use crate::format::{
    open_envelope, sealed_stratum_body_len, stamp_page_offset, stamp_pages, stratum_capacity,
    stratum_slot_size, HeaderError, StratumHeader, STAMPS_PER_PAGE, STAMP_PAGE_BYTES,
    STRATUM_MAGIC_BYTES,
};
use crate::sealing::{PagePlace, Sealer, Unsealed};

/// One header copy as read.
#[derive(Debug, Clone)]
pub(crate) struct CopyState {
    /// Its fields and bitmaps.
    pub header: StratumHeader,
    /// Sealed: the generation that last wrote each stamp page (0: never).
    pub versions: Vec<u64>,
    /// Sealed: one stamp per grain.
    pub stamps: Vec<u32>,
    /// Sealed: the key ids of its envelope and pages.
    pub key_ids: BTreeSet<KeyId>,
}

impl CopyState {
    /// Whether two copies hold the same state (header and stamps),
    /// whatever keys sealed them and whichever generations wrote their
    /// pages.
    pub fn same_state(&self, other: &CopyState) -> bool {
        self.header == other.header && self.stamps == other.stamps
    }
}

/// Why a header copy did not read.
#[derive(Debug)]
pub(crate) enum CopyError {
    /// Damaged, never written or of another format.
    Header(HeaderError),
    /// Sealed with a key that is missing or wrong: not damage.
    Key(io::Error),
}

/// The file name of the stamps of stratum `number` of `basin`.
pub(crate) fn stamps_file_name(basin: u8, number: u32) -> String {
    format!("stamps-{basin}-{number}")
}

/// Bytes of stamp pages written with one `pwrite` at most.
const MAX_STAMP_RUN_BYTES: usize = 1 << 20;

/// Reads up to `want` bytes at `offset` of `file` (fewer where it ends).
fn read_up_to(file: &dyn FileHandle, offset: u64, want: u64) -> io::Result<Vec<u8>> {
    let len = file.len()?;
    let available = len.saturating_sub(offset).min(want) as usize;
    let mut bytes = vec![0; available];
    file.read_exact_at(&mut bytes, offset)?;
    Ok(bytes)
}

/// Reads header copy `slot` of a stratum file of `basin`, number `number`;
/// sealed if `sealed` gives the store's sealer and the stratum's stamps
/// file (if it exists). Only failed reads are errors.
pub(crate) fn read_copy(
    file: &dyn FileHandle,
    sealed: Option<(&Sealer, Option<&dyn FileHandle>)>,
    basin: u8,
    number: u32,
    slot: u64,
    what: &dyn std::fmt::Display,
) -> io::Result<Result<CopyState, CopyError>> {
    let slot_size = stratum_slot_size(basin);
    let start = slot * slot_size;
    let Some((sealer, stamps_file)) = sealed else {
        let bytes = read_up_to(file, start, slot_size)?;
        return Ok(StratumHeader::decode(&bytes, basin, number)
            .map(|header| CopyState {
                header,
                versions: Vec::new(),
                stamps: Vec::new(),
                key_ids: BTreeSet::new(),
            })
            .map_err(CopyError::Header));
    };
    let head = read_up_to(file, start, slot_size)?;
    let envelope = match open_envelope(&head, STRATUM_MAGIC_BYTES, sealed_stratum_body_len(basin)) {
        Ok(envelope) => envelope,
        Err(error) => return Ok(Err(CopyError::Header(error))),
    };
    let (body, key_id) = match sealer.open_stratum_header(&envelope, basin, number, slot, what) {
        Ok(opened) => opened,
        Err(Unsealed::Key(error)) => return Ok(Err(CopyError::Key(error))),
        Err(Unsealed::Damaged) => return Ok(Err(CopyError::Header(HeaderError::NotAuthentic))),
    };
    let (header, versions) = match StratumHeader::decode_sealed_body(&body, basin, number) {
        Ok(decoded) => decoded,
        Err(error) => return Ok(Err(CopyError::Header(error))),
    };
    let capacity = stratum_capacity(basin) as usize;
    let mut stamps = vec![0_u32; capacity];
    let mut key_ids = BTreeSet::from([key_id]);
    for (page, &version) in versions.iter().enumerate() {
        if version == 0 {
            continue;
        }
        let page = page as u32;
        let at = stamp_page_offset(basin, slot, page);
        let mut bytes = match stamps_file {
            Some(stamps_file) => read_up_to(stamps_file, at, STAMP_PAGE_BYTES)?,
            None => Vec::new(),
        };
        if bytes.len() as u64 != STAMP_PAGE_BYTES {
            return Ok(Err(CopyError::Header(HeaderError::Truncated)));
        }
        let place = PagePlace {
            basin,
            number,
            slot,
            page,
            version,
        };
        match sealer.open_page(&place, &mut bytes, what) {
            Ok((page_stamps, key_id)) => {
                key_ids.insert(key_id);
                let first = (page * STAMPS_PER_PAGE) as usize;
                for (i, stamp) in page_stamps.into_iter().enumerate() {
                    if let Some(slot) = stamps.get_mut(first + i) {
                        *slot = stamp;
                    }
                }
            }
            Err(Unsealed::Key(error)) => return Ok(Err(CopyError::Key(error))),
            Err(Unsealed::Damaged) => return Ok(Err(CopyError::Header(HeaderError::NotAuthentic))),
        }
    }
    Ok(Ok(CopyState {
        header,
        versions,
        stamps,
        key_ids,
    }))
}

/// Writes `header` (its generation also the version of every page
/// written) into sealed copy `slot`: the changed stamp pages (every page
/// ever written, if `full`) into the stamps file, which is synced, then
/// the envelope into the stratum file (not synced).
pub(crate) fn write_copy(
    file: &dyn FileHandle,
    sealer: &Sealer,
    header: &StratumHeader,
    slot: u64,
    stamps: &Stamps,
    full: bool,
) -> io::Result<()> {
    let basin = header.basin;
    let start = slot * stratum_slot_size(basin);
    if stamps.sync_failed.load(Ordering::Acquire) {
        // As for a stratum file: after a failed fdatasync, no later one
        // proves that the pages are on disk.
        return Err(io::Error::other(format!(
            "an fdatasync of {} failed; its stamp pages may be lost",
            stamps.path.display()
        )));
    }
    let mut durable = stamps.durable.lock();
    let copy = slot as usize;
    let mut versions = durable.versions[copy].clone();
    let pages: Vec<u32> = if full {
        (0..stamp_pages(basin))
            .filter(|&page| {
                durable.versions.iter().any(|v| v[page as usize] != 0)
                    || durable.dirty[copy].contains(&page)
            })
            .collect()
    } else {
        durable.dirty[copy].iter().copied().collect()
    };
    if !pages.is_empty() && stamps.file.is_none() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} is open read-only", stamps.path.display()),
        ));
    }
    // Pages with consecutive numbers are neighbours in the file: each run
    // of them goes out as one write.
    let mut run: Vec<u8> = Vec::new();
    let mut run_start = 0_u32;
    for (i, &page) in pages.iter().enumerate() {
        let first = (page * STAMPS_PER_PAGE) as usize;
        let last = (first + STAMPS_PER_PAGE as usize).min(durable.stamps.len());
        let place = PagePlace {
            basin,
            number: header.stratum,
            slot,
            page,
            version: header.generation,
        };
        if run.is_empty() {
            run_start = page;
        }
        sealer.append_page(&place, &durable.stamps[first..last], &mut run)?;
        versions[page as usize] = header.generation;
        let run_ends = pages.get(i + 1) != Some(&(page + 1)) || run.len() >= MAX_STAMP_RUN_BYTES;
        if let (true, Some(stamps_file)) = (run_ends, &stamps.file) {
            stamps_file.write_all_at(&run, stamp_page_offset(basin, slot, run_start))?;
            run.clear();
        }
    }
    if let (false, Some(stamps_file)) = (pages.is_empty(), &stamps.file) {
        // The pages are durable before the envelope that lists them is
        // written: a crash may leave this copy's pages newer than its
        // envelope (then the copy is invalid), never the reverse.
        if let Err(error) = stamps_file.sync_data() {
            stamps.sync_failed.store(true, Ordering::Release);
            return Err(error);
        }
    }
    let body = header.encode_sealed_body(&versions);
    let envelope = sealer.seal_stratum_header(basin, header.stratum, slot, body)?;
    file.write_all_at(&envelope, start)?;
    durable.versions[copy] = versions;
    for page in pages {
        durable.dirty[copy].remove(&page);
    }
    Ok(())
}

/// A sealed stratum's stamps: as committed (what readers check) and as
/// checkpointed (what the header copies hold), with which pages each copy
/// must write again.
#[derive(Debug)]
pub(crate) struct Stamps {
    live: Vec<AtomicU32>,
    durable: Mutex<Durable>,
    /// The stamps file (`None` in a read-only store where it is missing).
    file: Option<Arc<dyn FileHandle>>,
    path: PathBuf,
    /// Set once an `fdatasync` of the stamps file failed.
    sync_failed: AtomicBool,
}

#[derive(Debug)]
struct Durable {
    stamps: Vec<u32>,
    /// Per header copy: the generation that last wrote each page.
    versions: [Vec<u64>; 2],
    /// Per header copy: pages whose stamps changed since it was written.
    dirty: [BTreeSet<u32>; 2],
}

impl Stamps {
    /// Opens (`writable`: creating it, durably, if it is missing) the
    /// stamps file of stratum `number` of `basin` in `directory`; `None` if
    /// a read-only open finds none.
    pub fn open_file(
        fs: &dyn FileSystem,
        directory: &Path,
        basin: u8,
        number: u32,
        writable: bool,
    ) -> io::Result<(PathBuf, Option<Arc<dyn FileHandle>>)> {
        let path = directory.join(stamps_file_name(basin, number));
        if !writable {
            return match fs.open(&path, OpenMode::Read) {
                Ok(file) => Ok((path, Some(file))),
                Err(error) if error.kind() == io::ErrorKind::NotFound => Ok((path, None)),
                Err(error) => Err(error),
            };
        }
        let existed = fs.exists(&path)?;
        let file = fs.open(&path, OpenMode::Create)?;
        if !existed {
            fs.sync_dir(directory)?;
        }
        Ok((path, Some(file)))
    }

    /// Stamps as the header copies hold them: `stamps`, and each copy's
    /// page versions; `file` is the stamps file at `path`.
    pub fn new(
        basin: u8,
        stamps: Vec<u32>,
        versions: [Vec<u64>; 2],
        (path, file): (PathBuf, Option<Arc<dyn FileHandle>>),
    ) -> Self {
        let capacity = stratum_capacity(basin) as usize;
        let pages = stamp_pages(basin) as usize;
        let mut stamps = stamps;
        stamps.resize(capacity, 0);
        let versions = versions.map(|mut v| {
            v.resize(pages, 0);
            v
        });
        Self {
            live: stamps.iter().map(|&s| AtomicU32::new(s)).collect(),
            durable: Mutex::new(Durable {
                stamps,
                versions,
                dirty: [BTreeSet::new(), BTreeSet::new()],
            }),
            file,
            path,
            sync_failed: AtomicBool::new(false),
        }
    }

    /// The stamps file, if open.
    pub fn file(&self) -> Option<&dyn FileHandle> {
        self.file.as_deref()
    }

    /// The stamp of the blob committed at grain `index` (0 if none).
    pub fn live(&self, index: u32) -> u32 {
        self.live
            .get(index as usize)
            .map_or(0, |stamp| stamp.load(Ordering::Acquire))
    }

    /// A blob written by `sequence` was committed at grain `index`.
    pub fn set_live(&self, index: u32, sequence: u64) {
        if let Some(stamp) = self.live.get(index as usize) {
            stamp.store(stamp_of(sequence), Ordering::Release);
        }
    }

    /// A WAL checkpoint records the blob written by `sequence` at grain
    /// `index`: the next header write carries its stamp.
    pub fn set_durable(&self, index: u32, sequence: u64) {
        let mut durable = self.durable.lock();
        let stamp = stamp_of(sequence);
        let Some(slot) = durable.stamps.get_mut(index as usize) else {
            return;
        };
        if *slot != stamp {
            *slot = stamp;
            let page = index / STAMPS_PER_PAGE;
            for dirty in &mut durable.dirty {
                dirty.insert(page);
            }
        }
    }

    /// The checkpointed stamps of `indexes` (for `verify`).
    pub fn durable_of(&self, indexes: &HashSet<u32>) -> Vec<(u32, u32)> {
        let durable = self.durable.lock();
        indexes
            .iter()
            .filter_map(|&i| durable.stamps.get(i as usize).map(|&s| (i, s)))
            .collect()
    }
}

/// The stamp of a blob written by `sequence`: its low 32 bits.
pub(crate) fn stamp_of(sequence: u64) -> u32 {
    sequence as u32
}
