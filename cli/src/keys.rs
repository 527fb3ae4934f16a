//! `--key-file`: the key of an encrypted store or WAL.
//!
//! Every subcommand takes `--key-file PATH` (a file holding the 32-byte
//! key: 32 raw bytes or 64 hexadecimal characters, used as key id 1). It
//! is read once, before the command runs, and every store or WAL the
//! command opens gets its configuration from [`store_config`] or
//! [`wal_config`], so all of them see the same key.
//!
//! Key problems are told plainly, never as damage: [`key_problem`] turns a
//! [`KeyError`] into a message that names the key id the file wants.

use std::path::Path;
use std::sync::OnceLock;

use okaywal::encryption::{KeyError, StaticKey};

use crate::error::{describe_io, CliError};

static KEY: OnceLock<StaticKey> = OnceLock::new();

/// Reads the key file at `path` for the rest of the process.
pub fn load(path: &Path) -> Result<(), CliError> {
    let key = StaticKey::from_file(path)
        .map_err(|err| CliError::input(format!("--key-file: {}", describe_io(&err))))?;
    // Set once, from `main`.
    let _ = KEY.set(key);
    Ok(())
}

/// The key given with `--key-file`, if any.
pub fn key() -> Option<&'static StaticKey> {
    KEY.get()
}

/// The configuration every command opens the store at `path` with: the
/// defaults, `--recovery`'s mode, and the key if one was given.
pub fn store_config(path: &Path) -> sediment::Config {
    let config =
        sediment::Config::for_directory(path).wal(|wal| wal.recovery_mode(crate::recovery::mode()));
    match key() {
        Some(key) => config.encryption(key.clone()),
        None => config,
    }
}

/// The configuration of the okaywal log in `dir`, with the key if one was
/// given.
pub fn wal_config(dir: &Path) -> okaywal::Configuration {
    let config = okaywal::Configuration::default_for(dir).recovery_mode(crate::recovery::mode());
    match key() {
        Some(key) => config.encryption(key.clone()),
        None => config,
    }
}

/// A key problem (found in `error`'s chain) as a plain message, or `None`
/// if `error` is something else.
pub fn key_problem(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            if let Some(key_error) = KeyError::of(io) {
                return Some(describe(key_error, io));
            }
        }
        if let Some(key_error) = error.downcast_ref::<KeyError>() {
            return Some(describe(key_error, error));
        }
        next = error.source();
    }
    None
}

fn describe(key_error: &KeyError, error: &dyn std::fmt::Display) -> String {
    // The error reads "{file}: {key error}": name the file on its own.
    let text = error.to_string();
    let what = text
        .strip_suffix(&format!(": {key_error}"))
        .unwrap_or("the data");
    match key_error {
        KeyError::Wrong(id) => format!(
            "wrong key: {what} is encrypted with {id}, and the key in --key-file is a different key"
        ),
        KeyError::Missing(id) if key().is_some() => {
            format!("missing key: {what} is encrypted with {id}, and --key-file gives key id 1")
        }
        KeyError::Missing(id) => {
            format!("missing key: {what} is encrypted with {id}; give its key with --key-file")
        }
        // `what` names the key id when the files say which, e.g.
        // "db/index (encrypted with key id 1)".
        KeyError::NotConfigured if what.ends_with(')') => {
            format!("missing key: {what}; give its key with --key-file")
        }
        KeyError::NotConfigured => {
            format!("missing key: {what} is encrypted; give its key with --key-file")
        }
        KeyError::NotEncrypted => {
            format!("{what} is not encrypted: run without --key-file")
        }
    }
}
