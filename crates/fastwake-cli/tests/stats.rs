//! `fastwake stats`: bad input is one line with exit 2; against a real
//! shimmed process (`fastwake run -- sleep`), the list and `-p PID --json`
//! show it, and a SIGKILLed process's segment is removed by the lister.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod common;
use common::{assert_one_line_error, exe, fastwake};

/// The lister removes stale segments, so tests that list or kill run one
/// at a time (one test's list must not clean up another's killed process).
static LISTING: Mutex<()> = Mutex::new(());

#[test]
fn a_pid_that_is_not_shimmed_is_one_line() {
    let me = std::process::id().to_string();
    assert_one_line_error(&["stats", "-p", &me], "is not shimmed");
    assert_one_line_error(&["stats", "-p", "4000000000"], "no process 4000000000");
    assert_one_line_error(&["stats", "-p", "abc"], "abc");
}

#[test]
fn bad_watch_values_are_one_line() {
    assert_one_line_error(&["stats", "-p", "1", "--watch", "0"], "--watch");
    assert_one_line_error(&["stats", "--watch", "x"], "--watch");
    assert_one_line_error(&["stats", "--watch", "1"], "--watch needs -p PID");
}

fn segment(pid: u32) -> Option<PathBuf> {
    fastwake::preload_stats::dirs()
        .into_iter()
        .map(|d| d.join(format!("fastwake-{pid}")))
        .find(|p| p.exists())
}

/// `fastwake run --mode hybrid -- sleep 30`, once its segment exists.
fn shimmed_sleep() -> Option<std::process::Child> {
    // Fail, not skip: a skip printed by a passing test is swallowed.
    assert!(
        exe().with_file_name("libfastwake_preload.so").is_file(),
        "libfastwake_preload.so not built next to fastwake: run `cargo build --release -p fastwake-preload` first (scripts/test does)"
    );
    let c = Command::new(exe())
        .args(["run", "--mode", "hybrid", "--", "sleep", "30"])
        .env_remove("LD_PRELOAD")
        .spawn()
        .expect("spawn fastwake run");
    let t = Instant::now();
    while segment(c.id()).is_none() {
        assert!(t.elapsed() < Duration::from_secs(5), "no segment");
        std::thread::sleep(Duration::from_millis(10));
    }
    Some(c)
}

#[test]
fn lists_and_shows_a_shimmed_process() {
    let _g = LISTING.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut c) = shimmed_sleep() else { return };
    let pid = c.id();
    let o = fastwake(&["stats"]);
    let list = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{o:?}");
    assert!(
        list.lines()
            .any(|l| l.split_whitespace().next() == Some(&pid.to_string())
                && l.contains("sleep")
                && l.contains("hybrid")),
        "{list}"
    );
    let o = fastwake(&["stats", "-p", &pid.to_string(), "--json"]);
    assert!(o.status.success(), "{o:?}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON document");
    assert_eq!(v["pid"], pid);
    assert_eq!(v["program"], "sleep");
    assert_eq!(v["mode"], "hybrid");
    assert_eq!(v["meta"]["version"], env!("CARGO_PKG_VERSION"));
    assert!(v["counters"]["calls"]["epoll_wait"]["seen"].is_u64());
    let o = fastwake(&["stats", "-p", &pid.to_string()]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("mode hybrid") && text.contains("spin CPU"),
        "{text}"
    );
    let _ = c.kill();
    let _ = c.wait();
}

#[test]
fn the_lister_removes_the_segment_of_a_killed_process() {
    let _g = LISTING.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut c) = shimmed_sleep() else { return };
    let pid = c.id();
    c.kill().unwrap(); // SIGKILL: the shim cannot clean up
    c.wait().unwrap();
    assert!(segment(pid).is_some(), "expected a stale segment");
    let o = fastwake(&["stats"]);
    assert!(o.status.success(), "{o:?}");
    assert!(segment(pid).is_none(), "stale segment of {pid} not removed");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(&format!("pid {pid} is gone")),
        "{o:?}"
    );
    assert_one_line_error(&["stats", "-p", &pid.to_string()], "no process");
}

#[test]
fn the_lister_removes_a_segment_its_dead_process_never_finished() {
    let _g = LISTING.lock().unwrap_or_else(|p| p.into_inner());
    let Some(dir) = fastwake::preload_stats::dirs()
        .into_iter()
        .find(|d| d.is_dir())
    else {
        panic!("no segment directory exists")
    };
    // Killed while creating it: the file exists, sized, magic still 0.
    let mut c = Command::new("true").spawn().expect("spawn true");
    let dead = c.id();
    c.wait().unwrap();
    let stale = dir.join(format!("fastwake-{dead}"));
    std::fs::write(&stale, [0u8; 64]).unwrap();
    // The same for a live process (this test): still being created.
    let me = std::process::id();
    let live = dir.join(format!("fastwake-{me}"));
    std::fs::write(&live, [0u8; 64]).unwrap();
    let o = fastwake(&["stats"]);
    let kept = live.exists();
    let _ = std::fs::remove_file(&live);
    assert!(o.status.success(), "{o:?}");
    assert!(kept, "a live process's unfinished segment was removed");
    assert!(
        !stale.exists(),
        "unfinished segment of dead {dead} not removed"
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(&format!("pid {dead} is gone")),
        "{o:?}"
    );
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains(&format!("pid {me} ")),
        "a live process's unfinished segment was judged: {o:?}"
    );
}
