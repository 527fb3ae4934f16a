//! Keys and where they come from: key ids, the key bytes (zeroed when
//! dropped), the providers an application hands the log (one static key,
//! a keyring for rotation) and the errors of a missing or wrong key.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::Path;
use std::sync::Arc;

use parking_lot::RwLock;
use zeroize::{Zeroize, Zeroizing};

use super::KEY_BYTES;

/// Names a key. Files record the id of the key their data is sealed with,
/// never the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyId(pub(super) u32);

impl KeyId {
    /// The id `id`.
    #[must_use]
    pub const fn new(id: u32) -> Self {
        Self(id)
    }

    /// The number.
    #[must_use]
    pub const fn get(self) -> u32 {
        self.0
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "key id {}", self.0)
    }
}

/// A 256-bit key. Its bytes are zeroed when it is dropped and never
/// printed.
#[derive(Clone)]
pub struct Key(Zeroizing<[u8; KEY_BYTES]>);

impl Key {
    /// A key of these bytes.
    #[must_use]
    pub fn from_bytes(bytes: [u8; KEY_BYTES]) -> Self {
        Self(Zeroizing::new(bytes))
    }

    /// A key from 32 raw bytes or 64 hexadecimal characters (surrounding
    /// whitespace ignored): the format of a key file.
    ///
    /// # Errors
    ///
    /// `InvalidInput` if `text` is neither; the message never contains
    /// the bytes.
    pub fn parse(text: &[u8]) -> io::Result<Self> {
        if text.len() == KEY_BYTES {
            let mut bytes = [0; KEY_BYTES];
            bytes.copy_from_slice(text);
            let key = Self::from_bytes(bytes);
            bytes.zeroize();
            return Ok(key);
        }
        let trimmed = text.trim_ascii();
        if trimmed.len() == 2 * KEY_BYTES {
            let mut bytes = Zeroizing::new([0; KEY_BYTES]);
            for (i, pair) in trimmed.chunks(2).enumerate() {
                match (hex_digit(pair[0]), hex_digit(pair[1])) {
                    (Some(high), Some(low)) => bytes[i] = high << 4 | low,
                    _ => return Err(bad_key_text(text.len())),
                }
            }
            return Ok(Self(bytes));
        }
        Err(bad_key_text(text.len()))
    }

    /// Reads a key file: 32 raw bytes, or 64 hexadecimal characters.
    ///
    /// # Errors
    ///
    /// The file cannot be read, or holds neither form (the error names the
    /// file and its length, never its contents).
    pub fn read_file(path: impl AsRef<Path>) -> io::Result<Self> {
        let path = path.as_ref();
        let text = Zeroizing::new(std::fs::read(path).map_err(|error| {
            io::Error::new(
                error.kind(),
                format!("cannot read key file {}: {error}", path.display()),
            )
        })?);
        Self::parse(&text).map_err(|error| {
            io::Error::new(
                error.kind(),
                format!("key file {}: {error}", path.display()),
            )
        })
    }

    /// The key's bytes, for deriving the keys that seal (see
    /// `super::aead`).
    pub(super) fn secret(&self) -> &[u8; KEY_BYTES] {
        &self.0
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(redacted)")
    }
}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

fn bad_key_text(len: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "a key is {KEY_BYTES} raw bytes or {} hexadecimal characters; got {len} bytes of neither",
            2 * KEY_BYTES
        ),
    )
}

/// Where keys come from. Implement it over a KMS or keyring, or use
/// [`StaticKey`] or [`Keyring`].
///
/// It is asked for the current key on every write and for a key by id on
/// reads, so implementations should answer from memory.
pub trait KeyProvider: Send + Sync + 'static {
    /// The key new data is sealed with, and its id.
    ///
    /// # Errors
    ///
    /// Any error is returned to the write that asked.
    fn current(&self) -> io::Result<(KeyId, Key)>;

    /// The key with this id, or `None` if the provider does not have it.
    ///
    /// # Errors
    ///
    /// Any error is returned to the read that asked.
    fn key(&self, id: KeyId) -> io::Result<Option<Key>>;
}

/// One key that never changes, with id 1 (or the id given).
#[derive(Debug, Clone)]
pub struct StaticKey {
    id: KeyId,
    key: Key,
}

impl StaticKey {
    /// `bytes` as key id 1.
    #[must_use]
    pub fn new(bytes: [u8; KEY_BYTES]) -> Self {
        Self::with_id(KeyId::new(1), Key::from_bytes(bytes))
    }

    /// `key` under `id`.
    #[must_use]
    pub fn with_id(id: KeyId, key: Key) -> Self {
        Self { id, key }
    }

