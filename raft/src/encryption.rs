//! Encryption at rest for a node's own files: the log's metadata and
//! archive files, snapshot files, and the key check that says whether a
//! node directory is encrypted and with which key.
//!
//! A node started with a key provider ([`NodeConfig::key_provider`],
//! `sediment-raft node --key-file`) seals every file it writes outside
//! okaywal and sediment with [`okaywal::encryption::Cipher`]
//! (AES-256-GCM, a nonce never used twice under a key). Each sealed range
//! is authenticated together with where it belongs (the file's kind, its
//! number, the record's offset and log id, the block's index), so bytes
//! that were changed, moved to another place or copied from an older file
//! fail to open and are reported as damage naming the file. `FORMAT.md`
//! gives every layout.
//!
//! The node directory holds a key check file, [`KEY_CHECK_FILE`], written
//! when a node with a key starts in a new directory. Every start checks it
//! before anything else is opened:
//!
//! - a key and a key check that the key opens: the node starts;
//! - a key the key check was not made with, or a key id the provider does
//!   not have: the node refuses to start, with an error naming the key id,
//!   and writes nothing;
//! - a key, and a directory that holds a node without a key check: refused
//!   (the node's files are not encrypted);
//! - no key, and a key check: refused (the files are encrypted).
//!
//! Every such error is an [`Error::Key`] whose `io::Error` (kind
//! `PermissionDenied`) carries an [`okaywal::encryption::KeyError`].
//!
//! [`NodeConfig::key_provider`]: crate::node::NodeConfig::key_provider

use std::fmt;
use std::io;
use std::path::Path;
use std::sync::Arc;

use okaywal::encryption::{Cipher, Key, KeyError, KeyId, KeyProvider, Seal, SEAL_BYTES};
use okaywal::fs::{FileSystem, OpenMode};

use crate::error::{Error, Result};

/// The name of the key check file in a node directory.
pub const KEY_CHECK_FILE: &str = "key-check";

const KEY_CHECK_MAGIC: &[u8; 8] = b"SRKEYCK1";
/// Bytes of the key check file: magic, key check seal, CRC32.
const KEY_CHECK_BYTES: usize = 8 + SEAL_BYTES + 4;
/// What the node's key check is bound to.
const NODE_CONTEXT: &[u8] = b"sediment-raft node";

/// A key provider shared by a node's log, state machine and snapshots.
/// Cheap to clone; its `Debug` never shows a key.
#[derive(Clone)]
pub struct SharedKeys(Arc<dyn KeyProvider>);

impl SharedKeys {
    /// Shares `provider`.
    pub fn new(provider: impl KeyProvider) -> Self {
        Self(Arc::new(provider))
    }

    /// Shares a provider that is already behind an `Arc`.
    #[must_use]
    pub fn from_arc(provider: Arc<dyn KeyProvider>) -> Self {
        Self(provider)
    }

    /// A cipher over these keys.
    #[must_use]
    pub fn cipher(&self) -> Cipher {
        Cipher::shared(self.0.clone())
    }
}

impl KeyProvider for SharedKeys {
    fn current(&self) -> io::Result<(KeyId, Key)> {
        self.0.current()
    }

    fn key(&self, id: KeyId) -> io::Result<Option<Key>> {
        self.0.key(id)
    }
}

impl fmt::Debug for SharedKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SharedKeys(..)")
    }
}

/// `error` as this crate's error: [`Error::Key`] for a key problem,
/// [`Error::Corrupt`] naming `what` for damage, [`Error::Io`] otherwise.
pub(crate) fn classify(what: &str, error: io::Error) -> Error {
    if KeyError::of(&error).is_some() {
        Error::Key(error)
    } else if error.kind() == io::ErrorKind::InvalidData {
        Error::Corrupt {
            what: what.to_string(),
            detail: error.to_string(),
        }
    } else {
        Error::io(format!("reading {what}"), error)
    }
}

