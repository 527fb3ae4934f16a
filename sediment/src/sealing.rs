//! Encryption at rest for one store: every unit sediment seals, the
//! associated data that binds it to its place, and the key checks that
//! tell a wrong key from damage. The cipher is okaywal's
//! ([`okaywal::encryption::Cipher`], AES-256-GCM with a nonce never used
//! twice under a key); the byte positions are `format`'s.
//!
//! Every unit's associated data starts with what it is (a fixed label)
//! and the store's random id, then says where it belongs:
//!
//! | unit | bound to |
//! | --- | --- |
//! | grain header | grain id (basin, stratum, index, count) |
//! | blob chunk | grain id, the writing sequence, the blob's length, the chunk number |
//! | stratum header body | basin, stratum number, header copy |
//! | stamp page | basin, stratum number, header copy, page, the generation that wrote it |
//! | index body | header copy (the store id is inside it) |
//! | commit frame length / record | commit log file, frame offset (and the record's length) |
//! | rekey journal | the store |
//!
//! So a changed byte, a unit moved to another place or file, or a stamp
//! page of another generation fails to open and is reported as damage. An
//! old copy of a grain that was freed and reused opens (it was sealed for
//! that place), but its sequence is not the one the stratum's stamps
//! record: readers compare the two.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use okaywal::encryption::{Cipher, Key, KeyError, KeyId, KeyProvider, OpenError, Seal, SEAL_BYTES};
use parking_lot::Mutex;

use crate::format::{
    encode_envelope, sealed_chunk_span, sealed_chunks, sealed_image_len, Envelope, GrainHeader,
    MAX_KEY_CHECKS, SEALED_IMAGE_HEAD, STAMPS_PER_PAGE, STAMP_PAGE_BYTES,
};
use crate::grain_id::GrainId;

/// Key check context of index header copies.
pub(crate) const INDEX_CHECK: &[u8] = b"sediment index";
/// Key check context of stratum header copies.
pub(crate) const STRATUM_CHECK: &[u8] = b"sediment stratum header";

/// A provider shared between the store and its WAL.
#[derive(Clone)]
pub(crate) struct SharedProvider(pub Arc<dyn KeyProvider>);

impl fmt::Debug for SharedProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SharedProvider")
    }
}

impl KeyProvider for SharedProvider {
    fn current(&self) -> io::Result<(KeyId, Key)> {
        self.0.current()
    }

    fn key(&self, id: KeyId) -> io::Result<Option<Key>> {
        self.0.key(id)
    }
}

/// The provider's key `id` presented as the current one, to make a key
/// check for a key that is no longer current.
struct Pinned {
    provider: Arc<dyn KeyProvider>,
    id: KeyId,
}

impl KeyProvider for Pinned {
    fn current(&self) -> io::Result<(KeyId, Key)> {
        match self.provider.key(self.id)? {
            Some(key) => Ok((self.id, key)),
            None => Err(KeyError::Missing(self.id).into_io("making a key check")),
        }
    }

    fn key(&self, id: KeyId) -> io::Result<Option<Key>> {
        self.provider.key(id)
    }
}

/// Why a sealed unit did not open.
#[derive(Debug)]
pub(crate) enum Unsealed {
    /// Its bytes, seal or place are not what was sealed: damage.
    Damaged,
    /// The key is missing, or the provider failed: an `io::Error` of kind
    /// `PermissionDenied` carrying a [`KeyError`], or the provider's.
    Key(io::Error),
}

impl Unsealed {
    fn from_open(error: OpenError, what: &dyn fmt::Display) -> Self {
        match error {
            OpenError::Damaged => Unsealed::Damaged,
            OpenError::Key(key) => Unsealed::Key(key.into_io(what)),
            OpenError::Provider(error) => Unsealed::Key(error),
        }
    }
}

/// Associated data: a label, the store id, then fields.
struct Ad(Vec<u8>);

