//! Progress bars and spinners on stderr (drawn only when stderr is a
//! terminal, so scripts and tests see nothing of them).

use std::io::IsTerminal;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// Transfers at least this large get a progress bar.
pub const BIG_TRANSFER: u64 = 16 << 20;

/// How long an operation runs before [`busy`] shows a spinner.
const SPINNER_DELAY: Duration = Duration::from_millis(400);

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

/// A bar counting `total` bytes, or a hidden one for small transfers.
pub fn bytes_bar(total: u64, message: &str) -> ProgressBar {
    if total < BIG_TRANSFER {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(style("{msg} [{bar:30}] {bytes}/{total_bytes} eta {eta}"));
    bar.set_message(message.to_string());
    bar
}

/// A bar counting items (`set_length` may change the total later).
pub fn count_bar(message: &str) -> ProgressBar {
    let bar = ProgressBar::new(0);
    bar.set_style(style("{msg} [{bar:30}] {pos}/{len} eta {eta}"));
    bar.set_message(message.to_string());
    bar
}

/// Runs `work`, showing a spinner with `message` if it takes longer than
/// a moment and stderr is a terminal.
pub fn busy<T>(message: &str, work: impl FnOnce() -> T) -> T {
    if !std::io::stderr().is_terminal() {
        return work();
    }
    let (done, finished) = mpsc::channel::<()>();
    let message = message.to_string();
    let spinner = thread::spawn(move || {
        if finished.recv_timeout(SPINNER_DELAY) != Err(mpsc::RecvTimeoutError::Timeout) {
            return;
        }
        let bar = ProgressBar::new_spinner();
        bar.set_message(message);
        while finished.recv_timeout(Duration::from_millis(100))
            == Err(mpsc::RecvTimeoutError::Timeout)
        {
            bar.tick();
        }
        bar.finish_and_clear();
    });
    let result = work();
    drop(done);
    let _ = spinner.join();
    result
}
