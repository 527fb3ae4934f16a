//! `read_at` of a chunk its writer has just written (before the entry is
//! committed) returns that chunk, even while other threads' syncs are
//! taking the write buffer to write it out.

use std::io::Read;

use okaywal::{Configuration, LogVoid};

#[test]
fn a_chunk_reads_back_at_once_while_other_threads_sync() {
    let dir = tempfile::tempdir().unwrap();
    let log = Configuration::default_for(dir.path())
        .open(LogVoid)
        .unwrap();
    let failures = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..8_u8)
            .map(|t| {
                let log = &log;
                scope.spawn(move || {
                    let mut failures = Vec::new();
                    for i in 0..300_u32 {
                        let mut entry = log.begin_entry().unwrap();
                        let data = vec![t ^ i as u8; 100 + (i as usize % 50)];
                        let record = entry.write_chunk(&data).unwrap();
                        match log.read_at(record.position) {
                            Ok(mut reader) => {
                                let mut read = Vec::new();
                                reader.read_to_end(&mut read).unwrap();
                                if read != data || !reader.crc_is_valid().unwrap() {
                                    failures.push(format!("{}: wrong bytes", record.position));
                                }
                            }
                            Err(err) => failures.push(format!("{}: {err}", record.position)),
                        }
                        entry.commit().unwrap();
                    }
                    failures
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|thread| thread.join().unwrap())
            .collect::<Vec<_>>()
    });
    assert!(
        failures.is_empty(),
        "{} chunks did not read back: {:?}",
        failures.len(),
        &failures[..failures.len().min(3)]
    );
    log.shutdown().unwrap();
}
