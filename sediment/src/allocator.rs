//! Grain bitmaps of one stratum and first-fit allocation of grain runs.

/// Returns bit `i` of `words`.
pub(crate) fn bit(words: &[u64], i: u32) -> bool {
    words
        .get((i / 64) as usize)
        .is_some_and(|w| w & (1 << (i % 64)) != 0)
}

/// Sets or clears bits `start..start + count`.
pub(crate) fn set_bits(words: &mut [u64], start: u32, count: u32, value: bool) {
    for i in start..start + count {
        let word = &mut words[(i / 64) as usize];
        if value {
            *word |= 1 << (i % 64);
        } else {
            *word &= !(1 << (i % 64));
        }
    }
}

/// Returns true if every bit in `start..start + count` equals `value`.
pub(crate) fn all_bits(words: &[u64], start: u32, count: u32, value: bool) -> bool {
    (start..start + count).all(|i| bit(words, i) == value)
}

/// The allocation state of one stratum, in memory.
#[derive(Debug, Clone)]
pub(crate) struct StratumBits {
    pub capacity: u32,
    /// Committed blobs (visible to `get`): allocated grains and blob starts.
    pub live_allocated: Vec<u64>,
    pub live_starts: Vec<u64>,
    /// The same as of the last checkpoint (what the on-disk header holds).
    pub durable_allocated: Vec<u64>,
    pub durable_starts: Vec<u64>,
    /// Grains that may not be handed out: live, reserved by a running
    /// transaction, or freed but not yet reusable.
    pub busy: Vec<u64>,
    /// No free grain lies below this index.
    pub free_hint: u32,
    /// Number of busy grains.
    pub busy_count: u32,
}

impl StratumBits {
    /// State for a stratum whose on-disk header holds these bitmaps.
    pub fn from_durable(capacity: u32, allocated: Vec<u64>, starts: Vec<u64>) -> Self {
        let busy_count = allocated.iter().map(|w| w.count_ones()).sum();
        Self {
            capacity,
            live_allocated: allocated.clone(),
            live_starts: starts.clone(),
            busy: allocated.clone(),
            durable_allocated: allocated,
            durable_starts: starts,
            free_hint: 0,
            busy_count,
        }
    }

    /// Finds and reserves `count` consecutive free grains (first fit).
    pub fn reserve(&mut self, count: u32) -> Option<u32> {
        if self.capacity - self.busy_count < count {
            return None;
        }
        let mut run_start = self.free_hint;
        let mut i = self.free_hint;
        let mut first_free = None;
        while i < self.capacity {
            let word = self.busy[(i / 64) as usize];
            if word == u64::MAX && i % 64 == 0 {
                i += 64;
                run_start = i;
                continue;
            }
            if bit(&self.busy, i) {
                i += 1;
                run_start = i;
                continue;
            }
            first_free.get_or_insert(i);
            if i + 1 - run_start == count {
                set_bits(&mut self.busy, run_start, count, true);
                self.busy_count += count;
                if first_free == Some(run_start) {
                    self.free_hint = run_start + count;
                } else if let Some(free) = first_free {
                    self.free_hint = free;
                }
                return Some(run_start);
            }
            i += 1;
        }
        if let Some(free) = first_free {
            self.free_hint = free;
        } else {
            self.free_hint = self.capacity;
        }
        None
    }

    /// Makes reserved or freed grains available again.
    pub fn release(&mut self, start: u32, count: u32) {
        for i in start..start + count {
            if bit(&self.busy, i) {
                self.busy_count -= 1;
            }
        }
        set_bits(&mut self.busy, start, count, false);
        self.free_hint = self.free_hint.min(start);
    }

    /// Marks grains as busy (used when replaying allocations).
    pub fn mark_busy(&mut self, start: u32, count: u32) {
        for i in start..start + count {
            if !bit(&self.busy, i) {
                self.busy_count += 1;
            }
        }
        set_bits(&mut self.busy, start, count, true);
    }

    /// Records a committed blob.
    pub fn set_live(&mut self, start: u32, count: u32, live: bool) {
        set_bits(&mut self.live_allocated, start, count, live);
        set_bits(&mut self.live_starts, start, count, false);
        if live {
            set_bits(&mut self.live_starts, start, 1, true);
        }
    }