impl Ad {
    fn new(label: &[u8], store: &[u8; 16]) -> Self {
        let mut bytes = Vec::with_capacity(label.len() + 64);
        bytes.extend_from_slice(label);
        bytes.push(0);
        bytes.extend_from_slice(store);
        Self(bytes)
    }

    fn u64(mut self, value: u64) -> Self {
        self.0.extend_from_slice(&value.to_le_bytes());
        self
    }
}

/// The sealing context of an encrypted store: its cipher, its id and the
/// key checks of the key ids its files may be sealed with.
pub(crate) struct Sealer {
    provider: Arc<dyn KeyProvider>,
    cipher: Cipher,
    store_id: [u8; 16],
    /// A key check per key id the store has sealed with (written into the
    /// index, verified at open).
    checks: Mutex<BTreeMap<KeyId, Seal>>,
    /// The last key id noted, plus one (0: none), so that sealing skips
    /// the lock while the key does not change.
    noted: AtomicU64,
}

impl fmt::Debug for Sealer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sealer")
            .field("key_ids", &self.checks.lock().keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Sealer {
    /// The sealing context of the store `store_id`, whose index lists
    /// `checks`; the current key gets a check too.
    pub fn new(
        provider: Arc<dyn KeyProvider>,
        store_id: [u8; 16],
        checks: &[Seal],
    ) -> io::Result<Self> {
        let sealer = Self {
            cipher: Cipher::shared(provider.clone()),
            provider,
            store_id,
            checks: Mutex::new(checks.iter().map(|check| (check.key_id, *check)).collect()),
            noted: AtomicU64::new(0),
        };
        let current = sealer.cipher.current_key_id()?;
        sealer.note(current)?;
        Ok(sealer)
    }

    /// A new random store id.
    pub fn new_store_id() -> io::Result<[u8; 16]> {
        let mut id = [0; 16];
        getrandom::fill(&mut id).map_err(|error| {
            io::Error::other(format!(
                "the operating system's random generator failed: {error}"
            ))
        })?;
        Ok(id)
    }

    /// The key provider.
    pub fn provider(&self) -> &Arc<dyn KeyProvider> {
        &self.provider
    }

    /// The store's id.
    pub fn store_id(&self) -> [u8; 16] {
        self.store_id
    }

    /// The provider's current key id.
    pub fn current_key_id(&self) -> io::Result<KeyId> {
        self.cipher.current_key_id()
    }

    /// Records that something was sealed with `id`: the index will carry
    /// a key check for it.
    fn note(&self, id: KeyId) -> io::Result<()> {
        let tag = u64::from(id.get()) + 1;
        if self.noted.load(Ordering::Acquire) == tag {
            return Ok(());
        }
        let mut checks = self.checks.lock();
        if let std::collections::btree_map::Entry::Vacant(entry) = checks.entry(id) {
            let pinned = Cipher::new(Pinned {
                provider: self.provider.clone(),
                id,
            });
            entry.insert(pinned.key_check(INDEX_CHECK)?);
        }
        self.noted.store(tag, Ordering::Release);
        Ok(())
    }

    /// The key checks to write into the index (at most
    /// [`MAX_KEY_CHECKS`]; the highest ids if there are more).
    pub fn key_checks(&self) -> Vec<Seal> {
        let checks = self.checks.lock();
        let skip = checks.len().saturating_sub(MAX_KEY_CHECKS);
        checks.values().skip(skip).copied().collect()
    }

    /// Keeps the key checks of the ids `keep` says are still in use (and
    /// of the current key).
    pub fn retain_key_checks(&self, keep: impl Fn(KeyId) -> bool) -> io::Result<()> {
        let current = self.current_key_id()?;
        self.checks
            .lock()
            .retain(|id, _| *id == current || keep(*id));
        self.noted.store(0, Ordering::Release);
        Ok(())
    }

    /// Checks that the provider has the right key for every check the
    /// index lists; `what` names the index file.
    pub fn verify_key_checks(
        provider: &Arc<dyn KeyProvider>,
        checks: &[Seal],
        what: &dyn fmt::Display,
    ) -> io::Result<()> {
        let cipher = Cipher::shared(provider.clone());
        for check in checks {
            cipher.verify_key_check(check, INDEX_CHECK, what)?;
        }
        Ok(())
    }

    fn seal(&self, ad: &Ad, buffer: &mut [u8]) -> io::Result<Seal> {
        let seal = self.cipher.seal(&ad.0, buffer)?;
        self.note(seal.key_id)?;
        Ok(seal)
    }

    /// Opens `buffer` in place. A key id that neither the provider nor
    /// the store's key checks know is a damaged seal, not a missing key:
    /// every key the store's files need was checked at open.
    fn open(
        &self,
        seal: &Seal,
        ad: &Ad,
        buffer: &mut [u8],
        what: &dyn fmt::Display,
    ) -> Result<KeyId, Unsealed> {
        match self.cipher.open(seal, &ad.0, buffer) {
            Ok(()) => Ok(seal.key_id),
            Err(OpenError::Key(KeyError::Missing(id))) if !self.checks.lock().contains_key(&id) => {
                Err(Unsealed::Damaged)
            }
            Err(error) => Err(Unsealed::from_open(error, what)),
        }
    }

    // --- Blob images -------------------------------------------------

    fn head_ad(&self, id: GrainId) -> Ad {
        Ad::new(b"sediment grain header", &self.store_id).u64(id.as_u64())
    }

    fn chunk_ad(&self, id: GrainId, header: &GrainHeader, chunk: u64) -> Ad {
        Ad::new(b"sediment grain chunk", &self.store_id)
            .u64(id.as_u64())
            .u64(header.sequence)
            .u64(u64::from(header.length))
            .u64(chunk)
    }

    /// Appends `plain` sealed with `ad` to `out`: the seal, then the
    /// ciphertext (encrypted in place there).
    fn push_sealed(&self, ad: &Ad, plain: &[u8], out: &mut Vec<u8>) -> io::Result<()> {
        let at = out.len();
        out.resize(at + SEAL_BYTES, 0);
        out.extend_from_slice(plain);
        let seal = self.seal(ad, &mut out[at + SEAL_BYTES..])?;
        out[at..at + SEAL_BYTES].copy_from_slice(&seal.to_bytes());
        Ok(())
    }

    /// Seals the image of a blob (`header` describes `data`) for grain
    /// `id`, handing it to `emit` in pieces of about 1 MiB with their
    /// offset in the image.
    pub fn seal_image(
        &self,
        id: GrainId,
        header: &GrainHeader,
        data: &[u8],
        mut emit: impl FnMut(u64, &[u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        const BATCH: usize = 1 << 20;
        let len = data.len() as u64;
        let mut out = Vec::with_capacity(
            (sealed_image_len(len).unwrap_or(u64::MAX) as usize).min(BATCH + (80 << 10)),
        );
        self.push_sealed(&self.head_ad(id), &header.encode(), &mut out)?;
        let mut out_at = 0_u64;
        for chunk in 0..sealed_chunks(len) {
            let (offset, _) = sealed_chunk_span(len, chunk);
            if out.len() >= BATCH {
                emit(out_at, &out)?;
                out.clear();
                out_at = offset;
            }
            self.push_chunk(id, header, data, chunk, &mut out)?;
        }
        emit(out_at, &out)
    }

    /// Appends chunk `chunk` of the image of `data` to `out`.
    fn push_chunk(
        &self,
        id: GrainId,
        header: &GrainHeader,
        data: &[u8],
        chunk: u64,
        out: &mut Vec<u8>,
    ) -> io::Result<()> {
        let (_, plain) = sealed_chunk_span(data.len() as u64, chunk);
        let from = (chunk * crate::format::SEALED_CHUNK) as usize;
        self.push_sealed(
            &self.chunk_ad(id, header, chunk),
            &data[from..from + plain],
            out,
        )
    }

    /// The whole image of a blob, as [`Sealer::seal_image`] makes it.
    #[cfg(test)]
    pub fn image(&self, id: GrainId, header: &GrainHeader, data: &[u8]) -> io::Result<Vec<u8>> {
        let mut image = Vec::new();
        self.append_image(id, header, data, &mut image)?;
        Ok(image)
    }

    /// Appends the whole image of a blob, as [`Sealer::seal_image`] makes
    /// it, to `out`: sealed in place there, with no copy in between.
    pub fn append_image(
        &self,
        id: GrainId,
        header: &GrainHeader,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> io::Result<()> {
        let len = data.len() as u64;
        out.reserve(sealed_image_len(len).unwrap_or(0) as usize);
        self.push_sealed(&self.head_ad(id), &header.encode(), out)?;
        for chunk in 0..sealed_chunks(len) {
            self.push_chunk(id, header, data, chunk, out)?;
        }
        Ok(())
    }

    /// Opens the first [`SEALED_IMAGE_HEAD`] bytes of an image of grain
    /// `id` in place: the grain header and the key id it was sealed with.
    pub fn open_image_head(
        &self,
        id: GrainId,
        piece: &mut [u8],
        what: &dyn fmt::Display,
    ) -> Result<(GrainHeader, KeyId), Unsealed> {
        if piece.len() < SEALED_IMAGE_HEAD as usize {
            return Err(Unsealed::Damaged);
        }
        let seal = seal_at(piece);
        let key_id = self.open(
            &seal,
            &self.head_ad(id),
            &mut piece[SEAL_BYTES..SEALED_IMAGE_HEAD as usize],
            what,
        )?;
        let header = GrainHeader::decode(&piece[SEAL_BYTES..]).ok_or(Unsealed::Damaged)?;
        Ok((header, key_id))
    }

    /// Opens chunk `chunk` of the blob `header` describes, at grain `id`,
    /// in place: `piece` is its seal and ciphertext, and holds the
    /// plaintext after the seal on success.
    pub fn open_image_chunk(
        &self,
        id: GrainId,
        header: &GrainHeader,
        chunk: u64,
        piece: &mut [u8],
        what: &dyn fmt::Display,
    ) -> Result<KeyId, Unsealed> {
        if piece.len() < SEAL_BYTES {
            return Err(Unsealed::Damaged);
        }
        let seal = seal_at(piece);
        self.open(
            &seal,
            &self.chunk_ad(id, header, chunk),
            &mut piece[SEAL_BYTES..],
            what,
        )
    }

    /// Opens a whole image of grain `id` (at least as long as the blob's
    /// image; what follows is ignored): its grain header, the blob, and
    /// the key ids of its pieces.
    pub fn open_image(
        &self,
        id: GrainId,
        image: &[u8],
        what: &dyn fmt::Display,
    ) -> Result<(GrainHeader, Vec<u8>, BTreeSet<KeyId>), Unsealed> {
        let mut head = image
            .get(..SEALED_IMAGE_HEAD as usize)
            .ok_or(Unsealed::Damaged)?
            .to_vec();
        let (header, key_id) = self.open_image_head(id, &mut head, what)?;
        let len = u64::from(header.length);
        let mut key_ids = BTreeSet::from([key_id]);
        let mut data = Vec::with_capacity(header.length as usize);
        for chunk in 0..sealed_chunks(len) {
            let (at, plain) = sealed_chunk_span(len, chunk);
            let mut piece = image
                .get(at as usize..at as usize + SEAL_BYTES + plain)
                .ok_or(Unsealed::Damaged)?
                .to_vec();
            key_ids.insert(self.open_image_chunk(id, &header, chunk, &mut piece, what)?);
            data.extend_from_slice(&piece[SEAL_BYTES..]);
        }
        Ok((header, data, key_ids))
    }

    /// Seals again, under the current key, a piece of an image of grain
    /// `id` (its head if `chunk` is `None`, else that chunk of the blob
    /// `header` describes) that was sealed under another key: `Ok(true)`
    /// if `piece` was rewritten, `Ok(false)` if it was under the current
    /// key already.
    pub fn reseal_image_piece(
        &self,
        id: GrainId,
        header: &GrainHeader,
        chunk: Option<u64>,
        piece: &mut [u8],
        current: KeyId,
        what: &dyn fmt::Display,
    ) -> Result<bool, Unsealed> {
        if piece.len() < SEAL_BYTES {
            return Err(Unsealed::Damaged);
        }
        let seal = seal_at(piece);
        if seal.key_id == current {
            return Ok(false);
        }
        let ad = match chunk {
            None => self.head_ad(id),
            Some(chunk) => self.chunk_ad(id, header, chunk),
        };
        self.open(&seal, &ad, &mut piece[SEAL_BYTES..], what)?;
        let seal = self
            .seal(&ad, &mut piece[SEAL_BYTES..])
            .map_err(Unsealed::Key)?;
        piece[..SEAL_BYTES].copy_from_slice(&seal.to_bytes());
        Ok(true)
    }

    // --- Headers -----------------------------------------------------

    fn index_ad(&self, slot: u64) -> Ad {
        // The store id is inside the body; the index binds only its copy.
        Ad::new(b"sediment index", &[0; 16]).u64(slot)
    }

    fn stratum_ad(&self, basin: u8, number: u32, slot: u64) -> Ad {
        Ad::new(b"sediment stratum header", &self.store_id)
            .u64(u64::from(basin))
            .u64(u64::from(number))
            .u64(slot)
    }

    fn page_ad(&self, place: &PagePlace) -> Ad {
        Ad::new(b"sediment stamp page", &self.store_id)
            .u64(u64::from(place.basin))
            .u64(u64::from(place.number))
            .u64(place.slot)
            .u64(u64::from(place.page))
            .u64(place.version)
    }

    fn seal_envelope(
        &self,
        magic: [u8; 8],
        check: &[u8],
        ad: &Ad,
        mut body: Vec<u8>,
    ) -> io::Result<Vec<u8>> {
        let body_seal = self.seal(ad, &mut body)?;
        // The key check by the same key as the body.
        let pinned = Cipher::new(Pinned {
            provider: self.provider.clone(),
            id: body_seal.key_id,
        });
        let key_check = pinned.key_check(check)?;
        Ok(encode_envelope(magic, &key_check, &body_seal, &body))
    }

    /// A sealed index header copy for `slot` holding `body` (the plaintext
    /// body of a `SealedIndex`).
    pub fn seal_index(&self, slot: u64, body: Vec<u8>) -> io::Result<Vec<u8>> {
        self.seal_envelope(
            crate::format::INDEX_MAGIC_BYTES,
            INDEX_CHECK,
            &self.index_ad(slot),
            body,
        )
    }

    /// Opens the body of a sealed index header copy of `slot`; a key
    /// check that fails is a key error naming `what`, a body that then
    /// does not open is damage.
    pub fn open_index(
        provider: &Arc<dyn KeyProvider>,
        envelope: &Envelope,
        slot: u64,
        what: &dyn fmt::Display,
    ) -> Result<(Vec<u8>, KeyId), Unsealed> {
        let cipher = Cipher::shared(provider.clone());
        cipher
            .verify_key_check(&envelope.key_check, INDEX_CHECK, what)
            .map_err(Unsealed::Key)?;
        if envelope.body_seal.key_id != envelope.key_check.key_id {
            return Err(Unsealed::Damaged);
        }
        let mut body = envelope.body.clone();
        let ad = Ad::new(b"sediment index", &[0; 16]).u64(slot);
        cipher
            .open(&envelope.body_seal, &ad.0, &mut body)
            .map_err(|error| Unsealed::from_open(error, what))?;
        Ok((body, envelope.body_seal.key_id))
    }

    /// A sealed stratum header copy's first part, for `slot`, holding
    /// `body` (see `StratumHeader::encode_sealed_body`).
    pub fn seal_stratum_header(
        &self,
        basin: u8,
        number: u32,
        slot: u64,
        body: Vec<u8>,
    ) -> io::Result<Vec<u8>> {
        self.seal_envelope(
            crate::format::STRATUM_MAGIC_BYTES,
            STRATUM_CHECK,
            &self.stratum_ad(basin, number, slot),
            body,
        )
    }

    /// Opens the body of a sealed stratum header copy, as
    /// [`Sealer::open_index`] does; also returns the key id.
    pub fn open_stratum_header(
        &self,
        envelope: &Envelope,
        basin: u8,
        number: u32,
        slot: u64,
        what: &dyn fmt::Display,
    ) -> Result<(Vec<u8>, KeyId), Unsealed> {
        self.cipher
            .verify_key_check(&envelope.key_check, STRATUM_CHECK, what)
            .map_err(Unsealed::Key)?;
        if envelope.body_seal.key_id != envelope.key_check.key_id {
            return Err(Unsealed::Damaged);
        }
        let mut body = envelope.body.clone();
        let key_id = self.open(
            &envelope.body_seal,
            &self.stratum_ad(basin, number, slot),
            &mut body,
            what,
        )?;
        Ok((body, key_id))
    }

    /// Appends a sealed stamp page ([`STAMP_PAGE_BYTES`] bytes) holding
    /// `stamps` (at most [`STAMPS_PER_PAGE`]; the rest are zero) to `out`.
    pub fn append_page(
        &self,
        place: &PagePlace,
        stamps: &[u32],
        out: &mut Vec<u8>,
    ) -> io::Result<()> {
        let start = out.len();
        out.resize(start + STAMP_PAGE_BYTES as usize, 0);
        let bytes = &mut out[start..];
        for (i, stamp) in stamps.iter().take(STAMPS_PER_PAGE as usize).enumerate() {
            let at = SEAL_BYTES + 4 * i;
            bytes[at..at + 4].copy_from_slice(&stamp.to_le_bytes());
        }
        let seal = self.seal(&self.page_ad(place), &mut bytes[SEAL_BYTES..])?;
        bytes[..SEAL_BYTES].copy_from_slice(&seal.to_bytes());
        Ok(())
    }

    /// Opens a stamp page: its stamps and key id.
    pub fn open_page(
        &self,
        place: &PagePlace,
        bytes: &mut [u8],
        what: &dyn fmt::Display,
    ) -> Result<(Vec<u32>, KeyId), Unsealed> {
        if bytes.len() != STAMP_PAGE_BYTES as usize {
            return Err(Unsealed::Damaged);
        }
        let seal = seal_at(bytes);
        let key_id = self.open(&seal, &self.page_ad(place), &mut bytes[SEAL_BYTES..], what)?;
        let stamps = bytes[SEAL_BYTES..]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        Ok((stamps, key_id))
    }

    // --- Commit log frames -------------------------------------------

    fn frame_len_ad(&self, file: u64, offset: u64) -> Ad {
        Ad::new(b"sediment commit length", &self.store_id)
            .u64(file)
            .u64(offset)
    }

    fn frame_record_ad(&self, file: u64, offset: u64, len: u32) -> Ad {
        Ad::new(b"sediment commit record", &self.store_id)
            .u64(file)
            .u64(offset)
            .u64(u64::from(len))
    }

    /// Appends to `out` the sealed frame of `record` at `offset` of the
    /// commit log file `file` ([`SEALED_FRAME_HEAD`] bytes, then the
    /// record's ciphertext).
    pub fn seal_frame(
        &self,
        file: u64,
        offset: u64,
        record: &[u8],
        out: &mut Vec<u8>,
    ) -> io::Result<()> {
        let len = u32::try_from(record.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "record too long"))?;
        let mut len_bytes = len.to_le_bytes();
        let len_seal = self.seal(&self.frame_len_ad(file, offset), &mut len_bytes)?;
        let start = out.len();
        out.extend_from_slice(&len_seal.to_bytes());
        out.extend_from_slice(&len_bytes);
        out.resize(start + SEALED_FRAME_HEAD, 0);
        out.extend_from_slice(record);
        let record_seal = self.seal(
            &self.frame_record_ad(file, offset, len),
            &mut out[start + SEALED_FRAME_HEAD..],
        )?;
        out[start + SEAL_BYTES + 4..start + SEALED_FRAME_HEAD]
            .copy_from_slice(&record_seal.to_bytes());
        Ok(())
    }

    /// The record length of the frame at `offset` of file `file`, from its
    /// first [`SEALED_FRAME_HEAD`] bytes, and its key id.
    pub fn open_frame_len(
        &self,
        file: u64,
        offset: u64,
        head: &[u8],
        what: &dyn fmt::Display,
    ) -> Result<(u32, KeyId), Unsealed> {
        if head.len() < SEALED_FRAME_HEAD {
            return Err(Unsealed::Damaged);
        }
        let seal = seal_at(head);
        let mut len = [0_u8; 4];
        len.copy_from_slice(&head[SEAL_BYTES..SEAL_BYTES + 4]);
        let key_id = self.open(&seal, &self.frame_len_ad(file, offset), &mut len, what)?;
        Ok((u32::from_le_bytes(len), key_id))
    }

    /// Opens the record of the frame at `offset` of file `file` in place:
    /// `head` is the frame's first [`SEALED_FRAME_HEAD`] bytes, `record`
    /// its ciphertext (`len` bytes).
    pub fn open_frame_record(
        &self,
        file: u64,
        offset: u64,
        head: &[u8],
        record: &mut [u8],
        what: &dyn fmt::Display,
    ) -> Result<KeyId, Unsealed> {
        if head.len() < SEALED_FRAME_HEAD {
            return Err(Unsealed::Damaged);
        }
        let seal = seal_at(&head[SEAL_BYTES + 4..]);
        let len = record.len() as u32;
        self.open(
            &seal,
            &self.frame_record_ad(file, offset, len),
            record,
            what,
        )
    }

    /// Key ids of a sealed frame's two seals, without opening them.
    pub fn frame_key_ids(head: &[u8]) -> Option<(KeyId, KeyId)> {
        if head.len() < SEALED_FRAME_HEAD {
            return None;
        }
        Some((
            seal_at(head).key_id,
            seal_at(&head[SEAL_BYTES + 4..]).key_id,
        ))
    }

    // --- The rekey journal --------------------------------------------

    /// The sealed form of the rekey journal's `body`: its seal, then the
    /// ciphertext.
    pub fn seal_journal(&self, mut body: Vec<u8>) -> io::Result<Vec<u8>> {
        let seal = self.seal(
            &Ad::new(b"sediment rekey journal", &self.store_id),
            &mut body,
        )?;
        let mut out = Vec::with_capacity(SEAL_BYTES + body.len());
        out.extend_from_slice(&seal.to_bytes());
        out.extend_from_slice(&body);
        Ok(out)
    }

    /// Opens what [`Sealer::seal_journal`] made.
    pub fn open_journal(&self, bytes: &[u8], what: &dyn fmt::Display) -> Result<Vec<u8>, Unsealed> {
        if bytes.len() < SEAL_BYTES {
            return Err(Unsealed::Damaged);
        }
        let seal = seal_at(bytes);
        let mut body = bytes[SEAL_BYTES..].to_vec();
        self.open(
            &seal,
            &Ad::new(b"sediment rekey journal", &self.store_id),
            &mut body,
            what,
        )?;
        Ok(body)
    }
}

/// Where a stamp page belongs: its stratum, header copy and page, and the
/// generation that wrote it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PagePlace {
    pub basin: u8,
    pub number: u32,
    pub slot: u64,
    pub page: u32,
    pub version: u64,
}

/// Bytes of a sealed commit log frame before the record's ciphertext: the
/// length's seal and ciphertext, then the record's seal.
pub(crate) const SEALED_FRAME_HEAD: usize = 2 * SEAL_BYTES + 4;

/// The seal at the start of `bytes` (at least [`SEAL_BYTES`] long).
pub(crate) fn seal_at(bytes: &[u8]) -> Seal {
    Seal::from_bytes(bytes[..SEAL_BYTES].try_into().expect("SEAL_BYTES bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use okaywal::encryption::StaticKey;

    fn sealer() -> Sealer {
        Sealer::new(Arc::new(StaticKey::new([5; 32])), [9; 16], &[]).unwrap()
    }

    #[test]
    fn images_open_only_at_their_grain_and_hide_the_blob() {
        let sealer = sealer();
        let id = GrainId::new(3, 0, 2, 5).unwrap();
        let data: Vec<u8> = (0..150_000_u32).map(|i| (i % 251) as u8).collect();
        let header = GrainHeader {
            sequence: 7,
            length: data.len() as u32,
            crc: crate::format::grain_crc(7, &data),
        };
        // The same layout whichever way it is made: whole, in pieces
        // handed out at their offsets, or appended after other bytes.
        let mut pieces = Vec::new();
        sealer
            .seal_image(id, &header, &data, |at, piece| {
                assert_eq!(at as usize, pieces.len());
                pieces.extend_from_slice(piece);
                Ok(())
            })
            .unwrap();
        let mut appended = b"prefix".to_vec();
        sealer
            .append_image(id, &header, &data, &mut appended)
            .unwrap();
        assert_eq!(&appended[..6], b"prefix");
        let image = sealer.image(id, &header, &data).unwrap();
        assert!(!image.windows(16).any(|w| data.windows(16).any(|d| d == w)));
        for image in [image, pieces, appended[6..].to_vec()] {
            image_opens(&sealer, id, &header, &data, &image);
        }
    }

    fn image_opens(sealer: &Sealer, id: GrainId, header: &GrainHeader, data: &[u8], image: &[u8]) {
        let header = *header;
        assert_eq!(
            image.len() as u64,
            sealed_image_len(data.len() as u64).unwrap()
        );
        let mut head = image[..SEALED_IMAGE_HEAD as usize].to_vec();
        let (opened, _) = sealer.open_image_head(id, &mut head, &"test").unwrap();
        assert_eq!(opened, header);
        let mut plain = Vec::new();
        for chunk in 0..sealed_chunks(data.len() as u64) {
            let (at, len) = sealed_chunk_span(data.len() as u64, chunk);
            let mut piece = image[at as usize..at as usize + SEAL_BYTES + len].to_vec();
            sealer
                .open_image_chunk(id, &header, chunk, &mut piece, &"test")
                .unwrap();
            plain.extend_from_slice(&piece[SEAL_BYTES..]);
        }
        assert_eq!(plain, data);
        let elsewhere = GrainId::new(3, 0, 9, 5).unwrap();
        let mut head = image[..SEALED_IMAGE_HEAD as usize].to_vec();
        assert!(matches!(
            sealer.open_image_head(elsewhere, &mut head, &"test"),
            Err(Unsealed::Damaged)
        ));
        let (at, len) = sealed_chunk_span(data.len() as u64, 1);
        let mut piece = image[at as usize..at as usize + SEAL_BYTES + len].to_vec();
        assert!(matches!(
            sealer.open_image_chunk(id, &header, 0, &mut piece, &"test"),
            Err(Unsealed::Damaged)
        ));
    }
}
