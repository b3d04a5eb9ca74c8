//! The shim over a process's life: live counters in the stats segment,
//! SIGTERM and the program's own signal handlers, the exit report, a
//! forked child's own segment, and `_exit`.
//!
//! Like tests/shim.rs, each test re-runs this test binary as a child under
//! the shim and runs one `#[ignore]`d `child_*` scenario there.

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

mod common;
use common::fds::{epoll_with, ewait, pipe};
use common::{HYBRID, SPIN, child};

// ------------------------------------------------- live counters (stats)

/// A shimmed process's segment, mapped read-only as `fastwake stats` maps
/// it.
struct Seg {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Seg {
    fn path(pid: u32) -> Option<PathBuf> {
        fastwake::preload_stats::dirs()
            .into_iter()
            .map(|d| d.join(format!("{}{pid}", fastwake::preload_stats::PREFIX)))
            .find(|p| p.exists())
    }

    fn open(pid: u32) -> Option<Seg> {
        let f = std::fs::File::open(Seg::path(pid)?).ok()?;
        let len = std::mem::size_of::<fastwake::preload_stats::Segment>();
        if f.metadata().ok()?.len() < len as u64 {
            return None;
        }
        // SAFETY: a read-only shared mapping of a file at least `len` long.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return None;
        }
        let s = Seg { ptr, len };
        (s.seg()
            .header
            .magic
            .load(std::sync::atomic::Ordering::Acquire)
            == fastwake::preload_stats::MAGIC
            && s.seg().header.version == fastwake::preload_stats::VERSION)
            .then_some(s)
    }

    fn seg(&self) -> &fastwake::preload_stats::Segment {
        // SAFETY: a mapping of a whole Segment (checked in `open`).
        unsafe { &*(self.ptr as *const fastwake::preload_stats::Segment) }
    }

    /// (served, seen) of `epoll_wait`.
    fn epoll_wait(&self) -> (u64, u64) {
        let c = self.seg().call(fastwake::preload_stats::Call::EpollWait);
        let l = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        let served = l(&c.served);
        (served, served + c.passed.iter().map(l).sum::<u64>())
    }
}

