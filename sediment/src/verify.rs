//! Checking every header, allocation, grain and commit record.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use okaywal::encryption::KeyId;

use crate::allocator::blobs;
use crate::commit_record::{CommitLogDamage, CommitRecord};
use crate::db::Database;
use crate::error::{Context, Result};
use crate::format::{
    fit, grain_crc, newest, open_envelope, placement, sealed_image_len, version_of, GrainHeader,
    HeaderError, IndexHeader, BASINS, GRAIN_HEADER_SIZE, INDEX_MAGIC_BYTES, MAX_GRAINS_PER_BLOB,
    SEALED_FORMAT_VERSION, SEALED_INDEX_BODY,
};
use crate::grain_id::GrainId;
use crate::open::INDEX_FILE;
use crate::sealing::{Sealer, Unsealed};
use crate::stratum::{stamp_of, CopyError, Stratum};
use crate::verify_report::{Problem, VerifyReport};
use crate::wal_entry::{data_of_chunk, grain_of_data_chunk, record_of_chunk};

pub(crate) fn verify(db: &Database, mut progress: impl FnMut(u64, u64)) -> Result<VerifyReport> {
    let shared = db.shared();
    let mut report = VerifyReport::default();
    // Holding the store keeps checkpoints (the only writers of headers and
    // of checkpointed grains) out while we look.
    let mut store = shared.lock_store();
    let problem = |location: String, grain: Option<GrainId>, description: String| Problem {
        location,
        grain,
        description,
    };

    let sealer = shared.strata().sealer().cloned();
    let mut key_ids: BTreeSet<KeyId> = BTreeSet::new();
    let index_path = shared.directory().join(INDEX_FILE);
    // Each copy: its generation if it verifies, `None` if it was never
    // written (all zeros, or past the end of the file), or the problem.
    let mut copies = Vec::with_capacity(2);
    for slot in 0..2_u64 {
        let decode = |bytes: &[u8]| match &sealer {
            Some(sealer) => decode_sealed_index(sealer, bytes, slot, &index_path),
            None => IndexHeader::decode(bytes).map(|header| (header.generation, None)),
        };
        copies.push(match store.read_index_copy(slot) {
            Ok(bytes) if bytes.iter().all(|b| *b == 0) => Ok(None),
            Ok(bytes) => match decode(&bytes) {
                Ok((generation, key_id)) => {
                    key_ids.extend(key_id);
                    Ok(Some(generation))
                }
                Err(e) => Err(problem(
                    format!("{} (header copy {slot})", index_path.display()),
                    None,
                    format!("index header: {e}"),
                )),
            },
            Err(e) => Err(problem(
                index_path.display().to_string(),
                None,
                format!("cannot read index header: {e}"),
            )),
        });
    }
    // A new store writes copy 0 alone (generation 1); the first checkpoint
    // or open for writing writes copy 1. A missing copy beside one of a
    // later generation was written once and is gone: a truncated or zeroed
    // index, which an open for writing repairs from the other copy.
    for (slot, copy) in copies.iter().enumerate() {
        match copy {
            Err(found) => report.problems.push(found.clone()),
            Ok(None) => {
                let fresh = slot == 1 && matches!(copies[0], Ok(Some(1)));
                if !fresh {
                    report.problems.push(problem(
                        format!("{} (header copy {slot})", index_path.display()),
                        None,
                        "index header: the copy is missing (all zeros, or past the end of \
                         the file) although the other copy shows that both were written; an \
                         open for writing rewrites it from the other copy"
                            .to_string(),
                    ));
                }
            }
            Ok(Some(_)) => {}
        }
    }

    let strata: Vec<_> = (0..BASINS)
        .flat_map(|b| shared.strata().of_basin(b))
        .collect();

    // The commit records, read before the strata: the blobs the readable
    // records list as written are checked against them (`Expected`). Their
    // problems are listed after the strata's.
    let mut expected = Expected::default();
    let log_problems = match store.read_commit_log(0) {
        Ok(contents) => {
            report.commit_records_checked = contents.records.len() as u64;
            key_ids.extend(contents.key_ids.iter().copied());
            expected = Expected::collect(db, &strata, contents.records, &contents.damage);
            report.commit_log_damage = contents.damage;
            report
                .commit_log_damage
                .iter()
                .map(|damage| {
                    problem(
                        format!("{} offset {}", damage.path.display(), damage.offset),
                        None,
                        format!(
                            "commit record: {}; the records of sequences {} to {} cannot be \
                             read (blobs are not affected)",
                            damage.what, damage.first, damage.last
                        ),
                    )
                })
                .collect()
        }
        Err(e) => vec![problem(
            commit_log_location(shared.directory()),
            None,
            e.to_string(),
        )],
    };

    let mut work = Vec::new();
    for stratum in &strata {
        report.strata_checked += 1;
        let location = stratum.path().display().to_string();
        let headers = stratum.read_copies();
        let [first, second] = match headers {
            Ok(pair) => pair,
            Err(e) => {
                report
                    .problems
                    .push(problem(location, None, format!("cannot read headers: {e}")));
                continue;
            }
        };
        let [first, second] = [first, second].map(|copy| match copy {
            Ok(state) => {
                key_ids.extend(state.key_ids.iter().copied());
                Ok(state)
            }
            Err(CopyError::Header(error)) => Err(error),
            // Open checked every key; a provider that changed since is
            // reported with the copy.
            Err(CopyError::Key(error)) => Err(HeaderError::Inconsistent(error.to_string())),
        });
        for (copy, decoded) in [(0, &first), (1, &second)] {
            if let Err(e) = decoded {
                // Never-written copies read as short or zeroed.
                if !matches!(e, HeaderError::BadMagic | HeaderError::Truncated) {
                    report.problems.push(problem(
                        format!("{location} (header copy {copy})"),
                        None,
                        format!("stratum header: {e}"),
                    ));
                }
            }
        }
        // The live bitmaps and the blobs still in the WAL are read together,
        // as a commit makes its blobs live and pending at once: a blob
        // committed while `verify` runs is then checked where its bytes
        // are (only in the WAL, at first).
        let snapshot = shared.reclamation().stratum_snapshot(stratum);
        // Grains freed (and maybe reused) after this are not damage.
        let epoch = snapshot.epoch;
        let bits = &snapshot.bits;
        match newest(first, second, |c| c.header.generation) {
            Ok((_, state)) => {
                let header = &state.header;
                if !stratum.is_dirty()
                    && (header.allocated != bits.durable_allocated
                        || header.starts != bits.durable_starts
                        || !stamps_agree(stratum, &state.stamps, bits))
                {
                    report.problems.push(problem(
                        location.clone(),
                        None,
                        "the newest header's bitmaps differ from the checkpointed state".into(),
                    ));
                }
            }
            // A stratum whose creation was cut short (a crash, or a full
            // disk under the write that made it) holds no grains: the next
            // open for writing finishes it. Nothing is lost there.
            Err(_) if stratum.is_unfinished() => {}
            Err((a, b)) => report.problems.push(problem(
                location.clone(),
                None,
                format!("no valid header copy ({a}; {b})"),
            )),
        }
        // Live blobs must read back. Grains only the checkpointed bitmaps
        // still list were freed since (or come from a checkpoint a crash
        // cut short): the WAL replay or the next checkpoint clears them,
        // and their bytes no longer matter; their structure is checked.
        let runs = blobs(&bits.live_allocated, &bits.live_starts, bits.capacity);
        for (start, count) in blobs(&bits.durable_allocated, &bits.durable_starts, bits.capacity) {
            if count == 0 || count > MAX_GRAINS_PER_BLOB {
                report.problems.push(problem(
                    format!("{location} offset {}", stratum.offset_of(start)),
                    None,
                    format!(
                        "checkpointed bitmap: grain {start} is allocated outside a blob of 1..=32 grains"
                    ),
                ));
            }
        }
        for (start, count) in runs {
            if count == 0 || count > MAX_GRAINS_PER_BLOB {
                report.problems.push(problem(
                    format!("{location} offset {}", stratum.offset_of(start)),
                    None,
                    format!(
                        "grain {start} is allocated but is not part of a blob of 1..=32 grains"
                    ),
                ));
                continue;
            }
            let Some(id) = GrainId::new(stratum.basin(), stratum.number(), start, count) else {
                report.problems.push(problem(
                    location.clone(),
                    None,
                    format!(
                        "stratum number {} cannot be named by a grain id",
                        stratum.number()
                    ),
                ));
                continue;
            };
            work.push((
                stratum.clone(),
                id,
                snapshot.in_wal.get(&id).copied(),
                epoch,
            ));
        }
    }

    let total = work.len() as u64;
    for (done, (stratum, id, in_wal, epoch)) in work.into_iter().enumerate() {
        progress(done as u64, total);
        report.grains_checked += 1;
        if let Some(p) = in_wal {
            let result = db.wal().read_at(p.position).and_then(|mut chunk| {
                let mut bytes = Vec::new();
                chunk.read_to_end(&mut bytes)?;
                if !chunk.crc_is_valid()? {
                    return Ok(false);
                }
                let Some(data) = data_of_chunk(&bytes) else {
                    return Ok(false);
                };
                let Some(sealer) = &sealer else {
                    return Ok(grain_crc(p.sequence, data) == p.crc);
                };
                // The chunk holds the blob's image.
                let what = format!("WAL {}", p.position);
                Ok(match sealer.open_image(id, data, &what) {
                    Ok((header, plain, ids)) => {
                        key_ids.extend(ids);
                        (header.sequence, header.length, header.crc)
                            == (p.sequence, p.length, p.crc)
                            && grain_crc(p.sequence, &plain) == p.crc
                    }
                    Err(Unsealed::Damaged) => false,
                    Err(Unsealed::Key(error)) => return Err(error),
                })
            });
            match result {
                // Damage is reported once: the record is compared with
                // blobs that pass their own checksum.
                Ok(true) => report.problems.extend(expected.mismatch(
                    &stratum,
                    id,
                    (p.sequence, p.length, p.crc),
                    format!("WAL {}", p.position),
                    "the WAL",
                )),
                Ok(false) => report.problems.push(problem(
                    format!("WAL {}", p.position),
                    Some(id),
                    "checksum mismatch in the WAL copy".into(),
                )),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => report.problems.push(problem(
                    format!("WAL {}", p.position),
                    Some(id),
                    format!("cannot read: {e}"),
                )),
            }
            continue;
        }
        let offset = stratum.offset_of(id.index());
        let location = format!("{} offset {offset}", stratum.path().display());
        let size = u64::from(id.count()) * stratum.grain_size();
        let mut bytes = vec![0; size as usize];
        let mut filled = 0;
        while filled < bytes.len() {
            match stratum.read_at(&mut bytes[filled..], offset + filled as u64) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) => {
                    report.problems.push(problem(
                        location.clone(),
                        Some(id),
                        format!("cannot read: {e}"),
                    ));
                    break;
                }
            }
        }
        let mut found = VerifyReport::default();
        let header = match &sealer {
            Some(sealer) => {
                let header = check_sealed_grain(
                    sealer,
                    &stratum,
                    &bytes[..filled],
                    id,
                    &location,
                    &mut found,
                );
                if let Some((_, ids)) = &header {
                    key_ids.extend(ids.iter().copied());
                }
                header.map(|(header, _)| header)
            }
            None => {
                check_grain(&bytes[..filled], id, &location, &mut found);
                GrainHeader::decode(&bytes[..filled])
            }
        };
        // A live blob's transaction committed: a header naming a later one
        // (or none) is from another moment of the store, such as a copy
        // of its files taken while it was written. (Read after the header:
        // a blob is live only once its transaction counts as committed.)
        if let (true, Some(header)) = (found.problems.is_empty(), header) {
            let last_committed = db.last_committed().0;
            if header.sequence == 0 || header.sequence > last_committed {
                found.problems.push(problem(
                    location.clone(),
                    Some(id),
                    format!(
                        "its grain header names transaction {}, but the last committed \
                         transaction is {last_committed}: the grain was written by a \
                         transaction this store never committed (its files are from \
                         different moments, as in a copy taken while it was written)",
                        header.sequence
                    ),
                ));
            }
        }
        if let (true, Some(header)) = (found.problems.is_empty(), header) {
            found.problems.extend(expected.mismatch(
                &stratum,
                id,
                (header.sequence, header.length, header.crc),
                location.clone(),
                "its grain header",
            ));
        }
        // A blob freed since its grains were listed may have had them
        // reused by a write in progress: only a blob still live counts.
        if stratum.reuse_epoch() == epoch {
            report.problems.extend(found.problems);
        }
    }
    progress(total, total);
    report.problems.extend(log_problems);
    if sealer.is_some() {
        key_ids.extend(wal_key_ids(db));
    }
    report.key_ids_in_use = key_ids.into_iter().collect();
    expected.check_allocated(db, &mut report);
    drop(store);
    if db.is_read_only() {
        check_wal(db, &mut report)?;
    }
    Ok(report)
}

