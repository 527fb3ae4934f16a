//! The WAL checkpoint: moving the entries of a WAL segment into the
//! strata, the commit log files and the index, and making them durable
//! before okaywal may recycle the segment. [`Store`], the index file and
//! the commit log files, is written only here.

use std::io;
use std::sync::Arc;

use okaywal::fs::FileHandle;
use okaywal::SegmentReader;

use crate::commit_log::{CommitLogFiles, LogContents};
use crate::db::Shared;
use crate::error::{Context, Error, Result};
use crate::format::{
    fit, grain_crc, placement, GrainHeader, IndexHeader, Layout, SealedIndex, INDEX_SLOT_SIZE,
};
use crate::grain_id::GrainId;
use crate::sealing::Sealer;
use crate::stratum::Stratum;
use crate::wal_entry::parse_entry;

/// The index file and the commit log files: written only by checkpoints.
#[derive(Debug)]
pub(crate) struct Store {
    index_file: Arc<dyn FileHandle>,
    /// The index header as last written.
    index: IndexHeader,
    /// The header copy the next checkpoint overwrites first.
    next_slot: usize,
    commit_log: CommitLogFiles,
    /// The store's sealing context, if it is encrypted.
    sealer: Option<Arc<Sealer>>,
}

impl Store {
    /// The store as opened: the index file, its newest header and the copy
    /// to overwrite first, and the commit log files.
    pub fn new(
        index_file: Arc<dyn FileHandle>,
        index: IndexHeader,
        next_slot: usize,
        commit_log: CommitLogFiles,
        sealer: Option<Arc<Sealer>>,
    ) -> Self {
        Self {
            index_file,
            index,
            next_slot,
            commit_log,
            sealer,
        }
    }

    /// The bytes of index header copy `slot` holding `index`: plain, or
    /// sealed with the store's id and key checks.
    pub fn encode_index(&self, index: &IndexHeader, slot: u64) -> io::Result<Vec<u8>> {
        encode_index(self.sealer.as_deref(), index, slot)
    }

    /// Writes `index` into both copies, the older first, each synced:
    /// a crash leaves one of them whole. (Outside a checkpoint: rekey.)
    pub fn rewrite_index(&mut self) -> Result<()> {
        let mut index = self.index.clone();
        index.generation += 1;
        for slot in [self.next_slot, 1 - self.next_slot] {
            let bytes = self
                .encode_index(&index, slot as u64)
                .context(|| "sealing the index header".to_string())?;
            self.index_file
                .write_all_at(&bytes, slot as u64 * INDEX_SLOT_SIZE)
                .and_then(|()| self.index_file.sync_data())
                .context(|| "writing the index header".to_string())?;
        }
        self.next_slot = 1 - self.next_slot;
        self.index = index;
        Ok(())
    }

    /// The commit log files (for rekey).
    pub fn commit_log_mut(&mut self) -> &mut CommitLogFiles {
        &mut self.commit_log
    }

    /// The commit records in the commit log files from `since` up to the
    /// last sequence the index counts as written there.
    pub fn read_commit_log(&mut self, since: u64) -> Result<LogContents> {
        let last_written = self.index.last_committed;
        self.commit_log.read(since, last_written)
    }

    /// Bytes of the commit log files.
    pub fn commit_log_bytes(&self) -> u64 {
        self.commit_log.bytes()
    }

    /// The raw bytes of index header copy `slot`, as far as the file
    /// holds them (as an open reads them: a copy that a torn write left
    /// short may still hold a whole header).
    pub fn read_index_copy(&self, slot: u64) -> io::Result<Vec<u8>> {
        let start = slot * INDEX_SLOT_SIZE;
        let len = self.index_file.len()?;
        let mut bytes = vec![0; len.saturating_sub(start).min(INDEX_SLOT_SIZE) as usize];
        self.index_file.read_exact_at(&mut bytes, start)?;
        Ok(bytes)
    }
}

/// Moves every entry of a WAL segment into the strata, the commit log and
/// the index, syncing them before the WAL may recycle the segment.
pub(crate) fn checkpoint(shared: &Shared, last_id: u64, entries: &mut SegmentReader) -> Result<()> {
    // Frees of blobs this checkpoint may copy hold their grains until it
    // ends; set before any blob is checked.
    shared.reclamation().checkpoint_started(last_id);
    let result = copy_entries(shared, last_id, entries);
    shared.reclamation().checkpoint_finished(
        shared.strata(),
        shared.cache(),
        last_id,
        result.is_ok(),
    );
    result
}

