//! The exit report when the program is killed by SIGTERM or SIGINT
//! (`FASTWAKE_VERBOSE=1` only), without a change the program can observe.
//!
//! At load, for SIGTERM and SIGINT whose disposition is `SIG_DFL` (not
//! ignored, as under `nohup`; the program has no handler yet), the shim
//! installs a handler (`SA_RESETHAND`: the kernel puts `SIG_DFL` back as it
//! enters it). The handler writes the report (preformatted from atomics in
//! a stack buffer, one raw `write`), unlinks the segment, and re-sends the
//! signal to its own thread: it is blocked while the handler runs and is
//! delivered, with the default action, as the handler returns. The process
//! dies by that signal: the exit status (`WTERMSIG`), core-dump rules and
//! what the parent sees are those of the plain program.
//!
//! So that the program still sees `SIG_DFL`, `sigaction` and `signal` are
//! interposed: while the shim's handler is in place, a query returns
//! `SIG_DFL` (empty mask, no flags) and the program's first own
//! disposition for that signal replaces the shim's for good (the old
//! disposition it is told is `SIG_DFL`). Every other call is forwarded
//! unchanged.
//!
//! Limits: a program that reads dispositions without these two functions
//! (the raw `rt_sigaction` syscall, `sigset`/`sysv_signal`/`bsd_signal`,
//! `/proc/PID/status`'s `SigCgt`) sees the handler. A blocking system
//! call the signal interrupts does not return `EINTR` to the program: the
//! process dies first, as with `SIG_DFL`. A signal blocked by the program
//! (`sigwait`, `signalfd`) stays blocked and is taken as before. Without
//! verbose nothing is installed and the two hooks only forward.

use crate::real::Sym;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};

static SIGACTION: Sym = Sym::new(c"sigaction");
static SIGNAL: Sym = Sym::new(c"signal");

type SigactionFn =
    unsafe extern "C" fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int;
type SignalFn = unsafe extern "C" fn(c_int, libc::sighandler_t) -> libc::sighandler_t;

/// The signals the report survives.
const SIGS: [c_int; 2] = [libc::SIGINT, libc::SIGTERM];
/// `OURS[i]`: the shim's handler holds `SIGS[i]`, and the program believes
/// it is `SIG_DFL`.
static OURS: [AtomicBool; 2] = [const { AtomicBool::new(false) }; 2];

fn slot(sig: c_int) -> Option<usize> {
    SIGS.iter().position(|&s| s == sig)
}

fn real_sigaction() -> Option<SigactionFn> {
    let a = SIGACTION.get();
    // SAFETY: `a` is the address dlsym returned for `sigaction`.
    (a != 0).then(|| unsafe { std::mem::transmute::<usize, SigactionFn>(a) })
}

/// `SIG_DFL` with an empty mask and no flags: what a program that never
/// touched the signal reads.
fn default_action() -> libc::sigaction {
    // SAFETY: all-zero is a valid sigaction: SIG_DFL, empty mask, no flags.
    unsafe { std::mem::zeroed() }
}

/// Constructor, verbose only: take SIGTERM and SIGINT where they are
/// `SIG_DFL`.
pub fn install() {
    SIGNAL.get();
    let Some(real) = real_sigaction() else { return };
    for (i, &sig) in SIGS.iter().enumerate() {
        let mut old = default_action();
        // SAFETY: a query into a live sigaction.
        if unsafe { real(sig, std::ptr::null(), &mut old) } != 0
            || old.sa_sigaction != libc::SIG_DFL
        {
            continue;
        }
        let mut act = default_action();
        act.sa_sigaction = handler as extern "C" fn(c_int) as libc::sighandler_t;
        act.sa_flags = libc::SA_RESETHAND | libc::SA_RESTART;
        OURS[i].store(true, Ordering::Release);
        // SAFETY: a live sigaction naming a plain handler.
        if unsafe { real(sig, &act, std::ptr::null_mut()) } != 0 {
            OURS[i].store(false, Ordering::Release);
        }
    }
}

/// Report, unlink, die by the same signal. Async-signal-safe: atomics,
/// stack buffers, raw syscalls.
extern "C" fn handler(sig: c_int) {
    // SAFETY: the thread's errno slot, restored before returning.
    let errno = unsafe { *libc::__errno_location() };
    if let Some(i) = slot(sig) {
        OURS[i].store(false, Ordering::Release);
    }
    super::report_once();
    super::remove();
    // SA_RESETHAND made the disposition SIG_DFL; the signal is blocked in
    // this handler, so the re-sent one is delivered as it returns.
    // SAFETY: raw tgkill to this very thread.
    unsafe {
        libc::syscall(
            libc::SYS_tgkill,
            libc::syscall(libc::SYS_getpid),
            libc::syscall(libc::SYS_gettid),
            sig,
        );
        *libc::__errno_location() = errno;
    }
}

/// # Safety
/// The libc contract of `sigaction`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    oldact: *mut libc::sigaction,
) -> c_int {
    let Some(real) = real_sigaction() else {
        // SAFETY: the thread's errno slot.
        unsafe { *libc::__errno_location() = libc::ENOSYS };
        return -1;
    };
    if let Some(i) = slot(sig)
        && OURS[i].load(Ordering::Acquire)
    {
        if act.is_null() {
            if !oldact.is_null() {
                // SAFETY: the caller's writable sigaction.
                unsafe { oldact.write(default_action()) };
            }
            return 0;
        }
        // SAFETY: the caller's arguments, unchanged.
        let r = unsafe { real(sig, act, oldact) };
        if r == 0 {
            OURS[i].store(false, Ordering::Release);
            if !oldact.is_null() {
                // SAFETY: as above.
                unsafe { oldact.write(default_action()) };
            }
        }
        return r;
    }
    // SAFETY: the caller's arguments, unchanged.
    unsafe { real(sig, act, oldact) }
}

/// # Safety
/// The libc contract of `signal`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn signal(sig: c_int, h: libc::sighandler_t) -> libc::sighandler_t {
    let a = SIGNAL.get();
    if a == 0 {
        return libc::SIG_ERR;
    }
    // SAFETY: `a` is the address dlsym returned for `signal`; the caller's
    // arguments, unchanged.
    let r = unsafe { std::mem::transmute::<usize, SignalFn>(a)(sig, h) };
    if r != libc::SIG_ERR
        && let Some(i) = slot(sig)
        && OURS[i].swap(false, Ordering::AcqRel)
    {
        return libc::SIG_DFL;
    }
    r
}
