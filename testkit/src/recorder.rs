//! A `LogManager` that records every callback into shared state: the
//! segments offered, the entries recovered (chunk by chunk, every CRC
//! checked) or aborted, and each checkpoint's entries. It can refuse
//! checkpoints, fail a number of them, or abandon segments; a test may
//! choose how entries are read ([`Recorder::read_with`]) and act on each
//! accepted checkpoint ([`Recorder::on_checkpoint`]).
//!
//! ```
//! use okaywal::{fs::MemoryFileSystem, Configuration};
//! use testkit::recorder::Recorder;
//!
//! let config = Configuration::default_for("/log").file_system(MemoryFileSystem::new());
//! let log = config.clone().open(Recorder::new()).unwrap();
//! let mut entry = log.begin_entry().unwrap();
//! entry.write_chunk(b"hello").unwrap();
//! let id = entry.commit().unwrap();
//! drop(log);
//!
//! let recorder = Recorder::new();
//! let log = config.open(recorder.clone()).unwrap();
//! assert_eq!(recorder.seen().recovered, vec![(id.0, vec![b"hello".to_vec()])]);
//! ```

use std::fmt;
use std::io::{self, Read};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use okaywal::{
    Entry, EntryId, LogManager, ReadChunkResult, RecoveredSegment, Recovery, SegmentReader,
    WriteAheadLog,
};

/// Locks `mutex`, ignoring poisoning (a failed test thread must not hide
/// what it recorded).
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One successful (or attempted) `checkpoint_to` call.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// The last entry id the call checkpointed through.
    pub last_id: u64,
    /// The segment it read.
    pub segment_id: u64,
    /// Each entry read: its id and chunks (empty for a refused call).
    pub entries: Vec<(u64, Vec<Vec<u8>>)>,
}

/// Everything a [`Recorder`] was handed.
#[derive(Debug, Default)]
pub struct Seen {
    /// `should_recover_segment` calls: (segment id, version info).
    pub segments: Vec<(u64, Vec<u8>)>,
    /// Entries passed to `recover`, in call order.
    pub recovered: Vec<(u64, Vec<Vec<u8>>)>,
    /// Entries passed to `recover` that reported `AbortedEntry`.
    pub aborted: Vec<u64>,
    /// `checkpoint_to` calls that returned `Ok`.
    pub checkpoints: Vec<Checkpoint>,
    /// `checkpoint_to` calls that the recorder failed on purpose.
    pub refused: Vec<Checkpoint>,
}

impl Seen {
    /// Ids of every entry a successful checkpoint took, in call order.
    pub fn checkpointed_ids(&self) -> Vec<u64> {
        self.checkpoints
            .iter()
            .flat_map(|c| c.entries.iter().map(|(id, _)| *id))
            .collect()
    }

    /// Every entry a successful checkpoint took, with its chunks, in call
    /// order.
    pub fn checkpointed(&self) -> Vec<(u64, Vec<Vec<u8>>)> {
        self.checkpoints
            .iter()
            .flat_map(|c| c.entries.iter().cloned())
            .collect()
    }

    /// Ids of every recovered entry, in call order.
    pub fn recovered_ids(&self) -> Vec<u64> {
        self.recovered.iter().map(|(id, _)| *id).collect()
    }

    /// The highest id handed over by any callback.
    pub fn max_id(&self) -> u64 {
        let checkpointed = self.checkpointed_ids().into_iter().max().unwrap_or(0);
        let recovered = self.recovered_ids().into_iter().max().unwrap_or(0);
        let refused = self
            .refused
            .iter()
            .flat_map(|c| c.entries.iter().map(|(id, _)| *id))
            .max()
            .unwrap_or(0);
        checkpointed.max(recovered).max(refused)
    }
}

/// Reads one entry's chunks; `None` if the entry reported itself aborted.
pub type ReadEntry = fn(&mut Entry<'_>) -> io::Result<Option<Vec<Vec<u8>>>>;

/// Called with an accepted checkpoint once all its entries are read; an
/// error fails the checkpoint instead.
pub type CheckpointHook = Arc<dyn Fn(&Checkpoint) -> io::Result<()> + Send + Sync>;

/// A `LogManager` that records every callback into shared state.
#[derive(Clone, Default)]
pub struct Recorder {
    /// What the callbacks were handed.
    pub seen: Arc<Mutex<Seen>>,
    /// While true, `checkpoint_to` lists the entries and then fails.
    pub refuse: Arc<AtomicBool>,
    /// `checkpoint_to` reads every entry and then fails, this many more
    /// times.
    pub fail_next: Arc<AtomicUsize>,
    /// Segments whose version info equals this are abandoned.
    pub abandon: Option<Vec<u8>>,
    /// How entries are read, in recovery and in checkpoints alike. Unset,
    /// recovery reads through `Read` ([`read_entry_streaming`]) and
    /// checkpoints with [`Entry::read_all_chunks`].
    pub read_with: Option<ReadEntry>,
    /// Keeps entries' ids only, each with an empty chunk list (as
    /// [`Recorder::on_checkpoint`] sees them too): chunks are still read
    /// and checked. For tests that write more than memory should hold.
    pub ids_only: bool,
    /// Runs for every checkpoint not refused, after its entries are read
    /// and before it succeeds; its error fails the checkpoint (which is
    /// then listed in [`Seen::refused`]).
    pub on_checkpoint: Option<CheckpointHook>,
}

impl fmt::Debug for Recorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recorder")
            .field("seen", &self.seen)
            .field("refuse", &self.refuse)
            .field("fail_next", &self.fail_next)
            .field("abandon", &self.abandon)
            .field("read_with", &self.read_with.is_some())
            .field("ids_only", &self.ids_only)
            .field("on_checkpoint", &self.on_checkpoint.is_some())
            .finish()
    }
}

