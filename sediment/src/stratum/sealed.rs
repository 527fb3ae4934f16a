//! The header copies of a stratum file, plain (format version 1) or sealed
//! (version 2), and a sealed stratum's stamps.
//!
//! A sealed copy is an envelope (fixed fields and both bitmaps, with a
//! version per stamp page) followed by its stamp pages. A stamp is the low
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
use std::sync::atomic::{AtomicU32, Ordering};

use okaywal::encryption::KeyId;
use okaywal::fs::FileHandle;
use parking_lot::Mutex;

use crate::format::{
    open_envelope, sealed_stratum_body_len, sealed_stratum_head_len, stamp_pages, stratum_capacity,
    HeaderError, Layout, StratumHeader, STAMPS_PER_PAGE, STAMP_PAGE_BYTES, STRATUM_MAGIC_BYTES,
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

/// Reads header copy `slot` of a stratum file of `basin`, number `number`,
/// sealed if `sealer` is given. Only failed reads are errors.
pub(crate) fn read_copy(
    file: &dyn FileHandle,
    sealer: Option<&Sealer>,
    basin: u8,
    number: u32,
    slot: u64,
    what: &dyn std::fmt::Display,
) -> io::Result<Result<CopyState, CopyError>> {
    let layout = if sealer.is_some() {
        Layout::Sealed
    } else {
        Layout::Plain
    };
    let slot_size = layout.slot_size(basin);
    let len = file.len()?;
    let start = slot * slot_size;
    let read = |offset: u64, want: u64| -> io::Result<Vec<u8>> {
        let available = len.saturating_sub(offset).min(want) as usize;
        let mut bytes = vec![0; available];
        file.read_exact_at(&mut bytes, offset)?;
        Ok(bytes)
    };
    let Some(sealer) = sealer else {
        let bytes = read(start, slot_size)?;
        return Ok(StratumHeader::decode(&bytes, basin, number)
            .map(|header| CopyState {
                header,
                versions: Vec::new(),
                stamps: Vec::new(),
                key_ids: BTreeSet::new(),
            })
            .map_err(CopyError::Header));
    };
    let head = read(start, sealed_stratum_head_len(basin))?;
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
        let at = start + sealed_stratum_head_len(basin) + u64::from(page) * STAMP_PAGE_BYTES;
        let mut bytes = read(at, STAMP_PAGE_BYTES)?;
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
/// ever written, if `full`), then the envelope. Not synced.
pub(crate) fn write_copy(
    file: &dyn FileHandle,
    sealer: &Sealer,
    header: &StratumHeader,
    slot: u64,
    stamps: &Stamps,
    full: bool,
) -> io::Result<()> {
    let basin = header.basin;
    let start = slot * Layout::Sealed.slot_size(basin);
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
    for &page in &pages {
        let first = (page * STAMPS_PER_PAGE) as usize;
        let last = (first + STAMPS_PER_PAGE as usize).min(durable.stamps.len());
        let place = PagePlace {
            basin,
            number: header.stratum,
            slot,
            page,
            version: header.generation,
        };
        let bytes = sealer.seal_page(&place, &durable.stamps[first..last])?;
        let at = start + sealed_stratum_head_len(basin) + u64::from(page) * STAMP_PAGE_BYTES;
        file.write_all_at(&bytes, at)?;
        versions[page as usize] = header.generation;
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
    /// Stamps as the header copies hold them: `stamps`, and each copy's
    /// page versions.
    pub fn new(basin: u8, stamps: Vec<u32>, versions: [Vec<u64>; 2]) -> Self {
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
        }
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