/// Reads the WAL's segments as recovery would (okaywal's inspection) and
/// reports every problem recovery would report, and the blobs of each
/// committed transaction whose WAL entry is damaged: they are lost, and
/// the store does not know them otherwise. Only for a store open
/// read-only, whose WAL files no writer can change meanwhile.
fn check_wal(db: &Database, report: &mut VerifyReport) -> Result<()> {
    let shared = db.shared();
    let mut configuration = okaywal::Configuration::default_for(shared.directory())
        .shared_file_system(shared.fs().clone());
    if let Some(sealer) = shared.strata().sealer() {
        configuration =
            configuration.encryption(crate::sealing::SharedProvider(sealer.provider().clone()));
    }
    let inspection = configuration
        .inspect()
        .context(|| "inspecting the write-ahead log".to_string())?;
    let location = |path: &Path, offset: Option<u64>| match offset {
        Some(offset) => format!("{} offset {offset}", path.display()),
        None => path.display().to_string(),
    };
    for problem in &inspection.problems {
        report.problems.push(Problem {
            location: location(&problem.path, problem.offset),
            grain: None,
            description: format!("write-ahead log: {}", problem.description),
        });
    }
    let damaged: Vec<&Path> = inspection
        .problems
        .iter()
        .map(|problem| problem.path.as_path())
        .collect();
    let checkpointed = shared.reclamation().wal_checkpointed_entry();
    for segment in &inspection.segments {
        if !damaged.contains(&segment.path.as_path()) {
            // Nothing written later proves these entries were synced: a
            // power cut while they were written leaves them so, and then
            // they were never acknowledged. So can damage to transactions
            // that committed, and the log cannot tell which; an open for
            // writing drops them. Said, so that a store that lost
            // committed transactions never verifies clean.
            unproven_entries(segment, checkpointed, report);
            continue;
        }
        for entry in &segment.incomplete {
            let at = location(&segment.path, Some(entry.commit_offset));
            if entry.id.0 <= shared.reclamation().wal_checkpointed_entry() {
                // Already in the strata: nothing was lost with it.
                continue;
            }
            let (grains, named_by) = lost_grains(entry);
            if grains.is_empty() {
                report.problems.push(Problem {
                    location: at.clone(),
                    grain: None,
                    description: format!(
                        "transaction {} is committed but its WAL entry is damaged: the blobs \
                         it wrote are lost and cannot be named",
                        entry.id
                    ),
                });
            }
            let description = format!(
                "lost: written by transaction {}, whose WAL entry is damaged (named by \
                 {named_by})",
                entry.id
            );
            name_blobs(report, &at, grains, &description);
        }
    }
    Ok(())
}