/// The message of a refused checkpoint's error.
pub const REFUSAL: &str = "the recording manager refuses this checkpoint";

impl Recorder {
    /// A recorder that accepts every checkpoint.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// A recorder whose checkpoints fail until `allow_checkpoints`.
    #[must_use]
    pub fn refusing() -> Self {
        let recorder = Self::default();
        recorder.refuse.store(true, Ordering::SeqCst);
        recorder
    }

    /// Lets checkpoints succeed from now on.
    pub fn allow_checkpoints(&self) {
        self.refuse.store(false, Ordering::SeqCst);
    }

    /// What the callbacks were handed so far.
    pub fn seen(&self) -> MutexGuard<'_, Seen> {
        lock(&self.seen)
    }

    /// `chunks`, or nothing with [`Recorder::ids_only`].
    fn kept(&self, chunks: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
        if self.ids_only {
            Vec::new()
        } else {
            chunks
        }
    }
}

/// Reads an entry chunk by chunk through `Read`, checking every CRC.
/// `None` if the entry reported itself aborted.
///
/// # Errors
/// The read's error, or `InvalidData` for a chunk that fails its CRC.
///
/// # Panics
/// If a chunk's reported lengths disagree with the bytes read.
pub fn read_entry_streaming(entry: &mut Entry<'_>) -> io::Result<Option<Vec<Vec<u8>>>> {
    let mut chunks = Vec::with_capacity(entry.chunk_count());
    loop {
        match entry.read_chunk()? {
            ReadChunkResult::Chunk(mut chunk) => {
                let len = chunk.len() as usize;
                assert_eq!(chunk.bytes_remaining() as usize, len);
                let mut data = Vec::with_capacity(len);
                chunk.read_to_end(&mut data)?;
                assert_eq!(data.len(), len, "chunk at {} is short", chunk.position());
                if !chunk.check_crc()? {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("chunk at {} fails its CRC in recovery", chunk.position()),
                    ));
                }
                chunks.push(data);
            }
            ReadChunkResult::EndOfEntry => return Ok(Some(chunks)),
            ReadChunkResult::AbortedEntry => return Ok(None),
        }
    }
}

impl LogManager for Recorder {
    fn should_recover_segment(&mut self, segment: &RecoveredSegment) -> io::Result<Recovery> {
        assert_eq!(segment.version_info(), &segment.version_info[..]);
        lock(&self.seen)
            .segments
            .push((segment.id, segment.version_info.clone()));
        if self.abandon.as_deref() == Some(segment.version_info()) {
            Ok(Recovery::Abandon)
        } else {
            Ok(Recovery::Recover)
        }
    }

    fn recover(&mut self, entry: &mut Entry<'_>) -> io::Result<()> {
        let id = entry.id().0;
        let read = self.read_with.unwrap_or(read_entry_streaming);
        match read(entry)? {
            Some(chunks) => lock(&self.seen).recovered.push((id, self.kept(chunks))),
            None => lock(&self.seen).aborted.push(id),
        }
        Ok(())
    }

    fn checkpoint_to(
        &mut self,
        last_checkpointed_id: EntryId,
        entries: &mut SegmentReader,
        _wal: &WriteAheadLog,
    ) -> io::Result<()> {
        let mut checkpoint = Checkpoint {
            last_id: last_checkpointed_id.0,
            segment_id: entries.segment_id(),
            entries: Vec::new(),
        };
        if self.refuse.load(Ordering::SeqCst) {
            // Note which entries were offered, without reading their bytes
            // (refused checkpoints are retried often).
            while let Some(entry) = entries.read_entry()? {
                checkpoint.entries.push((entry.id().0, Vec::new()));
            }
            lock(&self.seen).refused.push(checkpoint);
            return Err(io::Error::other(REFUSAL));
        }
        while let Some(mut entry) = entries.read_entry()? {
            let id = entry.id().0;
            let chunks = match self.read_with {
                Some(read) => read(&mut entry)?,
                None => entry.read_all_chunks()?,
            };
            let chunks = chunks.ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("entry {id} was aborted while being checkpointed"),
                )
            })?;
            checkpoint.entries.push((id, self.kept(chunks)));
        }
        let fail = self
            .fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if fail {
            lock(&self.seen).refused.push(checkpoint);
            return Err(io::Error::other(REFUSAL));
        }
        if let Some(hook) = &self.on_checkpoint {
            if let Err(err) = hook(&checkpoint) {
                lock(&self.seen).refused.push(checkpoint);
                return Err(err);
            }
        }
        lock(&self.seen).checkpoints.push(checkpoint);
        Ok(())
    }
}
