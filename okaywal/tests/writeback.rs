//! Large chunks start their write-back as soon as their data is in the
//! file (`FileHandle::start_writeback`) when other entries are being
//! written at the same time, and only large ones: these tests record every
//! such call through a wrapping file system, with the bytes the file held
//! in the range at the moment of the call.

use std::io;
use std::path::Path;
use std::sync::Arc;

use okaywal::encryption::StaticKey;
use okaywal::fs::{FileHandle, FileSystem, MemoryFileSystem, OpenMode, StdFileSystem};
use okaywal::{Configuration, LogManager, LogVoid, WriteAheadLog};
use parking_lot::Mutex;

/// One `start_writeback` call: the range, and what the file held there.
#[derive(Debug, Clone)]
struct Call {
    offset: u64,
    bytes: Vec<u8>,
}

#[derive(Debug, Clone)]
struct RecordingFs {
    inner: Arc<dyn FileSystem>,
    calls: Arc<Mutex<Vec<Call>>>,
}

impl RecordingFs {
    fn new(inner: impl FileSystem + 'static) -> Self {
        Self {
            inner: Arc::new(inner),
            calls: Arc::default(),
        }
    }

    fn take_calls(&self) -> Vec<Call> {
        std::mem::take(&mut *self.calls.lock())
    }
}

#[derive(Debug)]
struct RecordingFile {
    inner: Arc<dyn FileHandle>,
    calls: Arc<Mutex<Vec<Call>>>,
}

impl FileHandle for RecordingFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_all_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.inner.sync_data()
    }
    fn sync_all(&self) -> io::Result<()> {
        self.inner.sync_all()
    }
    fn start_writeback(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut bytes = vec![0; usize::try_from(len).unwrap()];
        self.inner.read_exact_at(&mut bytes, offset)?;
        self.calls.lock().push(Call { offset, bytes });
        self.inner.start_writeback(offset, len)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
}

impl FileSystem for RecordingFs {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.inner.create_dir_all(path)
    }
    fn list_files(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.inner.list_files(dir)
    }
    fn exists(&self, path: &Path) -> io::Result<bool> {
        self.inner.exists(path)
    }
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn FileHandle>> {
        Ok(Arc::new(RecordingFile {
            inner: self.inner.open(path, mode)?,
            calls: self.calls.clone(),
        }))
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_file(path)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.inner.sync_dir(dir)
    }
}

fn payload(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn commit(log: &WriteAheadLog, data: &[u8]) {
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(data).unwrap();
    entry.commit().unwrap();
}

/// Every chunk read back at the next open, in order.
#[derive(Debug, Default, Clone)]
struct Collect(Arc<Mutex<Vec<Vec<u8>>>>);

impl LogManager for Collect {
    fn recover(&mut self, entry: &mut okaywal::Entry<'_>) -> io::Result<()> {
        let chunks = entry.read_all_chunks()?.expect("every entry verifies");
        self.0.lock().extend(chunks);
        Ok(())
    }
    fn checkpoint_to(
        &mut self,
        _last: okaywal::EntryId,
        _entries: &mut okaywal::SegmentReader,
        _log: &WriteAheadLog,
    ) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_large_chunk_starts_its_write_back_once_its_data_is_in_the_file() {
    let fs = RecordingFs::new(MemoryFileSystem::new());
    let log = Configuration::default_for("/writeback")
        .file_system(fs.clone())
        .open(LogVoid)
        .unwrap();
    let _ = fs.take_calls(); // whatever opening did (nothing, today)

    // A lone writer gives no hint: its own sync follows at once.
    commit(&log, &payload(1 << 20, 5));
    assert!(fs.take_calls().is_empty());

    // With another entry open, it does.
    let mut other = log.begin_entry().unwrap();
    other.write_chunk(b"another writer").unwrap();
    let large = payload(1 << 20, 7);
    commit(&log, &large);
    let calls = fs.take_calls();
    assert_eq!(calls.len(), 1, "one hint for one large chunk: {calls:?}");
    assert_eq!(calls[0].bytes.len(), large.len());
    assert!(
        calls[0].bytes == large,
        "the hinted range holds the chunk's data when the hint is given"
    );
    assert_eq!(
        calls[0].offset % 4096,
        0,
        "large chunk data starts on a page"
    );

    // Small entries and chunks under the threshold give none.
    for seed in 0..64 {
        commit(&log, &payload(4096, seed));
    }
    commit(&log, &payload(200 << 10, 1));
    assert!(fs.take_calls().is_empty());
    other.commit().unwrap();
    log.shutdown().unwrap();
}

#[test]
fn an_encrypted_large_chunk_starts_the_write_back_of_each_batch_of_frames() {
    let fs = RecordingFs::new(MemoryFileSystem::new());
    let log = Configuration::default_for("/writeback-encrypted")
        .file_system(fs.clone())
        .encryption(StaticKey::new([9; 32]))
        .open(LogVoid)
        .unwrap();
    let _ = fs.take_calls();

    let mut other = log.begin_entry().unwrap();
    other.write_chunk(b"another writer").unwrap();
    // 2.5 MiB: 40 frames of 64 KiB, sealed and written 16 at a time.
    let large = payload(5 << 19, 3);
    commit(&log, &large);
    let calls = fs.take_calls();
    // Two full batches (16 frames each) reach the threshold; the last
    // (8 frames, 512 KiB of plaintext) does too.
    assert_eq!(calls.len(), 3, "{calls:?}");
    for pair in calls.windows(2) {
        assert_eq!(
            pair[0].offset + pair[0].bytes.len() as u64,
            pair[1].offset,
            "batches follow each other"
        );
    }
    // Sealed: the hinted bytes are ciphertext, not the payload.
    let hinted: usize = calls.iter().map(|c| c.bytes.len()).sum();
    assert!(hinted > large.len());
    assert!(!calls[0].bytes.windows(64).any(|w| w == &large[..64]));
    other.commit().unwrap();
    log.shutdown().unwrap();
}

/// On a real file system the hint changes nothing that is read back:
/// entries committed with it are all there after a reopen, and the
/// operating system's call accepts ranges at and past the end of a file.
#[test]
fn entries_written_with_the_hint_read_back_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let fs = RecordingFs::new(StdFileSystem);
    let config = || {
        Configuration::default_for(dir.path())
            .file_system(fs.clone())
            .preallocate_bytes(4 << 20)
            .checkpoint_after_bytes(1 << 30)
    };
    let log = config().open(LogVoid).unwrap();
    let mut other = log.begin_entry().unwrap();
    let mut written: Vec<Vec<u8>> = (0..6).map(|i| payload(700 << 10, i)).collect();
    for data in &written {
        commit(&log, data);
    }
    assert_eq!(fs.take_calls().len(), written.len());
    other.write_chunk(b"committed last").unwrap();
    other.commit().unwrap();
    written.push(b"committed last".to_vec());
    log.shutdown().unwrap();
    drop(log);

    let seen = Collect::default();
    let log = config().open(seen.clone()).unwrap();
    let mut seen = seen.0.lock().clone();
    seen.sort();
    written.sort();
    assert!(seen == written, "every entry read back");
    log.shutdown().unwrap();

    let file = StdFileSystem
        .open(&dir.path().join("hint"), OpenMode::CreateNew)
        .unwrap();
    file.write_all_at(b"written", 0).unwrap();
    file.start_writeback(0, 7).unwrap();
    file.start_writeback(1 << 20, 4096).unwrap();
    file.start_writeback(0, 0).unwrap();
    let mut back = [0; 7];
    file.read_exact_at(&mut back, 0).unwrap();
    assert_eq!(&back, b"written");
}
