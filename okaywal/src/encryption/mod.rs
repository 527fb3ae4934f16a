//! Encryption at rest: keys the application supplies, and the one
//! authenticated cipher every file format of this workspace uses.
//!
//! An application implements [`KeyProvider`] (or uses [`StaticKey`] for one
//! fixed key, or [`Keyring`] for rotation): it hands out the *current* key
//! with its [`KeyId`] for new writes, and any older key by id for reads, so
//! a KMS or an OS keyring plugs in. [`Cipher`] wraps a provider and seals
//! and opens byte ranges with AES-256-GCM (the RustCrypto `aes-gcm` crate)
//! under keys derived from the provider's with HKDF-SHA256:
//!
//! - **Authenticated**: every sealed range carries a 16-byte GCM tag over
//!   the ciphertext and caller-chosen *associated data*. Formats put where
//!   the bytes belong (file, generation, offset, record kind) in the
//!   associated data, so a changed byte, a block moved to another place, or
//!   a record of an older generation fails to open instead of being read.
//! - **No nonce is used twice**: a seal's 24-byte nonce is the cipher's
//!   *epoch* (16 random bytes from the operating system's generator, drawn
//!   once per [`Cipher`]) followed by a count of its seals. The bytes are
//!   sealed under the key HKDF-SHA256 derives from the provider's key and
//!   the epoch, with the count as the GCM nonce: within an epoch the count
//!   never repeats, and two epochs are equal only if two 128-bit random
//!   draws are. Rewriting a place (a recycled segment, a reused grain)
//!   takes the next count like any other seal, so no (key, nonce) pair
//!   repeats. The exact construction is in `FORMAT.md` ("Encrypted logs").
//! - **Keys never leak**: [`Key`] zeroes its bytes when dropped (`zeroize`),
//!   so do the derived keys and AES round keys, and no type here prints
//!   key bytes in `Debug` or `Display`.
//!
//! A wrong key is told apart from damage by a *key check*
//! ([`Cipher::key_check`]): a sealed, empty message stored once per file
//! header. If the header's checksum is right but its key check does not
//! open, the key is wrong ([`KeyError::Wrong`]); if the provider does not
//! have the key id at all, it is missing ([`KeyError::Missing`]). Both
//! reach callers as `io::Error`s of kind [`io::ErrorKind::PermissionDenied`]
//! whose inner error is a [`KeyError`], never as corruption.
//!
//! ```rust
//! use okaywal::encryption::{Cipher, Keyring, Key, KeyId};
//! use std::sync::{Arc, OnceLock};
//!
//! # fn main() -> std::io::Result<()> {
//! let ring = Arc::new(Keyring::new(KeyId::new(1), Key::from_bytes([7; 32])));
//! let cipher = Cipher::new(ring.clone());
//! let mut bytes = b"secret payload".to_vec();
//! let seal = cipher.seal(b"file 3, offset 4096", &mut bytes)?;
//! assert_ne!(&bytes[..], b"secret payload");
//!
//! // After rotation new seals use key 2 and key 1 still opens old data.
//! ring.rotate(KeyId::new(2), Key::from_bytes([9; 32]));
//! cipher.open(&seal, b"file 3, offset 4096", &mut bytes)?;
//! assert_eq!(&bytes[..], b"secret payload");
//! assert_eq!(cipher.current_key_id()?, KeyId::new(2));
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::io;
use std::sync::{Arc, OnceLock};

mod aead;
mod keys;

use aead::{epoch_of, Shared};

pub use keys::{Key, KeyError, KeyId, KeyProvider, Keyring, StaticKey};

/// Bytes in a key.
pub const KEY_BYTES: usize = 32;
/// Bytes in a nonce: the cipher's epoch (16) and the seal's count (8).
pub const NONCE_BYTES: usize = 24;
/// Bytes in an authentication tag.
pub const TAG_BYTES: usize = 16;
/// Bytes of a [`Seal`] written to disk: key id (4, little-endian), nonce
/// (24) and tag (16).
pub const SEAL_BYTES: usize = 4 + NONCE_BYTES + TAG_BYTES;

