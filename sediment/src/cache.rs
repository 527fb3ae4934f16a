//! A bounded in-memory cache of small blobs, so repeated `get`s of hot
//! blobs cost a hash lookup instead of a system call.
//!
//! It is filled from both sides: a committed transaction puts the small
//! blobs it wrote in (so reads right after a load hit, as they would in a
//! store whose page cache its writes fill), and `get` puts in what it
//! read. Eviction is first in, first out.
//!
//! Correctness rests on two rules kept by the callers: a blob is removed
//! (after its stratum's `reuse_epoch` is bumped) whenever it is freed, and
//! a blob is inserted only if that epoch did not move since a moment the
//! blob was known not to be freed: for a reader, before it checked that
//! the blob was live; for a writer, before its commit made the blob
//! visible (nothing can free a blob nobody else can see). So a hit is
//! always a live blob's current bytes.
//!
//! A shard's lock is the last in the lock order (see `reclamation`): no
//! other lock is taken under it.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::grain_id::GrainId;

/// Shards keep threads that read different blobs off each other's lock.
const SHARDS: usize = 16;
/// Bytes charged per entry on top of the blob (map slot, queue, `Arc`).
const ENTRY_OVERHEAD: usize = 64;
/// Blobs larger than this are never cached: for them the read itself, not
/// the system call, is the cost.
const MAX_CACHED_BLOB: usize = 64 << 10;

/// Grain ids are already well mixed in their low bits (grain index); one
/// multiplication spreads them over the hash.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

#[derive(Default)]
struct Shard {
    blobs: HashMap<GrainId, Arc<[u8]>, BuildHasherDefault<IdHasher>>,
    /// Insertion order, for first-in first-out eviction; may name blobs
    /// removed since (skipped when reached).
    order: VecDeque<GrainId>,
    bytes: usize,
}

/// The cache; a capacity of 0 disables it.
pub(crate) struct BlobCache {
    shards: Vec<Mutex<Shard>>,
    shard_capacity: usize,
}

impl std::fmt::Debug for BlobCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobCache")
            .field("capacity", &(self.shard_capacity * SHARDS))
            .finish()
    }
}

impl BlobCache {
    pub fn new(capacity_bytes: u64) -> Self {
        let capacity = usize::try_from(capacity_bytes).unwrap_or(usize::MAX);
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            shard_capacity: capacity / SHARDS,
        }
    }

    fn shard(&self, id: GrainId) -> &Mutex<Shard> {
        let spread = id.as_u64().wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 60;
        &self.shards[spread as usize % SHARDS]
    }

    /// True if a blob of `len` bytes would be cached.
    pub fn accepts(&self, len: usize) -> bool {
        len <= MAX_CACHED_BLOB && len + ENTRY_OVERHEAD <= self.shard_capacity / 4
    }

    pub fn get(&self, id: GrainId) -> Option<Arc<[u8]>> {
        if self.shard_capacity == 0 {
            return None;
        }
        self.shard(id).lock().blobs.get(&id).cloned()
    }

    /// Caches `data` as blob `id` if `still_valid()` (checked under the
    /// shard's lock, so a concurrent `remove` is ordered with it).
    pub fn insert_if(&self, id: GrainId, data: &[u8], still_valid: impl FnOnce() -> bool) {
        if !self.accepts(data.len()) {
            return;
        }
        self.insert_shared_if(id, Arc::from(data), still_valid);
    }

    /// [`BlobCache::insert_if`] for bytes already shared (a committed
    /// write's copy), without copying them again.
    pub fn insert_shared_if(
        &self,
        id: GrainId,
        data: Arc<[u8]>,
        still_valid: impl FnOnce() -> bool,
    ) {
        if !self.accepts(data.len()) {
            return;
        }
        let mut shard = self.shard(id).lock();
        if !still_valid() {
            return;
        }
        let cost = data.len() + ENTRY_OVERHEAD;
        if let Some(old) = shard.blobs.insert(id, data) {
            shard.bytes -= old.len() + ENTRY_OVERHEAD;
        } else {
            shard.order.push_back(id);
        }
        shard.bytes += cost;
        while shard.bytes > self.shard_capacity {
            let Some(oldest) = shard.order.pop_front() else {
                break;
            };
            if let Some(old) = shard.blobs.remove(&oldest) {
                shard.bytes -= old.len() + ENTRY_OVERHEAD;
            }
        }
        // Keep the queue from filling up with blobs removed long ago.
        if shard.order.len() > 2 * shard.blobs.len() + 64 {
            let Shard { blobs, order, .. } = &mut *shard;
            order.retain(|id| blobs.contains_key(id));
        }
    }

    pub fn remove(&self, id: GrainId) {
        if self.shard_capacity == 0 {
            return;
        }
        let mut shard = self.shard(id).lock();
        if let Some(old) = shard.blobs.remove(&id) {
            shard.bytes -= old.len() + ENTRY_OVERHEAD;
        }
    }

    /// Bytes held, counting the per-entry overhead.
    pub fn bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.lock().bytes as u64).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(index: u32) -> GrainId {
        GrainId::new(2, 0, index, 1).unwrap()
    }

    #[test]
    fn stays_within_its_capacity_and_evicts_the_oldest() {
        let cache = BlobCache::new(SHARDS as u64 * 4096);
        for i in 0..10_000 {
            cache.insert_if(id(i), &[i as u8; 100], || true);
            assert!(cache.bytes() <= SHARDS as u64 * 4096);
        }
        assert_eq!(
            cache.get(id(9_999)).as_deref(),
            Some(&[9_999_u32 as u8; 100][..])
        );
        assert_eq!(cache.get(id(0)), None);
    }

    #[test]
    fn refuses_stale_inserts_and_forgets_removed_blobs() {
        let cache = BlobCache::new(1 << 20);
        cache.insert_if(id(1), b"old", || false);
        assert_eq!(cache.get(id(1)), None);
        cache.insert_if(id(1), b"new", || true);
        assert_eq!(cache.get(id(1)).as_deref(), Some(&b"new"[..]));
        cache.remove(id(1));
        assert_eq!(cache.get(id(1)), None);
        assert_eq!(cache.bytes(), 0);
    }

    #[test]
    fn a_zero_capacity_cache_holds_nothing() {
        let cache = BlobCache::new(0);
        cache.insert_if(id(1), b"x", || true);
        assert_eq!(cache.get(id(1)), None);
    }
}
