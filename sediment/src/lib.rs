//! A crash-safe multi-file blob store built on [`okaywal`] (under construction).
#![forbid(unsafe_code)]
