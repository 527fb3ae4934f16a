//! What encryption at rest costs on this machine: the cipher's time per
//! byte for an encrypted log's frames (64 KiB) and smaller ranges, one
//! record header's seal (what a writer holds the log's lock for), and the
//! first seal of a new cipher (its epoch drawn from the operating system's
//! generator, its epoch key derived).
//!
//! ```text
//! cargo run --release -p okaywal --example cipher_cost
//! ```
//!
//! Build it with `--release`: in a debug build the cipher's generic code
//! is compiled at this crate's optimisation level and runs several times
//! slower.

use std::hint::black_box;
use std::time::{Duration, Instant};

use okaywal::encryption::{Cipher, StaticKey};

/// Runs `work` `rounds` times and returns the time of one round, best of
/// three tries (the machine may be shared).
fn time(rounds: u32, mut work: impl FnMut()) -> Duration {
    (0..3)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..rounds {
                work();
            }
            start.elapsed() / rounds
        })
        .min()
        .expect("three tries")
}

fn main() -> std::io::Result<()> {
    let cipher = Cipher::new(StaticKey::new([7; 32]));
    let key = cipher.current_key()?;
    let associated = [0_u8; 62];
    println!("size      seal              open              (per byte, and per call)");
    for size in [20, 1024, 4096, 64 * 1024] {
        let rounds = ((64 << 20) / size.max(4096)) as u32;
        let mut buffer = vec![7_u8; size];
        let seal_time = time(rounds, || {
            black_box(key.seal(&associated, &mut buffer).expect("seal"));
        });
        let mut sealed = vec![7_u8; size];
        let seal = key.seal(&associated, &mut sealed)?;
        let mut copy = sealed.clone();
        let open_time = time(rounds, || {
            copy.copy_from_slice(&sealed);
            key.open(&seal, &associated, &mut copy).expect("open");
        });
        let per_byte = |t: Duration| t.as_nanos() as f64 / size as f64;
        println!(
            "{size:>6} B  {:>6.2} ns/B {:>7.2} us  {:>6.2} ns/B {:>7.2} us",
            per_byte(seal_time),
            seal_time.as_secs_f64() * 1e6,
            per_byte(open_time),
            open_time.as_secs_f64() * 1e6,
        );
    }
    let mut body = [0_u8; 20];
    let header = time(100_000, || {
        black_box(key.seal(&associated, &mut body).expect("seal"));
    });
    let first = time(10_000, || {
        let cipher = Cipher::new(StaticKey::new([7; 32]));
        let key = cipher.current_key().expect("key");
        black_box(key.seal(&associated, &mut body).expect("seal"));
    });
    println!(
        "a record header (20 B, 62 B associated): {:.2} us to seal; a new cipher's first \
         seal (epoch drawn, epoch key derived): {:.2} us",
        header.as_secs_f64() * 1e6,
        first.as_secs_f64() * 1e6
    );
    let data = vec![7_u8; 64 * 1024];
    let crc = time(4096, || {
        black_box(crc32fast::hash(black_box(&data)));
    });
    println!(
        "CRC32 of 64 KiB, what a plain log pays instead: {:.3} ns/B",
        crc.as_nanos() as f64 / data.len() as f64
    );
    Ok(())
}
