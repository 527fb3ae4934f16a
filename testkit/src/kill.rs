//! The real-process `SIGKILL` tests' protocol.
//!
//! The parent ([`KillRuns::run`]) starts this same test binary again, once
//! per kill, running only the child test with an environment variable
//! naming the directory; the child ([`child_dir`]) works there and
//! reports each acknowledged operation on stdout ([`Report`]) *after* the
//! acknowledgment; the parent kills it with `SIGKILL` after a seeded random
//! delay, collects the lines it printed and checks the directory.
//!
//! ```no_run
//! use testkit::kill::{child_dir, KillRuns, Report};
//!
//! # fn child() {
//! // In the child test:
//! let Some(dir) = child_dir("MY_KILL_CHILD_DIR") else { return };
//! let report = Report::new();
//! report.line(format_args!("ACK {}", 1));
//! # }
//! # fn parent(dir: std::path::PathBuf) {
//! // In the parent test:
//! let runs = KillRuns {
//!     child_test: "child_process",
//!     child_env: "MY_KILL_CHILD_DIR",
//!     dir,
//!     kills: 50,
//!     delay_ms: 20..170,
//! };
//! runs.run(7, |kill, lines| { /* reopen and check */ });
//! # }
//! ```

use std::io::{self, BufRead, BufReader, Stdout, Write};
use std::ops::Range;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::rng::Rng;

/// The variable that tells a child which run (0-based) it is.
pub const RUN_ENV: &str = "TESTKIT_KILL_RUN";

/// In a child started by [`KillRuns::run`] with `env`: the directory to
/// work in. `None` when the test runs as an ordinary test (it should then
/// return at once).
#[must_use]
pub fn child_dir(env: &str) -> Option<PathBuf> {
    std::env::var_os(env).map(PathBuf::from)
}

/// In a child: which run this is (0 for the first).
#[must_use]
pub fn child_run() -> u64 {
    std::env::var(RUN_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The child's reports to its parent: whole lines on stdout, each flushed
/// before `line` returns. Clones share stdout.
#[derive(Debug, Clone)]
pub struct Report(Arc<Mutex<Stdout>>);

impl Default for Report {
    fn default() -> Self {
        Self::new()
    }
}

impl Report {
    /// A reporter on this process's stdout.
    #[must_use]
    pub fn new() -> Self {
        Self(Arc::new(Mutex::new(io::stdout())))
    }

    /// Prints one line and flushes it.
    ///
    /// # Panics
    /// If stdout is closed (the parent is gone).
    pub fn line(&self, line: std::fmt::Arguments<'_>) {
        let mut out = crate::recorder::lock(&self.0);
        writeln!(out, "{line}").expect("the parent reads stdout");
        out.flush().expect("the parent reads stdout");
    }
}

/// The parent's side: how to start and kill the children.
#[derive(Debug, Clone)]
pub struct KillRuns {
    /// The name of the child test in this test binary.
    pub child_test: &'static str,
    /// The variable that names the directory for the child.
    pub child_env: &'static str,
    /// The directory every run works in.
    pub dir: PathBuf,
    /// How many children to start and kill.
    pub kills: usize,
    /// Each child is killed this many milliseconds after it starts (drawn
    /// from the seeded generator).
    pub delay_ms: Range<u64>,
}

impl KillRuns {
    /// Starts and kills the children one after the other; after each kill,
    /// `after(kill, lines)` gets the lines the child printed (stdout only,
    /// the child's stderr is dropped) to reopen and check the directory.
    ///
    /// # Panics
    /// If a child cannot be started or killed.
    pub fn run(&self, seed: u64, mut after: impl FnMut(usize, Vec<String>)) {
        let mut rng = Rng::new(seed);
        for kill in 0..self.kills {
            let mut child = Command::new(std::env::current_exe().expect("the test binary"))
                .args([
                    "--exact",
                    self.child_test,
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(self.child_env, &self.dir)
                .env(RUN_ENV, kill.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("starting the child");
            let stdout = child.stdout.take().expect("the child's stdout");
            let reader = std::thread::spawn(move || {
                BufReader::new(stdout)
                    .lines()
                    .map_while(Result::ok)
                    .collect::<Vec<String>>()
            });
            let span = self.delay_ms.end.saturating_sub(self.delay_ms.start).max(1);
            let delay = self.delay_ms.start + rng.below(span);
            std::thread::sleep(Duration::from_millis(delay));
            child.kill().expect("SIGKILL the child");
            child.wait().expect("reaping the child");
            let lines = reader.join().expect("the reader thread");
            after(kill, lines);
        }
    }
}

/// `len` bytes that follow from `id` alone (xorshift from a seed made of
/// the id), so a checker can tell the right bytes of any entry or blob
/// without having kept them.
#[must_use]
pub fn pattern(id: u64, len: usize) -> Vec<u8> {
    let mut state = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_follow_from_the_id() {
        assert_eq!(pattern(5, 100), pattern(5, 100));
        assert_ne!(pattern(5, 100), pattern(6, 100));
        assert_eq!(pattern(5, 100)[..10], pattern(5, 10)[..]);
        assert!(pattern(9, 0).is_empty());
    }
}
