//! Live counters and the exit report.
//!
//! Every counter of the shim (the fd-hook engine's, dispatch mode's, the
//! verbs hooks', and one block per hooked call kind: served, or passed
//! through and why) lives in one [`Segment`]
//! (layout: [`fastwake::preload_stats`]). When the mode is not `off`, the
//! constructor creates `<dir>/fastwake-<pid>` (`/dev/shm`, else
//! `$XDG_RUNTIME_DIR`, else `/tmp`; mode 0600; raw syscalls) and maps it
//! shared, so `fastwake stats -p PID` can read the counters of the running
//! process without stopping it. If it cannot, the counters live in a static
//! [`Segment`] (everything else works; with `FASTWAKE_VERBOSE=1` one line
//! says `fastwake stats` will not see the process). Mode `off` creates
//! nothing and counts nothing, unless verbose (then into the static, for the
//! exit report's "calls seen").
//!
//! Hook paths: [`counters`] is one acquire load of a pointer; a count is one
//! relaxed `fetch_add`. No lock, no allocation, no syscall. The pointer is
//! null before the constructor and in mode `off` without verbose: nothing
//! is counted.
//!
//! fork: a `pthread_atfork` child handler gives the child a segment of its
//! own, named by its pid, with zeroed counters (the parent's mapping stays
//! mapped in the child, unused: unmapping it could pull the page from under
//! a signal handler's count). A child made by `vfork`/`posix_spawn` runs no
//! handler; it execs, and the new image's constructor makes its segment.
//!
//! Exit: the library's destructor ([`exit`]) prints the report when
//! verbose and unlinks the file (never unmaps: other threads may still count
//! until the process is gone); so do the `_exit` and `_Exit` hooks
//! ([`leave`]). `exec` of an unshimmed program and SIGKILL leave the file
//! behind; `fastwake stats` removes such stale segments when it lists.
//! SIGTERM and SIGINT with verbose: [`signals`].

pub mod leave;
pub mod signals;

use fastwake::preload_stats::{Call, Pass, Segment};
use std::ffi::CStr;
use std::fmt::Write as _;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

/// Where the counters live when there is no mapping.
static FALLBACK: Segment = Segment::zeroed();
/// The counters in use: null (not counting), `&FALLBACK`, or the mapping.
static SEG: AtomicPtr<Segment> = AtomicPtr::new(std::ptr::null_mut());
/// `SEG` is a mapping of this process's file.
static MAPPED: AtomicBool = AtomicBool::new(false);
/// The report was printed (by a signal handler, or the destructor).
static REPORTED: AtomicBool = AtomicBool::new(false);

/// Fixed at load: the segment directory and the mode's name (what a forked
/// child and the signal handler need, without allocating).
struct Info {
    dir: [u8; 200],
    dir_len: usize,
    mode: [u8; 48],
}

static INFO: OnceLock<Info> = OnceLock::new();

/// The counters in use, if counting.
#[inline]
pub fn counters() -> Option<&'static Segment> {
    let p = SEG.load(Ordering::Acquire);
    // SAFETY: null, `&FALLBACK`, or a shared mapping of a whole Segment
    // that is never unmapped once published.
    unsafe { p.as_ref() }
}

/// Add `n` to the counter `f` picks (nothing when not counting).
#[inline]
pub fn add(f: impl FnOnce(&Segment) -> &AtomicU64, n: u64) {
    if let Some(s) = counters() {
        f(s).fetch_add(n, Ordering::Relaxed);
    }
}

/// A call of kind `c` was served by the mode's wait (the calling thread
/// asks for `FASTWAKE_SLICE` at its first, see [`crate::slice`]).
#[inline]
pub fn served(c: Call) {
    crate::slice::take();
    add(|s| &s.call(c).served, 1);
}

/// A call of kind `c` was passed through unchanged, because `why`.
#[inline]
pub fn passed(c: Call, why: Pass) {
    crate::slice::take();
    add(|s| &s.call(c).passed[why as usize], 1);
}

