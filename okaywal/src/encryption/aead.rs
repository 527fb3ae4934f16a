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
//! Two implementations of AES-256-GCM do the work, both RustCrypto's
//! `aes-gcm`: ranges shorter than [`SHORT_RANGE`] go through the 0.10
//! release line, longer ones through 0.11. They compute the same function
//! (a seal of one opens with the other), and each is faster where it is
//! used: 0.11 hashes several blocks at once, 0.10 costs less per call.
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
use aes_gcm_short::aead::AeadInPlace as _;
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

/// Ranges (plaintext or ciphertext) shorter than this many bytes are
/// sealed and opened by `aes-gcm` 0.10, longer ones by 0.11. Measured on
/// an x86-64 machine with VAES-512, 0.10 against 0.11 per seal: 0.13
/// against 0.35 us at 16 bytes, 0.18 against 0.37–0.46 us at 20, 0.51
/// against 0.57–0.59 us at 512, about even from 768 bytes, and 1.27
/// against 1.14 us at 1.5 KiB.
pub(super) const SHORT_RANGE: usize = 768;

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
    /// Ranges of [`SHORT_RANGE`] bytes and more.
    aead: Aes256Gcm,
    /// Shorter ranges.
    short: aes_gcm_short::Aes256Gcm,
}

impl EpochKey {
    fn derive(key: &Key, epoch: &Epoch) -> Self {
        let mut okm = Zeroizing::new([0_u8; KEY_BYTES]);
        let info = [DERIVE_INFO, epoch].concat();
        Hkdf::<Sha256>::new(Some(DERIVE_SALT), key.secret())
            .expand(&info, &mut *okm)
            .expect("32 bytes is a valid HKDF-SHA256 length");
        let short_key = aes_gcm_short::Key::<aes_gcm_short::Aes256Gcm>::from_slice(&*okm);
        Self {
            epoch: *epoch,
            source: key.clone(),
            aead: Aes256Gcm::new((&*okm).into()),
            short: aes_gcm_short::KeyInit::new(short_key),
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
        let nonce = gcm_nonce(nonce);
        if buffer.len() < SHORT_RANGE {
            return self
                .short
                .encrypt_in_place_detached(
                    aes_gcm_short::Nonce::from_slice(&nonce),
                    associated,
                    buffer,
                )
                .map(Into::into)
                .map_err(|_| io::Error::other("a short range failed to seal"));
        }
        self.aead
            .encrypt_inout_detached(&nonce.into(), associated, buffer.into())
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
        let nonce = gcm_nonce(nonce);
        if buffer.len() < SHORT_RANGE {
            return self
                .short
                .decrypt_in_place_detached(
                    aes_gcm_short::Nonce::from_slice(&nonce),
                    associated,
                    buffer,
                    aes_gcm_short::Tag::from_slice(tag),
                )
                .is_ok();
        }
        self.aead
            .decrypt_inout_detached(&nonce.into(), associated, buffer.into(), tag.into())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Seals `plain` with `associated` under `nonce` through both
    /// implementations, whatever the length.
    fn both(key: &EpochKey, nonce: [u8; 12], associated: &[u8], plain: &[u8]) -> [Vec<u8>; 2] {
        let mut long = plain.to_vec();
        let long_tag = key
            .aead
            .encrypt_inout_detached(&nonce.into(), associated, (&mut long[..]).into())
            .expect("seal");
        let mut short = plain.to_vec();
        let short_tag = key
            .short
            .encrypt_in_place_detached(
                aes_gcm_short::Nonce::from_slice(&nonce),
                associated,
                &mut short,
            )
            .expect("seal");
        long.extend_from_slice(&long_tag);
        short.extend_from_slice(&short_tag);
        [long, short]
    }

    #[test]
    fn short_and_long_ranges_are_the_same_cipher() {
        let key = EpochKey::derive(&Key::from_bytes([3; 32]), &[9; EPOCH_BYTES]);
        for len in [
            0, 1, 15, 16, 17, 20, 31, 64, 100, 767, 768, 769, 1024, 4096, 5000,
        ] {
            let plain: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
            for associated in [&b""[..], b"x", &[5; 62], &[6; 100]] {
                let mut nonce = [0_u8; 12];
                nonce[4..].copy_from_slice(&(len as u64).to_le_bytes());
                let [long, short] = both(&key, nonce, associated, &plain);
                assert_eq!(long, short, "length {len}, associated {}", associated.len());
                if len > 0 {
                    assert_ne!(long[..len], plain[..], "length {len} was not encrypted");
                }
            }
        }
    }

    #[test]
    fn seals_open_at_either_side_of_the_threshold_and_fail_when_changed() {
        let key = EpochKey::derive(&Key::from_bytes([4; 32]), &[1; EPOCH_BYTES]);
        let mut nonce = [0_u8; NONCE_BYTES];
        for len in [0, 20, SHORT_RANGE - 1, SHORT_RANGE, SHORT_RANGE + 1] {
            nonce[EPOCH_BYTES] = nonce[EPOCH_BYTES].wrapping_add(1);
            let plain = vec![0x5a_u8; len];
            let mut bytes = plain.clone();
            let tag = key.seal(&nonce, b"place", &mut bytes).expect("seal");
            let mut opened = bytes.clone();
            assert!(
                key.open(&nonce, &tag, b"place", &mut opened),
                "length {len}"
            );
            assert_eq!(opened, plain);
            assert!(!key.open(&nonce, &tag, b"other", &mut bytes.clone()));
            if len > 0 {
                let mut changed = bytes.clone();
                changed[len / 2] ^= 1;
                assert!(
                    !key.open(&nonce, &tag, b"place", &mut changed),
                    "length {len}"
                );
            }
            let mut bad_tag = tag;
            bad_tag[0] ^= 0x80;
            assert!(!key.open(&nonce, &bad_tag, b"place", &mut bytes));
        }
    }
}