fn copy_entries(shared: &Shared, last_id: u64, entries: &mut SegmentReader) -> Result<()> {
    let mut store = shared.lock_store();
    let applied_through = store.index.wal_checkpointed_entry;
    let mut index = store.index.clone();
    let log_position = store.commit_log.position();
    let mut touched: Vec<Arc<Stratum>> = Vec::new();
    let mut encoded = Vec::new();
    let mut batch = GrainBatch::new(shared);

    let result = (|| -> Result<()> {
        while let Some(mut entry) = entries
            .read_entry()
            .context(|| "reading the WAL".to_string())?
        {
            let sequence = entry.id().0;
            if sequence <= applied_through {
                continue;
            }
            let (chunks, record) =
                parse_entry(&mut entry, true, shared.strata().sealer().is_some())
                    .context(|| format!("reading WAL entry {sequence}"))?;
            for chunk in chunks {
                let data = chunk.data.expect("read with data");
                let stratum =
                    shared
                        .strata()
                        .stratum_of(chunk.id)?
                        .ok_or_else(|| Error::Corrupt {
                            path: shared.directory().to_path_buf(),
                            what: format!(
                                "WAL entry {sequence} writes grain {} of a missing stratum",
                                chunk.id
                            ),
                        })?;
                // A blob must fill exactly the grains its id names: one
                // that does not would spill into its neighbours. (A sealed
                // store's chunk holds the blob's image, sealed by the
                // writer.)
                let fits = match shared.strata().layout() {
                    Layout::Plain => placement(data.len() as u64),
                    Layout::Sealed => fit(data.len() as u64),
                };
                if fits != Some((chunk.id.basin(), chunk.id.count())) {
                    return Err(Error::Corrupt {
                        path: shared.directory().to_path_buf(),
                        what: format!(
                            "WAL entry {sequence} holds {} bytes for grain {}, which does not \
                             fit them",
                            data.len(),
                            chunk.id
                        ),
                    });
                }
                if batch.add(&stratum, chunk.id, sequence, &data)? {
                    note(&mut touched, &stratum);
                }
            }
            for grain in &record.new_grains {
                if let Some(stratum) = shared.strata().stratum_of(grain.id)? {
                    stratum.set_durable(grain.id.index(), grain.id.count(), true, sequence);
                    note(&mut touched, &stratum);
                }
            }
            for id in &record.freed {
                if let Some(stratum) = shared.strata().stratum_of(*id)? {
                    stratum.set_durable(id.index(), id.count(), false, sequence);
                    note(&mut touched, &stratum);
                }
            }
            if let Some(header) = record.embedded_header {
                index.embedded_header = header;
            }
            if let Some(to) = record.checkpointed_to {
                index.checkpointed_to = index.checkpointed_to.max(to.0);
            }
            index.last_committed = index.last_committed.max(sequence);
            encoded.clear();
            record.encode(&mut encoded);
            store.commit_log.append(sequence, &encoded)?;
        }

        batch.flush()?;

        // Headers go into the older copy, so a crash now leaves the other
        // copy intact; the WAL still holds everything until the index says
        // it is applied, and replaying it is idempotent.
        let mut headers_written = Vec::new();
        for stratum in &touched {
            if stratum.take_dirty() {
                stratum.write_header()?;
                headers_written.push(stratum);
            }
        }
        let sync = |stratum: &Stratum| stratum.sync().inspect_err(|err| shared.poison(err));
        for stratum in &touched {
            sync(stratum)?;
        }
        // Only once the new headers are durable may their other copies be
        // overwritten: both copies then hold them (see `mirror_header`).
        for stratum in &headers_written {
            stratum.mirror_header()?;
        }
        for stratum in &headers_written {
            sync(stratum)?;
        }
        store.commit_log.sync()?;
        if store.commit_log.created_since_dir_sync() {
            shared
                .fs()
                .sync_dir(shared.directory())
                .context(|| format!("syncing directory {}", shared.directory().display()))?;
            store.commit_log.dir_synced();
        }

        let (file, end) = store.commit_log.position();
        index.commit_log_file = file;
        index.commit_log_end = end;
        index.wal_checkpointed_entry = index.wal_checkpointed_entry.max(last_id);
        // Every stratum in the list was synced by `Stratum::create` before
        // it got there, so all of them have a durable header by now.
        for (count, now) in index.strata.iter_mut().zip(shared.strata().counts()) {
            *count = (*count).max(now as u32);
        }
        index.generation += 1;
        // The older copy first; once it is durable, the other one too, so
        // that a copy decaying later falls back to the same state.
        for slot in [store.next_slot, 1 - store.next_slot] {
            let encoded_index = store
                .encode_index(&index, slot as u64)
                .context(|| "sealing the index header".to_string())?;
            store
                .index_file
                .write_all_at(&encoded_index, slot as u64 * INDEX_SLOT_SIZE)
                .and_then(|()| store.index_file.sync_data())
                .context(|| "writing the index header".to_string())?;
        }
        Ok(())
    })();

    if let Err(err) = result {
        // Nothing counts until the index says so: forget the appended
        // records so the retry writes them again at the same place.
        store.commit_log.rewind(log_position);
        for stratum in &touched {
            stratum.mark_dirty();
        }
        return Err(err);
    }
    store.next_slot = 1 - store.next_slot;
    store.index = index.clone();
    // Records may carry a `checkpoint_to` whose transaction still waits
    // for its commit to return (this checkpoint's sync made it durable);
    // until it does, readers are told the older value and must still find
    // every record above it. The rest goes at a later checkpoint.
    let applied = shared.reclamation().checkpointed_to();
    store.commit_log.trim(index.checkpointed_to.min(applied))?;
    drop(store);

    // Now that the strata hold these entries: their blobs are read from the
    // strata, their freed grains may be reused, their records are on disk.
    shared.reclamation().checkpoint_copied(last_id);
    Ok(())
}

