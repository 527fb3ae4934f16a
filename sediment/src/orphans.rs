//! Blobs of transactions that recovery dropped after a checkpoint had
//! already put them into the strata.
//!
//! A WAL checkpoint writes the stratum headers before the index, and relies
//! on replaying the WAL from the index's `wal_checkpointed_entry` after a
//! crash in between: replaying is idempotent. When such an entry is damaged
//! and the open drops it (the WAL's recovery mode is `SkipCorrupted` or
//! `PointInTime`), nothing replays it, and the blobs the interrupted
//! checkpoint wrote for it would stay allocated: readable by `get`, and
//! live blobs of a transaction the store never lists once later sequences
//! pass theirs. An open for writing with such a recovery mode therefore
//! frees every live blob whose grain header names a sequence above
//! `wal_checkpointed_entry` that no replayed entry wrote, and makes the
//! stratum headers say so before the store is used. (The frees such an
//! entry made are in the headers too, and stay: the blobs they freed were
//! archived, and their space may be reused.)

use std::collections::HashSet;

use crate::db::Database;
use crate::error::{Error, Result};
use crate::format::{grain_crc, GrainHeader, BASINS, GRAIN_HEADER_SIZE};
use crate::grain_id::GrainId;
use crate::grains::{next_live_run, read_header, read_sealed_header};
use crate::stratum::Stratum;

/// Where a blob starts: (basin, stratum, first grain).
pub(crate) type BlobStart = (u8, u32, u32);

/// The start of the blob `id`.
pub(crate) fn start_of(id: GrainId) -> BlobStart {
    (id.basin(), id.stratum(), id.index())
}

/// Frees the live blobs written by a sequence above `checkpointed_entry`
/// that no replayed WAL entry wrote (`replayed` holds the starts of the
/// blobs the replay wrote), and writes the stratum headers that changed.
/// Returns how many blobs were freed.
pub(crate) fn drop_orphans(
    db: &Database,
    checkpointed_entry: u64,
    replayed: &HashSet<BlobStart>,
) -> Result<usize> {
    let shared = db.shared();
    // The WAL's maintenance thread may start a checkpoint as soon as the
    // log is open: it writes stratum headers under the same lock.
    let _store = shared.lock_store();
    let mut dropped = 0;
    for basin in 0..BASINS {
        for stratum in shared.strata().of_basin(basin) {
            let runs = stratum.with_bits(|bits| {
                let mut runs = Vec::new();
                let mut from = 0;
                while let Some((start, count)) = next_live_run(bits, from) {
                    runs.push((start, count));
                    from = start + count;
                }
                runs
            });
            let mut changed = false;
            for (start, count) in runs {
                if replayed.contains(&(stratum.basin(), stratum.number(), start)) {
                    continue;
                }
                let Some(id) = GrainId::new(stratum.basin(), stratum.number(), start, count) else {
                    continue;
                };
                // A header that does not read back whole is damage, which
                // `verify` reports; only a whole one names an orphan.
                let Some(header) = orphan_header(&stratum, id, checkpointed_entry)? else {
                    continue;
                };
                stratum.blob_freed(start, count);
                stratum.set_durable(start, count, false, header.sequence);
                stratum.freed_grains_reusable(start, count);
                shared.cache().remove(id);
                changed = true;
                dropped += 1;
            }
            if changed && stratum.take_dirty() {
                // As a checkpoint writes a header: the older copy, synced,
                // then the other one.
                stratum.write_header()?;
                stratum.sync()?;
                stratum.mirror_header()?;
                stratum.sync()?;
            }
        }
    }
    Ok(dropped)
}

/// The grain header of the live blob `id` if it names a sequence above
/// `checkpointed_entry` and the blob reads back whole; `None` otherwise.
fn orphan_header(
    stratum: &Stratum,
    id: GrainId,
    checkpointed_entry: u64,
) -> Result<Option<GrainHeader>> {
    match stratum.sealer() {
        Some(sealer) => Ok(read_sealed_header(stratum, sealer, id)?
            .filter(|header| header.sequence > checkpointed_entry)),
        None => {
            let Some(header) = read_header(stratum, id)? else {
                return Ok(None);
            };
            if header.sequence <= checkpointed_entry
                || stratum.layout().placement(u64::from(header.length))
                    != Some((id.basin(), id.count()))
            {
                return Ok(None);
            }
            // A plain header has no checksum of its own: the blob's CRC,
            // which covers its sequence, says whether it is what that
            // sequence wrote.
            let mut data = vec![0; header.length as usize];
            let offset = stratum.offset_of(id.index()) + GRAIN_HEADER_SIZE as u64;
            let mut filled = 0;
            while filled < data.len() {
                match stratum.read_at(&mut data[filled..], offset + filled as u64) {
                    Ok(0) => return Ok(None),
                    Ok(n) => filled += n,
                    Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(source) => {
                        return Err(Error::from_io(
                            format!("reading grain {id} from {}", stratum.path().display()),
                            source,
                        ))
                    }
                }
            }
            Ok((grain_crc(header.sequence, &data) == header.crc).then_some(header))
        }
    }
}
