//! A crash-safe blob store built on [`okaywal`].
//!
//! Blobs ("grains") are written in transactions, get a [`GrainId`], can be
//! read back with [`Database::get`] and are [`archive`](Transaction::archive)d
//! when no longer needed. Archived grains stay readable until a transaction
//! calls [`checkpoint_to`](Transaction::checkpoint_to) with a sequence at
//! or after the archiving one; then their space is reused.
//!
//! ```rust
//! use sediment::Database;
//!
//! # fn main() -> sediment::Result<()> {
//! let dir = tempfile::tempdir()?;
//! let db = Database::recover(dir.path())?;
//!
//! let mut tx = db.begin_transaction()?;
//! let grain = tx.write(b"hello, world")?;
//! tx.set_embedded_header(Some(grain))?;
//! let written_at = tx.commit()?; // durable once this returns Ok
//! assert_eq!(db.get(grain)?.as_deref(), Some(&b"hello, world"[..]));
//!
//! // Archive it, then free it with a checkpoint.
//! let mut tx = db.begin_transaction()?;
//! tx.archive(grain)?;
//! tx.set_embedded_header(None)?;
//! let archived_at = tx.commit()?;
//! assert!(db.get(grain)?.is_some()); // archived grains stay readable
//!
//! let mut tx = db.begin_transaction()?;
//! tx.checkpoint_to(archived_at)?;
//! tx.commit()?;
//! assert_eq!(db.get(grain)?, None); // freed: its space will be reused
//!
//! // Every committed transaction after the checkpoint is in the commit log.
//! for record in db.commit_log(written_at)? {
//!     assert!(record.sequence > archived_at);
//! }
//! db.shutdown()?;
//! # Ok(())
//! # }
//! ```
//!
//! # The durability contract
//!
//! [`Transaction::commit`] returns `Ok` only after everything the
//! transaction did is durable, and only then is it visible to other
//! readers. A transaction that did not commit is never visible, after a
//! crash or otherwise. Many threads may commit at once; their WAL entries
//! share `fdatasync` calls. A failed sync stops the database from
//! acknowledging anything more until it is reopened; every later error
//! has that failure's I/O error kind and includes its message. Every stored grain and
//! header is checksummed: damaged bytes give an error, never wrong data.
//!
//! Where a transaction may be lost to a power cut in exchange for not
//! waiting for a sync, choose per commit:
//!
//! | call | returns when | process crash | power loss |
//! | --- | --- | --- | --- |
//! | [`Transaction::commit`] | the transaction is durable | survives | survives |
//! | [`Transaction::commit_buffered`] | its WAL entry is handed to the OS, in commit order | survives | may be lost, only as a suffix of the commits |
//! | [`Database::sync`] | every commit returned before it is durable | survives | survives |
//!
//! A buffered transaction is visible (to `get`, [`Database::last_committed`],
//! [`Database::commit_log`] and `checkpoint_to`) as soon as it returns. It
//! is never lost while a transaction whose commit began after it returned
//! survives, so a durable commit or a sync makes every earlier buffered
//! one durable. [`Config::max_unsynced`] and [`Config::max_unsynced_bytes`]
//! bound how long or how many bytes buffered commits stay unsynced. Blobs
//! that bypass the WAL are synced into their grains before any commit
//! returns, and grains a buffered transaction frees are reused only once
//! it is durable.
//!
//! # Layout
//!
//! A database directory holds the WAL's segment files, an `index` file,
//! `stratum-{basin}-{n}` files (arrays of fixed-size grains after a header
//! stored twice) and `commits-{sequence}` files (the commit log). `FORMAT.md`
//! in the crate describes every byte.
//!
//! # Encryption at rest
//!
//! [`Config::encryption`] seals everything the store writes (blobs, stratum
//! headers, the index, the commit log and the WAL) with keys from an
//! [`okaywal::encryption::KeyProvider`]; damage and tampering read as
//! damage, a missing or wrong key fails the open with [`Error::Key`], and
//! [`Database::rekey`] moves everything to the current key after a
//! rotation. `FORMAT.md` describes the encrypted layout (format version 2).
//!
//! # Space and memory
//!
//! Grains freed by a committed `checkpoint_to` are handed to the next
//! transactions at once (freed by a buffered commit: once it is durable):
//! a store that deletes as much as it writes stays the same size, with no
//! compaction. Memory is bounded by configuration:
//! the WAL's write buffer and a cache of recently read small blobs
//! ([`Config::cache_bytes`], [`DEFAULT_CACHE_BYTES`]), plus the in-memory
//! allocation bitmaps (five bits per grain of every stratum; an encrypted
//! store adds two 32-bit stamps per grain).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod allocator;
mod cache;
mod checkpoint;
mod commit_log;
mod commit_record;
mod config;
mod db;
mod error;
mod files;
#[cfg(feature = "internals")]
pub mod format;
#[cfg(not(feature = "internals"))]
#[allow(dead_code, unreachable_pub)]
mod format;
mod grain_id;
mod grains;
mod manager;
mod open;
mod orphans;
mod read;
mod reclamation;
mod rekey;
mod sealing;
mod stats;
mod strata;
mod stratum;
mod transaction;
mod verify;
mod verify_report;
mod wal_entry;

pub use commit_record::{CommitLogDamage, CommitRecord, NewGrain, SequenceId};
pub use config::{
    Config, DEFAULT_CACHE_BYTES, DEFAULT_DIRECT_WRITE_BYTES, DEFAULT_MAX_BLOB_BYTES,
    DEFAULT_WAL_SEGMENT_BYTES,
};
pub use db::{CommitLog, Database};
pub use error::{Error, Result};
pub use format::{MAX_FORMAT_BLOB_BYTES, MAX_SEALED_BLOB_BYTES};
pub use grain_id::{GrainId, InvalidGrainId, MAX_STRATA};
pub use grains::{GrainInfo, Grains};
pub use read::GrainReader;
pub use rekey::RekeyReport;
pub use stats::{BasinStats, Stats};
pub use transaction::Transaction;
pub use verify_report::{Problem, VerifyReport};

// The example in README.md runs as a doctest, so it stays in step with the
// API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
