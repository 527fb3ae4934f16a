//! The one error type of the crate.

use std::io;
use std::path::PathBuf;

use okaywal::encryption::KeyError;

use crate::commit_record::CommitLogDamage;
use crate::grain_id::GrainId;
use crate::verify_report::VerifyReport;

/// Everything that can go wrong in sediment.
///
/// New variants may be added: a `match` needs a wildcard arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The value is not a well-formed grain id (reserved bits set, or a
    /// part out of range).
    #[error("invalid grain id: {0}")]
    InvalidGrainId(String),
    /// The grain is not an allocated, committed blob (never written,
    /// freed, or not the first grain of a blob).
    #[error("grain {0} is not allocated")]
    NotAllocated(GrainId),
    /// The grain was already archived (by a committed transaction or one
    /// in progress).
    #[error("grain {0} was already archived")]
    AlreadyArchived(GrainId),
    /// Stored bytes do not match their checksum.
    #[error("checksum mismatch in grain {grain} ({}, offset {offset})", path.display())]
    ChecksumMismatch {
        /// The grain whose bytes are damaged.
        grain: GrainId,
        /// The file holding it.
        path: PathBuf,
        /// Byte offset of the grain in that file.
        offset: u64,
    },
    /// A blob is larger than the configured maximum.
    #[error("a blob of {length} bytes is larger than the maximum of {maximum} bytes")]
    TooLarge {
        /// The blob's length.
        length: u64,
        /// The configured maximum.
        maximum: u64,
    },
    /// The sequence given to `checkpoint_to` is not committed yet: it is
    /// above every sequence a commit has returned
    /// ([`Database::last_committed`](crate::Database::last_committed)).
    #[error(
        "sequence {requested} is not committed yet (the last committed sequence is {committed})"
    )]
    FutureSequence {
        /// What was asked for.
        requested: u64,
        /// The highest committed sequence
        /// ([`Database::last_committed`](crate::Database::last_committed)).
        committed: u64,
    },
    /// A commit with `checkpoint_to(requested)` would have to wait for
    /// transaction `open`, which the calling thread holds (it used it last:
    /// began it, or wrote, archived or set the header in it after it was
    /// moved here) and has neither committed nor rolled back: it would
    /// wait forever. The checkpointing transaction is rolled back; finish
    /// `open` first.
    #[error(
        "checkpoint_to({requested}) must wait for transaction {open}, which the calling thread \
         holds open: commit or roll it back first"
    )]
    CheckpointBlockedByOwnTransaction {
        /// The sequence the transaction checkpoints to.
        requested: u64,
        /// The sequence of the calling thread's open transaction.
        open: u64,
    },
    /// A setting of [`Config`](crate::Config) cannot be honoured (the
    /// message names it); [`Config::open`](crate::Config::open) refuses it
    /// rather than replace it.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The database was shut down.
    #[error("the database has been shut down")]
    ShutDown,

    /// A write (a transaction, a WAL checkpoint) on a store opened
    /// read-only.
    #[error("the store is open read-only")]
    ReadOnly,
    /// A file is damaged beyond what recovery can fall back from.
    #[error("{}: {what}", path.display())]
    Corrupt {
        /// The damaged file.
        path: PathBuf,
        /// What is wrong with it.
        what: String,
    },
    /// A file in the store directory is named like one of the store's
    /// (a stratum file) but holds bytes that sediment never writes there,
    /// nor a cut-short write of them leaves: another program's file.
    /// sediment never reuses or overwrites it, and the store does not open
    /// while it is there. Nothing was changed.
    #[error(
        "{}: not a file of this store: {what}. sediment never overwrites a file it does not \
         recognise, so the store does not open while it is there: move it out of the store \
         directory (or rename it) if it belongs to something else",
        path.display()
    )]
    UnrecognisedFile {
        /// The file.
        path: PathBuf,
        /// What it begins with.
        what: String,
    },
    /// [`Database::commit_log`](crate::Database::commit_log) reached
    /// records that cannot be read because commit log bytes are damaged:
    /// the file, the offset of the damaged frame and the sequences whose
    /// records are lost to readers. The records before them were returned;
    /// those after `damage.last` can be read with `commit_log(last + 1)`.
    #[error("{0}")]
    CommitLogDamaged(CommitLogDamage),
    /// `verify` found problems; the report lists each with its location.
    #[error("verification found problems:\n{0}")]
    Verification(VerifyReport),
    /// The store is encrypted and the key it needs is missing or wrong, or
    /// a key was given for a store that is not encrypted (or none for one
    /// that is): see [`Config::encryption`](crate::Config::encryption).
    /// `source` is an `io::Error` of kind
    /// [`PermissionDenied`](io::ErrorKind::PermissionDenied) whose inner
    /// error is an [`okaywal::encryption::KeyError`] naming the key id the
    /// file wants ([`Error::key_error`] finds it); its message names the
    /// file. Nothing was read as data and nothing was changed.
    #[error("{context}: {source}")]
    Key {
        /// What sediment was doing.
        context: String,
        /// The `PermissionDenied` error carrying the `KeyError`.
        #[source]
        source: io::Error,
    },
    /// An I/O error, with what was being done.
    #[error("{context}: {source}")]
    Io {
        /// What sediment was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

impl From<io::Error> for Error {
    fn from(source: io::Error) -> Self {
        Error::from_io("I/O error".into(), source)
    }
}

impl Error {
    /// An I/O error while doing `context`: [`Error::Key`] if it carries a
    /// [`KeyError`], [`Error::Io`] otherwise.
    pub(crate) fn from_io(context: String, source: io::Error) -> Self {
        if KeyError::of(&source).is_some() {
            Error::Key { context, source }
        } else {
            Error::Io { context, source }
        }
    }

    /// The key error behind this error, if it is one: the key id a file
    /// wants and whether the key is missing or wrong (or a key was given
    /// for a plain store, or none for an encrypted one).
    #[must_use]
    pub fn key_error(&self) -> Option<&KeyError> {
        match self {
            Error::Key { source, .. } | Error::Io { source, .. } => KeyError::of(source),
            _ => None,
        }
    }
}

/// The first bytes of a file as hex and as text, for an error about a file
/// that is not what its name says: `6d 79 20 6e ("my n")`.
pub(crate) fn first_bytes(bytes: &[u8]) -> String {
    let shown = &bytes[..bytes.len().min(16)];
    let hex: Vec<String> = shown.iter().map(|b| format!("{b:02x}")).collect();
    let text: String = shown
        .iter()
        .map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                char::from(b)
            } else {
                '.'
            }
        })
        .collect();
    format!("{} (\"{text}\")", hex.join(" "))
}

/// Adds context to I/O results.
pub(crate) trait Context<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T, Error>;
}

impl<T> Context<T> for io::Result<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T, Error> {
        self.map_err(|source| Error::from_io(what(), source))
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