/// Constructor: choose the directory, create and map this process's
/// segment (mode not off), publish. Returns the path for the banner, or
/// `Err(line)` for the verbose line when the segment could not be made.
pub fn start(cfg: &crate::config::Config) -> Result<Option<String>, String> {
    let mode = cfg.mode.map_or("off".to_string(), |m| m.to_string());
    let mut info = Info {
        dir: [0; 200],
        dir_len: 0,
        mode: [0; 48],
    };
    fastwake::preload_stats::copy_str(&mut info.mode, mode.as_bytes());
    if let Some(d) = fastwake::preload_stats::dirs()
        .into_iter()
        .find(|d| d.is_dir())
    {
        let b = d.as_os_str().as_encoded_bytes();
        if b.len() < info.dir.len() - 1 {
            info.dir[..b.len()].copy_from_slice(b);
            info.dir_len = b.len();
        }
    }
    let _ = INFO.set(info);
    let mut result = Ok(None);
    if cfg.mode.is_some() {
        let command = std::env::args_os()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<String>>()
            .join(" ");
        let p = Params {
            budget_ns: cfg.budget.as_nanos() as u64,
            cpu_cap_ppm: (cfg.cpu_cap * 1e6) as u32,
            command: command.as_bytes(),
        };
        let mut path = [0u8; 256];
        match create(&p, &mut path) {
            Ok(seg) => {
                MAPPED.store(true, Ordering::Relaxed);
                SEG.store(seg, Ordering::Release);
                result = Ok(Some(path_text(&path)));
            }
            Err(e) => {
                result = Err(format!(
                    "stats: cannot create {}: {e}; `fastwake stats -p {}` will not see this process",
                    path_text(&path),
                    rustix::process::getpid().as_raw_nonzero()
                ));
            }
        }
    }
    if SEG.load(Ordering::Relaxed).is_null() && cfg.verbose {
        SEG.store(
            &FALLBACK as *const Segment as *mut Segment,
            Ordering::Release,
        );
    }
    if !SEG.load(Ordering::Relaxed).is_null() {
        // SAFETY: registers a plain function that runs in the child only,
        // using raw syscalls and atomics.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_child)) };
    }
    if cfg.verbose {
        signals::install();
    }
    result
}

/// What a new segment's header says besides the pid and times.
struct Params<'a> {
    budget_ns: u64,
    cpu_cap_ppm: u32,
    command: &'a [u8],
}

/// `<dir>/fastwake-<pid>` as a C string in `buf`.
fn path_of(pid: u32, buf: &mut [u8; 256]) -> Option<&CStr> {
    let info = INFO.get()?;
    if info.dir_len == 0 {
        return None;
    }
    let mut w = Buf::<256>::new();
    let dir = std::str::from_utf8(&info.dir[..info.dir_len]).ok()?;
    let _ = write!(w, "{dir}/{}{pid}\0", fastwake::preload_stats::PREFIX);
    let b = w.bytes();
    if b.last() != Some(&0) {
        return None;
    }
    buf[..b.len()].copy_from_slice(b);
    CStr::from_bytes_with_nul(&buf[..b.len()]).ok()
}

fn path_text(buf: &[u8; 256]) -> String {
    fastwake::preload_stats::field_str(buf)
}

