//! Value parsers clap calls for options that several commands share: each
//! reads the one grammar (`fastwake::grammar`, `fastwake::slice`) and
//! gives its error as the one line clap prints.

use std::time::Duration;

/// A duration in the grammar (`20us`, `1ms`, a bare number of µs).
pub fn duration(s: &str) -> Result<Duration, String> {
    fastwake::grammar::duration(s).map_err(|e| e.to_string())
}

/// A scheduler slice: a duration within the kernel's range.
pub fn slice(s: &str) -> Result<Duration, String> {
    fastwake::slice::parse(s).map_err(|e| e.to_string())
}
