//! Settings that the store cannot honour are refused when it opens, with
//! an error naming them, instead of being replaced by other values.

use std::sync::Arc;

use okaywal::fs::{FileSystem, MemoryFileSystem};
use sediment::format::MAX_FORMAT_BLOB_BYTES;
use sediment::{Config, Error};

fn refused(config: Config) -> String {
    match config.open() {
        Err(Error::InvalidConfig(message)) => message,
        Err(other) => panic!("refused with another error: {other}"),
        Ok(db) => {
            db.shutdown().unwrap();
            panic!("opened with a setting it cannot honour")
        }
    }
}

#[test]
fn a_max_blob_bytes_above_what_the_format_holds_is_refused() {
    let fs = MemoryFileSystem::new();
    for bytes in [MAX_FORMAT_BLOB_BYTES + 1, 1 << 30, u64::MAX] {
        let config = Config::for_directory("/db")
            .file_system(fs.clone())
            .max_blob_bytes(bytes);
        assert_eq!(config.blob_size_limit(), bytes, "kept as given");
        let message = refused(config);
        assert!(message.contains("max_blob_bytes"), "{message}");
        assert!(message.contains(&bytes.to_string()), "{message}");
    }
    assert!(
        !fs.exists(std::path::Path::new("/db/index")).unwrap(),
        "nothing was created"
    );
    let db = Config::for_directory("/db")
        .file_system(fs)
        .max_blob_bytes(MAX_FORMAT_BLOB_BYTES)
        .open()
        .unwrap();
    db.shutdown().unwrap();
}

/// An empty directory path names no directory: it is refused, writable
/// or read-only, before a lock file is made in the current directory.
#[test]
fn an_empty_directory_path_is_refused() {
    let lock_in_cwd = std::path::Path::new("sediment.lock");
    let existed = lock_in_cwd.exists();
    let message = refused(Config::for_directory(""));
    assert!(message.contains("empty path"), "{message}");
    let message = refused(Config::for_directory("").read_only(true));
    assert!(message.contains("empty path"), "{message}");
    assert!(matches!(
        sediment::Database::recover(""),
        Err(Error::InvalidConfig(_))
    ));
    assert_eq!(lock_in_cwd.exists(), existed);
}

#[test]
fn a_wal_directory_set_through_the_wal_settings_is_refused() {
    let fs = MemoryFileSystem::new();
    let config = Config::for_directory("/db")
        .file_system(fs.clone())
        .wal(|mut wal| {
            wal.directory = "/elsewhere".into();
            wal
        });
    let message = refused(config);
    assert!(message.contains("wal.directory"), "{message}");
    assert!(message.contains("/elsewhere"), "{message}");
    assert!(!fs.exists(std::path::Path::new("/elsewhere")).unwrap());

    // The database's own directory, set again, is no change.
    let db = Config::for_directory("/db")
        .file_system(fs)
        .wal(|mut wal| {
            wal.directory = "/db".into();
            wal
        })
        .open()
        .unwrap();
    db.shutdown().unwrap();
}

#[test]
fn a_wal_file_system_set_through_the_wal_settings_is_refused() {
    let database_fs = MemoryFileSystem::new();
    let wal_fs = MemoryFileSystem::new();
    let config = Config::for_directory("/db")
        .file_system(database_fs.clone())
        .wal(|wal| wal.file_system(wal_fs.clone()));
    let message = refused(config);
    assert!(message.contains("wal.file_system"), "{message}");
    assert!(!wal_fs.exists(std::path::Path::new("/db")).unwrap());

    // Config::file_system moves the WAL along, in either order.
    let shared: Arc<dyn FileSystem> = Arc::new(database_fs.clone());
    let config = Config::for_directory("/db")
        .wal(|wal| wal.checkpoint_after_bytes(1 << 20))
        .shared_file_system(shared.clone());
    assert!(Arc::ptr_eq(config.file_system_in_use(), &shared));
    assert!(Arc::ptr_eq(
        &config.wal_configuration().file_system,
        &shared
    ));
    let db = config.open().unwrap();
    let mut tx = db.begin_transaction().unwrap();
    tx.write(b"on the shared file system").unwrap();
    tx.commit().unwrap();
    db.shutdown().unwrap();
    assert!(database_fs
        .list_files(std::path::Path::new("/db"))
        .unwrap()
        .iter()
        .any(|name| name.starts_with("wal-")));
}

/// The WAL's `minimum_next_entry_id` is honoured together with the
/// store's own floor, not replaced by it.
#[test]
fn a_minimum_next_entry_id_is_honoured() {
    let fs = MemoryFileSystem::new();
    let config = || {
        Config::for_directory("/db")
            .file_system(fs.clone())
            .wal(|wal| wal.minimum_next_entry_id(1000))
    };
    let db = config().open().unwrap();
    let mut tx = db.begin_transaction().unwrap();
    tx.write(b"first").unwrap();
    let first = tx.commit().unwrap();
    assert!(first.0 >= 1000, "{first}");
    db.shutdown().unwrap();
    // Reopened with a lower minimum, sequences still go on from the store.
    let db = Config::for_directory("/db")
        .file_system(fs.clone())
        .wal(|wal| wal.minimum_next_entry_id(5))
        .open()
        .unwrap();
    let mut tx = db.begin_transaction().unwrap();
    tx.write(b"second").unwrap();
    assert!(tx.commit().unwrap() > first);
    db.shutdown().unwrap();
}

#[test]
fn the_getters_return_what_the_builder_set() {
    let config = Config::for_directory("/db")
        .max_blob_bytes(12345)
        .direct_write_bytes(4096)
        .cache_bytes(0)
        .wal(|wal| wal.checkpoint_after_bytes(1 << 20));
    assert_eq!(config.directory(), std::path::Path::new("/db"));
    assert_eq!(config.blob_size_limit(), 12345);
    assert_eq!(config.direct_write_threshold(), 4096);
    assert_eq!(config.cache_size(), 0);
    assert_eq!(config.wal_configuration().checkpoint_after_bytes, 1 << 20);
    assert_eq!(
        config.wal_configuration().directory,
        std::path::Path::new("/db")
    );
}
