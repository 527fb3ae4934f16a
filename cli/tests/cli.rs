//! Runs the real `sediment` binary against stores in temporary directories.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::SystemTime;

use okaywal::{Configuration, LogVoid, WriteAheadLog};
use sediment::{Database, GrainId};

/// The result of one run.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn sediment(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Run {
    sediment_with_stdin(args, None)
}

fn sediment_with_stdin(args: &[&dyn AsRef<std::ffi::OsStr>], stdin: Option<&[u8]>) -> Run {
    let source = if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    };
    sediment_reading(args, source, stdin)
}

/// Runs the command with `source` as its standard input, writing `bytes`
/// down it when it is a pipe.
fn sediment_reading(
    args: &[&dyn AsRef<std::ffi::OsStr>],
    source: Stdio,
    bytes: Option<&[u8]>,
) -> Run {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sediment"));
    command
        .args(args.iter().map(|a| a.as_ref()))
        .env("RUST_BACKTRACE", "1")
        .stdin(source)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("the binary runs");
    if let Some(bytes) = bytes {
        use std::io::Write;
        let mut pipe = child.stdin.take().expect("piped stdin");
        pipe.write_all(bytes).expect("writing stdin");
    }
    let output: Output = child.wait_with_output().expect("the binary finishes");
    let run = Run {
        code: output.status.code().expect("exited, not killed"),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    };
    assert!(
        !run.stderr.contains("panicked") && !run.stderr.contains("stack backtrace"),
        "panic or backtrace: {}",
        run.stderr
    );
    run
}

/// Asserts a failed run printed exactly one `sediment: ...` line.
fn assert_error(run: &Run, code: i32, needle: &str) {
    assert_eq!(
        run.code, code,
        "stdout: {}\nstderr: {}",
        run.stdout, run.stderr
    );
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line of error: {:?}", run.stderr);
    assert!(lines[0].starts_with("sediment: "), "{:?}", lines[0]);
    assert!(
        lines[0].contains(needle),
        "{:?} should mention {needle:?}",
        lines[0]
    );
}

fn ok(run: Run) -> Run {
    assert_eq!(
        run.code, 0,
        "stdout: {}\nstderr: {}",
        run.stdout, run.stderr
    );
    run
}

/// A temp dir with a store made by `sediment put` of the given contents;
/// returns the grain ids.
fn store_with(contents: &[&[u8]]) -> (tempfile::TempDir, PathBuf, Vec<String>) {
    let temp = tempfile::tempdir().unwrap();
    let db = temp.path().join("db");
    let mut files = Vec::new();
    for (i, bytes) in contents.iter().enumerate() {
        let file = temp.path().join(format!("in-{i}"));
        fs::write(&file, bytes).unwrap();
        files.push(file);
    }
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"put", &db];
    for file in &files {
        args.push(file);
    }
    let run = ok(sediment(&args));
    let ids: Vec<String> = run.stdout.lines().map(str::to_string).collect();
    assert_eq!(ids.len(), contents.len());
    (temp, db, ids)
}

#[test]
fn put_get_round_trip_and_stdin() {
    let big: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let (temp, db, ids) = store_with(&[b"hello, world\n", b"", &big]);
    for id in &ids {
        id.parse::<GrainId>().expect("put prints grain ids");
    }
    assert_eq!(
        ok(sediment(&[&"get", &db, &ids[0]])).stdout,
        "hello, world\n"
    );
    assert_eq!(ok(sediment(&[&"get", &db, &ids[1]])).stdout, "");
    let out = temp.path().join("out.bin");
    ok(sediment(&[&"get", &db, &ids[2], &"-o", &out]));
    assert_eq!(fs::read(&out).unwrap(), big);

    let run = ok(sediment_with_stdin(
        &[&"put", &db, &"-"],
        Some(b"from stdin"),
    ));
    let id = run.stdout.trim().to_string();
    assert_eq!(ok(sediment(&[&"get", &db, &id])).stdout, "from stdin");

    let run = sediment(&[&"put", &db, &"-", &"-"]);
    assert_error(&run, 2, "only once");
}

#[test]
fn put_creates_only_new_or_empty_stores() {
    let temp = tempfile::tempdir().unwrap();
    let file = temp.path().join("f");
    fs::write(&file, b"x").unwrap();

    // A new directory under an existing parent becomes a store.
    let db = temp.path().join("new");
    ok(sediment(&[&"put", &db, &file]));
    assert!(db.join("index").is_file());

    // An empty directory too.
    let empty = temp.path().join("empty");
    fs::create_dir(&empty).unwrap();
    ok(sediment(&[&"put", &empty, &file]));

    // Not a directory with other files in it, nor a missing parent.
    let other = temp.path().join("other");
    fs::create_dir(&other).unwrap();
    fs::write(other.join("notes.txt"), b"mine").unwrap();
    assert_error(
        &sediment(&[&"put", &other, &file]),
        2,
        "not a sediment store",
    );
    assert_eq!(fs::read_dir(&other).unwrap().count(), 1);
    // Nor one holding a file of the user's named `index`: every command
    // says it is no store and leaves the file as it was.
    let foreign = temp.path().join("foreign");
    fs::create_dir(&foreign).unwrap();
    fs::write(foreign.join("index"), b"my index of recipes").unwrap();
    for args in [
        &[&"put" as &dyn AsRef<std::ffi::OsStr>, &foreign, &file][..],
        &[&"ls", &foreign],
        &[&"verify", &foreign],
    ] {
        assert_error(&sediment(args), 2, "its index file is not a sediment index");
    }
    assert_eq!(
        fs::read(foreign.join("index")).unwrap(),
        b"my index of recipes"
    );
    assert_eq!(fs::read_dir(&foreign).unwrap().count(), 1);
    // An index a crash cut short while creating the store (empty, or
    // zeros) holds nothing: the commands that read say it is no store
    // and leave it, and `put` starts the store there.
    for (name, contents) in [("cut-empty", Vec::new()), ("cut-zeros", vec![0_u8; 100])] {
        let unfinished = temp.path().join(name);
        fs::create_dir(&unfinished).unwrap();
        fs::write(unfinished.join("index"), &contents).unwrap();
        for args in [
            &[&"ls" as &dyn AsRef<std::ffi::OsStr>, &unfinished][..],
            &[&"verify", &unfinished],
            &[&"log", &unfinished],
            &[&"stats", &unfinished],
        ] {
            assert_error(&sediment(args), 2, "creation was interrupted");
        }
        assert_eq!(fs::read(unfinished.join("index")).unwrap(), contents);
        assert_eq!(fs::read_dir(&unfinished).unwrap().count(), 1);
        ok(sediment(&[&"put", &unfinished, &file]));
        ok(sediment(&[&"verify", &unfinished]));
    }
    let deep = temp.path().join("missing/parent/db");
    assert_error(&sediment(&[&"put", &deep, &file]), 2, "parent directory");
    assert!(!temp.path().join("missing").exists());

    // Bad input files are refused before the store is touched.
    let fresh = temp.path().join("fresh");
    assert_error(
        &sediment(&[&"put", &fresh, &temp.path().join("nope")]),
        2,
        "nope",
    );
    assert_error(
        &sediment(&[&"put", &fresh, &temp.path()]),
        2,
        "is a directory",
    );
    assert!(!fresh.exists());

    let help = ok(sediment(&[&"put", &"--help"])).stdout;
    assert!(help.contains("Creates a new store"), "{help}");
}

#[test]
fn other_commands_never_create_a_store() {
    let temp = tempfile::tempdir().unwrap();
    let missing = temp.path().join("missing");
    for args in [
        vec!["get", "0-0-0-1"],
        vec!["archive", "0-0-0-1"],
        vec!["checkpoint", "1"],
        vec!["log"],
        vec!["stats"],
        vec!["verify"],
        vec!["wal-dump"],
    ] {
        let mut full: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&args[0], &missing];
        for arg in &args[1..] {
            full.push(arg);
        }
        assert_error(&sediment(&full), 2, "no such directory");
        assert!(!missing.exists(), "{args:?} created the directory");
    }

    let not_store = temp.path().join("plain");
    fs::create_dir(&not_store).unwrap();
    fs::write(not_store.join("readme"), b"hi").unwrap();
    for command in ["log", "stats", "verify"] {
        assert_error(
            &sediment(&[&command, &not_store]),
            2,
            "not a sediment store",
        );
    }
    assert_error(
        &sediment(&[&"wal-dump", &not_store]),
        2,
        "not an okaywal directory",
    );
    assert_eq!(fs::read_dir(&not_store).unwrap().count(), 1);
}

#[test]
fn bad_grain_ids_and_sequences() {
    let (_temp, db, ids) = store_with(&[b"one", b"two"]);
    for bad in ["x", "1-2-3", "99-0-0-1", "0-0-0-0", "0xzz"] {
        assert_error(&sediment(&[&"get", &db, &bad]), 2, "not a grain id");
        assert_error(
            &sediment(&[&"archive", &db, &ids[0], &bad]),
            2,
            "not a grain id",
        );
    }
    // A well-formed id with nothing there.
    let free = "0-0-100-1";
    assert_error(&sediment(&[&"get", &db, &free]), 2, "not allocated");
    assert_error(&sediment(&[&"archive", &db, &free]), 2, "not allocated");
    // The failed archive did not archive ids[0] along with it.
    assert_eq!(ok(sediment(&[&"get", &db, &ids[0]])).stdout, "one");

    assert_error(
        &sediment(&[&"checkpoint", &db, &"abc"]),
        2,
        "not a sequence",
    );
    // Usage errors from the argument parser are one line too.
    assert_error(
        &sediment(&[&"checkpoint", &db, &"-1"]),
        2,
        "unexpected argument '-1'",
    );
    assert_error(&sediment(&[&"get", &db]), 2, "sediment get --help");
    assert_error(&sediment(&[&"frobnicate"]), 2, "unrecognized subcommand");
    assert_error(
        &sediment(&[&"checkpoint", &db, &"99999"]),
        2,
        "not committed yet",
    );
    assert_error(
        &sediment(&[&"log", &db, &"--since", &"-3"]),
        2,
        "not a sequence",
    );
    assert_error(
        &sediment(&[&"log", &db, &"--since", &"99999"]),
        2,
        "in the future",
    );

    // Usage errors are clap's, with exit code 2.
    let run = sediment(&[&"get", &db]);
    assert_eq!(run.code, 2);
    let run = sediment(&[&"frobnicate"]);
    assert_eq!(run.code, 2);
}

