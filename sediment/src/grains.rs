//! Listing the live blobs of a store: [`Database::grains`].

use std::io;

use crate::allocator::{bit, StratumBits};
use crate::commit_record::SequenceId;
use crate::db::Database;
use crate::error::{Error, Result};
use crate::format::{GrainHeader, BASINS, GRAIN_HEADER_SIZE, MAX_GRAINS_PER_BLOB};
use crate::grain_id::GrainId;
use crate::reclamation::Described;
use crate::sealing::{Sealer, Unsealed};
use crate::stratum::Stratum;

/// One live blob, as listed by [`Database::grains`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct GrainInfo {
    /// The blob's id, as [`Transaction::write`](crate::Transaction::write)
    /// returned it.
    pub id: GrainId,
    /// The blob's length in bytes.
    pub length: u64,
    /// The sequence of the transaction that wrote the blob.
    pub sequence: SequenceId,
    /// True if a committed transaction archived the blob: it stays readable
    /// until a `checkpoint_to` at or after that transaction frees it.
    pub archived: bool,
}

/// The live blobs of a store, in id order: see [`Database::grains`].
///
/// Each item is looked up when the iterator reaches it, so blobs committed
/// or freed while it runs may or may not be listed; every item it returns
/// describes a blob that was committed, and not yet freed, when it was
/// read.
#[derive(Debug)]
#[must_use = "an iterator does nothing unless consumed"]
pub struct Grains<'db> {
    db: &'db Database,
    /// The basin being listed; `BASINS` once every basin was.
    basin: usize,
    /// The stratum being listed within `basin`.
    stratum: u32,
    /// The next grain index to look at in that stratum.
    next_index: u32,
    /// Set once the listing ended (every stratum done, or the store shut
    /// down).
    finished: bool,
}

impl<'db> Grains<'db> {
    pub(crate) fn new(db: &'db Database) -> Self {
        Self {
            db,
            basin: 0,
            stratum: 0,
            next_index: 0,
            finished: false,
        }
    }

    /// Moves on to the next stratum file of the basin (or the next basin).
    fn next_stratum(&mut self) {
        self.stratum += 1;
        self.next_index = 0;
    }
}

impl Iterator for Grains<'_> {
    type Item = Result<GrainInfo>;

    fn next(&mut self) -> Option<Result<GrainInfo>> {
        let shared = self.db.shared();
        while !self.finished {
            if shared.is_shut_down() {
                self.finished = true;
                return Some(Err(Error::ShutDown));
            }
            if self.basin >= BASINS {
                self.finished = true;
                break;
            }
            // Strata are only ever added, at the end: one that appears
            // while the listing runs is listed if it comes after this one.
            let stratum = shared.strata().stratum(self.basin, self.stratum);
            let Some(stratum) = stratum else {
                self.basin += 1;
                self.stratum = 0;
                self.next_index = 0;
                continue;
            };
            let next_index = self.next_index;
            let run = stratum.with_bits(|bits| next_live_run(bits, next_index));
            let Some((start, count)) = run else {
                self.next_stratum();
                continue;
            };
            self.next_index = start + count;
            let Some(id) = GrainId::new(stratum.basin(), stratum.number(), start, count) else {
                return Some(Err(Error::Corrupt {
                    path: stratum.path().to_path_buf(),
                    what: format!(
                        "grains {start}..{} are allocated as one blob, more than the \
                         {MAX_GRAINS_PER_BLOB} grains a blob can span",
                        start + count
                    ),
                }));
            };
            match info(self.db, &stratum, id) {
                Ok(Some(info)) => return Some(Ok(info)),
                // Freed since the bitmap was read.
                Ok(None) => continue,
                Err(err) => return Some(Err(err)),
            }
        }
        None
    }
}

impl std::iter::FusedIterator for Grains<'_> {}

/// The first committed blob of the stratum that starts at or after grain
/// `from`, as (first grain, grain count): a start bit and the allocated
/// grains without one that follow it.
pub(crate) fn next_live_run(bits: &StratumBits, from: u32) -> Option<(u32, u32)> {
    let mut i = from;
    while i < bits.capacity {
        let word = (i / 64) as usize;
        let (Some(starts), Some(allocated)) =
            (bits.live_starts.get(word), bits.live_allocated.get(word))
        else {
            return None;
        };
        let candidates = starts & allocated & (u64::MAX << (i % 64));
        if candidates == 0 {
            i = (word as u32 + 1) * 64;
            continue;
        }
        let start = word as u32 * 64 + candidates.trailing_zeros();
        let mut end = start + 1;
        while end < bits.capacity && bit(&bits.live_allocated, end) && !bit(&bits.live_starts, end)
        {
            end += 1;
        }
        return Some((start, end - start));
    }
    None
}

