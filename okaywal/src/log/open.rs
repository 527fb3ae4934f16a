//! Opening a log: listing the directory, replaying the segments recovery
//! keeps through the manager, and starting the first active segment.

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::sync::ledger::SyncLedger;
use super::{Inner, Owner, State};
use crate::checkpoint::{self, CheckpointStatus};
use crate::config::Configuration;
use crate::failure::Failure;
use crate::format::{AnyHeader, SegmentHeader, HEADER_SIZE};
use crate::fs::{FileSystem, OpenLock, OpenMode};
use crate::group_commit::GroupCommit;
use crate::manager::{LogManager, RecoveredSegment, Recovery};
use crate::recovery::{find_segments, FoundSegment, Look, SegmentReader};
use crate::segment::{FileName, Segment, SyncHandles, LOCK_FILE};
use crate::segments::{SegmentSettings, SegmentState, Segments, Spare};
use crate::stats::Counters;
use crate::tuning::MAX_SPARES;
use crate::WriteAheadLog;

impl WriteAheadLog {
    pub(crate) fn open(
        config: Configuration,
        mut manager: Box<dyn LogManager>,
    ) -> io::Result<Self> {
        crate::trace::span!(INFO, "open", directory = %config.directory.display());
        let fs = config.file_system.clone();
        let directory = config.directory.clone();
        let minimum_next_entry_id = config.minimum_next_entry_id;
        crate::fs::create_dir_durably(&*fs, &directory).map_err(|err| {
            io::Error::new(
                err.kind(),
                format!("creating the log directory {}: {err}", directory.display()),
            )
        })?;
        // Until the open succeeds, a lock file this open created goes again
        // if it fails.
        let lock = OpenLock::take(fs.clone(), &directory.join(LOCK_FILE))?;
        let mut segments = Vec::new();
        let mut reusable = Vec::new();
        let mut max_id = 0_u64;
        let mut next_spare_number = 0;
        let mut legacy_checkpointed = Vec::new();
        for name in fs.list_files(&directory)? {
            match FileName::parse(&name) {
                Some(FileName::Segment(id)) => {
                    // A segment may hold ids from `id` on; whether `id`
                    // itself was used, its records tell.
                    max_id = max_id.max(id.saturating_sub(1));
                    segments.push(id);
                }
                Some(file @ FileName::Recycled(id)) => {
                    max_id = max_id.max(id);
                    reusable.push(file.path_in(&directory));
                }
                Some(file @ FileName::Spare(n)) => {
                    next_spare_number = next_spare_number.max(n.saturating_add(1));
                    reusable.push(file.path_in(&directory));
                }
                // A segment okaywal 0.2/0.3 had checkpointed.
                None => legacy_checkpointed.extend(
                    crate::legacy::checkpointed_name(&name).map(|id| (id, directory.join(&name))),
                ),
            }
        }
        segments.sort_unstable();
        let cipher = config.encryption.as_ref();
        if let (Some(_), Some((_, path))) = (cipher, legacy_checkpointed.first()) {
            // An okaywal 0.2/0.3 log is never encrypted.
            return Err(crate::recovery::plain_with_key_error(path));
        }
        for path in &reusable {
            // A spare or recycled file that a crash caught after it became
            // a segment but before its rename holds records salted with that
            // segment's id, which no segment name records. Reused under the
            // same id, those records would verify again past the new ones,
            // and a later crash would bring back entries never acknowledged.
            // Ids past it make every new salt differ. (Read before anything
            // is changed: a file of the other kind of log, encrypted or
            // not, fails the open.)
            if let Some(id) = stale_segment_id(&*fs, path, cipher.is_some())? {
                max_id = max_id.max(id);
            }
        }

        let mut found = find_segments(
            &*fs,
            &directory,
            &segments,
            config.buffer_bytes,
            cipher,
            Look::Recover(config.recovery_mode),
        )?;
        max_id = max_id.max(found.max_id);
        legacy_checkpointed.sort_unstable();
        let mut legacy = crate::legacy::LegacyLog::read(
            &*fs,
            std::mem::take(&mut found.legacy),
            legacy_checkpointed,
            config.buffer_bytes,
            config.recovery_mode,
        )?;
        max_id = max_id.max(legacy.max_id());
        reusable.extend(found.reusable);
        if !found.dropped.is_empty() {
            for (path, highest) in found.dropped {
                // Its records are salted with its id: reused under that id
                // (the next one, if nothing of it was read), they would
                // verify again. Ids past it make every new salt differ.
                max_id = max_id.max(highest);
                let recycled = FileName::Recycled(highest).path_in(&directory);
                fs.rename(&path, &recycled)?;
                reusable.push(recycled);
            }
            fs.sync_dir(&directory)?;
        }
        // Entries of okaywal 0.2/0.3 segments come first: their ids are
        // below every id of this format's segments.
        legacy.recover(&mut *manager)?;
        let mut live = BTreeMap::new();
        let mut abandoned = false;
        for found in found.segments {
            let FoundSegment {
                id,
                path,
                file,
                header,
                layout,
                scan,
            } = found;
            let info = RecoveredSegment {
                id,
                version_info: header.version_info,
            };
            let decision = manager.should_recover_segment(&info)?;
            if decision == Recovery::Abandon {
                // Discarded for good at once, as a checkpoint would: left
                // live until the background thread got to it, a shutdown
                // right after open kept it, and the next open replayed it.
                let highest = scan.max_entry_id.unwrap_or(id).max(id);
                // As for dropped segments: no new segment may take its id.
                max_id = max_id.max(highest);
                let recycled = FileName::Recycled(highest).path_in(&directory);
                drop(file);
                fs.rename(&path, &recycled)?;
                reusable.push(recycled);
                abandoned = true;
                continue;
            }
            // After a crash of the process alone, what the walk read may be
            // in the page cache only. It counts as synced from here on (and
            // the next segment's header vouches for its end), so it must be
            // on the disk before the log goes on.
            file.sync_data()?;
            let segment = Arc::new(Segment::new(
                id,
                file.clone(),
                SyncHandles::open(&*file),
                path,
                None,
                scan.end,
                Arc::new(info.version_info.clone()),
                layout.clone(),
            ));
            let state = SegmentState::recovered(
                segment,
                scan.end,
                scan.max_entry_id,
                scan.committed.keys().next_back().copied(),
            );
            let mut reader = SegmentReader::new(
                id,
                &info.version_info,
                file.clone(),
                layout,
                scan.committed,
                None,
            );
            while let Some(mut entry) = reader.read_entry()? {
                manager.recover(&mut entry)?;
            }
            live.insert(id, state);
        }
        // The names of the segments kept, too: a crash of the process may
        // have left a rename that no directory sync followed.
        if abandoned || !live.is_empty() {
            fs.sync_dir(&directory)?;
        }

        let mut spares = Vec::new();
        for path in reusable {
            if spares.len() < MAX_SPARES + live.len() + 1 {
                let file = fs.open(&path, OpenMode::ReadWrite)?;
                // A file that an earlier run sized up (or that a segment
                // grew) goes back to the configured size once this log is
                // idle, like one recycled now.
                let preallocated = config.preallocate_bytes.max(HEADER_SIZE);
                let grown = file.len()? > preallocated;
                spares.push(Spare {
                    sync_handles: SyncHandles::open(&*file),
                    file,
                    path,
                    grown,
                });
            } else {
                fs.remove_file(&path)?;
            }
        }

        let next_entry_id = max_id
            .checked_add(1)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{}: a file name or record there claims entry id {max_id}, which \
                         leaves no id for new entries",
                        directory.display()
                    ),
                )
            })?
            .max(minimum_next_entry_id);
        // Every entry below the first live segment was in a segment that
        // an earlier run checkpointed and recycled.
        let recycled_through = live
            .keys()
            .next()
            .map_or(next_entry_id, |first| *first)
            .saturating_sub(1);
        // What `sync` reports before the first new commit: the entries
        // recovered were committed (and are durable) before any call, and
        // with none live, every entry an earlier run checkpointed is.
        let last_committed_id = live
            .values()
            .filter_map(SegmentState::highest_committed_id)
            .max()
            .unwrap_or(recycled_through);
        // An empty last segment (a header and no record: a switch made just
        // before the process ended) already has the name the first active
        // segment takes, and its preallocated blocks: with no reusable file,
        // it becomes that segment, where otherwise a new file would be made
        // and renamed over it. On a disk too full for a new file, the log
        // then still opens, and the writes that free space can be made.
        if spares.is_empty() {
            let empty_last = live.iter().next_back().and_then(|(&last, state)| {
                (last == next_entry_id && state.reserved_end() <= HEADER_SIZE)
                    .then(|| (last, state.segment().path().to_path_buf()))
            });
            if let Some((last, path)) = empty_last {
                live.remove(&last);
                let file = fs.open(&path, OpenMode::ReadWrite)?;
                let grown = file.len()? > config.preallocate_bytes.max(HEADER_SIZE);
                spares.push(Spare {
                    sync_handles: SyncHandles::open(&*file),
                    file,
                    path,
                    grown,
                });
            }
        }
        let failure = Arc::new(Failure::default());
        let segments = Segments::new(
            SegmentSettings {
                directory: directory.clone(),
                version_info: config.version_info.clone(),
                checkpoint_after_bytes: config.checkpoint_after_bytes,
                buffer_bytes: config.buffer_bytes,
                cipher: config.encryption.clone(),
            },
            live,
            spares,
            next_spare_number,
        );
        let inner = Arc::new(Inner {
            config,
            fs,
            state: Mutex::new(State {
                segments,
                next_entry_id,
                progress_waiters: 0,
                hole_waiters: Default::default(),
                shutting_down: false,
                shutdown_marked: false,
                checkpoints: CheckpointStatus::default(),
                open_ids: BTreeMap::new(),
                pending_commits: BTreeMap::new(),
                recycled_through,
            }),
            progress: Condvar::new(),
            signal: Arc::default(),
            checkpointed: Condvar::new(),
            drained: Condvar::new(),
            group: GroupCommit::with_failure(failure.clone()),
            ledger: SyncLedger::with_failure(failure.clone()),
            failure,
            maintenance: Mutex::new(None),
            maintenance_thread: Mutex::new(None),
            counters: Counters::default(),
            last_committed_id: AtomicU64::new(last_committed_id),
            synced: Condvar::new(),
            buffered_followers: 0.into(),
            unblocking_rollbacks: AtomicU64::new(0),
            naming: Mutex::new(()),
            legacy_files: Mutex::new(BTreeMap::new()),
            _lock: lock.opened(),
        });
        // The first active segment: a reused file if any, else a new one;
        // on a disk with no room for a new one, the last segment goes on.
        let mut resumed = false;
        if !inner.state.lock().segments.has_spare() {
            match inner.create_spare() {
                Ok(spare) => inner.state.lock().segments.add_spare(spare),
                Err(err) if err.kind() == io::ErrorKind::StorageFull => {
                    let resumable = inner.state.lock().segments.resumable_last(next_entry_id);
                    let Some((segment, end)) = resumable else {
                        return Err(err);
                    };
                    let len = segment.file().len()?;
                    crate::fs::zero_fill(&**segment.file(), end, len.saturating_sub(end))
                        .and_then(|()| segment.file().sync_data())
                        .map_err(|e| {
                            io::Error::new(
                                e.kind(),
                                format!(
                                    "{err}; and going on in {} instead: {e}",
                                    segment.path().display()
                                ),
                            )
                        })?;
                    inner.state.lock().segments.resume_last()?;
                    resumed = true;
                }
                Err(err) => return Err(err),
            }
        }
        if !resumed {
            let mut state = inner.state.lock();
            let next_entry_id = state.next_entry_id;
            if state.segments.start(next_entry_id)? {
                inner.signal.wake();
            }
        }
        let log = WriteAheadLog {
            _owner: Some(Arc::new(Owner {
                inner: inner.clone(),
            })),
            inner,
        };
        // Segments in the okaywal 0.2/0.3 format are checkpointed (and
        // recycled) now: the log writes only this crate's format.
        legacy.checkpoint_and_recycle(&log, &mut *manager)?;
        checkpoint::start(&log, manager)?;
        Ok(log)
    }
}