#[test]
fn archive_checkpoint_and_log() {
    let (_temp, db, ids) = store_with(&[b"keep", b"drop me", b"drop me too"]);
    let run = ok(sediment(&[&"archive", &db, &ids[1], &ids[2]]));
    assert!(
        run.stdout.starts_with("archived 2 grain(s) in sequence "),
        "{}",
        run.stdout
    );
    let archived_at: u64 = run.stdout["archived 2 grain(s) in sequence ".len()..]
        .split(';')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    // Archived grains stay readable and cannot be archived twice.
    assert_eq!(ok(sediment(&[&"get", &db, &ids[1]])).stdout, "drop me");
    assert_error(
        &sediment(&[&"archive", &db, &ids[1]]),
        2,
        "already archived",
    );
    // A grain given twice is bad input, not "already archived".
    assert_error(
        &sediment(&[&"archive", &db, &ids[0], &ids[0]]),
        2,
        &format!("grain {} is given more than once", ids[0]),
    );

    let log = ok(sediment(&[&"log", &db])).stdout;
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 2, "{log}");
    assert!(lines[0].contains(&format!("{}:4B", ids[0])), "{log}");
    assert!(lines[1].starts_with(&archived_at.to_string()), "{log}");
    assert!(
        lines[1].contains(&format!("archived {},{}", ids[1], ids[2])),
        "{log}"
    );

    let json = ok(sediment(&[&"log", &db, &"--json"])).stdout;
    let records: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(records.len(), 2);
    assert_eq!(records[0]["new"].as_array().unwrap().len(), 3);
    assert_eq!(records[0]["new"][1]["length"], 7);
    assert_eq!(records[1]["sequence"], archived_at);
    assert_eq!(records[1]["archived"][0], ids[1].as_str());

    let since = ok(sediment(&[
        &"log",
        &db,
        &"--since",
        &archived_at.to_string(),
    ]))
    .stdout;
    assert_eq!(since.lines().count(), 1, "{since}");

    let run = ok(sediment(&[&"checkpoint", &db, &archived_at.to_string()]));
    assert!(run.stdout.contains("freed 2 grain(s)"), "{}", run.stdout);
    assert_error(&sediment(&[&"get", &db, &ids[1]]), 2, "not allocated");
    assert_eq!(ok(sediment(&[&"get", &db, &ids[0]])).stdout, "keep");

    // The checkpoint dropped the records up to it; its own record remains.
    let json = ok(sediment(&[&"log", &db, &"--json"])).stdout;
    let last: serde_json::Value = serde_json::from_str(json.lines().last().unwrap()).unwrap();
    assert_eq!(last["checkpointed_to"], archived_at);
    assert_eq!(last["freed"].as_array().unwrap().len(), 2);

    // Checkpointing to an earlier sequence (or the same) changes nothing
    // and says so, naming where the store stands.
    for earlier in [archived_at - 1, archived_at] {
        let run = ok(sediment(&[&"checkpoint", &db, &earlier.to_string()]));
        assert_eq!(
            run.stdout.trim(),
            format!("already checkpointed to sequence {archived_at}: nothing to do")
        );
    }
    let again = ok(sediment(&[&"log", &db, &"--json"])).stdout;
    assert_eq!(again, json, "no transaction was added");
}

#[test]
fn stats_reports_basins_and_wal_files() {
    let (_temp, db, ids) = store_with(&[b"a", &[7u8; 1000], &[9u8; 5000]]);
    ok(sediment(&[&"archive", &db, &ids[0]]));
    let text = ok(sediment(&[&"stats", &db])).stdout;
    assert!(text.contains("basin"), "{text}");
    assert!(text.contains("WAL files:"), "{text}");
    assert!(text.contains("wal-"), "{text}");

    let json: serde_json::Value =
        serde_json::from_str(&ok(sediment(&[&"stats", &db, &"--json"])).stdout).unwrap();
    let basins = json["basins"].as_array().unwrap();
    assert!(!basins.is_empty());
    let used: u64 = basins
        .iter()
        .map(|b| b["grains_used"].as_u64().unwrap())
        .sum();
    let archived: u64 = basins
        .iter()
        .map(|b| b["grains_archived"].as_u64().unwrap())
        .sum();
    let id0: GrainId = ids[0].parse().unwrap();
    assert_eq!(archived, u64::from(id0.count()));
    assert!(used >= archived);
    for basin in basins {
        assert!(basin["bytes_on_disk"].as_u64().unwrap() > 0);
        assert_eq!(basin["strata"], 1);
    }
    let wal = json["wal_files"].as_array().unwrap();
    assert!(!wal.is_empty());
    assert!(wal
        .iter()
        .all(|f| f["state"].as_str().is_some_and(|s| !s.is_empty())));
}

/// Flips one byte of `needle` where it appears in the store's stratum
/// files; returns the file and offset.
fn damage(db: &Path, needle: &[u8]) -> (PathBuf, u64) {
    for entry in fs::read_dir(db).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        if !name.starts_with("stratum-") {
            continue;
        }
        let bytes = fs::read(&path).unwrap();
        if let Some(at) = bytes.windows(needle.len()).position(|w| w == needle) {
            let file = fs::OpenOptions::new().write(true).open(&path).unwrap();
            let at = (at + needle.len() / 2) as u64;
            file.write_all_at(&[bytes[at as usize] ^ 0x55], at).unwrap();
            file.sync_all().unwrap();
            return (path, at);
        }
    }
    panic!("{needle:?} is not in any stratum file");
}

