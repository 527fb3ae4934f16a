//! What the power-cut tests share: where a cut happens, a check whose
//! panic becomes an error, and one crash run with a time limit.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use okaywal::fs::{Operation, PowerLoss};

use super::Rng;

/// How the error of a run that did not finish in time begins.
pub const HUNG: &str = "HUNG";

/// Where the power goes out: at the `nth` call of `operation`, leaving
/// the disk as `policy` says.
#[derive(Debug, Clone, Copy)]
pub struct CrashPoint {
    pub operation: Operation,
    pub nth: u64,
    pub policy: PowerLoss,
}

impl CrashPoint {
    /// A random cut: in 40% of the draws at one of the first `syncs`
    /// syncs, otherwise at one of the first `writes` writes, with a random
    /// power-loss policy.
    pub fn random(rng: &mut Rng, syncs: u64, writes: u64) -> Self {
        let (operation, count) = if rng.percent(40) {
            (Operation::Sync, syncs)
        } else {
            (Operation::Write, writes)
        };
        let policy = match rng.below(4) {
            0 => PowerLoss::Clean,
            1 => PowerLoss::TornPrefix,
            2 => PowerLoss::SectorHole,
            _ => PowerLoss::Random(rng.next_u64()),
        };
        Self {
            operation,
            nth: rng.below(count),
            policy,
        }
    }
}

/// Runs `check`; a panic in it is reported as an error.
pub fn checked(check: impl FnOnce() -> Result<(), String>) -> Result<(), String> {
    catch_unwind(AssertUnwindSafe(check)).unwrap_or_else(|panic| {
        Err(format!(
            "checking panicked: {}",
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        ))
    })
}

/// Runs one crash `run` on its own thread: one that does not finish
/// within `seconds` is reported ([`HUNG`]) and its thread abandoned
/// instead of hanging the test, and a panic is reported too.
pub fn with_timeout(
    seconds: u64,
    run: impl FnOnce() -> Result<bool, String> + Send + 'static,
) -> Result<bool, String> {
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let result =
            catch_unwind(AssertUnwindSafe(run)).unwrap_or_else(|_| Err("panicked".to_string()));
        let _ = sender.send(result);
    });
    receiver
        .recv_timeout(Duration::from_secs(seconds))
        .unwrap_or_else(|_| Err(format!("{HUNG}: the run did not finish within {seconds} s")))
}