/// One problem per blob in `grains`, at `at`, each described so.
fn name_blobs(report: &mut VerifyReport, at: &str, grains: Vec<GrainId>, description: &str) {
    for grain in grains {
        report.problems.push(Problem {
            location: at.to_string(),
            grain: Some(grain),
            description: description.to_string(),
        });
    }
}

/// Reports the transactions of `segment` (one no damage was proven in)
/// that recovery drops although their commit records verify: entries
/// whose chunks do not all verify, and entries whose commit record lies
/// past the torn tail where the walk stopped. Those at or below
/// `checkpointed` are in the strata already and lose nothing.
fn unproven_entries(
    segment: &okaywal::InspectedSegment,
    checkpointed: u64,
    report: &mut VerifyReport,
) {
    const EITHER: &str = "a power cut while it was being written leaves this (then it was \
                          never acknowledged), and so does damage after it committed, which \
                          nothing written later in the WAL can prove; opening the store for \
                          writing drops it";
    let path = segment.path.display();
    for entry in segment.incomplete.iter().filter(|e| e.id.0 > checkpointed) {
        let at = format!("{path} offset {}", entry.commit_offset);
        let (grains, named_by) = lost_grains(entry);
        report.problems.push(Problem {
            location: at.clone(),
            grain: None,
            description: format!(
                "transaction {} has a commit record in the write-ahead log, but its entry \
                 does not verify: {EITHER}, with every later transaction in this segment",
                entry.id
            ),
        });
        let description = format!(
            "dropped at the next open for writing: written by transaction {}, whose WAL entry \
             does not verify (named by {named_by})",
            entry.id
        );
        name_blobs(report, &at, grains, &description);
    }
    let end = segment.end;
    let why = match &segment.stopped {
        Some((at, why)) if *at == end => format!("a record there does not verify ({why})"),
        _ => "an earlier transaction there does not verify".to_string(),
    };
    for id in segment
        .committed_past_end
        .iter()
        .filter(|id| id.0 > checkpointed)
    {
        report.problems.push(Problem {
            location: format!("{path} offset {end}"),
            grain: None,
            description: format!(
                "transaction {id} has a commit record in the write-ahead log past offset \
                 {end}, where the log ends because {why}: {EITHER}"
            ),
        });
    }
}