/// The segment id in the header of a spare or recycled file, if it has a
/// valid one (a file zero-filled as a spare has none). A header of the
/// other kind of log than `encrypted` says is a key error: its stale
/// bytes were written by a log opened the other way.
fn stale_segment_id(
    fs: &dyn FileSystem,
    path: &std::path::Path,
    encrypted: bool,
) -> io::Result<Option<u64>> {
    let file = fs.open(path, OpenMode::Read)?;
    let len = file.len()?;
    if len < HEADER_SIZE {
        // Shorter than a header: a spare whose zero-fill a crash cut
        // short is reused; a short file of anything but zeros (or the
        // start of this format's header) is not the log's, and is refused
        // like a long one.
        let mut bytes = vec![0; len as usize];
        file.read_exact_at(&mut bytes, 0)?;
        crate::legacy::refuse_foreign(path, &bytes)?;
        return Ok(None);
    }
    let mut bytes = vec![0; HEADER_SIZE as usize];
    file.read_exact_at(&mut bytes, 0)?;
    // Reused only if it is ours: a file of another format version, or of
    // another program, is refused and left as it is.
    if let Some(version) = SegmentHeader::other_version(&bytes) {
        return Err(crate::recovery::other_version_error(path, version));
    }
    crate::legacy::refuse_foreign(path, &bytes)?;
    match AnyHeader::decode(&bytes) {
        Ok(AnyHeader::Plain(_)) if encrypted => Err(crate::recovery::plain_with_key_error(path)),
        Ok(AnyHeader::Sealed(raw)) if !encrypted => {
            Err(crate::recovery::sealed_without_key_error(path, &raw))
        }
        Ok(header) => Ok(Some(header.first_entry_id())),
        Err(_) => Ok(None),
    }
}