/// A `KeyError` about `what` as an [`Error::Key`].
pub(crate) fn key_error(error: KeyError, what: impl fmt::Display) -> Error {
    Error::Key(error.into_io(what))
}

/// Writes a key check of `cipher`'s current key as a header: `magic`, the
/// seal, a CRC32 of both.
pub(crate) fn key_check_header(
    cipher: &Cipher,
    magic: &[u8; 8],
    context: &[u8],
) -> io::Result<Vec<u8>> {
    let check = cipher.key_check(context)?;
    let mut out = Vec::with_capacity(8 + SEAL_BYTES + 4);
    out.extend_from_slice(magic);
    out.extend_from_slice(&check.to_bytes());
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(out)
}

/// Reads a header written by [`key_check_header`] from the start of
/// `bytes` (which must hold at least its bytes) and checks the key.
/// Errors: `InvalidData` if the CRC does not match, a `KeyError` (kind
/// `PermissionDenied`, naming `what`) if the key is wrong or missing.
pub(crate) fn verify_key_check_header(
    cipher: &Cipher,
    bytes: &[u8],
    context: &[u8],
    what: &str,
) -> io::Result<()> {
    let len = 8 + SEAL_BYTES;
    let Some(header) = bytes.get(..len + 4) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{what}: its header is cut short"),
        ));
    };
    let crc = u32::from_le_bytes(header[len..].try_into().expect("4 bytes"));
    if crc32fast::hash(&header[..len]) != crc {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{what}: header checksum mismatch"),
        ));
    }
    let seal: &[u8; SEAL_BYTES] = header[8..len].try_into().expect("a seal");
    cipher.verify_key_check(&Seal::from_bytes(seal), context, what)
}

/// Checks the node directory `directory` against `keys` before a node
/// opens anything in it, and writes the key check when a node with a key
/// starts in a new directory (see the [module docs](self)).
///
/// # Errors
///
/// [`Error::Key`] for a wrong or missing key, a key given for a node
/// directory without a key check, or none given for one with it;
/// [`Error::Corrupt`] for a damaged key check file; [`Error::Io`] if the
/// directory cannot be read or the key check written.
pub fn check_node_directory(
    fs: &dyn FileSystem,
    directory: &Path,
    keys: Option<&SharedKeys>,
) -> Result<()> {
    let path = directory.join(KEY_CHECK_FILE);
    let shown = path.display().to_string();
    let exists = fs
        .exists(&path)
        .map_err(|e| Error::io(format!("looking for {shown}"), e))?;
    match (keys, exists) {
        (None, false) => Ok(()),
        (None, true) => {
            // Only a key check makes the directory encrypted: a file of
            // that name that is none (empty, or another file) is damage,
            // which no key would get past.
            let bytes =
                read_all(fs, &path).map_err(|e| Error::io(format!("reading {shown}"), e))?;
            if bytes.len() != KEY_CHECK_BYTES || &bytes[..8] != KEY_CHECK_MAGIC {
                return Err(not_a_key_check(shown));
            }
            // Name the key the directory needs.
            let id = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
            Err(key_error(
                KeyError::NotConfigured,
                format!("{shown} (encrypted with key id {id})"),
            ))
        }
        (Some(keys), true) => {
            let bytes =
                read_all(fs, &path).map_err(|e| Error::io(format!("reading {shown}"), e))?;
            if bytes.len() != KEY_CHECK_BYTES || &bytes[..8] != KEY_CHECK_MAGIC {
                return Err(not_a_key_check(shown));
            }
            let cipher = keys.cipher();
            verify_key_check_header(&cipher, &bytes, NODE_CONTEXT, &shown)
                .map_err(|e| classify(&shown, e))?;
            // After a rotation, the check moves to the current key, so that
            // the old one can be retired once nothing else needs it.
            let made_with = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
            let current = cipher
                .current_key_id()
                .map_err(|e| Error::io("asking the key provider for its current key", e))?;
            if current.get() != made_with {
                let header = key_check_header(&cipher, KEY_CHECK_MAGIC, NODE_CONTEXT)
                    .map_err(|e| Error::io("making the key check", e))?;
                write_durably(fs, directory, KEY_CHECK_FILE, &header)
                    .map_err(|e| Error::io(format!("writing {shown}"), e))?;
            }
            Ok(())
        }
        (Some(keys), false) => {
            for part in ["log", "state"] {
                let inside = directory.join(part);
                if fs
                    .exists(&inside)
                    .map_err(|e| Error::io(format!("looking for {}", inside.display()), e))?
                {
                    return Err(key_error(
                        KeyError::NotEncrypted,
                        format!(
                            "{} (a node directory without {KEY_CHECK_FILE})",
                            directory.display()
                        ),
                    ));
                }
            }
            okaywal::fs::create_dir_durably(fs, directory)
                .map_err(|e| Error::io(format!("creating {}", directory.display()), e))?;
            let header = key_check_header(&keys.cipher(), KEY_CHECK_MAGIC, NODE_CONTEXT)
                .map_err(|e| Error::io("making the key check", e))?;
            write_durably(fs, directory, KEY_CHECK_FILE, &header)
                .map_err(|e| Error::io(format!("writing {shown}"), e))
        }
    }
}

