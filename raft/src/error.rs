//! The crate's error type.

use std::io;

/// Everything that can go wrong in the replicated store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The state machine's sediment store failed.
    #[error("state machine store: {0}")]
    Sediment(#[from] sediment::Error),
    /// Stored bytes could not be decoded.
    #[error("{what}: {detail}")]
    Corrupt {
        /// Which structure.
        what: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The node's encryption key does not fit its files: a wrong key, a
    /// key id the provider does not have, a key given for files that are
    /// not encrypted, or none given for files that are. The `io::Error`
    /// (kind `PermissionDenied`) names the file and carries an
    /// [`okaywal::encryption::KeyError`]; its message names the key id.
    #[error("encryption key: {0}")]
    Key(io::Error),
    /// A request was not valid (bad key, value too large, bad JSON).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// openraft refused to start or stopped.
    #[error("raft: {0}")]
    Raft(String),
    /// The node's configuration cannot be used: a missing or unreadable
    /// TLS or token file, or a non-loopback address without TLS and
    /// authentication. The message never includes a token's or a key's
    /// bytes.
    #[error("configuration: {0}")]
    Config(String),
}

impl From<io::Error> for Error {
    fn from(source: io::Error) -> Self {
        Error::Io {
            context: "I/O error".into(),
            source,
        }
    }
}

impl Error {
    /// An I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// The key problem behind this error, if it is one ([`Error::Key`]).
    #[must_use]
    pub fn key_error(&self) -> Option<&okaywal::encryption::KeyError> {
        match self {
            Error::Key(source) | Error::Io { source, .. } => {
                okaywal::encryption::KeyError::of(source)
            }
            Error::Sediment(error) => error.key_error(),
            _ => None,
        }
    }

    /// Converts to an `io::Error`, keeping an underlying one as is.
    pub fn into_io(self) -> io::Error {
        match self {
            Error::Io { context, source } => {
                io::Error::new(source.kind(), format!("{context}: {source}"))
            }
            Error::Key(source) => source,
            other => io::Error::other(other),
        }
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
