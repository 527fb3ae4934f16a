//! [`Database::rekey`]: after the key provider's current key changed,
//! sealing everything an older key sealed again, so that the old key can
//! be retired; and finishing, at open, a rekey that a crash cut short.
//!
//! Blobs cannot move (a grain id is where the blob is), so their pieces
//! are rewritten in place. A torn in-place write would lose the blob, so
//! each batch of new pieces first goes into the journal file
//! `rekey-journal` (sealed, synced, its name synced), then into the
//! grains, which are synced, and only then is the journal removed (and the
//! directory synced). An open that finds the journal writes its pieces
//! again once the WAL has replayed, where the blob is still the one the
//! journal names (live, with the stamp of the same sequence); a journal
//! that does not open was being written when the crash came, before any
//! grain was touched, and is removed.
//!
//! A piece sealed under the old key and its resealed copy hold the same
//! plaintext and open at the same place, so a blob that is half rewritten
//! reads with either key. Stratum headers are rewritten as a checkpoint
//! writes them (one copy, sync, the other, sync); commit log files are
//! written whole under another name and renamed over the old ones; the
//! index goes last, with the key checks of the keys still in use.

use std::collections::BTreeSet;
use std::io;
use std::path::Path;
use std::sync::Arc;

use okaywal::encryption::{KeyError, KeyId, SEAL_BYTES};
use okaywal::fs::{FileSystem, OpenMode};

use crate::allocator::blobs;
use crate::db::Database;
use crate::error::{Context, Error, Result};
use crate::format::{sealed_chunk_span, sealed_chunks, BASINS, SEALED_IMAGE_HEAD};
use crate::grain_id::GrainId;
use crate::read::read_stable;
use crate::sealing::{seal_at, Sealer, Unsealed};
use crate::stratum::Stratum;
use crate::verify_report::Problem;

/// The journal of the batch of pieces being rewritten.
pub(crate) const JOURNAL: &str = "rekey-journal";
const JOURNAL_MAGIC: [u8; 8] = *b"SEDREKEY";
/// Bytes of new pieces a batch collects before it is written.
const BATCH_BYTES: usize = 1 << 20;

/// What [`Database::rekey`] did and what the store still needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RekeyReport {
    /// Blobs with at least one piece sealed again.
    pub blobs_resealed: u64,
    /// Stratum files whose header copies were sealed again.
    pub strata_resealed: u64,
    /// Commit log files sealed again.
    pub commit_log_files_resealed: u64,
    /// The key ids still in use afterwards, as
    /// [`VerifyReport::key_ids_in_use`](crate::VerifyReport::key_ids_in_use)
    /// lists them: only the current key once the rekey is complete. A key
    /// listed here must not be retired.
    pub key_ids_in_use: Vec<KeyId>,
    /// What could not be read (so not sealed again), and what `verify`
    /// found afterwards.
    pub problems: Vec<Problem>,
}

/// One blob's new pieces: (offset in its image, bytes).
struct Entry {
    id: GrainId,
    sequence: u64,
    pieces: Vec<(u64, Vec<u8>)>,
}