/// A file named [`KEY_CHECK_FILE`] that is no key check.
fn not_a_key_check(shown: String) -> Error {
    Error::Corrupt {
        what: shown,
        detail: format!(
            "not a key check file ({KEY_CHECK_BYTES} bytes starting with SRKEYCK1, written by \
             the node's first start with --key-file)"
        ),
    }
}

/// Whether `directory` holds a key check file (the node's files are
/// encrypted).
pub fn is_encrypted_node(fs: &dyn FileSystem, directory: &Path) -> io::Result<bool> {
    fs.exists(&directory.join(KEY_CHECK_FILE))
}

/// The largest file [`read_all`] reads: the node's small files (key
/// check, identity) are a few hundred bytes at most.
const SMALL_FILE_LIMIT: u64 = 64 * 1024;

/// Reads one of the node's small files whole. A file larger than any the
/// node writes there (a stray file under that name) is refused with
/// `InvalidData` rather than read into memory.
pub(crate) fn read_all(fs: &dyn FileSystem, path: &Path) -> io::Result<Vec<u8>> {
    let file = fs.open(path, OpenMode::Read)?;
    let len = file.len()?;
    if len > SMALL_FILE_LIMIT {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} holds {len} bytes, more than any file the node writes there \
                 ({SMALL_FILE_LIMIT} at most): not the node's file",
                path.display()
            ),
        ));
    }
    let mut bytes = vec![0; len as usize];
    file.read_exact_at(&mut bytes, 0)?;
    Ok(bytes)
}

/// Writes `bytes` to `directory/name` through a synced temporary file
/// renamed into place, then syncs the directory.
pub(crate) fn write_durably(
    fs: &dyn FileSystem,
    directory: &Path,
    name: &str,
    bytes: &[u8],
) -> io::Result<()> {
    let tmp = directory.join(format!("{name}.tmp"));
    let file = fs.open(&tmp, OpenMode::Create)?;
    file.set_len(0)?;
    file.write_all_at(bytes, 0)?;
    file.sync_all()?;
    drop(file);
    fs.rename(&tmp, &directory.join(name))?;
    fs.sync_dir(directory)
}

#[cfg(test)]
mod tests {
    use super::*;
    use okaywal::encryption::StaticKey;
    use okaywal::fs::MemoryFileSystem;