/// What opening sealed bytes needs besides the key: the key id, the nonce
/// and the tag. [`Seal::to_bytes`] is its [`SEAL_BYTES`]-byte form on disk.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Seal {
    /// The key the bytes were sealed with.
    pub key_id: KeyId,
    /// The nonce, never the same for two seals under one key.
    pub nonce: [u8; NONCE_BYTES],
    /// The authentication tag.
    pub tag: [u8; TAG_BYTES],
}

impl Seal {
    /// Key id (`u32` little-endian), nonce, tag.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; SEAL_BYTES] {
        let mut out = [0; SEAL_BYTES];
        out[..4].copy_from_slice(&self.key_id.0.to_le_bytes());
        out[4..4 + NONCE_BYTES].copy_from_slice(&self.nonce);
        out[4 + NONCE_BYTES..].copy_from_slice(&self.tag);
        out
    }

    /// The seal written by [`Seal::to_bytes`].
    #[must_use]
    pub fn from_bytes(bytes: &[u8; SEAL_BYTES]) -> Self {
        let mut nonce = [0; NONCE_BYTES];
        nonce.copy_from_slice(&bytes[4..4 + NONCE_BYTES]);
        let mut tag = [0; TAG_BYTES];
        tag.copy_from_slice(&bytes[4 + NONCE_BYTES..]);
        Self {
            key_id: KeyId(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])),
            nonce,
            tag,
        }
    }
}

impl fmt::Debug for Seal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Seal")
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

/// Why [`Cipher::open`] failed.
#[derive(Debug)]
pub enum OpenError {
    /// The key is missing (the provider has no such id).
    Key(KeyError),
    /// The bytes, the seal or the associated data are not what was sealed:
    /// damage, tampering or bytes from another place.
    Damaged,
    /// The provider failed.
    Provider(io::Error),
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Key(error) => error.fmt(f),
            Self::Damaged => f.write_str(
                "authentication failed: the encrypted bytes are damaged or not from this place",
            ),
            Self::Provider(error) => write!(f, "key provider failed: {error}"),
        }
    }
}

impl std::error::Error for OpenError {}

impl From<OpenError> for io::Error {
    /// `PermissionDenied` for a key error, `InvalidData` for damage, the
    /// provider's error as it is.
    fn from(error: OpenError) -> Self {
        match error {
            OpenError::Key(error) => io::Error::new(io::ErrorKind::PermissionDenied, error),
            OpenError::Damaged => io::Error::new(io::ErrorKind::InvalidData, OpenError::Damaged),
            OpenError::Provider(error) => error,
        }
    }
}

/// Seals and opens bytes with the keys of a [`KeyProvider`]. Cheap to
/// clone; shared by every thread of a log or store.
///
/// Each `Cipher` made by [`Cipher::new`] or [`Cipher::shared`] has its own
/// nonce epoch; its clones share it. A process that forks must not seal
/// with the same cipher in both processes (nor use one open log or store
/// in both, which their file locks do not allow either).
#[derive(Clone)]
pub struct Cipher {
    provider: Arc<dyn KeyProvider>,
    shared: Arc<Shared>,
}

impl fmt::Debug for Cipher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Cipher(AES-256-GCM)")
    }
}

/// Associated data of key checks, so a key check never opens as anything
/// else.
const KEY_CHECK_CONTEXT: &[u8] = b"okaywal key check v1";

impl Cipher {
    /// A cipher over `provider`.
    pub fn new(provider: impl KeyProvider) -> Self {
        Self::shared(Arc::new(provider))
    }

    /// A cipher over a shared provider.
    #[must_use]
    pub fn shared(provider: Arc<dyn KeyProvider>) -> Self {
        Self {
            provider,
            shared: Arc::default(),
        }
    }