impl Database {
    /// Seals again, under the key provider's current key, everything in
    /// the store sealed under another key: blobs, stratum headers and
    /// their stamp pages, commit log files and the index. Run it after
    /// rotating the key; once it returns with only the current key in
    /// [`RekeyReport::key_ids_in_use`], the old keys can be retired (the
    /// index then lists only the current key, and an open with a provider
    /// that lacks a key the store needs fails, naming it).
    ///
    /// It first moves everything the WAL holds into the strata (as
    /// [`Database::checkpoint_wal`] does, so it must not be called while
    /// this thread holds a transaction open), then rewrites in batches
    /// while other threads go on reading and writing. It is crash-safe:
    /// after a crash every blob reads with the keys it had before (the
    /// next open finishes the batch that was being written), and running
    /// it again finishes the work.
    ///
    /// The WAL (an encrypted okaywal log) needs no rewriting: its segments
    /// under older keys are checkpointed first, and the next segment
    /// starts under the current key.
    ///
    /// If the key is rotated again while it runs, what was sealed under
    /// the key current when it began may stay: run it again.
    ///
    /// Fails with [`Error::ReadOnly`] on a store opened read-only, and with
    /// [`Error::Key`] ([`KeyError::NotEncrypted`]) on a plain store.
    pub fn rekey(&self) -> Result<RekeyReport> {
        self.check_open()?;
        self.wal().live()?;
        let shared = self.shared();
        let Some(sealer) = shared.strata().sealer().cloned() else {
            return Err(Error::Key {
                context: "rekeying".into(),
                source: KeyError::NotEncrypted.into_io(shared.directory().display()),
            });
        };
        let current = sealer
            .current_key_id()
            .context(|| "asking the key provider for the current key".to_string())?;
        // Every blob sealed before the key changed is committed (or gone)
        // and in the strata once this returns: transactions that began
        // before it hold entries it waits for. The empty transaction makes
        // the second checkpoint start a new WAL segment, under the current
        // key, even if the active one held nothing.
        self.checkpoint_wal()?;
        self.begin_transaction()?.commit()?;
        self.checkpoint_wal()?;

        let mut report = RekeyReport::default();
        // Ids of what could not be read, so could not be sealed again.
        let mut stuck: BTreeSet<KeyId> = BTreeSet::new();
        let mut batch: Vec<Entry> = Vec::new();
        let mut batch_bytes = 0;
        for basin in 0..BASINS {
            for stratum in shared.strata().of_basin(basin) {
                let snapshot = shared.reclamation().stratum_snapshot(&stratum);
                let bits = &snapshot.bits;
                for (start, count) in blobs(&bits.live_allocated, &bits.live_starts, bits.capacity)
                {
                    let Some(id) = GrainId::new(stratum.basin(), stratum.number(), start, count)
                    else {
                        continue;
                    };
                    if snapshot.in_wal.contains_key(&id) {
                        continue;
                    }
                    let queue = (&mut batch, &mut batch_bytes);
                    match reseal_blob(self, &stratum, &sealer, id, current, queue) {
                        Ok(true) => report.blobs_resealed += 1,
                        Ok(false) => {}
                        Err(Skipped::Gone) => {}
                        Err(Skipped::Damaged(key_id, problem)) => {
                            stuck.insert(key_id);
                            report.problems.push(problem);
                        }
                        Err(Skipped::Failed(error)) => return Err(error),
                    }
                    if batch_bytes >= BATCH_BYTES {
                        self.apply_batch(&sealer, &mut batch)?;
                        batch_bytes = 0;
                    }
                }
            }
        }
        self.apply_batch(&sealer, &mut batch)?;

        for basin in 0..BASINS {
            for stratum in shared.strata().of_basin(basin) {
                let copies = stratum
                    .read_copies()
                    .context(|| format!("reading the headers of {}", stratum.path().display()))?;
                let resealed = copies.iter().all(|copy| {
                    copy.as_ref()
                        .is_ok_and(|c| c.key_ids.iter().all(|id| *id == current))
                });
                if resealed {
                    continue;
                }
                let _store = shared.lock_store();
                if let Err(error) = stratum.rewrite_headers() {
                    shared.poison(&error);
                    return Err(error);
                }
                report.strata_resealed += 1;
            }
        }

        {
            let mut store = shared.lock_store();
            report.commit_log_files_resealed = store.commit_log_mut().reseal(current)? as u64;
            sealer
                .retain_key_checks(|id| stuck.contains(&id))
                .context(|| "asking the key provider for the current key".to_string())?;
            store.rewrite_index()?;
        }

        let verified = self.verify_report(|_, _| {})?;
        report.key_ids_in_use = verified.key_ids_in_use;
        report.problems.extend(verified.problems);
        Ok(report)
    }

    /// Writes a batch of new pieces: journal, grains, sync, no journal.
    fn apply_batch(&self, sealer: &Sealer, batch: &mut Vec<Entry>) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let shared = self.shared();
        let fs = shared.fs();
        let directory = shared.directory();
        let path = directory.join(JOURNAL);
        let sealed = sealer
            .seal_journal(encode_journal(batch))
            .context(|| format!("sealing {}", path.display()))?;
        let mut bytes = Vec::with_capacity(16 + sealed.len());
        bytes.extend_from_slice(&JOURNAL_MAGIC);
        bytes.push(crate::format::SEALED_FORMAT_VERSION);
        bytes.extend_from_slice(&[0; 7]);
        bytes.extend_from_slice(&sealed);
        let file = fs
            .open(&path, OpenMode::Create)
            .context(|| format!("creating {}", path.display()))?;
        file.set_len(0)
            .and_then(|()| file.write_all_at(&bytes, 0))
            .and_then(|()| file.sync_data())
            .and_then(|()| fs.sync_dir(directory))
            .context(|| format!("writing {}", path.display()))?;
        write_entries(self, batch)?;
        batch.clear();
        fs.remove_file(&path)
            .and_then(|()| fs.sync_dir(directory))
            .context(|| format!("removing {}", path.display()))
    }
}

/// Why a blob was not resealed.
enum Skipped {
    /// It was freed meanwhile.
    Gone,
    /// A piece (sealed under this key id) does not open: damage.
    Damaged(KeyId, Problem),
    /// Reading failed, or a key is missing.
    Failed(Error),
}

