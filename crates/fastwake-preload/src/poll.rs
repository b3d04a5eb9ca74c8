//! poll interposition: `poll`, its fortified form `__poll_chk`, and
//! `ppoll` (with its signal mask and nanosecond timeout), through the wait
//! engine. A `ppoll` with a mask is not dispatched: the mask must hold
//! during the sleep, which the dispatcher's futex sleep cannot give
//! atomically; in `dispatch` mode it spins as in `hybrid`.

use crate::real::Sym;
use crate::wait;
use fastwake::preload_stats::{Call, Pass};
use libc::{nfds_t, pollfd};
use std::ffi::c_int;

static POLL: Sym = Sym::new(c"poll");
static POLL_CHK: Sym = Sym::new(c"__poll_chk");
static PPOLL: Sym = Sym::new(c"ppoll");

type PollFn = unsafe extern "C" fn(*mut pollfd, nfds_t, c_int) -> c_int;
type PollChkFn = unsafe extern "C" fn(*mut pollfd, nfds_t, c_int, usize) -> c_int;
type PpollFn = unsafe extern "C" fn(
    *mut pollfd,
    nfds_t,
    *const libc::timespec,
    *const libc::sigset_t,
) -> c_int;

/// Resolve the real functions (from the library constructor).
pub fn resolve() {
    POLL.get();
    POLL_CHK.get();
    PPOLL.get();
}

/// `ppoll` as a raw syscall (never our hook): a look with `ns` = 0, a
/// pre-wake's timed look with `ns` > 0 (ppoll's timeout is in ns).
fn probe(fds: *mut pollfd, nfds: nfds_t, mask: *const u64, ns: u64) -> c_int {
    // SAFETY: the caller's fds as the real call would get them, and an
    // 8-byte kernel sigset or null.
    let n = unsafe { crate::sys::ppoll_ns(fds, nfds, ns, mask) };
    // Completion channels in the set: their CQs too.
    crate::verbs::channel_fds::after_poll(fds, nfds, n)
}

/// `crate::pollers`' key of a poll set: its first fd and its size.
fn key(fds: *mut pollfd, nfds: nfds_t) -> crate::pollset::Key {
    // SAFETY: the caller passed at least one pollfd at `fds` (checked
    // non-null, nfds > 0).
    let first = unsafe { (*fds).fd };
    crate::pollset::Key::Fd(2 + (nfds.min(200) as u8), first)
}

/// Add a poll set's fds to a polling thread's set.
fn watch(s: &mut crate::pollset::Set, fds: *mut pollfd, nfds: nfds_t) {
    // SAFETY: the caller passed `nfds` pollfds at `fds` (checked non-null).
    let set = unsafe { std::slice::from_raw_parts(fds, nfds as usize) };
    for p in set {
        s.add_fd(p.fd, p.events);
    }
}

/// The first readable fd, for the peer-CPU sample.
fn readable_fd(fds: *mut pollfd, nfds: nfds_t) -> Option<c_int> {
    // SAFETY: the caller passed `nfds` pollfds at `fds` (checked non-null).
    let s = unsafe { std::slice::from_raw_parts(fds, nfds as usize) };
    s.iter()
        .find(|p| p.fd >= 0 && p.revents & libc::POLLIN != 0)
        .map(|p| p.fd)
}

fn intercept(fds: *mut pollfd, nfds: nfds_t, timeout: c_int, real: PollFn) -> c_int {
    if fds.is_null() || nfds == 0 {
        crate::stats::passed(Call::Poll, Pass::Other);
        // Nothing to watch: a plain sleep (or EFAULT); the real call does it.
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { real(fds, nfds, timeout) };
    }
    let go = || {
        if crate::config::dispatch()
            && let Some(n) = crate::fds::poll(fds, nfds, wait::ms(timeout), || {
                probe(fds, nfds, std::ptr::null(), 0)
            })
        {
            crate::stats::served(Call::Poll);
            return n;
        }
        crate::fdwait::wait(
            Call::Poll,
            (key(fds, nfds), &|s| watch(s, fds, nfds)),
            wait::ms_to_ns(timeout),
            std::ptr::null(),
            |m, ns| probe(fds, nfds, m, ns),
            // SAFETY: the caller's arguments with the remaining timeout.
            |left| unsafe { real(fds, nfds, wait::ms_left(timeout, left)) },
            || readable_fd(fds, nfds),
        )
    };
    crate::guarded(go, || {
        // SAFETY: as above.
        unsafe { real(fds, nfds, timeout) }
    })
}