    /// Records a blob in the state the next header write persists.
    pub fn set_durable(&mut self, start: u32, count: u32, live: bool) {
        set_bits(&mut self.durable_allocated, start, count, live);
        set_bits(&mut self.durable_starts, start, count, false);
        if live {
            set_bits(&mut self.durable_starts, start, 1, true);
        }
    }

    /// True if exactly grains `start..start + count` form one committed
    /// blob.
    pub fn is_live_blob(&self, start: u32, count: u32) -> bool {
        let end = start + count;
        end <= self.capacity
            && bit(&self.live_starts, start)
            && all_bits(&self.live_allocated, start, count, true)
            && all_bits(&self.live_starts, start + 1, count - 1, false)
            && (end == self.capacity
                || !bit(&self.live_allocated, end)
                || bit(&self.live_starts, end))
    }

    /// The committed blobs, as (start, count), from the durable bitmaps.
    #[cfg(test)]
    pub fn durable_blobs(&self) -> Vec<(u32, u32)> {
        blobs(&self.durable_allocated, &self.durable_starts, self.capacity)
    }
}

/// Splits allocation bitmaps into runs (start, count); a run starts at a
/// start bit and continues over allocated non-start grains. Allocated
/// grains with no start before them are reported as runs of their own
/// with count 0 so verification can flag them.
pub(crate) fn blobs(allocated: &[u64], starts: &[u64], capacity: u32) -> Vec<(u32, u32)> {
    let mut runs = Vec::new();
    let mut i = 0;
    while i < capacity {
        if allocated[(i / 64) as usize] == 0 && i % 64 == 0 {
            i += 64;
            continue;
        }
        if !bit(allocated, i) {
            i += 1;
            continue;
        }
        if !bit(starts, i) {
            runs.push((i, 0));
            i += 1;
            continue;
        }
        let start = i;
        i += 1;
        while i < capacity && bit(allocated, i) && !bit(starts, i) {
            i += 1;
        }
        runs.push((start, i - start));
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty(capacity: u32) -> StratumBits {
        let words = capacity as usize / 64;
        StratumBits::from_durable(capacity, vec![0; words], vec![0; words])
    }

    #[test]
    fn first_fit_reuses_released_space() {
        let mut bits = empty(128);
        let a = bits.reserve(10).unwrap();
        let b = bits.reserve(20).unwrap();
        let c = bits.reserve(30).unwrap();
        assert_eq!((a, b, c), (0, 10, 30));
        bits.release(b, 20);
        assert_eq!(bits.reserve(15), Some(10));
        assert_eq!(bits.reserve(5), Some(25));
        assert_eq!(bits.reserve(68), Some(60));
        assert_eq!(bits.reserve(1), None);
        assert_eq!(bits.busy_count, 128);
        bits.release(0, 10);
        assert_eq!(bits.reserve(11), None);
        assert_eq!(bits.reserve(10), Some(0));
    }

    #[test]
    fn live_blob_checks_exact_extent() {
        let mut bits = empty(64);
        bits.set_live(4, 3, true);
        bits.set_live(7, 2, true);
        assert!(bits.is_live_blob(4, 3));
        assert!(bits.is_live_blob(7, 2));
        assert!(!bits.is_live_blob(4, 2));
        assert!(!bits.is_live_blob(4, 4));
        assert!(!bits.is_live_blob(5, 2));
        assert!(!bits.is_live_blob(0, 1));
        assert!(!bits.is_live_blob(63, 2));
        bits.set_live(4, 3, false);
        assert!(!bits.is_live_blob(4, 3));
        assert!(bits.is_live_blob(7, 2));
    }

    #[test]
    fn runs_are_found_in_bitmaps() {
        let mut bits = empty(192);
        bits.set_durable(0, 2, true);
        bits.set_durable(2, 3, true);
        bits.set_durable(130, 1, true);
        assert_eq!(bits.durable_blobs(), vec![(0, 2), (2, 3), (130, 1)]);
        set_bits(&mut bits.durable_allocated, 150, 1, true);
        assert_eq!(bits.durable_blobs().last(), Some(&(150, 0)));
    }
}
