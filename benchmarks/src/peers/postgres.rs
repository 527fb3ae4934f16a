//! PostgreSQL through the `postgres` crate: one connection per thread, the
//! server's default durability (`fsync=on`, `synchronous_commit=on`). The
//! server is found through the `PG_URL` environment variable
//! (`benchmarks/pg.sh start` prints one).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use postgres::{Client, NoTls, Statement};

use crate::blob::BlobSystem;
use crate::wal::WalSystem;

const WAL_TABLE: &str = "okaywal_bench_wal";
const BLOB_TABLE: &str = "okaywal_bench_blobs";

fn err(e: postgres::Error) -> String {
    format!("PostgreSQL: {e}")
}

/// Connects to `PG_URL`, or says why not.
pub fn connect() -> Result<Client, String> {
    let raw = std::env::var("PG_URL").map_err(|_| {
        "PG_URL is not set (run `export PG_URL=\"$(benchmarks/pg.sh start)\"`)".to_string()
    })?;
    let url = super::pg_url(&raw);
    if url.is_empty() {
        return Err("PG_URL is empty (run `export PG_URL=\"$(benchmarks/pg.sh start)\"`)".into());
    }
    let mut config: postgres::Config = url
        .parse()
        .map_err(|e| format!("PG_URL {url:?} does not parse: {e}"))?;
    config.connect_timeout(Duration::from_secs(5));
    config
        .connect(NoTls)
        .map_err(|e| format!("cannot connect to {url}: {e}"))
}

/// Checks that the server answers; the error says why it is skipped.
pub fn server_info() -> Result<String, String> {
    let mut client = connect()?;
    let row = client.query_one("SHOW server_version", &[]).map_err(err)?;
    let version: String = row.get(0);
    let row = client
        .query_one(
            "SELECT current_setting('fsync'), current_setting('synchronous_commit')",
            &[],
        )
        .map_err(err)?;
    let (fsync, sync): (String, String) = (row.get(0), row.get(1));
    Ok(format!(
        "PostgreSQL {version} (fsync={fsync}, synchronous_commit={sync})"
    ))
}

struct WalConnection {
    client: Client,
    insert: Statement,
}

/// One autocommitted `INSERT` of a `bytea` per commit.
pub struct PostgresWal {
    connections: Vec<Mutex<WalConnection>>,
}

impl PostgresWal {
    /// Creates the table (dropping a leftover one) and one connection per
    /// thread.
    pub fn open(threads: usize) -> Result<Self, String> {
        let mut first = connect()?;
        first
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {WAL_TABLE}; \
                 CREATE TABLE {WAL_TABLE} (thread integer NOT NULL, payload bytea NOT NULL)"
            ))
            .map_err(err)?;
        let mut connections = Vec::with_capacity(threads);
        let mut spare = Some(first);
        for _ in 0..threads.max(1) {
            let mut client = match spare.take() {
                Some(client) => client,
                None => connect()?,
            };
            let insert = client
                .prepare(&format!(
                    "INSERT INTO {WAL_TABLE} (thread, payload) VALUES ($1, $2)"
                ))
                .map_err(err)?;
            connections.push(Mutex::new(WalConnection { client, insert }));
        }
        Ok(Self { connections })
    }
}

impl WalSystem for PostgresWal {
    fn commit(&self, thread: usize, payload: &[u8]) -> Result<(), String> {
        let mut connection = self.connections[thread % self.connections.len()].lock();
        let WalConnection { client, insert } = &mut *connection;
        client
            .execute(&*insert, &[&(thread as i32), &payload])
            .map_err(err)?;
        Ok(())
    }
}

impl Drop for PostgresWal {
    fn drop(&mut self) {
        if let Some(connection) = self.connections.first() {
            let _ = connection
                .lock()
                .client
                .batch_execute(&format!("DROP TABLE IF EXISTS {WAL_TABLE}"));
        }
    }
}

struct BlobConnection {
    client: Client,
    insert: Statement,
    select: Statement,
}

