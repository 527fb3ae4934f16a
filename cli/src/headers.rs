//! For `verify`: the header copies of the index and of every stratum file,
//! read before the store is opened.
//!
//! Each header is stored twice. Opening a store rewrites a copy that does
//! not verify from the other one (after a crash that copy may have been
//! half written), so by the time [`sediment::Database::verify_report`]
//! looks, a damaged copy has already been repaired and is not reported.
//! `verify` reads the copies first, read-only, to report one that was bad.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use sediment::format::{
    stratum_slot_size, HeaderError, IndexHeader, StratumHeader, BASINS, INDEX_SLOT_SIZE,
};

/// A header copy that did not verify while the other one did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadCopy {
    /// The file and which copy, e.g. `db/stratum-0-0 (header copy 0)`.
    pub location: String,
    /// What is wrong with it.
    pub description: String,
}

/// `stratum-{basin}-{number}`, as sediment names its stratum files.
fn parse_stratum_name(name: &str) -> Option<(u8, u32)> {
    let (basin, number) = name.strip_prefix("stratum-")?.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(basin) || !digits(number) {
        return None;
    }
    let basin: u8 = basin.parse().ok()?;
    (usize::from(basin) < BASINS).then_some(())?;
    Some((basin, number.parse().ok()?))
}

/// The bytes of copy `slot` (`slot_size` bytes at `slot × slot_size`, fewer
/// at the end of the file).
fn read_copy(file: &File, len: u64, slot: u64, slot_size: u64) -> io::Result<Vec<u8>> {
    let start = slot * slot_size;
    let mut bytes = vec![0; len.saturating_sub(start).min(slot_size) as usize];
    file.read_exact_at(&mut bytes, start)?;
    Ok(bytes)
}

/// Whether copy `slot`, which failed with `error`, is damage rather than a
/// copy that was never written. Copy 0 is written when the file is created
/// and only rewritten after that, so it never legitimately reads as zeros.
/// Copy 1 may (or be missing from a short file) until the first update,
/// which writes both: once the other copy's generation is past the first,
/// a missing copy 1 was written once and is gone.
fn is_damage(slot: u64, error: &HeaderError, bytes: &[u8], other_generation: u64) -> bool {
    let unwritten = match error {
        HeaderError::Truncated => true,
        HeaderError::BadMagic => bytes.iter().all(|b| *b == 0),
        _ => false,
    };
    !unwritten || slot == 0 || other_generation > 1
}

/// Checks the two copies of one header (`generation` reads a decoded
/// one's); reports a bad one only when the other verifies (with both bad,
/// opening fails and says so itself).
fn check_pair<T>(
    path: &Path,
    what: &str,
    copies: [(Vec<u8>, Result<T, HeaderError>); 2],
    generation: impl Fn(&T) -> u64,
    out: &mut Vec<BadCopy>,
) {
    let [(first_bytes, first), (second_bytes, second)] = copies;
    let pairs = [(0, &first_bytes, &first), (1, &second_bytes, &second)];
    for (slot, bytes, decoded) in pairs {
        let other = if slot == 0 { &second } else { &first };
        let Ok(other) = other else {
            continue;
        };
        if let Err(error) = decoded {
            if is_damage(slot, error, bytes, generation(other)) {
                let found = if bytes.iter().all(|b| *b == 0) {
                    "the copy is missing (all zeros, or past the end of the file) although \
                     the other copy shows that both were written"
                        .to_string()
                } else {
                    format!("{error} (damaged, or torn by a write a crash cut short")
                };
                let close = if found.ends_with("short") { ")" } else { "" };
                out.push(BadCopy {
                    location: format!("{} (header copy {slot})", path.display()),
                    description: format!(
                        "{what}: {found}; the other copy is intact, and `sediment repair` \
                         rewrites this one from it{close}"
                    ),
                });
            }
        }
    }
}

/// Reads the index's and every stratum file's header copies under
/// `directory` without changing anything; returns the copies that do not
/// verify while their twin does. Files that cannot be read are left to
/// opening the store to report.
pub fn bad_copies(directory: &Path) -> Vec<BadCopy> {
    let mut out = Vec::new();
    let index = directory.join("index");
    if let Ok(file) = File::open(&index) {
        if let Ok(len) = file.metadata().map(|m| m.len()) {
            let copies = [0, 1].map(|slot| {
                read_copy(&file, len, slot, INDEX_SLOT_SIZE).map(|bytes| {
                    let decoded = IndexHeader::decode(&bytes);
                    (bytes, decoded)
                })
            });
            if let [Ok(first), Ok(second)] = copies {
                check_pair(
                    &index,
                    "index header",
                    [first, second],
                    |h: &IndexHeader| h.generation,
                    &mut out,
                );
            }
        }
    }
    let Ok(entries) = fs::read_dir(directory) else {
        return out;
    };
    let mut strata: Vec<(u8, u32, std::path::PathBuf)> = entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name();
            let (basin, number) = parse_stratum_name(name.to_str()?)?;
            Some((basin, number, entry.path()))
        })
        .collect();
    strata.sort();
    for (basin, number, path) in strata {
        let Ok(file) = File::open(&path) else {
            continue;
        };
        let Ok(len) = file.metadata().map(|m| m.len()) else {
            continue;
        };
        let slot_size = stratum_slot_size(basin);
        let copies = [0, 1].map(|slot| {
            read_copy(&file, len, slot, slot_size).map(|bytes| {
                let decoded = StratumHeader::decode(&bytes, basin, number);
                (bytes, decoded)
            })
        });
        if let [Ok(first), Ok(second)] = copies {
            check_pair(
                &path,
                "stratum header",
                [first, second],
                |h: &StratumHeader| h.generation,
                &mut out,
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stratum_names() {
        assert_eq!(parse_stratum_name("stratum-3-17"), Some((3, 17)));
        for junk in [
            "stratum-",
            "stratum-1",
            "stratum-a-1",
            "stratum-99-0",
            "index",
        ] {
            assert_eq!(parse_stratum_name(junk), None, "{junk}");
        }
    }

    #[test]
    fn never_written_copies_are_not_damage() {
        // Beside a copy of the first generation, copy 1 may be unwritten.
        assert!(!is_damage(1, &HeaderError::BadMagic, &[0; 64], 1));
        assert!(!is_damage(1, &HeaderError::Truncated, &[], 1));
        // Once an update wrote both, it may not.
        assert!(is_damage(1, &HeaderError::BadMagic, &[0; 64], 2));
        assert!(is_damage(1, &HeaderError::Truncated, &[], 7));
        // Copy 0 is always written first; other errors are always damage.
        assert!(is_damage(0, &HeaderError::BadMagic, &[0; 64], 1));
        assert!(is_damage(1, &HeaderError::BadMagic, &[1; 64], 1));
        assert!(is_damage(1, &HeaderError::BadChecksum, &[0; 64], 1));
    }
}
