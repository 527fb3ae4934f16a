//! The command's error type: a one-line message and an exit code.

use std::io;
use std::path::Path;

/// Exit code when `verify` found problems.
pub const EXIT_PROBLEMS: u8 = 1;
/// Exit code for bad input: usage errors (clap's own code), a missing
/// directory, a directory that is not a store, a malformed grain id or
/// sequence, a free grain, a sequence in the future.
pub const EXIT_INPUT: u8 = 2;
/// Exit code for everything else: damaged files, I/O errors.
pub const EXIT_FAILURE: u8 = 3;

/// Writes one line to standard error, as `eprintln!` does, except that a
/// standard error that cannot be written (a full disk behind `2>>log`, a
/// closed pipe) loses the line instead of panicking.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}
pub(crate) use say;

/// Why a command failed.
#[derive(Debug)]
pub struct CliError {
    /// The process exit code.
    pub code: u8,
    /// Printed as `sediment: <message>` on stderr; `None` when everything
    /// was already said (verification problems, a closed output pipe).
    pub message: Option<String>,
}

impl CliError {
    /// Bad input from the user: exit code 2.
    pub fn input(message: impl Into<String>) -> Self {
        Self {
            code: EXIT_INPUT,
            message: Some(message.into()),
        }
    }

    /// Anything else that went wrong: exit code 3.
    pub fn failure(message: impl Into<String>) -> Self {
        Self {
            code: EXIT_FAILURE,
            message: Some(message.into()),
        }
    }

    /// `verify` found (and printed) problems: exit code 1.
    pub fn problems() -> Self {
        Self {
            code: EXIT_PROBLEMS,
            message: None,
        }
    }

    /// An error writing our own output. A reader that went away (`sediment
    /// log | head`) is not an error worth a message.
    pub fn output(err: io::Error) -> Self {
        if err.kind() == io::ErrorKind::BrokenPipe {
            Self {
                code: 0,
                message: None,
            }
        } else {
            Self::failure(format!("writing output: {}", describe_io(&err)))
        }
    }

    /// An I/O error on `path` while doing `what` (e.g. "reading"); a key
    /// problem is told as one (exit code 2).
    pub fn io(what: &str, path: &Path, err: &io::Error) -> Self {
        if let Some(message) = crate::keys::key_problem(err) {
            return Self::input(message);
        }
        let message = format!("{what} {}: {}", path.display(), describe_io(err));
        match err.kind() {
            io::ErrorKind::NotFound
            | io::ErrorKind::PermissionDenied
            | io::ErrorKind::IsADirectory
            | io::ErrorKind::NotADirectory => Self::input(message),
            _ => Self::failure(message),
        }
    }
}

/// An I/O error without the "(os error N)" suffix.
pub fn describe_io(err: &io::Error) -> String {
    without_os_error_codes(&err.to_string())
}

