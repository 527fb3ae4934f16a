//! Compatibility tests for `okaywal`: a directory holding a live log
//! written by the published okaywal 0.3 opens with this workspace's
//! okaywal, which replays, checkpoints and recycles it.
//!
//! The tests are in `tests/older_format.rs` and need the `okaywal-0.3`
//! feature, which builds the published okaywal 0.3.1 to write real logs
//! in its format:
//!
//! ```text
//! cargo test -p compat --features okaywal-0.3
//! ```
#![forbid(unsafe_code)]
