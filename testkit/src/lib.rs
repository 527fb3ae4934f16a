//! Test scaffolding shared by the workspace's tests, written once:
//!
//! - [`rng`]: a seeded generator and the seed of a randomized test;
//! - [`disk`]: a real directory's snapshot, and the simulated disk's
//!   operations (every kind, waiting until it is quiet);
//! - [`recorder`]: a `LogManager` that records every callback;
//! - [`hooks`]: a file system that calls a hook before renames and syncs,
//!   and a [`hooks::Gate`] to hold a thread there;
//! - [`kill`]: the parent/child protocol of the real-process `SIGKILL`
//!   tests, and the deterministic payloads they check;
//! - `sediment_runs` (feature `sediment`): a second run of a sediment store that dies before
//!   any checkpoint.
//!
//! ```
//! use testkit::rng::Rng;
//!
//! let mut a = Rng::new(7);
//! let mut b = Rng::new(7);
//! assert_eq!(a.bytes(16), b.bytes(16));
//! assert!(a.below(10) < 10);
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod disk;
pub mod hooks;
pub mod kill;
pub mod recorder;
pub mod rng;
#[cfg(feature = "sediment")]
pub mod sediment_runs;
