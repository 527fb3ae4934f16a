//! Stores files as blobs, reads them back, archives them, frees them with a
//! checkpoint and shows the space being reused.
//!
//! `cargo run --release -p sediment --example files [FILE...]`; without
//! arguments it stores this crate's source files. The database lives in a
//! temporary directory under `target/` that is removed at the end.

use std::path::{Path, PathBuf};

use sediment::{Database, GrainId};

fn main() -> sediment::Result<()> {
    let mut paths: Vec<PathBuf> = std::env::args().skip(1).map(PathBuf::from).collect();
    if paths.is_empty() {
        files_under(
            &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut paths,
        )?;
        paths.sort();
    }
    std::fs::create_dir_all("target")?;
    let temp = tempfile::tempdir_in("target")?;
    let directory = temp.path().join("files-db");

    let db = Database::recover(&directory)?;
    let mut tx = db.begin_transaction()?;
    let mut stored: Vec<(PathBuf, GrainId, usize)> = Vec::new();
    for path in &paths {
        let bytes = std::fs::read(path)?;
        let grain = tx.write(&bytes)?;
        stored.push((path.clone(), grain, bytes.len()));
    }
    let sequence = tx.commit()?;
    println!("stored {} files in transaction {sequence}:", stored.len());
    for (path, grain, len) in &stored {
        println!("  {grain:>14}  {len:>8} bytes  {}", path.display());
    }

    // Reopen and read everything back.
    db.shutdown()?;
    let db = Database::recover(&directory)?;
    for (path, grain, _) in &stored {
        let original = std::fs::read(path)?;
        let read = db.get(*grain)?.expect("the blob was committed");
        assert_eq!(read, original, "{} came back different", path.display());
    }
    println!("reopened: all {} blobs read back intact", stored.len());

    // Archive the first half: still readable until a checkpoint frees them.
    let (archived, kept) = stored.split_at(stored.len() / 2);
    let mut tx = db.begin_transaction()?;
    for (_, grain, _) in archived {
        tx.archive(*grain)?;
    }
    let archived_at = tx.commit()?;
    assert!(archived
        .iter()
        .all(|(_, g, _)| db.get(*g).is_ok_and(|b| b.is_some())));
    println!(
        "archived {} blobs in transaction {archived_at}; they are still readable",
        archived.len()
    );

    let mut tx = db.begin_transaction()?;
    tx.checkpoint_to(archived_at)?;
    let checkpoint = tx.commit()?;
    let freed = archived
        .iter()
        .filter(|(_, g, _)| db.get(*g).is_ok_and(|b| b.is_none()))
        .count();
    println!("checkpoint_to({archived_at}) in transaction {checkpoint} freed {freed} blobs");

    // New writes reuse the freed grains once the WAL has moved the freeing
    // transaction into the strata.
    db.checkpoint_wal()?;
    let mut tx = db.begin_transaction()?;
    let mut reused = 0;
    for (path, old_grain, _) in archived {
        let grain = tx.write(&std::fs::read(path)?)?;
        if grain == *old_grain {
            reused += 1;
        }
    }
    tx.commit()?;
    println!(
        "rewrote {} files: {reused} landed in freed grains",
        archived.len()
    );
    for (path, grain, _) in kept {
        assert_eq!(db.get(*grain)?.expect("kept"), std::fs::read(path)?);
    }

    let report = db.verify()?;
    println!("verify: {report}");
    let stats = db.stats()?;
    for basin in &stats.basins {
        println!(
            "  basin {:>2} ({:>7} B grains): {} strata, {} grains used, {} archived, {} bytes",
            basin.basin,
            basin.grain_size,
            basin.strata,
            basin.grains_used,
            basin.grains_archived,
            basin.bytes_on_disk
        );
    }
    println!("total bytes on disk: {}", stats.total_bytes());
    db.shutdown()?;
    Ok(())
}

/// Every file under `dir`, its subdirectories included.
fn files_under(dir: &Path, files: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            files_under(&path, files)?;
        } else {
            files.push(path);
        }
    }
    Ok(())
}
