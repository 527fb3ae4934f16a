//! Code written the way okaywal 0.3 users write it: a manager that reads
//! chunks one by one (`read_all`, then `check_crc` on the same chunk),
//! `Entry::segment`, `EntryChunk::log_position` and
//! `LogPosition::serialize_to` / `deserialize_from`.

use std::io::{self, Read};
use std::sync::Arc;

use okaywal::fs::MemoryFileSystem;
use okaywal::{
    Configuration, Entry, EntryId, LogManager, LogPosition, ReadChunkResult, SegmentReader,
    WriteAheadLog,
};
use parking_lot::Mutex;

/// An entry's id and its chunks, each with where it was written.
type Written = Vec<(u64, Vec<(LogPosition, Vec<u8>)>)>;

/// One entry as a manager saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    id: u64,
    segment_id: u64,
    version_info: Vec<u8>,
    chunks: Vec<(LogPosition, Vec<u8>)>,
}

#[derive(Debug, Default, Clone)]
struct Manager {
    recovered: Arc<Mutex<Vec<Seen>>>,
    checkpointed: Arc<Mutex<Vec<Seen>>>,
}

fn read_entry(entry: &mut Entry<'_>) -> io::Result<Seen> {
    let mut seen = Seen {
        id: entry.id().0,
        segment_id: entry.segment().id,
        version_info: entry.segment().version_info.clone(),
        chunks: Vec::new(),
    };
    loop {
        match entry.read_chunk()? {
            ReadChunkResult::Chunk(mut chunk) => {
                let position = chunk.log_position();
                assert_eq!(position, chunk.position());
                let data = chunk.read_all()?;
                assert_eq!(chunk.bytes_remaining(), 0);
                assert!(chunk.check_crc()?, "chunk at {position}");
                seen.chunks.push((position, data));
            }
            ReadChunkResult::EndOfEntry => return Ok(seen),
            ReadChunkResult::AbortedEntry => {
                return Err(io::Error::other(format!("entry {} aborted", seen.id)))
            }
        }
    }
}

impl LogManager for Manager {
    fn recover(&mut self, entry: &mut Entry<'_>) -> io::Result<()> {
        let seen = read_entry(entry)?;
        self.recovered.lock().push(seen);
        Ok(())
    }

    fn checkpoint_to(
        &mut self,
        _last_checkpointed_id: EntryId,
        entries: &mut SegmentReader,
        _wal: &WriteAheadLog,
    ) -> io::Result<()> {
        let segment_id = entries.segment_id();
        while let Some(mut entry) = entries.read_entry()? {
            let seen = read_entry(&mut entry)?;
            assert_eq!(seen.segment_id, segment_id);
            self.checkpointed.lock().push(seen);
        }
        Ok(())
    }
}

/// Writes `count` entries of three chunks each (the last through
/// `begin_chunk`) and returns them as a manager should see them, minus the
/// segment.
fn write_entries(log: &WriteAheadLog, count: usize, seed: u8) -> Written {
    let mut written = Vec::new();
    for i in 0..count {
        let mut entry = log.begin_entry().unwrap();
        let mut chunks = Vec::new();
        // Every fifth entry's last chunk is too big to be read together
        // with its header, so it is streamed from the file.
        let last = if i % 5 == 0 { 100_000 } else { 3000 };
        for (n, len) in [0_usize, 700, last].into_iter().enumerate() {
            let data: Vec<u8> = (0..len)
                .map(|b| (b as u8) ^ seed ^ (i as u8) ^ (n as u8))
                .collect();
            let record = if n == 2 {
                let mut writer = entry.begin_chunk(len as u32).unwrap();
                io::Write::write_all(&mut writer, &data).unwrap();
                writer.finish().unwrap()
            } else {
                entry.write_chunk(&data).unwrap()
            };
            assert_eq!(record.length, len as u32);
            assert_eq!(record.crc, crc32fast::hash(&data));
            chunks.push((record.position, data));
        }
        let id = entry.commit().unwrap();
        written.push((id.0, chunks));
    }
    written
}

fn without_segment(seen: &[Seen]) -> Written {
    seen.iter().map(|s| (s.id, s.chunks.clone())).collect()
}