fn real_poll() -> Option<PollFn> {
    let a = POLL.get();
    // SAFETY: `a` is the address dlsym returned for `poll`.
    (a != 0).then(|| unsafe { std::mem::transmute::<usize, PollFn>(a) })
}

fn enosys() -> c_int {
    // SAFETY: the thread's errno slot.
    unsafe { *libc::__errno_location() = libc::ENOSYS };
    -1
}

/// # Safety
/// The libc contract of `poll`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn poll(fds: *mut pollfd, nfds: nfds_t, timeout: c_int) -> c_int {
    match real_poll() {
        Some(real) => intercept(fds, nfds, timeout, real),
        None => enosys(),
    }
}

/// # Safety
/// The libc contract of `__poll_chk` (what `poll` becomes under
/// `_FORTIFY_SOURCE`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __poll_chk(
    fds: *mut pollfd,
    nfds: nfds_t,
    timeout: c_int,
    fdslen: usize,
) -> c_int {
    let too_many = (nfds as usize)
        .checked_mul(std::mem::size_of::<pollfd>())
        .is_none_or(|b| b > fdslen);
    let a = POLL_CHK.get();
    match real_poll() {
        Some(real) if !too_many => intercept(fds, nfds, timeout, real),
        _ if a != 0 => {
            // Let glibc's own check abort the program, as without the shim.
            // SAFETY: `a` is dlsym's address for `__poll_chk`; the
            // caller's arguments, unchanged.
            unsafe { std::mem::transmute::<usize, PollChkFn>(a)(fds, nfds, timeout, fdslen) }
        }
        _ => enosys(),
    }
}

/// # Safety
/// The libc contract of `ppoll`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ppoll(
    fds: *mut pollfd,
    nfds: nfds_t,
    tmo: *const libc::timespec,
    sigmask: *const libc::sigset_t,
) -> c_int {
    let a = PPOLL.get();
    if a == 0 {
        return enosys();
    }
    // SAFETY: `a` is the address dlsym returned for this very symbol.
    let real: PpollFn = unsafe { std::mem::transmute(a) };
    // SAFETY: the caller's arguments, unchanged.
    let plain = || unsafe { real(fds, nfds, tmo, sigmask) };
    // SAFETY: the caller\'s timeout argument, which the real call reads too.
    let Ok(timeout_ns) = (unsafe { wait::ts_to_ns(tmo) }) else {
        crate::stats::passed(Call::Ppoll, Pass::Other);
        return plain();
    };
    if fds.is_null() || nfds == 0 {
        crate::stats::passed(Call::Ppoll, Pass::Other);
        return plain();
    }
    let go = || {
        if sigmask.is_null()
            && crate::config::dispatch()
            && let Some(n) = crate::fds::poll(
                fds,
                nfds,
                timeout_ns.map(std::time::Duration::from_nanos),
                || probe(fds, nfds, std::ptr::null(), 0),
            )
        {
            crate::stats::served(Call::Ppoll);
            return n;
        }
        crate::fdwait::wait(
            Call::Ppoll,
            (key(fds, nfds), &|s| watch(s, fds, nfds)),
            timeout_ns,
            sigmask.cast(),
            |m, ns| probe(fds, nfds, m, ns),
            |left| match left {
                None => plain(),
                Some(ns) => {
                    let ts = wait::ns_to_ts(ns);
                    // SAFETY: the caller's arguments with what is left of
                    // the timeout, exact to the nanosecond.
                    unsafe { real(fds, nfds, &ts, sigmask) }
                }
            },
            || readable_fd(fds, nfds),
        )
    };
    crate::guarded(go, plain)
}
