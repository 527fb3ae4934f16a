//! A write-ahead log for Rust: many threads append atomic, checksummed
//! entries; each commit returns once its entry is durable, and concurrent
//! commits share one `fdatasync` (group commit). Old segments are handed to
//! your store through [`LogManager::checkpoint_to`] on a background thread
//! and then recycled.
//!
//! ```rust
//! use okaywal::{LogManager, WriteAheadLog, Entry, EntryId, SegmentReader};
//! use std::io;
//!
//! /// Collects recovered entries.
//! #[derive(Debug, Default)]
//! struct Collect(Vec<Vec<u8>>);
//!
//! impl LogManager for Collect {
//!     fn recover(&mut self, entry: &mut Entry<'_>) -> io::Result<()> {
//!         if let Some(chunks) = entry.read_all_chunks()? {
//!             self.0.extend(chunks);
//!         }
//!         Ok(())
//!     }
//!     fn checkpoint_to(
//!         &mut self,
//!         _last_checkpointed_id: EntryId,
//!         _entries: &mut SegmentReader,
//!         _wal: &WriteAheadLog,
//!     ) -> io::Result<()> {
//!         Ok(()) // a real store would make the entries durable here
//!     }
//! }
//!
//! # fn main() -> io::Result<()> {
//! let dir = tempfile::tempdir()?;
//! let log = WriteAheadLog::recover(dir.path(), Collect::default())?;
//! let mut entry = log.begin_entry()?;
//! let record = entry.write_chunk(b"hello, world")?;
//! let id = entry.commit()?; // durable once this returns Ok
//! let mut reader = log.read_at(record.position)?;
//! let mut bytes = Vec::new();
//! io::Read::read_to_end(&mut reader, &mut bytes)?;
//! assert_eq!(bytes, b"hello, world");
//! assert!(reader.crc_is_valid()?);
//! log.shutdown()?;
//! drop(log);
//!
//! // Reopening replays the committed entry through the manager.
//! let log = WriteAheadLog::recover(dir.path(), Collect::default())?;
//! # let _ = id;
//! # log.shutdown()?;
//! # Ok(())
//! # }
//! ```
//!
//! # The durability contract
//!
//! - [`EntryWriter::commit`] returns `Ok` only after the entry's bytes (and
//!   the directory entry of a new segment file) have been synced.
//! - A commit that did not return `Ok` is either wholly present after
//!   recovery or wholly absent. Rolled-back entries are never recovered.
//! - If a write or sync fails, that commit and every commit waiting on the
//!   same sync fail, and the log refuses further commits until reopened: a
//!   failed `fdatasync` is never retried as if nothing had happened. Every
//!   later error has the first failure's [`std::io::ErrorKind`] (a full
//!   disk stays `StorageFull`) and includes its message.
//! - Torn, truncated or damaged bytes end the valid log (every record is
//!   checksummed); they never cause a panic or wrong data.
//!
//! # Choosing durability per commit
//!
//! | call | returns when | process crash | power loss |
//! | --- | --- | --- | --- |
//! | [`EntryWriter::commit`] | the entry is synced | survives | survives |
//! | [`EntryWriter::commit_buffered`] | the entry is handed to the OS, in log order | survives | may be lost, only as a suffix of the log |
//! | [`WriteAheadLog::sync`] | everything committed before it is synced | survives | survives |
//!
//! [`Configuration::max_unsynced`] bounds how long buffered entries wait
//! for a sync. [`Configuration::recovery_mode`] chooses what recovery does
//! with damage in the middle of the log ([`RecoveryMode`]);
//! [`WriteAheadLog::entries_from`] tails the live log (durable entries, or
//! with [`LogEntries::include_buffered`] buffered ones too) and
//! [`WriteAheadLog::stats`] returns counters.
//!
//! # Encryption at rest
//!
//! [`Configuration::encryption`] seals everything the log writes (chunk
//! data, entry ids, commit records, `version_info`) with AES-256-GCM
//! under keys from an [`encryption::KeyProvider`], each record bound to
//! its segment, its segment's generation and its offset: damage,
//! tampering and bytes from another place or an earlier use of a file
//! are detected and handled like any damage, never returned. A wrong or
//! missing key makes opening fail with a `PermissionDenied` error carrying
//! an [`encryption::KeyError`], and changes nothing. Every reader
//! (recovery, checkpoints, [`WriteAheadLog::read_at`],
//! [`WriteAheadLog::entries_from`], [`Configuration::open_read_only`],
//! [`Configuration::inspect`]) reads an encrypted log given its key.
//! `FORMAT.md` ("Encrypted logs") has the layout.
//!
//! # Tracing
//!
//! With the cargo feature `tracing`, the log enters spans a `tracing`
//! subscriber can time: `open` (recovery; `directory`), `commit` (`entry`,
//! `bytes`, `durability`), `sync` (a sync pass over the segments that may
//! hold unsynced records, each synced only if it needs it: `segments`
//! looked at, `commits` covered; group commits, checkpoints and shutdown
//! run them), `switch_segment` (`segment`, the new one's id)
//! and `checkpoint` (`segment`, `last_entry_id`). Spans on the commit path
//! are at `DEBUG` level, the others at `INFO`. Without the feature the
//! crate does not depend on `tracing`.
//!
//! # Switching from okaywal 0.2 or 0.3
//!
//! The API has the shape okaywal 0.3 users know, and a directory holding a
//! live 0.2/0.3 log opens as it is: [`WriteAheadLog::recover`] reads the
//! segments that version had not checkpointed yet, hands their committed
//! entries to [`LogManager::recover`] (in id order, before any entry of
//! this format), checkpoints them through [`LogManager::checkpoint_to`]
//! before it returns, and then recycles their files; new entry ids are
//! above every id the old log used. From then on the directory holds this
//! crate's format, which okaywal 0.3 cannot read. A file named like a
//! segment (`wal-{id}`, `wal-{id}-cp`) whose header belongs to neither
//! format makes the open fail with an `InvalidData` error naming it; it
//! is never reused or overwritten. `FORMAT.md` ("Logs written by okaywal
//! 0.2 and 0.3") has the details.
//!
//! # Layout
//!
//! Segment files `wal-{first entry id}` are preallocated, written with
//! positioned writes by many threads at once, and recycled after their
//! checkpoint. `FORMAT.md` in the crate describes every byte. All file
//! access goes through the [`fs`] module's [`fs::FileSystem`] trait, which
//! has a real, an in-memory and a crash-simulating backend. The group
//! commit's protocol, one sync at a time shared by every thread waiting
//! for it, is public as [`GroupCommit`], for stores that sync files of
//! their own.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod checkpoint;
mod config;
pub mod encryption;
mod failure;
#[cfg(feature = "internals")]
pub mod format;
#[cfg(not(feature = "internals"))]
#[allow(dead_code, unreachable_pub)]
mod format;
pub mod fs;
mod group_commit;
mod inspect;
mod legacy;
mod log;
mod manager;
mod position;
mod reader;
mod recovery;
mod sealed;
mod segment;
mod segments;
mod stats;
mod tail;
mod trace;
mod tuning;
mod writer;

pub use config::{
    Configuration, IntoVersionInfo, RecoveryMode, DEFAULT_BUFFER_BYTES,
    DEFAULT_CHECKPOINT_AFTER_BYTES, DEFAULT_PREALLOCATE_BYTES,
};
pub use group_commit::GroupCommit;
pub use inspect::{
    HeaderStatus, IncompleteEntry, InspectedChunk, InspectedRecord, InspectedSegment, LogFileName,
    LogInspection, LogProblem, ReadOnlyLog, RecordType, RecordsEnd, SegmentRecords, TornRecord,
};
pub use log::WriteAheadLog;
pub use manager::{LogManager, LogVoid, RecoveredSegment, Recovery};
pub use position::{EntryId, LogPosition};
pub use reader::ChunkReader;
pub use recovery::{Entry, EntryChunk, ReadChunkResult, SegmentReader};
pub use stats::LogStats;
pub use tail::{LiveEntry, LogEntries};
pub use writer::{ChunkRecord, ChunkWriter, Durability, EntryWriter};

// The example in README.md runs as a doctest, so it stays in step with the
// API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