/// The blobs a damaged WAL entry of a transaction wrote: those its commit
/// record lists if that chunk verifies, else those its data chunks name,
/// and what named them.
fn lost_grains(entry: &okaywal::IncompleteEntry) -> (Vec<GrainId>, &'static str) {
    for chunk in entry.chunks.iter().filter(|chunk| chunk.crc_ok) {
        if let Some(record) = record_of_chunk(&chunk.data) {
            let grains = record.new_grains.iter().map(|grain| grain.id).collect();
            return (grains, "its commit record");
        }
    }
    let grains = entry
        .chunks
        .iter()
        .filter_map(|chunk| grain_of_data_chunk(&chunk.data))
        .collect();
    (grains, "its data chunks, unverified")
}

/// What a blob's grain header must hold: (sequence, length, CRC).
type Written = (u64, u32, u32);

/// The blobs that readable commit records list as written, and that no
/// later record frees: each must be allocated and hold exactly what its
/// record says. (Every allocated blob's own checksum is checked anyway;
/// this ties the strata to the records replicas follow.)
#[derive(Debug, Default)]
struct Expected {
    blobs: HashMap<GrainId, Written>,
    /// Each stratum's `reuse_epoch` when the records were taken, by
    /// (basin, number): a blob freed since (and maybe reused) was not
    /// damaged, and a stratum whose epoch moved is not judged.
    epochs: HashMap<(u8, u32), u64>,
}