    #[test]
    fn the_key_check_admits_the_key_and_refuses_others() {
        let fs = MemoryFileSystem::new();
        let dir = Path::new("/node");
        let keys = SharedKeys::new(StaticKey::new([1; 32]));
        check_node_directory(&fs, dir, Some(&keys)).unwrap();
        assert!(is_encrypted_node(&fs, dir).unwrap());
        check_node_directory(&fs, dir, Some(&keys)).unwrap();

        let wrong = SharedKeys::new(StaticKey::new([2; 32]));
        let error = check_node_directory(&fs, dir, Some(&wrong)).unwrap_err();
        let text = error.to_string();
        assert!(text.contains("key id 1"), "{text}");
        assert!(!text.contains("corrupt"), "{text}");
        assert!(matches!(error, Error::Key(_)));

        let other_id = SharedKeys::new(StaticKey::with_id(KeyId::new(9), Key::from_bytes([1; 32])));
        let error = check_node_directory(&fs, dir, Some(&other_id)).unwrap_err();
        assert!(error.to_string().contains("no key for key id 1"), "{error}");

        let error = check_node_directory(&fs, dir, None).unwrap_err();
        assert!(error.to_string().contains("no key was given"), "{error}");
        assert!(error.to_string().contains("key id 1"), "{error}");
    }

    #[test]
    fn the_key_check_follows_a_rotation() {
        use okaywal::encryption::Keyring;
        let fs = MemoryFileSystem::new();
        let dir = Path::new("/node");
        let ring = Arc::new(Keyring::new(KeyId::new(1), Key::from_bytes([1; 32])));
        let keys = SharedKeys::from_arc(ring.clone());
        check_node_directory(&fs, dir, Some(&keys)).unwrap();
        ring.rotate(KeyId::new(2), Key::from_bytes([2; 32]));
        check_node_directory(&fs, dir, Some(&keys)).unwrap();
        assert!(ring.retire(KeyId::new(1)));
        check_node_directory(&fs, dir, Some(&keys)).unwrap();
        let only_old = SharedKeys::new(StaticKey::new([1; 32]));
        let error = check_node_directory(&fs, dir, Some(&only_old)).unwrap_err();
        assert!(error.to_string().contains("key id 2"), "{error}");
    }

    #[test]
    fn a_file_named_key_check_larger_than_any_the_node_writes_is_refused() {
        let fs = MemoryFileSystem::new();
        let dir = Path::new("/node");
        okaywal::fs::create_dir_durably(&fs, dir).unwrap();
        let file = fs
            .open(&dir.join(KEY_CHECK_FILE), OpenMode::Create)
            .unwrap();
        file.set_len(1 << 20).unwrap();
        let keys = SharedKeys::new(StaticKey::new([1; 32]));
        for given in [None, Some(&keys)] {
            let error = check_node_directory(&fs, dir, given).unwrap_err();
            assert!(
                error
                    .to_string()
                    .contains("more than any file the node writes"),
                "{error}"
            );
        }
    }

    #[test]
    fn a_file_named_key_check_that_is_none_is_damage_with_or_without_a_key() {
        let fs = MemoryFileSystem::new();
        let dir = Path::new("/node");
        okaywal::fs::create_dir_durably(&fs, dir).unwrap();
        let keys = SharedKeys::new(StaticKey::new([1; 32]));
        for bytes in [Vec::new(), vec![7; KEY_CHECK_BYTES]] {
            write_durably(&fs, dir, KEY_CHECK_FILE, &bytes).unwrap();
            for given in [None, Some(&keys)] {
                let error = check_node_directory(&fs, dir, given).unwrap_err();
                assert!(matches!(error, Error::Corrupt { .. }), "{error}");
                assert!(error.to_string().contains("not a key check"), "{error}");
            }
        }
    }

    #[test]
    fn a_key_for_a_plain_node_directory_is_refused() {
        let fs = MemoryFileSystem::new();
        let dir = Path::new("/plain");
        okaywal::fs::create_dir_durably(&fs, &dir.join("log")).unwrap();
        check_node_directory(&fs, dir, None).unwrap();
        let keys = SharedKeys::new(StaticKey::new([1; 32]));
        let error = check_node_directory(&fs, dir, Some(&keys)).unwrap_err();
        assert!(error.to_string().contains("not encrypted"), "{error}");
        assert!(!is_encrypted_node(&fs, dir).unwrap());
    }
}
