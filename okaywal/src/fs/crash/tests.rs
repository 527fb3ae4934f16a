//! Tests of the crash-simulating file system.

use super::*;

fn write_file(fs: &CrashFileSystem, path: &Path, bytes: &[u8]) -> Arc<dyn FileHandle> {
    let file = fs.open(path, OpenMode::Create).unwrap();
    file.write_all_at(bytes, 0).unwrap();
    file
}

/// With jitter, writes keep landing while syncs run: each sync must
/// still make durable every write that completed before it began.
#[test]
fn a_jittered_sync_covers_every_write_completed_before_it() {
    let fs = CrashFileSystem::new();
    fs.create_dir_all(Path::new("/d")).unwrap();
    let file = write_file(&fs, Path::new("/d/a"), b"");
    fs.jitter(1, Duration::from_micros(300));
    let completed = AtomicU64::new(0);
    let durable = || {
        let namespace = fs.disk.namespace.lock();
        let inode = namespace.files.get(Path::new("/d/a")).unwrap().clone();
        drop(namespace);
        let durable = inode.read().durable.clone();
        durable
    };
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for i in 0..300_u64 {
                file.write_all_at(&[(i % 251) as u8 + 1; 8], i * 8).unwrap();
                completed.store(i + 1, Ordering::Release);
            }
        });
        loop {
            let before = completed.load(Ordering::Acquire);
            file.sync_data().unwrap();
            let durable = durable();
            for i in 0..before {
                let at = (i * 8) as usize;
                assert_eq!(
                    durable.get(at..at + 8),
                    Some(&[(i % 251) as u8 + 1; 8][..]),
                    "write {i} completed before the sync began but is not durable"
                );
            }
            if before == 300 {
                break;
            }
        }
    });
}

#[test]
fn unsynced_name_is_lost() {
    let fs = CrashFileSystem::new();
    fs.create_dir_all(Path::new("/d")).unwrap();
    let file = write_file(&fs, Path::new("/d/a"), b"hello");
    file.sync_data().unwrap();
    fs.power_loss(PowerLoss::Clean);
    assert!(!fs.exists(Path::new("/d/a")).unwrap());
}

#[test]
fn synced_data_and_name_survive_unsynced_data_does_not() {
    let fs = CrashFileSystem::new();
    fs.create_dir_all(Path::new("/d")).unwrap();
    let file = write_file(&fs, Path::new("/d/a"), b"hello");
    file.sync_data().unwrap();
    fs.sync_dir(Path::new("/d")).unwrap();
    file.write_all_at(b"J", 0).unwrap();
    file.write_all_at(b" world", 5).unwrap();
    assert_eq!(fs.contents(Path::new("/d/a")).unwrap(), b"Jello world");
    fs.power_loss(PowerLoss::Clean);
    assert_eq!(fs.contents(Path::new("/d/a")).unwrap(), b"hello");
    // The old handle is dead after the power loss.
    assert!(file.write_all_at(b"x", 0).is_err());
}

#[test]
fn torn_prefix_keeps_half_of_the_last_write() {
    let fs = CrashFileSystem::new();
    fs.create_dir_all(Path::new("/d")).unwrap();
    let file = write_file(&fs, Path::new("/d/a"), b"");
    file.sync_data().unwrap();
    fs.sync_dir(Path::new("/d")).unwrap();
    file.write_all_at(b"aaaa", 0).unwrap();
    file.write_all_at(b"bbbb", 4).unwrap();
    fs.power_loss(PowerLoss::TornPrefix);
    assert_eq!(fs.contents(Path::new("/d/a")).unwrap(), b"aaaabb");
}

#[test]
fn sector_hole_keeps_old_bytes_in_one_sector() {
    let fs = CrashFileSystem::new();
    fs.create_dir_all(Path::new("/d")).unwrap();
    let file = write_file(&fs, Path::new("/d/a"), &[1_u8; 2048]);
    file.sync_data().unwrap();
    fs.sync_dir(Path::new("/d")).unwrap();
    file.write_all_at(&[2_u8; 2048], 0).unwrap();
    fs.power_loss(PowerLoss::SectorHole);
    let contents = fs.contents(Path::new("/d/a")).unwrap();
    assert_eq!(contents.iter().filter(|b| **b == 1).count(), 512);
    assert_eq!(contents[1024..1536], [1_u8; 512]);
}

#[test]
fn rename_becomes_durable_with_dir_sync() {
    let fs = CrashFileSystem::new();
    fs.create_dir_all(Path::new("/d")).unwrap();
    let file = write_file(&fs, Path::new("/d/a"), b"x");
    file.sync_data().unwrap();
    fs.sync_dir(Path::new("/d")).unwrap();
    fs.rename(Path::new("/d/a"), Path::new("/d/b")).unwrap();
    fs.power_loss(PowerLoss::Clean);
    assert!(fs.exists(Path::new("/d/a")).unwrap());
    fs.rename(Path::new("/d/a"), Path::new("/d/b")).unwrap();
    fs.sync_dir(Path::new("/d")).unwrap();
    fs.power_loss(PowerLoss::Clean);
    assert!(!fs.exists(Path::new("/d/a")).unwrap());
    assert_eq!(fs.contents(Path::new("/d/b")).unwrap(), b"x");
}

#[test]
fn injected_faults_fire_once_or_cut_power() {
    let fs = CrashFileSystem::new();
    fs.create_dir_all(Path::new("/d")).unwrap();
    let file = write_file(&fs, Path::new("/d/a"), b"x");
    fs.inject(Operation::Sync, 0, FaultKind::Error(io::ErrorKind::Other));
    assert!(file.sync_data().is_err());
    file.sync_data().unwrap();
    fs.inject(Operation::Write, 2, FaultKind::PowerOff);
    file.write_all_at(b"y", 1).unwrap();
    assert!(file.write_all_at(b"z", 2).is_err());
    assert!(fs.is_powered_off());
    assert!(file.sync_data().is_err());
    assert_eq!(fs.operation_count(Operation::Write), 3);
    fs.power_loss(PowerLoss::Clean);
    assert!(!fs.is_powered_off());
}