#[test]
fn verify_finds_a_damaged_grain() {
    let needle = b"THIS GRAIN WILL BE DAMAGED 0123456789";
    let (_temp, db, ids) = store_with(&[b"healthy", needle]);
    let run = ok(sediment(&[&"verify", &db]));
    assert!(run.stdout.contains("no problems"), "{}", run.stdout);
    ok(sediment(&[&"verify", &db, &"--progress"]));

    let (file, _) = damage(&db, needle);
    let run = sediment(&[&"verify", &db]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let problem = run
        .stdout
        .lines()
        .find(|l| l.starts_with("problem:"))
        .unwrap_or_else(|| panic!("no problem line in {}", run.stdout));
    assert!(problem.contains(&ids[1]), "{problem}");
    assert!(
        problem.contains(file.file_name().unwrap().to_str().unwrap()) && problem.contains("offset"),
        "{problem}"
    );
    assert!(problem.contains("checksum"), "{problem}");
    assert!(run.stdout.contains("1 problem"), "{}", run.stdout);

    let json = sediment(&[&"verify", &db, &"--json"]);
    assert_eq!(json.code, 1);
    let json: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(json["ok"], false);
    assert_eq!(json["problems"][0]["grain"], ids[1].as_str());

    // Reading the damaged grain fails cleanly; the healthy one still reads.
    let run = sediment(&[&"get", &db, &ids[1]]);
    assert_error(&run, 3, "checksum mismatch");
    assert!(
        run.stdout.is_empty(),
        "damaged bytes on stdout: {:?}",
        run.stdout
    );
    let out = _temp.path().join("partial");
    assert_error(
        &sediment(&[&"get", &db, &ids[1], &"-o", &out]),
        3,
        "checksum",
    );
    assert!(!out.exists(), "a failed get leaves no partial file");
    assert_eq!(ok(sediment(&[&"get", &db, &ids[0]])).stdout, "healthy");
}

/// `get -o /dev/stdout` (and its other names) writes to standard output
/// when that is a pipe, as docs/cli.md shows: the link in /proc names no
/// file (`pipe:[N]`), and no temporary file can be made beside it.
#[test]
fn get_to_dev_stdout_writes_down_a_pipe() {
    let (_temp, db, ids) = store_with(&[b"down the pipe"]);
    for name in ["/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"] {
        let run = ok(sediment(&[&"get", &db, &ids[0], &"-o", &name]));
        assert_eq!(run.stdout, "down the pipe", "{name}");
    }
}

/// `get -o /dev/stdout` with standard output going to a file (`>> log`)
/// writes the blob where that descriptor stands, appended, and never
/// replaces the file behind it (which would drop what it held).
#[test]
fn get_to_dev_stdout_appends_to_the_file_standard_output_goes_to() {
    use std::os::unix::fs::MetadataExt;
    let (temp, db, ids) = store_with(&[b"the blob"]);
    for name in ["/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"] {
        let log = temp.path().join("log.txt");
        fs::write(&log, b"important line\n").unwrap();
        let inode = fs::metadata(&log).unwrap().ino();
        let appending = fs::OpenOptions::new().append(true).open(&log).unwrap();
        let status = Command::new(env!("CARGO_BIN_EXE_sediment"))
            .args(
                [
                    &"get" as &dyn AsRef<std::ffi::OsStr>,
                    &db,
                    &ids[0],
                    &"-o",
                    &name,
                ]
                .iter()
                .map(|a| a.as_ref()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::from(appending))
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        assert!(
            status.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&status.stderr)
        );
        assert_eq!(
            fs::read(&log).unwrap(),
            b"important line\nthe blob",
            "{name}"
        );
        assert_eq!(
            fs::metadata(&log).unwrap().ino(),
            inode,
            "{name}: the file was replaced"
        );
    }
}

/// A failed `get -o` leaves the output path as it was: an existing file
/// keeps its contents (also through a symbolic link, which stays), a new
/// path gets no partial file, a device is left alone (`-o /dev/stdout` must
/// never delete `/dev/stdout`), and no temporary file is left beside any of
/// them. A `get -o` that succeeds replaces an existing file whole and keeps
/// its permissions.
#[test]
fn a_failed_get_leaves_the_output_path_as_it_was() {
    use std::os::unix::fs::PermissionsExt;
    let needle = b"THIS BLOB WILL BE DAMAGED AS WELL 0123456789";
    let (temp, db, ids) = store_with(&[needle, b"healthy blob"]);
    damage(&db, needle);
    let out = temp.path().join("out");
    fs::create_dir(&out).unwrap();
    let listing = || {
        let mut names: Vec<String> = fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };

    let to_device = out.join("to-null");
    std::os::unix::fs::symlink("/dev/null", &to_device).unwrap();
    assert_error(
        &sediment(&[&"get", &db, &ids[0], &"-o", &to_device]),
        3,
        "checksum",
    );
    assert!(
        fs::symlink_metadata(&to_device).is_ok(),
        "the link to /dev/null was deleted"
    );

    let target = out.join("target.txt");
    fs::write(&target, b"old contents").unwrap();
    fs::set_permissions(&target, fs::Permissions::from_mode(0o640)).unwrap();
    let link = out.join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    for path in [&target, &link] {
        assert_error(
            &sediment(&[&"get", &db, &ids[0], &"-o", path]),
            3,
            "checksum",
        );
        assert_eq!(
            fs::read(&target).unwrap(),
            b"old contents",
            "a failed get through {} changed the file",
            path.display()
        );
    }
    assert!(
        fs::symlink_metadata(&link).is_ok_and(|m| m.file_type().is_symlink()),
        "the link was deleted"
    );

    let plain = out.join("plain");
    assert_error(
        &sediment(&[&"get", &db, &ids[0], &"-o", &plain]),
        3,
        "checksum",
    );
    assert!(!plain.exists(), "a failed get leaves no partial file");
    assert_eq!(
        listing(),
        ["link", "target.txt", "to-null"],
        "files left behind"
    );

    // Success: through the link, the file is replaced whole, the link
    // stays a link and the file keeps its permissions.
    ok(sediment(&[&"get", &db, &ids[1], &"-o", &link]));
    assert_eq!(fs::read(&target).unwrap(), b"healthy blob");
    assert!(fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(
        fs::metadata(&target).unwrap().permissions().mode() & 0o777,
        0o640
    );
    ok(sediment(&[&"get", &db, &ids[1], &"-o", &to_device]));
    assert_eq!(
        listing(),
        ["link", "target.txt", "to-null"],
        "files left behind"
    );
}

/// `get -o` into an existing file that its user may write, in a directory
/// where they may not create one: written in place, and a damaged blob,
/// checked before anything is written, leaves the file as it was. Runs as
/// an unprivileged user through `setpriv`, so only as root.
#[test]
fn get_writes_in_place_where_no_temporary_file_can_be_made() {
    use std::os::unix::fs::{chown, PermissionsExt};
    let is_root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout == b"0\n");
    let setpriv = Path::new("/usr/bin/setpriv");
    if !is_root || !setpriv.exists() {
        println!("skipped: needs root and /usr/bin/setpriv to run as another user");
        return;
    }
    let needle = b"A BLOB THAT WILL BE DAMAGED 0123456789";
    let (temp, db, ids) = store_with(&[b"healthy blob", needle]);
    let damaged = temp.path().join("damaged");
    let (_other_temp, other, other_ids) = store_with(&[needle]);
    fs::rename(&other, &damaged).unwrap();
    damage(&damaged, needle);
    let out = temp.path().join("out");
    fs::create_dir(&out).unwrap();
    let target = out.join("mine.txt");
    fs::write(&target, b"old contents").unwrap();
    chown(&target, Some(65534), Some(65534)).unwrap();
    fs::set_permissions(&out, fs::Permissions::from_mode(0o555)).unwrap();
    // Everything else readable by the other user.
    for path in [temp.path(), db.as_path(), damaged.as_path()] {
        fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
    }
    for dir in [&db, &damaged] {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        }
    }
    let as_nobody = |store: &Path, id: &str| {
        let output = Command::new(setpriv)
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_sediment"))
            .arg("get")
            .arg(store)
            .arg(id)
            .arg("-o")
            .arg(&target)
            .output()
            .unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (code, stderr) = as_nobody(&damaged, &other_ids[0]);
    assert_eq!(code, Some(3), "{stderr}");
    assert!(stderr.contains("checksum"), "{stderr}");
    assert_eq!(fs::read(&target).unwrap(), b"old contents");
    let (code, stderr) = as_nobody(&db, &ids[0]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(fs::read(&target).unwrap(), b"healthy blob");
    assert_eq!(fs::read_dir(&out).unwrap().count(), 1, "files left behind");
    fs::set_permissions(&out, fs::Permissions::from_mode(0o755)).unwrap();
}

/// Runs `sediment` with its standard output on `/dev/full`: every write
/// to it fails with "no space left on device".
fn sediment_to_full_stdout(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Run {
    let output = Command::new(env!("CARGO_BIN_EXE_sediment"))
        .args(args.iter().map(|a| a.as_ref()))
        .stdin(Stdio::null())
        .stdout(
            fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .unwrap(),
        )
        .stderr(Stdio::piped())
        .output()
        .expect("the binary runs");
    Run {
        code: output.status.code().expect("exited, not killed"),
        stdout: String::new(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Once `put`, `archive` or `checkpoint` committed, a failure to print
/// what it did is a warning that says it (the ids `put` stored), and the
/// command exits 0: a script that runs a failed command again would store
/// the files twice. A command that committed nothing still fails.
#[test]
fn a_committed_command_whose_output_fails_exits_0_and_names_what_it_did() {
    let (temp, db, _) = store_with(&[b"first"]);
    let file = temp.path().join("second");
    fs::write(&file, b"second blob").unwrap();
    let run = sediment_to_full_stdout(&[&"put", &db, &file, &file]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stderr
            .starts_with("sediment: warning: sequence 2 committed")
            && run.stderr.contains("No space left on device"),
        "{}",
        run.stderr
    );
    // The ids the warning names are the blobs that were stored.
    let listed = ok(sediment(&[&"ls", &db, &"--json"])).stdout;
    let named: Vec<&str> = run
        .stderr
        .trim_end()
        .rsplit(": ")
        .next()
        .unwrap()
        .split(' ')
        .collect();
    assert_eq!(named.len(), 2, "{}", run.stderr);
    for id in &named {
        assert_eq!(
            ok(sediment(&[&"get", &db, id])).stdout,
            "second blob",
            "{id}: {listed}"
        );
    }

    let run = sediment_to_full_stdout(&[&"archive", &db, &named[0]]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stderr.contains("sequence 3 committed"),
        "{}",
        run.stderr
    );
    let run = sediment_to_full_stdout(&[&"checkpoint", &db, &"3", &"--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stderr.contains("freed 1 grain"), "{}", run.stderr);
    assert_error(&sediment(&[&"get", &db, &named[0]]), 2, "not allocated");

    // Nothing committed: the failure to print is an error.
    let run = sediment_to_full_stdout(&[&"checkpoint", &db, &"3"]);
    assert_eq!(run.code, 3, "{}", run.stderr);
    let run = sediment_to_full_stdout(&[&"ls", &db]);
    assert_eq!(run.code, 3, "{}", run.stderr);
}

/// A damaged blob larger than one read: `get` to standard output writes
/// none of it (a pipeline that ignores the exit status must not receive
/// the first megabytes of a blob whose checksum fails at its end).
#[test]
fn get_of_a_damaged_large_blob_writes_nothing_to_stdout() {
    let needle = b"THE END OF A LARGE BLOB THAT WILL BE DAMAGED";
    let mut large: Vec<u8> = (0..3 << 20).map(|i: u32| b'a' + (i % 26) as u8).collect();
    large.extend_from_slice(needle);
    let (_temp, db, ids) = store_with(&[&large]);
    assert_eq!(
        ok(sediment(&[&"get", &db, &ids[0]])).stdout.len(),
        large.len()
    );
    damage(&db, needle);
    let run = sediment(&[&"get", &db, &ids[0]]);
    assert_error(&run, 3, "checksum");
    assert!(
        run.stdout.is_empty(),
        "{} bytes of a damaged blob reached stdout",
        run.stdout.len()
    );
}

/// Every header is stored twice. `verify` reports a copy that does not
/// verify (exit 1, with the file and the copy) and, being read-only,
/// leaves it as it is: the next `verify` reports it again. `sediment
/// repair` rewrites it from its twin; then `verify` finds nothing wrong.
#[test]
fn verify_reports_a_damaged_header_copy() {
    let (_temp, db, ids) = store_with(&[b"two copies of every header"]);
    let id: GrainId = ids[0].parse().unwrap();
    let stratum = format!("stratum-{}-{}", id.basin(), id.stratum());
    let slot = sediment::format::stratum_slot_size(id.basin());
    let index_slot = sediment::format::INDEX_SLOT_SIZE;
    // (file, offset, bytes written there, copy, what the problem says)
    // (A zeroed copy 1 is damage here: both copies were written by the
    // checkpoint `put` ended with. `None` cuts the file after copy 0.)
    type Case<'a> = (&'a str, u64, Option<Vec<u8>>, u32, &'a str);
    let cases: [Case; 7] = [
        (&stratum, 40, Some(vec![0x5A]), 0, "checksum"),
        (&stratum, slot + 40, Some(vec![0x5A]), 1, "checksum"),
        (&stratum, 0, Some(vec![0; 4096]), 0, "magic"),
        (&stratum, slot, Some(vec![0; slot as usize]), 1, "missing"),
        ("index", index_slot + 20, Some(vec![0x5A]), 1, "checksum"),
        (
            "index",
            index_slot,
            Some(vec![0; index_slot as usize]),
            1,
            "missing",
        ),
        ("index", index_slot, None, 1, "missing"),
    ];
    for (name, at, bytes, copy, says) in cases {
        let path = db.join(name);
        let file = fs::OpenOptions::new().write(true).open(&path).unwrap();
        match bytes {
            Some(bytes) => file.write_all_at(&bytes, at).unwrap(),
            None => file.set_len(at).unwrap(),
        }
        file.sync_all().unwrap();
        drop(file);

        let run = sediment(&[&"verify", &db]);
        assert_eq!(run.code, 1, "{name}@{at}: {}\n{}", run.stdout, run.stderr);
        let problem = run
            .stdout
            .lines()
            .find(|l| l.starts_with("problem:"))
            .unwrap_or_else(|| panic!("{name}@{at}: no problem line in {}", run.stdout));
        assert!(
            problem.contains(name)
                && problem.contains(&format!("header copy {copy}"))
                && problem.contains(says),
            "{name}@{at}: {problem}"
        );
        assert!(run.stdout.contains("1 problem"), "{}", run.stdout);
        let again = sediment(&[&"verify", &db]);
        assert_eq!(again.code, 1, "{name}@{at}: verify repaired the copy");

        let repaired = ok(sediment(&[&"repair", &db]));
        assert!(
            repaired.stdout.contains("repaired 1 header copy"),
            "{}",
            repaired.stdout
        );
        // Nothing is left to repair; `--json` says so as a number.
        let again = ok(sediment(&[&"repair", &db, &"--json"]));
        let json: serde_json::Value = serde_json::from_str(&again.stdout).unwrap();
        assert_eq!(json["repaired_header_copies"], 0, "{json}");
        let run = ok(sediment(&[&"verify", &db, &"--json"]));
        let json: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
        assert_eq!(json["ok"], true, "{name}@{at}: not repaired: {json}");
        assert_eq!(
            ok(sediment(&[&"get", &db, &ids[0]])).stdout,
            "two copies of every header"
        );
    }
}

#[test]
fn a_damaged_index_is_a_clear_error() {
    let (_temp, db, ids) = store_with(&[b"x"]);
    fs::write(db.join("index"), vec![0xA5; 8192]).unwrap();
    let run = sediment(&[&"verify", &db]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("index"), "{}", run.stdout);
    assert!(run.stdout.contains("cannot be opened"), "{}", run.stdout);
    assert_error(&sediment(&[&"get", &db, &ids[0]]), 3, "index");
    assert_error(&sediment(&[&"stats", &db]), 3, "index");
}

/// Writes a log with okaywal itself: committed, rolled-back and damaged
/// entries, then a torn commit record. Returns the directory and the
/// torn offset.
fn torn_log() -> (tempfile::TempDir, PathBuf, u64) {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("log");
    let log = WriteAheadLog::recover(&dir, LogVoid).unwrap();
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(b"first").unwrap();
    entry.commit().unwrap();
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(b"second, a").unwrap();
    entry.write_chunk(b"second, b").unwrap();
    entry.commit().unwrap();
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(b"rolled back").unwrap();
    entry.rollback().unwrap();
    let mut entry = log.begin_entry().unwrap();
    let damaged = entry.write_chunk(b"damaged data").unwrap();
    entry.commit().unwrap();
    let mut entry = log.begin_entry().unwrap();
    let last = entry.write_chunk(b"torn").unwrap();
    entry.commit().unwrap();
    drop(log);

    let segment = dir.join(format!("wal-{}", damaged.position.file_id));
    let file = fs::OpenOptions::new().write(true).open(&segment).unwrap();
    // One byte of the fourth entry's data...
    file.write_all_at(b"X", damaged.position.offset + 25 + 3)
        .unwrap();
    // ...and the last entry's commit record, as if torn mid-write.
    let commit_at = last.position.offset + 25 + 4 + 4;
    file.write_all_at(&[0xEE; 10], commit_at + 5).unwrap();
    (temp, dir, commit_at)
}

/// Bytes that were synced once and no longer verify, with records synced
/// after them, are damage: `wal-dump` says so (the records walk ends there
/// as at a torn tail, which recovery would forgive) and its JSON carries
/// it. Here a commit record in the middle of the log is zeroed, which
/// reads like unwritten space.
#[test]
fn wal_dump_tells_damage_in_the_middle_from_a_torn_tail() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("log");
    let log = WriteAheadLog::recover(&dir, LogVoid).unwrap();
    let mut records = Vec::new();
    for data in [&b"first"[..], b"second", b"third"] {
        let mut entry = log.begin_entry().unwrap();
        records.push(entry.write_chunk(data).unwrap());
        entry.commit().unwrap();
    }
    drop(log);
    let second = &records[1];
    let segment = dir.join(format!("wal-{}", second.position.file_id));
    let commit_at = second.position.offset + 25 + u64::from(second.length) + 4;
    let file = fs::OpenOptions::new().write(true).open(&segment).unwrap();
    file.write_all_at(&[0; 25], commit_at).unwrap();

    let text = ok(sediment(&[&"wal-dump", &dir])).stdout;
    assert!(
        text.contains(&format!("DAMAGE at offset {commit_at} (unwritten space)")),
        "commit record at {commit_at}: {text}"
    );
    assert!(!text.contains("torn tail at"), "{text}");
    let json: serde_json::Value =
        serde_json::from_str(&ok(sediment(&[&"wal-dump", &dir, &"--json"])).stdout).unwrap();
    let end = &json["segments"][0]["end"];
    assert_eq!(end["offset"], commit_at, "{json}");
    assert_eq!(end["damage"]["offset"], commit_at, "{json}");
}

#[test]
fn wal_dump_shows_entries_and_the_torn_tail() {
    let (_temp, dir, torn_at) = torn_log();
    let run = ok(sediment(&[&"wal-dump", &dir]));
    let text = run.stdout;
    assert!(
        text.contains("header: first entry 1, format version 1"),
        "{text}"
    );
    let entry_lines: Vec<&str> = text
        .lines()
        .filter(|l| l.trim_start().starts_with("entry "))
        .collect();
    assert_eq!(entry_lines.len(), 5, "{text}");
    assert!(
        entry_lines[0].contains("committed") && entry_lines[0].contains("[5 bytes ok]"),
        "{text}"
    );
    assert!(
        entry_lines[1].contains("committed") && entry_lines[1].contains("[9 bytes ok, 9 bytes ok]"),
        "{text}"
    );
    assert!(entry_lines[2].contains("rolled back"), "{text}");
    assert!(
        entry_lines[3].contains("incomplete") && entry_lines[3].contains("CRC MISMATCH"),
        "{text}"
    );
    assert!(
        entry_lines[4].contains("incomplete") && entry_lines[4].contains("no commit record"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "torn tail at offset {torn_at} (record header checksum mismatch"
        )),
        "{text}"
    );
    // The fourth entry's data was synced before the fifth entry's records:
    // its failed CRC is damage, and said so.
    assert!(
        text.contains("DAMAGE at offset") && text.contains("entry 4 failed its CRC"),
        "{text}"
    );

    let json: serde_json::Value =
        serde_json::from_str(&ok(sediment(&[&"wal-dump", &dir, &"--json", &"--records"])).stdout)
            .unwrap();
    let segment = &json["segments"][0];
    assert_eq!(segment["header"]["status"], "valid");
    let statuses: Vec<&str> = segment["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses,
        [
            "committed",
            "committed",
            "rolled_back",
            "incomplete",
            "incomplete"
        ]
    );
    assert_eq!(segment["end"]["offset"], torn_at);
    assert_eq!(segment["end"]["torn"], true);
    // 1 + 1 + 2 + 1 + 1 + 1 + 1 + 1 + 1 records before the torn one.
    assert_eq!(segment["records"].as_array().unwrap().len(), 10);
    assert_eq!(segment["records"][0]["offset"], 512);
}

#[test]
fn wal_dump_steps_over_padding_before_a_large_chunk() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("log");
    let log = WriteAheadLog::recover(&dir, LogVoid).unwrap();
    let mut entry = log.begin_entry().unwrap();
    let large = entry.write_chunk(&vec![7_u8; 100_000]).unwrap();
    entry.commit().unwrap();
    drop(log);

    let json: serde_json::Value =
        serde_json::from_str(&ok(sediment(&[&"wal-dump", &dir, &"--json", &"--records"])).stdout)
            .unwrap();
    let segment = &json["segments"][0];
    let records = segment["records"].as_array().unwrap();
    let kinds: Vec<&str> = records
        .iter()
        .map(|r| r["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["padding", "chunk", "commit"], "{segment}");
    assert_eq!(records[0]["offset"], 512);
    assert_eq!(records[1]["offset"], large.position.offset);
    assert_eq!(
        records[0]["length"].as_u64().unwrap() + 25 + 512,
        large.position.offset
    );
    let entries = segment["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{segment}");
    assert_eq!(entries[0]["status"], "committed");
}

#[test]
fn wal_dump_reports_truncation_and_unwritten_space() {
    let (_temp, dir, _) = torn_log();
    let segment = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_str().unwrap() == "wal-1")
        .unwrap();
    // Cut the file inside the second entry's second chunk.
    let file = fs::OpenOptions::new().write(true).open(&segment).unwrap();
    let cut = 512 + (25 + 5 + 4) + 25 + (25 + 9 + 4) + 25 + 3;
    file.set_len(cut).unwrap();
    let text = ok(sediment(&[&"wal-dump", &dir])).stdout;
    assert!(
        text.contains(&format!(
            "torn tail at offset {} (a record of 38 bytes would extend past the end of the file)",
            cut - 28
        )),
        "{text}"
    );

    // A fresh log ends in zeros.
    let temp = tempfile::tempdir().unwrap();
    let fresh = temp.path().join("log");
    let log = WriteAheadLog::recover(&fresh, LogVoid).unwrap();
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(b"only").unwrap();
    entry.commit().unwrap();
    drop(log);
    let text = ok(sediment(&[&"wal-dump", &fresh])).stdout;
    assert!(text.contains("(unwritten space)"), "{text}");
    assert!(
        text.contains("1 committed, 0 rolled back, 0 incomplete"),
        "{text}"
    );
}

/// Names, lengths, modification times and contents of every file.
fn snapshot(dir: &Path) -> BTreeMap<String, (u64, SystemTime, Vec<u8>)> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            let meta = fs::metadata(&path).unwrap();
            (
                path.file_name().unwrap().to_str().unwrap().to_string(),
                (
                    meta.len(),
                    meta.modified().unwrap(),
                    fs::read(&path).unwrap(),
                ),
            )
        })
        .collect()
}

#[test]
fn wal_dump_never_writes() {
    // A store whose last transaction is only in the WAL: opening it would
    // replay and checkpoint it.
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("db");
    let db = Database::recover(&dir).unwrap();
    let mut tx = db.begin_transaction().unwrap();
    tx.write(b"pending in the WAL").unwrap();
    tx.commit().unwrap();
    drop(db);

    let before = snapshot(&dir);
    let text = ok(sediment(&[&"wal-dump", &dir])).stdout;
    assert!(text.contains("1 committed"), "{text}");
    ok(sediment(&[&"wal-dump", &dir, &"--json", &"--records"]));
    assert!(before == snapshot(&dir), "wal-dump changed the directory");

    // The store still opens and has the pending blob.
    let log = ok(sediment(&[&"log", &dir])).stdout;
    assert_eq!(log.lines().count(), 1, "{log}");
}

#[test]
fn wal_dump_shows_version_info_and_bad_headers() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("log");
    let log = Configuration::default_for(&dir)
        .version_info(b"app v2".to_vec())
        .open(LogVoid)
        .unwrap();
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(b"data").unwrap();
    entry.commit().unwrap();
    drop(log);
    // A segment whose header never became durable, and one whose header
    // was damaged although records follow it.
    fs::write(dir.join("wal-1000"), vec![0; 4096]).unwrap();
    let first = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter_map(|n| n.strip_prefix("wal-")?.parse::<u64>().ok())
        .min()
        .unwrap();
    let original = dir.join(format!("wal-{first}"));
    let mut copy = fs::read(&original).unwrap();
    copy[100] ^= 1;
    fs::write(dir.join(format!("wal-{first}")), &copy).unwrap();

    let text = ok(sediment(&[&"wal-dump", &dir])).stdout;
    assert!(text.contains("segment wal-1000"), "{text}");
    assert!(text.contains("no valid record follows"), "{text}");
    assert!(
        text.contains("header: INVALID (segment header checksum mismatch)"),
        "{text}"
    );
    assert!(text.contains("valid records follow the header"), "{text}");

    // Undo the damage: the version info shows as hex and text.
    copy[100] ^= 1;
    fs::write(&original, &copy).unwrap();
    let text = ok(sediment(&[&"wal-dump", &dir])).stdout;
    assert!(
        text.contains("version info 6 byte(s), hex 617070207632, utf-8 \"app v2\""),
        "{text}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&ok(sediment(&[&"wal-dump", &dir, &"--json"])).stdout).unwrap();
    assert_eq!(json["segments"][0]["header"]["version_info_utf8"], "app v2");
    assert_eq!(json["segments"][1]["file"], "wal-1000");
    assert_eq!(json["segments"][1]["header"]["status"], "invalid");
    assert_eq!(json["segments"][1]["header"]["records_follow"], false);
}

/// A segment file of okaywal 0.2/0.3 is shown as that (an open replays and
/// converts it), never as a header that "never became durable" and a file
/// that is reusable; another program's file named like a segment is shown
/// as no segment, and recovery's refusal of it is printed.
#[test]
fn wal_dump_names_older_format_segments_and_files_that_are_no_segment() {
    let temp = tempfile::tempdir().unwrap();
    let older = temp.path().join("older");
    fs::create_dir(&older).unwrap();
    // An okaywal 0.3 segment header (`okw`, version 0, no version info)
    // followed by unwritten space.
    let mut segment = b"okw\0\0".to_vec();
    segment.resize(4096, 0);
    fs::write(older.join("wal-1"), &segment).unwrap();
    let text = ok(sediment(&[&"wal-dump", &older])).stdout;
    assert!(text.contains("header: okaywal 0.2/0.3 format"), "{text}");
    assert!(!text.contains("INVALID"), "{text}");
    assert!(!text.contains("is reusable"), "{text}");
    assert!(text.contains("reusable: none"), "{text}");
    assert!(text.contains("recovery: no problems"), "{text}");
    let json: serde_json::Value =
        serde_json::from_str(&ok(sediment(&[&"wal-dump", &older, &"--json"])).stdout).unwrap();
    assert_eq!(
        json["segments"][0]["header"]["status"], "older_format",
        "{json}"
    );
    assert_eq!(json["problems"], serde_json::json!([]), "{json}");

    let foreign = temp.path().join("foreign");
    let log = WriteAheadLog::recover(&foreign, LogVoid).unwrap();
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(b"data").unwrap();
    entry.commit().unwrap();
    log.shutdown().unwrap();
    drop(log);
    fs::write(foreign.join("wal-7"), b"my own notes, not a log\n").unwrap();
    let before = snapshot(&foreign);
    let text = ok(sediment(&[&"wal-dump", &foreign])).stdout;
    assert!(text.contains("segment wal-7"), "{text}");
    assert!(
        text.contains("header: NOT A SEGMENT okaywal reads"),
        "{text}"
    );
    assert!(text.contains("recovery: 1 PROBLEM(S)"), "{text}");
    assert!(
        text.contains("  wal-7 offset 0: not a segment of this log"),
        "{text}"
    );
    assert!(!text.contains("is reusable"), "{text}");
    assert_eq!(snapshot(&foreign), before, "wal-dump wrote");
}

/// Damage to the last record of a segment looks like a torn tail from
/// inside that segment; the next segment's header records where the
/// segment ended, and recovery refuses the log. `wal-dump` says so.
#[test]
fn wal_dump_reports_damage_that_a_later_segment_proves() {
    /// Never checkpoints, so every segment stays in the directory.
    struct Keeps;
    impl okaywal::LogManager for Keeps {
        fn recover(&mut self, _entry: &mut okaywal::Entry<'_>) -> std::io::Result<()> {
            Ok(())
        }
        fn checkpoint_to(
            &mut self,
            _last: okaywal::EntryId,
            _entries: &mut okaywal::SegmentReader,
            _wal: &WriteAheadLog,
        ) -> std::io::Result<()> {
            Err(std::io::Error::other("kept for the test"))
        }
    }
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("log");
    let log = Configuration::default_for(&dir)
        .checkpoint_after_bytes(16 << 10)
        .open(Keeps)
        .unwrap();
    let mut records = Vec::new();
    while records
        .last()
        .is_none_or(|r: &okaywal::ChunkRecord| r.position.file_id == records[0].position.file_id)
    {
        let mut entry = log.begin_entry().unwrap();
        records.push(entry.write_chunk(&[7; 3000]).unwrap());
        entry.commit().unwrap();
    }
    drop(log);
    // The last entry of the first segment: zero its commit record.
    let last = &records[records.len() - 2];
    let segment = format!("wal-{}", last.position.file_id);
    let commit_at = last.position.offset + 25 + u64::from(last.length) + 4;
    let file = fs::OpenOptions::new()
        .write(true)
        .open(dir.join(&segment))
        .unwrap();
    file.write_all_at(&[0; 25], commit_at).unwrap();

    let text = ok(sediment(&[&"wal-dump", &dir])).stdout;
    let section: String = text
        .lines()
        .skip_while(|l| !l.starts_with(&format!("segment {segment} ")))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(!section.contains("torn tail at"), "{text}");
    assert!(
        section.contains(&format!("records end at offset {commit_at}")),
        "{text}"
    );
    assert!(text.contains("recovery: 1 PROBLEM(S)"), "{text}");
    assert!(
        text.contains(&format!("  {segment} offset {commit_at}: ")),
        "{text}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&ok(sediment(&[&"wal-dump", &dir, &"--json"])).stdout).unwrap();
    assert_eq!(json["problems"][0]["file"], segment.as_str(), "{json}");
    assert_eq!(json["problems"][0]["offset"], commit_at, "{json}");
    // The later segment's header, which proves it, is shown.
    let first_id = last.position.file_id;
    assert!(
        text.contains(&format!(
            "the segment before it, {first_id}, ended at offset "
        )),
        "{text}"
    );
    assert_eq!(
        json["segments"][1]["header"]["previous"]["id"], first_id,
        "{json}"
    );
    assert_eq!(
        json["segments"][1]["header"]["previous"]["end"],
        commit_at + 25,
        "{json}"
    );
}

#[test]
fn a_store_open_in_another_process_is_refused() {
    let (_temp, db, ids) = store_with(&[b"held"]);
    let held = Database::recover(&db).unwrap();
    for args in [
        vec![&"stats" as &dyn AsRef<std::ffi::OsStr>, &db],
        vec![&"get", &db, &ids[0]],
        vec![&"verify", &db],
        // The dump of the WAL too: a writer's half-written records would
        // read as damage.
        vec![&"wal-dump", &db],
    ] {
        let run = sediment(&args);
        assert_eq!(
            run.code, 3,
            "stdout: {}\nstderr: {}",
            run.stdout, run.stderr
        );
        assert!(
            run.stderr.contains("sediment.lock") && run.stderr.contains("another process"),
            "{}",
            run.stderr
        );
    }
    held.shutdown().unwrap();
    assert_eq!(ok(sediment(&[&"get", &db, &ids[0]])).stdout, "held");
    ok(sediment(&[&"wal-dump", &db]));
}

/// A flipped byte in the commit log: every blob still reads, `log` fails
/// naming the damage (and how to read past it), and `verify` reports it.
#[test]
fn a_damaged_commit_log_is_reported_by_log_and_verify_and_blobs_still_read() {
    let (_temp, db, mut ids) = store_with(&[b"first"]);
    for (i, bytes) in [&b"second"[..], b"third"].iter().enumerate() {
        let file = db.with_file_name(format!("more-{i}"));
        fs::write(&file, bytes).unwrap();
        let run = ok(sediment(&[&"put", &db, &file]));
        ids.push(run.stdout.trim().to_string());
    }
    let before = ok(sediment(&[&"log", &db])).stdout;
    assert_eq!(before.lines().count(), 3, "{before}");

    // The second record's last byte.
    let path = db.join("commits-1");
    let mut bytes = fs::read(&path).unwrap();
    let first_len = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
    let second_len =
        u32::from_le_bytes(bytes[8 + first_len..12 + first_len].try_into().unwrap()) as usize;
    let at = 8 + first_len + 8 + second_len - 1;
    bytes[at] ^= 0x01;
    fs::write(&path, bytes).unwrap();

    for (id, expected) in ids.iter().zip(["first", "second", "third"]) {
        assert_eq!(ok(sediment(&[&"get", &db, id])).stdout, expected);
    }
    let run = sediment(&[&"log", &db]);
    assert_error(&run, 3, "commits-1 offset");
    assert!(run.stderr.contains("--since 4"), "{}", run.stderr);
    assert_eq!(
        run.stdout, "",
        "a listing whose range holds the damage fails"
    );
    let run = sediment(&[&"verify", &db]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let problem = run
        .stdout
        .lines()
        .find(|l| l.starts_with("problem:"))
        .unwrap_or_else(|| panic!("no problem line in {}", run.stdout));
    assert!(
        problem.contains(&format!("commits-1 offset {}", 8 + first_len)),
        "{problem}"
    );
    assert!(problem.contains("checksum mismatch"), "{problem}");

    // `ls` and `stats` still work, and warn that archived flags the hidden
    // records set are unknown; so does `checkpoint`, which cannot free
    // them. A store whose commit log is intact gets no warning.
    for args in [
        &[&"ls" as &dyn AsRef<std::ffi::OsStr>, &db][..],
        &[&"stats", &db],
    ] {
        let run = ok(sediment(args));
        assert!(
            run.stderr.starts_with("sediment: warning: ")
                && run.stderr.contains("commits-1")
                && run.stderr.contains("no checkpoint frees them"),
            "{}",
            run.stderr
        );
    }
    let (_clean_temp, clean, _) = store_with(&[b"clean"]);
    assert_eq!(ok(sediment(&[&"ls", &clean])).stderr, "");
    assert_eq!(ok(sediment(&[&"stats", &clean])).stderr, "");
}

/// `get`, `log`, `stats`, `verify` and `wal-dump` open the store
/// read-only: after them every file's bytes and modification time are as
/// they were, although the store's last transaction is only in the WAL
/// (an open for writing would replay and checkpoint it).
#[test]
fn inspection_commands_never_write_to_the_store() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("db");
    let db = Database::recover(&dir).unwrap();
    let mut tx = db.begin_transaction().unwrap();
    let in_strata = tx.write(b"moved into the strata").unwrap();
    tx.commit().unwrap();
    db.checkpoint_wal().unwrap();
    let mut tx = db.begin_transaction().unwrap();
    let in_wal = tx.write(b"pending in the WAL").unwrap();
    tx.commit().unwrap();
    drop(db);

    let before = snapshot(&dir);
    std::thread::sleep(std::time::Duration::from_millis(20));
    let (strata, wal) = (in_strata.to_string(), in_wal.to_string());
    assert_eq!(
        ok(sediment(&[&"get", &dir, &strata])).stdout,
        "moved into the strata"
    );
    assert_eq!(
        ok(sediment(&[&"get", &dir, &wal])).stdout,
        "pending in the WAL"
    );
    assert_eq!(ok(sediment(&[&"log", &dir])).stdout.lines().count(), 2);
    ok(sediment(&[&"log", &dir, &"--json"]));
    ok(sediment(&[&"stats", &dir]));
    ok(sediment(&[&"stats", &dir, &"--json"]));
    ok(sediment(&[&"verify", &dir]));
    ok(sediment(&[&"verify", &dir, &"--json"]));
    ok(sediment(&[&"wal-dump", &dir]));
    assert!(
        before == snapshot(&dir),
        "an inspection command changed the store"
    );
}

/// A committed transaction whose WAL entry is damaged, in a segment the
/// next run's segment vouches for: the store does not open for writing,
/// `get` of its blobs fails instead of answering "not allocated", and
/// `verify` (read-only, past the damage) names the damaged record and
/// every blob the transaction wrote, exits 1 and writes nothing.
#[test]
fn verify_names_a_damaged_wal_entry_and_the_blobs_it_took() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("db");
    // A first run commits a transaction of four blobs (one written
    // straight into its grains) and stops before any checkpoint.
    let db = sediment::Config::for_directory(&dir)
        .wal(|wal| wal.preallocate_bytes(64 << 10))
        .open()
        .unwrap();
    let mut tx = db.begin_transaction().unwrap();
    let lost: Vec<GrainId> = [40, 300, 70_290, 17]
        .iter()
        .map(|&len| tx.write(&vec![7_u8; len]).unwrap())
        .collect();
    tx.commit().unwrap();
    drop(db);
    second_run_without_a_checkpoint(&dir);
    let segment = dir.join("wal-1");
    let mut bytes = fs::read(&segment).unwrap();
    bytes[512 + 25 + 9 + 20] ^= 0x01;
    fs::write(&segment, &bytes).unwrap();
    let name = segment.file_name().unwrap().to_str().unwrap().to_string();

    let before = snapshot(&dir);
    let run = sediment(&[&"get", &dir, &lost[0].to_string()]);
    assert_error(&run, 3, &name);
    let run = sediment(&[&"verify", &dir]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let problems: Vec<&str> = run
        .stdout
        .lines()
        .filter(|l| l.starts_with("problem:"))
        .collect();
    assert!(
        problems
            .iter()
            .any(|p| p.contains(&name) && p.contains("CRC")),
        "{}",
        run.stdout
    );
    for id in &lost {
        assert!(
            problems
                .iter()
                .any(|p| p.contains(&id.to_string()) && p.contains("lost")),
            "{id} not named: {}",
            run.stdout
        );
    }
    // The damaged record and the four blobs, nothing of the second run.
    assert_eq!(problems.len(), 1 + lost.len(), "{}", run.stdout);
    assert!(before == snapshot(&dir), "verify changed the store");
}

/// A committed transaction whose WAL entry is damaged in the last segment,
/// which nothing written later vouches for: the log reads it as a torn
/// tail and an open for writing drops the transaction, which is right only
/// if a power cut interrupted its writing. `verify` cannot tell, so it
/// says so (exit 1), naming the transaction and, when its chunks can be
/// read, its blobs, and writes nothing; `wal-dump` says the same.
#[test]
fn verify_names_a_transaction_that_a_damaged_last_wal_segment_would_drop() {
    // (where the byte is flipped, what verify must name)
    for (in_header, needle) in [(true, "past offset 512"), (false, "does not verify")] {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path().join("db");
        let db = sediment::Config::for_directory(&dir).open().unwrap();
        let mut tx = db.begin_transaction().unwrap();
        let written: Vec<GrainId> = [40, 300, 17]
            .iter()
            .map(|&len| tx.write(&vec![3_u8; len]).unwrap())
            .collect();
        tx.commit().unwrap();
        drop(db);
        let segment = dir.join("wal-1");
        let mut bytes = fs::read(&segment).unwrap();
        // The first record (offset 512): its header's entry id, or its data.
        let at = if in_header { 512 + 3 } else { 512 + 25 + 20 };
        bytes[at] ^= 0x01;
        fs::write(&segment, &bytes).unwrap();

        let before = snapshot(&dir);
        let run = sediment(&[&"verify", &dir]);
        assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
        let problems: Vec<&str> = run
            .stdout
            .lines()
            .filter(|l| l.starts_with("problem:"))
            .collect();
        assert!(
            problems.iter().any(|p| p.contains("wal-1")
                && p.contains("transaction 1 ")
                && p.contains(needle)
                && p.contains("power cut")),
            "{}",
            run.stdout
        );
        if !in_header {
            for id in &written {
                assert!(
                    problems.iter().any(|p| p.contains(&id.to_string())),
                    "{id} not named: {}",
                    run.stdout
                );
            }
        }
        let dump = ok(sediment(&[&"wal-dump", &dir])).stdout;
        if in_header {
            assert!(
                dump.contains("BUT the commit records of entry 1 verify past it"),
                "{dump}"
            );
        } else {
            assert!(dump.contains("entry 1: incomplete"), "{dump}");
        }
        assert!(
            before == snapshot(&dir),
            "verify or wal-dump changed the store"
        );
    }
}

/// An entry of many chunks is one short line in `wal-dump`: their count,
/// their bytes and the offsets of those that fail their CRC (`--json`
/// still lists every chunk).
#[test]
fn wal_dump_sums_up_an_entry_of_many_chunks() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("wal");
    let log = WriteAheadLog::recover(&dir, LogVoid).unwrap();
    let mut entry = log.begin_entry().unwrap();
    let chunks: Vec<_> = (0..40_u8)
        .map(|i| entry.write_chunk(&[i; 10]).unwrap())
        .collect();
    let id = entry.commit().unwrap();
    log.shutdown().unwrap();
    drop(log);

    let dump = ok(sediment(&[&"wal-dump", &dir])).stdout;
    let line = format!(
        "  entry {}: committed, 40 chunk(s) of 400 bytes, all ok",
        id.0
    );
    assert!(dump.lines().any(|l| l == line), "{dump}");

    let damaged = chunks[4].position;
    let segment = dir.join(format!("wal-{}", damaged.file_id));
    let file = fs::OpenOptions::new().write(true).open(&segment).unwrap();
    file.write_all_at(b"X", damaged.offset + 25 + 3).unwrap();
    drop(file);
    let dump = ok(sediment(&[&"wal-dump", &dir])).stdout;
    assert!(
        dump.lines()
            .any(|l| l.starts_with(&format!("  entry {}: incomplete", id.0))
                && l.ends_with(&format!(
                    "40 chunk(s) of 400 bytes, CRC MISMATCH at offset {}",
                    damaged.offset
                ))),
        "{dump}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&ok(sediment(&[&"wal-dump", &dir, &"--json"])).stdout).unwrap();
    assert_eq!(
        json["segments"][0]["entries"][0]["chunks"]
            .as_array()
            .unwrap()
            .len(),
        40
    );
}

/// Parses every line of `stdout` as one JSON object.
fn json_lines(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect()
}

/// `ls` lists every live blob once, in id order, with its length, the
/// sequence that wrote it and whether it is archived: blobs in the strata,
/// large ones written straight into their grains, and ones still only in
/// the WAL; freed blobs are not listed. Its ids get the blobs back.
#[test]
fn ls_lists_live_blobs_with_length_sequence_and_archived() {
    let big: Vec<u8> = (0..300_000u32).map(|i| (i * 13 % 251) as u8).collect();
    let (_temp, db, ids) = store_with(&[b"kept", b"", &big, b"archived", b"freed"]);
    let archived = ok(sediment(&[&"archive", &db, &ids[4], &"--json"])).stdout;
    let at = json_lines(&archived)[0]["sequence"].as_u64().unwrap();
    ok(sediment(&[&"checkpoint", &db, &at.to_string()]));
    ok(sediment(&[&"archive", &db, &ids[3]]));
    // Two blobs committed and left only in the WAL (no shutdown).
    let (in_wal, wal_sequence) = {
        let store = Database::recover(&db).unwrap();
        let mut tx = store.begin_transaction().unwrap();
        let ids = [
            tx.write(b"only in the WAL, after the others").unwrap(),
            tx.write(&[5_u8; 3000]).unwrap(),
        ];
        let sequence = tx.commit().unwrap();
        assert_eq!(store.stats().unwrap().blobs_in_wal, 2);
        (ids.map(|id| id.to_string()), sequence.0)
    };

    let text = ok(sediment(&[&"ls", &db])).stdout;
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 6, "{text}");
    let json = json_lines(&ok(sediment(&[&"ls", &db, &"--json"])).stdout);
    assert_eq!(json.len(), 6);
    let listed: Vec<GrainId> = json
        .iter()
        .map(|item| item["id"].as_str().unwrap().parse().unwrap())
        .collect();
    let mut sorted = listed.clone();
    sorted.sort();
    assert_eq!(listed, sorted, "in id order");

    let find = |id: &str| {
        json.iter()
            .find(|item| item["id"] == id)
            .unwrap_or_else(|| panic!("{id} not listed: {json:?}"))
    };
    // (The blobs written since take other ids than the freed one.)
    assert!(!in_wal.contains(&ids[4]));
    assert!(
        !json.iter().any(|item| item["id"] == ids[4].as_str()),
        "freed"
    );
    for (id, length, is_archived) in [
        (&ids[0], 4, false),
        (&ids[1], 0, false),
        (&ids[2], 300_000, false),
        (&ids[3], 8, true),
    ] {
        let item = find(id);
        assert_eq!(item["length"], length, "{item}");
        assert_eq!(item["sequence"], 1, "{item}");
        assert_eq!(item["archived"], is_archived, "{item}");
    }
    for (id, length) in in_wal.iter().zip([33, 3000]) {
        let item = find(id);
        assert_eq!(item["length"], length, "{item}");
        assert_eq!(item["sequence"], wal_sequence, "{item}");
        assert_eq!(item["archived"], false, "{item}");
    }
    // The text has the same blobs in the same order, one per line.
    for (line, item) in lines.iter().zip(&json) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(fields[0], item["id"].as_str().unwrap(), "{line}");
        assert_eq!(fields[1], item["length"].to_string(), "{line}");
        assert_eq!(&fields[2..4], ["bytes", "sequence"], "{line}");
        assert_eq!(fields[4], item["sequence"].to_string(), "{line}");
        assert_eq!(fields.get(5) == Some(&"archived"), item["archived"] == true);
    }
    // Lost ids are found again: every listed blob reads back.
    let copy = db.with_file_name("copy");
    ok(sediment(&[&"get", &db, &ids[2], &"-o", &copy]));
    assert_eq!(fs::read(&copy).unwrap(), big);
    assert_eq!(
        ok(sediment(&[&"get", &db, &in_wal[0]])).stdout,
        "only in the WAL, after the others"
    );

    // Not a store: the usual input errors.
    let temp = tempfile::tempdir().unwrap();
    assert_error(&sediment(&[&"ls", &temp.path()]), 2, "not a sediment store");
    assert_error(
        &sediment(&[&"ls", &temp.path().join("nowhere")]),
        2,
        "no such directory",
    );
}

/// A blob whose grain header is damaged is reported on stderr and skipped;
/// the others are listed, and the exit code says the store is damaged.
#[test]
fn ls_reports_a_damaged_header_and_lists_the_rest() {
    let needle = b"THE HEADER BEFORE THIS BLOB WILL BE DAMAGED";
    let (_temp, db, ids) = store_with(&[b"before", needle, b"after"]);
    let (path, at) = damage(&db, needle);
    // `damage` flipped a byte in the middle of the blob; make the length
    // field of its header (8 bytes before the data) impossible too.
    let start = at - (needle.len() / 2) as u64;
    let file = fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.write_all_at(&u32::MAX.to_le_bytes(), start - 8)
        .unwrap();
    drop(file);

    let run = sediment(&[&"ls", &db]);
    assert_eq!(run.code, 3, "{}\n{}", run.stdout, run.stderr);
    let listed: Vec<&str> = run
        .stdout
        .lines()
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(listed, [ids[0].as_str(), ids[2].as_str()]);
    let errors: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(errors.len(), 2, "{}", run.stderr);
    assert!(errors[0].contains(&ids[1]), "{}", errors[0]);
    assert!(
        errors[1].contains("1 blob(s) could not be listed"),
        "{}",
        errors[1]
    );
}

/// Standard input is read before the store is touched: input that fails
/// creates no store at a new path, and leaves an existing one as it was.
#[test]
fn put_whose_standard_input_fails_leaves_no_store_behind() {
    let temp = tempfile::tempdir().unwrap();
    let db = temp.path().join("new");
    // Reading a directory fails (EISDIR).
    let directory = fs::File::open(temp.path()).unwrap();
    let run = sediment_reading(&[&"put", &db, &"-"], directory.into(), None);
    assert_error(&run, 2, "cannot read standard input");
    assert!(!db.exists(), "a failed put created {}", db.display());

    // More than the largest blob, from a sparse file (no disk used).
    let too_big = temp.path().join("too-big");
    let file = fs::File::create(&too_big).unwrap();
    file.set_len(sediment::DEFAULT_MAX_BLOB_BYTES + 1).unwrap();
    drop(file);
    let a = temp.path().join("a.txt");
    fs::write(&a, b"a file").unwrap();
    let stdin = fs::File::open(&too_big).unwrap();
    let run = sediment_reading(&[&"put", &db, &a, &"-"], stdin.into(), None);
    assert_error(&run, 2, "more than the largest blob");
    assert!(!db.exists(), "a failed put created {}", db.display());

    // An existing store keeps its files as they were.
    let (_store_temp, store, _ids) = store_with(&[b"kept"]);
    let before = snapshot(&store);
    let stdin = fs::File::open(&too_big).unwrap();
    let run = sediment_reading(&[&"put", &store, &"-"], stdin.into(), None);
    assert_error(&run, 2, "more than the largest blob");
    assert_eq!(snapshot(&store), before);
}

/// `put`, `archive` and `checkpoint` take `--json` like `log` and `stats`:
/// the same facts as their text, as JSON.
#[test]
fn put_archive_and_checkpoint_print_json() {
    let temp = tempfile::tempdir().unwrap();
    let db = temp.path().join("db");
    let a = temp.path().join("a.txt");
    fs::write(&a, b"first file").unwrap();
    let run = ok(sediment_with_stdin(
        &[&"put", &db, &"--json", &a, &"-"],
        Some(b"from stdin!"),
    ));
    let put = json_lines(&run.stdout);
    assert_eq!(put.len(), 2, "one object per file: {}", run.stdout);
    assert_eq!(put[0]["file"], a.display().to_string());
    assert_eq!(put[0]["length"], 10);
    assert_eq!(put[1]["file"], "-");
    assert_eq!(put[1]["length"], 11);
    assert_eq!(put[0]["sequence"], 1);
    assert_eq!(put[1]["sequence"], 1);
    let ids: Vec<String> = put
        .iter()
        .map(|p| p["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ok(sediment(&[&"get", &db, &ids[0]])).stdout, "first file");
    assert_eq!(ok(sediment(&[&"get", &db, &ids[1]])).stdout, "from stdin!");
    // The text form prints the same ids.
    let run = ok(sediment(&[&"put", &db, &a]));
    let third = run.stdout.trim().to_string();
    third.parse::<GrainId>().unwrap();

    let run = ok(sediment(&[&"archive", &db, &"--json", &ids[0], &third]));
    let archived = json_lines(&run.stdout);
    assert_eq!(archived.len(), 1, "{}", run.stdout);
    assert_eq!(archived[0]["archived"], serde_json::json!([ids[0], third]));
    assert_eq!(archived[0]["sequence"], 3);

    let run = ok(sediment(&[&"checkpoint", &db, &"3", &"--json"]));
    let checkpoint = json_lines(&run.stdout);
    assert_eq!(checkpoint.len(), 1, "{}", run.stdout);
    assert_eq!(checkpoint[0]["checkpointed_to"], 3);
    assert_eq!(checkpoint[0]["sequence"], 4);
    let mut freed: Vec<String> = checkpoint[0]["freed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_str().unwrap().to_string())
        .collect();
    freed.sort();
    let mut expected = vec![ids[0].clone(), third.clone()];
    expected.sort();
    assert_eq!(freed, expected);
    assert_error(&sediment(&[&"get", &db, &ids[0]]), 2, "not allocated");

    // Nothing to do: no transaction, where the store stands.
    let run = ok(sediment(&[&"checkpoint", &db, &"2", &"--json"]));
    assert_eq!(
        json_lines(&run.stdout),
        [serde_json::json!({"checkpointed_to": 3, "sequence": null, "freed": []})]
    );
    let log = json_lines(&ok(sediment(&[&"log", &db, &"--json"])).stdout);
    assert_eq!(log.last().unwrap()["sequence"], 4, "no transaction added");
}

/// `get -o` refuses a path inside the store directory, however it is
/// spelled, before opening the store; the store is untouched and still
/// opens. Paths outside it, even with a similar name, are written.
#[test]
fn get_refuses_an_output_path_inside_the_store() {
    let (temp, db, ids) = store_with(&[b"blob"]);
    let index_before = fs::read(db.join("index")).unwrap();
    let link_to_store = temp.path().join("link-to-store");
    std::os::unix::fs::symlink(&db, &link_to_store).unwrap();
    let link_to_index = temp.path().join("link-to-index");
    std::os::unix::fs::symlink(db.join("index"), &link_to_index).unwrap();
    let dangling = temp.path().join("dangling");
    std::os::unix::fs::symlink(db.join("would-be-created"), &dangling).unwrap();
    let relative_link = temp.path().join("relative");
    std::os::unix::fs::symlink("db/another-new-file", &relative_link).unwrap();
    let db_name = db.file_name().unwrap().to_str().unwrap();
    let dotted = db.join("..").join(db_name).join("newfile");
    let before = snapshot(&db);

    for (store, output) in [
        (&db, db.join("index")),
        (&db, dotted.clone()),
        (&db, db.join("newfile")),
        (&db, db.clone()),
        (&db, link_to_store.join("index")),
        (&db, link_to_store.join("newfile")),
        (&link_to_store, db.join("newfile")),
        (&db, link_to_index.clone()),
        (&db, dangling.clone()),
        (&db, relative_link.clone()),
    ] {
        let run = sediment(&[&"get", store, &ids[0], &"-o", &output]);
        assert_error(&run, 2, "inside the store directory");
        assert!(
            before == snapshot(&db),
            "-o {}: the store changed",
            output.display()
        );
    }
    assert_eq!(fs::read(db.join("index")).unwrap(), index_before);
    assert!(!db.join("would-be-created").exists());

    // A relative path from inside the store's parent.
    let run = Command::new(env!("CARGO_BIN_EXE_sediment"))
        .current_dir(&db)
        .args(["get", "../db", &ids[0], "-o", "./index"])
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&run.stderr).contains("inside the store directory"));
    assert!(before == snapshot(&db), "the store changed");

    // The store still opens and reads.
    assert_eq!(ok(sediment(&[&"get", &db, &ids[0]])).stdout, "blob");
    // Beside the store, even named like it, is fine.
    for output in [temp.path().join("db-copy"), temp.path().join("db.blob")] {
        ok(sediment(&[&"get", &db, &ids[0], &"-o", &output]));
        assert_eq!(fs::read(&output).unwrap(), b"blob");
    }
    // Through a link that leads outside the store, too.
    let outside = temp.path().join("outside");
    std::os::unix::fs::symlink(temp.path().join("target"), &outside).unwrap();
    ok(sediment(&[&"get", &db, &ids[0], &"-o", &outside]));
    assert_eq!(fs::read(temp.path().join("target")).unwrap(), b"blob");
}

/// A second run of the store that commits one transaction and dies before
/// any checkpoint (see `testkit::sediment_runs`), so the first run's WAL
/// segment stays.
fn second_run_without_a_checkpoint(dir: &Path) {
    let _ = testkit::sediment_runs::second_run_without_a_checkpoint(
        Configuration::default_for(dir).preallocate_bytes(64 << 10),
    );
}

/// Flips one bit of `needle` where it is stored in the store's WAL files.
fn damage_in_wal(dir: &Path, needle: &[u8]) {
    let wal = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name().unwrap().to_string_lossy().starts_with("wal-")
                && fs::read(p)
                    .unwrap()
                    .windows(needle.len())
                    .any(|w| w == needle)
        })
        .expect("a WAL file holding the needle");
    let mut bytes = fs::read(&wal).unwrap();
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap();
    bytes[at] ^= 0x20;
    fs::write(&wal, bytes).unwrap();
}

/// Damage in the middle of the WAL stops every command that opens the
/// store, and the error says how to go on: `--recovery point-in-time`
/// keeps the transactions before the damage, `--recovery skip-corrupted`
/// all but the damaged one. Read-only commands apply it in memory only;
/// `repair` with it makes it permanent.
#[test]
fn recovery_flag_opens_a_store_whose_wal_is_damaged_in_the_middle() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("db");
    let db = Database::recover(&dir).unwrap();
    let mut ids = Vec::new();
    for needle in [
        &b"first transaction, before the damage"[..],
        b"second transaction, DAMAGED in the WAL",
        b"third transaction, after the damage",
    ] {
        let mut tx = db.begin_transaction().unwrap();
        ids.push(tx.write(needle).unwrap().to_string());
        tx.commit().unwrap();
    }
    // Left only in the WAL: no shutdown.
    drop(db);
    damage_in_wal(&dir, b"DAMAGED in the WAL");
    let before = snapshot(&dir);

    let refused = sediment(&[&"ls", &dir]);
    assert_eq!(refused.code, 3, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("--recovery point-in-time")
            && refused.stderr.contains("--recovery skip-corrupted"),
        "{}",
        refused.stderr
    );
    let listed = |args: &[&dyn AsRef<std::ffi::OsStr>]| -> Vec<String> {
        ok(sediment(args))
            .stdout
            .lines()
            .map(|l| l.split_whitespace().next().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        listed(&[&"ls", &dir, &"--recovery", &"skip-corrupted"]),
        [ids[0].clone(), ids[2].clone()]
    );
    assert_eq!(
        listed(&[&"--recovery", &"point-in-time", &"ls", &dir]),
        [ids[0].clone()]
    );
    assert_eq!(
        ok(sediment(&[
            &"get",
            &dir,
            &ids[2],
            &"--recovery",
            &"skip-corrupted"
        ]))
        .stdout,
        "third transaction, after the damage"
    );
    assert!(before == snapshot(&dir), "a read-only command wrote");
    assert_eq!(sediment(&[&"verify", &dir]).code, 1);

    ok(sediment(&[
        &"repair",
        &dir,
        &"--recovery",
        &"skip-corrupted",
    ]));
    assert_eq!(listed(&[&"ls", &dir]), [ids[0].clone(), ids[2].clone()]);
    ok(sediment(&[&"verify", &dir]));
}

/// A WAL that ends at a record that does not verify, with a commit record
/// of a later transaction verifying past it, is what a power cut in the
/// middle of that transaction's write leaves, and also damage after it
/// committed. Read-only commands show the store without it; a command
/// that writes (which would drop it for good) refuses until
/// `--recovery point-in-time` says to go on.
#[test]
fn a_committing_command_does_not_drop_a_commit_past_the_end_unasked() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("db");
    let db = Database::recover(&dir).unwrap();
    let mut ids = Vec::new();
    for needle in [
        &b"first transaction, intact"[..],
        b"last transaction, DAMAGED at the tail",
    ] {
        let mut tx = db.begin_transaction().unwrap();
        ids.push(tx.write(needle).unwrap().to_string());
        tx.commit().unwrap();
    }
    drop(db);
    damage_in_wal(&dir, b"DAMAGED at the tail");
    let before = snapshot(&dir);
    let new_file = temp.path().join("new.txt");
    fs::write(&new_file, b"a new blob").unwrap();

    assert_eq!(sediment(&[&"verify", &dir]).code, 1);
    let refused = sediment(&[&"put", &dir, &new_file]);
    assert_eq!(refused.code, 3, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("commit records of WAL entry")
            && refused.stderr.contains("--recovery point-in-time"),
        "{}",
        refused.stderr
    );
    assert_error(&sediment(&[&"repair", &dir]), 3, "--recovery point-in-time");
    assert!(before == snapshot(&dir), "a refused command wrote");
    // Read-only, the store is shown as recovery would leave it.
    let listed = ok(sediment(&[&"ls", &dir])).stdout;
    assert!(
        listed.contains(&ids[0]) && !listed.contains(&ids[1]),
        "{listed}"
    );

    let put = ok(sediment(&[
        &"put",
        &dir,
        &new_file,
        &"--recovery",
        &"point-in-time",
    ]));
    let new_id = put.stdout.trim().to_string();
    let listed = ok(sediment(&[&"ls", &dir])).stdout;
    assert!(
        listed.contains(&ids[0]) && listed.contains(&new_id) && !listed.contains(&ids[1]),
        "{listed}"
    );
    ok(sediment(&[&"verify", &dir]));
}