/// Create, size and map this process's segment and fill its header. Raw
/// syscalls and stack buffers only: also called in a forked child.
fn create(p: &Params, path_buf: &mut [u8; 256]) -> rustix::io::Result<*mut Segment> {
    use rustix::fs::{Mode, OFlags};
    let pid = rustix::process::getpid().as_raw_nonzero().get() as u32;
    let path = path_of(pid, path_buf).ok_or(rustix::io::Errno::NOENT)?;
    // A file of an earlier image of this pid (exec) or of a dead process
    // that had this pid: ours to replace. Another user's cannot be
    // unlinked (sticky directory), and then O_EXCL fails: no segment.
    let _ = rustix::fs::unlink(path);
    let fd = rustix::fs::open(
        path,
        OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::RUSR | Mode::WUSR,
    )?;
    let size = std::mem::size_of::<Segment>();
    let mapped = rustix::fs::ftruncate(&fd, size as u64).and_then(|()| {
        // SAFETY: a fresh shared mapping of a file we just sized; nothing
        // else in this process refers to the address range.
        unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                size,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                &fd,
                0,
            )
        }
    });
    let mapped = match mapped {
        Ok(m) => m.cast::<Segment>(),
        Err(e) => {
            let _ = rustix::fs::unlink(path);
            return Err(e);
        }
    };
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Realtime);
    let info = INFO.get();
    // SAFETY: the mapping is ours, zero-filled and the size of a Segment;
    // no other reference to it exists yet.
    let seg = unsafe { &mut *mapped };
    seg.init(
        pid,
        info.map_or(&b"?"[..], |i| nul_trimmed(&i.mode)),
        p.budget_ns,
        p.cpu_cap_ppm,
        (now.tv_sec as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(now.tv_nsec as u64),
        own_start_ticks(),
        p.command,
    );
    Ok(mapped)
}

fn nul_trimmed(b: &[u8]) -> &[u8] {
    &b[..b.iter().position(|&c| c == 0).unwrap_or(b.len())]
}

/// This process's start time in clock ticks since boot (`/proc/self/stat`),
/// 0 if unknown.
fn own_start_ticks() -> u64 {
    use rustix::fs::{Mode, OFlags};
    let Ok(fd) = rustix::fs::open(
        c"/proc/self/stat",
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return 0;
    };
    let mut b = [0u8; 1024];
    let n = rustix::io::read(&fd, &mut b[..]).unwrap_or(0);
    fastwake::preload_stats::start_ticks(&b[..n]).unwrap_or(0)
}

/// In a forked child (its only thread, before `fork` returns): counters of
/// its own, from zero, in a segment named by its pid.
extern "C" fn after_fork_child() {
    REPORTED.store(false, Ordering::Relaxed);
    let old = SEG.load(Ordering::Acquire);
    if old.is_null() {
        return;
    }
    if !MAPPED.load(Ordering::Relaxed) {
        FALLBACK.clear();
        return;
    }
    // SAFETY: a published mapping (never unmapped).
    let h = unsafe { &(*old).header };
    let p = Params {
        budget_ns: h.budget_ns,
        cpu_cap_ppm: h.cpu_cap_ppm,
        command: nul_trimmed(&h.command),
    };
    let mut path = [0u8; 256];
    match create(&p, &mut path) {
        Ok(seg) => SEG.store(seg, Ordering::Release),
        Err(_) => {
            MAPPED.store(false, Ordering::Relaxed);
            FALLBACK.clear();
            SEG.store(
                &FALLBACK as *const Segment as *mut Segment,
                Ordering::Release,
            );
        }
    }
}

/// Is the segment this process's own (not its parent's, as in a `vfork`
/// child, which shares the parent's memory)? True without a file (the
/// static fallback, or nothing counted).
pub fn owned() -> bool {
    if !MAPPED.load(Ordering::Acquire) {
        return true;
    }
    counters()
        .is_none_or(|s| s.header.pid == rustix::process::getpid().as_raw_nonzero().get() as u32)
}

/// Unlink this process's file (if it has one). Async-signal-safe.
pub fn remove() {
    if !MAPPED.load(Ordering::Acquire) {
        return;
    }
    // A segment inherited from the parent is the parent's to remove.
    if !owned() {
        return;
    }
    let pid = rustix::process::getpid().as_raw_nonzero().get() as u32;
    let mut buf = [0u8; 256];
    if let Some(path) = path_of(pid, &mut buf) {
        let _ = rustix::fs::unlink(path);
    }
}