/// Largest run of adjacent grains copied with one write.
const MAX_RUN_BYTES: usize = 1 << 20;
/// Bytes a checkpoint collects before writing them out.
const MAX_COLLECTED_BYTES: usize = 16 << 20;

/// Collects the blobs a checkpoint copies into the strata and writes them
/// sorted by file and offset, so blobs in neighbouring grains go out as
/// one write (concurrent transactions interleave their blobs in the WAL,
/// so WAL order rarely puts neighbours together).
///
/// No lock is held while writing: a blob freed after its check here keeps
/// its grains unusable until this checkpoint has finished (see
/// `Reclamation::checkpoint_started`).
struct GrainBatch<'a> {
    shared: &'a Shared,
    /// Grain headers, blobs and padding, back to back.
    arena: Vec<u8>,
    /// Where each blob goes: stratum, offset in its file, bytes in `arena`.
    writes: Vec<(Arc<Stratum>, u64, std::ops::Range<usize>)>,
}

impl<'a> GrainBatch<'a> {
    fn new(shared: &'a Shared) -> Self {
        Self {
            shared,
            arena: Vec::new(),
            writes: Vec::new(),
        }
    }

    /// Queues the blob `id` written by `sequence`; returns false if it was
    /// freed since and need not be copied.
    fn add(
        &mut self,
        stratum: &Arc<Stratum>,
        id: GrainId,
        sequence: u64,
        data: &[u8],
    ) -> Result<bool> {
        if self.shared.reclamation().is_superseded(id, sequence) {
            return Ok(false);
        }
        let start = self.arena.len();
        if stratum.layout() == Layout::Plain {
            let header = GrainHeader {
                sequence,
                length: data.len() as u32,
                crc: grain_crc(sequence, data),
            };
            self.arena.extend_from_slice(&header.encode());
        }
        // Sealed: `data` is the image, copied as it is (the writer sealed
        // it, bound to this grain and sequence).
        self.arena.extend_from_slice(data);
        // The rest of the blob's last grain is its own: padding it keeps
        // the next blob adjacent.
        let end = start + (u64::from(id.count()) * stratum.grain_size()) as usize;
        self.arena.resize(end, 0);
        self.writes
            .push((stratum.clone(), stratum.offset_of(id.index()), start..end));
        if self.arena.len() >= MAX_COLLECTED_BYTES {
            self.flush()?;
        }
        Ok(true)
    }

    /// Writes everything queued.
    fn flush(&mut self) -> Result<()> {
        // Two blobs of one checkpoint never share a grain (a blob freed
        // before its check is skipped; one freed after keeps its grains
        // until the checkpoint ends), so the order of the writes is free.
        self.writes
            .sort_by_key(|(stratum, offset, _)| (Arc::as_ptr(stratum) as usize, *offset));
        let mut run: Vec<u8> = Vec::new();
        let mut run_at: Option<(&Arc<Stratum>, u64)> = None;
        for (stratum, offset, range) in &self.writes {
            let adjacent = run_at.is_some_and(|(s, start)| {
                Arc::ptr_eq(s, stratum) && start + run.len() as u64 == *offset
            });
            if !adjacent || run.len() >= MAX_RUN_BYTES {
                if let Some((s, start)) = run_at {
                    write_run(s, start, &run)?;
                }
                run.clear();
                run_at = Some((stratum, *offset));
            }
            run.extend_from_slice(&self.arena[range.clone()]);
        }
        if let Some((s, start)) = run_at {
            write_run(s, start, &run)?;
        }
        self.writes.clear();
        self.arena.clear();
        Ok(())
    }
}

fn write_run(stratum: &Stratum, start: u64, bytes: &[u8]) -> Result<()> {
    stratum.write_grains(bytes, start).context(|| {
        format!(
            "writing {} bytes of grains at offset {} of {}",
            bytes.len(),
            start,
            stratum.path().display()
        )
    })
}

fn note(touched: &mut Vec<Arc<Stratum>>, stratum: &Arc<Stratum>) {
    if !touched.iter().any(|s| Arc::ptr_eq(s, stratum)) {
        touched.push(stratum.clone());
    }
}

/// The bytes of index header copy `slot` holding `index`: format version
/// 1, or sealed (version 2) with the store's id and key checks.
pub(crate) fn encode_index(
    sealer: Option<&Sealer>,
    index: &IndexHeader,
    slot: u64,
) -> io::Result<Vec<u8>> {
    let Some(sealer) = sealer else {
        return Ok(index.encode());
    };
    let body = SealedIndex {
        header: index.clone(),
        store_id: sealer.store_id(),
        key_checks: sealer.key_checks(),
    }
    .encode_body();
    let mut bytes = sealer.seal_index(slot, body)?;
    bytes.resize(INDEX_SLOT_SIZE as usize, 0);
    Ok(bytes)
}
