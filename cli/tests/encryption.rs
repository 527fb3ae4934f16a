//! `--key-file`: every subcommand opens an encrypted store (or its WAL)
//! with the right key, and refuses a wrong or missing key, or a key for a
//! plain store, with an error that names the key problem and leaves the
//! store as it was.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn sediment(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Run {
    let output = Command::new(env!("CARGO_BIN_EXE_sediment"))
        .args(args.iter().map(|a| a.as_ref()))
        .stdin(Stdio::null())
        .output()
        .expect("the binary runs");
    let run = Run {
        code: output.status.code().expect("exited, not killed"),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    };
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    run
}

fn ok(run: Run, what: &str) -> Run {
    assert_eq!(
        run.code, 0,
        "{what}: stdout: {}\nstderr: {}",
        run.stdout, run.stderr
    );
    run
}

/// Every file under `dir`, path → bytes.
fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.insert(path.clone(), std::fs::read(&path).unwrap());
            }
        }
    }
    out
}

/// A blob no file of the encrypted store may show: every 16 bytes of it
/// are distinctive.
fn blob(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            b'a' + (state % 26) as u8
        })
        .collect()
}

/// The argument lists of every subcommand on `db` (each with what it
/// needs: files, grain ids, a sequence, the `-o` target).
fn every_command(db: &Path, grain: &str, output: &Path, input: &Path) -> Vec<Vec<String>> {
    let db = db.to_str().unwrap().to_string();
    let s = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    vec![
        s(&["put", &db, input.to_str().unwrap()]),
        s(&["get", &db, grain, "-o", output.to_str().unwrap()]),
        s(&["ls", &db]),
        s(&["archive", &db, grain]),
        s(&["checkpoint", &db, "0"]),
        s(&["log", &db]),
        s(&["stats", &db]),
        s(&["verify", &db]),
        s(&["repair", &db]),
        s(&["wal-dump", &db]),
    ]
}

#[test]
fn every_subcommand_opens_an_encrypted_store_only_with_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let key = root.join("store.key");
    let wrong = root.join("wrong.key");
    // The right key as hexadecimal text, the wrong one as raw bytes.
    std::fs::write(&key, format!("{}\n", "5a".repeat(32))).unwrap();
    std::fs::write(&wrong, [0xa5_u8; 32]).unwrap();
    let db = root.join("db");
    let secrets: Vec<Vec<u8>> = (0..3)
        .map(|i| blob(i, 3000 + 70_000 * i as usize))
        .collect();
    let inputs: Vec<PathBuf> = secrets
        .iter()
        .enumerate()
        .map(|(i, bytes)| {
            let path = root.join(format!("input-{i}"));
            std::fs::write(&path, bytes).unwrap();
            path
        })
        .collect();

    // `put` creates the store encrypted; the flag goes before or after the
    // subcommand.
    let put = ok(
        sediment(&[&"--key-file", &key, &"put", &db, &inputs[0], &inputs[1]]),
        "put",
    );
    let grains: Vec<String> = put.stdout.lines().map(str::to_string).collect();
    assert_eq!(grains.len(), 2, "{}", put.stdout);
    let output = root.join("out");

    // Every subcommand works with the key.
    for args in every_command(&db, &grains[0], &output, &inputs[2]) {
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = args
            .iter()
            .map(|a| a as &dyn AsRef<std::ffi::OsStr>)
            .collect();
        args.extend([&"--key-file" as &dyn AsRef<std::ffi::OsStr>, &key]);
        let run = ok(sediment(&args), &format!("{:?}", args[0].as_ref()));
        if args[0].as_ref() == "get" {
            assert_eq!(std::fs::read(&output).unwrap(), secrets[0]);
        }
        if args[0].as_ref() == "wal-dump" || args[0].as_ref() == "ls" {
            assert!(!run.stdout.is_empty());
        }
    }
    let run = ok(
        sediment(&[&"get", &db, &grains[1], &"--key-file", &key]),
        "get to stdout",
    );
    assert_eq!(run.stdout.as_bytes(), &secrets[1][..]);

    // No file of the store holds any 16 bytes of what was stored.
    let windows: std::collections::HashSet<&[u8]> =
        secrets.iter().flat_map(|s| s.windows(16)).collect();
    for (path, bytes) in files(&db) {
        assert!(
            !bytes.windows(16).any(|w| windows.contains(w)),
            "{} holds plaintext",
            path.display()
        );
    }

    // A wrong key and no key: every subcommand refuses, naming the
    // problem and the key id, and changes nothing.
    let before = files(&db);
    let cases: [(Option<&Path>, &str); 2] = [(Some(&wrong), "wrong key"), (None, "missing key")];
    for (key_file, problem) in cases {
        for args in every_command(&db, &grains[0], &output, &inputs[2]) {
            let mut all: Vec<&dyn AsRef<std::ffi::OsStr>> = args
                .iter()
                .map(|a| a as &dyn AsRef<std::ffi::OsStr>)
                .collect();
            if let Some(key_file) = &key_file {
                all.extend([&"--key-file" as &dyn AsRef<std::ffi::OsStr>, key_file]);
            }
            let run = sediment(&all);
            let what = format!("{} with {problem}", args[0]);
            assert_eq!(run.code, 2, "{what}: {}", run.stderr);
            let lines: Vec<&str> = run.stderr.lines().collect();
            assert_eq!(lines.len(), 1, "{what}: {}", run.stderr);
            let line = lines[0];
            assert!(line.starts_with("sediment: "), "{what}: {line}");
            assert!(line.contains(problem), "{what}: {line}");
            assert!(line.contains("key id 1"), "{what}: {line}");
            let lower = line.to_lowercase();
            assert!(
                !lower.contains("corrupt") && !lower.contains("damaged"),
                "{what}: {line}"
            );
            assert!(files(&db) == before, "{what}: the store changed");
        }
    }

    // A key for a plain store.
    let plain = root.join("plain");
    ok(sediment(&[&"put", &plain, &inputs[0]]), "plain put");
    let before = files(&plain);
    for args in every_command(&plain, "0-0-0-1", &output, &inputs[2]) {
        let mut all: Vec<&dyn AsRef<std::ffi::OsStr>> = args
            .iter()
            .map(|a| a as &dyn AsRef<std::ffi::OsStr>)
            .collect();
        all.extend([&"--key-file" as &dyn AsRef<std::ffi::OsStr>, &key]);
        let run = sediment(&all);
        let what = format!("{} on a plain store", args[0]);
        assert_eq!(run.code, 2, "{what}: {}", run.stderr);
        assert!(
            run.stderr.contains("not encrypted"),
            "{what}: {}",
            run.stderr
        );
        assert!(files(&plain) == before, "{what}: the store changed");
    }
}

#[test]
fn a_bad_key_file_is_an_input_error_that_hides_its_contents() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("short.key");
    std::fs::write(&key, "not-a-key-secret").unwrap();
    let db = dir.path().join("db");
    let run = sediment(&[&"ls", &db, &"--key-file", &key]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("short.key"), "{}", run.stderr);
    assert!(!run.stderr.contains("secret"), "{}", run.stderr);
    let missing = dir.path().join("missing.key");
    let run = sediment(&[&"wal-dump", &db, &"--key-file", &missing]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("missing.key"), "{}", run.stderr);
}