/// A function the destructor calls with the verbose flag, for the exit
/// lines of a module that depends on this one (one: the stall monitor).
static EXIT_LINES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Register `f` to print its exit lines from the destructor.
pub fn on_exit(f: fn(bool)) {
    EXIT_LINES.store(f as usize, Ordering::Release);
}

/// The library's destructor: the report (verbose), then the file goes.
pub fn exit() {
    if crate::config::verbose() && !REPORTED.swap(true, Ordering::AcqRel) {
        report();
    }
    // Lines of modules above this one (the verbs stall monitor's), which
    // register here: stats imports nothing from them.
    let hook = EXIT_LINES.load(Ordering::Acquire);
    if hook != 0 {
        // SAFETY: only ever stored from a `fn(bool)` by `on_exit`.
        let f = unsafe { std::mem::transmute::<usize, fn(bool)>(hook) };
        f(crate::config::verbose());
    }
    remove();
}

/// A line buffer for the report: no allocation, so a signal handler can
/// use it; output past its size is cut.
pub(crate) struct Buf<const N: usize> {
    b: [u8; N],
    n: usize,
}

impl<const N: usize> Buf<N> {
    pub(crate) fn new() -> Self {
        Buf { b: [0; N], n: 0 }
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.b[..self.n]
    }
}

impl<const N: usize> std::fmt::Write for Buf<N> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let k = s.len().min(N - self.n);
        self.b[self.n..self.n + k].copy_from_slice(&s.as_bytes()[..k]);
        self.n += k;
        Ok(())
    }
}

/// One report line on stderr: `fastwake-preload: ` + the line, one raw
/// `write`.
fn emit(line: &Buf<2048>) {
    let mut out = Buf::<2100>::new();
    let _ = out.write_str("fastwake-preload: ");
    let _ = out.write_str(std::str::from_utf8(line.bytes()).unwrap_or("?"));
    let _ = out.write_str("\n");
    // SAFETY: fd 2 borrowed for one write; EBADF if the host closed it.
    let stderr = unsafe { rustix::fd::BorrowedFd::borrow_raw(2) };
    let _ = rustix::io::write(stderr, out.bytes());
}

/// `ns` as milliseconds with three decimals, in integers.
struct Ms(u64);

impl std::fmt::Display for Ms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{:03}", self.0 / 1_000_000, self.0 / 1_000 % 1_000)
    }
}