impl Expected {
    /// The blobs listed by `from_files` (the commit log files) and the
    /// records still only in memory, with a sequence above the last
    /// `checkpoint_to`. Records hidden by `damage` may have freed or
    /// written any blob of an earlier record, so only records after every
    /// damaged stretch are used.
    fn collect(
        db: &Database,
        strata: &[Arc<Stratum>],
        from_files: Vec<CommitRecord>,
        damage: &[CommitLogDamage],
    ) -> Self {
        let after = damage.iter().map(|d| d.last.0).max().unwrap_or(0);
        // Taken with the records at one moment: a free after it moves its
        // stratum's epoch.
        let (records, epochs) = db
            .shared()
            .reclamation()
            .applied_records(after, from_files, strata);
        let mut blobs = HashMap::new();
        for (sequence, record) in records {
            for id in &record.freed {
                blobs.remove(id);
            }
            for grain in &record.new_grains {
                blobs.insert(grain.id, (sequence, grain.length, grain.crc));
            }
        }
        Self { blobs, epochs }
    }

    /// True if no grain of `stratum` was freed since the records were taken.
    fn unchanged(&self, stratum: &Stratum) -> bool {
        self.epochs.get(&(stratum.basin(), stratum.number())) == Some(&stratum.reuse_epoch())
    }

