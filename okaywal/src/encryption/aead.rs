//! The authenticated cipher behind every seal: AES-256-GCM (RustCrypto's
//! `aes-gcm`) under a key derived for each *epoch*, with nonces that count.
//!
//! A seal's 24-byte nonce is an epoch (16 bytes from the operating
//! system's generator, drawn once per [`Cipher`](super::Cipher) at its
//! first seal) followed by a counter (u64, little-endian) that the cipher
//! takes one step for every seal. The bytes are sealed with AES-256-GCM
//! under the *epoch key*, HKDF-SHA256 of the provider's key (salt
//! [`DERIVE_SALT`], info [`DERIVE_INFO`] followed by the epoch), and the
//! 12-byte GCM nonce is four zero bytes followed by the counter.
//!
//! Why no (key, nonce) pair repeats: within one epoch the counter never
//! does (it stops, with an error, before it would wrap); two epochs are
//! equal only if two 128-bit random draws are (below 2^-64 among 2^32
//! ciphers); and different epochs give unrelated epoch keys. Rewriting a
//! place (a recycled segment, a reused grain) takes the next count like
//! any other seal.
//!
//! Each epoch key is derived once and kept: the sealing one in the
//! [`SealingKey`](super::SealingKey), those of older epochs (files another
//! run wrote) in a small table shared by the cipher's clones.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use aes_gcm::aead::AeadInOut;
use aes_gcm::{Aes256Gcm, KeyInit};
use hkdf::Hkdf;
use parking_lot::RwLock;
use sha2::Sha256;
use zeroize::Zeroizing;

use super::{Key, KeyId, KEY_BYTES, NONCE_BYTES, TAG_BYTES};

/// Bytes of a nonce's epoch; the rest (8 bytes) is the counter.
pub(super) const EPOCH_BYTES: usize = 16;
/// HKDF's salt for epoch keys.
pub(super) const DERIVE_SALT: &[u8] = b"okaywal aes-256-gcm v2";
/// HKDF's info for epoch keys, followed by the epoch.
pub(super) const DERIVE_INFO: &[u8] = b"okaywal epoch key";
/// Epoch keys of older epochs kept at most; the table starts again when
/// it is full (a store written by many runs only derives again).
const MAX_KEPT: usize = 256;

/// An epoch.
pub(super) type Epoch = [u8; EPOCH_BYTES];

/// The nonces of one cipher: its epoch and the count of seals.
#[derive(Default)]
pub(super) struct Nonces {
    epoch: OnceLock<Epoch>,
    counter: AtomicU64,
}

impl Nonces {
    /// The epoch, drawn at the first call.
    pub fn epoch(&self) -> io::Result<&Epoch> {
        if let Some(epoch) = self.epoch.get() {
            return Ok(epoch);
        }
        let mut drawn = [0_u8; EPOCH_BYTES];
        getrandom::fill(&mut drawn).map_err(|error| {
            io::Error::other(format!(
                "the operating system's random generator failed: {error}"
            ))
        })?;
        // A thread that lost the race uses the winner's epoch.
        Ok(self.epoch.get_or_init(|| drawn))
    }

    /// The next nonce of `epoch` (this cipher's).
    pub fn next(&self, epoch: &Epoch) -> io::Result<[u8; NONCE_BYTES]> {
        let count = self
            .counter
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_add(1))
            .map_err(|_| io::Error::other("the cipher has used every nonce of its epoch"))?;
        let mut nonce = [0_u8; NONCE_BYTES];
        nonce[..EPOCH_BYTES].copy_from_slice(epoch);
        nonce[EPOCH_BYTES..].copy_from_slice(&count.to_le_bytes());
        Ok(nonce)
    }
}

/// The epoch of a nonce.
pub(super) fn epoch_of(nonce: &[u8; NONCE_BYTES]) -> &Epoch {
    nonce[..EPOCH_BYTES].try_into().expect("16 bytes")
}

/// One epoch key: AES-256-GCM under HKDF-SHA256(key, epoch).
pub(super) struct EpochKey {
    epoch: Epoch,
    /// The provider's key it was derived from, to tell a provider that
    /// changed a key's bytes under the same id.
    source: Key,
    aead: Aes256Gcm,
}

impl EpochKey {
    fn derive(key: &Key, epoch: &Epoch) -> Self {
        let mut okm = Zeroizing::new([0_u8; KEY_BYTES]);
        let info = [DERIVE_INFO, epoch].concat();
        Hkdf::<Sha256>::new(Some(DERIVE_SALT), key.secret())
            .expand(&info, &mut *okm)
            .expect("32 bytes is a valid HKDF-SHA256 length");
        Self {
            epoch: *epoch,
            source: key.clone(),
            aead: Aes256Gcm::new((&*okm).into()),
        }
    }

    /// Whether this is the epoch key of `key` and `epoch`.
    pub fn is_for(&self, key: &Key, epoch: &Epoch) -> bool {
        self.epoch == *epoch && self.source.secret() == key.secret()
    }

    /// Encrypts `buffer` in place under `nonce` (of this epoch); returns
    /// the tag.
    pub fn seal(
        &self,
        nonce: &[u8; NONCE_BYTES],
        associated: &[u8],
        buffer: &mut [u8],
    ) -> io::Result<[u8; TAG_BYTES]> {
        self.aead
            .encrypt_inout_detached(&gcm_nonce(nonce).into(), associated, buffer.into())
            .map(Into::into)
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "too many bytes to encrypt at once",
                )
            })
    }

    /// Decrypts `buffer` in place if `tag` authenticates it with
    /// `associated` under `nonce`.
    pub fn open(
        &self,
        nonce: &[u8; NONCE_BYTES],
        tag: &[u8; TAG_BYTES],
        associated: &[u8],
        buffer: &mut [u8],
    ) -> bool {
        self.aead
            .decrypt_inout_detached(
                &gcm_nonce(nonce).into(),
                associated,
                buffer.into(),
                tag.into(),
            )
            .is_ok()
    }
}

/// The 12-byte GCM nonce of a 24-byte nonce: four zero bytes, then the
/// counter.
fn gcm_nonce(nonce: &[u8; NONCE_BYTES]) -> [u8; 12] {
    let mut out = [0_u8; 12];
    out[4..].copy_from_slice(&nonce[EPOCH_BYTES..]);
    out
}

/// What the clones of one cipher share: its nonces and the epoch keys it
/// has derived.
#[derive(Default)]
pub(super) struct Shared {
    pub nonces: Nonces,
    kept: RwLock<HashMap<(KeyId, Epoch), Arc<EpochKey>>>,
}

impl Shared {
    /// The epoch key of key `id` (`key`) and `epoch`, derived at most once
    /// while it is kept.
    pub fn epoch_key(&self, id: KeyId, key: &Key, epoch: &Epoch) -> Arc<EpochKey> {
        if let Some(found) = self.kept.read().get(&(id, *epoch)) {
            if found.is_for(key, epoch) {
                return found.clone();
            }
        }
        let derived = Arc::new(EpochKey::derive(key, epoch));
        let mut kept = self.kept.write();
        if kept.len() >= MAX_KEPT {
            kept.clear();
        }
        kept.insert((id, *epoch), derived.clone());
        derived
    }
}