/// The exit report (FASTWAKE_VERBOSE=1): the engine's, dispatch's and
/// verbs' counters when they moved, and always one line about the calls:
/// what was served and passed through (and why), or that no wait was
/// intercepted and which hooked calls the program made, or that it made
/// none. No allocation, no lock: also run from the signal handler.
pub fn report() {
    let Some(s) = counters() else { return };
    let pid = rustix::process::getpid().as_raw_nonzero().get();
    let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let e = &s.engine;
    if l(&e.waits) + l(&e.spins) + l(&e.prewakes) > 0 {
        let mut w = Buf::<2048>::new();
        let _ = write!(
            w,
            "pid={pid} waits={} spins={} spin_hits={} spin_ms={} blocked={} same_cpu_skips={} sibling_skips={} capped={} contended={} prewakes={} prewake_caught={}",
            l(&e.waits),
            l(&e.spins),
            l(&e.spin_hits),
            Ms(l(&e.spin_ns)),
            l(&e.blocked),
            l(&e.same_cpu),
            l(&e.siblings),
            l(&e.capped),
            l(&e.contended),
            l(&e.prewakes),
            l(&e.prewake_caught)
        );
        emit(&w);
    }
    let p = &s.pollers;
    if l(&p.empty_polls) > 0 {
        let mut w = Buf::<2048>::new();
        let _ = write!(
            w,
            "pollers pid={pid} empty_polls={} sleeps={} woke_by_completion={} woke_by_bound={} polling_ms={} sleep_ms={} threads_off_hazard={} unsleepable={}",
            l(&p.empty_polls),
            l(&p.sleeps),
            l(&p.woke_by_completion),
            l(&p.woke_by_bound),
            Ms(l(&p.polling_ns)),
            Ms(l(&p.sleep_ns)),
            l(&p.off_hazard),
            l(&p.unsleepable),
        );
        emit(&w);
    }
    let d = &s.dispatch;
    if l(&d.waits) > 0 {
        let mut w = Buf::<2048>::new();
        let _ = write!(
            w,
            "pid={pid} dispatch_waits={} handoffs={} fallbacks={}",
            l(&d.waits),
            l(&d.handoffs),
            l(&d.fallbacks)
        );
        emit(&w);
    }
    let v = &s.verbs;
    if l(&v.ctx_wrapped) + l(&v.ctx_passed) > 0 {
        let mut w = Buf::<2048>::new();
        let _ = write!(
            w,
            "verbs pid={pid} contexts wrapped={} passed={} cqs={} waits={} events synthetic={} real={} swallowed={} blocked={} arms_skipped={} stashed_cqes_delivered={} acks_absorbed={} channels={} fdset_ready={} fdset_absorbed={} cqs_ex_served={} cqs_ex_passed={}",
            l(&v.ctx_wrapped),
            l(&v.ctx_passed),
            l(&v.cqs),
            l(&v.waits),
            l(&v.synthetic),
            l(&v.real),
            l(&v.swallowed),
            l(&v.blocked),
            l(&v.arms_skipped),
            l(&v.stash_delivered),
            l(&v.acks_absorbed),
            l(&v.channels),
            l(&v.fdset_ready),
            l(&v.fdset_absorbed),
            l(&v.cqs_ex_served),
            l(&v.cqs_ex),
        );
        emit(&w);
    }
    let mode = INFO
        .get()
        .and_then(|i| std::str::from_utf8(nul_trimmed(&i.mode)).ok())
        .unwrap_or("?");
    let seen = |c: Call| {
        let k = s.call(c);
        l(&k.served) + k.passed.iter().map(l).sum::<u64>()
    };
    let served: u64 = fastwake::preload_stats::Call::ALL
        .iter()
        .map(|&c| l(&s.call(c).served))
        .sum();
    let any = fastwake::preload_stats::Call::ALL
        .iter()
        .any(|&c| seen(c) > 0);
    let mut w = Buf::<2048>::new();
    if !any {
        let _ = write!(
            w,
            "pid={pid} mode={mode}: no waits intercepted: no hooked call was made (hooked:"
        );
        // Every call the counters name is a hooked call.
        for (i, c) in fastwake::preload_stats::Call::ALL.iter().enumerate() {
            let _ = write!(w, "{}{}", if i == 0 { " " } else { ", " }, c.name());
        }
        let _ = write!(w, ")");
        emit(&w);
        return;
    }
    if served == 0 {
        let _ = write!(
            w,
            "pid={pid} mode={mode}: no waits intercepted; calls seen:"
        );
    } else {
        let _ = write!(w, "pid={pid} mode={mode} calls:");
    }
    let mut first = true;
    for &c in fastwake::preload_stats::Call::ALL.iter() {
        let n = seen(c);
        if n == 0 {
            continue;
        }
        let k = s.call(c);
        let passed = n - l(&k.served);
        let _ = write!(
            w,
            "{} {} seen={n} served={} passed={passed}",
            if first { "" } else { ";" },
            c.name(),
            l(&k.served)
        );
        first = false;
        if passed > 0 {
            let _ = write!(w, " (");
            let mut sep = "";
            for why in Pass::ALL {
                let m = l(&k.passed[why as usize]);
                if m > 0 {
                    let _ = write!(w, "{sep}{}={m}", why.name());
                    sep = " ";
                }
            }
            let _ = write!(w, ")");
        }
    }
    emit(&w);
}

/// The report, once, from the signal handler.
pub(crate) fn report_once() {
    if !REPORTED.swap(true, Ordering::AcqRel) {
        report();
    }
}
