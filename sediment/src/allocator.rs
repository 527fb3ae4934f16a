//! Grain bitmaps of one stratum and first-fit allocation of grain runs.
//!
//! First fit scans the busy bitmap a run of busy or free grains at a time
//! (not a grain at a time) and starts from a hint per run length: "no
//! `count` free grains in a row start below `at`". Reserving only makes
//! grains busy, so a hint stays true until grains are released, and a
//! release lowers each hint just enough to cover the runs it can create.
//! A stratum whose free space is scattered in holes too small for a blob
//! is then passed over at once instead of scanned again by every
//! allocation that tries it.

/// Hints kept per stratum (one per recently requested run length).
const MAX_HINTS: usize = 8;

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
    /// Number of busy grains.
    pub busy_count: u32,
    /// `(count, at)`: no run of `count` free grains starts below `at`
    /// (true for any larger count too). One entry per count; an entry that
    /// a smaller count's says more than is dropped.
    hints: Vec<(u32, u32)>,
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
            busy_count,
            hints: Vec::new(),
        }
    }

    /// Finds and reserves `count` consecutive free grains (first fit: the
    /// lowest run there is).
    pub fn reserve(&mut self, count: u32) -> Option<u32> {
        if count == 0 || self.capacity - self.busy_count < count {
            return None;
        }
        let from = self.hint_for(count);
        match self.find_run(from, count) {
            Some(start) => {
                set_bits(&mut self.busy, start, count, true);
                self.busy_count += count;
                self.note_hint(count, start);
                Some(start)
            }
            None => {
                self.note_hint(count, self.capacity);
                None
            }
        }
    }

    /// Where a search for `count` free grains may start.
    fn hint_for(&self, count: u32) -> u32 {
        self.hints
            .iter()
            .filter(|(c, _)| *c <= count)
            .map(|(_, at)| *at)
            .max()
            .unwrap_or(0)
    }

    /// Records that no run of `count` free grains starts below `at`.
    fn note_hint(&mut self, count: u32, at: u32) {
        match self.hints.iter_mut().find(|(c, _)| *c == count) {
            Some(hint) => hint.1 = hint.1.max(at),
            None => self.hints.push((count, at)),
        }
        // A hint is worthless when one for a smaller count starts at least
        // as high (each count has one hint): in count order, only hints
        // that raise the highest start so far are kept.
        self.hints.sort_unstable_by_key(|&(c, _)| c);
        let mut highest: Option<u32> = None;
        self.hints.retain(|&(_, a)| {
            let keep = highest.map_or(true, |h| a > h);
            if keep {
                highest = Some(a);
            }
            keep
        });
        self.hints.truncate(MAX_HINTS);
    }

    /// The lowest `start >= from` with grains `start..start + count` all
    /// free, scanning whole runs of free and busy grains at a time.
    fn find_run(&self, from: u32, count: u32) -> Option<u32> {
        let mut i = from;
        let mut run_start = from;
        while i < self.capacity {
            let offset = i % 64;
            let word = self.busy[(i / 64) as usize] >> offset;
            let valid = (64 - offset).min(self.capacity - i);
            // Free grains from `i` on within this word.
            let free = if word == 0 {
                valid
            } else {
                word.trailing_zeros().min(valid)
            };
            i += free;
            if i - run_start >= count {
                return Some(run_start);
            }
            if free == valid {
                continue;
            }
            // Grain `i` is busy: pass its busy run.
            let busy = (word >> free).trailing_ones().min(valid - free);
            i += busy;
            run_start = i;
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
        // A run of `c` free grains that uses any released grain starts at
        // `start - (c - 1)` or later: the free grains just before `start`
        // were a run shorter than `c` if it began below the hint.
        for hint in &mut self.hints {
            hint.1 = hint.1.min(start.saturating_sub(hint.0 - 1));
        }
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

    /// The lowest run of `count` free grains, one grain at a time.
    fn naive_first_fit(bits: &StratumBits, count: u32) -> Option<u32> {
        (0..bits.capacity.saturating_sub(count - 1))
            .find(|&p| all_bits(&bits.busy, p, count, false))
    }

    #[test]
    fn reserve_finds_the_same_runs_as_a_grain_by_grain_first_fit() {
        for seed in 0..20u64 {
            let mut rng = testkit::rng::Rng::new(seed);
            let capacity = 64 * (1 + rng.below(40) as u32);
            let mut bits = empty(capacity);
            let mut held: Vec<(u32, u32)> = Vec::new();
            for step in 0..3_000 {
                if !held.is_empty() && rng.below(100) < 45 {
                    let (start, count) = held.swap_remove(rng.below(held.len() as u64) as usize);
                    bits.release(start, count);
                    continue;
                }
                // Mostly small runs, now and then a long one.
                let count = if rng.below(10) == 0 {
                    1 + rng.below(200) as u32
                } else {
                    1 + rng.below(6) as u32
                };
                let expected = naive_first_fit(&bits, count);
                let got = bits.reserve(count);
                assert_eq!(got, expected, "seed {seed}, step {step}, count {count}");
                if let Some(start) = got {
                    held.push((start, count));
                }
                let busy: u32 = bits.busy.iter().map(|w| w.count_ones()).sum();
                assert_eq!(busy, bits.busy_count, "seed {seed}, step {step}");
            }
        }
    }

    #[test]
    fn scattered_holes_too_small_are_passed_over() {
        let mut bits = empty(1 << 16);
        while bits.reserve(1).is_some() {}
        for start in (0..1 << 16).step_by(2) {
            bits.release(start, 1);
        }
        assert_eq!(bits.reserve(2), None);
        // The hint says so without a scan; a release that makes room
        // brings the run back.
        assert_eq!(bits.hint_for(2), bits.capacity);
        assert_eq!(bits.reserve(3), None);
        bits.release(1001, 1);
        assert_eq!(bits.reserve(3), Some(1000));
        assert_eq!(bits.reserve(1), Some(0));
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
