//! What every shim test binary shares: running one of its own `child_*`
//! scenarios as a child process under the freshly built shim, and reading
//! the shim's counters from the child's stderr.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::Mutex;

/// Children spin; run one at a time (tests in a binary run in parallel).
static SPIN: Mutex<()> = Mutex::new(());

pub fn shim() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    [
        deps.join("libfastwake_preload.so"),
        deps.parent()?.join("libfastwake_preload.so"),
    ]
    .into_iter()
    .find(|p| p.is_file())
}

/// Run scenario `name` under the shim with `env`; None = skipped.
pub fn child(name: &str, env: &[(&str, &str)]) -> Option<Output> {
    let Some(so) = shim() else {
        eprintln!("SKIPPED {name}: libfastwake_preload.so not built next to the test binary");
        return None;
    };
    let _g = SPIN.lock().unwrap_or_else(|p| p.into_inner());
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
    let out = c.output().expect("spawn child");
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
