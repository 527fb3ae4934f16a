//! Optional `tracing` spans, behind the cargo feature `tracing`. Without
//! the feature the macro expands to nothing, so the crate neither depends
//! on `tracing` nor pays for a span on the commit path.

/// Enters a span until the end of the enclosing block:
/// `span!(DEBUG, "commit", entry = id)`, with `tracing`'s field syntax.
#[cfg(feature = "tracing")]
macro_rules! span {
    ($level:ident, $name:literal $(, $($fields:tt)*)?) => {
        let _span = tracing::span!(tracing::Level::$level, $name $(, $($fields)*)?).entered();
    };
}

/// Without the `tracing` feature: nothing.
#[cfg(not(feature = "tracing"))]
macro_rules! span {
    ($($ignored:tt)*) => {};
}

pub(crate) use span;
