//! Opening the store's existing files (index, strata, commit log files):
//! for reading and writing, or for reading only when the store is opened
//! read-only.

use std::io;
use std::path::Path;
use std::sync::Arc;

use okaywal::fs::{FileHandle, FileSystem, OpenMode};

/// Opens the existing file at `path`, writable or read-only.
pub(crate) fn open_existing(
    fs: &dyn FileSystem,
    path: &Path,
    writable: bool,
) -> io::Result<Arc<dyn FileHandle>> {
    let mode = if writable {
        OpenMode::ReadWrite
    } else {
        OpenMode::Read
    };
    fs.open(path, mode)
}
