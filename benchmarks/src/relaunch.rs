//! Peers on by default for `compare`, without `cargo test --workspace`
//! ever compiling them.
//!
//! The peer features are off by default, so a plain
//! `cargo run --release -p benchmarks --bin compare` builds `compare`
//! without them. Started that way (by cargo, whose path is in `CARGO`), a
//! run that wants a missing peer builds `compare` again with
//! `--features peers` (plus `rocksdb` when this build has it; `--only
//! raft` builds with `--features raft` alone) into the same target
//! directory and profile, then runs that build with the same arguments. If the build fails, the run goes on without the peers and
//! says which are missing. `COMPARE_NO_REBUILD=1` turns this off; a binary
//! started directly (not by cargo) never rebuilds itself.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// Set (to anything) to keep `compare` from rebuilding itself with peers.
pub const OPT_OUT: &str = "COMPARE_NO_REBUILD";
/// Set in the relaunched process, so that it never relaunches again.
const RELAUNCHED: &str = "COMPARE_RELAUNCHED";

/// Whether a run of `systems` (all, when `None`) in section `only` (every
/// section but scale, when `None`) wants a peer that `features` (name,
/// cargo feature, compiled in) lacks, or the raft section (which runs
/// whatever `--systems` says) without `raft_on`. `--only raft` wants no
/// other peer: its systems are processes of their own. RocksDB never
/// counts: it needs system packages.
#[must_use]
pub fn wants_rebuild(
    systems: Option<&[String]>,
    only: Option<&str>,
    features: &[(&str, &str, bool)],
    raft_on: bool,
) -> bool {
    let missing = |system: &str| {
        features
            .iter()
            .any(|(name, feature, on)| *name == system && *feature != "rocksdb" && !on)
    };
    let raft_missing = !raft_on && only.map_or(true, |section| section == "raft");
    if only == Some("raft") {
        return raft_missing;
    }
    let peer_missing = match systems {
        Some(list) => list.iter().any(|system| missing(system)),
        None => features.iter().any(|(name, _, _)| missing(name)),
    };
    raft_missing || peer_missing
}

/// Where cargo put the running binary, so that the rebuild lands on the
/// same path.
#[derive(Debug, PartialEq, Eq)]
pub struct Layout {
    /// The target directory (the one holding cargo's `CACHEDIR.TAG`).
    pub target_dir: PathBuf,
    /// The profile, as `cargo build --profile` takes it.
    pub profile: String,
    /// The target triple, when the binary was built with `--target`
    /// (`<target dir>/<triple>/<profile>/compare`).
    pub triple: Option<String>,
}

/// Reads the [`Layout`] from the running binary's path
/// (`<target dir>[/<triple>]/<profile>/compare`).
#[must_use]
pub fn layout(exe: &Path) -> Option<Layout> {
    let profile_dir = exe.parent()?;
    let profile = match profile_dir.file_name()?.to_str()? {
        "debug" => "dev".to_string(),
        other => other.to_string(),
    };
    let above = profile_dir.parent()?;
    let tagged = |dir: &Path| dir.join("CACHEDIR.TAG").is_file();
    let (target_dir, triple) = match above.parent() {
        Some(outer) if !tagged(above) && tagged(outer) => (
            outer.to_path_buf(),
            Some(above.file_name()?.to_str()?.to_string()),
        ),
        _ => (above.to_path_buf(), None),
    };
    Some(Layout {
        target_dir,
        profile,
        triple,
    })
}

/// The features a rebuild turns on: `raft` alone for `--only raft`,
/// else `peers` (plus `rocksdb` when this build has it).
#[must_use]
pub fn rebuild_features(only: Option<&str>) -> &'static str {
    if only == Some("raft") {
        "raft"
    } else if cfg!(feature = "rocksdb") {
        "peers,rocksdb"
    } else {
        "peers"
    }
}

/// Builds `compare` with the peers (see [`rebuild_features`]) and runs it
/// with `args`, if this run wants that (see the module docs). Returns the
/// relaunched run's exit code, or `None` to go on in this process.
#[must_use]
pub fn relaunch_with_peers(args: &[String], wanted: bool, only: Option<&str>) -> Option<ExitCode> {
    if !wanted || std::env::var_os(OPT_OUT).is_some() || std::env::var_os(RELAUNCHED).is_some() {
        return None;
    }
    let cargo = std::env::var_os("CARGO")?;
    // Taken before the build replaces the file under this name.
    let exe = std::env::current_exe().ok()?;
    let Layout {
        target_dir,
        profile,
        triple,
    } = layout(&exe)?;
    let features = rebuild_features(only);
    eprintln!(
        "compare: the peers are not compiled in; building compare with `--features \
         {features}` first (several minutes the first time; {OPT_OUT}=1 runs without them)"
    );
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let mut build = Command::new(&cargo);
    build
        .args(["build", "--profile", &profile, "--bin", "compare"])
        .args(["-p", "benchmarks", "--features", features])
        .arg("--manifest-path")
        .arg(manifest)
        .arg("--target-dir")
        .arg(&target_dir);
    if let Some(triple) = &triple {
        build.args(["--target", triple]);
    }
    let built = build.status();
    match built {
        Ok(status) if status.success() => {}
        Ok(status) => {
            eprintln!("compare: building with the peers failed ({status}); running without them");
            return None;
        }
        Err(err) => {
            eprintln!("compare: could not run cargo ({err}); running without the peers");
            return None;
        }
    }
    run(&exe, args)
}