    /// Reads a key file (see [`Key::read_file`]) as key id 1.
    ///
    /// # Errors
    ///
    /// As [`Key::read_file`].
    pub fn from_file(path: impl AsRef<Path>) -> io::Result<Self> {
        Ok(Self::with_id(KeyId::new(1), Key::read_file(path)?))
    }
}

impl KeyProvider for StaticKey {
    fn current(&self) -> io::Result<(KeyId, Key)> {
        Ok((self.id, self.key.clone()))
    }

    fn key(&self, id: KeyId) -> io::Result<Option<Key>> {
        Ok((id == self.id).then(|| self.key.clone()))
    }
}

/// Keys by id, one of them current; [`Keyring::rotate`] makes a new key
/// current while the old ones stay readable, and [`Keyring::retire`]
/// forgets one.
#[derive(Debug)]
pub struct Keyring {
    inner: RwLock<Ring>,
}

#[derive(Debug)]
struct Ring {
    current: KeyId,
    keys: BTreeMap<KeyId, Key>,
}

impl Keyring {
    /// A ring holding `key` as `id`, current.
    #[must_use]
    pub fn new(id: KeyId, key: Key) -> Self {
        Self {
            inner: RwLock::new(Ring {
                current: id,
                keys: BTreeMap::from([(id, key)]),
            }),
        }
    }

    /// Adds an older key that stays readable but is not current.
    pub fn add(&self, id: KeyId, key: Key) {
        self.inner.write().keys.insert(id, key);
    }

    /// Makes `key` current under `id`; new writes use it from now on.
    pub fn rotate(&self, id: KeyId, key: Key) {
        let mut ring = self.inner.write();
        ring.keys.insert(id, key);
        ring.current = id;
    }

    /// Forgets the key `id`, unless it is current. Returns whether it was
    /// forgotten.
    pub fn retire(&self, id: KeyId) -> bool {
        let mut ring = self.inner.write();
        ring.current != id && ring.keys.remove(&id).is_some()
    }

    /// The ids the ring holds, in order.
    #[must_use]
    pub fn ids(&self) -> Vec<KeyId> {
        self.inner.read().keys.keys().copied().collect()
    }
}

impl KeyProvider for Keyring {
    fn current(&self) -> io::Result<(KeyId, Key)> {
        let ring = self.inner.read();
        let key = ring.keys[&ring.current].clone();
        Ok((ring.current, key))
    }

    fn key(&self, id: KeyId) -> io::Result<Option<Key>> {
        Ok(self.inner.read().keys.get(&id).cloned())
    }
}

impl<P: KeyProvider> KeyProvider for Arc<P> {
    fn current(&self) -> io::Result<(KeyId, Key)> {
        (**self).current()
    }

    fn key(&self, id: KeyId) -> io::Result<Option<Key>> {
        (**self).key(id)
    }
}

/// Why sealed bytes could not be opened for want of the right key.
/// Carried inside an `io::Error` of kind `PermissionDenied`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    /// The provider has no key with this id.
    Missing(KeyId),
    /// The provider's key with this id is not the one the data was sealed
    /// with.
    Wrong(KeyId),
    /// The data is encrypted and no key provider was configured.
    NotConfigured,
    /// A key provider was configured for data that is not encrypted.
    NotEncrypted,
}

impl KeyError {
    /// This error as an `io::Error` of kind `PermissionDenied`, with
    /// `what` (a file name, say) in the message.
    #[must_use]
    pub fn into_io(self, what: impl fmt::Display) -> io::Error {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            Located {
                what: what.to_string(),
                error: self,
            },
        )
    }

    /// The `KeyError` inside `error`, if it is one this module made.
    #[must_use]
    pub fn of(error: &io::Error) -> Option<&KeyError> {
        let inner = error.get_ref()?;
        if let Some(located) = inner.downcast_ref::<Located>() {
            return Some(&located.error);
        }
        inner.downcast_ref::<KeyError>()
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing(id) => write!(
                f,
                "the key provider has no key for {id}, which the data was encrypted with"
            ),
            Self::Wrong(id) => write!(
                f,
                "the key provider's key for {id} is not the key the data was encrypted with"
            ),
            Self::NotConfigured => f.write_str("the data is encrypted and no key was given"),
            Self::NotEncrypted => f.write_str("a key was given but the data is not encrypted"),
        }
    }
}

impl std::error::Error for KeyError {}

#[derive(Debug)]
struct Located {
    what: String,
    error: KeyError,
}

impl fmt::Display for Located {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.what, self.error)
    }
}

impl std::error::Error for Located {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}
