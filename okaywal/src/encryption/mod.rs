//! Encryption at rest: keys the application supplies, and the one
//! authenticated cipher every file format of this workspace uses.
//!
//! An application implements [`KeyProvider`] (or uses [`StaticKey`] for one
//! fixed key, or [`Keyring`] for rotation): it hands out the *current* key
//! with its [`KeyId`] for new writes, and any older key by id for reads, so
//! a KMS or an OS keyring plugs in. [`Cipher`] wraps a provider and seals
//! and opens byte ranges with XChaCha20-Poly1305 (the RustCrypto
//! `chacha20poly1305` crate):
//!
//! - **Authenticated**: every sealed range carries a 16-byte Poly1305 tag
//!   over the ciphertext and caller-chosen *associated data*. Formats put
//!   where the bytes belong (file, generation, offset, record kind) in the
//!   associated data, so a changed byte, a block moved to another place, or
//!   a record of an older generation fails to open instead of being read.
//! - **No nonce is used twice**: every seal draws a fresh 192-bit nonce from
//!   the operating system's generator (`getrandom`). With 2^48 seals under
//!   one key, the chance that any two nonces are equal is below 2^-96;
//!   rewriting a place (a recycled segment, a reused grain) gets a new
//!   nonce like any other write, so no (key, nonce) pair repeats.
//! - **Keys never leak**: [`Key`] zeroes its bytes when dropped (`zeroize`),
//!   and no type here prints key bytes in `Debug` or `Display`.
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
//! use std::sync::Arc;
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
use std::sync::Arc;

use chacha20poly1305::aead::AeadInPlace;
use chacha20poly1305::XNonce;

mod keys;

pub use keys::{Key, KeyError, KeyId, KeyProvider, Keyring, StaticKey};

/// Bytes in a key.
pub const KEY_BYTES: usize = 32;
/// Bytes in a nonce (XChaCha20-Poly1305's extended nonce).
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
    /// The nonce, fresh for every seal.
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
#[derive(Clone)]
pub struct Cipher {
    provider: Arc<dyn KeyProvider>,
}

impl fmt::Debug for Cipher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Cipher(XChaCha20-Poly1305)")
    }
}

/// Associated data of key checks, so a key check never opens as anything
/// else.
const KEY_CHECK_CONTEXT: &[u8] = b"okaywal key check v1";

impl Cipher {
    /// A cipher over `provider`.
    pub fn new(provider: impl KeyProvider) -> Self {
        Self {
            provider: Arc::new(provider),
        }
    }

    /// A cipher over a shared provider.
    #[must_use]
    pub fn shared(provider: Arc<dyn KeyProvider>) -> Self {
        Self { provider }
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
        Ok(SealingKey { id, key })
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
            Ok(key) => Ok(SealingKey { id, key }),
            Err(OpenError::Key(error)) => Err(error.into_io(what)),
            Err(error) => Err(error.into()),
        }
    }

    /// Encrypts `buffer` in place under the current key and a fresh nonce,
    /// authenticating `associated` with it.
    ///
    /// # Errors
    ///
    /// The provider's, or `InvalidInput` if `buffer` is too long for the
    /// cipher (over 256 GiB).
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
        open_with(&key, seal, associated, buffer)
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

/// A nonce drawn from the operating system's generator for one seal.
///
/// It is neither `Clone` nor `Copy`, and [`SealingKey::seal_with`] takes
/// it by value: a nonce is used at most once. Drawing it apart from the
/// seal lets a caller draw it where a system call costs least (before
/// taking a lock, say) and seal later.
///
/// ```rust
/// use okaywal::encryption::{Cipher, FreshNonce, StaticKey};
///
/// # fn main() -> std::io::Result<()> {
/// let cipher = Cipher::new(StaticKey::new([3; 32]));
/// let key = cipher.current_key()?;
/// let [first, second] = FreshNonce::draw_many()?;
/// let mut a = *b"one";
/// let mut b = *b"two";
/// let seal_a = key.seal_with(first, b"place a", &mut a)?;
/// let seal_b = key.seal_with(second, b"place b", &mut b)?;
/// assert_ne!(seal_a.nonce, seal_b.nonce);
/// # Ok(())
/// # }
/// ```
pub struct FreshNonce([u8; NONCE_BYTES]);

impl FreshNonce {
    /// One nonce.
    ///
    /// # Errors
    ///
    /// The operating system's generator failed.
    pub fn draw() -> io::Result<Self> {
        let [nonce] = Self::draw_many()?;
        Ok(nonce)
    }

    /// `N` nonces from one call to the generator.
    ///
    /// # Errors
    ///
    /// The operating system's generator failed.
    pub fn draw_many<const N: usize>() -> io::Result<[Self; N]> {
        let mut bytes = [[0_u8; NONCE_BYTES]; N];
        getrandom::fill(bytes.as_flattened_mut()).map_err(|error| {
            io::Error::other(format!(
                "the operating system's random generator failed: {error}"
            ))
        })?;
        Ok(bytes.map(Self))
    }
}

impl fmt::Debug for FreshNonce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FreshNonce")
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

    /// Encrypts `buffer` in place under this key and a fresh nonce,
    /// authenticating `associated` with it.
    ///
    /// # Errors
    ///
    /// The operating system's generator failed, or `buffer` is too long
    /// for the cipher (over 256 GiB: `InvalidInput`).
    pub fn seal(&self, associated: &[u8], buffer: &mut [u8]) -> io::Result<Seal> {
        self.seal_with(FreshNonce::draw()?, associated, buffer)
    }

    /// [`SealingKey::seal`] with a nonce drawn beforehand.
    ///
    /// # Errors
    ///
    /// `InvalidInput` if `buffer` is too long for the cipher (over
    /// 256 GiB).
    pub fn seal_with(
        &self,
        nonce: FreshNonce,
        associated: &[u8],
        buffer: &mut [u8],
    ) -> io::Result<Seal> {
        let tag = self
            .key
            .cipher()
            .encrypt_in_place_detached(XNonce::from_slice(&nonce.0), associated, buffer)
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "too many bytes to encrypt at once",
                )
            })?;
        Ok(Seal {
            key_id: self.id,
            nonce: nonce.0,
            tag: tag.into(),
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
        open_with(&self.key, seal, associated, buffer)
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
        match open_with(&self.key, check, &associated, &mut []) {
            Ok(()) => Ok(()),
            Err(_) => Err(KeyError::Wrong(check.key_id).into_io(what)),
        }
    }
}

fn open_with(
    key: &Key,
    seal: &Seal,
    associated: &[u8],
    buffer: &mut [u8],
) -> Result<(), OpenError> {
    key.cipher()
        .decrypt_in_place_detached(
            XNonce::from_slice(&seal.nonce),
            associated,
            buffer,
            (&seal.tag).into(),
        )
        .map_err(|_| OpenError::Damaged)
}

#[cfg(test)]
mod tests;
