//! Shared helpers for the benchmark binaries (under construction).
