//! Runs the `compare` binary end to end on tiny settings with this
//! project's own systems (no peer is compiled into a plain test build).

use std::process::Command;

/// Runs `compare` with `args` and `--out` a fresh directory; checks that it
/// succeeded and returns the directory, stdout and stderr.
fn run_compare(args: &[&str]) -> (tempfile::TempDir, String, String) {
    let out = benchmarks::temp_dir();
    let output = Command::new(env!("CARGO_BIN_EXE_compare"))
        .args(args)
        // These runs test this build: never rebuild it with the peers.
        .env(benchmarks::relaunch::OPT_OUT, "1")
        .arg("--out")
        .arg(out.path())
        .output()
        .expect("running compare");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{stdout}\n{stderr}");
    (out, stdout, stderr)
}

#[test]
fn quick_run_writes_tables_csv_and_charts() {
    let (out, stdout, stderr) = run_compare(&[
        "--quick",
        "--systems",
        "okaywal,sediment",
        "--payloads",
        "256",
        "--threads",
        "1,2",
        "--seconds",
        "0.05",
        "--blobs",
        "200",
    ]);
    assert!(stdout.contains("CPUs, data on"), "{stdout}");
    assert!(stdout.contains("| 256 B | 1 | okaywal |"), "{stdout}");
    assert!(stdout.contains("| 256 B | 2 | okaywal |"), "{stdout}");
    for section in ["### (a)", "### (b)", "### (c)", "### (d)"] {
        assert!(stdout.contains(section), "{section} missing:\n{stdout}");
    }
    assert!(stdout.contains("| sediment |"), "{stdout}");
    // Systems left out by --systems are not reported; peers that are
    // not compiled in are named.
    assert!(!stdout.contains("| floor |"), "{stdout}");
    if !cfg!(feature = "redb") {
        assert!(stdout.contains("Peers not compiled in"), "{stdout}");
    }
    // One progress line per cell on stderr.
    assert!(
        stderr.contains("wal 256 B × 1 threads: okaywal"),
        "{stderr}"
    );
    for file in [
        "wal.csv",
        "wal-256B.svg",
        "blob-a.csv",
        "blob-b.svg",
        "blob-c.csv",
        "blob-d.svg",
    ] {
        let path = out.path().join(file);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(!text.is_empty(), "{file} is empty");
    }
    let csv = std::fs::read_to_string(out.path().join("wal.csv")).unwrap();
    assert!(csv.starts_with("payload,threads,system,commits/s"), "{csv}");
}

/// Runs `compare` with `args`, which it must refuse with exit code 2;
/// returns its stderr.
fn refused(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_compare"))
        .args(args)
        .env(benchmarks::relaunch::OPT_OUT, "1")
        .output()
        .expect("running compare");
    assert_eq!(output.status.code(), Some(2), "{args:?}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn bad_arguments_are_refused() {
    assert!(refused(&["--systems", "nosuchdb"]).contains("unknown system"));
    assert!(refused(&["--nodes", "3,0"]).contains("at least one node"));
    assert!(refused(&["--nodes", "three"]).contains("not a number"));
}

#[test]
fn blob_a_measures_the_floor_in_the_same_rounds_by_default() {
    let (out, stdout, _) = run_compare(&[
        "--quick",
        "--only",
        "blob",
        "--seconds",
        "0.05",
        "--blobs",
        "200",
    ]);
    let a = stdout
        .split("### (a)")
        .nth(1)
        .and_then(|rest| rest.split("### (b)").next())
        .unwrap_or_else(|| panic!("no (a) table:\n{stdout}"));
    let row = |system: &str| {
        a.lines()
            .find(|l| l.starts_with(&format!("| {system} |")))
            .unwrap_or_else(|| panic!("no {system} row in (a):\n{a}"))
            .split('|')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(row("floor").last().map(String::as_str), Some("1.00"), "{a}");
    let sediment = row("sediment");
    let ratio: f64 = sediment
        .last()
        .unwrap()
        .parse()
        .expect("a ratio to the floor");
    assert!(ratio > 0.0, "{a}");
    assert!(a.contains("- floor: no store"), "{a}");
    // The floor is a reference, not a store: only (a) runs it.
    let rest = stdout.split("### (b)").nth(1).unwrap();
    assert!(!rest.contains("| floor |"), "{rest}");
    let csv = std::fs::read_to_string(out.path().join("blob-a.csv")).unwrap();
    assert!(csv.lines().any(|l| l.starts_with("floor,")), "{csv}");
}

#[test]
fn transactions_sets_blob_a_s_count_split_over_the_rounds() {
    let (_out, stdout, _) = run_compare(&[
        "--quick",
        "--only",
        "blob",
        "--systems",
        "sediment",
        "--seconds",
        "0.05",
        "--blobs",
        "200",
        "--rounds",
        "3",
        "--transactions",
        "60",
    ]);
    assert!(
        stdout.contains("### (a) 1 thread, 60 transactions of one 16-byte blob"),
        "{stdout}"
    );
    assert!(stdout.contains("3 rounds of 20 transactions"), "{stdout}");
}

#[test]
fn a_bad_transaction_count_is_a_clear_error() {
    let stderr = refused(&["--transactions", "many"]);
    assert!(
        stderr.contains("--transactions: \"many\" is not a number"),
        "{stderr}"
    );
}