    /// A problem if blob `id`, found holding `found` at `location`, is
    /// listed by a record with other values.
    fn mismatch(
        &self,
        stratum: &Stratum,
        id: GrainId,
        found: Written,
        location: String,
        source: &str,
    ) -> Option<Problem> {
        let &(sequence, length, crc) = self.blobs.get(&id)?;
        if found == (sequence, length, crc) || !self.unchanged(stratum) {
            return None;
        }
        Some(Problem {
            location,
            grain: Some(id),
            description: format!(
                "the commit record of sequence {sequence} lists this blob with length {length} \
                 and CRC {crc:#010x}, but {source} holds sequence {}, length {} and CRC {:#010x}",
                found.0, found.1, found.2
            ),
        })
    }

    /// A problem for each listed blob that is not allocated.
    fn check_allocated(&self, db: &Database, report: &mut VerifyReport) {
        let shared = db.shared();
        let mut missing: Vec<(GrainId, Problem)> = Vec::new();
        for (&id, &(sequence, length, _)) in &self.blobs {
            let listed = format!(
                "the commit record of sequence {sequence} lists this blob ({length} bytes) as \
                 written and no later record frees it"
            );
            let stratum = match shared.strata().stratum_of(id) {
                Ok(Some(stratum)) => stratum,
                Ok(None) => {
                    let path = shared
                        .directory()
                        .join(crate::stratum::file_name(id.basin(), id.stratum()));
                    missing.push((
                        id,
                        Problem {
                            location: path.display().to_string(),
                            grain: Some(id),
                            description: format!("{listed}, but its stratum file is missing"),
                        },
                    ));
                    continue;
                }
                Err(e) => {
                    missing.push((
                        id,
                        Problem {
                            location: commit_log_location(shared.directory()),
                            grain: Some(id),
                            description: format!("{listed}, but it cannot name a blob: {e}"),
                        },
                    ));
                    continue;
                }
            };
            // Liveness and epoch together, as a commit's free changes both.
            let epoch = self
                .epochs
                .get(&(stratum.basin(), stratum.number()))
                .copied();
            let Some(live) = shared.reclamation().live_at_epoch(&stratum, id, epoch) else {
                continue;
            };
            if !live {
                missing.push((
                    id,
                    Problem {
                        location: format!(
                            "{} offset {}",
                            stratum.path().display(),
                            stratum.offset_of(id.index())
                        ),
                        grain: Some(id),
                        description: format!("{listed}, but it is not allocated"),
                    },
                ));
            }
        }
        missing.sort_by_key(|(id, _)| *id);
        report
            .problems
            .extend(missing.into_iter().map(|(_, problem)| problem));
    }
}

fn commit_log_location(directory: &Path) -> String {
    format!("{} (commit log)", directory.display())
}

fn check_grain(bytes: &[u8], id: GrainId, location: &str, report: &mut VerifyReport) {
    let mut fail = |what: String| {
        report.problems.push(Problem {
            location: location.to_string(),
            grain: Some(id),
            description: what,
        });
    };
    let Some(header) = GrainHeader::decode(bytes) else {
        fail("grain header is missing (file too short)".into());
        return;
    };
    if placement(u64::from(header.length)) != Some((id.basin(), id.count())) {
        fail(format!(
            "stored length {} does not fit this {}-grain extent",
            header.length,
            id.count()
        ));
        return;
    }
    let end = GRAIN_HEADER_SIZE + header.length as usize;
    let Some(data) = bytes.get(GRAIN_HEADER_SIZE..end) else {
        fail("grain data is cut short by the end of the file".into());
        return;
    };
    if grain_crc(header.sequence, data) != header.crc {
        fail(format!(
            "checksum mismatch (sequence {}, length {})",
            header.sequence, header.length
        ));
    }
}

/// Opens a sealed index header copy: the key id of its body.
fn decode_sealed_index(
    sealer: &Sealer,
    bytes: &[u8],
    slot: u64,
    path: &Path,
) -> Result<(u64, Option<KeyId>), HeaderError> {
    if version_of(bytes, INDEX_MAGIC_BYTES) != Some(SEALED_FORMAT_VERSION) {
        // Zeros, or not a sealed copy at all.
        return IndexHeader::decode(bytes).and(Err(HeaderError::UnknownVersion(1)));
    }
    let envelope = open_envelope(bytes, INDEX_MAGIC_BYTES, SEALED_INDEX_BODY)?;
    match Sealer::open_index(sealer.provider(), &envelope, slot, &path.display()) {
        Ok((body, key_id)) => {
            let index = crate::format::SealedIndex::decode_body(&body)?;
            Ok((index.header.generation, Some(key_id)))
        }
        Err(Unsealed::Damaged) => Err(HeaderError::NotAuthentic),
        Err(Unsealed::Key(error)) => Err(HeaderError::Inconsistent(error.to_string())),
    }
}