/// What is known of the live blob `id` of `stratum`; `None` if it is not
/// (or no longer) a committed blob.
///
/// Follows [`Database::read`]: a blob whose bytes are still only in the
/// WAL is described from memory, any other from its grain header, read
/// again if its grains were freed (and so maybe reused) meanwhile.
fn info(db: &Database, stratum: &Stratum, id: GrainId) -> Result<Option<GrainInfo>> {
    let shared = db.shared();
    for _ in 0..16 {
        let (epoch, archived, last_committed) = match shared.reclamation().describe(id, stratum) {
            Described::Wal { pending, archived } => {
                return Ok(Some(GrainInfo {
                    id,
                    length: u64::from(pending.length),
                    sequence: SequenceId(pending.sequence),
                    archived,
                }));
            }
            Described::Stratum {
                epoch,
                archived,
                last_committed,
            } => (epoch, archived, last_committed),
            Described::Nowhere => return Ok(None),
        };
        let header = match stratum.sealer() {
            Some(sealer) => read_sealed_header(stratum, sealer, id),
            None => read_header(stratum, id),
        };
        if stratum.reuse_epoch() != epoch {
            // Freed since, and its grains may hold another blob by now.
            continue;
        }
        let offset = stratum.offset_of(id.index());
        let mismatch = || Error::ChecksumMismatch {
            grain: id,
            path: stratum.path().to_path_buf(),
            offset,
        };
        let header = header?.ok_or_else(mismatch)?;
        // A header that this exact extent could not hold, or naming a
        // sequence that never committed, is damaged.
        if stratum.layout().placement(u64::from(header.length)) != Some((id.basin(), id.count()))
            || header.sequence == 0
            || header.sequence > last_committed
        {
            return Err(mismatch());
        }
        return Ok(Some(GrainInfo {
            id,
            length: u64::from(header.length),
            sequence: SequenceId(header.sequence),
            archived,
        }));
    }
    Err(Error::Io {
        context: format!("reading the header of grain {id}"),
        source: io::Error::other("the grain kept moving while being read"),
    })
}

/// Opens the sealed grain header of `id`; `None` if it does not open
/// (damaged, or an old image: not this blob's header).
pub(crate) fn read_sealed_header(
    stratum: &Stratum,
    sealer: &Sealer,
    id: GrainId,
) -> Result<Option<GrainHeader>> {
    match crate::read::open_sealed_head(stratum, sealer, id) {
        Ok(Ok((header, _))) => Ok(Some(header)),
        Ok(Err(Unsealed::Damaged)) => Ok(None),
        Ok(Err(Unsealed::Key(source))) => Err(Error::from_io(
            format!("reading the header of grain {id}"),
            source,
        )),
        Err(source) => Err(Error::from_io(
            format!(
                "reading the header of grain {id} from {}",
                stratum.path().display()
            ),
            source,
        )),
    }
}

/// Reads the grain header of `id`; `None` if the file ends before it.
pub(crate) fn read_header(stratum: &Stratum, id: GrainId) -> Result<Option<GrainHeader>> {
    let offset = stratum.offset_of(id.index());
    let mut bytes = [0_u8; GRAIN_HEADER_SIZE];
    let mut filled = 0;
    while filled < bytes.len() {
        match stratum.read_at(&mut bytes[filled..], offset + filled as u64) {
            Ok(0) => return Ok(None),
            Ok(n) => filled += n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(Error::Io {
                    context: format!(
                        "reading the header of grain {id} from {}",
                        stratum.path().display()
                    ),
                    source,
                })
            }
        }
    }
    Ok(GrainHeader::decode(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_found_from_any_grain() {
        let words = 3;
        let mut bits = StratumBits::from_durable(192, vec![0; words], vec![0; words]);
        bits.set_live(0, 2, true);
        bits.set_live(2, 3, true);
        bits.set_live(63, 2, true);
        bits.set_live(190, 2, true);
        let mut found = Vec::new();
        let mut from = 0;
        while let Some((start, count)) = next_live_run(&bits, from) {
            found.push((start, count));
            from = start + count;
        }
        assert_eq!(found, vec![(0, 2), (2, 3), (63, 2), (190, 2)]);
        // From the middle of a blob: the next one that starts after it.
        assert_eq!(next_live_run(&bits, 1), Some((2, 3)));
        assert_eq!(next_live_run(&bits, 64), Some((190, 2)));
        assert_eq!(next_live_run(&bits, 191), None);
        assert_eq!(next_live_run(&bits, 192), None);
        // Allocated grains with no start before them are not a blob.
        let mut stray = StratumBits::from_durable(64, vec![0b1100], vec![0]);
        assert_eq!(next_live_run(&stray, 0), None);
        stray.set_live(5, 1, true);
        assert_eq!(next_live_run(&stray, 0), Some((5, 1)));
    }
}