/// A store whose one blob (written straight into its grain) has a
/// flipped byte: `verify` finds one problem.
fn damaged_store() -> (tempfile::TempDir, PathBuf) {
    let (temp, db, _) = store_with(&[&vec![0xAB; 100_000]]);
    let stratum = fs::read_dir(&db)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("stratum-")
                && fs::read(p).unwrap().windows(64).any(|w| w == [0xAB; 64])
        })
        .expect("the blob's stratum file");
    let mut bytes = fs::read(&stratum).unwrap();
    let at = bytes.windows(64).position(|w| w == [0xAB; 64]).unwrap() + 1000;
    bytes[at] ^= 0x01;
    fs::write(&stratum, bytes).unwrap();
    assert_eq!(sediment(&[&"verify", &db]).code, 1);
    (temp, db)
}

/// `verify db | head -1`: the reader goes away before the report is
/// written, and the exit code still says problems were found.
#[test]
fn verify_reports_problems_to_a_reader_that_went_away() {
    let (_temp, db) = damaged_store();
    for json in [false, true] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_sediment"));
        command.arg("verify").arg(&db);
        if json {
            command.arg("--json");
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Closed before the store is even open: every write fails.
        drop(child.stdout.take());
        let output = child.wait_with_output().unwrap();
        assert_eq!(
            output.status.code(),
            Some(1),
            "json {json}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// A standard error or output that cannot be written (`2>>log` or
/// `>out` on a full disk) fails with an exit code of the command's own,
/// never a panic or an abort, and never success.
#[test]
fn an_unwritable_stderr_or_stdout_is_no_panic_and_no_success() {
    let full = || {
        Stdio::from(
            fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .unwrap(),
        )
    };
    let temp = tempfile::tempdir().unwrap();
    let nowhere = temp.path().join("nowhere");
    let refused = Command::new(env!("CARGO_BIN_EXE_sediment"))
        .arg("ls")
        .arg(&nowhere)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(full())
        .status()
        .unwrap();
    assert_eq!(refused.code(), Some(2), "{refused:?}");

    for args in [&["--help"][..], &["--version"], &["ls", "--help"]] {
        let status = Command::new(env!("CARGO_BIN_EXE_sediment"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(full())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert_eq!(status.code(), Some(3), "{args:?}: {status:?}");
    }
}

/// Input that is not a regular file is read before the store is made: a
/// device that gives more than the largest blob is refused (exit 2) and
/// leaves no new store behind, and a pipe is read whole first.
#[test]
fn put_reads_a_device_or_a_pipe_before_making_the_store() {
    let temp = tempfile::tempdir().unwrap();
    let db = temp.path().join("db");
    let refused = sediment(&[&"put", &db, &"/dev/zero"]);
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("more than the largest blob"),
        "{}",
        refused.stderr
    );
    assert!(!db.exists(), "a refused put left a store behind");

    // A named pipe with a writer on the other side.
    let fifo = temp.path().join("fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || fs::write(&fifo, b"through a pipe").unwrap())
    };
    let id = ok(sediment(&[&"put", &db, &fifo])).stdout;
    writer.join().unwrap();
    assert_eq!(
        ok(sediment(&[&"get", &db, &id.trim()])).stdout,
        "through a pipe"
    );
}