/// Whether a header copy's stamps agree with the checkpointed ones at the
/// start of every checkpointed blob.
fn stamps_agree(stratum: &Stratum, stamps: &[u32], bits: &crate::allocator::StratumBits) -> bool {
    if stratum.sealer().is_none() {
        return true;
    }
    let starts: HashSet<u32> = blobs(&bits.durable_allocated, &bits.durable_starts, bits.capacity)
        .into_iter()
        .map(|(start, _)| start)
        .collect();
    stratum
        .durable_stamps(&starts)
        .into_iter()
        .all(|(index, stamp)| stamps.get(index as usize) == Some(&stamp))
}

/// Checks a sealed blob's bytes (its image and whatever follows in its
/// grains): every piece opens at this grain, the length fits the extent,
/// the sequence is the stratum's stamp and the CRC matches. Returns its
/// header and key ids if it opened.
fn check_sealed_grain(
    sealer: &Sealer,
    stratum: &Stratum,
    bytes: &[u8],
    id: GrainId,
    location: &str,
    report: &mut VerifyReport,
) -> Option<(GrainHeader, BTreeSet<KeyId>)> {
    let mut fail = |what: String| {
        report.problems.push(Problem {
            location: location.to_string(),
            grain: Some(id),
            description: what,
        });
    };
    match sealer.open_image(id, bytes, &location) {
        Ok((header, data, key_ids)) => {
            let extent = sealed_image_len(u64::from(header.length)).and_then(fit);
            if extent != Some((id.basin(), id.count())) {
                fail(format!(
                    "stored length {} does not fit this {}-grain extent",
                    header.length,
                    id.count()
                ));
            } else if stratum.stamp(id.index()) != Some(stamp_of(header.sequence)) {
                fail(format!(
                    "holds the blob of sequence {}, not the one the stratum's stamps record: \
                     an old copy",
                    header.sequence
                ));
            } else if grain_crc(header.sequence, &data) != header.crc {
                fail(format!(
                    "checksum mismatch (sequence {}, length {})",
                    header.sequence, header.length
                ));
            } else {
                return Some((header, key_ids));
            }
            None
        }
        Err(Unsealed::Damaged) => {
            fail("failed authentication (damaged, or not from this place)".into());
            None
        }
        Err(Unsealed::Key(error)) => {
            fail(format!("cannot be opened: {error}"));
            None
        }
    }
}

/// The key ids of the WAL's live segments (`wal-{id}`), from the key
/// check in each one's header (`okaywal/FORMAT.md`, "Segment header" of an
/// encrypted log: the key id at offset 16, the CRC of bytes 0..508 at 508).
/// A segment renamed or recycled meanwhile, or whose header does not
/// verify, is skipped: okaywal's open judges those.
fn wal_key_ids(db: &Database) -> BTreeSet<KeyId> {
    let shared = db.shared();
    let mut ids = BTreeSet::new();
    let Ok(names) = shared.fs().list_files(shared.directory()) else {
        return ids;
    };
    for name in names {
        let live = name
            .strip_prefix("wal-")
            .is_some_and(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()));
        if !live {
            continue;
        }
        let path = shared.directory().join(&name);
        let mut header = [0_u8; 512];
        let read = shared
            .fs()
            .open(&path, okaywal::fs::OpenMode::Read)
            .and_then(|file| file.read_exact_at(&mut header, 0));
        if read.is_err() || &header[..7] != b"OKAYWAL" || header[7] != 2 {
            continue;
        }
        let crc = u32::from_le_bytes(header[508..].try_into().expect("4 bytes"));
        if crc32fast::hash(&header[..508]) == crc {
            let id = u32::from_le_bytes(header[16..20].try_into().expect("4 bytes"));
            ids.insert(KeyId::new(id));
        }
    }
    ids
}