/// Replaces this process with the new build (so that signals and the exit
/// status are the new build's own).
#[cfg(unix)]
fn run(exe: &Path, args: &[String]) -> Option<ExitCode> {
    use std::os::unix::process::CommandExt;
    let err = Command::new(exe).args(args).env(RELAUNCHED, "1").exec();
    eprintln!(
        "compare: could not start {} ({err}); running without the peers",
        exe.display()
    );
    None
}

/// Runs the new build and passes its exit status on.
#[cfg(not(unix))]
fn run(exe: &Path, args: &[String]) -> Option<ExitCode> {
    match Command::new(exe).args(args).env(RELAUNCHED, "1").status() {
        Ok(status) => Some(match status.code() {
            Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
            None => ExitCode::FAILURE,
        }),
        Err(err) => {
            eprintln!(
                "compare: could not start {} ({err}); running without the peers",
                exe.display()
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE_ON: &[(&str, &str, bool)] = &[
        ("fjall", "fjall", false),
        ("rocksdb", "rocksdb", false),
        ("postgresql", "postgres", false),
    ];
    const ALL_BUT_ROCKSDB: &[(&str, &str, bool)] = &[
        ("fjall", "fjall", true),
        ("rocksdb", "rocksdb", false),
        ("postgresql", "postgres", true),
    ];

    fn list(systems: &[&str]) -> Vec<String> {
        systems.iter().map(|s| (*s).to_string()).collect()
    }

    #[test]
    fn a_run_rebuilds_only_for_peers_it_wants_and_lacks() {
        // Every system: the peers are wanted.
        assert!(wants_rebuild(None, None, NONE_ON, false));
        assert!(wants_rebuild(None, Some("blob"), NONE_ON, true));
        // Only our own systems, or peers that are there: no rebuild...
        let ours = list(&["okaywal", "floor", "sediment"]);
        assert!(!wants_rebuild(Some(&ours), None, NONE_ON, true));
        assert!(!wants_rebuild(Some(&ours), Some("wal"), NONE_ON, false));
        // ...unless the raft section runs (it does by default) without
        // its feature.
        assert!(wants_rebuild(Some(&ours), None, NONE_ON, false));
        assert!(!wants_rebuild(None, None, ALL_BUT_ROCKSDB, true));
        assert!(!wants_rebuild(None, Some("blob"), ALL_BUT_ROCKSDB, false));
        let present = list(&["fjall", "postgresql", "sediment"]);
        assert!(!wants_rebuild(Some(&present), None, ALL_BUT_ROCKSDB, true));
        // One missing peer is enough.
        let one = list(&["sediment", "postgresql"]);
        assert!(wants_rebuild(Some(&one), None, NONE_ON, true));
        // RocksDB needs system packages: never a reason to rebuild.
        let rocks = list(&["rocksdb", "okaywal"]);
        assert!(!wants_rebuild(Some(&rocks), None, ALL_BUT_ROCKSDB, true));
        // The raft section needs its feature even for our own systems.
        assert!(wants_rebuild(
            Some(&ours),
            Some("raft"),
            ALL_BUT_ROCKSDB,
            false
        ));
        assert!(!wants_rebuild(
            Some(&ours),
            Some("raft"),
            ALL_BUT_ROCKSDB,
            true
        ));
        // ...and no other peer.
        assert!(!wants_rebuild(None, Some("raft"), NONE_ON, true));
        assert!(wants_rebuild(None, Some("raft"), NONE_ON, false));
    }

    #[test]
    fn the_rebuild_goes_to_the_running_binary_s_target_dir_profile_and_triple() {
        let root = crate::temp_dir();
        let target = root.path().join("target");
        std::fs::create_dir_all(target.join("x86_64-unknown-linux-gnu/release")).unwrap();
        std::fs::create_dir_all(target.join("debug")).unwrap();
        std::fs::write(target.join("CACHEDIR.TAG"), "Signature").unwrap();
        assert_eq!(
            layout(&target.join("release/compare")),
            Some(Layout {
                target_dir: target.clone(),
                profile: "release".into(),
                triple: None
            })
        );
        assert_eq!(
            layout(&target.join("debug/compare")),
            Some(Layout {
                target_dir: target.clone(),
                profile: "dev".into(),
                triple: None
            })
        );
        assert_eq!(
            layout(&target.join("x86_64-unknown-linux-gnu/release/compare")),
            Some(Layout {
                target_dir: target.clone(),
                profile: "release".into(),
                triple: Some("x86_64-unknown-linux-gnu".into())
            })
        );
        // Without cargo's tag, the directory above the profile's.
        assert_eq!(
            layout(Path::new("/elsewhere/bench/compare")),
            Some(Layout {
                target_dir: PathBuf::from("/elsewhere"),
                profile: "bench".into(),
                triple: None
            })
        );
    }
}