/// `text` without the " (os error N)" that the standard library appends to
/// every operating-system error: the words before it already say what
/// went wrong, wherever in a longer message (a library's error that wraps
/// an `io::Error`) it stands.
pub fn without_os_error_codes(text: &str) -> String {
    const MARK: &str = " (os error ";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(MARK) {
        let after = &rest[at + MARK.len()..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 && after[digits..].starts_with(')') {
            out.push_str(&rest[..at]);
            rest = &after[digits + 1..];
        } else {
            out.push_str(&rest[..at + MARK.len()]);
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// True for errors that mean the store's files are damaged (as opposed to
/// bad input or a failing disk).
pub fn is_corruption(err: &sediment::Error) -> bool {
    match err {
        sediment::Error::Corrupt { .. }
        | sediment::Error::ChecksumMismatch { .. }
        | sediment::Error::CommitLogDamaged(_)
        | sediment::Error::Verification(_) => true,
        sediment::Error::Io { source, .. } => source.kind() == io::ErrorKind::InvalidData,
        _ => false,
    }
}

impl From<sediment::Error> for CliError {
    fn from(err: sediment::Error) -> Self {
        use sediment::Error;
        // A wrong or missing key is the user's input, never damage.
        if let Some(message) = crate::keys::key_problem(&err) {
            return Self::input(message);
        }
        match &err {
            Error::InvalidGrainId(_)
            | Error::AlreadyArchived(_)
            | Error::TooLarge { .. }
            | Error::FutureSequence { .. } => Self::input(err.to_string()),
            Error::NotAllocated(id) => Self::input(not_allocated(*id)),
            _ => {
                let message = match &err {
                    Error::Corrupt { .. }
                    | Error::ChecksumMismatch { .. }
                    | Error::CommitLogDamaged(_) => format!("the store is damaged: {err}"),
                    _ => err.to_string(),
                };
                // okaywal's advice names its settings; say how to give
                // them to this command.
                if message.contains("RecoveryMode::") {
                    Self::failure(format!("{message}; {}", crate::recovery::HINT))
                } else {
                    Self::failure(message)
                }
            }
        }
    }
}

/// The message for a grain id that names no committed blob.
pub fn not_allocated(id: sediment::GrainId) -> String {
    format!(
        "grain {id} is not allocated (it is free, was freed by a checkpoint, or is not the start of a blob)"
    )
}

/// Folds a message onto one line.
pub fn one_line(message: &str) -> String {
    let message = without_os_error_codes(message);
    let mut lines = message.lines().map(str::trim).filter(|l| !l.is_empty());
    let mut out = lines.next().unwrap_or_default().to_string();
    for line in lines {
        out.push_str("; ");
        out.push_str(line);
    }
    out
}

/// A command-line usage error from clap, on one line like every other
/// error: its message and tip, without the usage block clap prints under
/// it, and a pointer to `--help`.
pub fn usage_error(rendered: &str, command: &str) -> String {
    let kept: Vec<&str> = rendered
        .lines()
        .map(str::trim)
        .take_while(|line| !line.starts_with("Usage:"))
        .filter(|line| !line.is_empty())
        .collect();
    let mut message = String::new();
    for line in kept {
        if !message.is_empty() {
            // A line ending in a colon introduces what follows it.
            message.push_str(if message.ends_with(':') { " " } else { "; " });
        }
        message.push_str(line);
    }
    let message = message.strip_prefix("error: ").unwrap_or(&message);
    format!("{message} (see `{command} --help`)")
}

#[cfg(test)]
mod usage_tests {
    use super::usage_error;

    #[test]
    fn a_clap_error_folds_to_one_line_without_the_usage_block() {
        let rendered = "error: unexpected argument '-1' found\n\n  tip: to pass '-1' as a value, use '-- -1'\n\nUsage: sediment get [OPTIONS] <DB> <GRAIN>\n\nFor more information, try '--help'.\n";
        assert_eq!(
            usage_error(rendered, "sediment get"),
            "unexpected argument '-1' found; tip: to pass '-1' as a value, use '-- -1' (see `sediment get --help`)"
        );
        let missing = "error: the following required arguments were not provided:\n  <GRAIN>\n\nUsage: sediment get <DB> <GRAIN>\n";
        assert_eq!(
            usage_error(missing, "sediment get"),
            "the following required arguments were not provided: <GRAIN> (see `sediment get --help`)"
        );
    }
}

#[cfg(test)]
mod message_tests {
    use super::{one_line, without_os_error_codes};

    #[test]
    fn os_error_codes_are_dropped_wherever_they_stand() {
        assert_eq!(
            without_os_error_codes(
                "writing db/wal: No space left on device (os error 28): syncing failed (os error 5)"
            ),
            "writing db/wal: No space left on device: syncing failed"
        );
        // Text that only looks like one stays.
        assert_eq!(
            without_os_error_codes("a (os error x) and (os error 7"),
            "a (os error x) and (os error 7"
        );
        assert_eq!(
            one_line("opening db: Permission denied (os error 13)\n  at segment 3"),
            "opening db: Permission denied; at segment 3"
        );
    }
}