/// Reads blob `id` of `stratum` piece by piece and queues, into `batch`,
/// every piece sealed under a key other than `current`, sealed again.
/// Returns whether it queued any.
/// A batch that grows past [`BATCH_BYTES`] is written on the way (a large
/// blob goes out over several batches).
fn reseal_blob(
    db: &Database,
    stratum: &Arc<Stratum>,
    sealer: &Sealer,
    id: GrainId,
    current: KeyId,
    (batch, batch_bytes): (&mut Vec<Entry>, &mut usize),
) -> Result<bool, Skipped> {
    let offset = stratum.offset_of(id.index());
    let location = format!("{} offset {offset}", stratum.path().display());
    let failed = |source: io::Error| {
        Skipped::Failed(Error::from_io(
            format!("rekeying grain {id} ({location})"),
            source,
        ))
    };
    // Damage is damage only while the blob is still there.
    let damaged = |key_id: KeyId, what: &str| {
        if stratum.is_live_blob(id.index(), id.count()) {
            Skipped::Damaged(
                key_id,
                Problem {
                    location: location.clone(),
                    grain: Some(id),
                    description: format!("{what}: it cannot be sealed again under the new key"),
                },
            )
        } else {
            Skipped::Gone
        }
    };
    let mut head = [0_u8; SEALED_IMAGE_HEAD as usize];
    let header = match crate::read::open_sealed_head(stratum, sealer, id).map_err(failed)? {
        Ok((header, _)) => header,
        Err(Unsealed::Damaged) => {
            let _ = stratum.file().read_exact_at(&mut head, offset);
            return Err(damaged(
                seal_at(&head).key_id,
                "its grain header failed authentication",
            ));
        }
        Err(Unsealed::Key(source)) => return Err(failed(source)),
    };
    let mut entry = Entry {
        id,
        sequence: header.sequence,
        pieces: Vec::new(),
    };
    let mut queued = false;
    let len = u64::from(header.length);
    let spans = std::iter::once((0, SEALED_IMAGE_HEAD as usize - SEAL_BYTES, None)).chain(
        (0..sealed_chunks(len)).map(|chunk| {
            let (at, plain) = sealed_chunk_span(len, chunk);
            (at, plain, Some(chunk))
        }),
    );
    for (at, plain, chunk) in spans {
        let mut piece = vec![0_u8; SEAL_BYTES + plain];
        let resealed = read_stable(stratum, offset + at, &mut piece, |piece| {
            sealer.reseal_image_piece(id, &header, chunk, piece, current, &location)
        })
        .map_err(failed)?;
        match resealed {
            Ok(true) => {
                *batch_bytes += piece.len();
                entry.pieces.push((at, piece));
                queued = true;
            }
            Ok(false) => {}
            Err(Unsealed::Damaged) => {
                let _ = stratum
                    .file()
                    .read_exact_at(&mut piece[..SEAL_BYTES], offset + at);
                let what = match chunk {
                    Some(chunk) => format!("chunk {chunk} failed authentication"),
                    None => "its grain header failed authentication".to_string(),
                };
                return Err(damaged(seal_at(&piece).key_id, &what));
            }
            Err(Unsealed::Key(source)) => return Err(failed(source)),
        }
        if *batch_bytes >= BATCH_BYTES {
            batch.push(Entry {
                id,
                sequence: entry.sequence,
                pieces: std::mem::take(&mut entry.pieces),
            });
            db.apply_batch(sealer, batch).map_err(Skipped::Failed)?;
            *batch_bytes = 0;
        }
    }
    if !entry.pieces.is_empty() {
        batch.push(entry);
    }
    Ok(queued)
}

/// Writes each entry's pieces into its grains where the blob is still the
/// one the entry names, then syncs the strata written to. Checkpoints and
/// `verify` wait meanwhile (the store is locked).
fn write_entries(db: &Database, entries: &[Entry]) -> Result<()> {
    let shared = db.shared();
    let _store = shared.lock_store();
    let mut touched: Vec<Arc<Stratum>> = Vec::new();
    for entry in entries {
        let Ok(Some(stratum)) = shared.strata().stratum_of(entry.id) else {
            continue;
        };
        let pieces: Vec<(u64, &[u8])> = entry
            .pieces
            .iter()
            .map(|(at, bytes)| (*at, bytes.as_slice()))
            .collect();
        let wrote = stratum
            .rewrite_blob(entry.id.index(), entry.id.count(), entry.sequence, &pieces)
            .context(|| {
                format!(
                    "rewriting grain {} in {}",
                    entry.id,
                    stratum.path().display()
                )
            })?;
        if wrote && !touched.iter().any(|s| Arc::ptr_eq(s, &stratum)) {
            touched.push(stratum);
        }
    }
    for stratum in &touched {
        if let Err(error) = stratum.sync() {
            shared.poison(&error);
            return Err(error);
        }
    }
    Ok(())
}