/// A `bytea` table keyed by a `bigint` primary key; a transaction is one
/// autocommitted `INSERT … SELECT * FROM unnest($1, $2)` of all its blobs
/// (one round trip, one commit).
pub struct PostgresBlobs {
    connections: Vec<Mutex<BlobConnection>>,
    next_key: AtomicU64,
}

impl PostgresBlobs {
    /// Creates the table (dropping a leftover one) and one connection per
    /// thread.
    pub fn open(threads: usize) -> Result<Self, String> {
        let mut first = connect()?;
        first
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {BLOB_TABLE}; \
                 CREATE TABLE {BLOB_TABLE} (id bigint PRIMARY KEY, data bytea NOT NULL)"
            ))
            .map_err(err)?;
        let mut connections = Vec::with_capacity(threads);
        let mut spare = Some(first);
        for _ in 0..threads.max(1) {
            let mut client = match spare.take() {
                Some(client) => client,
                None => connect()?,
            };
            let insert = client
                .prepare(&format!(
                    "INSERT INTO {BLOB_TABLE} (id, data) \
                     SELECT * FROM unnest($1::bigint[], $2::bytea[])"
                ))
                .map_err(err)?;
            let select = client
                .prepare(&format!("SELECT data FROM {BLOB_TABLE} WHERE id = $1"))
                .map_err(err)?;
            connections.push(Mutex::new(BlobConnection {
                client,
                insert,
                select,
            }));
        }
        Ok(Self {
            connections,
            next_key: AtomicU64::new(1),
        })
    }

    fn connection(&self, thread: usize) -> parking_lot::MutexGuard<'_, BlobConnection> {
        self.connections[thread % self.connections.len()].lock()
    }
}

impl BlobSystem for PostgresBlobs {
    fn write(&self, thread: usize, blobs: &[&[u8]]) -> Result<Vec<u64>, String> {
        let first = self
            .next_key
            .fetch_add(blobs.len() as u64, Ordering::Relaxed);
        let keys: Vec<u64> = (first..first + blobs.len() as u64).collect();
        let ids: Vec<i64> = keys.iter().map(|&k| k as i64).collect();
        let mut connection = self.connection(thread);
        let BlobConnection { client, insert, .. } = &mut *connection;
        client.execute(&*insert, &[&ids, &blobs]).map_err(err)?;
        Ok(keys)
    }

    fn get(&self, thread: usize, key: u64) -> Result<Option<usize>, String> {
        let mut connection = self.connection(thread);
        let BlobConnection { client, select, .. } = &mut *connection;
        let row = client.query_opt(&*select, &[&(key as i64)]).map_err(err)?;
        Ok(row.map(|row| row.get::<_, &[u8]>(0).len()))
    }

    fn delete(&self, keys: &[u64]) -> Result<(), String> {
        let keys: Vec<i64> = keys.iter().map(|&k| k as i64).collect();
        self.connection(0)
            .client
            .execute(
                &format!("DELETE FROM {BLOB_TABLE} WHERE id = ANY($1)"),
                &[&keys],
            )
            .map_err(err)?;
        Ok(())
    }

    fn reclaim(&mut self) -> Result<Option<&'static str>, String> {
        self.connection(0)
            .client
            .batch_execute(&format!("VACUUM {BLOB_TABLE}"))
            .map_err(err)?;
        Ok(Some("VACUUM"))
    }

    fn bytes_on_disk(&self, _dir: &Path) -> Result<u64, String> {
        let row = self
            .connection(0)
            .client
            .query_one(
                &format!("SELECT pg_total_relation_size('{BLOB_TABLE}')"),
                &[],
            )
            .map_err(err)?;
        Ok(row.get::<_, i64>(0) as u64)
    }

    fn space_note(&self) -> Option<&'static str> {
        Some("PostgreSQL: pg_total_relation_size of the table (heap, TOAST, index), without pg_wal")
    }
}

impl Drop for PostgresBlobs {
    fn drop(&mut self) {
        if let Some(connection) = self.connections.first() {
            let _ = connection
                .lock()
                .client
                .batch_execute(&format!("DROP TABLE IF EXISTS {BLOB_TABLE}"));
        }
    }
}