impl Drop for Seg {
    fn drop(&mut self) {
        // SAFETY: our own mapping.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// Start scenario `name` under the shim without waiting for it.
fn spawn_child(name: &str, env: &[(&str, &str)]) -> Option<std::process::Child> {
    let mut c = common::command(name, env)?;
    c.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    Some(c.spawn().expect("spawn child"))
}

/// Wait up to 5 s for `pid`'s segment.
fn wait_for_segment(pid: u32) -> Seg {
    let t = Instant::now();
    loop {
        if let Some(s) = Seg::open(pid) {
            return s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "no segment for pid {pid}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
#[ignore = "child scenario, run by live_counters_rise_and_the_segment_goes_at_exit"]
fn child_stats_live() {
    let (r, _w) = pipe();
    let ep = epoll_with(&[r.as_raw_fd()]);
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(1500) {
        assert_eq!(ewait(&ep, 2).0, 0);
    }
}

#[test]
fn live_counters_rise_and_the_segment_goes_at_exit() {
    let _g = SPIN.lock().unwrap_or_else(|p| p.into_inner());
    let Some(c) = spawn_child("child_stats_live", HYBRID) else {
        return;
    };
    let pid = c.id();
    let seg = wait_for_segment(pid);
    assert_eq!(seg.seg().header.pid, pid);
    assert_eq!(
        fastwake::preload_stats::field_str(&seg.seg().header.mode),
        "hybrid:200us"
    );
    std::thread::sleep(Duration::from_millis(200));
    let (a, _) = seg.epoll_wait();
    std::thread::sleep(Duration::from_millis(300));
    let (b, seen) = seg.epoll_wait();
    assert!(a > 0 && b > a, "epoll_wait served {a} then {b}: not rising");
    assert!(seen >= b);
    let out = c.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        Seg::path(pid).is_none(),
        "segment of {pid} left after a normal exit"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("pid={pid} mode=hybrid:200us calls:"))
            && err.contains(" epoll_wait seen="),
        "{err}"
    );
}

#[test]
#[ignore = "child scenario, run by sigterm_prints_the_report_and_still_kills"]
fn child_sigterm_wait() {
    let (r, _w) = pipe();
    let ep = epoll_with(&[r.as_raw_fd()]);
    for _ in 0..10 {
        assert_eq!(ewait(&ep, 1).0, 0);
    }
    // The program still reads SIG_DFL (the shim's handler is invisible).
    // SAFETY: a query into a zeroed sigaction.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a query into a live sigaction.
    let r = unsafe { libc::sigaction(libc::SIGTERM, std::ptr::null(), &mut old) };
    assert_eq!(r, 0);
    assert_eq!(old.sa_sigaction, libc::SIG_DFL);
    println!("ready");
    ewait(&ep, -1);
    unreachable!("the pipe is never written");
}

#[test]
fn sigterm_prints_the_report_and_still_kills() {
    use std::os::unix::process::ExitStatusExt;
    let _g = SPIN.lock().unwrap_or_else(|p| p.into_inner());
    let Some(c) = spawn_child("child_sigterm_wait", HYBRID) else {
        return;
    };
    let pid = c.id();
    let seg = wait_for_segment(pid);
    let t = Instant::now();
    while seg.epoll_wait().0 < 10 {
        assert!(t.elapsed() < Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(100));
    // SAFETY: our own child.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    let out = c.wait_with_output().unwrap();
    assert_eq!(out.status.signal(), Some(libc::SIGTERM), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "pid={pid} mode=hybrid:200us calls: epoll_wait seen=10 served=10"
        )),
        "no exit report:\n{err}"
    );
    assert!(
        Seg::path(pid).is_none(),
        "segment of {pid} left after SIGTERM"
    );
}

static CAUGHT: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn note_signal(sig: i32) {
    CAUGHT.store(sig, std::sync::atomic::Ordering::SeqCst);
}

#[test]
#[ignore = "child scenario, run by the_programs_own_handlers_replace_the_shims"]
fn child_own_handlers() {
    let h = note_signal as extern "C" fn(i32) as libc::sighandler_t;
    // SAFETY: signal() with a plain handler; it must report SIG_DFL.
    assert_eq!(unsafe { libc::signal(libc::SIGINT, h) }, libc::SIG_DFL);
    // SAFETY: raising a handled signal.
    unsafe { libc::raise(libc::SIGINT) };
    assert_eq!(
        CAUGHT.load(std::sync::atomic::Ordering::SeqCst),
        libc::SIGINT
    );
    // SAFETY: a zeroed sigaction naming the handler; `old` is written.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = h;
    // SAFETY: as above.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    old.sa_sigaction = 12345;
    // SAFETY: as above.
    assert_eq!(unsafe { libc::sigaction(libc::SIGTERM, &act, &mut old) }, 0);
    assert_eq!(old.sa_sigaction, libc::SIG_DFL);
    // SAFETY: raising a handled signal.
    unsafe { libc::raise(libc::SIGTERM) };
    assert_eq!(
        CAUGHT.load(std::sync::atomic::Ordering::SeqCst),
        libc::SIGTERM
    );
    // Now the query reports the program's own handler.
    // SAFETY: a query into a live sigaction.
    let r = unsafe { libc::sigaction(libc::SIGTERM, std::ptr::null(), &mut old) };
    assert_eq!(r, 0);
    assert_eq!(old.sa_sigaction, h);
}

#[test]
fn the_programs_own_handlers_replace_the_shims() {
    child("child_own_handlers", HYBRID);
}

#[test]
#[ignore = "child scenario, run by a_forked_child_gets_its_own_segment"]
fn child_fork_segment() {
    let me = std::process::id();
    let parent = Seg::open(me).expect("the parent's segment");
    let (r, _w) = pipe();
    let ep = epoll_with(&[r.as_raw_fd()]);
    for _ in 0..5 {
        ewait(&ep, 1);
    }
    let before = parent.epoll_wait().0;
    assert!(before >= 5);
    // SAFETY: fork; the child only waits, checks and exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let me = std::process::id();
        let ok = (|| {
            let own = Seg::open(me)?;
            let fresh = own.seg().header.pid == me && own.epoll_wait().0 == 0;
            for _ in 0..3 {
                ewait(&ep, 1);
            }
            let counted = own.epoll_wait().0 == 3;
            Some(fresh && counted)
        })();
        // exit, not _exit: the destructor removes the child's segment.
        // SAFETY: ends the child.
        unsafe { libc::exit(if ok == Some(true) { 0 } else { 1 }) };
    }
    let mut st = 0;
    // SAFETY: our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
    assert!(
        libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
        "the child's own segment was missing or wrong ({st})"
    );
    assert_eq!(
        parent.epoll_wait().0,
        before,
        "the child counted into the parent's segment"
    );
    assert!(
        Seg::path(pid as u32).is_none(),
        "the child's segment was left behind"
    );
}

#[test]
fn a_forked_child_gets_its_own_segment() {
    child("child_fork_segment", HYBRID);
}

/// `_exit` skips the destructor: the shim's hook reports and removes the
/// segment first; a `vfork` child's `_exit` (which shares the parent's
/// memory) must leave the parent's segment and counters alone.
#[test]
#[ignore = "child scenario, run by exit_through_underscore_exit_reports_and_cleans_up"]
fn child_underscore_exit() {
    let me = std::process::id();
    let (r, _w) = pipe();
    let ep = epoll_with(&[r.as_raw_fd()]);
    ewait(&ep, 1);
    // What vfork does (the child shares our memory and we wait until it
    // leaves), as clone with a function of its own on a stack of its own,
    // so no code returns twice. The child only calls _exit (the shim's
    // hook, which must do nothing in it), as a failed exec would.
    extern "C" fn vfork_child(_: *mut libc::c_void) -> libc::c_int {
        // SAFETY: ends the child.
        unsafe { libc::_exit(0) }
    }
    let mut stack = vec![0u8; 64 * 1024];
    // SAFETY: the stack top of a live buffer (16-byte aligned), a plain
    // function; CLONE_VFORK keeps us (and the buffer) until it exits.
    let pid = unsafe {
        let top = stack.as_mut_ptr().add(stack.len()) as usize & !15;
        libc::clone(
            vfork_child,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            std::ptr::null_mut(),
        )
    };
    assert!(pid > 0, "clone failed");
    let mut st = 0;
    // SAFETY: our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
    assert!(
        Seg::path(me).is_some(),
        "the vfork child's _exit removed the parent's segment"
    );
    eprintln!("child_underscore_exit: pid {me} leaves by _exit");
    // SAFETY: ends the process without the destructor (stdout is empty).
    unsafe { libc::_exit(0) };
}

#[test]
fn exit_through_underscore_exit_reports_and_cleans_up() {
    let Some(out) = child("child_underscore_exit", HYBRID) else {
        return;
    };
    let err = String::from_utf8_lossy(&out.stderr);
    let pid: u32 = err
        .lines()
        .find_map(|l| l.strip_prefix("child_underscore_exit: pid "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("the scenario did not run:\n{err}"));
    assert!(
        err.lines()
            .filter(|l| l.contains(&format!("pid={pid} ")) && l.contains("waits="))
            .count()
            == 1,
        "no exit report (or two) for pid {pid}:\n{err}"
    );
    assert!(
        Seg::path(pid).is_none(),
        "pid {pid}'s segment was left behind"
    );
}
