//! The log's one failure state: the first error that stopped it from
//! accepting commits, kept with its kind.
//!
//! A failed write or `fdatasync` stops the log until it is reopened (see
//! the crate docs). Every error the log reports after that is built from
//! the first one: it has the first error's [`io::ErrorKind`] (a full disk
//! stays `StorageFull`, not a generic `Other`) and its message, so whoever
//! sees a later error learns what actually went wrong.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

/// What every error after the first failure says before that failure's
/// message.
pub(crate) const STOPPED: &str =
    "the log stopped accepting commits after an I/O failure and must be reopened";

/// An error's kind and message, kept to build errors of the same kind
/// later (an `io::Error` itself cannot be cloned).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ErrorRecord {
    pub kind: io::ErrorKind,
    pub message: String,
}

impl ErrorRecord {
    /// Keeps `err`'s kind and message.
    pub fn of(err: &io::Error) -> Self {
        Self {
            kind: err.kind(),
            message: err.to_string(),
        }
    }

    /// An error of the kept kind whose message is `context`, a colon and
    /// the kept message.
    pub fn error(&self, context: &str) -> io::Error {
        io::Error::new(self.kind, format!("{context}: {}", self.message))
    }
}

/// Set once, by the first failure; never cleared while the log is open.
#[derive(Debug, Default)]
pub(crate) struct Failure {
    /// True once `first` is set: checked without the lock on hot paths.
    failed: AtomicBool,
    first: Mutex<Option<ErrorRecord>>,
}

impl Failure {
    /// Records `err` unless an earlier failure is recorded already.
    pub fn record(&self, err: &io::Error) {
        self.record_with(|| ErrorRecord::of(err));
    }

    /// Records the failure `record` makes unless one is recorded already.
    pub fn record_with(&self, record: impl FnOnce() -> ErrorRecord) {
        let mut first = self.first.lock();
        if first.is_none() {
            *first = Some(record());
        }
        self.failed.store(true, Ordering::Release);
    }

    /// True once a failure has been recorded.
    pub fn is_set(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// The first failure, if any.
    pub fn first(&self) -> Option<ErrorRecord> {
        if !self.is_set() {
            return None;
        }
        self.first.lock().clone()
    }

    /// The error every later operation of a failed log gets: the first
    /// failure's kind, with `context` before its message.
    pub fn error(&self, context: &str) -> Option<io::Error> {
        self.first().map(|first| first.error(context))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_failure_wins_and_keeps_its_kind() {
        let failure = Failure::default();
        assert!(failure.error("later").is_none());
        failure.record(&io::Error::new(io::ErrorKind::StorageFull, "disk full"));
        failure.record(&io::Error::other("something else"));
        let err = failure.error("later").unwrap();
        assert_eq!(err.kind(), io::ErrorKind::StorageFull);
        assert_eq!(err.to_string(), "later: disk full");
    }
}
