//! What the CLI's test binaries share: running the built `fastwake` and
//! checking that bad input is one line.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::PathBuf;
use std::process::{Command, Output};

/// The `fastwake` binary cargo built for these tests.
pub fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_fastwake"))
}

/// Run `fastwake ARGS` (never under an inherited preload) to completion.
pub fn fastwake(args: &[&str]) -> Output {
    Command::new(exe())
        .args(args)
        .env_remove("LD_PRELOAD")
        .output()
        .expect("run fastwake")
}

/// `fastwake ARGS` fails with exit 2, one line on stderr containing
/// `needle`, and prints no result.
pub fn assert_one_line_error(args: &[&str], needle: &str) {
    let o = fastwake(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "{args:?}: not one line: {err:?}"
    );
    assert!(err.contains(needle), "{args:?}: {err:?} lacks {needle:?}");
    assert!(o.stdout.is_empty(), "{args:?}: printed a result anyway");
}

/// `o` exited with `code` and said one line on stderr, containing
/// `needle`.
pub fn assert_exit_and_one_line(o: &Output, code: i32, needle: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(code), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err:?}");
    assert!(err.contains(needle), "{err:?} lacks {needle:?}");
}
