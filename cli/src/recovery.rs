//! `--recovery`: what opening a store or log does with damage in the
//! middle of its write-ahead log (okaywal's `RecoveryMode`).
//!
//! By default damage is an error, and every command but `verify` and
//! `wal-dump` refuses the store. `--recovery point-in-time` keeps what
//! precedes the damage, `--recovery skip-corrupted` keeps every entry but
//! the damaged ones. A read-only command applies the choice in memory
//! only; a command that writes (`put`, `archive`, `checkpoint`, `repair`)
//! makes it permanent, dropping the transactions it does not keep.

use std::sync::OnceLock;

use okaywal::RecoveryMode;

/// The `--recovery` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Recovery {
    /// Damage is an error (the default).
    Error,
    /// Keep the transactions before the damage, drop it and all after it.
    PointInTime,
    /// Drop only the damaged transactions, keep the rest.
    SkipCorrupted,
}

impl Recovery {
    fn mode(self) -> RecoveryMode {
        match self {
            Recovery::Error => RecoveryMode::ErrorOnCorruption,
            Recovery::PointInTime => RecoveryMode::PointInTime,
            Recovery::SkipCorrupted => RecoveryMode::SkipCorrupted,
        }
    }
}

static MODE: OnceLock<RecoveryMode> = OnceLock::new();

/// Sets the mode for the rest of the process (from `main`, once).
pub fn set(recovery: Recovery) {
    let _ = MODE.set(recovery.mode());
}

/// The mode every store and log is opened with.
pub fn mode() -> RecoveryMode {
    MODE.get()
        .copied()
        .unwrap_or(RecoveryMode::ErrorOnCorruption)
}

/// Said after an error that damage in the WAL stopped the open.
pub const HINT: &str = "to open it anyway, add --recovery point-in-time (keeps the transactions \
                        before the damage) or --recovery skip-corrupted (drops only the damaged \
                        ones); read-only commands apply it in memory, commands that write make \
                        it permanent";