    fn sealing_key(&self, id: KeyId, key: Key) -> SealingKey {
        SealingKey {
            id,
            key,
            shared: self.shared.clone(),
            sealing: OnceLock::new(),
        }
    }

    /// The provider's current key id.
    ///
    /// # Errors
    ///
    /// The provider's.
    pub fn current_key_id(&self) -> io::Result<KeyId> {
        Ok(self.provider.current()?.0)
    }

    /// The provider's current key, resolved once: [`SealingKey`] seals
    /// many ranges without asking the provider again.
    ///
    /// # Errors
    ///
    /// The provider's.
    pub fn current_key(&self) -> io::Result<SealingKey> {
        let (id, key) = self.provider.current()?;
        Ok(self.sealing_key(id, key))
    }

    /// The provider's key with id `id`, resolved once.
    ///
    /// # Errors
    ///
    /// [`KeyError::Missing`] inside an `io::Error` of kind
    /// `PermissionDenied` naming `what` if the provider does not have it;
    /// the provider's errors as they are.
    pub fn key_by_id(&self, id: KeyId, what: impl fmt::Display) -> io::Result<SealingKey> {
        match self.key(id) {
            Ok(key) => Ok(self.sealing_key(id, key)),
            Err(OpenError::Key(error)) => Err(error.into_io(what)),
            Err(error) => Err(error.into()),
        }
    }

    /// Encrypts `buffer` in place under the current key and the next nonce,
    /// authenticating `associated` with it.
    ///
    /// # Errors
    ///
    /// The provider's, or `InvalidInput` if `buffer` is too long for the
    /// cipher (over 64 GiB).
    pub fn seal(&self, associated: &[u8], buffer: &mut [u8]) -> io::Result<Seal> {
        self.current_key()?.seal(associated, buffer)
    }

    /// Decrypts `buffer` in place if `seal` and `associated` authenticate
    /// it; on failure `buffer`'s contents are unspecified.
    ///
    /// # Errors
    ///
    /// [`OpenError::Key`] with [`KeyError::Missing`] if the provider does
    /// not have the key; [`OpenError::Damaged`] if authentication fails.
    pub fn open(&self, seal: &Seal, associated: &[u8], buffer: &mut [u8]) -> Result<(), OpenError> {
        let key = self.key(seal.key_id)?;
        self.sealing_key(seal.key_id, key)
            .open(seal, associated, buffer)
    }

    fn key(&self, id: KeyId) -> Result<Key, OpenError> {
        match self.provider.key(id) {
            Ok(Some(key)) => Ok(key),
            Ok(None) => Err(OpenError::Key(KeyError::Missing(id))),
            Err(error) => Err(OpenError::Provider(error)),
        }
    }

    /// A key check for the current key: a seal of nothing, bound to
    /// `context` (a file's kind, say), that [`Cipher::verify_key_check`]
    /// opens only with the same key.
    ///
    /// # Errors
    ///
    /// The provider's.
    pub fn key_check(&self, context: &[u8]) -> io::Result<Seal> {
        self.current_key()?.key_check(context)
    }

    /// Whether the provider's key for `check.key_id` is the one that made
    /// `check`.
    ///
    /// # Errors
    ///
    /// [`KeyError::Missing`] or [`KeyError::Wrong`] inside an `io::Error`
    /// of kind `PermissionDenied` naming `what`; the provider's errors as
    /// they are.
    pub fn verify_key_check(
        &self,
        check: &Seal,
        context: &[u8],
        what: impl fmt::Display,
    ) -> io::Result<()> {
        let key = self.key_by_id(check.key_id, &what)?;
        key.verify_key_check(check, context, what)
    }
}