#[test]
fn managers_written_for_okaywal_0_3_see_every_chunk_and_the_segment_it_is_in() {
    let fs = MemoryFileSystem::new();
    // Segments big enough that only `checkpoint_active` seals them: which
    // entries each checkpoint sees is then fixed, not a matter of timing.
    let config = || {
        Configuration::default_for("/log")
            .file_system(fs.clone())
            .preallocate_bytes(4 << 20)
            .checkpoint_after_bytes(4 << 20)
    };

    // Version 1: some entries checkpointed, the rest left for recovery.
    let manager = Manager::default();
    let log = config().version_info(b"v1").open(manager.clone()).unwrap();
    let checkpointed = write_entries(&log, 30, 1);
    log.checkpoint_active().unwrap();
    let left = write_entries(&log, 5, 2);

    // Positions survive a round trip through bytes and read back the chunk.
    let (position, data) = left[3].1[2].clone();
    let mut bytes = Vec::new();
    position.serialize_to(&mut bytes).unwrap();
    assert_eq!(bytes.len(), usize::from(LogPosition::SERIALIZED_LENGTH));
    let position = LogPosition::deserialize_from(&bytes[..]).unwrap();
    let mut reader = log.read_at(position).unwrap();
    let mut read_back = Vec::new();
    reader.read_to_end(&mut read_back).unwrap();
    assert_eq!(read_back, data);
    assert!(reader.crc_is_valid().unwrap());

    log.shutdown().unwrap();
    drop(log);
    {
        let seen = manager.checkpointed.lock();
        assert_eq!(without_segment(&seen), checkpointed);
        for entry in seen.iter() {
            assert_eq!(entry.version_info, b"v1", "entry {}", entry.id);
            assert!(entry.segment_id <= entry.id, "entry {}", entry.id);
        }
        assert!(manager.recovered.lock().is_empty());
    }

    // Version 2 recovers version 1's entries with version 1's header, and
    // its own entries carry its own.
    let second = Manager::default();
    let log = config().version_info("v2").open(second.clone()).unwrap();
    {
        let recovered = second.recovered.lock();
        assert_eq!(without_segment(&recovered), left);
        for entry in recovered.iter() {
            assert_eq!(entry.version_info, b"v1", "entry {}", entry.id);
        }
    }
    let new = write_entries(&log, 3, 3);
    log.checkpoint_active().unwrap();
    log.shutdown().unwrap();
    let seen = second.checkpointed.lock();
    let versions: Vec<(u64, &[u8])> = seen
        .iter()
        .map(|entry| (entry.id, entry.version_info.as_slice()))
        .collect();
    for (id, version) in &versions {
        let expected: &[u8] = if left.iter().any(|(l, _)| l == id) {
            b"v1"
        } else {
            b"v2"
        };
        assert_eq!(*version, expected, "entry {id}");
    }
    let ids: Vec<u64> = versions.iter().map(|(id, _)| *id).collect();
    let expected: Vec<u64> = left.iter().chain(&new).map(|(id, _)| *id).collect();
    assert_eq!(ids, expected);
}

#[test]
fn the_default_configuration_is_the_default_for_a_directory_named_okaywal() {
    let default = Configuration::default();
    let named = Configuration::default_for("okaywal");
    assert_eq!(default.directory, named.directory);
    assert_eq!(default.preallocate_bytes, named.preallocate_bytes);
    assert_eq!(default.checkpoint_after_bytes, named.checkpoint_after_bytes);
    assert_eq!(default.buffer_bytes, named.buffer_bytes);
    // Fields assigned directly, as 0.3 users also write them. (The struct
    // update syntax of 0.3, `Configuration { directory, ..default() }`,
    // does not compile: the struct is `#[non_exhaustive]`.)
    let dir = tempfile::tempdir().unwrap();
    let mut config = Configuration::default();
    config.directory = dir.path().to_path_buf();
    let log = config.open(okaywal::LogVoid).unwrap();
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(b"x").unwrap();
    entry.commit().unwrap();
    log.shutdown().unwrap();
}

#[test]
fn version_info_takes_bytes_in_any_usual_form() {
    let base = Configuration::default_for("/log");
    let owned = vec![7_u8, 8];
    let named = String::from("ab");
    let forms = [
        base.clone().version_info(b"ab").version_info,
        base.clone().version_info(&b"ab"[..]).version_info,
        base.clone().version_info(*b"ab").version_info,
        base.clone().version_info("ab").version_info,
        base.clone().version_info(String::from("ab")).version_info,
        base.clone().version_info(b"ab".to_vec()).version_info,
        base.clone()
            .version_info(Arc::new(b"ab".to_vec()))
            .version_info,
        base.clone()
            .version_info(Box::new(b"ab".to_vec()))
            .version_info,
        base.clone().version_info(&named).version_info,
    ];
    for form in forms {
        assert_eq!(form.as_slice(), b"ab");
    }
    assert_eq!(
        base.clone().version_info(&owned).version_info.as_slice(),
        [7, 8]
    );
    assert_eq!(
        base.version_info(vec![1; 3]).version_info.as_slice(),
        [1, 1, 1]
    );
}