fn encode_journal(entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for entry in entries {
        out.extend_from_slice(&entry.id.to_bytes());
        out.extend_from_slice(&entry.sequence.to_le_bytes());
        out.extend_from_slice(&(entry.pieces.len() as u32).to_le_bytes());
        for (at, bytes) in &entry.pieces {
            out.extend_from_slice(&at.to_le_bytes());
            out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            out.extend_from_slice(bytes);
        }
    }
    out
}

/// Decodes a journal body; `None` if it is not one (never a panic).
fn decode_journal(bytes: &[u8]) -> Option<Vec<Entry>> {
    let mut rest = bytes;
    let mut take = |n: usize| -> Option<&[u8]> {
        if rest.len() < n {
            return None;
        }
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Some(head)
    };
    let u32_of = |b: &[u8]| u32::from_le_bytes(b.try_into().expect("4 bytes"));
    let u64_of = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
    let count = u32_of(take(4)?);
    let mut entries = Vec::new();
    for _ in 0..count {
        let id = GrainId::from_u64(u64_of(take(8)?)).ok()?;
        let sequence = u64_of(take(8)?);
        let pieces = u32_of(take(4)?);
        let mut entry = Entry {
            id,
            sequence,
            pieces: Vec::new(),
        };
        for _ in 0..pieces {
            let at = u64_of(take(8)?);
            let len = u32_of(take(4)?) as usize;
            entry.pieces.push((at, take(len)?.to_vec()));
        }
        entries.push(entry);
    }
    Some(entries)
}

/// At a writable open of an encrypted store, after the WAL replayed:
/// writes again the pieces of a batch that a crash may have left half
/// written, then removes the journal.
pub(crate) fn finish_interrupted(db: &Database) -> Result<()> {
    let shared = db.shared();
    let Some(sealer) = shared.strata().sealer() else {
        return Ok(());
    };
    let fs = shared.fs();
    let directory = shared.directory();
    let path = directory.join(JOURNAL);
    if !fs
        .exists(&path)
        .context(|| format!("checking {}", path.display()))?
    {
        return Ok(());
    }
    let file = fs
        .open(&path, OpenMode::Read)
        .context(|| format!("opening {}", path.display()))?;
    let len = file
        .len()
        .context(|| format!("reading {}", path.display()))?;
    let mut bytes = vec![0; len as usize];
    file.read_exact_at(&mut bytes, 0)
        .context(|| format!("reading {}", path.display()))?;
    let body = if bytes.len() >= 16 && bytes[..8] == JOURNAL_MAGIC {
        match sealer.open_journal(&bytes[16..], &path.display()) {
            Ok(body) => Some(body),
            Err(Unsealed::Damaged) => None,
            Err(Unsealed::Key(source)) => {
                return Err(Error::from_io(
                    format!("reading {}", path.display()),
                    source,
                ))
            }
        }
    } else {
        None
    };
    // A journal that does not open was cut short while being written:
    // no grain had been touched yet.
    if let Some(entries) = body.as_deref().and_then(decode_journal) {
        write_entries(db, &entries)?;
    }
    fs.remove_file(&path)
        .and_then(|()| fs.sync_dir(directory))
        .context(|| format!("removing {}", path.display()))
}

/// Removes the commit log copies a crash left before their rename (see
/// `CommitLogFiles::reseal`): a file named `rekey-commits-N` that is
/// empty, zeroed, or begins with a sealed commit log frame of sequence N.
/// Another program's file of that name is refused, left as it is
/// ([`Error::UnrecognisedFile`]), like one named as a commit log file.
pub(crate) fn remove_leftovers(
    fs: &dyn FileSystem,
    directory: &Path,
    names: &[String],
    sealer: &Sealer,
) -> Result<()> {
    for name in names {
        let first = name
            .strip_prefix("rekey-commits-")
            .filter(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|digits| digits.parse::<u64>().ok());
        if let Some(first) = first {
            let path = directory.join(name);
            crate::commit_log::refuse_unrecognised(fs, &path, first, Some(sealer))?;
            fs.remove_file(&path)
                .context(|| format!("removing the leftover {}", path.display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journals_round_trip_and_garbage_is_refused() {
        let entries = vec![Entry {
            id: GrainId::new(2, 1, 3, 4).unwrap(),
            sequence: 99,
            pieces: vec![(0, vec![1, 2, 3]), (60, vec![4; 10])],
        }];
        let bytes = encode_journal(&entries);
        let decoded = decode_journal(&bytes).unwrap();
        assert_eq!(decoded.len(), 1);
        assert_eq!(decoded[0].sequence, 99);
        assert_eq!(decoded[0].pieces, entries[0].pieces);
        for cut in 0..bytes.len() {
            assert!(decode_journal(&bytes[..cut]).is_none(), "cut at {cut}");
        }
    }
}