/// A key resolved from a [`KeyProvider`] once ([`Cipher::current_key`],
/// [`Cipher::key_by_id`]), with its id: it seals and opens many ranges
/// without asking the provider again. Its bytes are zeroed when it is
/// dropped and never printed.
///
/// ```rust
/// use okaywal::encryption::{Cipher, KeyId, StaticKey};
///
/// # fn main() -> std::io::Result<()> {
/// let cipher = Cipher::new(StaticKey::new([5; 32]));
/// let key = cipher.current_key()?;
/// assert_eq!(key.id(), KeyId::new(1));
/// let mut bytes = b"payload".to_vec();
/// let seal = key.seal(b"where", &mut bytes)?;
/// key.open(&seal, b"where", &mut bytes).unwrap();
/// assert_eq!(bytes, b"payload");
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct SealingKey {
    id: KeyId,
    key: Key,
    shared: Arc<Shared>,
    /// The epoch key this key seals with, derived at its first seal.
    sealing: OnceLock<Arc<aead::EpochKey>>,
}

impl fmt::Debug for SealingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SealingKey")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl SealingKey {
    /// The key's id.
    #[must_use]
    pub fn id(&self) -> KeyId {
        self.id
    }

    /// Encrypts `buffer` in place under this key and the cipher's next
    /// nonce, authenticating `associated` with it.
    ///
    /// # Errors
    ///
    /// The operating system's generator failed (at a cipher's first seal),
    /// or `buffer` is too long for the cipher (over 64 GiB:
    /// `InvalidInput`).
    pub fn seal(&self, associated: &[u8], buffer: &mut [u8]) -> io::Result<Seal> {
        let nonces = &self.shared.nonces;
        let epoch = nonces.epoch()?;
        let sealing = self
            .sealing
            .get_or_init(|| self.shared.epoch_key(self.id, &self.key, epoch));
        let nonce = nonces.next(epoch)?;
        let tag = sealing.seal(&nonce, associated, buffer)?;
        Ok(Seal {
            key_id: self.id,
            nonce,
            tag,
        })
    }

    /// Decrypts `buffer` in place if `seal` and `associated` authenticate
    /// it; on failure `buffer`'s contents are unspecified.
    ///
    /// # Errors
    ///
    /// [`OpenError::Damaged`] if authentication fails, or if `seal` names
    /// another key id than this key's.
    pub fn open(&self, seal: &Seal, associated: &[u8], buffer: &mut [u8]) -> Result<(), OpenError> {
        if seal.key_id != self.id {
            return Err(OpenError::Damaged);
        }
        let epoch = epoch_of(&seal.nonce);
        let opened = match self.sealing.get() {
            Some(sealing) if sealing.is_for(&self.key, epoch) => {
                sealing.open(&seal.nonce, &seal.tag, associated, buffer)
            }
            _ => self.shared.epoch_key(self.id, &self.key, epoch).open(
                &seal.nonce,
                &seal.tag,
                associated,
                buffer,
            ),
        };
        if opened {
            Ok(())
        } else {
            Err(OpenError::Damaged)
        }
    }

    /// A key check for this key (see [`Cipher::key_check`]).
    ///
    /// # Errors
    ///
    /// The operating system's generator failed.
    pub fn key_check(&self, context: &[u8]) -> io::Result<Seal> {
        let associated = [KEY_CHECK_CONTEXT, context].concat();
        self.seal(&associated, &mut [])
    }

    /// Whether this key made `check` (see [`Cipher::verify_key_check`]).
    ///
    /// # Errors
    ///
    /// [`KeyError::Wrong`] inside an `io::Error` of kind
    /// `PermissionDenied` naming `what` if it did not; [`KeyError::Missing`]
    /// the same way if `check` names another key id.
    pub fn verify_key_check(
        &self,
        check: &Seal,
        context: &[u8],
        what: impl fmt::Display,
    ) -> io::Result<()> {
        if check.key_id != self.id {
            return Err(KeyError::Missing(check.key_id).into_io(what));
        }
        let associated = [KEY_CHECK_CONTEXT, context].concat();
        match self.open(check, &associated, &mut []) {
            Ok(()) => Ok(()),
            Err(_) => Err(KeyError::Wrong(check.key_id).into_io(what)),
        }
    }
}

#[cfg(test)]
mod tests;
