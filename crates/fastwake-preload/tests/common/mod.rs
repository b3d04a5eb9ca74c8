//! What every shim test binary shares: running one of its own `child_*`
//! scenarios as a child process under the freshly built shim, and reading
//! the shim's counters from the child's stderr.
#![allow(dead_code)] // each test binary uses its own subset

pub mod fds;

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::Mutex;

/// Hybrid mode with a 200 µs spin budget.
pub const HYBRID: &[(&str, &str)] = &[("FASTWAKE_MODE", "hybrid"), ("FASTWAKE_BUDGET_US", "200")];

/// Children spin; run one at a time (tests in a binary run in parallel).
pub static SPIN: Mutex<()> = Mutex::new(());

/// The shim these tests run children under: the build tree's
/// `libfastwake_preload.so`. `cargo test` does not build a cdylib for its
/// package's integration tests, so it must have been built first
/// (`cargo build --release -p fastwake-preload`; scripts/test does). A
/// missing or stale library fails the test rather than skipping it: a
/// skip printed by a passing test is swallowed by the harness, and these
/// tests once "passed" for a whole CI run without a shim to test.
pub fn shim() -> Option<PathBuf> {
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("target/<profile>/deps");
    let so = [deps.join("libfastwake_preload.so"), deps.join("../libfastwake_preload.so")]
        .into_iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "libfastwake_preload.so is not built next to {}: run `cargo build --release -p fastwake-preload` first (scripts/test does)",
                deps.display()
            )
        });
    let built = std::fs::metadata(&so)
        .and_then(|m| m.modified())
        .expect("the shim's mtime");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    if let Some((newest, path)) = newest_source(std::path::Path::new(src))
        && newest > built
    {
        panic!(
            "{} is older than {} : rebuild it (`cargo build --release -p fastwake-preload`) so these tests test this code",
            so.display(),
            path.display()
        );
    }
    Some(so)
}

/// The most recently modified source file of the shim and the library it
/// links (`crates/fastwake-preload/src`, `crates/fastwake/src`). Unit-test
/// modules (`*tests.rs`) are left out: they are not in the cdylib, so a
/// change to one does not rebuild it and must not call it stale.
fn newest_source(crates: &std::path::Path) -> Option<(std::time::SystemTime, PathBuf)> {
    fn walk(dir: &std::path::Path, best: &mut Option<(std::time::SystemTime, PathBuf)>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, best);
            } else if p
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with("tests.rs"))
            {
                continue;
            } else if let Ok(t) = e.metadata().and_then(|m| m.modified())
                && best.as_ref().is_none_or(|(b, _)| t > *b)
            {
                *best = Some((t, p));
            }
        }
    }
    let mut best = None;
    walk(&crates.join("fastwake-preload/src"), &mut best);
    walk(&crates.join("fastwake/src"), &mut best);
    best
}

/// Run scenario `name` under the shim with `env`; None = skipped.
pub fn child(name: &str, env: &[(&str, &str)]) -> Option<Output> {
    child_check(name, child_unchecked(name, env)?)
}

/// A scenario's exit code that says "this host was too slow for the
/// scenario's timing to mean anything; run it again" (see
/// [`child_retrying`]).
pub const RETRY: i32 = 42;

/// [`child`], run again (up to 5 times) while the scenario exits with
/// [`RETRY`]; fails if it never ran under the timing it needs.
pub fn child_retrying(name: &str, env: &[(&str, &str)]) -> Option<Output> {
    for _ in 0..5 {
        let out = child_unchecked(name, env)?;
        if out.status.code() != Some(RETRY) {
            return child_check(name, out);
        }
    }
    panic!("{name}: 5 runs on a host too slow for its timing (each exited {RETRY})");
}

fn child_check(name: &str, out: Output) -> Option<Output> {
    if !out.status.success() {
        panic!(
            "child {name} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Some(out)
}

/// The command that runs scenario `name` (an ignored test of this binary)
/// alone under the shim, verbose, with `env`.
pub fn command(name: &str, env: &[(&str, &str)]) -> Option<Command> {
    let so = shim()?;
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([
        "--ignored",
        "--exact",
        name,
        "--nocapture",
        "--test-threads=1",
    ])
    .env("LD_PRELOAD", so)
    .env("FASTWAKE_VERBOSE", "1");
    for (k, v) in env {
        c.env(k, v);
    }
    Some(c)
}

/// Run scenario `name` under the shim with `env`, whatever its exit.
pub fn child_unchecked(name: &str, env: &[(&str, &str)]) -> Option<Output> {
    let mut c = command(name, env)?;
    let _g = SPIN.lock().unwrap_or_else(|p| p.into_inner());
    Some(c.output().expect("spawn child"))
}

/// The shim's exit counter `key` from a child's stderr (summed over
/// processes, e.g. after a fork). A process that never waited prints no
/// counters (0), but the shim must have announced itself.
pub fn counter(out: &Output, key: &str) -> u64 {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.lines()
            .any(|l| l.starts_with("fastwake-preload: fastwake ") && l.contains(": mode=")),
        "the shim did not load:\n{err}"
    );
    let mut sum = 0;
    for l in err.lines().filter(|l| l.contains("waits=")) {
        for w in l.split_whitespace() {
            if let Some(v) = w.strip_prefix(&format!("{key}=")) {
                sum += v.parse::<f64>().unwrap_or(0.0) as u64;
            }
        }
    }
    sum
}

/// Pin the calling thread to `cpu` if the machine has it (best effort).
pub fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t filled with CPU_SET, for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}
