//! SQLite through `rusqlite` (bundled): WAL journal mode,
//! `synchronous=FULL`, one connection per thread, one transaction per
//! commit. Writers wait for each other through a 60 s busy timeout.

use std::path::Path;
use std::time::Duration;

use parking_lot::Mutex;
use rusqlite::{params, Connection, OptionalExtension};

use crate::blob::BlobSystem;
use crate::wal::WalSystem;

fn err(e: rusqlite::Error) -> String {
    format!("SQLite: {e}")
}

fn connect(path: &Path) -> Result<Connection, String> {
    let connection = Connection::open(path).map_err(err)?;
    connection
        .busy_timeout(Duration::from_secs(60))
        .map_err(err)?;
    let mode: String = connection
        .query_row("PRAGMA journal_mode=WAL", [], |row| row.get(0))
        .map_err(err)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(format!("SQLite refused WAL mode ({mode})"));
    }
    connection
        .execute_batch("PRAGMA synchronous=FULL")
        .map_err(err)?;
    Ok(connection)
}

fn connections(
    path: &Path,
    threads: usize,
    schema: &str,
) -> Result<Vec<Mutex<Connection>>, String> {
    let first = connect(path)?;
    first.execute_batch(schema).map_err(err)?;
    let mut all = vec![Mutex::new(first)];
    for _ in 1..threads.max(1) {
        all.push(Mutex::new(connect(path)?));
    }
    Ok(all)
}

/// One autocommitted `INSERT` of a blob per commit.
pub struct SqliteWal {
    connections: Vec<Mutex<Connection>>,
}

impl SqliteWal {
    /// Creates `log.sqlite` in `dir` with one connection per thread.
    pub fn open(dir: &Path, threads: usize) -> Result<Self, String> {
        Ok(Self {
            connections: connections(
                &dir.join("log.sqlite"),
                threads,
                "CREATE TABLE log (id INTEGER PRIMARY KEY, thread INTEGER, payload BLOB)",
            )?,
        })
    }
}

impl WalSystem for SqliteWal {
    fn commit(&self, thread: usize, payload: &[u8]) -> Result<(), String> {
        let connection = self.connections[thread % self.connections.len()].lock();
        connection
            .prepare_cached("INSERT INTO log (thread, payload) VALUES (?1, ?2)")
            .and_then(|mut insert| insert.execute(params![thread as i64, payload]))
            .map_err(err)?;
        Ok(())
    }
}

/// A blob table keyed by rowid; a transaction is `BEGIN IMMEDIATE`, one
/// `INSERT` per blob, `COMMIT`.
pub struct SqliteBlobs {
    connections: Vec<Mutex<Connection>>,
}

impl SqliteBlobs {
    /// Creates `blobs.sqlite` in `dir` with one connection per thread.
    pub fn open(dir: &Path, threads: usize) -> Result<Self, String> {
        let path = dir.join("blobs.sqlite");
        Ok(Self {
            connections: connections(
                &path,
                threads,
                "CREATE TABLE blobs (id INTEGER PRIMARY KEY, data BLOB NOT NULL)",
            )?,
        })
    }

    fn connection(&self, thread: usize) -> parking_lot::MutexGuard<'_, Connection> {
        self.connections[thread % self.connections.len()].lock()
    }
}

impl BlobSystem for SqliteBlobs {
    fn write(&self, thread: usize, blobs: &[&[u8]]) -> Result<Vec<u64>, String> {
        let mut connection = self.connection(thread);
        let tx = connection
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(err)?;
        let mut keys = Vec::with_capacity(blobs.len());
        {
            let mut insert = tx
                .prepare_cached("INSERT INTO blobs (data) VALUES (?1)")
                .map_err(err)?;
            for blob in blobs {
                insert.execute(params![blob]).map_err(err)?;
                keys.push(tx.last_insert_rowid() as u64);
            }
        }
        tx.commit().map_err(err)?;
        Ok(keys)
    }

    fn get(&self, thread: usize, key: u64) -> Result<Option<usize>, String> {
        let connection = self.connection(thread);
        let mut select = connection
            .prepare_cached("SELECT data FROM blobs WHERE id = ?1")
            .map_err(err)?;
        select
            .query_row(params![key as i64], |row| {
                Ok(row.get_ref(0)?.as_blob().map_or(0, <[u8]>::len))
            })
            .optional()
            .map_err(err)
    }

    fn delete(&self, keys: &[u64]) -> Result<(), String> {
        let mut connection = self.connection(0);
        let tx = connection
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(err)?;
        {
            let mut delete = tx
                .prepare_cached("DELETE FROM blobs WHERE id = ?1")
                .map_err(err)?;
            for &key in keys {
                delete.execute(params![key as i64]).map_err(err)?;
            }
        }
        tx.commit().map_err(err)
    }

    fn space_note(&self) -> Option<&'static str> {
        Some("SQLite: no VACUUM (free pages are reused in place); the WAL file counts")
    }
}
